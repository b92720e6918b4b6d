"""The client's merge of spilled Categorify counts (issue 10, item 2): its memory is
bounded by the vocabulary of one bucket, not by how many partitions spilled.

On a cluster (and threaded) every partition whose counts outgrow ``spill_rows``
spills, and the final merge reads each bucket's file of every spilled folder. With
many partitions sharing the same values, merging all those files at once holds
(partitions x bucket size) rows; folding them into a running merge holds about three times
one bucket's distinct values."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.ops import categorify

DISTINCT, BUCKETS, ROWS = 2_000, 4, 120_000


def _frame(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, DISTINCT, ROWS)
    return pd.DataFrame({"c": pd.array([f"v{x}" for x in ids], dtype="str")})


@pytest.mark.parametrize("seed", [0, 7])
def test_spilled_merge_rows_stay_bounded_by_a_bucket(tmp_path, monkeypatch, seed):
    df = _frame(seed)
    # about 40 partitions, each holding most of the values
    ds = ts.Dataset(df, part_size=int(df.memory_usage(deep=True).sum()) // 40)
    assert ds.npartitions >= 30
    merged_rows: list[int] = []
    real_merge = categorify._sum_counts  # every merge of counts (merge_counts too) ends there

    def recording_merge(tables):
        if len(tables) > 1:
            merged_rows.append(sum(t.num_rows for t in tables))
        return real_merge(tables)

    monkeypatch.setattr(categorify, "_sum_counts", recording_merge)
    op = ops.Categorify(spill_rows=100, spill_buckets=BUCKETS, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds)

    # the vocabulary, computed a second way: every value with its exact count
    expected = df["c"].value_counts()
    got = op.tables["c"]
    assert got.num_rows == DISTINCT
    assert dict(zip(got["values"].to_pylist(), got["counts"].to_pylist(), strict=True)) == expected.to_dict()
    # merging all ~40 files of a bucket at once takes ~40 x 375 rows; the running
    # merge holds at most three buckets' worth of distinct values plus one file
    assert max(merged_rows) <= 5 * DISTINCT // BUCKETS
    assert list(tmp_path.iterdir()) == []  # spill folders are removed


def test_spilled_merge_applies_freq_threshold_after_the_whole_bucket(tmp_path):
    # a value below the threshold in every partition but above it in total is kept
    parts = [pa.table({"c": pa.array(["a", "b"] + [f"u{i}-{p}" for i in range(30)])}) for p in range(6)]
    df = pa.concat_tables(parts).to_pandas()
    op = ops.Categorify(freq_threshold=3, spill_rows=5, spill_buckets=2, spill_dir=str(tmp_path))
    ds = ts.Dataset(df, part_size=int(df.memory_usage(deep=True).sum()) // 6)
    assert ds.npartitions >= 5
    ts.Workflow(["c"] >> op).fit(ds)
    counts = df["c"].value_counts()
    expected = counts[counts >= 3]
    got = op.tables["c"]
    assert dict(zip(got["values"].to_pylist(), got["counts"].to_pylist(), strict=True)) == expected.to_dict()

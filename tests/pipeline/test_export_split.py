"""``num_files`` / ``out_files_per_proc`` split the rows into equal files, whatever the
partitions: file ``f`` of ``F`` holds ``N // F`` rows, one more for the first
``N % F``; every row is written exactly once; without shuffle the files hold the
rows in order."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.pipeline.execution import num_workers


def _expected_counts(n: int, files: int) -> list[int]:
    return [n // files + (1 if f < n % files else 0) for f in range(files)]


def _files(out) -> tuple[list[int], pd.DataFrame]:
    manifest = json.loads((out / "_manifest.json").read_text())
    frames = [pq.read_table(out / e["path"]).to_pandas() for e in manifest["files"]]
    assert [e["num_rows"] for e in manifest["files"]] == [len(f) for f in frames]
    assert manifest["num_rows"] == sum(len(f) for f in frames)
    return [e["num_rows"] for e in manifest["files"]], pd.concat(frames, ignore_index=True)


def _frame(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(n)
    return pd.DataFrame({"row_id": np.arange(n, dtype=np.int64), "x": rng.random(n)})


@pytest.mark.parametrize("shuffle", [None, "per_partition", "per_worker", "full"])
@pytest.mark.parametrize(("rows", "part_size"), [
    (40_960, 8192 * 16),   # 5 partitions of 8,192 rows (the 16,384 + 24,576)
    (40_960, 10**9),       # one partition
    (10_001, 30_000),      # 6 partitions, the last short
    (5, 10**9),            # fewer rows than some of the files asked for
])
@pytest.mark.parametrize("split", [{"num_files": 2}, {"num_files": 3}, {"out_files_per_proc": 2}])
def test_files_have_equal_rows(tmp_path, shuffle, rows, part_size, split):
    frame = _frame(rows)
    ds = ts.Dataset(frame, part_size=part_size)
    files = split.get("num_files") or 2 * min(num_workers(None), ds.npartitions)
    out = tmp_path / "out"
    if rows < files:
        with pytest.warns(UserWarning, match=rf"{files} files were asked for, but the data has {rows} rows"):
            ds.to_parquet(str(out), shuffle=shuffle, seed=3, **split)
    else:
        ds.to_parquet(str(out), shuffle=shuffle, seed=3, **split)
    counts, got = _files(out)
    assert counts == [c for c in _expected_counts(rows, files) if c]
    if shuffle is None:  # the files, in order, hold the rows in order
        pd.testing.assert_frame_equal(got, frame)
    else:
        pd.testing.assert_frame_equal(got.sort_values("row_id").reset_index(drop=True), frame)
        if rows > 1000:
            assert not got["row_id"].is_monotonic_increasing, "shuffled"


@pytest.mark.parametrize("shuffle", [None, "per_worker", "full"])
def test_parquet_and_csv_inputs(tmp_path, shuffle):
    frame = _frame(9_000)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "in.parquet",
                   row_group_size=700)
    frame.to_csv(tmp_path / "in.csv", index=False)
    for name, ds in [("parquet", ts.Dataset(str(tmp_path / "in.parquet"), part_size=20_000)),
                     ("csv", ts.Dataset(str(tmp_path / "in.csv"), dtypes={"row_id": "int64", "x": "float64"},
                                        part_size=40_000))]:
        assert ds.npartitions > 2
        out = tmp_path / f"out-{name}"
        ds.to_parquet(str(out), num_files=4, shuffle=shuffle, seed=1)
        counts, got = _files(out)
        assert counts == _expected_counts(len(frame), 4), name
        pd.testing.assert_frame_equal(got.sort_values("row_id").reset_index(drop=True), frame)


@pytest.mark.parametrize("shuffle", [None, "per_worker", "full"])
def test_a_filter_in_the_workflow(tmp_path, shuffle):
    """The rows after a Filter are not known before the export reads them: it counts
    them and splits by those counts."""
    frame = _frame(12_000)
    frame["keep"] = (frame["row_id"] % 7 < 3) | (frame["row_id"] < 2000)  # uneven per partition
    ds = ts.Dataset(frame, part_size=50_000)
    assert ds.npartitions > 3
    wf = ts.Workflow(["row_id", "x", "keep"] >> ops.Filter(lambda df: df["keep"]))
    wf.fit(ds)
    out = tmp_path / "out"
    wf.transform(ds).to_parquet(str(out), num_files=3, shuffle=shuffle, seed=2)
    expected = frame[frame["keep"]].reset_index(drop=True)
    counts, got = _files(out)
    assert counts == _expected_counts(len(expected), 3)
    pd.testing.assert_frame_equal(got.sort_values("row_id").reset_index(drop=True), expected)


def test_per_worker_spreads_every_partition_over_the_files(tmp_path):
    frame = _frame(8_000)
    ds = ts.Dataset(frame, part_size=40_000)
    out = tmp_path / "out"
    ds.to_parquet(str(out), num_files=2, shuffle="per_worker", seed=0)
    manifest = json.loads((out / "_manifest.json").read_text())
    bounds = np.cumsum([0] + [len(ds.read_piece(p)) for p in ds.pieces])
    for entry in manifest["files"]:
        ids = pq.read_table(out / entry["path"])["row_id"].to_numpy()
        per_partition = np.bincount(np.searchsorted(bounds, ids, side="right") - 1, minlength=ds.npartitions)
        # each file holds rows of each of its group's partitions
        assert (per_partition > 0).sum() >= ds.npartitions // 2

"""The multi-hot generator: shapes, reproducibility, the hidden model recomputed
row by row, and the parquet writer."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tabstream.datasets import generate_data, synthetic, write_data

OPTS = {"slots": 6, "nnz": 4, "vocabulary": 50}


def _ids(df) -> np.ndarray:
    table = pa.Table.from_pandas(df[["multi_hot"]], preserve_index=False)
    return table.column("multi_hot").combine_chunks().flatten().flatten().to_numpy().reshape(
        len(df), OPTS["slots"], OPTS["nnz"])


def test_shapes_types_and_range() -> None:
    df = generate_data("multi-hot", 2500, seed=1, **OPTS)
    assert list(df.columns) == ["label", "multi_hot"]
    assert str(df["multi_hot"].dtype.pyarrow_dtype) == \
        "fixed_size_list<item: fixed_size_list<item: int64>[4]>[6]"
    ids = _ids(df)
    assert ids.min() >= 0 and ids.max() < OPTS["vocabulary"]
    assert (ids == 0).mean() > 1 / OPTS["vocabulary"]   # power law: id 0 the most frequent
    assert set(np.unique(df["label"])) <= {0, 1}


def test_columns_layout_holds_the_same_ids() -> None:
    nested = _ids(generate_data("multi-hot", 300, seed=2, **OPTS))
    cols = generate_data("multi-hot", 300, seed=2, layout="columns", **OPTS)
    assert list(cols.columns) == ["label"] + [f"S{i}" for i in range(1, 7)]
    for s in range(OPTS["slots"]):
        got = np.array(cols[f"S{s + 1}"].tolist())
        assert np.array_equal(got, nested[:, s])


def test_rows_do_not_depend_on_the_cut() -> None:
    whole = generate_data("multi-hot", 3000, seed=4, **OPTS)
    part = generate_data("multi-hot", 1100, seed=4, start_row=1500, **OPTS)
    assert np.array_equal(_ids(part), _ids(whole)[1500:2600])
    assert np.array_equal(part["label"].to_numpy(), whole["label"].to_numpy()[1500:2600])
    assert not np.array_equal(_ids(generate_data("multi-hot", 300, seed=5, **OPTS)),
                              _ids(whole)[:300])


def test_probability_is_the_hidden_logistic_model() -> None:
    df, prob = generate_data("multi-hot", 40, seed=3, return_probability=True, **OPTS)
    ids = _ids(df)
    slots, nnz = OPTS["slots"], OPTS["nnz"]
    for row in range(40):
        total = 0.0
        for s in range(slots):
            key = synthetic._key(3, "multi-hot", s)
            for i in ids[row, s]:
                total += float(np.float32(synthetic._hash_normal(key, np.array([i]))[0, 0]))
        want = 1 / (1 + math.exp(-(synthetic._MULTIHOT_BIAS + total * 2 / math.sqrt(slots * nnz))))
        assert prob[row] == pytest.approx(want, rel=1e-5)


def test_write_data_parquet_equals_generate(tmp_path: Path) -> None:
    paths = write_data("multi-hot", tmp_path, 700, num_files=2, row_group_size=200, seed=6,
                       **OPTS)
    read = pa.concat_tables(pq.read_table(p) for p in paths)
    want = pa.Table.from_pandas(generate_data("multi-hot", 700, seed=6, **OPTS),
                                preserve_index=False)
    assert read.column("multi_hot").to_pylist() == want.column("multi_hot").to_pylist()
    assert read.column("label").to_pylist() == want.column("label").to_pylist()


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"dataset 'criteo' takes no options \['slots'\]; only "
                                        r"'multi-hot' takes"):
        generate_data("criteo", 3, slots=3)
    with pytest.raises(TypeError, match=r"unknown multi-hot options \['width'\]"):
        generate_data("multi-hot", 3, width=3)
    with pytest.raises(ValueError, match=r"layout must be 'nested' or 'columns', got 'flat'"):
        generate_data("multi-hot", 3, layout="flat")
    with pytest.raises(ValueError, match=r"nnz must be >= 1"):
        generate_data("multi-hot", 3, nnz=0)
    with pytest.raises(ValueError, match=r"the multi-hot dataset holds lists: write it with "
                                         r"fmt='parquet'"):
        write_data("multi-hot", tmp_path, 3, fmt="tsv")

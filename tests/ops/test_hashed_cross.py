import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.pipeline.hashing import hash_combine, murmur3_32


def scalar_hash(v):
    return int(murmur3_32(pa.array([v]))[0]) if v is not None else 0


def test_cross_matches_documented_formula():
    df = pd.DataFrame({"a": ["x", "y", None, "x", "y"], "b": [1, 2, 3, 1, 2], "c": [0.5, 0.5, 1.0, 2.0, 0.5]})
    wf = ts.Workflow(["a", "b", "c"] >> ops.HashedCross(97)).fit(ts.Dataset(df))
    out = wf.transform(df)
    assert list(out.columns) == ["a_X_b_X_c"]
    expected = []
    for a, b, c in zip(df["a"], df["b"], df["c"]):
        a = None if pd.isna(a) else a
        h = hash_combine(hash_combine(np.uint32(scalar_hash(a)), np.uint32(scalar_hash(int(b)))),
                         np.uint32(scalar_hash(float(c))))
        expected.append(int(h) % 97)
    assert out["a_X_b_X_c"].tolist() == expected
    assert out["a_X_b_X_c"].iloc[1] == out["a_X_b_X_c"].iloc[4]
    assert wf.output_schema["a_X_b_X_c"].cardinality == 97 + 1  # plus the all-missing id 97


def test_groups_give_several_crosses():
    df = pd.DataFrame({"a": ["x", "y"], "b": ["p", "q"], "c": [1, 2]})
    out = ts.Workflow([["a", "b"], ["a", "c"]] >> ops.HashedCross({"a_X_b": 10, "a_X_c": 20})).fit(
        ts.Dataset(df)).transform(df)
    assert list(out.columns) == ["a_X_b", "a_X_c"]
    assert out["a_X_c"].max() < 20


def test_list_cross_elementwise_with_scalar_broadcast():
    table = pa.table({"l": pa.array([[1, 2], [], None, [5]], pa.list_(pa.int64())), "s": ["u", "v", "w", "u"]})
    op = ops.HashedCross(1000)
    out = op.transform(table).column("l_X_s").to_pylist()
    expected = []
    for row, s in zip(table.column("l").to_pylist(), table.column("s").to_pylist()):
        if row is None:
            expected.append(None)
        else:
            expected.append([int(hash_combine(np.uint32(scalar_hash(v)), np.uint32(scalar_hash(s)))) % 1000 for v in row])
    assert out == expected


def test_unequal_list_lengths_are_an_error():
    table = pa.table({"l": pa.array([[1, 2]], pa.list_(pa.int64())), "m": pa.array([[1]], pa.list_(pa.int64()))})
    with pytest.raises(ValueError, match="length differs"):
        ops.HashedCross(10).transform(table)


def test_one_column_is_not_a_cross():
    with pytest.raises(ValueError, match="at least two columns"):
        ts.Workflow(["a"] >> ops.HashedCross(10)).fit_schema(ts.Schema(["a"]))


def test_hash_bucket_same_ids_in_another_process():
    values = ["a", "bb", "ccc", "", "日本"]
    here = ops.HashBucket(1009).transform(pa.table({"c": values})).column("c").to_pylist()
    code = ("import pyarrow as pa; from tabstream import ops;"
            f"print(ops.HashBucket(1009).transform(pa.table({{'c': {values!r}}})).column('c').to_pylist())")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert there.strip() == str(here)

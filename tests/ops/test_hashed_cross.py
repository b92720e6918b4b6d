import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.hashing import hash_combine, murmur3_32


def scalar_hash(v):
    return int(murmur3_32(pa.array([v]))[0]) if v is not None else 0


def test_cross_matches_documented_formula():
    df = pd.DataFrame({"a": ["x", "y", None, "x", "y"], "b": [1, 2, 3, 1, 2], "c": [0.5, 0.5, 1.0, 2.0, 0.5]})
    wf = ts.Workflow(["a", "b", "c"] >> ops.HashedCross(97)).fit(ts.Dataset(df))
    out = wf.transform(df)
    assert list(out.columns) == ["a_X_b_X_c"]
    expected = []
    marker = np.uint32(0x9E3779B9)  # a missing first part: start from M, one more fold at the end
    for a, b, c in zip(df["a"], df["b"], df["c"]):
        first = marker if pd.isna(a) else np.uint32(scalar_hash(a))
        h = hash_combine(hash_combine(first, np.uint32(scalar_hash(int(b)))),
                         np.uint32(scalar_hash(float(c))))
        if pd.isna(a):
            h = hash_combine(h, marker)
        expected.append(int(h) % 97)
    assert out["a_X_b_X_c"].tolist() == expected
    assert out["a_X_b_X_c"].iloc[1] == out["a_X_b_X_c"].iloc[4]
    assert wf.output_schema["a_X_b_X_c"].cardinality == 97 + 1  # plus the all-missing id 97


def test_missing_part_is_not_the_empty_string():
    # murmur3("") is 0: a missing part once hashed as 0, so (null, "x") and ("", "x")
    # shared an id; a NaN part is missing like a null one
    table = pa.table({"s": pa.array([None, "", "a", None]), "u": ["x", "x", "x", "y"],
                      "f": pa.array([None, float("nan"), 0.0, 1.0])})
    ids = ops.HashedCross(1 << 30, column_groups=[["s", "u"], ["u", "s"], ["f", "u"]]).transform(table)
    s_u, u_s, f_u = (ids.column(c).to_pylist() for c in ["s_X_u", "u_X_s", "f_X_u"])
    assert s_u[0] != s_u[1] and u_s[0] != u_s[1]
    assert f_u[0] == f_u[1] != f_u[2]
    marker = np.uint32(0x9E3779B9)
    h = lambda v: np.uint32(scalar_hash(v))  # noqa: E731
    assert s_u[1] == int(hash_combine(h(""), h("x"))) % (1 << 30)
    assert s_u[0] == int(hash_combine(hash_combine(marker, h("x")), marker)) % (1 << 30)
    assert u_s[0] == int(hash_combine(hash_combine(h("x"), marker), marker)) % (1 << 30)


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

"""float16 key columns: Arrow has no sort/hash/arithmetic kernels for half floats, so
the ops once failed with raw Arrow errors. A float16 key must give what the same
keys widened (exactly) to float32 give."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops

KEYS = np.array([1, np.nan, np.nan, -0.0, 0.0, 2.5, 1, 2.5], dtype="float16")
VALUES = np.arange(len(KEYS), dtype="float64")

NODES = {
    "JoinGroupby": lambda: ["k", "v"] >> ops.JoinGroupby(cont_cols=["v"], stats=["sum", "count"]),
    "TargetEncoding": lambda: ["k", "v"] >> ops.TargetEncoding(["v"], kfold=1, p_smooth=0),
    "Categorify": lambda: ["k"] >> ops.Categorify(),
    "Groupby": lambda: ["k", "v"] >> ops.Groupby(groupby_cols=["k"], aggs={"v": ["sum", "count"]}),
}


def _run(node, keys):
    table = pa.table({"k": pa.array(keys), "v": pa.array(VALUES)})
    ds = ts.Dataset(table)
    wf = ts.Workflow(node).fit(ds)
    return wf.transform(ds).compute()


@pytest.mark.parametrize("op", list(NODES))
def test_float16_keys_match_float32(op):
    got = _run(NODES[op](), KEYS)
    expected = _run(NODES[op](), KEYS.astype("float32"))
    assert list(got.columns) == list(expected.columns)
    for c in got.columns:
        np.testing.assert_array_equal(got[c].to_numpy(dtype="float64", na_value=np.nan),
                                      expected[c].to_numpy(dtype="float64", na_value=np.nan), err_msg=c)


# -- float16 value columns: computed on the float32 values (exact), as float16 out --

HALF = np.array([-1.5, 2.0, np.nan, 7.0, 0.0999, -0.0, 65504.0, 3.25], dtype="float16")
GROUPS = np.array([1, 1, 2, 2, 1, 3, 3, 2])


def _values_run(node, values=HALF):
    table = pa.table({"k": pa.array(GROUPS), "x": pa.array(values)})
    return ts.Workflow(node).fit(ts.Dataset(table)).transform(table)


@pytest.mark.parametrize(("lo", "hi"), [(0, 5), (0.1, None), (None, -1.0), (-1.25, 7.5)])
def test_clip_of_float16_values_is_the_float32_clip(lo, hi):
    out = _values_run(["x"] >> ops.Clip(min_value=lo, max_value=hi))["x"]
    assert out.type == pa.float16()
    def bound(b):
        return None if b is None else np.float32(np.float16(b))

    expected = np.clip(HALF.astype(np.float32), bound(lo), bound(hi)).astype(np.float16)
    np.testing.assert_array_equal(out.to_numpy(zero_copy_only=False), expected)


def test_difference_lag_of_float16_values():
    out = _values_run(["x", "k"] >> ops.DifferenceLag("k"))["x_difference_lag_1"]
    assert out.type == pa.float16()
    x = HALF.astype(np.float32)
    same = np.r_[False, GROUPS[1:] == GROUPS[:-1]]
    expected = np.where(same, x - np.r_[np.nan, x[:-1]], np.nan).astype(np.float16)
    np.testing.assert_array_equal(out.to_numpy(zero_copy_only=False), expected)


@pytest.mark.parametrize("agg", ["sum", "mean", "min", "max", "count", "std"])
def test_groupby_aggregates_float16_values(agg):
    import pandas as pd

    out = _values_run(["k", "x"] >> ops.Groupby("k", aggs={"x": [agg]}))
    frame = pd.DataFrame({"k": GROUPS, "x": HALF.astype(np.float64)})
    expected = frame.groupby("k")["x"].agg(agg)
    got = out[f"x-{agg}"].to_numpy(zero_copy_only=False).astype(np.float64)
    np.testing.assert_allclose(got, expected.to_numpy(), rtol=1e-3 if agg in ("mean", "std") else 0)
    if agg in ("min", "max"):
        assert out[f"x-{agg}"].type == pa.float16()

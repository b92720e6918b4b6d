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

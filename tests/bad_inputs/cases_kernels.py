"""Backend kernels: arguments a backend refuses, and data the ops now running on
kernels must refuse (or read correctly) as before."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
import tabstream.backends as backends
from tabstream import ops
from tabstream.core.errors import DataError


def _join_how(tmp):
    backends.get("arrow").join_indices(pa.table({"k": [1]}), pa.table({"k": [1]}), ["k"], how="right")


def _unknown_aggregation(tmp):
    backends.get("arrow").groupby_aggregate(pa.table({"k": [1], "v": [2.0]}), ["k"], [("v", "median", "m")])


def _reduce_beyond_fitted_range(tmp):
    op = ops.ReduceDtypeSize()
    op.fit_table(pa.table({"x": pa.array([0, 100], pa.int64())}))
    op.transform(pa.table({"x": pa.array([5, 1000], pa.int64())}))


def _split_not_numbers(tmp):
    ops.SplitList("|", dtype="int64").transform(pa.table({"tags": ["1|2", "3|x"]}))


def _bucketize_from_parquet(tmp):
    rng = np.random.default_rng(3)
    df = pd.DataFrame({"x": rng.normal(size=200)})
    df.loc[::17, "x"] = np.nan
    df.to_parquet(tmp / "x.parquet")
    wf = ts.Workflow(["x"] >> ops.Bucketize([-1.0, 0.0, 1.0]))
    out = wf.fit_transform(ts.Dataset(str(tmp / "x.parquet"))).to_ddf().compute()
    expected = np.digitize(df["x"].to_numpy(), [-1.0, 0.0, 1.0])
    got = out["x"].astype("Float64").to_numpy(dtype=float, na_value=np.nan)
    assert np.array_equal(np.isnan(got), df["x"].isna().to_numpy())
    assert (got[~np.isnan(got)] == expected[df["x"].notna().to_numpy()]).all()


CASES = [
    ("join-how", _join_how, ValueError, r"join_indices: how must be 'left' or 'inner', got 'right'"),
    ("groupby-unknown-aggregation", _unknown_aggregation, ValueError, r"unknown aggregation 'median'; expected one of"),
    ("reduce-beyond-fitted-range", _reduce_beyond_fitted_range, DataError,
     r"ReduceDtypeSize: column 'x' holds values outside the range fitted \[0, 100\]"),
    ("splitlist-not-numbers", _split_not_numbers, DataError,
     r"SplitList: column 'tags': cannot convert the pieces split on '\|' to int64"),
    ("bucketize-parquet-read-correctly", _bucketize_from_parquet, None, None),
]

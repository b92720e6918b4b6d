"""Categorify, HashBucket and HashedCross: parameters and data a user gets wrong."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import tabstream as ts
from tabstream import ops


def _max_size_no_room(tmp):
    ops.Categorify(max_size=3)  # 0 padding, 1 null, 2 out-of-vocabulary: nothing left


def _max_size_no_room_with_buckets(tmp):
    ops.Categorify(max_size=10, num_buckets=8)


def _max_size_no_room_for_one_column(tmp):
    ops.Categorify(max_size={"C1": 100, "C2": 2})


def _max_size_negative(tmp):
    ops.Categorify(max_size=-5)


def _vocab_with_nan(tmp):
    ops.Categorify(vocabs={"price": [1.0, float("nan")]}).fit_table(pa.table({"price": [1.0]}))


def _vocab_with_both_zeros(tmp):
    ops.Categorify(vocabs={"price": [0.0, -0.0]}).fit_table(pa.table({"price": [1.0]}))


def _vocab_over_max_size(tmp):
    ops.Categorify(vocabs={"city": ["a", "b", "c"]}, max_size=5).fit_table(pa.table({"city": ["a"]}))


def _hash_bucket_zero(tmp):
    ops.HashBucket({"C1": 10, "C2": 0})


def _hash_bucket_text(tmp):
    ops.HashBucket("100")


def _hashed_cross_negative(tmp):
    ops.HashedCross(-1)


def _parquet_nan_is_missing(tmp):
    """NaN stored in parquet is missing (id 1), like null, and -0.0 is 0.0."""
    values = [1.5, math.nan, None, -0.0, 0.0, 1.5, math.inf, math.nan]
    pq.write_table(pa.table({"x": pa.array(values, from_pandas=False)}), tmp / "x.parquet")
    ds = ts.Dataset(str(tmp / "x.parquet"))
    wf = ts.Workflow(["x"] >> ops.Categorify()).fit(ds)
    got = wf.transform(ds).compute()["x"].to_numpy()
    raw = pd.read_parquet(tmp / "x.parquet")["x"]
    plain = raw.where(raw != 0, 0.0)  # -0.0 -> 0.0; NaN stays NaN, dropped below
    counts = plain.value_counts(dropna=True)
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ids = {v: 3 + i for i, (v, _) in enumerate(order)}
    expected = np.array([1 if pd.isna(v) else ids[v] for v in plain], dtype=np.int64)
    np.testing.assert_array_equal(got, expected)
    assert wf.output_schema["x"].cardinality == 3 + len(order)


CASES = [
    ("max_size without room for a value", _max_size_no_room, ValueError,
     r"max_size=3 leaves no room for a vocabulary.*reserves 3 rows.*use max_size > 3, or 0"),
    ("max_size eaten by num_buckets", _max_size_no_room_with_buckets, ValueError,
     r"max_size=10 leaves no room.*reserves 10 rows.*num_buckets=8"),
    ("max_size too small for one column", _max_size_no_room_for_one_column, ValueError,
     r"max_size=2 for 'C2' leaves no room"),
    ("negative max_size", _max_size_negative, ValueError, r"max_size must be a non-negative integer, got -5"),
    ("given vocabulary holds NaN", _vocab_with_nan, ValueError,
     r"vocabulary given for 'price' contains a missing value \(None or NaN\)"),
    ("given vocabulary holds 0.0 and -0.0", _vocab_with_both_zeros, ValueError,
     r"'price' has duplicate values \(-0.0 and 0.0 are one value\)"),
    ("given vocabulary larger than max_size", _vocab_over_max_size, ValueError,
     r"vocabulary given for 'city' has 3 values, but max_size=5 leaves room for 2"),
    ("HashBucket with zero buckets", _hash_bucket_zero, ValueError,
     r"HashBucket: num_buckets for 'C2' must be a positive integer, got 0"),
    ("HashBucket with text buckets", _hash_bucket_text, TypeError,
     r"HashBucket: num_buckets must be a positive integer, got str '100'"),
    ("HashedCross with negative buckets", _hashed_cross_negative, ValueError,
     r"HashedCross: num_buckets must be a positive integer, got -1"),
    ("NaN in parquet is missing", _parquet_nan_is_missing, None, None),
]

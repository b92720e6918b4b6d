"""Op parameters a user gets wrong (continuous, statistics, structural and list ops)."""

from __future__ import annotations

import math

import pyarrow as pa

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, SchemaError
from tabstream.testing import assert_tables_equal

TABLE = pa.table({
    "x": pa.array([1.5, None, float("nan"), -0.0, float("inf")]),
    "i8": pa.array([1, None, -3, 0, 7], pa.int8()),
    "s": pa.array(["a", "", None, "b", "a"]),
    "b": pa.array([True, None, False, True, False]),
    "l": pa.array([[1, 2], None, [], [3], [4, 5, 6]], pa.list_(pa.int8())),
    "t": pa.array(["1|2", "", None, "x|3", "4"]),
})


def _fit(columns, op):
    return ts.Workflow(columns >> op).fit_transform(TABLE)


def _clip_as_ints_beyond_the_dtype(tmp):
    # a bound no int8 can cross changes nothing and keeps the dtype (pandas: same values)
    out = _fit(["i8"], ops.Clip(min_value=-1000, max_value=1000))
    assert out["i8"].type == pa.int8() and out["i8"].to_pylist() == TABLE["i8"].to_pylist()


def _clip_with_infinite_bound(tmp):
    out = _fit(["i8", "x"], ops.Clip(max_value=math.inf))
    assert out["i8"].type == pa.int8() and out["i8"].to_pylist() == TABLE["i8"].to_pylist()
    assert out["x"].is_null().to_pylist() == TABLE["x"].is_null().to_pylist()


def _fill_int_with_inf(tmp):
    out = _fit(["i8"], ops.FillMissing(math.inf))
    expected = [math.inf if v is None else float(v) for v in TABLE["i8"].to_pylist()]
    assert out["i8"].type == pa.float64() and out["i8"].to_pylist() == expected


def _reduce_to_float64_keeps_large_values(tmp):
    table = pa.table({"x": [1.0, math.nan, None, -1e300, math.inf]})
    out = ts.Workflow(["x"] >> ops.ReduceDtypeSize(float_dtype="float64")).fit_transform(table)
    assert_tables_equal(out, table)


CASES = [
    # Clip
    ("Clip min above max", lambda tmp: ops.Clip(min_value=5, max_value=1), ValueError,
     "min_value 5 is greater than max_value 1"),
    ("Clip without bounds", lambda tmp: ops.Clip(), ValueError, "Clip needs min_value, max_value or both"),
    ("Clip NaN bound", lambda tmp: ops.Clip(min_value=math.nan), ValueError,
     "min_value must be a number, got NaN"),
    ("Clip string bound", lambda tmp: ops.Clip(max_value="10"), TypeError, "max_value must be a number, got '10'"),
    ("Clip on a string column", lambda tmp: _fit(["s"], ops.Clip(0)), TypeError,
     "Clip needs numeric columns, but column 's' is string"),
    ("Clip on a bool column", lambda tmp: _fit(["b"], ops.Clip(0, 1)), TypeError,
     "Clip needs integer or float columns, but column 'b' is bool"),
    ("Clip bound no int8 can hold", lambda tmp: _fit(["i8"], ops.Clip(min_value=1000)), ValueError,
     r"column 'i8' \(int8, range -128\.\.127\) would become 1000"),
    ("Clip bounds beyond an int8 column", _clip_as_ints_beyond_the_dtype, None, None),
    ("Clip with an infinite bound", _clip_with_infinite_bound, None, None),
    # FillMissing / FillMedian
    ("FillMissing NaN", lambda tmp: ops.FillMissing(math.nan), ValueError, "fill_val must be a number, got NaN"),
    ("FillMissing string", lambda tmp: ops.FillMissing("0"), TypeError, "fill_val must be a number, got '0'"),
    ("FillMissing value no int8 can hold", lambda tmp: _fit(["i8"], ops.FillMissing(1000)), ValueError,
     r"fill_val 1000 does not fit column 'i8' of dtype int8 \(range -128\.\.127\)"),
    ("FillMissing inf in an int column", _fill_int_with_inf, None, None),
    ("FillMissing on a list column", lambda tmp: _fit(["l"], ops.FillMissing(0)), TypeError,
     "FillMissing needs numeric columns, but column 'l' is a list of int8"),
    ("FillMedian flag not a bool", lambda tmp: ops.FillMedian(add_binary_cols="yes"), TypeError,
     "add_binary_cols must be True or False, got 'yes'"),
    # LogOp / Normalize / NormalizeMinMax
    ("LogOp on a string column", lambda tmp: _fit(["s"], ops.LogOp()), TypeError,
     "LogOp needs numeric columns, but column 's' is string"),
    # a list of numbers is normalized element-wise (as NVTabular); strings are not numbers
    ("Normalize on a string column", lambda tmp: _fit(["s"], ops.Normalize()), TypeError,
     "Normalize needs numeric columns, but column 's' is string"),
    ("NormalizeMinMax on a string column", lambda tmp: _fit(["s"], ops.NormalizeMinMax()), TypeError,
     "NormalizeMinMax needs numeric columns, but column 's' is string"),
    # Bucketize
    ("Bucketize unsorted boundaries", lambda tmp: ops.Bucketize([3, 1, 2]), ValueError,
     r"boundaries must be strictly increasing, got \[3, 1, 2\]"),
    ("Bucketize -0.0 and 0.0 boundaries", lambda tmp: ops.Bucketize([-0.0, 0.0]), ValueError,
     "strictly increasing"),
    ("Bucketize NaN boundary", lambda tmp: ops.Bucketize([0, math.nan]), ValueError,
     "boundaries must be finite numbers"),
    ("Bucketize inf boundary", lambda tmp: ops.Bucketize([0, math.inf]), ValueError,
     "boundaries must be finite numbers"),
    ("Bucketize empty boundaries", lambda tmp: ops.Bucketize([]), TypeError, "non-empty list of numbers"),
    ("Bucketize column without boundaries", lambda tmp: _fit(["x", "i8"], ops.Bucketize({"x": [0.0]})),
     SchemaError, "no boundaries given for column 'i8'"),
    # ReduceDtypeSize / DataStats
    ("ReduceDtypeSize float16", lambda tmp: ops.ReduceDtypeSize(float_dtype="float16"), ValueError,
     "float_dtype must be 'float32' or 'float64', got 'float16'"),
    ("ReduceDtypeSize float beyond float32", lambda tmp: ts.Workflow(["x"] >> ops.ReduceDtypeSize()).fit_transform(
        pa.table({"x": [1.0, math.nan, None, -1e300, math.inf]})), DataError,
     r"column 'x' holds -1e\+300, beyond float32's range .*float_dtype='float64'"),
    ("ReduceDtypeSize float64 keeps it", _reduce_to_float64_keeps_large_values, None, None),
    ("DataStats negative max_exact_distinct", lambda tmp: ops.DataStats(max_exact_distinct=-1), ValueError,
     "max_exact_distinct must be an integer >= 0, got -1"),
    # lists
    ("ListSlice NaN pad in an int list", lambda tmp: _fit(["l"], ops.ListSlice(0, 2, pad=True, pad_value=math.nan)),
     TypeError, "pad_value nan does not fit column 'l', a list of int8"),
    ("ListSlice pad no int8 can hold", lambda tmp: _fit(["l"], ops.ListSlice(0, 2, pad=True, pad_value=300)),
     ValueError, r"pad_value 300 is outside the range of column 'l', a list of int8 \(-128\.\.127\)"),
    ("ListSlice pad with a varying length", lambda tmp: ops.ListSlice(2, -1, pad=True), ValueError,
     "padding needs a fixed slice length"),
    ("ListSlice on a scalar column", lambda tmp: _fit(["x"], ops.ListSlice(2)), TypeError,
     "ListSlice needs list columns, but column 'x' is a scalar float64"),
    ("ValueCount on a scalar column", lambda tmp: _fit(["s"], ops.ValueCount()), TypeError,
     "ValueCount needs list columns, but column 's' is a scalar string"),
    ("SplitList empty separator", lambda tmp: ops.SplitList(""), ValueError,
     "separator must be a non-empty string, got ''"),
    ("SplitList piece that is not an int", lambda tmp: _fit(["t"], ops.SplitList("|", dtype="int64")), DataError,
     r"column 't': cannot convert the pieces split on '\|' to int64"),
    # structural
    ("Rename with nothing", lambda tmp: ops.Rename(), ValueError, "Rename needs exactly one of f, postfix or name"),
    ("Rename one name for two columns", lambda tmp: _fit(["x", "s"], ops.Rename(name="y")), SchemaError,
     r"renames one column, but 2 are selected: \['x', 's'\]"),
    # dtype=None infers the dtype f returns on no rows; f returning another one on data is refused
    ("LambdaOp changes the dtype undeclared", lambda tmp: _fit(["i8"], ops.LambdaOp(_halve_rows)), SchemaError,
     r"returned float64 for column 'i8', which was declared int8.*pass dtype='float64'"),
    ("Filter returning numbers", lambda tmp: _fit(["x"], ops.Filter(_plus_one)), TypeError,
     "Filter: f=_plus_one must return booleans, got double"),
]


def _halve_rows(s):
    return s / 2 if len(s) else s


def _plus_one(df):
    return df["x"] + 1

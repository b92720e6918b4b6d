"""Numeric, structural and list ops on NaN, null, -0.0, 0.0, ±inf and empty strings,
each against a plain pandas/numpy reference (issue 8, "Nothing silent").

The rules the references encode:

* null and NaN are one missing value: every op fills, skips or drops both alike
  (the references see the column through pandas, where both are NaN);
* ``-0.0`` equals ``0.0`` (references compare with ``==``);
* ±inf is a value. Element-wise ops treat it as numpy does (Clip bounds it,
  LogOp gives ``log1p``, Bucketize puts it in the first/last bucket, FillMissing
  and Dropna keep it). Statistics of continuous values (Normalize's mean/std,
  NormalizeMinMax's min/max, FillMedian's median, DataStats' mean/std) use the
  finite values only, so one ``inf`` cannot turn a whole column into NaN.
"""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabstream as ts
from tabstream import ops
from tabstream.testing import assert_tables_equal, nan_to_null, nasty_floats

SEEDS = [0, 1, 2]
SPECIAL = [np.nan, None, -0.0, 0.0, np.inf, -np.inf]


def mixed_floats(seed: int, n: int = 60) -> list:
    """Every special value several times, mixed with ordinary ones, shuffled."""
    rng = np.random.default_rng(seed)
    values = SPECIAL * 4 + [float(v) for v in rng.normal(0, 3, n - 4 * len(SPECIAL)).round(2)]
    return [values[i] for i in rng.permutation(len(values))]


def nasty_ints(seed: int, n: int = 60) -> list:
    rng = np.random.default_rng(seed + 100)
    return [None if rng.random() < 0.2 else int(v) for v in rng.integers(-5, 40, n)]


def nasty_table(seed: int) -> pa.Table:
    return pa.table({"x": pa.array(mixed_floats(seed), pa.float64()),
                     "i": pa.array(nasty_ints(seed), pa.int64())})


def as_pandas_float(column) -> np.ndarray:
    """What a pandas user holds: float64 with NaN for null and NaN alike."""
    return pd.Series(column.to_pylist(), dtype="float64").to_numpy()


def fit_transform(node, table, parts: int = 4):
    ds = ts.Dataset(table, part_size=max(1, table.nbytes // parts))
    assert ds.npartitions > 1
    wf = ts.Workflow(node).fit(ds)
    return wf, wf.transform(table)


def values(column) -> np.ndarray:
    """float64 numpy with nulls as NaN (for comparing up to NaN vs null)."""
    return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def assert_same_floats(got, expected, rtol=0.0, atol=0.0):
    """Equal with NaN == NaN (null counts as NaN), -0.0 == 0.0, ±inf exact."""
    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, equal_nan=True)


# -- continuous.py ---------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("fill", [0, -1.5])
def test_fill_missing_fills_nan_and_null_and_keeps_inf(seed, fill):
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.FillMissing(fill, add_binary_cols=True), t)
    x = pd.Series(as_pandas_float(t["x"]))
    i = pd.Series(t["i"].to_pylist(), dtype="Int64")
    assert out["x"].null_count == 0
    assert_same_floats(values(out["x"]), x.fillna(fill))
    assert out["x_filled"].to_pylist() == x.isna().tolist()
    assert_same_floats(values(out["i"]), i.astype("float64").fillna(fill))
    assert out["i_filled"].to_pylist() == i.isna().tolist()
    assert out["i"].type == (pa.int64() if float(fill).is_integer() else pa.float64())


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("lo", "hi"), [(0, 2), (-1.5, None), (None, 0.0)])
def test_clip_bounds_inf_and_keeps_missing(seed, lo, hi):
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.Clip(min_value=lo, max_value=hi), t)
    expected = pd.Series(as_pandas_float(t["x"])).clip(lower=lo, upper=hi)
    assert_same_floats(values(out["x"]), expected)
    # missing stays missing of its own kind: NaN stays NaN, null stays null
    assert out["x"].is_null().to_pylist() == t["x"].is_null().to_pylist()
    expected_i = pd.Series(t["i"].to_pylist(), dtype="float64").clip(lower=lo, upper=hi)
    assert_same_floats(values(out["i"]), expected_i)


@pytest.mark.parametrize("seed", SEEDS)
def test_log_op_is_numpy_log1p(seed):
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.LogOp(), t)
    with np.errstate(divide="ignore", invalid="ignore"):
        expected_x = np.log1p(as_pandas_float(t["x"])).astype(np.float32)
        expected_i = np.log1p(values(t["i"])).astype(np.float32)
    assert out["x"].type == pa.float32()
    assert_same_floats(values(out["x"]), expected_x)
    assert_same_floats(values(out["i"]), expected_i)
    assert out["x"].is_null().to_pylist() == t["x"].is_null().to_pylist()
    # -0.0 is 0.0: log1p of both is 0 (and -inf gives NaN, as numpy)
    x = as_pandas_float(t["x"])
    assert (values(out["x"])[x == 0] == 0).all()


def finite_stats(x: np.ndarray) -> tuple[float, float]:
    finite = x[np.isfinite(x)]
    return finite.mean(), finite.std(ddof=1)


@pytest.mark.parametrize("seed", SEEDS)
def test_normalize_skips_missing_and_inf_in_statistics(seed):
    t = nasty_table(seed)
    wf, out = fit_transform(["x", "i"] >> ops.Normalize(), t)
    for name in ("x", "i"):
        x = as_pandas_float(t[name])
        mean, std = finite_stats(x)
        expected = ((x - mean) / std).astype(np.float32)
        assert out[name].type == pa.float32()
        assert_same_floats(values(out[name]), expected, rtol=1e-6)
    # pandas skips NaN in mean/std: over the finite values the statistics agree
    x = pd.Series(as_pandas_float(t["x"]))
    x = x[np.isfinite(x)]
    mean, std = finite_stats(as_pandas_float(t["x"]))
    assert math.isclose(mean, x.mean(), rel_tol=1e-12) and math.isclose(std, x.std(), rel_tol=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_normalize_min_max_over_finite_values(seed):
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.NormalizeMinMax(), t)
    for name in ("x", "i"):
        x = as_pandas_float(t[name])
        finite = x[np.isfinite(x)]
        lo, hi = finite.min(), finite.max()
        assert_same_floats(values(out[name]), ((x - lo) / (hi - lo)).astype(np.float32), rtol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_fill_median_fills_nan_and_null_with_median_of_finite_values(seed):
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.FillMedian(add_binary_cols=True), t)
    for name in ("x", "i"):
        x = pd.Series(as_pandas_float(t[name]))
        median = x[np.isfinite(x)].median()
        assert_same_floats(values(out[name]), x.fillna(median))
        assert out[name].null_count == 0
        assert out[f"{name}_filled"].to_pylist() == x.isna().tolist()


def test_fill_median_counts_negative_zero_as_zero():
    # the median of [-0.0, 0.0, 0.0, 5.0] is 0.0 whatever the zeros' signs
    t = pa.table({"x": pa.array([-0.0, 0.0, None, float("nan"), 0.0, 5.0, -0.0])})
    _, out = fit_transform(["x"] >> ops.FillMedian(), t, parts=3)
    x = pd.Series(as_pandas_float(t["x"]))
    assert_same_floats(values(out["x"]), x.fillna(x.median()))


@pytest.mark.parametrize("seed", SEEDS)
def test_bucketize_is_numpy_digitize_with_missing_as_null(seed):
    boundaries = [-1.0, 0.0, 2.5]
    t = nasty_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.Bucketize(boundaries), t)
    for name in ("x", "i"):
        x = as_pandas_float(t[name])
        expected = np.digitize(x, boundaries, right=False)
        got = out[name].to_pylist()
        assert got == [None if np.isnan(v) else int(e) for v, e in zip(x, expected)]
    # -0.0 falls in the same bucket as 0.0 (the boundary itself)
    x = as_pandas_float(t["x"])
    zero_buckets = {got for v, got in zip(x, out["x"].to_pylist()) if v == 0}
    assert zero_buckets == {2}


@pytest.mark.parametrize("seed", SEEDS)
def test_reduce_dtype_size_keeps_every_special_value(seed):
    t = nasty_table(seed)
    wf, out = fit_transform(["x", "i"] >> ops.ReduceDtypeSize(), t)
    assert out["x"].type == pa.float32()
    expected = np.asarray(as_pandas_float(t["x"]), dtype=np.float32)
    assert_same_floats(values(out["x"]), expected)
    assert out["x"].is_null().to_pylist() == t["x"].is_null().to_pylist()
    assert np.array_equal(np.signbit(values(out["x"])), np.signbit(as_pandas_float(t["x"])))
    i = pd.Series(t["i"].to_pylist(), dtype="Int64")
    lo, hi = int(i.min()), int(i.max())
    dtype = next(d for d in ("int8", "int16", "int32", "int64")
                 if np.iinfo(d).min <= lo and hi <= np.iinfo(d).max)
    assert out["i"].type == pa.from_numpy_dtype(np.dtype(dtype))
    assert out["i"].to_pylist() == t["i"].to_pylist()


def _reference_stats(values_: list) -> dict:
    """DataStats of one scalar column computed with pandas / plain Python."""
    present = [v for v in values_ if v is not None and not (isinstance(v, float) and math.isnan(v))]
    out = {"count": len(present), "null_count": len(values_) - len(present),
           "distinct": len(set(present))}  # set(): -0.0 and 0.0 are one value
    if present:
        out["min"], out["max"] = min(present), max(present)
    if present and not isinstance(present[0], str):
        x = np.asarray(present, dtype=np.float64)
        finite = pd.Series(x[np.isfinite(x)])
        out["inf_count"] = int(np.isinf(x).sum())
        out["mean"] = finite.mean() if len(finite) else None
        out["std"] = finite.std() if len(finite) > 1 else None
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_data_stats_against_pandas(seed):
    rng = np.random.default_rng(seed)
    t = nasty_table(seed)
    strings = [["", None, "a", "b", " ", "0"][k] for k in rng.integers(0, 6, t.num_rows)]
    lists = [None if rng.random() < 0.1 else [mixed_floats(seed)[k] for k in rng.integers(0, 60, rng.integers(0, 4))]
             for _ in range(t.num_rows)]
    t = t.append_column("s", pa.array(strings, pa.string())).append_column("l", pa.array(lists, pa.list_(pa.float64())))
    wf, out = fit_transform(["x", "i", "s", "l"] >> ops.DataStats(), t)
    assert_tables_equal(out, t)
    stats = next(n.op for n in wf.output_node.walk() if n.kind == "op").stats
    flat = [v for row in lists if row is not None for v in row]
    for name, column in (("x", t["x"].to_pylist()), ("i", t["i"].to_pylist()), ("s", strings), ("l", flat)):
        expected = _reference_stats(column)
        got = stats[name]
        if name == "l":
            # rows: null rows are missing; elements: their own counts go to min/max/mean
            lengths = [len(r) for r in lists if r is not None]
            assert (got["list_length_min"], got["list_length_max"]) == (min(lengths), max(lengths))
            assert got["null_count"] == sum(r is None for r in lists)
            expected.pop("count"), expected.pop("null_count")
        for key, value in expected.items():
            if isinstance(value, float) and key in ("mean", "std"):
                assert math.isclose(got[key], value, rel_tol=1e-12), (name, key)
            else:
                assert got[key] == value, (name, key, got[key], value)


# -- structural.py -------------------------------------------------------------------
def structural_table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    t = nasty_table(seed)
    strings = [["", None, "a", "b"][k] for k in rng.integers(0, 4, t.num_rows)]
    lists = [None if rng.random() < 0.15 else [int(v) for v in rng.integers(0, 5, rng.integers(0, 3))]
             for _ in range(t.num_rows)]
    return (t.append_column("s", pa.array(strings, pa.string()))
             .append_column("l", pa.array(lists, pa.list_(pa.int64()))))


@pytest.mark.parametrize("seed", SEEDS)
def test_rename_keeps_every_value_exactly(seed):
    t = structural_table(seed)
    _, out = fit_transform(["x", "i", "s", "l"] >> ops.Rename(postfix="_r"), t)
    assert_tables_equal(out, t.rename_columns([f"{c}_r" for c in t.column_names]))
    # NaN stays NaN and null stays null (no silent conversion either way)
    assert out["x_r"].is_null().to_pylist() == t["x"].is_null().to_pylist()


def keep_positive_x(df):
    return df["x"] > 0


def keep_nonzero_i(df):
    return df["i"] != 0


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("f", [keep_positive_x, keep_nonzero_i])
def test_filter_like_pandas_boolean_indexing(seed, f):
    t = structural_table(seed)
    _, out = fit_transform(["x", "i", "s", "l"] >> ops.Filter(f), t)
    df = t.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    keep = pd.Series(f(df)).fillna(False).astype(bool).to_numpy()  # a missing answer drops the row
    assert_tables_equal(out, t.filter(pa.array(keep)))
    # +inf > 0 is kept, -0.0 > 0 is not
    if f is keep_positive_x:
        assert np.isposinf(values(out["x"])).sum() == np.isposinf(values(t["x"])).sum() > 0
        assert (values(out["x"]) != 0).all()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("columns", [["x"], ["i", "s"], ["x", "i", "s", "l"]])
def test_dropna_drops_nan_and_null_like_pandas(seed, columns):
    t = structural_table(seed).select(columns)
    _, out = fit_transform(columns >> ops.Dropna(), t)
    df = t.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    kept = df.dropna().index.to_numpy()  # "" and [] and ±inf are values, as in pandas
    assert_tables_equal(out, t.take(pa.array(kept, pa.int64())))


def double(s):
    return s * 2


def is_empty_string(s):
    return s == ""


@pytest.mark.parametrize("seed", SEEDS)
def test_lambda_op_sees_missing_as_missing(seed):
    t = structural_table(seed)
    _, out = fit_transform(["x", "i"] >> ops.LambdaOp(double), t)
    assert_same_floats(values(out["x"]), as_pandas_float(t["x"]) * 2)
    assert out["i"].type == pa.int64()
    assert out["i"].to_pylist() == [None if v is None else 2 * v for v in t["i"].to_pylist()]
    _, out = fit_transform(["s"] >> ops.LambdaOp(is_empty_string, dtype="bool"), t)
    # pandas' string dtype answers False (not NA) for a missing string: f's own answer
    expected = is_empty_string(pd.Series(t["s"].to_pylist(), dtype="str"))
    assert out["s"].to_pylist() == expected.tolist()
    assert sum(out["s"].to_pylist()) == t["s"].to_pylist().count("") > 0


# -- lists.py --------------------------------------------------------------------------
def _split_reference(text, cast):
    return None if text is None else [] if text == "" else [cast(p) for p in text.split("|")]


def test_split_list_strings_empty_pieces_and_nulls():
    texts = ["a|b", "", None, "a||b", "|", " ", "x"]
    t = pa.table({"t": pa.array(texts * 3, pa.string())})
    _, out = fit_transform(["t"] >> ops.SplitList("|"), t)
    assert out["t"].to_pylist() == [_split_reference(s, str) for s in texts * 3]


def test_split_list_floats_parse_nan_inf_and_negative_zero():
    texts = ["1.5|-0.0", "nan|inf|-inf", "", None, "0|-0"]
    t = pa.table({"t": pa.array(texts * 3, pa.string())})
    _, out = fit_transform(["t"] >> ops.SplitList("|", dtype="float64"), t)
    got, expected = out["t"].to_pylist(), [_split_reference(s, float) for s in texts * 3]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert (g is None) == (e is None)
        if e is not None:
            assert_same_floats(g, e)
            assert np.array_equal(np.signbit(g), np.signbit(e))


def nasty_lists(seed: int, n: int = 60) -> list:
    rng = np.random.default_rng(seed)
    elements = mixed_floats(seed)
    return [None if rng.random() < 0.1 else [elements[k] for k in rng.integers(0, 60, rng.integers(0, 6))]
            for _ in range(n)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("start", "end", "pad"), [(2, None, False), (-2, None, False), (1, 4, False),
                                                     (0, 3, True), (-3, None, True)])
def test_list_slice_is_python_slicing_and_keeps_element_values(seed, start, end, pad):
    rows = nasty_lists(seed)
    t = pa.table({"l": pa.array(rows, pa.list_(pa.float64()))})
    _, out = fit_transform(["l"] >> ops.ListSlice(start, end, pad=pad, pad_value=-9.0), t)
    lo, hi = (0, start) if end is None and start > 0 else (start, end)
    if pad:
        n = (hi - lo) if hi is not None else -lo
        expected = [(r or [])[lo:hi] + [-9.0] * (n - len((r or [])[lo:hi])) for r in rows]
    else:
        expected = [None if r is None else r[lo:hi] for r in rows]
    # NaN elements stay NaN, null elements stay null, -0.0 stays -0.0
    assert_tables_equal(out, pa.table({"l": pa.array(expected, pa.list_(pa.float64()))}))


@pytest.mark.parametrize("seed", SEEDS)
def test_value_count_lengths_with_null_rows_as_empty(seed):
    rows = nasty_lists(seed)
    t = pa.table({"l": pa.array(rows, pa.list_(pa.float64()))})
    wf, out = fit_transform(["l"] >> ops.ValueCount(), t)
    lengths = [len(r or []) for r in rows]  # null element values still count as elements
    assert wf.output_schema["l"].properties["value_count"] == {"min": min(lengths), "max": max(lengths)}
    assert_tables_equal(out, t)


def test_nan_to_null_helper_agrees_with_pandas():
    t = nasty_table(0)
    got = nan_to_null(t)["x"]
    assert got.is_null().to_pylist() == pd.Series(as_pandas_float(t["x"])).isna().tolist()


@pytest.mark.parametrize(("lo", "hi"), [(-1000, 1000), (None, math.inf), (-math.inf, 3), (-2, math.inf),
                                        (0.5, None), (None, -math.inf)])
def test_clip_int_columns_with_wide_or_infinite_bounds_like_pandas(lo, hi):
    t = pa.table({"i": pa.array(nasty_ints(0), pa.int8()), "u": pa.array([None, 0, 5, 200] * 15, pa.uint8())})
    wf, out = fit_transform(["i", "u"] >> ops.Clip(min_value=lo, max_value=hi), t)
    for name in ("i", "u"):
        expected = pd.Series(values(t[name])).clip(lower=lo, upper=hi)
        assert_same_floats(values(out[name]), expected)
        # the dtype changes only when a bound that applies is not a whole number
        needs_float = (lo is not None and not float(lo).is_integer() and lo > -math.inf) or \
                      (hi is not None and not float(hi).is_integer() and hi < math.inf) or hi == -math.inf
        assert out[name].type == (pa.float64() if needs_float else t[name].type)
        assert wf.output_schema[name].dtype == ("float64" if needs_float else str(t[name].type))


@pytest.mark.parametrize("fill", [math.inf, -math.inf, 2.5, 100])
def test_fill_missing_int_columns_like_pandas(fill):
    t = pa.table({"i": pa.array(nasty_ints(1), pa.int8())})
    _, out = fit_transform(["i"] >> ops.FillMissing(fill), t)
    expected = pd.Series(values(t["i"])).fillna(fill)
    assert_same_floats(values(out["i"]), expected)
    assert out["i"].type == (pa.int8() if float(fill).is_integer() else pa.float64())


@pytest.mark.parametrize("fill", [1, 0, 1.0])
def test_fill_missing_bool_columns_take_a_bool(fill):
    t = pa.table({"b": pa.array([True, None, False, None], pa.bool_())})
    _, out = fit_transform(["b"] >> ops.FillMissing(fill), t)
    assert out["b"].type == pa.bool_()
    assert out["b"].to_pylist() == [True, bool(fill), False, bool(fill)]


@pytest.mark.parametrize("fill", [0.5, -7, 2, math.inf])
def test_fill_missing_refuses_a_number_a_bool_column_cannot_hold(fill):
    """pandas refuses them; a cast to bool made each of them True, silently."""
    t = pa.table({"b": pa.array([True, None, False], pa.bool_())})
    with pytest.raises(ValueError, match=r"FillMissing: fill_val .* does not fit the bool column 'b'"):
        fit_transform(["b"] >> ops.FillMissing(fill), t)


def float32_and_bool_table(seed: int) -> pa.Table:
    rng = np.random.default_rng(seed)
    return pa.table({"f": pa.array(mixed_floats(seed), pa.float32()),
                     "b": pa.array([None if rng.random() < 0.2 else bool(v) for v in rng.integers(0, 2, 60)],
                                   pa.bool_())})


@pytest.mark.parametrize("seed", SEEDS)
def test_log_op_on_float32_and_nullable_bool_columns(seed):
    t = float32_and_bool_table(seed)
    _, out = fit_transform(["f", "b"] >> ops.LogOp(), t)
    for name in ("f", "b"):
        with np.errstate(divide="ignore", invalid="ignore"):
            expected = np.log1p(values(t[name])).astype(np.float32)
        assert out[name].type == pa.float32()
        assert_same_floats(values(out[name]), expected)
        assert out[name].is_null().to_pylist() == t[name].is_null().to_pylist()


@pytest.mark.parametrize("seed", SEEDS)
def test_statistics_ops_on_float32_and_bool_columns(seed):
    t = float32_and_bool_table(seed)
    _, norm = fit_transform(["f", "b"] >> ops.Normalize(), t)
    _, minmax = fit_transform(["f", "b"] >> ops.NormalizeMinMax(), t)
    _, median = fit_transform(["f", "b"] >> ops.FillMedian(), t)
    for name in ("f", "b"):
        x = values(t[name])
        mean, std = finite_stats(x)
        assert_same_floats(values(norm[name]), ((x - mean) / std).astype(np.float32), rtol=1e-6)
        finite = x[np.isfinite(x)]
        expected = ((x - finite.min()) / (finite.max() - finite.min())).astype(np.float32)
        assert_same_floats(values(minmax[name]), expected, rtol=1e-6)
        assert_same_floats(values(median[name]), pd.Series(x).fillna(np.median(finite)))
    assert median["f"].type == pa.float32() and median["b"].type == pa.float64()


def test_fill_median_of_zeros_fills_positive_zero():
    # -0.0 and 0.0 are one value: the median of signed zeros is written as 0.0
    t = pa.table({"x": pa.array([-0.0, None, -0.0, float("nan"), 0.0, -0.0])})
    _, out = fit_transform(["x"] >> ops.FillMedian(), t, parts=3)
    filled = values(out["x"])[pd.Series(as_pandas_float(t["x"])).isna().to_numpy()]
    assert len(filled) == 2 and (filled == 0).all() and not np.signbit(filled).any()


# -- properties over any mix of special values and any partitioning --------------
def _workflow_output(op, values_, parts):
    t = pa.table({"x": pa.array(values_, pa.float64())})
    ds = ts.Dataset(t, part_size=max(1, t.nbytes // parts))
    wf = ts.Workflow(["x"] >> op).fit(ds)
    return wf.transform(t)["x"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nasty_floats(min_size=1, bound=1000, step=0.125), st.integers(1, 5))
def test_continuous_ops_match_references_on_any_special_values(values_, parts):
    x = pd.Series(values_, dtype="float64").to_numpy()  # pandas: null and NaN are NaN
    finite = x[np.isfinite(x)]
    missing = np.isnan(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        # FillMissing / Clip / LogOp / Bucketize: element-wise, as pandas and numpy
        assert_same_floats(values(_workflow_output(ops.FillMissing(-7), values_, parts)), np.where(missing, -7, x))
        assert_same_floats(values(_workflow_output(ops.Clip(-1, 2), values_, parts)), np.clip(x, -1, 2))
        assert_same_floats(values(_workflow_output(ops.LogOp(), values_, parts)),
                           np.log1p(x).astype(np.float32))
        got = _workflow_output(ops.Bucketize([-1.0, 0.0, 5.0]), values_, parts).to_pylist()
        assert got == [None if m else int(b) for m, b in zip(missing, np.digitize(x, [-1.0, 0.0, 5.0]))]
        # Normalize / NormalizeMinMax / FillMedian: statistics over the finite values
        mean = finite.mean() if len(finite) else 0.0
        std = finite.std(ddof=1) if len(finite) > 1 else 0.0
        expected = ((x - mean) / (std if std > 0 else 1.0)).astype(np.float32)
        assert_same_floats(values(_workflow_output(ops.Normalize(), values_, parts)), expected,
                           rtol=1e-6, atol=1e-6)
        lo, hi = (finite.min(), finite.max()) if len(finite) else (0.0, 0.0)
        expected = ((x - lo) / (hi - lo if hi > lo else 1.0)).astype(np.float32)
        assert_same_floats(values(_workflow_output(ops.NormalizeMinMax(), values_, parts)), expected,
                           rtol=1e-6, atol=1e-6)
        expected = np.where(missing, np.median(finite), x) if len(finite) else x
        assert_same_floats(values(_workflow_output(ops.FillMedian(), values_, parts)), expected)
    # Dropna keeps exactly what pandas' dropna keeps (±inf, -0.0 included)
    kept = _workflow_output(ops.Dropna(), values_, parts)
    assert_same_floats(values(kept), pd.Series(x).dropna().to_numpy())

"""Statistics ops (tabstream.ops.statistics) against plain numpy/pandas references."""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tabstream as ts
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.ops import AddTags, Categorify
from tabstream.ops.statistics import (
    Bucketize,
    DataStats,
    DropLowCardinality,
    FillMedian,
    NormalizeMinMax,
    ReduceDtypeSize,
)

SEEDS = [0, 1]
SMALL_PART = 1_500  # bytes: several partitions for the tables below


def raw(seed: int, n: int = 400) -> pa.Table:
    """Continuous columns with nulls, NaN and ±inf; ints with nulls; strings; lists."""
    rng = np.random.default_rng(seed)
    x = rng.normal(3.0, 2.0, n).round(3)
    x[rng.random(n) < 0.05] = np.nan
    x[rng.choice(n, 3, replace=False)] = np.inf
    x[rng.choice(n, 2, replace=False)] = -np.inf
    i = rng.integers(-50, 200, n)
    s = np.array(["a", "b", "c", "", "e"])[rng.integers(0, 5, n)]
    lists = [list(rng.integers(0, 9, rng.integers(0, 4))) for _ in range(n)]
    return pa.table({
        "x": pa.array(x, mask=rng.random(n) < 0.1),
        "i": pa.array(i, mask=rng.random(n) < 0.1),
        "s": pa.array(s, mask=rng.random(n) < 0.1),
        "l": pa.array(lists, type=pa.list_(pa.int64()), mask=rng.random(n) < 0.1),
    })


def fit(node, table, part_size=None):
    ds = ts.Dataset(table, part_size=part_size)
    if part_size is not None:
        assert ds.npartitions > 1
    return ts.Workflow(node).fit(ds)


def missing_as_nan(column) -> np.ndarray:
    return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def nulls(column) -> np.ndarray:
    return np.asarray(column.is_null().to_numpy(zero_copy_only=False), dtype=bool)


def assert_tables_equal(got: pa.Table, expected: pa.Table) -> None:
    assert got.schema == expected.schema
    for name in got.column_names:
        np.testing.assert_array_equal(nulls(got[name]), nulls(expected[name]))
    pd.testing.assert_frame_equal(got.to_pandas(), expected.to_pandas())


# -- NormalizeMinMax ------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("part_size", [None, SMALL_PART])
def test_normalize_minmax_matches_numpy(seed, part_size):
    t = raw(seed)
    wf = fit(["x", "i"] >> NormalizeMinMax(), t, part_size)
    out = wf.transform(t)
    for col in ["x", "i"]:
        x = missing_as_nan(t[col])
        finite = x[np.isfinite(x)]
        with np.errstate(invalid="ignore"):
            expected = ((x - finite.min()) / (finite.max() - finite.min())).astype(np.float32)
        assert out[col].type == pa.float32()
        np.testing.assert_allclose(missing_as_nan(out[col]), expected, rtol=1e-6, equal_nan=True)
        np.testing.assert_array_equal(nulls(out[col]), nulls(t[col]))  # nulls stay null, NaN stays NaN
    assert ts.Tags.CONTINUOUS in wf.output_schema["x"].tags


@pytest.mark.parametrize("op", [NormalizeMinMax, ts.ops.Normalize])
def test_int64_values_past_2_53_are_scaled_as_numpy_converts_them(op):
    """Integers past 2**53 (ids, timestamps in ns) are rounded to the nearest float64,
    as numpy converts them; Arrow's safe cast refused them with a raw ArrowInvalid."""
    values = np.array([2**63 - 1, 0, 7, 2**53 + 1, -(2**62)], dtype=np.int64)
    t = pa.table({"big": pa.array(values)})
    out = fit(["big"] >> op(), t, None).transform(t)
    x = values.astype(np.float64)
    if op is NormalizeMinMax:
        expected = (x - x.min()) / (x.max() - x.min())
    else:
        expected = (x - x.mean()) / x.std(ddof=1)
    np.testing.assert_allclose(out["big"].to_numpy(), expected.astype(np.float32), rtol=1e-5, atol=1e-12)


def test_normalize_minmax_constant_and_empty_columns():
    t = pa.table({"c": [4.0, None, 4.0, float("inf")], "e": pa.array([None, float("nan"), None, None])})
    out = NormalizeMinMax().fit_table(t).transform(pa.table({"c": [4.0, 6.0, None, 1.0],
                                                             "e": [1.0, 2.0, None, 3.0]}))
    assert out["c"].to_pylist() == [0.0, 2.0, None, -3.0]   # range 0: x - min
    assert out["e"].to_pylist() == [1.0, 2.0, None, 3.0]    # nothing finite at fit: passes through


# -- FillMedian ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_fill_median_exact_and_identical_on_partitions(seed):
    t = raw(seed)
    whole = fit(["x", "i"] >> FillMedian(add_binary_cols=True), t)
    parts = fit(["x", "i"] >> FillMedian(add_binary_cols=True), t, SMALL_PART)
    op_whole, op_parts = whole.output_node.op, parts.output_node.op
    assert op_whole.get_state() == op_parts.get_state()          # exact: identical medians
    out = parts.transform(t)
    assert out.column_names == ["x", "x_filled", "i", "i_filled"]
    assert out["i"].type == pa.float64() and out["x"].type == pa.float64()
    for col in ["x", "i"]:
        x = missing_as_nan(t[col])
        median = np.median(x[np.isfinite(x)])
        assert op_parts.medians[col] == median
        expected = np.where(np.isnan(x), median, x)                # ±inf is kept, not filled
        np.testing.assert_array_equal(out[col].to_numpy(), expected)
        np.testing.assert_array_equal(out[f"{col}_filled"].to_numpy(zero_copy_only=False), np.isnan(x))


def test_fill_median_even_count_and_all_missing():
    t = pa.table({"i": pa.array([1, 2, None, 4, 10]), "e": pa.array([None, float("nan"), None, None, None])})
    op = FillMedian().fit_table(t)
    out = op.transform(t)
    assert op.medians["i"] == np.median([1, 2, 4, 10])
    assert out["i"].to_pylist() == [1.0, 2.0, np.median([1, 2, 4, 10]), 4.0, 10.0]
    assert op.medians["e"] is None
    assert nulls(out["e"]).tolist() == nulls(t["e"]).tolist()   # no median: stays missing


def test_fill_median_rejects_strings_and_bad_flag():
    with pytest.raises(TypeError, match="FillMedian needs numeric columns, but column 's' is string"):
        ts.Workflow(["s"] >> FillMedian()).fit_schema(ts.Dataset(raw(0)).schema)
    with pytest.raises(TypeError, match="add_binary_cols must be True or False"):
        FillMedian(add_binary_cols="yes")


# -- Bucketize ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_bucketize_matches_digitize(seed):
    t = raw(seed)
    bounds = {"x": [-1.0, 0.0, 2.5, 4.0], "i": [0, 100]}
    wf = fit(["x", "i"] >> Bucketize(bounds), t)
    out = wf.transform(t)
    for col, b in bounds.items():
        x = missing_as_nan(t[col])
        missing = np.isnan(x)
        assert out[col].type == pa.int64()
        np.testing.assert_array_equal(nulls(out[col]), missing)   # null and NaN -> null
        got = out[col].to_numpy(zero_copy_only=False)[~missing]
        np.testing.assert_array_equal(got, np.digitize(x[~missing], b, right=False))
        col_schema = wf.output_schema[col]
        assert col_schema.cardinality == len(b) + 1 and ts.Tags.CATEGORICAL in col_schema.tags
    assert out["x"].to_numpy(zero_copy_only=False)[np.isposinf(missing_as_nan(t["x"]))].tolist() == [4] * 3


def test_bucketize_one_list_for_all_columns():
    t = pa.table({"a": [-5, 0, 9, 10, None], "b": [0.5, 10.0, 11.0, -1.0, 3.0]})
    out = Bucketize([0, 10]).transform(t)
    assert out["a"].to_pylist() == np.digitize([-5, 0, 9, 10], [0, 10]).tolist() + [None]
    assert out["b"].to_pylist() == np.digitize([0.5, 10.0, 11.0, -1.0, 3.0], [0, 10]).tolist()


@pytest.mark.parametrize("bounds, error, match", [
    ([], TypeError, "non-empty list of numbers"),
    ([1, 1, 2], ValueError, "strictly increasing"),
    ([3, 2], ValueError, "strictly increasing"),
    ([0, float("nan")], ValueError, "finite numbers"),
    ({"x": ["a"]}, ValueError, "boundaries of column 'x' must be finite numbers"),
])
def test_bucketize_bad_boundaries(bounds, error, match):
    with pytest.raises(error, match=match):
        Bucketize(bounds)


def test_bucketize_missing_column_in_dict():
    with pytest.raises(SchemaError, match="no boundaries given for column 'i'"):
        ts.Workflow(["x", "i"] >> Bucketize({"x": [0]})).fit_schema(ts.Dataset(raw(0)).schema)


# -- DropLowCardinality ---------------------------------------------------------------------------
def low_card_table(seed: int, n: int = 300) -> pa.Table:
    """Columns of 0 to 4 distinct non-missing values (null, NaN and -0.0 included)."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "const": pa.array(np.full(n, 7.0), mask=rng.random(n) < 0.3),
        "nan_const": pa.array(np.where(rng.random(n) < 0.5, np.nan, 1.0)),   # NaN is missing
        "zeros": pa.array(np.where(rng.random(n) < 0.5, -0.0, 0.0)),          # one value
        "two": pa.array(rng.integers(0, 2, n)),
        "three": pa.array(np.array(["u", "", "w"])[rng.integers(0, 3, n)]),   # "" is a value
        "many": pa.array(rng.integers(0, 50, n)),
        "empty": pa.array([None] * n, type=pa.string()),
        "list2": pa.array([[5, 6][: int(k)] for k in rng.integers(0, 3, n)], type=pa.list_(pa.int64())),
        "price": pa.array(np.full(n, 1.5)),                                     # continuous, constant
        "label": pa.array(np.where(rng.random(n) < 0.5, 0, 1)),                # target, 2 values
    })


LOW_CARD_CATS = ["const", "nan_const", "zeros", "two", "three", "many", "empty", "list2"]


def distinct_non_missing(df: pd.DataFrame, col: str) -> int:
    """Distinct values with NaN/None missing and -0.0 == 0.0 (pandas' own rules)."""
    values = df[col].explode() if col == "list2" else df[col]
    return values.dropna().replace(-0.0, 0.0).nunique()


def tagged(t: pa.Table):
    """Categorical tags (no domain) on LOW_CARD_CATS, a target tag on label."""
    return (LOW_CARD_CATS >> AddTags(["categorical"])) + ["price"] + (["label"] >> AddTags(["target", "categorical"]))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_card", [2, 3, 4, 5, 6])
def test_drop_low_cardinality_judges_categorify_domain(seed, min_card):
    """NVTabular's rule: a categorical column goes when its largest id (domain max) is
    below min_cardinality; after Categorify (ids 0-2 reserved) that is k + 2 for k values."""
    # NaN / -0.0 columns left out: how Categorify encodes them is Categorify's own test
    cats = [c for c in LOW_CARD_CATS if c not in ("nan_const", "zeros")]
    t = low_card_table(seed).drop_columns(["nan_const", "zeros"])
    df = t.to_pandas()
    expected = [c for c in cats if distinct_non_missing(df, c) + 2 >= min_card] + ["price", "label"]
    graph = (cats >> Categorify()) + ["price"] + (["label"] >> AddTags(["target", "categorical"]))
    for part in (None, SMALL_PART):
        op = DropLowCardinality(min_card)
        wf = fit(graph >> op, t, part)
        assert wf.output_schema.column_names == expected
        assert wf.transform(t).column_names == expected
        assert op.dropped == [c for c in cats if c not in expected]
        assert op.distinct == {}                        # the domains decide: nothing counted


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("min_card", [1, 2, 3, 4, 5, 6])
def test_drop_low_cardinality_counts_categoricals_without_domain(seed, min_card):
    t = low_card_table(seed)
    df = t.to_pandas()
    expected = [c for c in LOW_CARD_CATS if distinct_non_missing(df, c) + 2 >= min_card] + ["price", "label"]
    before = ts.Workflow(tagged(t) >> DropLowCardinality(min_card)).fit_schema(ts.Dataset(t).schema)
    assert before.output_schema.column_names == t.column_names[:8] + ["price", "label"]   # unknown yet
    for part in (None, SMALL_PART):
        op = DropLowCardinality(min_card)
        wf = fit(tagged(t) >> op, t, part)
        assert wf.output_schema.column_names == expected
        assert wf.transform(t).column_names == expected
        assert op.distinct == {c: min(distinct_non_missing(df, c), min_card) for c in LOW_CARD_CATS}


def test_drop_low_cardinality_keeps_a_column_whose_largest_id_is_min_cardinality():
    """One value -> ids up to 3, two values -> 4, three -> 5: with min_cardinality=4
    only the one-value column goes (NVTabular drops below, not at, the bound)."""
    df = pd.DataFrame({"one": ["a"] * 5, "two": ["a", "a", "a", "a", "b"], "three": ["a", "a", "b", "b", "c"]})
    wf = ts.Workflow(list(df.columns) >> Categorify() >> DropLowCardinality())
    got = wf.fit_transform(ts.Dataset(df)).to_ddf().compute()
    largest = {c: df[c].nunique() + 2 for c in df.columns}
    expected = [c for c in df.columns if largest[c] >= 4]
    assert expected == ["two", "three"] and list(got.columns) == expected
    for c in expected:   # Categorify's ids: by descending count, ties by value, from 3
        counts = df[c].value_counts()
        order = sorted(counts.index, key=lambda v: (-counts[v], v))
        assert got[c].tolist() == [3 + order.index(v) for v in df[c]]


def test_drop_low_cardinality_keeps_untagged_continuous_and_target():
    t = pa.table({"a": [1, 1, 1], "b": [0.5, 0.5, 0.5], "y": [1, 1, 1]})
    schema = ts.Schema([
        ts.ColumnSchema("a", "int64"),
        ts.ColumnSchema("b", "float64", frozenset({ts.Tags.CONTINUOUS})),
        ts.ColumnSchema("y", "int64", frozenset({ts.Tags.CATEGORICAL, ts.Tags.TARGET}),
                                        {"domain": {"min": 0, "max": 1}}),
    ])
    wf = ts.Workflow(["a", "b", "y"] >> DropLowCardinality(100)).fit(ts.Dataset(t, schema=schema))
    assert wf.transform(t).column_names == ["a", "b", "y"]


@pytest.mark.parametrize("props, kept", [
    ({"domain": {"min": 0, "max": 3}}, False),                         # max 3 < 4
    ({"domain": {"min": 0, "max": 4}}, True),                          # max 4 == 4: kept
    ({"embedding_sizes": {"cardinality": 4, "dimension": 8}}, False),  # ids 0..3
    ({"embedding_sizes": {"cardinality": 5, "dimension": 8}}, True),   # ids 0..4
])
def test_drop_low_cardinality_reads_domain_or_embedding_sizes(props, kept):
    t = pa.table({"c": [3, 4, 3], "d": [9, 9, 9]})
    schema = ts.Schema([ts.ColumnSchema("c", "int64", frozenset({ts.Tags.CATEGORICAL}), props),
                     ts.ColumnSchema("d", "int64", frozenset({ts.Tags.CATEGORICAL}), {"domain": {"min": 0, "max": 99}})])
    wf = ts.Workflow(["c", "d"] >> DropLowCardinality()).fit(ts.Dataset(t, schema=schema))
    assert wf.transform(t).column_names == (["c", "d"] if kept else ["d"])


def test_drop_low_cardinality_save_load_keeps_fitted_counts(tmp_path):
    t = low_card_table(2)
    wf = fit(tagged(t) >> DropLowCardinality(4), t, SMALL_PART)
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert again.output_schema == wf.output_schema
    assert_tables_equal(again.transform(t), wf.transform(t))
    assert len(wf.transform(t).column_names) < t.num_columns


def test_drop_low_cardinality_refuses_a_categorical_it_never_counted():
    t = pa.table({"a": [1, 1, 2]})
    op = DropLowCardinality()
    fit(["a"] >> op, t)                                  # untagged at fit: nothing counted
    later = ts.Schema([ts.ColumnSchema("a", "int64", frozenset({ts.Tags.CATEGORICAL}))])
    with pytest.raises(SchemaError, match="categorical column 'a' has no domain in the schema and "
                                          "its values were not counted at fit"):
        op.compute_output_schema(later)


@pytest.mark.parametrize("value, error, match", [
    (0, ValueError, "min_cardinality must be an integer >= 1, got 0"),
    ("3", TypeError, "min_cardinality must be an integer, got '3'"),
    (2.5, TypeError, "min_cardinality must be an integer, got 2.5"),
])
def test_drop_low_cardinality_bad_param(value, error, match):
    with pytest.raises(error, match=match):
        DropLowCardinality(value)


# -- ReduceDtypeSize -----------------------------------------------------------------------------
def smallest_int(lo, hi):
    for dtype in ("int8", "int16", "int32", "int64"):
        if np.iinfo(dtype).min <= lo and hi <= np.iinfo(dtype).max:
            return dtype
    return "uint64"


@pytest.mark.parametrize("seed", SEEDS)
def test_reduce_dtype_size_matches_reference(seed):
    rng = np.random.default_rng(seed)
    n = 200
    t = pa.table({
        "a": pa.array(rng.integers(-100, 100, n), mask=rng.random(n) < 0.1),
        "b": pa.array(rng.integers(0, 1000, n)),
        "c": pa.array(rng.integers(-(2**40), 2**40, n)),
        "d": pa.array(rng.integers(0, 2**31 - 1, n)),
        "u": pa.array(rng.integers(2**63, 2**64 - 1, n, dtype=np.uint64)),
        "f": pa.array(rng.normal(size=n)),
        "s": pa.array(["z"] * n),
        "l": pa.array([[int(v)] for v in rng.integers(0, 30_000, n)], type=pa.list_(pa.int64())),
    })
    df = t.to_pandas()
    wf = fit(t.column_names >> ReduceDtypeSize(), t, SMALL_PART)
    out = wf.transform(t)
    for col in "abcdu":
        expected = smallest_int(int(df[col].min()), int(df[col].max()))
        assert out[col].type == pa.from_numpy_dtype(np.dtype(expected)), col
        assert wf.output_schema[col].dtype == expected
        assert out[col].to_pylist() == t[col].to_pylist()
    assert out["f"].type == pa.float32() and out["s"].type == t["s"].type
    assert out["l"].type == pa.list_(pa.int16()) and out["l"].to_pylist() == t["l"].to_pylist()
    np.testing.assert_allclose(out["f"].to_numpy(), t["f"].to_numpy(), rtol=1e-6)


def test_reduce_dtype_size_never_widens():
    t = pa.table({"u8": pa.array([0, 200], type=pa.uint8()), "u32": pa.array([0, 2**32 - 1], type=pa.uint32()),
                  "i16": pa.array([-3, 3], type=pa.int16())})
    out = ReduceDtypeSize().fit_table(t).transform(t)
    assert [f.type for f in out.schema] == [pa.uint8(), pa.uint32(), pa.int8()]
    assert out["u32"].to_pylist() == t["u32"].to_pylist()


def test_reduce_dtype_size_out_of_range_and_bad_param():
    op = ReduceDtypeSize().fit_table(pa.table({"a": [1, 2, 3]}))
    with pytest.raises(DataError, match=r"column 'a' holds values outside the range fitted \[1, 3\]"):
        op.transform(pa.table({"a": [1, 1000]}))
    with pytest.raises(ValueError, match="float_dtype must be 'float32' or 'float64', got 'float8'"):
        ReduceDtypeSize("float8")


# -- DataStats -----------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_data_stats_matches_pandas(seed):
    t = raw(seed)
    wf = fit(t.column_names >> DataStats(), t, SMALL_PART)
    assert_tables_equal(wf.transform(t), t)                       # data passes through
    stats = wf.output_node.op.stats
    for col in ["x", "i"]:
        x = pd.Series(missing_as_nan(t[col]))
        finite = x[np.isfinite(x)]
        s = stats[col]
        assert (s["count"], s["null_count"]) == (x.notna().sum(), x.isna().sum())
        assert (s["min"], s["max"]) == (x.min(), x.max())
        assert s["mean"] == pytest.approx(finite.mean(), rel=1e-12)
        assert s["std"] == pytest.approx(finite.std(ddof=1), rel=1e-12)
        assert s["inf_count"] == np.isinf(x).sum()
        assert s["distinct"] == x.nunique() and s["distinct_exact"]
    strings = t["s"].to_pandas()
    assert stats["s"]["min"] == strings.min() and stats["s"]["max"] == strings.max()
    assert stats["s"]["distinct"] == strings.nunique() and stats["s"]["null_count"] == strings.isna().sum()
    lists = t["l"].to_pandas().dropna()
    lengths = lists.map(len)
    s = stats["l"]
    assert (s["list_length_min"], s["list_length_max"]) == (lengths.min(), lengths.max())
    assert s["distinct"] == lists.explode().dropna().nunique() and s["is_list"]
    assert s["count"] == len(lists)
    json.dumps(stats)                                              # JSON values only


@pytest.mark.parametrize("seed", SEEDS)
def test_data_stats_approximate_distinct_is_bounded_and_partition_independent(seed):
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 2**40, 6_000)
    t = pa.table({"v": values})
    ops = [fit(["v"] >> DataStats(max_exact_distinct=100), t, part).output_node.op for part in (None, 4_000)]
    true = len(np.unique(values))
    a, b = ops[0].stats["v"], ops[1].stats["v"]
    assert {k: v for k, v in a.items() if k not in ("mean", "std")} == \
        {k: v for k, v in b.items() if k not in ("mean", "std")}          # distinct identical
    assert (a["mean"], a["std"]) == pytest.approx((b["mean"], b["std"]), rel=1e-12)
    assert not ops[0].stats["v"]["distinct_exact"]
    assert abs(ops[0].stats["v"]["distinct"] - true) <= 0.04 * true   # 5 standard errors


def test_data_stats_bad_param():
    with pytest.raises(ValueError, match="max_exact_distinct must be an integer >= 0"):
        DataStats(max_exact_distinct=-1)


# -- shared contract checks ---------------------------------------------------------------------------
CASES = {
    "NormalizeMinMax": (["x", "i"], NormalizeMinMax),
    "FillMedian": (["x", "i"], lambda: FillMedian(add_binary_cols=True)),
    "DropLowCardinality": (["x", "s", "l"], lambda: DropLowCardinality(6)),
    "ReduceDtypeSize": (["x", "i", "l"], ReduceDtypeSize),
    "DataStats": (["x", "i", "s", "l"], DataStats),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_transform_before_fit_raises(name):
    cols, make = CASES[name]
    with pytest.raises(NotFittedError, match=f"{name} has not been fitted"):
        make().transform(raw(0).select(cols))


@pytest.mark.parametrize("name", sorted(CASES) + ["Bucketize"])
def test_save_load_gives_identical_output(name, tmp_path):
    cols, make = CASES.get(name, (["x", "i"], lambda: Bucketize([0, 1, 2])))
    t = raw(3)
    wf = fit(cols >> make(), t, SMALL_PART)
    wf.save(str(tmp_path / "wf"))
    files = [p.name for p in (tmp_path / "wf").rglob("*") if p.is_file()]
    assert all(f.endswith((".json", ".parquet")) for f in files)
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert again.output_schema == wf.output_schema
    assert_tables_equal(again.transform(t), wf.transform(t))
    op = wf.output_node.op
    assert type(op)(**json.loads(json.dumps(op.get_params()))).get_params() == op.get_params()


def test_empty_partition_and_all_null_columns_do_not_crash():
    t = pa.table({"x": pa.array([None, None], type=pa.float64()), "i": pa.array([None, None], type=pa.int64())})
    for make in (NormalizeMinMax, FillMedian, ReduceDtypeSize, DataStats, lambda: DropLowCardinality(1)):
        op = make().fit_table(t.slice(0, 0))
        op.fit_table(t)
        assert op.transform(t).num_rows == 2

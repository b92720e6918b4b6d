"""Core ops against plain pandas/numpy references."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import NotFittedError


def fit_transform(node, df, part_size=None):
    wf = ts.Workflow(node)
    wf.fit(ts.Dataset(df, part_size=part_size))
    return wf, wf.transform(df)


def categorify_reference(train: pd.Series, apply: pd.Series, freq_threshold=0, max_size=0):
    counts = train.dropna().value_counts()
    vocab = counts[counts >= max(freq_threshold, 1)]
    order = sorted(vocab.items(), key=lambda kv: (-kv[1], kv[0]))
    if max_size:  # max_size bounds the table: 0 padding, 1 null, 2 OOV, then values
        order = order[:max_size - 3]
    mapping = {v: i + 3 for i, (v, _) in enumerate(order)}
    return np.array([1 if pd.isna(v) else mapping.get(v, 2) for v in apply], dtype=np.int64)


@pytest.mark.parametrize("freq_threshold", [0, 5, 40])
@pytest.mark.parametrize("part_size", [None, 3000])
def test_categorify_matches_reference(small_raw, freq_threshold, part_size):
    wf, out = fit_transform(["C1", "C2"] >> ops.Categorify(freq_threshold=freq_threshold), small_raw, part_size)
    for col in ["C1", "C2"]:
        expected = categorify_reference(small_raw[col], small_raw[col], freq_threshold)
        np.testing.assert_array_equal(out[col].to_numpy(), expected)
        card = wf.output_schema[col].cardinality
        assert card == expected.max() + 1 if freq_threshold < 40 or col == "C1" else card >= 3


def test_categorify_unseen_nulls_and_max_size(small_raw):
    op = ops.Categorify(max_size=6)
    wf, _ = fit_transform(["C1"] >> op, small_raw)
    new = pd.DataFrame({"C1": pd.array(["a", "zzz", None, "h", "b"], dtype="str")})
    got = wf.transform(new)["C1"].to_numpy()
    np.testing.assert_array_equal(got, categorify_reference(small_raw["C1"], new["C1"], max_size=6))
    assert got[1] == 2 and got[2] == 1
    assert wf.output_schema["C1"].cardinality == 6  # the table has max_size rows


def test_categorify_ties_ordered_by_value():
    df = pd.DataFrame({"c": ["b", "a", "c", "b", "a", "c", "d"]})
    _, out = fit_transform(["c"] >> ops.Categorify(), df)
    assert out["c"].tolist() == [4, 3, 5, 4, 3, 5, 6]


def test_categorify_integer_column_and_schema(small_raw):
    wf, out = fit_transform(["I1"] >> ops.Categorify(), small_raw)
    expected = categorify_reference(small_raw["I1"].astype("float64"), small_raw["I1"].astype("float64"))
    np.testing.assert_array_equal(out["I1"].to_numpy(), expected)
    col = wf.output_schema["I1"]
    assert ts.Tags.CATEGORICAL in col.tags and col.dtype == "int64"
    assert col.properties["embedding_sizes"]["cardinality"] == col.cardinality
    assert col.properties["domain"] == {"min": 0, "max": col.cardinality - 1, "name": "I1"}


def test_categorify_vocabulary_reverse_mapping(small_raw):
    op = ops.Categorify()
    fit_transform(["C1"] >> op, small_raw)
    rev = op.reverse_mapping("C1").to_pandas()
    counts = small_raw["C1"].dropna().value_counts()
    assert dict(zip(rev["value"], rev["counts"])) == counts.to_dict()
    assert rev["id"].tolist() == list(range(3, 3 + len(counts)))


def test_fill_clip_log_normalize_match_numpy(small_raw):
    node = ["I1", "I2"] >> ops.FillMissing(0) >> ops.Clip(min_value=0) >> ops.LogOp() >> ops.Normalize()
    for part_size in (None, 2000):
        wf, out = fit_transform(node, small_raw, part_size)
        for col in ["I1", "I2"]:
            x = small_raw[col].astype("float64").fillna(0).clip(lower=0).to_numpy()
            logged = np.log1p(x).astype(np.float32).astype(np.float64)
            expected = (np.log1p(x) - np.log1p(x).mean()) / np.log1p(x).std(ddof=1)
            assert out[col].dtype == np.float32
            np.testing.assert_allclose(out[col].to_numpy(), expected, rtol=1e-5, atol=1e-5)
            assert logged.shape == x.shape


def test_normalize_stats_equal_on_one_and_many_partitions(small_raw):
    ops1, opsn = ops.Normalize(), ops.Normalize()
    ts.Workflow(["I2"] >> ops1).fit(ts.Dataset(small_raw))
    ts.Workflow(["I2"] >> opsn).fit(ts.Dataset(small_raw, part_size=500))
    assert ops1.means["I2"] == pytest.approx(opsn.means["I2"], rel=1e-12)
    assert ops1.stds["I2"] == pytest.approx(opsn.stds["I2"], rel=1e-12)
    assert ops1.means["I2"] == pytest.approx(small_raw["I2"].mean(), rel=1e-12)
    assert ops1.stds["I2"] == pytest.approx(small_raw["I2"].std(ddof=1), rel=1e-12)


def test_normalize_ignores_nonfinite_in_stats():
    df = pd.DataFrame({"x": [1.0, 2.0, np.nan, np.inf, 4.0, -np.inf]})
    op = ops.Normalize()
    _, out = fit_transform(["x"] >> op, df)
    finite = np.array([1.0, 2.0, 4.0])
    assert op.means["x"] == pytest.approx(finite.mean())
    assert op.stds["x"] == pytest.approx(finite.std(ddof=1))
    assert np.isnan(out["x"][2]) and np.isposinf(out["x"][3])


def test_normalize_constant_column_is_centred():
    _, out = fit_transform(["x"] >> ops.Normalize(), pd.DataFrame({"x": [3.0, 3.0, 3.0]}))
    assert out["x"].tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("value", [0.3, 0.1, 1 / 3, 1e10 + 0.1, -7.7e-5])
@pytest.mark.parametrize("part_size", [None, 4_000])
def test_normalize_constant_column_of_any_value_is_centred(value, part_size):
    """A constant whose float mean lands a rounding step off itself (0.3 x 1000): std
    exactly 0 and every row 0, on one partition and on several (before, a std of
    1e-17 was divided by: rows of about +-1, different per partitioning)."""
    df = pd.DataFrame({"x": np.full(1000, value), "y": value * (1 + np.arange(1000) * 1e-9)})
    op = ops.Normalize()
    wf = ts.Workflow(["x", "y"] >> op).fit(ts.Dataset(df, part_size=part_size))
    out = wf.transform(df)
    assert op.stds["x"] == 0.0 and op.means["x"] == value
    assert out["x"].tolist() == [0.0] * 1000
    # a column that only nearly is constant keeps its (tiny) std, as numpy has it
    assert op.stds["y"] == pytest.approx(df["y"].std(ddof=1), rel=1e-6)
    assert op.means["y"] == pytest.approx(df["y"].mean(), rel=1e-12)


def test_logop_negative_values_documented_behaviour():
    _, out = fit_transform(["x"] >> ops.LogOp(), pd.DataFrame({"x": [0.0, 1.0, -1.0, -2.0]}))
    with np.errstate(divide="ignore", invalid="ignore"):
        np.testing.assert_array_equal(out["x"].to_numpy(), np.log1p(np.array([0.0, 1.0, -1.0, -2.0])).astype(np.float32))


def test_fill_missing_binary_cols_and_nan():
    df = pd.DataFrame({"x": [1.0, np.nan, 3.0], "y": pd.array([None, 2, 3], dtype="Int64")})
    _, out = fit_transform(["x", "y"] >> ops.FillMissing(-1, add_binary_cols=True), df)
    assert out["x"].tolist() == [1.0, -1.0, 3.0]
    assert out["y"].tolist() == [-1, 2, 3]
    assert out["x_filled"].tolist() == [False, True, False]
    assert out["y_filled"].tolist() == [True, False, False]


def test_clip_both_bounds():
    _, out = fit_transform(["x"] >> ops.Clip(min_value=0, max_value=5), pd.DataFrame({"x": [-3, 2, 9]}))
    assert out["x"].tolist() == [0, 2, 5]
    with pytest.raises(ValueError, match="min_value 5 is greater than max_value 1"):
        ops.Clip(min_value=5, max_value=1)


@pytest.mark.parametrize("bounds", [(0, None), (None, 5), (0, 5), (-1.5, 2.5)])
def test_clip_keeps_nulls_and_nan_like_pandas(bounds):
    lo, hi = bounds
    values = [3.0, None, -2.0, float("nan"), float("inf"), float("-inf"), 7.5]
    table = pa.table({"x": pa.array(values, pa.float64())})
    wf = ts.Workflow(["x"] >> ops.Clip(min_value=lo, max_value=hi))
    wf.fit(ts.Dataset(table))
    got = wf.transform(ts.Dataset(table)).to_ddf().compute()["x"].to_numpy(dtype=float, na_value=np.nan)
    # pandas: NaN stays NaN; nulls (None) are NaN in a float Series too
    expected = pd.Series([np.nan if v is None else v for v in values]).clip(lower=lo, upper=hi).to_numpy()
    np.testing.assert_array_equal(got, expected)
    # and nulls stay nulls (not NaN, not the bound)
    arrow_out = wf.transform(table)
    col = arrow_out["x"] if isinstance(arrow_out, pa.Table) else pa.Table.from_pandas(arrow_out)["x"]
    assert col.null_count == 1 and col.to_pylist()[1] is None


def test_clip_integer_column_with_nulls():
    df = pd.DataFrame({"n": pd.array([-4, None, 3, 12], dtype="Int64")})
    _, out = fit_transform(["n"] >> ops.Clip(min_value=0, max_value=10), df)
    expected = df["n"].clip(lower=0, upper=10)
    assert out["n"].isna().tolist() == [False, True, False, False]
    assert out["n"].dropna().tolist() == expected.dropna().tolist()


def test_log_op_nulls_nan_and_infinities_like_numpy():
    values = [0.0, None, 1e6, float("nan"), float("inf"), -1.0, -3.0, 2.5]
    table = pa.table({"x": pa.array(values, pa.float64()), "i": pa.array([1, None, 0, 5, 2, 3, 4, 100], pa.int64())})
    wf = ts.Workflow(["x", "i"] >> ops.LogOp())
    wf.fit(ts.Dataset(table))
    out = wf.transform(ts.Dataset(table)).to_ddf().compute()
    with np.errstate(divide="ignore", invalid="ignore"):
        ref_x = np.log1p(np.array([np.nan if v is None else v for v in values])).astype(np.float32)
        ref_i = np.log1p(np.array([1, np.nan, 0, 5, 2, 3, 4, 100], dtype=float)).astype(np.float32)
    np.testing.assert_array_equal(out["x"].to_numpy(dtype=np.float32, na_value=np.nan), ref_x)
    np.testing.assert_array_equal(out["i"].to_numpy(dtype=np.float32, na_value=np.nan), ref_i)
    assert out["x"].isna().sum() >= 1 and out["i"].isna().tolist() == [False, True] + [False] * 6


def test_hash_bucket_is_stable_and_matches_hash():
    from tabstream.core.hashing import murmur3_32

    df = pd.DataFrame({"c": ["a", "b", "a", None, "zz"] * 40, "n": np.arange(200) % 7})
    wf = ts.Workflow(["c", "n"] >> ops.HashBucket(13))
    wf.fit(ts.Dataset(df, part_size=64))
    out = wf.transform(ts.Dataset(df, part_size=64)).compute()
    for col in ["c", "n"]:
        vals = pa.array(df[col])
        expected = (murmur3_32(vals) % 13).astype(np.int64)
        expected[df[col].isna().to_numpy()] = 13  # missing: the id past the buckets
        np.testing.assert_array_equal(out[col].to_numpy(), expected)
    # same value, same id on every row
    assert out.groupby(df["c"].fillna("<null>"))["c"].nunique().max() == 1
    assert wf.output_schema["c"].cardinality == 13 + 1


def test_transform_before_fit_raises(small_raw):
    wf = ts.Workflow(["C1"] >> ops.Categorify())
    with pytest.raises(NotFittedError, match="not fitted.*call fit"):
        wf.transform(small_raw)
    with pytest.raises(NotFittedError, match="Categorify has not been fitted"):
        ops.Categorify().transform(pa.table({"C1": ["a"]}))


@pytest.mark.parametrize("bad", [
    lambda: ops.Categorify(freq_threshold=-1),
    lambda: ops.Categorify(num_buckets=0),
    lambda: ops.HashBucket(0),
    lambda: ops.FillMissing("zero"),
])
def test_bad_parameters_are_rejected(bad):
    with pytest.raises((ValueError, TypeError), match="must be|fill_val"):
        bad()


def test_numeric_ops_reject_strings(small_raw):
    with pytest.raises(TypeError, match="LogOp needs numeric columns, but column 'C1' is string"):
        ts.Workflow(["C1"] >> ops.LogOp()).fit_schema(ts.Dataset(small_raw).schema)

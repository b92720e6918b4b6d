"""Missing is missing: TargetEncoding, JoinGroupby, JoinExternal, DifferenceLag and
DropLowCardinality on keys and values with NaN, null, -0.0, 0.0, "" and ±inf.

Every reference is plain pandas after mapping NaN to missing and -0.0 to 0.0
(`groupby(dropna=False)`, `merge`, `shift`); inputs are Arrow tables (NaN and
null apart) and pandas frames (NaN only), fitted on one and on several partitions.
"""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.ops import AddTags, DropLowCardinality
from tabstream.ops.joins import DifferenceLag, JoinExternal, JoinGroupby, TargetEncoding

SEEDS = [0, 1]
PARTS = [None, 2_000]          # bytes per partition: one, then several partitions
INPUTS = ["arrow", "pandas"]

FKEYS = [0.0, -0.0, np.nan, None, np.inf, -np.inf, 1.5]
SKEYS = ["a", "", None, "b"]
VALUES = [0.0, -0.0, np.nan, None, np.inf, -np.inf, 1.0, 2.5, -3.0]


def frame(seed: int, n: int = 300) -> pa.Table:
    rng = np.random.default_rng(seed)

    def pick(options, size=n):
        return [options[i] for i in rng.integers(0, len(options), size)]

    y = np.where(rng.random(n) < 0.5, 0.0, 1.0).tolist()
    for i in rng.choice(n, 40, replace=False):
        y[i] = [np.nan, None, np.inf, -np.inf][i % 4]
    return pa.table({
        "fk": pa.array(pick(FKEYS), pa.float64()),          # NaN and null stay apart in Arrow
        "sk": pa.array(pick(SKEYS), pa.string()),
        "y": pa.array(y, pa.float64()),
        "v": pa.array(pick(VALUES), pa.float64()),
        "ts": pa.array(np.arange(n)),
    })


def as_input(t: pa.Table, kind: str):
    return t if kind == "arrow" else t.to_pandas()


def fit(node, data, part_size):
    ds = ts.Dataset(data, part_size=part_size)
    if part_size is not None:
        assert ds.npartitions > 1
    return ts.Workflow(node).fit(ds)


def to_pandas(out) -> pd.DataFrame:
    return out if isinstance(out, pd.DataFrame) else out.to_pandas()


def floats(series) -> np.ndarray:
    """Values as float64 with every missing value (null or NaN) as NaN."""
    return pd.to_numeric(pd.Series(series), errors="raise").astype("float64").to_numpy()


def norm(df: pd.DataFrame, cols) -> pd.DataFrame:
    """The reference's key rule: NaN/None missing (pandas NaN), -0.0 is 0.0."""
    df = df.copy()
    for c in cols:
        if df[c].dtype.kind == "f":
            df[c] = df[c].astype("float64") + 0.0
        else:
            df[c] = df[c].astype(object).where(df[c].notna(), None)
    return df


def test_frame_has_every_kind_of_key():
    t = frame(0)
    fk = t["fk"]
    assert fk.null_count > 0 and np.isnan(fk.to_numpy(zero_copy_only=False)).sum() > fk.null_count
    raw = [v for v in fk.to_pylist() if v is not None]
    assert {str(v) for v in raw} >= {"0.0", "-0.0", "nan", "inf", "-inf"}
    assert {"", None} <= set(t["sk"].to_pylist())


# -- TargetEncoding ---------------------------------------------------------------------------------
def te_reference(df: pd.DataFrame, keys: list[str], p_smooth: float) -> np.ndarray:
    d = norm(df, keys)
    y = floats(d["y"])
    ok = np.isfinite(y)
    global_mean = y[ok].mean()
    d["_s"], d["_c"] = np.where(ok, y, 0.0), ok.astype(float)
    stats = d.groupby(keys, dropna=False)[["_s", "_c"]].sum().reset_index()
    merged = d[keys].merge(stats, on=keys, how="left")       # pandas merges missing keys together
    assert len(merged) == len(d)
    return ((merged["_s"] + p_smooth * global_mean) / (merged["_c"] + p_smooth)).to_numpy()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("part_size", PARTS)
def test_target_encoding_missing_keys_are_one_group(seed, kind, part_size):
    t = frame(seed)
    groups = ["fk", "sk", ["fk", "sk"]]
    op = TargetEncoding("y", kfold=1, p_smooth=3, out_dtype="float64", cat_groups=groups)
    wf = fit(["fk", "sk", "y"] >> op, as_input(t, kind), part_size)
    out = to_pandas(wf.transform(as_input(t, kind)))
    df = t.to_pandas()
    for g in (["fk"], ["sk"], ["fk", "sk"]):
        np.testing.assert_allclose(floats(out[f"TE_{'_'.join(g)}_y"]), te_reference(df, g, 3), rtol=1e-12)
    # fitted statistics: one row per group, NaN and null merged, no -0.0 left
    stats = op.stats["fk"].to_pandas()
    expected_groups = norm(df, ["fk"]).groupby("fk", dropna=False).ngroups
    assert stats["fk"].isna().sum() == 1 and len(stats) == expected_groups
    assert not np.signbit(stats["fk"].dropna().to_numpy()[stats["fk"].dropna().to_numpy() == 0]).any()


@pytest.mark.parametrize("kind", INPUTS)
def test_target_encoding_fold_col_nan_is_null_and_minus_zero_is_zero(kind):
    t = pa.table({"c": ["a"] * 6, "y": [1.0, 0.0, 1.0, 0.0, 1.0, 0.0],
                  "f": pa.array([np.nan, None, -0.0, 0.0, 5.0, 5.0], pa.float64())})
    op = TargetEncoding("y", kfold=4, fold_col="f", drop_folds=False)
    wf = fit(["c", "y", "f"] >> op, as_input(t, kind), None)
    folds = to_pandas(wf.transform(as_input(t, kind)))["__fold__"].to_numpy()
    assert folds[0] == folds[1] == 0                     # missing fold keys: fold 0
    assert folds[2] == folds[3]                          # -0.0 and 0.0: one key, one fold


# -- JoinGroupby ------------------------------------------------------------------------------------------
STATS = ["count", "sum", "mean", "std", "var", "min", "max"]


def groupby_reference(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    d = norm(df, keys)
    d["v"] = floats(d["v"])
    grouped = d.groupby(keys, dropna=False)["v"]
    stats = pd.DataFrame({"count": grouped.size(), "sum": grouped.sum(), "mean": grouped.mean(),
                          "std": grouped.std(), "var": grouped.var(), "min": grouped.min(),
                          "max": grouped.max()}).reset_index()
    merged = d[keys].merge(stats, on=keys, how="left")
    assert len(merged) == len(d)
    return merged


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("part_size", PARTS)
def test_join_groupby_missing_keys_are_one_group(seed, kind, part_size):
    t = frame(seed)
    op = JoinGroupby(cont_cols=["v"], stats=STATS, cat_groups=["fk", "sk", ["fk", "sk"]], out_dtype="float64")
    wf = fit(["fk", "sk", "v"] >> op, as_input(t, kind), part_size)
    out = to_pandas(wf.transform(as_input(t, kind)))
    df = t.to_pandas()
    for g in (["fk"], ["sk"], ["fk", "sk"]):
        ref = groupby_reference(df, g)
        name = "_".join(g)
        assert out[f"{name}_count"].tolist() == ref["count"].tolist()
        for stat in STATS[1:]:
            np.testing.assert_allclose(floats(out[f"{name}_v_{stat}"]), floats(ref[stat]),
                                       rtol=1e-9, err_msg=f"{name} {stat}")
    assert len(op.tables["fk"]) == norm(df, ["fk"]).groupby("fk", dropna=False).ngroups


@pytest.mark.parametrize("values", [[-0.0, 0.0], [0.0, -0.0], [-0.0, -0.0]])
def test_join_groupby_min_max_of_zeros_is_plus_zero(values):
    """-0.0 and 0.0 are one value: min, max and sum of zeros are +0.0, whatever the order."""
    t = pa.table({"k": ["a"] * len(values), "v": pa.array(values, pa.float64())})
    op = JoinGroupby(cont_cols=["v"], stats=["min", "max", "sum"], out_dtype="float64")
    out = op.fit_table(t).transform(t)
    for stat in ("min", "max", "sum"):
        got = floats(out[f"k_v_{stat}"].to_pandas())
        assert (got == 0.0).all() and not np.signbit(got).any(), stat


# -- JoinExternal ----------------------------------------------------------------------------------------
def side_table() -> pd.DataFrame:
    return pd.DataFrame({
        "fk": [0.0, -0.0, np.nan, None, np.inf, -np.inf, 1.5, 1.5, -0.0],
        "sk": ["a", "a", None, "b", "", "b", "a", "", "a"],
        "w": [1.0, 2.0, 3.0, 4.0, np.inf, -0.0, np.nan, 8.0, 1.0],
        "rid": np.arange(9),
    })


def join_reference(left: pd.DataFrame, side: pd.DataFrame, on: list[str], how: str) -> pd.DataFrame:
    """pandas merge on normalized keys, except that a missing key never matches (SQL)."""
    side = norm(side, on)
    side = side[side[on].notna().all(axis=1)]
    out = norm(left, on).merge(side, on=on, how=how)
    return out.sort_values(["ts", "rid"], kind="stable").reset_index(drop=True)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("on", [["fk"], ["fk", "sk"]])
def test_join_external_missing_keys_never_match_and_minus_zero_is_zero(seed, kind, how, on):
    t = frame(seed).select(["fk", "sk", "ts"])
    side = side_table()
    cols = ["w", "rid"] if on == ["fk", "sk"] else ["sk_ext", "w", "rid"]
    side_in = side if on == ["fk", "sk"] else side.rename(columns={"sk": "sk_ext"})
    op = JoinExternal(side_in, on=on, how=how, columns_ext=cols)
    wf = fit(["fk", "sk", "ts"] >> op, as_input(t, kind), None)
    out = to_pandas(wf.transform(as_input(t, kind)))
    ref = join_reference(t.to_pandas(), side_in, on, how)
    assert out["ts"].tolist() == ref["ts"].tolist()
    np.testing.assert_array_equal(floats(out["rid"]), floats(ref["rid"]))
    np.testing.assert_array_equal(floats(out["w"]), floats(ref["w"]))
    if how == "left":
        # rows with a missing key (null or NaN in any key column) get null side columns
        missing = t.to_pandas()[on].isna().any(axis=1).to_numpy()
        first = ~out["ts"].duplicated().to_numpy()
        assert np.isnan(floats(out["rid"])[first][missing]).all()


@pytest.mark.parametrize("kind", INPUTS)
def test_join_external_drop_duplicates_treats_missing_and_zero_as_equal(kind):
    side = pd.DataFrame({"k": [1.0, 1.0, 1.0, 1.0, 2.0, 2.0],
                         "w": [-0.0, 0.0, np.nan, None, np.inf, np.inf],
                         "s": ["x", "x", None, None, "", ""]})
    t = pa.table({"k": pa.array([2.0, 1.0, -0.0], pa.float64()), "ts": [0, 1, 2]})
    op = JoinExternal(side, on="k", drop_duplicates_ext=True)
    wf = fit(["k", "ts"] >> op, as_input(t, kind), None)
    out = to_pandas(wf.transform(as_input(t, kind)))
    ref_side = norm(side, ["k", "w", "s"]).drop_duplicates().reset_index(drop=True)
    ref = norm(t.to_pandas(), ["k"]).merge(ref_side, on="k", how="left")
    assert out["ts"].tolist() == ref["ts"].tolist()
    np.testing.assert_array_equal(floats(out["w"]), floats(ref["w"]))
    assert out["s"].fillna("<missing>").tolist() == ref["s"].fillna("<missing>").tolist()


# -- DifferenceLag --------------------------------------------------------------------------------------
def lag_reference(df: pd.DataFrame, keys: list[str], shift: int) -> np.ndarray:
    d = norm(df, keys)
    same = np.ones(len(d), dtype=bool)
    for k in keys:
        cur, prev = d[k], d[k].shift(shift)
        same &= (cur.notna() & prev.notna() & (cur == prev)).to_numpy(dtype=bool)
    v = floats(d["v"])
    with np.errstate(invalid="ignore"):                 # inf - inf is NaN, as in the op
        diff = v - floats(pd.Series(v).shift(shift))
    return np.where(same, diff, np.nan)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("part_size", PARTS)
@pytest.mark.parametrize("keys", [["fk"], ["fk", "sk"]])
def test_difference_lag_missing_keys_never_equal_minus_zero_equals_zero(seed, kind, part_size, keys):
    t = frame(seed, n=200)
    t = t.take(pa.array(np.argsort(np.array([str(x) for x in t["fk"].to_pylist()]), kind="stable")))
    ds = ts.Dataset(as_input(t, kind), part_size=part_size)
    if part_size is not None:
        assert ds.npartitions > 1
    wf = ts.Workflow(["v", *keys] >> DifferenceLag(keys, shift=[1, -2])).fit(ds)
    got, expected = [], []
    for piece in ds.pieces:          # the lag is computed within one partition
        part = ds.read_piece(piece)
        got.append(to_pandas(wf.transform(part)))
        df = part.to_pandas()
        expected.append(pd.DataFrame({s: lag_reference(df, keys, s) for s in (1, -2)}))
    got_df, ref = pd.concat(got, ignore_index=True), pd.concat(expected, ignore_index=True)
    for s in (1, -2):
        np.testing.assert_array_equal(floats(got_df[f"v_difference_lag_{s}"]), ref[s].to_numpy())
    assert len(got_df) == t.num_rows


# -- DropLowCardinality -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", INPUTS)
@pytest.mark.parametrize("part_size", PARTS)
@pytest.mark.parametrize("min_card", [3, 4, 5, 6, 7])
def test_drop_low_cardinality_counts_missing_once_and_minus_zero_as_zero(kind, part_size, min_card):
    rng = np.random.default_rng(min_card)
    n = 300
    t = frame(1, n).append_column(
        "z", pa.array([[0.0, -0.0, np.nan, None][i] for i in rng.integers(0, 4, n)], pa.float64()))
    cats = ["fk", "sk", "z", "v"]
    wf = fit((cats >> AddTags(["categorical"])) + ["y"] >> DropLowCardinality(min_card), as_input(t, kind), part_size)
    df = norm(t.to_pandas(), cats)
    expected = [c for c in cats if df[c].dropna().nunique() + 2 >= min_card] + ["y"]
    assert wf.output_schema.column_names == expected
    assert list(to_pandas(wf.transform(as_input(t, kind))).columns) == expected

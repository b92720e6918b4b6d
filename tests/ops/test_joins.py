"""TargetEncoding, JoinGroupby, JoinExternal, DifferenceLag (tabstream.ops.joins)
against plain Python/pandas references."""

import json
from collections import Counter, defaultdict

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import NotFittedError, SchemaError
from tabstream.core.operators import Operator
from tabstream.ops.joins import DifferenceLag, JoinExternal, JoinGroupby, TargetEncoding

mmh3 = pytest.importorskip("mmh3")

SEEDS = [0, 1]
SMALL_PART = 1_500  # bytes: several partitions for the tables below


def events(seed: int, n: int = 300) -> pa.Table:
    """Categories with nulls and empty strings, a 0/1 label with missing values,
    a continuous column with nulls, NaN and ±inf, and a unique event id."""
    rng = np.random.default_rng(seed)
    user = np.array(["u0", "u1", "u2", "", "u4", "u5"])[rng.integers(0, 6, n)]
    item = rng.integers(0, 4, n)
    label = rng.integers(0, 2, n).astype(np.float64)
    label[rng.random(n) < 0.05] = np.nan
    label[rng.choice(n, 2, replace=False)] = np.inf
    price = rng.normal(10, 3, n).round(2)
    price[rng.random(n) < 0.05] = np.nan
    price[rng.choice(n, 2, replace=False)] = np.inf
    return pa.table({
        "user": pa.array(user, mask=rng.random(n) < 0.1),
        "item": pa.array(item, mask=rng.random(n) < 0.05),
        "label": pa.array(label, mask=rng.random(n) < 0.05),
        "price": pa.array(price, mask=rng.random(n) < 0.05),
        "event_id": pa.array(rng.permutation(n).astype(np.int64) * 7919),
    })


def fit(node, table, part_size=None):
    ds = ts.Dataset(table, part_size=part_size)
    if part_size is not None:
        assert ds.npartitions > 1
    return ts.Workflow(node).fit(ds), ds


def as_float(column) -> np.ndarray:
    return np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)


def keys_of(table: pa.Table, cols) -> list[tuple]:
    return list(zip(*[table[c].to_pylist() for c in cols]))


def mmh3_fold(value, seed: int, kfold: int) -> int:
    """The documented fold rule, from the reference MurmurHash3 implementation."""
    data = int(value).to_bytes(8, "little", signed=True) if value is not None else None
    return 0 if data is None else mmh3.hash(data, seed, signed=False) % kfold


# -- TargetEncoding ----------------------------------------------------------------------------
def te_reference(train: pa.Table, apply: pa.Table, cols, target, p_smooth, kfold=1,
                 train_folds=None, apply_folds=None, target_mean=None) -> np.ndarray:
    y = as_float(train[target])
    ok = np.isfinite(y)
    gm = y[ok].mean() if target_mean is None else target_mean
    train_folds = np.zeros(train.num_rows, int) if train_folds is None else train_folds
    apply_folds = np.zeros(apply.num_rows, int) if apply_folds is None else apply_folds
    sums, counts = defaultdict(float), defaultdict(int)
    for key, value, fold, good in zip(keys_of(train, cols), y, train_folds, ok):
        if good:
            sums[key, fold] += value
            counts[key, fold] += 1
    out = []
    for key, fold in zip(keys_of(apply, cols), apply_folds):
        other = [f for f in range(kfold) if kfold == 1 or f != fold]
        s = sum(sums[key, f] for f in other)
        c = sum(counts[key, f] for f in other)
        out.append((s + p_smooth * gm) / (c + p_smooth))
    return np.array(out)


@pytest.mark.parametrize("seed", SEEDS)
def test_target_encoding_without_folds_matches_reference(seed):
    t = events(seed)
    wf, _ = fit(["user", "item", "label"] >> TargetEncoding("label", kfold=1, p_smooth=5), t)
    new = pa.table({"user": ["u1", "zz", None, ""], "item": pa.array([0, 99, None, 3]), "label": [0.0] * 4})
    for data in (t, new):                                      # new: unseen categories and nulls
        out = wf.transform(data)
        assert out.column_names == ["TE_user_label", "TE_item_label"]
        assert out["TE_user_label"].type == pa.float32()
        for col in ["user", "item"]:
            expected = te_reference(t, data, [col], "label", 5)
            np.testing.assert_allclose(as_float(out[f"TE_{col}_label"]), expected, rtol=1e-6)
    y = as_float(t["label"])
    gm = y[np.isfinite(y)].mean()
    assert as_float(wf.transform(new)["TE_user_label"])[1] == pytest.approx(gm, rel=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_target_encoding_positional_folds_are_out_of_fold(seed):
    """Folds from the row position in its partition: out-of-fold when the training
    data is transformed with the partitioning it was fitted on."""
    t = events(seed)
    wf, ds = fit(["user", "label"] >> TargetEncoding("label", kfold=3, fold_seed=seed, p_smooth=2,
                                                     drop_folds=False), t, SMALL_PART)
    tds = wf.transform(ds)
    out = pa.concat_tables([tds.read_piece(p) for p in ds.pieces])
    positions = np.concatenate([np.arange(ds.read_piece(p).num_rows) for p in ds.pieces])
    folds = np.array([mmh3_fold(pos, seed, 3) for pos in positions])
    np.testing.assert_array_equal(out["__fold__"].to_numpy(), folds)
    expected = te_reference(t, t, ["user"], "label", 2, 3, folds, folds)
    np.testing.assert_allclose(as_float(out["TE_user_label"]), expected, rtol=1e-6)


@pytest.mark.parametrize("seed", SEEDS)
def test_target_encoding_fold_col_is_partition_independent(seed):
    t = events(seed)
    node = ["user", "item", "event_id", "label"] >> TargetEncoding(
        "label", kfold=4, fold_seed=7, p_smooth=10, fold_col="event_id", out_dtype="float64",
        cat_groups=[["user", "item"], "item"])
    (whole, _), (parts, _) = fit(node, t), fit(node, t, SMALL_PART)
    state_whole, state_parts = whole.output_node.op.get_state(), parts.output_node.op.get_state()
    assert state_whole[0] == state_parts[0]
    assert all(state_whole[1][k].equals(state_parts[1][k]) for k in state_whole[1])
    out = parts.transform(t)
    assert out.equals(whole.transform(t))
    assert out.column_names == ["TE_user_item_label", "TE_item_label"]
    folds = np.array([mmh3_fold(v, 7, 4) for v in t["event_id"].to_pylist()])
    for group, name in ((["user", "item"], "TE_user_item_label"), (["item"], "TE_item_label")):
        expected = te_reference(t, t, group, "label", 10, 4, folds, folds)
        np.testing.assert_allclose(out[name].to_numpy(), expected, rtol=1e-12)


def test_target_encoding_target_mean_and_two_targets():
    t = events(5).append_column("clicks", pa.array(np.arange(300) % 7, type=pa.int64()))
    op = TargetEncoding(["label", "clicks"], target_mean={"label": 0.25, "clicks": 3.0}, kfold=1)
    wf, _ = fit(["user", "label", "clicks"] >> op, t)
    out = wf.transform(t)
    assert out.column_names == ["TE_user_label", "TE_user_clicks"]
    for target, mean in (("label", 0.25), ("clicks", 3.0)):
        expected = te_reference(t, t, ["user"], target, 20, target_mean=mean)
        np.testing.assert_allclose(as_float(out[f"TE_user_{target}"]), expected, rtol=1e-6)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"kfold": 0}, ValueError, "kfold must be an integer >= 1"),
    ({"fold_seed": -1}, ValueError, r"fold_seed must be an integer in \[0, 2\*\*32\)"),
    ({"p_smooth": -1}, ValueError, "p_smooth must be a number >= 0"),
    ({"out_dtype": "int8"}, ValueError, "out_dtype must be 'float32' or 'float64'"),
    ({"target_mean": "high"}, TypeError, "target_mean must be a number"),
    ({"fold_col": "label"}, ValueError, "fold_col must be a column name other than the target"),
    ({"cat_groups": []}, TypeError, "cat_groups must be a non-empty list"),
])
def test_target_encoding_bad_params(kwargs, error, match):
    with pytest.raises(error, match=match):
        TargetEncoding("label", **kwargs)


def test_target_encoding_selection_errors():
    schema = ts.Dataset(events(0)).schema
    # the target joins the selection (NVTabular's dependencies); a target the data lacks is named
    with pytest.raises(SchemaError, match=r"selected columns \['nope'\] do not exist"):
        ts.Workflow(["user"] >> TargetEncoding("nope")).fit_schema(schema)
    with pytest.raises(SchemaError, match="no category column selected besides"):
        ts.Workflow(["label"] >> TargetEncoding("label")).fit_schema(schema)
    with pytest.raises(ValueError, match=r"columns \['label'\] cannot be both a category and a value column"):
        ts.Workflow(["user", "label"] >> TargetEncoding("label", cat_groups=["label"])).fit_schema(schema)
    with pytest.raises(TypeError, match="TargetEncoding needs numeric columns, but column 'user' is string"):
        ts.Workflow(["item", "user"] >> TargetEncoding("user")).fit_schema(schema)
    lists = ts.Dataset(pa.table({"tags": [["a"], ["b"]], "label": [1, 0]})).schema
    with pytest.raises(TypeError, match=r"needs scalar category columns, but \['tags'\] hold lists"):
        ts.Workflow(["tags", "label"] >> TargetEncoding("label")).fit_schema(lists)


# -- JoinGroupby -------------------------------------------------------------------------------------
ALL_STATS = ["count", "sum", "mean", "std", "var", "min", "max"]


def groupby_reference(train: pa.Table, apply: pa.Table, cat: str, cont: str) -> pd.DataFrame:
    df = pd.DataFrame({"k": train[cat].to_pylist(), "x": as_float(train[cont])})
    agg = df.groupby("k", dropna=False)["x"].agg(["size", "sum", "mean", "std", "var", "min", "max"])
    keys = pd.DataFrame({"k": apply[cat].to_pylist()})
    return keys.merge(agg, left_on="k", right_index=True, how="left")   # NaN keys match, as ours


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("part_size", [None, SMALL_PART])
def test_join_groupby_matches_pandas(seed, part_size):
    t = events(seed)
    op = JoinGroupby(cont_cols=["price"], stats=ALL_STATS, out_dtype="float64")
    wf, _ = fit(["user", "item", "price"] >> op, t, part_size)
    new = pa.table({"user": ["u1", "never", None], "item": pa.array([1, 42, None]), "price": [1.0, 2.0, 3.0]})
    for data in (t, new):
        out = wf.transform(data)
        assert out.column_names == [f"{c}_{s}" if s == "count" else f"{c}_price_{s}"
                                    for c in ["user", "item"] for s in ALL_STATS]
        for cat in ["user", "item"]:
            ref = groupby_reference(t, data, cat, "price")
            np.testing.assert_array_equal(as_float(out[f"{cat}_count"]), ref["size"].to_numpy())
            for stat in ALL_STATS[1:]:
                np.testing.assert_allclose(as_float(out[f"{cat}_price_{stat}"]), ref[stat].to_numpy(),
                                           rtol=1e-9, equal_nan=True, err_msg=f"{cat} {stat}")
    unseen = wf.transform(new)
    assert all(unseen[c][1].as_py() is None for c in unseen.column_names)   # unseen -> null


def test_join_groupby_statistics_equal_on_partitions_and_combination_groups():
    t = events(2)
    node = ["user", "item", "price"] >> JoinGroupby(cont_cols="price", stats=["count", "min", "max", "mean"],
                                                     cat_groups=[["user", "item"]], name_sep="-")
    (whole, _), (parts, _) = fit(node, t), fit(node, t, SMALL_PART)
    a = whole.output_node.op.tables["user-item"]
    b = parts.output_node.op.tables["user-item"]
    for name in ["user", "item", "user-item-count", "user-item-price-min", "user-item-price-max"]:
        assert a[name].equals(b[name]), name                                  # exact
    np.testing.assert_allclose(as_float(a["user-item-price-mean"]), as_float(b["user-item-price-mean"]),
                               rtol=1e-12)
    sizes = Counter(keys_of(t, ["user", "item"]))
    expected = [sizes[key] for key in keys_of(t, ["user", "item"])]
    out = parts.transform(t)
    assert out["user-item-count"].to_pylist() == expected
    assert out["user-item-price-mean"].type == pa.float32()                 # default out_dtype
    np.testing.assert_array_equal(out["user-item-price-mean"].to_numpy(zero_copy_only=False),
                                  whole.transform(t)["user-item-price-mean"].to_numpy(zero_copy_only=False))


@pytest.mark.parametrize("kwargs, error, match", [
    ({"stats": ["median"]}, ValueError, r"unknown stats \['median'\]"),
    ({"stats": ["mean"]}, ValueError, r"stats \['mean'\] need cont_cols"),
    ({"cont_cols": [1]}, TypeError, "cont_cols must be a column name, a non-empty list of names or a workflow node"),
    ({"cont_cols": ["x"], "out_dtype": "int8"}, ValueError, "out_dtype must be 'float32' or 'float64'"),
])
def test_join_groupby_bad_params(kwargs, error, match):
    with pytest.raises(error, match=match):
        JoinGroupby(**kwargs)


def test_join_groupby_cont_not_selected():
    # cont_cols join the selection (NVTabular's dependencies); one the data lacks is named
    with pytest.raises(SchemaError, match=r"selected columns \['nope'\] do not exist"):
        ts.Workflow(["user"] >> JoinGroupby(cont_cols=["nope"], stats=["sum"])).fit_schema(
            ts.Dataset(events(0)).schema)


# -- JoinExternal --------------------------------------------------------------------------------------
def join_reference(left: pa.Table, side: pd.DataFrame, on, side_cols, how):
    """Row by row: every side row with an equal, non-null key, in side order."""
    rows = []
    for i, key in enumerate(keys_of(left, on)):
        matches = [] if any(k is None for k in key) else [
            j for j in range(len(side)) if tuple(side[c].iloc[j] for c in on) == key]
        if not matches and how == "left":
            rows.append((i, None))
        rows += [(i, j) for j in matches]
    left_rows = [i for i, _ in rows]
    out = {c: [left[c][i].as_py() for i in left_rows] for c in left.column_names}
    for c in side_cols:
        out[c] = [None if j is None else side[c].iloc[j].item() for _, j in rows]
    return out


@pytest.mark.parametrize("how", ["left", "inner"])
@pytest.mark.parametrize("mode", ["all", "drop_duplicates_ext", "first_match_only"])
def test_join_external_matches_reference(how, mode):
    t = events(4).select(["item", "user"])
    # rows 4 and 5 repeat rows 1 and 0 exactly; item 1 also has a different row 2
    side = pd.DataFrame({"item": [0, 1, 1, 7, 1, 0], "bonus": [0.5, 1.5, 2.5, 9.0, 1.5, 0.5],
                         "rank": [3, 1, 2, 0, 1, 3]})
    flags = {} if mode == "all" else {mode: True}
    wf, _ = fit(["item", "user"] >> JoinExternal(side, on="item", how=how, **flags), t)
    out = wf.transform(t)
    ref_side = {"all": side, "drop_duplicates_ext": side.drop_duplicates(),
                "first_match_only": side.drop_duplicates("item")}[mode].reset_index(drop=True)
    assert out.to_pydict() == join_reference(t, ref_side, ["item"], ["bonus", "rank"], how)
    assert wf.output_schema.column_names == ["item", "user", "bonus", "rank"]
    repeated = mode != "first_match_only"   # item 1 still has two different side rows
    if how == "left":
        assert (out.num_rows > t.num_rows) == repeated


def test_join_external_drop_duplicates_compares_selected_columns_only():
    """As NVTabular: duplicates are judged on the keys and the columns joined
    (columns_ext), with null/NaN equal and -0.0 equal to 0.0."""
    side = pa.table({"k": [1, 1, 1, 2, 2], "v": [-0.0, 0.0, None, float("nan"), None],
                     "junk": ["a", "b", "c", "d", "e"]})
    t = pa.table({"k": [2, 1]})
    out = JoinExternal(side, on="k", columns_ext=["v"], drop_duplicates_ext=True).fit_table(t).transform(t)
    ref = side.to_pandas()[["k", "v"]].replace(-0.0, 0.0).drop_duplicates()
    expected = [v for k in [2, 1] for v in ref[ref.k == k].v]
    assert out["k"].to_pylist() == [2] * (ref.k == 2).sum() + [1] * (ref.k == 1).sum()
    got = np.asarray(out["v"].to_numpy(zero_copy_only=False), dtype=float)
    np.testing.assert_array_equal(got, np.asarray(expected, dtype=float))   # NaN == NaN here
    whole = JoinExternal(side, on="k", drop_duplicates_ext=True).fit_table(t).transform(t)
    assert whole.num_rows == 5                          # every row differs in "junk": none dropped


def test_join_external_sources_save_load_without_the_file(tmp_path):
    t = events(6).select(["user", "item"])
    side = pd.DataFrame({"u": ["u0", "u1", ""], "i": [0, 1, 2], "score": [0.1, 0.2, 0.3], "junk": ["a", "b", "c"]})
    path = tmp_path / "side.parquet"
    pq.write_table(pa.Table.from_pandas(side, preserve_index=False), path)
    outs = []
    for source in (side, pa.Table.from_pandas(side, preserve_index=False), str(path), path):
        op = JoinExternal(source, on=["user", "item"], on_ext=["u", "i"], columns_ext=["score"])
        wf, _ = fit(["user", "item"] >> op, t, SMALL_PART)
        outs.append(wf.transform(t))
        json.dumps(op.get_params())                                          # JSON parameters only
    assert all(o.equals(outs[0]) for o in outs)
    assert outs[0].to_pydict() == join_reference(t, side.rename(columns={"u": "user", "i": "item"}),
                                                 ["user", "item"], ["score"], "left")
    wf.save(str(tmp_path / "wf"))
    path.unlink()
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert again.transform(t).equals(outs[0])


def test_join_external_key_dtype_and_null_keys():
    t = pa.table({"k": pa.array([1, None, 3, 2], type=pa.int32())})
    side = pa.table({"k": pa.array([None, 1, 2], type=pa.int64()), "v": ["null-key", "one", "two"]})
    out = JoinExternal(side, on="k").fit_table(t).transform(t)
    assert out.to_pydict() == {"k": [1, None, 3, 2], "v": ["one", None, None, "two"]}


def test_numeric_keys_compare_by_value_across_int_and_float():
    """An int key and a float key meet as numbers: 1 matches 1.0, 1.5 matches nothing."""
    side = pa.table({"k": [1.0, 2.5, -0.0], "w": ["one", "two.5", "zero"]})
    t = pa.table({"k": pa.array([1, 2, 0, None], pa.int32())})
    out = JoinExternal(side, on="k").fit_table(t).transform(t)
    ref = {1: "one", 0: "zero"}                            # side keys that are whole numbers
    assert out["w"].to_pylist() == [ref.get(k) for k in t["k"].to_pylist()]
    op = JoinGroupby().fit_table(pa.table({"k": [1, 1, 2]}))
    probe = [1.5, 1.0, -0.0, 2.0]
    counts = Counter([1, 1, 2])
    assert op.transform(pa.table({"k": probe}))["k_count"].to_pylist() == [counts.get(v) for v in probe]


def test_join_external_errors():
    side = pd.DataFrame({"item": [0], "user": ["x"], "v": [1]})
    schema = ts.Dataset(events(0)).schema
    with pytest.raises(ValueError, match="how must be 'left' or 'inner', got 'outer'"):
        JoinExternal(side, on="item", how="outer")
    with pytest.raises(TypeError, match="df_ext must be a pandas or dask DataFrame, a pyarrow Table, a Dataset or a parquet/CSV path"):
        JoinExternal([1, 2], on="item")
    with pytest.raises(SchemaError, match=r"side table has no columns \['nope'\]"):
        JoinExternal(side, on="nope")
    with pytest.raises(SchemaError, match=r"side columns \['user'\] are also selected columns"):
        ts.Workflow(["item", "user"] >> JoinExternal(side, on="item")).fit_schema(schema)
    with pytest.raises(SchemaError, match=r"key columns \['item'\] must be part of the op's selection"):
        ts.Workflow(["user"] >> JoinExternal(side, on="item", columns_ext=["v"])).fit_schema(schema)
    rebuilt = Operator.from_config(JoinExternal(side, on="item").to_config())  # no side table yet
    with pytest.raises(NotFittedError, match="JoinExternal has no side table"):
        rebuilt.fit_table(events(0).select(["item"]))


# -- DifferenceLag --------------------------------------------------------------------------------------
def lag_reference(df: pd.DataFrame, col: str, keys, shift: int) -> np.ndarray:
    """NVTabular's definition: x - x.shift(s) where every key equals its shifted key."""
    same = np.ones(len(df), dtype=bool)
    for k in keys:
        same &= (df[k] == df[k].shift(shift)).fillna(False).to_numpy(dtype=bool)
    x = df[col].astype("float64")
    return np.where(same, (x - x.shift(shift)).to_numpy(), np.nan)


@pytest.mark.parametrize("seed", SEEDS)
def test_difference_lag_matches_pandas(seed):
    rng = np.random.default_rng(seed)
    n = 200
    t = pa.table({
        "user": pa.array(np.sort(rng.integers(0, 20, n)), mask=rng.random(n) < 0.05),
        "day": pa.array(rng.integers(0, 2, n)),
        "ts": pa.array(np.cumsum(rng.integers(0, 50, n)), mask=rng.random(n) < 0.05),
        "x": pa.array(rng.normal(size=n).astype(np.float32)),
    })
    wf, _ = fit(["ts", "x", "user", "day"] >> DifferenceLag(["user", "day"], shift=[1, -2]), t)
    out = wf.transform(t)
    assert out.column_names == ["ts_difference_lag_1", "ts_difference_lag_-2",
                                "x_difference_lag_1", "x_difference_lag_-2"]
    assert out["ts_difference_lag_1"].type == pa.int64() and out["x_difference_lag_1"].type == pa.float32()
    df = pd.DataFrame({c: as_float(t[c]) for c in t.column_names})
    for col in ["ts", "x"]:
        for s in (1, -2):
            np.testing.assert_allclose(as_float(out[f"{col}_difference_lag_{s}"]),
                                       lag_reference(df, col, ["user", "day"], s), rtol=1e-6, equal_nan=True)


def test_difference_lag_only_within_a_partition():
    n = 120
    t = pa.table({"user": pa.array(np.zeros(n, dtype=np.int64)), "ts": pa.array(np.arange(n) * 3)})
    wf, ds = fit(["ts", "user"] >> DifferenceLag("user"), t, 600)
    tds = wf.transform(ds)
    for piece in ds.pieces:
        got = tds.read_piece(piece)["ts_difference_lag_1"].to_pylist()
        assert got == [None] + [3] * (len(got) - 1)                  # lag lost at each partition start


@pytest.mark.parametrize("kwargs, error, match", [
    ({"shift": 0}, ValueError, "shift must be a non-zero integer"),
    ({"shift": [1, 1.5]}, ValueError, "shift must be a non-zero integer"),
    ({"partition_cols": []}, TypeError, "partition_cols must be a column name, a non-empty list of names or a workflow node"),
])
def test_difference_lag_bad_params(kwargs, error, match):
    with pytest.raises(error, match=match):
        DifferenceLag(**{"partition_cols": "user", **kwargs})


def test_difference_lag_selection_errors():
    schema = ts.Dataset(events(0)).schema
    with pytest.raises(SchemaError, match=r"selected columns \['nope'\] do not exist"):
        ts.Workflow(["price"] >> DifferenceLag("nope")).fit_schema(schema)
    with pytest.raises(SchemaError, match="select the value columns besides partition_cols"):
        ts.Workflow(["user"] >> DifferenceLag("user")).fit_schema(schema)


# -- shared contract checks ---------------------------------------------------------------------------------
def cases():
    side = pd.DataFrame({"item": [0, 1, 2], "w": [1.0, 2.0, 3.0]})
    return {
        "TargetEncoding": ["user", "item", "label"] >> TargetEncoding("label", kfold=2, drop_folds=False),
        "JoinGroupby": ["user", "price"] >> JoinGroupby(cont_cols=["price"], stats=ALL_STATS),
        "JoinExternal": ["item", "user"] >> JoinExternal(side, on="item"),
        "DifferenceLag": ["price", "user"] >> DifferenceLag("user", shift=[1, 2]),
    }


@pytest.mark.parametrize("name", ["TargetEncoding", "JoinGroupby", "JoinExternal"])
def test_transform_before_fit_raises(name):
    op = cases()[name].op
    with pytest.raises(NotFittedError, match=f"{name} has not been fitted"):
        op.transform(events(0))


@pytest.mark.parametrize("name", ["TargetEncoding", "JoinGroupby", "JoinExternal", "DifferenceLag"])
def test_save_load_gives_identical_output(name, tmp_path):
    t = events(8)
    wf, _ = fit(cases()[name], t, SMALL_PART)
    wf.save(str(tmp_path / "wf"))
    files = [p.name for p in (tmp_path / "wf").rglob("*") if p.is_file()]
    assert all(f.endswith((".json", ".parquet")) for f in files)
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert again.output_schema == wf.output_schema
    got, expected = again.transform(t), wf.transform(t)
    assert got.schema == expected.schema
    pd.testing.assert_frame_equal(got.to_pandas(), expected.to_pandas())
    op = wf.output_node.op
    params = json.loads(json.dumps(op.get_params()))
    assert params == op.get_params()

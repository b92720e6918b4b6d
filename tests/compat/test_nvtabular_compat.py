"""NVTabular code through ``tabstream.compat.nvtabular`` (issue 31): each behaviour
migrating code relies on, written the NVTabular way, checked against plain
pandas/numpy."""

from __future__ import annotations

import os

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tabstream.compat.nvtabular as nvt
from tabstream.compat.nvtabular import ops
from tabstream.core.errors import SchemaError


@pytest.fixture
def df():
    rng = np.random.default_rng(7)
    n = 120
    return pd.DataFrame({
        "Author": rng.choice(list("ABCDEFG"), n, p=[0.3, 0.2, 0.15, 0.15, 0.1, 0.05, 0.05]),
        "User": rng.choice(list("abcd"), n),
        "Cost": rng.integers(0, 50, n).astype(np.float64),
        "Post": rng.integers(0, 2, n),
        "ts": np.arange(n),
        "vals": [list(rng.integers(0, 9, k).astype(float)) for k in rng.integers(0, 4, n)],
    })


def categorify_reference(values: pd.Series) -> dict:
    """NVTabular's encoding: vocabulary by descending count, ties by value, from id 3."""
    counts = values.value_counts()
    order = sorted(counts.index, key=lambda v: (-counts[v], v))
    return {v: i + 3 for i, v in enumerate(order)}


def fit_compute(node, data, part_size=None):
    workflow = nvt.Workflow(node)
    return workflow, workflow.fit_transform(nvt.Dataset(data, part_size=part_size)).to_ddf().compute()


# -- item 1: numpy dtypes ---------------------------------------------------------------------
def test_outputs_hold_numpy_dtypes(df):
    wf, out = fit_compute((["Author"] >> ops.Categorify()) + ["Cost", "Post"], df, part_size=1500)
    assert out["Author"].dtype == np.int64 and out["Cost"].dtype == np.float64 and out["Post"].dtype == np.int64
    assert wf.transform(df)["Author"].dtype == np.int64
    assert all(part["Author"].dtype == np.int64 for part in wf.transform(nvt.Dataset(df)).to_iter())


# -- item 2: parameters migrating code passes -------------------------------------------------------
def test_categorify_out_path_split_out_tree_width(df, tmp_path):
    cats = ["Author"] >> ops.Categorify(out_path=str(tmp_path), split_out=3, tree_width=4, on_host=True)
    _, out = fit_compute(cats, df, part_size=1000)
    ref = categorify_reference(df["Author"])
    assert out["Author"].tolist() == [ref[v] for v in df["Author"]]
    written = pq.read_table(tmp_path / "categories" / "unique.Author.parquet").to_pandas()
    assert written["Author"].tolist() == sorted(ref, key=ref.get)
    assert written["Author_size"].tolist() == [int((df["Author"] == v).sum()) for v in written["Author"]]
    assert cats.op.stats_files["unique.Author"] == str(tmp_path / "categories" / "unique.Author.parquet")


@pytest.mark.parametrize(("dtype", "expected"), [(np.int32, np.int32), (None, np.int64),
                                                 ("int16", np.int16), (np.dtype("uint32"), np.uint32)])
def test_categorify_dtype_numpy_or_none(df, dtype, expected):
    _, out = fit_compute(["Author"] >> ops.Categorify(dtype=dtype), df)
    assert out["Author"].dtype == expected
    ref = categorify_reference(df["Author"])
    assert out["Author"].tolist() == [ref[v] for v in df["Author"]]


def test_categorify_dtype_errors():
    with pytest.raises(TypeError, match="dtype must be an integer dtype such as 'int32', np.int64 or None, got 'float32'"):
        ops.Categorify(dtype="float32")
    with pytest.raises(ValueError, match=r"the ids of 'c' do not fit dtype int8.*pass a wider dtype"):
        nvt.Workflow(["c"] >> ops.Categorify(dtype="int8")).fit_transform(
            pd.DataFrame({"c": [str(i) for i in range(300)]}))


def test_categorify_num_buckets_per_column(df):
    train, test = df.iloc[:60], pd.DataFrame({"Author": ["zz", "yy", "A"], "User": ["qq", "a", "rr"]})
    wf = nvt.Workflow(["Author", "User"] >> ops.Categorify(num_buckets={"Author": 5}, max_size={"Author": 9}))
    wf.fit(nvt.Dataset(train))
    out = wf.transform(test)
    schema = wf.output_schema
    assert schema["Author"].properties["num_buckets"] == 5 and schema["Author"].properties["start_index"] == 7
    assert schema["User"].properties["num_buckets"] is None and schema["User"].properties["start_index"] == 3
    assert all(2 <= i < 7 for i in out["Author"][:2])          # unseen values: the column's 5 buckets
    top = train["Author"].value_counts()
    top_value = sorted(top.index, key=lambda v: (-top[v], v))[0]
    assert out["Author"][2] == (7 if top_value == "A" else out["Author"][2])
    assert out["User"].tolist()[0] == 2 and out["User"].tolist()[2] == 2  # one OOV id without buckets
    with pytest.raises(ValueError, match="num_buckets must be a positive integer, a dict column -> positive integer"):
        ops.Categorify(num_buckets={"Author": 0})


def test_target_encoding_pulls_in_its_target_and_takes_nvtabular_params(df, tmp_path):
    te = ["Author"] >> ops.TargetEncoding("Post", kfold=1, p_smooth=0, fold_seed=None,
                                          out_path=str(tmp_path), split_out=2, out_dtype="float32")
    _, out = fit_compute(te, df)
    means = df.groupby("Author")["Post"].mean()
    np.testing.assert_allclose(out["TE_Author_Post"], [means[a] for a in df["Author"]], rtol=1e-6)
    assert (tmp_path / "categories" / "target_encoding.Author.parquet").exists()


def test_target_encoding_target_given_as_a_node(df):
    labels = nvt.ColumnSelector(["Cost"]) >> ops.LambdaOp(lambda col: (col > 20).astype("int8"))
    _, out = fit_compute(["Author", "User", ["Author", "User"]] >> ops.TargetEncoding(labels, kfold=1, p_smooth=0), df)
    target = (df["Cost"] > 20).astype(float)
    for group in (["Author"], ["User"], ["Author", "User"]):
        means = target.groupby([df[c] for c in group]).transform("mean")
        np.testing.assert_allclose(out[f"TE_{'_'.join(group)}_Cost"], means, rtol=1e-6)


def test_join_groupby_pulls_in_cont_cols_and_takes_a_node(df, tmp_path):
    node = ["Author"] >> ops.JoinGroupby(cont_cols=["Cost"], stats=["sum", "count"], out_path=str(tmp_path))
    _, out = fit_compute(node, df)
    sums, counts = df.groupby("Author")["Cost"].sum(), df.groupby("Author").size()
    assert out["Author_Cost_sum"].tolist() == [sums[a] for a in df["Author"]]
    assert out["Author_count"].tolist() == [counts[a] for a in df["Author"]]
    assert (tmp_path / "categories" / "join_groupby.Author.parquet").exists()
    logged = nvt.ColumnSelector(["Cost"]) >> ops.LogOp()
    _, out = fit_compute(["Author"] >> ops.JoinGroupby(cont_cols=logged, stats=["mean"]), df)
    means = np.log1p(df["Cost"]).groupby(df["Author"]).mean()
    np.testing.assert_allclose(out["Author_Cost_mean"], [means[a] for a in df["Author"]], rtol=1e-5)


def test_difference_lag_and_groupby_pull_in_their_keys(df):
    _, out = fit_compute(["ts"] >> ops.DifferenceLag("Author", shift=1), df)
    # NVTabular's rule: the previous row's difference when it has the same key, else missing
    expected = (df["ts"] - df["ts"].shift(1)).where(df["Author"] == df["Author"].shift(1))
    np.testing.assert_array_equal(out["ts_difference_lag_1"].to_numpy(dtype=float, na_value=np.nan),
                                  expected.to_numpy(dtype=float))
    _, out = fit_compute(["Cost"] >> ops.Groupby(groupby_cols=["Author"], aggs={"Cost": ["sum", "median", "nunique"]}),
                         df)
    g = df.groupby("Author")["Cost"]
    assert out["Author"].tolist() == sorted(df["Author"].unique())
    np.testing.assert_allclose(out["Cost_sum"], g.sum().to_numpy())
    np.testing.assert_allclose(out["Cost_median"], g.median().to_numpy())
    assert out["Cost_nunique"].tolist() == g.nunique().tolist()


def test_dependency_already_selected_is_read_once(df):
    a = nvt.Workflow(["Author", "Post"] >> ops.TargetEncoding("Post", kfold=1)).fit_transform(df)
    b = nvt.Workflow(["Author"] >> ops.TargetEncoding("Post", kfold=1)).fit_transform(df)
    pd.testing.assert_frame_equal(a, b)


def test_free_form_tags_beside_the_enum(df):
    wf = nvt.Workflow(["Author"] >> ops.Categorify() >> ops.AddTags(["session_feature", nvt.Tags.ITEM]))
    wf.fit(nvt.Dataset(df))
    assert {t.value for t in wf.output_schema["Author"].tags} >= {"session_feature", "item", "categorical"}
    assert wf.output_schema.select_by_tag("session_feature").column_names == ["Author"]
    again = nvt.Schema.from_json(wf.output_schema.to_json())
    assert again.select_by_tag("session_feature").column_names == ["Author"]
    with pytest.raises(ValueError, match="unknown tag 'continous'; did you mean 'continuous'"):
        ops.AddTags(["continous"])


def test_schema_and_column_schema_api():
    col = nvt.ColumnSchema("x", dtype=np.int64, tags=[nvt.Tags.CATEGORICAL])
    assert col.dtype == "int64" and nvt.ColumnSchema("y", dtype=np.float32).dtype == "float32"
    fixed = col.with_shape((None, 3))
    assert fixed.is_list and not fixed.is_ragged and fixed.shape == (None, 3)
    ragged = col.with_shape((None, None))
    assert ragged.is_list and ragged.is_ragged and ragged.shape == (None, None)
    assert ragged.with_shape((None,)).shape == (None,) and not ragged.with_shape((None,)).is_list
    schema = nvt.Schema([col, nvt.ColumnSchema("y", dtype=np.float32)])
    assert list(schema.column_schemas) == ["x", "y"] and schema.column_schemas["x"] == col
    with pytest.raises(ValueError, match=r"shape must be \(None,\), \(None, None\) or \(None, n\)"):
        col.with_shape((None, 2, 2))


def test_node_api(df):
    cats = ["Author", "User"] >> ops.Categorify()
    with pytest.raises(SchemaError, match="has no output schema yet: fit its workflow first"):
        cats.output_schema.column_names  # noqa: B018
    picked = cats["Author"]
    doubled = nvt.ColumnSelector(["Cost"]) >> (lambda col: col * 2)
    wf = nvt.Workflow(picked + doubled)
    out = wf.fit_transform(df)
    assert cats.output_schema.column_names == ["Author", "User"]          # fitted: a schema
    assert cats.output_schema["Author"].properties["embedding_sizes"] == \
        wf.output_schema["Author"].properties["embedding_sizes"]
    assert out.columns.tolist() == ["Author", "Cost"] and out["Cost"].tolist() == (df["Cost"] * 2).tolist()
    sizes = ops.get_embedding_sizes(cats)
    cards = {c: df[c].nunique() + 3 for c in ("Author", "User")}
    assert {c: s[0] for c, s in sizes.items()} == cards
    assert ops.get_embedding_sizes(wf) == {"Author": sizes["Author"]}
    with pytest.raises(SchemaError, match=r"node\[\['nope'\]\]: \['nope'\] are not among its columns"):
        nvt.Workflow(cats["nope"]).fit(df)


def test_multi_hot_embedding_sizes_come_apart(df):
    wf = nvt.Workflow((["Author"] >> ops.Categorify()) + (["vals"] >> ops.Categorify()))
    wf.fit(nvt.Dataset(df))
    single, multi = ops.get_embedding_sizes(wf)
    assert list(single) == ["Author"] and list(multi) == ["vals"]
    assert multi["vals"][0] == len({v for row in df["vals"] for v in row}) + 3


def test_lambda_infers_a_changed_dtype(df):
    _, out = fit_compute(["Post"] >> ops.LambdaOp(lambda col: (col > 0).astype("int8")), df)
    assert out["Post"].dtype == np.int8 and out["Post"].tolist() == (df["Post"] > 0).astype("int8").tolist()
    _, out = fit_compute(["Cost"] >> ops.LambdaOp(lambda col: col.astype("float32") / 2), df)
    assert out["Cost"].dtype == np.float32


def test_transform_without_fit_when_no_op_needs_statistics(df):
    out = nvt.Workflow(["Cost"] >> ops.Clip(min_value=10) >> ops.LogOp()).transform(df)
    np.testing.assert_allclose(out["Cost"], np.log1p(df["Cost"].clip(lower=10)), rtol=1e-6)
    with pytest.raises(Exception, match="not fitted"):
        nvt.Workflow(["Cost"] >> ops.Normalize()).transform(df)


def test_filter_with_a_function_returning_the_filtered_frame(df):
    cols = ["Cost", "Post"]
    by_frame = nvt.Workflow(cols >> ops.Filter(lambda d: d[d["Cost"] > 20])).transform(nvt.Dataset(df, part_size=800))
    by_mask = nvt.Workflow(cols >> ops.Filter(lambda d: d["Cost"] > 20)).transform(df)
    expected = df.loc[df["Cost"] > 20, cols].reset_index(drop=True)
    pd.testing.assert_frame_equal(by_frame.to_ddf().compute().reset_index(drop=True), expected)
    pd.testing.assert_frame_equal(by_mask, expected)
    with pytest.raises(TypeError, match="returned a frame with columns"):
        nvt.Workflow(cols >> ops.Filter(lambda d: d[["Cost"]])).transform(df)


def test_log_and_normalize_on_list_columns(df):
    _, out = fit_compute(["vals"] >> ops.LogOp(), df)
    for got, row in zip(out["vals"], df["vals"]):
        np.testing.assert_allclose(list(got), np.log1p(row), rtol=1e-6)
    _, out = fit_compute(["vals"] >> ops.Normalize(), df, part_size=1000)
    flat = np.concatenate([r for r in df["vals"] if len(r)])
    mean, std = flat.mean(), flat.std(ddof=1)
    for got, row in zip(out["vals"], df["vals"]):
        assert len(got) == len(row)
        np.testing.assert_allclose(list(got), (np.asarray(row) - mean) / std, rtol=1e-5, atol=1e-6)


def test_data_stats_output(df):
    data = df.assign(Cost=df["Cost"].where(df.index % 4 != 0))
    stats = ops.DataStats()
    nvt.Workflow(["Cost", "Author"] >> stats).fit(nvt.Dataset(data))
    out = stats.output
    assert out["Cost"]["per_nan"] == pytest.approx(100 * data["Cost"].isna().mean())
    assert out["Cost"]["mean"] == pytest.approx(data["Cost"].mean())
    assert out["Cost"]["std"] == pytest.approx(data["Cost"].std())
    assert (out["Cost"]["min"], out["Cost"]["max"]) == (data["Cost"].min(), data["Cost"].max())
    assert "cardinality" not in out["Cost"] and out["Author"]["cardinality"] == data["Author"].nunique()


def test_dataset_compute(df):
    got = nvt.Dataset(df[["Cost", "Author"]], part_size=800).compute()
    pd.testing.assert_frame_equal(got, df[["Cost", "Author"]], check_dtype=False)
    assert got["Cost"].dtype == np.float64


@pytest.mark.parametrize("kind", ["csv", "dask", "dataset", "parquet"])
def test_join_external_side_tables(df, tmp_path, kind):
    side = pd.DataFrame({"Author": list("ABCDE"), "weight": [1.5, 2.5, 3.5, 4.5, 5.5]})
    if kind == "csv":
        side.to_csv(tmp_path / "side.csv", index=False)
        ext = str(tmp_path / "side.csv")
    elif kind == "parquet":
        side.to_parquet(tmp_path / "side.parquet")
        ext = str(tmp_path / "side.parquet")
    elif kind == "dask":
        ext = dd.from_pandas(side, npartitions=2)
    else:
        ext = nvt.Dataset(side)
    _, out = fit_compute(["Author"] >> ops.JoinExternal(ext, on="Author", cache="host"), df)
    expected = df[["Author"]].merge(side, on="Author", how="left")
    np.testing.assert_array_equal(out["weight"].to_numpy(dtype=float, na_value=np.nan),
                                  expected["weight"].to_numpy(dtype=float))


def test_export_into_an_existing_empty_folder_and_shuffle_enum(df, tmp_path):
    out = tmp_path / "out"
    os.makedirs(out)  # NVTabular notebooks make the folder first
    wf = nvt.Workflow(["Cost", "Post"])
    wf.fit_transform(nvt.Dataset(df)).to_parquet(str(out), shuffle=nvt.io.Shuffle.PER_PARTITION, seed=1)
    back = pd.read_parquet(out)
    assert sorted(back["Cost"].tolist()) == sorted(df["Cost"].tolist())
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        wf.transform(nvt.Dataset(df)).to_parquet(str(out))


def save_load_function(col):
    return col + 1


def test_saved_workflow_keeps_dependencies_and_picks(df, tmp_path):
    labels = nvt.ColumnSelector(["Post"]) >> ops.LambdaOp(save_load_function)
    node = (["Author"] >> ops.TargetEncoding(labels, kfold=1))["TE_Author_Post"] + \
        (["Author", "User"] >> ops.Categorify())["User"]
    wf = nvt.Workflow(node)
    before = wf.fit_transform(df)
    wf.save(str(tmp_path / "wf"))
    after = nvt.Workflow.load(str(tmp_path / "wf")).transform(df)
    pd.testing.assert_frame_equal(before, after)
    means = (df["Post"] + 1).groupby(df["Author"]).transform("mean")
    assert before.columns.tolist() == ["TE_Author_Post", "User"]
    # smoothed toward the global mean: between the category mean and the global mean
    lo = np.minimum(means, (df["Post"] + 1).mean()) - 1e-6
    hi = np.maximum(means, (df["Post"] + 1).mean()) + 1e-6
    assert ((before["TE_Author_Post"] >= lo) & (before["TE_Author_Post"] <= hi)).all()


def test_groupby_names_outputs_the_nvtabular_way(df):
    _, out = fit_compute(["Author", "Cost"] >> ops.Groupby("Author", aggs=["list", "count"]), df)
    assert out.columns.tolist() == ["Author", "Cost_list", "Cost_count"]
    assert out["Cost_count"].tolist() == df.groupby("Author")["Cost"].count().tolist()


def test_schema_without_dtypes_builds_the_graph():
    """NVTabular code builds graphs on ``Schema(["a", "b"])``; dtypes come with the data."""
    schema = nvt.Schema(["name", "ts", "x", "cost"])
    graph = ((["name"] >> ops.Categorify()) + (["x"] >> ops.Normalize())
             + (["name"] >> ops.TargetEncoding("cost")))
    wf = nvt.Workflow(graph).fit_schema(schema)
    out = wf.output_schema
    assert out.column_names == ["name", "x", "TE_name_cost"]
    assert out["name"].dtype == "int64" and nvt.Tags.CATEGORICAL in out["name"].tags
    assert out["x"].dtype == "float32" and out["TE_name_cost"].dtype == "float32"
    grouped = nvt.Workflow(["ts", "x"] >> ops.Groupby("name", aggs={"x": ["sum"]})).fit_schema(schema)
    assert grouped.output_schema.column_names == ["name", "x_sum"]
    with pytest.raises(TypeError, match="Normalize needs numeric columns, but column 'name' is string"):
        nvt.Workflow(["name"] >> ops.Normalize()).fit_schema(nvt.Schema([nvt.ColumnSchema("name", "string")]))


# -- item 6: the module itself ----------------------------------------------------------------------
def test_top_level_names_are_tabstreams_own():
    import tabstream as ts

    assert nvt.Workflow is ts.Workflow and nvt.Dataset is ts.Dataset and nvt.Schema is ts.Schema
    assert nvt.WorkflowNode is ts.Node and nvt.io.Dataset is ts.Dataset
    with pytest.warns(DeprecationWarning, match="ColumnGroup is deprecated"):
        assert nvt.ColumnGroup(["a"]).names == ["a"]
    assert ops.AddProperties({"x": 1}).properties == {"x": 1}
    with pytest.raises(AttributeError, match="nvtabular.ops.ColumnSimilarity has no tabstream counterpart"):
        ops.ColumnSimilarity  # noqa: B018
    with pytest.raises(AttributeError, match="nvtabular.Distributed has no tabstream counterpart"):
        nvt.Distributed  # noqa: B018
    import tabstream.ops as native

    missing = [n for n in ("Categorify", "HashBucket", "HashedCross", "Normalize", "NormalizeMinMax",
                           "FillMissing", "FillMedian", "Clip", "LogOp", "Bucketize", "LambdaOp", "Rename",
                           "Filter", "Dropna", "ListSlice", "TargetEncoding", "JoinGroupby", "JoinExternal",
                           "DifferenceLag", "ValueCount", "DropLowCardinality", "ReduceDtypeSize", "AddTags",
                           "AddMetadata", "DataStats", "get_embedding_sizes")
               if getattr(ops, n, None) is not getattr(native, n)]
    assert missing == []


def test_selector_plus_selector_is_one_selector_of_both_names():
    """NVTabular's selector arithmetic: ColumnSelector + ColumnSelector (or names) is one
    ColumnSelector (it was a node whose .names was empty); by-tag selectors with
    different tags stay a node of the two (a selector's tags are all required)."""
    from tabstream.core.graph import ColumnSelector, Node

    both = ColumnSelector(["a", "b"]) + ColumnSelector(["c", "a"])
    assert isinstance(both, ColumnSelector) and both.names == ["a", "b", "c"]
    assert (ColumnSelector(["a"]) + "d").names == ["a", "d"]
    assert (["x"] + ColumnSelector(["a"])).names == ["x", "a"]
    assert isinstance(ColumnSelector(tags=["categorical"]) + ColumnSelector(tags=["continuous"]), Node)
    df = pd.DataFrame({"a": [1.0, 2.0, 3.0], "b": [2.0, 2.0, 4.0], "c": [0.0, 1.0, 0.0]})
    out = nvt.Workflow(both >> ops.Normalize()).fit(nvt.Dataset(df)).transform(df)
    assert list(out.columns) == ["a", "b", "c"]
    np.testing.assert_allclose(out["b"], (df["b"] - df["b"].mean()) / df["b"].std(ddof=1), rtol=1e-6)


def test_nvtabular_dataset_and_export_keywords(tmp_path):
    """part_mem_fraction / row_groups_per_part are taken with a warning (partitions
    follow part_size); output_files is num_files; cats/conts/labels/preserve_files
    are refused by name (they were refused as unknown, and the Dataset's sizing
    keywords by the new unknown-keyword check)."""
    from tabstream.core.errors import DatasetWarning

    df = pd.DataFrame({"a": np.arange(100) % 7, "y": np.arange(100) % 2})
    df.to_parquet(tmp_path / "x.parquet")
    for keyword in ({"part_mem_fraction": 0.1}, {"row_groups_per_part": 2}):
        with pytest.warns(DatasetWarning, match=f"{next(iter(keyword))} .NVTabular's partition sizing. is ignored"):
            ds = nvt.Dataset(str(tmp_path / "x.parquet"), **keyword)
        assert ds.num_rows == 100
    wf = nvt.Workflow(["a"] >> ops.Categorify())
    wf.fit(nvt.Dataset(df))
    result = wf.transform(nvt.Dataset(df)).to_parquet(str(tmp_path / "out"), output_files=3)
    assert len(result.files) == 3 and sum(pq.read_metadata(tmp_path / "out" / f).num_rows for f in result.files) == 100
    with pytest.raises(TypeError, match=r"to_parquet: cats, conts \(NVTabular's\) are not taken"):
        wf.transform(nvt.Dataset(df)).to_parquet(str(tmp_path / "out2"), cats=["a"], conts=[])
    with pytest.raises(TypeError, match="num_files or output_files"):
        wf.transform(nvt.Dataset(df)).to_parquet(str(tmp_path / "out3"), output_files=2, num_files=2)

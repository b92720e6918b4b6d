"""Behaviours NVTabular code relies on beyond the ops' parameters (issue 31, the
measurement against NVTabular 23.08's own unit tests): an op's methods called in
NVTabular's forms, custom ops written NVTabular's way, ``cols >> OpClass``.
Each is checked against plain pandas/numpy."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tabstream.compat.nvtabular as nvt
from tabstream.compat.nvtabular import ColumnSchema, ColumnSelector, Schema, Tags, ops
from tabstream.core.errors import NotFittedError


@pytest.fixture
def df():
    rng = np.random.default_rng(3)
    n = 60
    return pd.DataFrame({
        "a": rng.integers(0, 9, n),
        "b": rng.random(n) * 10,
        "c": rng.choice(["x", "y", "z"], n),
        "label": rng.integers(0, 2, n),
    })


def run(node, data):
    workflow = nvt.Workflow(node)
    return workflow, workflow.fit_transform(nvt.Dataset(data)).to_ddf().compute()


# -- an op's methods in NVTabular's forms -----------------------------------------------------
SCHEMA = Schema([ColumnSchema("a", np.int64, tags=[Tags.CATEGORICAL]), ColumnSchema("b", np.float64),
                 ColumnSchema("c", "string"), ColumnSchema("label", np.int64)])


@pytest.mark.parametrize(("op", "selection", "names", "dtype"), [
    (ops.Categorify(), ["a", "c"], ["a", "c"], "int64"),
    (ops.LogOp(), ["b"], ["b"], "float32"),
    (ops.Rename(postfix="_r"), ["a", "b"], ["a_r", "b_r"], None),
    (ops.TargetEncoding("label", kfold=1), ["c"], ["TE_c_label"], "float32"),
    (ops.JoinGroupby(cont_cols=["b"], stats=["sum"]), ["c"], ["c_b_sum"], "float32"),
])
def test_compute_output_schema_with_a_selector(op, selection, names, dtype):
    out = op.compute_output_schema(SCHEMA, ColumnSelector(selection))
    assert out.column_names == names                    # only the selection's outputs
    for name, source in zip(names, selection if len(names) == len(selection) else selection * len(names)):
        assert out[name].dtype == (dtype or SCHEMA[source].dtype)
    assert op.output_column_names(ColumnSelector(selection)).names == names
    # the one-argument form on the narrowed schema agrees
    narrowed = SCHEMA.select_by_name([*selection, *(["label"] if "label" in repr(op) else []),
                                      *(["b"] if "JoinGroupby" in repr(op) else [])])
    assert op.compute_output_schema(narrowed).column_names == names


def test_transform_with_a_selector_and_a_pandas_frame(df):
    frame = df.set_index(pd.RangeIndex(100, 100 + len(df)))
    out = ops.LogOp().transform(ColumnSelector(["b"]), frame)
    assert list(out.columns) == ["b"] and out.index.equals(frame.index)
    np.testing.assert_allclose(out["b"], np.log1p(frame["b"]).astype(np.float32), rtol=1e-6)
    clipped = ops.Clip(min_value=3).transform(ColumnSelector(["a"]), frame)
    assert clipped["a"].tolist() == frame["a"].clip(lower=3).tolist()


def test_op_class_applied_builds_its_default_instance(df):
    _, out = run(["b"] >> ops.FillMissing >> ops.LogOp, df)
    np.testing.assert_allclose(out["b"], np.log1p(df["b"]).astype(np.float32), rtol=1e-6)
    with pytest.raises(TypeError, match=r"Bucketize is a class and it needs \['boundaries'\]; apply an instance"):
        ["b"] >> ops.Bucketize


def test_submodule_imports():
    from tabstream.compat.nvtabular.ops.categorify import get_embedding_sizes
    from tabstream.compat.nvtabular.ops.operator import Operator

    assert get_embedding_sizes is ops.get_embedding_sizes and Operator is ops.Operator


# -- custom ops written NVTabular's way ------------------------------------------------------
class Doubled(ops.Operator):
    """Renames through column_mapping; keeps the dtype."""

    def transform(self, col_selector, df):
        return pd.DataFrame({f"{n}_x2": df[n] * 2 for n in col_selector.names}, index=df.index)

    def column_mapping(self, col_selector):
        return {f"{n}_x2": [n] for n in col_selector.names}


class AsFloat(ops.Operator):
    """Changes the dtype without declaring it (learned on zero rows)."""

    def transform(self, col_selector, df):
        return df[col_selector.names].astype("float32") / 2


class Centered(ops.Operator):
    """Reads a dependency column; declares tags and a dtype."""

    def __init__(self, by):
        super().__init__()
        self.by = by

    @property
    def dependencies(self):
        return [self.by]

    output_dtype = np.float64
    output_tags = [Tags.CONTINUOUS]

    def transform(self, col_selector, df):
        for name in col_selector.names:
            df[name] = df[name] - df[self.by]
        return df[col_selector.names]


class Suffixed(ops.Operator):
    """Older NVTabular style: overrides output_column_names only."""

    def transform(self, col_selector, df):
        return df[col_selector.names].rename(columns=lambda n: n + "_s")

    def output_column_names(self, col_selector):
        return ColumnSelector([n + "_s" for n in col_selector.names])


def test_custom_ops_run_in_a_workflow(df):
    node = (["a", "b"] >> Doubled()) + (["a"] >> AsFloat()) + (["b"] >> Centered("a")) + (["c"] >> Suffixed())
    workflow, out = run(node, df)
    assert list(out.columns) == ["a_x2", "b_x2", "a", "b", "c_s"]
    assert out["a_x2"].tolist() == (df["a"] * 2).tolist()
    np.testing.assert_allclose(out["b_x2"], df["b"] * 2)
    assert out["a"].dtype == np.float32 and out["a"].tolist() == (df["a"] / 2).astype("float32").tolist()
    np.testing.assert_allclose(out["b"], df["b"] - df["a"])
    assert out["c_s"].tolist() == df["c"].tolist()
    schema = workflow.output_schema
    assert schema["a_x2"].dtype == "int64" and schema["a"].dtype == "float32"
    assert schema["b"].dtype == "float64" and Tags.CONTINUOUS in schema["b"].tags
    assert "a" not in (["b"] >> Centered("a")).output_schema(nvt.Dataset(df).schema).column_names[1:]


def test_custom_op_methods_called_directly(df):
    op = Doubled()
    assert op.output_column_names(ColumnSelector(["a"])).names == ["a_x2"]
    out = op.compute_output_schema(SCHEMA, ColumnSelector(["a", "b"]))
    assert out.column_names == ["a_x2", "b_x2"] and out["a_x2"].tags == SCHEMA["a"].tags
    frame = op.transform(ColumnSelector(["a"]), df)
    assert frame["a_x2"].tolist() == (df["a"] * 2).tolist()
    identity = ops.Operator()
    assert identity.transform(ColumnSelector(["a"]), df) is df
    _, same = run(["a", "c"] >> identity, df)
    assert same["a"].tolist() == df["a"].tolist() and same["c"].tolist() == df["c"].tolist()


# -- graph, schema, dataset and workflow names NVTabular code uses ----------------------------
def test_subtracting_a_node_drops_its_output_columns(df):
    feats = ["a", "b"] >> ops.FillMissing() >> ops.Rename(postfix="_r")
    minus = ["b", "not_there"] >> ops.Rename(postfix="_r")        # names feats lacks are ignored
    workflow, out = run(feats - minus, df)
    assert list(out.columns) == ["a_r"] and out["a_r"].tolist() == df["a"].tolist()
    _, kept = run((["a", "b", "c"] >> ops.Operator()) - nvt.ColumnSelector(["c"]), df)
    assert list(kept.columns) == ["a", "b"]
    assert (feats - (["c"] >> ops.Operator())) is feats              # nothing to drop: the node itself


def test_a_ragged_column_schema_is_a_list():
    col = ColumnSchema("feature", dtype=np.int64, is_ragged=True, properties={"value_count": {"min": 1, "max": 2}})
    assert col.is_list and col.shape == (None, None)
    assert ColumnSchema("f", "int64").is_list is False


def test_transform_takes_a_dict_of_arrays(df):
    arrays = {"b": df["b"].to_numpy(), "a": df["a"].to_numpy()}
    out = ops.LogOp().transform(ColumnSelector(["b"]), arrays)
    assert list(out) == ["b"] and isinstance(out["b"], np.ndarray)
    np.testing.assert_allclose(out["b"], np.log1p(df["b"]).astype(np.float32), rtol=1e-6)


def test_dataset_to_cpu(df):
    ds = nvt.Dataset(df)
    assert ds.to_cpu() is None and ds.cpu is True
    out = nvt.Workflow(["a"] >> ops.Clip(max_value=4)).fit_transform(ds).to_ddf().compute()
    assert out["a"].tolist() == df["a"].clip(upper=4).tolist()


def test_categorify_categories_lists_the_files_written(df, tmp_path):
    op = ops.Categorify(out_path=str(tmp_path), encode_type="combo")
    run(["c", ["a", "c"]] >> op, df)
    assert set(op.categories) == {"c", "a_c"}
    written = pd.read_parquet(op.categories["c"])
    counts = df["c"].value_counts()
    assert written["c"].tolist() == sorted(counts.index, key=lambda v: (-counts[v], v))
    with pytest.raises(ValueError, match=r"this op has none: pass Categorify\(out_path=folder\)"):
        _ = ops.Categorify().categories


def test_value_count_stats(df):
    lists = pd.DataFrame({"l": [[1, 2], [3], [4, 5, 6]], "m": [[1], [2], [3]]})
    op = ops.ValueCount()
    run(["l", "m"] >> op, lists)
    lengths = lists.map(len)
    assert op.stats == {c: {"value_count": {"min": int(lengths[c].min()), "max": int(lengths[c].max())}}
                        for c in ["l", "m"]}


def test_workflow_input_and_output_dtypes(df):
    workflow = nvt.Workflow([["c", "a"], "c"] >> ops.Categorify(encode_type="combo"))
    with pytest.raises(NotFittedError, match="no input schema yet"):
        _ = workflow.input_dtypes
    workflow.fit(nvt.Dataset(df))
    assert workflow.input_dtypes == {"c": "string", "a": str(df["a"].dtype)}
    assert workflow.output_dtypes == {"c_a": "int64", "c": "int64"}


def test_difference_lag_takes_a_node_as_partition_cols():
    frame = pd.DataFrame({"user": [1, 1, 1, 2, 2], "ts": [10, 15, 30, 5, 9]})
    users = ["user"] >> ops.Operator()
    _, out = run(["ts"] >> ops.DifferenceLag(partition_cols=[users], shift=1), frame)
    expected = frame["ts"] - frame.groupby("user")["ts"].shift(1)
    assert out["ts_difference_lag_1"].astype("float64").tolist()[1:3] == expected.tolist()[1:3]
    assert out["ts_difference_lag_1"].isna().tolist() == expected.isna().tolist()


def test_list_ops_build_a_graph_from_a_schema_without_dtypes():
    workflow = nvt.Workflow(ColumnSelector(tags=["c"]) >> ops.ListSlice(0, 2))
    workflow.fit_schema(Schema([ColumnSchema("col1", tags=["c"]), ColumnSchema("col2", tags=["d"])]))
    assert workflow.output_schema.column_names == ["col1"] and workflow.output_schema["col1"].is_list


def test_dask_frame_with_object_list_columns_gets_their_list_type():
    import dask
    import dask.dataframe as dd

    frame = pd.DataFrame({"u": [1, 2, 1, 3, 2], "v": [[1, 2], [3], [4], [5, 6], []]})
    with dask.config.set({"dataframe.convert-string": False}):  # lists stay objects in the dask frame
        ddf = dd.from_pandas(frame, npartitions=2)
    ds = nvt.Dataset(ddf)
    assert ds.schema["v"].is_list and ds.schema["v"].dtype == "int64"
    out = nvt.Workflow(["u", "v"] >> ops.Groupby(groupby_cols="u", aggs={"v": ["first", "last"]})) \
        .fit_transform(ds).compute().sort_values("u")
    groups = frame.groupby("u")["v"]
    assert [list(x) for x in out["v_first"]] == [list(x) for x in groups.first()]
    assert [list(x) for x in out["v_last"]] == [list(x) for x in groups.last()]

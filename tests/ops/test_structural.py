"""Rename, Filter, Dropna, LambdaOp and the tagging helpers against plain pandas
references; saving user functions by name, and refusing tampered names."""

import json
import os
from os.path import join as joined_path  # noqa: F401  (an alias: must not load as this module's function)

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.ops import functions
from tabstream.ops.structural import (
    Dropna,
    Filter,
    FunctionResolutionError,
    LambdaOp,
    Rename,
    TagAsItemFeatures,
    TagAsItemID,
    TagAsUserFeatures,
    TagAsUserID,
    provided_functions,
    register_function,
)


# module-level functions: the only kind a saved workflow can name
def upper_name(name):
    return name.upper()


def price_positive(df):
    return df["price"] > 0


def first_two(s):
    return s.str.slice(0, 2)


def plus_one(s):
    return s + 1


def halve(s):
    return s / 2


def minus_mean_of_frame(s, df):
    return s - df["price"].mean()


def not_a_mask(df):
    return df["price"] * 2


@pytest.fixture
def frame():
    return pd.DataFrame({
        "user": pd.array(["ann", "bob", None, "cy", "dee", "ed", None, "flo"], dtype="str"),
        "price": [1.5, -2.0, 3.0, np.nan, 0.0, 7.25, 2.0, -1.0],
        "count": pd.array([3, None, 5, 1, 6, 2, 8, 4], dtype="Int64"),
        "tags": pd.Series([["a"], [], None, ["b", "c"], [], ["d"], ["e"], None],
                          dtype=pd.ArrowDtype(pa.list_(pa.string()))),
    })


def run(node, df, part_size=96):
    ds = ts.Dataset(df, part_size=part_size)
    assert ds.npartitions > 1
    wf = ts.Workflow(node).fit(ds)
    return wf, wf.transform(ds).compute()


def test_rename_postfix_name_and_function(frame):
    for op, names in [
        (Rename(postfix="_x"), ["user_x", "price_x"]),
        (Rename(f=upper_name), ["USER", "PRICE"]),
    ]:
        wf, out = run(["user", "price"] >> op, frame)
        assert list(out.columns) == names == wf.output_schema.column_names
        pd.testing.assert_series_equal(out[names[1]], frame["price"], check_names=False)
    wf, out = run(["count"] >> Rename(name="n"), frame)
    assert list(out.columns) == ["n"] and out["n"].tolist() == frame["count"].tolist()


def test_rename_errors(frame):
    schema = ts.Dataset(frame).schema
    with pytest.raises(SchemaError, match=r"Rename\(name='n'\) renames one column, but 2 are selected"):
        ts.Workflow(["user", "price"] >> Rename(name="n")).fit_schema(schema)
    with pytest.raises(ValueError, match="exactly one of f, postfix or name; got none"):
        Rename()
    with pytest.raises(ValueError, match=r"got \['postfix', 'name'\]"):
        Rename(postfix="_a", name="b")
    with pytest.raises(SchemaError, match=r"several columns to the same name \['same'\]"):
        ts.Workflow(["user", "price"] >> Rename(f=lambda n: "same")).fit_schema(schema)


def test_filter_matches_pandas_mask(frame):
    node = ["user", "price", "count"] >> Filter(price_positive)
    wf, out = run(node, frame)
    expected = frame[["user", "price", "count"]][(frame["price"] > 0).fillna(False)].reset_index(drop=True)
    pd.testing.assert_frame_equal(out.reset_index(drop=True), expected, check_dtype=False)
    assert out["count"].dtype == "int64" and 0 < len(out) < len(frame)


def test_filter_rejects_non_boolean_result(frame):
    wf = ts.Workflow(["price"] >> Filter(not_a_mask)).fit(ts.Dataset(frame))
    with pytest.raises(TypeError, match="Filter: f=not_a_mask must return booleans, got double"):
        wf.transform(frame)


def test_dropna_matches_pandas(frame):
    cols = ["user", "price", "count", "tags"]
    _, out = run(cols >> Dropna(), frame)
    expected = frame[cols].dropna().reset_index(drop=True)
    assert out["user"].tolist() == expected["user"].tolist()
    assert out["price"].tolist() == expected["price"].tolist()
    assert out["count"].tolist() == expected["count"].tolist()
    assert pa.array(out["tags"]).to_pylist() == pa.array(expected["tags"]).to_pylist()
    assert [] in pa.array(out["tags"]).to_pylist()  # an empty list is a value


def test_lambda_keeps_nulls_and_dtypes(frame):
    wf, out = run((["user"] >> LambdaOp(first_two)) + (["count"] >> LambdaOp(plus_one)), frame)
    expected_user = [None if pd.isna(v) else v[:2] for v in frame["user"]]
    assert [None if pd.isna(v) else v for v in out["user"]] == expected_user
    expected_count = [None if pd.isna(v) else v + 1 for v in frame["count"]]
    assert [None if pd.isna(v) else v for v in out["count"]] == expected_count
    assert wf.output_schema["count"].dtype == "int64" and out["count"].dtype == "Int64"


def test_lambda_dtype_tags_properties_and_frame_argument(frame):
    node = ["count"] >> LambdaOp(halve, dtype="float32", tags=["continuous"], properties={"unit": "x"})
    node = node + (["price"] >> LambdaOp(minus_mean_of_frame))
    wf, out = run(node, frame)
    np.testing.assert_allclose(out["count"].to_numpy(dtype="float64", na_value=np.nan),
                               frame["count"].astype("float64") / 2)
    assert out["count"].dtype == np.float32
    col = wf.output_schema["count"]
    assert col.dtype == "float32" and ts.Tags.CONTINUOUS in col.tags and col.properties["unit"] == "x"
    # two-argument form: the frame is the partition's selected columns
    ds = ts.Dataset(frame, part_size=96)
    parts = [ds.read_piece(p, ["price"]).column("price").to_numpy() for p in ds.pieces]
    expected = np.concatenate([p - np.nanmean(p) for p in parts])
    np.testing.assert_allclose(out["price"].to_numpy(), expected)


def halve_rows(s):
    return s / 2 if len(s) else s  # the same dtype on no rows, float64 on rows


def test_lambda_dtype_inferred_and_lie_is_caught(frame):
    # dtype=None: the dtype f returns on no rows is the declared one (NVTabular infers it)
    wf = ts.Workflow(["count"] >> LambdaOp(halve)).fit(ts.Dataset(frame))
    assert wf.output_schema["count"].dtype == "float64"
    out = wf.transform(frame)
    np.testing.assert_allclose(out["count"].to_numpy(dtype=float, na_value=np.nan),
                               frame["count"].to_numpy(dtype=float, na_value=np.nan) / 2)
    wf = ts.Workflow(["count"] >> LambdaOp(halve_rows)).fit(ts.Dataset(frame))
    with pytest.raises(SchemaError, match="returned float64 for column 'count'.*declared int64.*dtype='float64'"):
        wf.transform(frame)
    wf = ts.Workflow(["price"] >> LambdaOp(halve, dtype="int64")).fit(ts.Dataset(frame))
    with pytest.raises(DataError, match="for column 'price' that do not convert to int64"):
        wf.transform(frame)


def test_tagging_helpers(frame):
    node = (["user"] >> TagAsUserID()) + (["count"] >> TagAsItemID()) + (
        ["price"] >> TagAsUserFeatures(tags=["continuous"])) + (["tags"] >> TagAsItemFeatures())
    wf, out = run(node, frame)
    tags = {c.name: {t.value for t in c.tags} for c in wf.output_schema}
    assert tags == {
        "user": {"user_id", "user", "id"},
        "count": {"item_id", "item", "id"},
        "price": {"user", "continuous"},
        "tags": {"item"},  # no LIST tag added to a list column (as Merlin infers it)
    }
    assert out["price"].tolist()[:3] == frame["price"].tolist()[:3]
    assert [c.name for c in wf.output_schema.select_by_tag(ts.Tags.USER_ID)] == ["user"]


def test_save_load_round_trip_with_functions(frame, tmp_path):
    node = (["user"] >> LambdaOp(first_two) >> Rename(f=upper_name)) + (
        ["count"] >> LambdaOp(halve, dtype="float64", tags=["continuous"]) >> Rename(postfix="_half"))
    wf, out = run(node, frame)
    wf.save(str(tmp_path / "wf"))
    doc = json.loads((tmp_path / "wf" / "workflow.json").read_text())
    saved = [n["op"]["params"].get("f") for n in doc["nodes"] if n["kind"] == "op"]
    assert f"{__name__}:first_two" in saved and f"{__name__}:upper_name" in saved
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(loaded.transform(frame), wf.transform(frame))
    assert loaded.output_schema == wf.output_schema

    filt = ["user", "price"] >> Filter(price_positive) >> TagAsUserFeatures()
    wf2, _ = run(filt, frame)
    wf2.save(str(tmp_path / "wf2"))
    pd.testing.assert_frame_equal(ts.Workflow.load(str(tmp_path / "wf2")).transform(frame), wf2.transform(frame))


def test_lambda_cannot_be_saved(frame, tmp_path):
    wf, _ = run(["price"] >> LambdaOp(lambda s: s * 2), frame)
    with pytest.raises(FunctionResolutionError,
                       match="LambdaOp: cannot save the function .*<lambda>.*Define it with `def` at the top level"):
        wf.save(str(tmp_path / "wf"))
    assert "<lambda>" in repr(wf)  # repr still works
    # an installed package's function is saved by its public name and loads again
    wf, out = run(["price"] >> LambdaOp(pd.to_numeric), frame)
    wf.save(str(tmp_path / "wf2"))
    doc = json.loads((tmp_path / "wf2" / "workflow.json").read_text())
    assert [n["op"]["params"]["f"] for n in doc["nodes"] if n["kind"] == "op"] == ["pandas:to_numeric"]
    pd.testing.assert_frame_equal(ts.Workflow.load(str(tmp_path / "wf2")).transform(frame), out)
    np.testing.assert_array_equal(out["price"], pd.to_numeric(frame["price"]))


def test_registered_lambda_round_trips(frame, tmp_path, monkeypatch):
    monkeypatch.setattr(functions, "_REGISTRY", {})
    triple = register_function(lambda s: s * 3, name="triple")
    wf, out = run(["price"] >> LambdaOp(triple), frame)
    wf.save(str(tmp_path / "wf"))
    np.testing.assert_allclose(out["price"], frame["price"] * 3)
    monkeypatch.setattr(functions, "_REGISTRY", {})
    with pytest.raises(FunctionResolutionError, match="'triple' is not an importable 'module:function' name"):
        ts.Workflow.load(str(tmp_path / "wf"))
    with provided_functions({"triple": lambda s: s * 3}):
        loaded = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(loaded.transform(frame), wf.transform(frame))


def tamper(tmp_path, frame, name):
    wf, _ = run(["user"] >> LambdaOp(first_two) >> Rename(f=upper_name), frame)
    wf.save(str(tmp_path / "wf"))
    path = tmp_path / "wf" / "workflow.json"
    doc = json.loads(path.read_text())
    for node in doc["nodes"]:
        if node["kind"] == "op" and node["op"]["class"] == "Rename":
            node["op"]["params"]["f"] = name
    path.write_text(json.dumps(doc))
    return str(tmp_path / "wf")


@pytest.mark.parametrize("name,message", [
    ("os:system", "module 'os' may not be used"),
    ("subprocess:getoutput", "module 'subprocess' may not be used"),
    ("builtins:eval", "module 'builtins' may not be used"),
    ("os.not_a_module_xyz:f", "module 'os.not_a_module_xyz' may not be used"),
    ("pandas:read_pickle", "module 'pandas.io.pickle' may not be used"),
    ("pandas:read_hdf", "module 'pandas.io.pytables' may not be used"),
    ("numpy:load", "module 'numpy.lib._npyio_impl' may not be used"),
    ("tabstream.cli:main", "module 'tabstream.cli' is part of tabstream itself"),
    ("json:loads", "module 'json' is part of the standard library"),
    (f"{__name__}:Rename", "does not name a plain Python function"),
    (f"{__name__}:no_such_function", "cannot import the saved function"),
    (f"{__name__}:joined_path", "does not name a plain Python function defined there"),
    (f"{__name__}:upper_name.__globals__", "private or special names"),
    ("__import__('os').system('x')", "not an importable 'module:function' name"),
])
def test_tampered_function_name_is_refused(frame, tmp_path, monkeypatch, name, message):
    calls = []
    monkeypatch.setattr(os, "system", lambda *a: calls.append(a))
    path = tamper(tmp_path, frame, name)
    with pytest.raises(FunctionResolutionError, match=f"Rename: .*{message}"):
        ts.Workflow.load(path)
    assert calls == []


def test_passing_the_function_again_overrides_a_tampered_name(frame, tmp_path):
    path = tamper(tmp_path, frame, "os:system")
    with provided_functions({"os:system": upper_name}):
        loaded = ts.Workflow.load(path)
    assert loaded.output_schema.column_names == ["USER"]
    with pytest.raises(TypeError, match="functions must be a dict"):
        with provided_functions([upper_name]):
            pass


def test_params_round_trip():
    for op in [Rename(f=upper_name), Rename(postfix="_p"), Filter(price_positive), Dropna(),
               LambdaOp(halve, dtype="float32", tags=["continuous"], properties={"a": 1}),
               TagAsUserID(tags=["categorical"]), TagAsItemFeatures()]:
        config = op.to_config()
        assert json.loads(json.dumps(config)) == config
        assert type(op).from_config(config).get_params() == op.get_params()

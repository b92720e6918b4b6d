"""Workflow.load on saved workflows that were damaged or tampered with: every
problem is an error naming workflow.json (or the stats file), the node and the
field, never a raw KeyError/ValueError; no path leaves the workflow folder."""

import json
import os
import re
import uuid

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.core.operators import StatOperator, registered_ops


@pytest.fixture
def frame():
    rng = np.random.default_rng(3)
    n = 400
    return pd.DataFrame({
        "C1": pd.array(np.array(["a", "b", "c", None], dtype=object)[rng.integers(0, 4, n)], dtype="str"),
        "I1": rng.normal(5.0, 2.0, n),
        "I2": np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)),
        "label": rng.integers(0, 2, n),
    })


def build():
    cats = ["C1"] >> ops.Categorify()
    norm = ["I1"] >> ops.Normalize()
    med = ["I2"] >> ops.FillMedian()
    return cats + norm + med + ["label"]


@pytest.fixture
def saved(frame, tmp_path):
    """A really saved workflow folder; returns (folder, fitted workflow)."""
    wf = ts.Workflow(build()).fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    return folder, wf


def doc_of(folder):
    return json.loads((folder / "workflow.json").read_text())


def write_doc(folder, doc):
    (folder / "workflow.json").write_text(json.dumps(doc))


def node_of(doc, cls):
    return next(n for n in doc["nodes"] if n["kind"] == "op" and n["op"]["class"] == cls)


def edit(folder, change):
    """Apply ``change(doc)`` to workflow.json; returns the doc."""
    doc = doc_of(folder)
    change(doc)
    write_doc(folder, doc)
    return doc


def load_fails(folder, error, pattern):
    with pytest.raises(error, match=pattern) as info:
        ts.Workflow.load(str(folder))
    assert "\n" not in str(info.value)
    return info.value


WF = r"workflow\.json: "


# -- the document itself --------------------------------------------------------------------
def test_not_json(saved):
    folder, _ = saved
    text = '{"format": "tabstream.workflow",\n  "version": 1,,}'
    (folder / "workflow.json").write_text(text)
    with pytest.raises(json.JSONDecodeError) as plain:
        json.loads(text)
    load_fails(folder, DataError, WF + f"not valid JSON \\(line {plain.value.lineno}, column {plain.value.colno}: "
               "Expecting property name")


def test_not_text(saved):
    folder, _ = saved
    (folder / "workflow.json").write_bytes(b"\xff\xfe\x00garbage")
    load_fails(folder, DataError, WF + "not a tabstream workflow file \\(not UTF-8")


@pytest.mark.parametrize(("doc", "pattern"), [
    ([1, 2], "a workflow file is a JSON object, found list"),
    ({"format": "something.else", "version": 1}, r"not a tabstream workflow file \(field 'format' is 'something.else', expected 'tabstream.workflow'\)"),
])
def test_wrong_top_level(saved, doc, pattern):
    folder, _ = saved
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + pattern)


@pytest.mark.parametrize(("version", "pattern"), [
    (99, r"unknown workflow format version 99; .* reads versions 1 to 1; it was written by a newer"),
    (0, r"unknown workflow format version 0; .* reads versions 1 to 1$"),
    ("1", r"unknown workflow format version '1'"),
    (True, r"unknown workflow format version True"),
    (None, r"unknown workflow format version None"),
])
def test_unknown_version(saved, version, pattern):
    folder, _ = saved
    edit(folder, lambda d: d.update(version=version))
    load_fails(folder, DataError, WF + pattern)


@pytest.mark.parametrize(("field", "value", "pattern"), [
    ("nodes", {"a": 1}, r"field 'nodes' must be a JSON array, found \{'a': 1\} \(dict\)"),
    ("output", "x", r"field 'output' must be a JSON integer, found 'x' \(str\)"),
    ("input_schema", None, r"field 'input_schema' must be a JSON object"),
])
def test_wrong_field_types(saved, field, value, pattern):
    folder, _ = saved
    edit(folder, lambda d: d.update({field: value}))
    load_fails(folder, DataError, WF + pattern)


def test_missing_field(saved):
    folder, _ = saved
    edit(folder, lambda d: d.pop("nodes"))
    load_fails(folder, DataError, WF + "field 'nodes' is missing")


def test_output_names_no_node(saved):
    folder, _ = saved
    doc = edit(folder, lambda d: d.update(output=12345))
    ids = sorted(n["id"] for n in doc["nodes"])
    load_fails(folder, DataError, WF + re.escape(f"field 'output' names node 12345, which is not among the nodes {ids}"))


def test_input_schema_not_a_schema(saved):
    folder, _ = saved
    edit(folder, lambda d: d.update(input_schema={"cols": []}))
    load_fails(folder, DataError, WF + r"field 'input_schema' is not a schema \(DataError: not a tabstream schema: "
               r"field 'columns' is None")


# -- node entries -----------------------------------------------------------------------------
def test_unknown_kind(saved):
    folder, _ = saved
    doc = edit(folder, lambda d: d["nodes"][0].update(kind="shell"))
    node_id = doc["nodes"][0]["id"]
    load_fails(folder, DataError,
               WF + f"node {node_id}: unknown kind 'shell'; known kinds: " + re.escape("['concat', 'drop', 'op', 'pick', 'select', 'union']"))


def test_unknown_node_field(saved):
    folder, _ = saved
    doc = edit(folder, lambda d: d["nodes"][0].update(command="rm -rf /"))
    load_fails(folder, DataError, WF + f"node {doc['nodes'][0]['id']}: unknown fields \\['command'\\] for a 'select' node")


def test_parent_not_an_earlier_node(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["parents"] = [987654]
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'parents' must list ids of earlier nodes")


def test_selector_not_an_object(saved):
    folder, _ = saved
    doc = edit(folder, lambda d: d["nodes"][0].pop("selector"))
    load_fails(folder, DataError, WF + f"node {doc['nodes'][0]['id']}: field 'selector' must be an object")


def test_unknown_op_lists_registered_ops(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["op"]["class"] = "Eval"
    write_doc(folder, doc)
    err = load_fails(folder, DataError, WF + f"node {entry['id']}: field 'op.class' \\(Eval\\): unknown op 'Eval'")
    for name in registered_ops():
        assert repr(name) in str(err)


def test_unknown_op_parameter(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Categorify")
    entry["op"]["params"]["frequency"] = 3
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'op.params' \\(Categorify\\): "
               r"Categorify: unknown parameters \['frequency'\]; it takes \['freq_threshold'")


def test_missing_required_op_parameter(frame, tmp_path):
    wf = ts.Workflow(["C1", "label"] >> ops.TargetEncoding("label", kfold=1)).fit(ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    doc = doc_of(tmp_path / "wf")
    entry = node_of(doc, "TargetEncoding")
    del entry["op"]["params"]["target"]
    write_doc(tmp_path / "wf", doc)
    load_fails(tmp_path / "wf", DataError,
               f"node {entry['id']}: field 'op.params' \\(TargetEncoding\\): TargetEncoding: missing required "
               r"parameters \['target'\]")


def test_op_parameter_the_constructor_refuses(frame, tmp_path):
    wf = ts.Workflow(["C1"] >> ops.DropLowCardinality(2)).fit(ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    doc = doc_of(tmp_path / "wf")
    entry = node_of(doc, "DropLowCardinality")
    entry["op"]["params"]["min_cardinality"] = -4
    write_doc(tmp_path / "wf", doc)
    load_fails(tmp_path / "wf", DataError, f"node {entry['id']}: field 'op.params' \\(DropLowCardinality\\): "
               "DropLowCardinality: min_cardinality must be an integer >= 1, got -4")


@pytest.mark.parametrize(("field", "value", "pattern"), [
    ("kind", [], "unknown kind \\[\\]"),
    ("kind", {"op": 1}, "unknown kind \\{'op': 1\\}"),
    ("parents", [[0]], "field 'parents' must list ids of earlier nodes"),
    ("parents", [{"a": 1}], "field 'parents' must list ids of earlier nodes"),
])
def test_node_fields_of_unhashable_json_types(saved, field, value, pattern):
    """A list or an object where a kind or a node id goes (they escaped as a raw
    TypeError: unhashable type)."""
    folder, _ = saved
    doc = edit(folder, lambda d: d["nodes"][1].update({field: value}))
    load_fails(folder, DataError, WF + f"node {doc['nodes'][1]['id']}: " + pattern)


@pytest.mark.parametrize(("cls", "param", "value", "pattern"), [
    ("Categorify", "vocabs", "x", "'str' object has no attribute 'items'"),
    ("Categorify", "spill_rows", float("inf"), "cannot convert float infinity to integer"),
    ("Categorify", "single_table", "no", "Categorify: single_table must be True or False, got 'no'"),
    ("TargetEncoding", "drop_folds", [], "TargetEncoding: drop_folds must be True or False, got \\[\\]"),
])
def test_op_parameters_of_the_wrong_json_type(frame, tmp_path, cls, param, value, pattern):
    """Parameters the constructor once took as they came ("no" as True) or failed on
    with a raw AttributeError/OverflowError: a DataError naming the node and field."""
    wf = ts.Workflow((["C1"] >> ops.Categorify()) + (["C1"] >> ops.TargetEncoding("label", kfold=1))).fit(
        ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    doc = doc_of(tmp_path / "wf")
    entry = node_of(doc, cls)
    entry["op"]["params"][param] = value
    write_doc(tmp_path / "wf", doc)
    load_fails(tmp_path / "wf", DataError, f"node {entry['id']}: field 'op.params' \\({cls}\\): .*{pattern}")


@pytest.mark.parametrize(("change", "pattern"), [
    (lambda state: state.update(global_counts={}), "global_counts lacks the targets \\['label'\\]"),
    (lambda state: state["global_counts"].update(label=-5), "global_counts must be at least 1"),
    (lambda state: state.update(global_sums={}), "global_sums lacks the targets \\['label'\\]"),
])
def test_target_encoding_global_statistics_are_checked(frame, tmp_path, change, pattern):
    """An emptied or negative count gave NaN or nonsense encodings, silently."""
    wf = ts.Workflow(["C1"] >> ops.TargetEncoding("label", kfold=1)).fit(ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    doc = doc_of(tmp_path / "wf")
    entry = node_of(doc, "TargetEncoding")
    change(entry["state"])
    write_doc(tmp_path / "wf", doc)
    load_fails(tmp_path / "wf", DataError, f"node {entry['id']}: TargetEncoding: the saved state does not "
               f"restore \\(ValueError: {pattern}")


@pytest.mark.parametrize(("graph", "key"), [
    (lambda: ["C1"] >> ops.JoinGroupby(cont_cols=["I1"], stats=["mean"]), "\\{'C1': 'c'\\}"),
    (lambda: ["C1"] >> ops.TargetEncoding("label", kfold=1), "\\{'C1': 'c', '__fold__': 0\\}"),
])
def test_statistics_listing_a_key_twice_are_refused(frame, tmp_path, graph, key):
    """A JoinGroupby or TargetEncoding stats file whose key repeats (a row's key
    overwritten with another's) loaded, and the key that lost its row came out null."""
    wf = ts.Workflow(graph()).fit(ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    (path,) = (tmp_path / "wf" / "stats").glob("*.parquet")
    table = pq.read_table(path)
    keys = table.column("C1").to_pylist()
    assert sorted(k for k in keys if k is not None) == ["a", "b", "c"]
    keys[keys.index("a")] = "c"
    pq.write_table(table.set_column(0, "C1", pa.array(keys, table.schema.field("C1").type)), path)
    doc = doc_of(tmp_path / "wf")
    entry = next(n for n in doc["nodes"] if n["kind"] == "op")
    entry.pop("table_rows", None)
    write_doc(tmp_path / "wf", doc)
    load_fails(tmp_path / "wf", DataError, f"stats table 'stats.C1' lists the key {key} more than once")


def test_params_not_an_object(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["op"]["params"] = ["x"]
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: .*'params' must be a JSON object of constructor arguments")


# -- fitted state values ---------------------------------------------------------------------
def test_tampered_mean_is_refused(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["state"]["means"]["I1"] = "abc"
    write_doc(folder, doc)
    load_fails(folder, DataError,
               WF + f"node {entry['id']}: Normalize: state field 'means.I1' must be float, found 'abc' \\(str\\)")


def test_hand_edited_integer_mean_is_a_number(saved, frame):
    """A mean edited to a JSON integer is a valid float: it is used as written."""
    folder, _ = saved
    doc = doc_of(folder)
    node_of(doc, "Normalize")["state"]["means"]["I1"] = 4
    write_doc(folder, doc)
    out = ts.Workflow.load(str(folder)).transform(frame)
    x = frame["I1"].to_numpy()
    expected = ((x - 4) / x.std(ddof=1)).astype(np.float32)
    np.testing.assert_allclose(out["I1"].to_numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(("field", "value", "pattern"), [
    ("means", float("nan"), r"state field 'means\.I1' must be finite, found nan"),
    ("means", float("inf"), r"state field 'means\.I1' must be finite, found inf"),
    ("stds", float("nan"), r"state field 'stds\.I1' must be finite and non-negative, found nan"),
    ("stds", float("-inf"), r"state field 'stds\.I1' must be finite and non-negative, found -inf"),
    ("stds", -1.0, r"state field 'stds\.I1' must be finite and non-negative, found -1\.0"),
])
def test_normalize_state_values_out_of_range(saved, field, value, pattern):
    # Before: only the types were checked, so a NaN, infinite or negative std loaded.
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["state"][field]["I1"] = value
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: Normalize: " + pattern)


@pytest.mark.parametrize(("value", "pattern"), [
    ([1.0], r"state field 'medians\.I2' must be float \| null, found \[1\.0\] \(list\)"),
    (True, r"state field 'medians\.I2' must be float \| null, found True \(bool\)"),
])
def test_tampered_median(saved, value, pattern):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "FillMedian")
    entry["state"]["medians"]["I2"] = value
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: FillMedian: " + pattern)


def test_state_not_an_object(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["state"] = "means"
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: Normalize: field 'state' must be a JSON object, found 'means'")


def test_missing_and_unknown_state_fields(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    del entry["state"]["stds"]
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: Normalize: state fields \\['stds'\\] are missing; "
               r"Normalize saves \['means', 'stds'\]")
    entry["state"]["stds"] = {"I1": 1.0}
    entry["state"]["eval"] = "x"
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: Normalize: unknown state fields \\['eval'\\]")


def test_stat_op_without_state(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    del entry["state"]
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: Normalize is a statistics op but field 'state' is missing")


def test_state_that_does_not_restore(frame, tmp_path):
    """A stats table without the columns the op computes from: set_state's own
    error, wrapped with the file and the node."""
    wf = ts.Workflow(["C1", "label"] >> ops.TargetEncoding("label", kfold=1)).fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    entry = node_of(doc_of(folder), "TargetEncoding")
    path = folder / entry["tables"]["stats.C1"]
    pq.write_table(pq.read_table(path).select(["C1"]), path)
    load_fails(folder, DataError, WF + f"node {entry['id']}: TargetEncoding: the saved state does not restore "
               r"\(KeyError")


def test_every_stat_op_declares_its_state():
    undeclared = [name for name, cls in registered_ops().items()
                  if issubclass(cls, StatOperator) and cls.state_types is None]
    assert undeclared == []


# -- stats tables -----------------------------------------------------------------------------
def vocab_file(folder, doc):
    entry = node_of(doc, "Categorify")
    return entry, folder / entry["tables"]["vocab.C1"]


def test_vocabulary_replaced_with_other_columns(saved):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    pq.write_table(pa.table({"word": ["a", "b"], "n": [1, 2]}), path)
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: stats file .*{re.escape(path.name)}: "
               r"stats table 'vocab.C1' has no column 'values' \(it has \['word', 'n'\]\)")


def test_vocabulary_counts_of_the_wrong_type(saved):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    pq.write_table(pa.table({"values": ["a", "b"], "counts": ["many", "few"]}), path)
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: stats file .*{re.escape(path.name)}: "
               "stats table 'vocab.C1' column 'counts' must be integer, found string")


def test_vocabulary_replaced_with_a_valid_one_is_used(saved, frame):
    """A replacement with the declared columns and as many rows is a valid vocabulary:
    ids follow it."""
    folder, _ = saved
    _, path = vocab_file(folder, doc_of(folder))
    assert pq.read_table(path).num_rows == 3
    pq.write_table(pa.table({"values": ["c", "a", "z"], "counts": pa.array([5, 4, 1], pa.int64())}), path)
    out = ts.Workflow.load(str(folder)).transform(frame)
    expected = frame["C1"].map({"c": 3, "a": 4}).where(frame["C1"].notna(), 1).fillna(2)
    np.testing.assert_array_equal(out["C1"].to_numpy(), expected.to_numpy().astype(np.int64))


@pytest.mark.parametrize("extra", [-1, 2])
def test_vocabulary_of_another_size_is_refused(saved, extra):
    # Before: a larger (or smaller) vocabulary loaded silently, and the ids no longer
    # matched the cardinality in the export's _schema.json.
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    saved_rows = pq.read_table(path).num_rows
    values = [f"v{i}" for i in range(saved_rows + extra)]
    pq.write_table(pa.table({"values": values, "counts": pa.array([1] * len(values), pa.int64())}), path)
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: stats file .*{re.escape(path.name)} holds "
               f"{saved_rows + extra} rows, workflow.json recorded {saved_rows} when it was saved")


def test_vocabulary_with_a_value_twice_is_refused(saved):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    table = pq.read_table(path)
    values = table.column("values").to_pylist()
    values[-1] = values[0]  # as many rows as saved, one value twice
    pq.write_table(table.set_column(0, "values", pa.array(values, table.schema.field("values").type)), path)
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: stats file .*{re.escape(path.name)}: "
               rf"stats table 'vocab.C1' column 'values' lists {values[0]!r} more than once "
               rf"\({len(values)} rows, {len(values) - 1} distinct values\)")


def test_table_rows_field_is_checked(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Categorify")
    entry["table_rows"] = {"vocab.C1": "three"}
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: Categorify: field 'table_rows' must map each of "
               r"the tables \['vocab.C1'\] to its row count, found \{'vocab.C1': 'three'\}")


def test_truncated_stats_file(saved):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: field 'tables.vocab.C1': stats file "
               f".*{re.escape(path.name)} is not a readable parquet file")


def test_missing_stats_file(saved):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    path.unlink()
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: field 'tables.vocab.C1': stats file "
               f".*{re.escape(path.name)} is missing")


def test_table_entry_missing_or_extra(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Categorify")
    rel = entry["tables"].pop("vocab.C1")
    write_doc(folder, doc)
    load_fails(folder, DataError, f"node {entry['id']}: Categorify: field 'tables' must name the stats tables "
               r"\['vocab.C1'\]; missing \['vocab.C1'\]")
    entry["tables"] = {"vocab.C1": rel, "vocab.C9": rel}
    write_doc(folder, doc)
    load_fails(folder, DataError, r"unexpected \['vocab.C9'\]")


# -- confinement ------------------------------------------------------------------------------
def point_vocab_at(folder, rel):
    doc = doc_of(folder)
    entry = node_of(doc, "Categorify")
    entry["tables"]["vocab.C1"] = rel
    write_doc(folder, doc)
    return entry


def test_dotdot_path_is_refused(saved, tmp_path):
    folder, _ = saved
    outside = tmp_path / "outside.parquet"
    pq.write_table(pq.read_table(vocab_file(folder, doc_of(folder))[1]), outside)
    entry = point_vocab_at(folder, "stats/../../outside.parquet")
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'tables.vocab.C1': path "
               r"'stats/\.\./\.\./outside\.parquet' leaves the workflow folder")


@pytest.mark.parametrize("rel", ["/etc/passwd", "~/x.parquet", "file:///etc/passwd", "C:/x.parquet", "",
                                 "\\\\server\\share\\x.parquet", "stats/x\x00.parquet"])
def test_absolute_paths_are_refused(saved, rel):
    folder, _ = saved
    entry = point_vocab_at(folder, rel)
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'tables.vocab.C1': path {re.escape(repr(rel))} "
               "is not a path relative to the workflow folder")


def test_folder_itself_is_refused(saved):
    folder, _ = saved
    entry = point_vocab_at(folder, "stats/..")
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'tables.vocab.C1': path 'stats/\\.\\.' names "
               "the workflow folder itself, not a file in it")


def test_symlink_out_is_refused(saved, tmp_path):
    folder, _ = saved
    entry, path = vocab_file(folder, doc_of(folder))
    outside = tmp_path / "elsewhere.parquet"
    path.rename(outside)
    os.symlink(outside, path)
    load_fails(folder, DataError, WF + f"node {entry['id']}: field 'tables.vocab.C1': path '.*' leaves the "
               f"workflow folder \\(it resolves to .*{re.escape(outside.name)}\\)")


def test_symlinked_folder_and_links_inside_are_fine(saved, frame, tmp_path):
    """Links that stay inside the folder, and a link to the folder itself, load."""
    folder, wf = saved
    entry, path = vocab_file(folder, doc_of(folder))
    os.rename(path, folder / "stats" / "real.parquet")
    os.symlink("real.parquet", path)
    os.symlink(folder, tmp_path / "link_to_wf")
    again = ts.Workflow.load(str(tmp_path / "link_to_wf"))
    pd.testing.assert_frame_equal(again.transform(frame), wf.transform(frame))


def test_confined_on_a_remote_filesystem(frame):
    """The same rules on an fsspec filesystem other than the local one."""
    wf = ts.Workflow(build()).fit(ts.Dataset(frame))
    root = f"memory://wf-{uuid.uuid4().hex}"
    wf.save(root)
    again = ts.Workflow.load(root)
    pd.testing.assert_frame_equal(again.transform(frame), wf.transform(frame))
    import fsspec

    fs = fsspec.filesystem("memory")
    path = root.removeprefix("memory://") + "/workflow.json"
    doc = json.loads(fs.cat(path))
    entry = node_of(doc, "Categorify")
    entry["tables"]["vocab.C1"] = "../other/vocab.parquet"
    fs.pipe(path, json.dumps(doc).encode())
    with pytest.raises(DataError, match=f"node {entry['id']}: field 'tables.vocab.C1': path "
                       "'../other/vocab.parquet' leaves the workflow folder"):
        ts.Workflow.load(root)
    fs.rm(root.removeprefix("memory://"), recursive=True)


# -- state that type-checks but does not fit the graph ---------------------------------------------
def test_mean_for_another_column(saved):
    folder, _ = saved
    doc = doc_of(folder)
    entry = node_of(doc, "Normalize")
    entry["state"]["means"] = {"I9": 1.0}
    write_doc(folder, doc)
    load_fails(folder, DataError, WF + f"node {entry['id']}: Normalize: the saved state does not fit the columns "
               r"\['I1'\] it is applied to \(KeyError: 'I1'\)")


def test_groupby_stats_without_an_output_column(frame, tmp_path):
    node = ["C1", "I1"] >> ops.JoinGroupby(cont_cols=["I1"], stats=["count", "mean"])
    wf = ts.Workflow(node).fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    entry = node_of(doc_of(folder), "JoinGroupby")
    (name, rel), = entry["tables"].items()
    table = pq.read_table(folder / rel)
    kept = [c for c in table.column_names if not c.endswith("_mean")]
    assert len(kept) == table.num_columns - 1
    pq.write_table(table.select(kept), folder / rel)
    load_fails(folder, DataError, WF + f"node {entry['id']}: JoinGroupby: the saved state does not fit the columns "
               r"\['C1', 'I1'\] it is applied to \(KeyError")


def negate(s):
    return -s


def test_op_errors_of_its_own_gain_file_and_node(frame, tmp_path):
    """An op's own project error (here: a saved function name that does not resolve)
    keeps its type and gains the file and node."""
    from tabstream.ops.structural import FunctionResolutionError

    wf = ts.Workflow(["I1"] >> ops.LambdaOp(negate)).fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    doc = doc_of(folder)
    entry = node_of(doc, "LambdaOp")
    entry["op"]["params"]["f"] = "tabstream_no_such_module:f"
    write_doc(folder, doc)
    load_fails(folder, FunctionResolutionError, WF + f"node {entry['id']}: LambdaOp: .*tabstream_no_such_module")


def test_duplicate_keys_are_refused(saved):
    """JSON readers keep the last of two equal keys; a tampered file could hide a
    second value behind the first, so a repeated key is an error."""
    folder, _ = saved
    text = (folder / "workflow.json").read_text()
    (folder / "workflow.json").write_text(text.replace('"version": 1,', '"version": 1, "version": 1,', 1))
    load_fails(folder, DataError, WF + "key 'version' appears twice in one JSON object")


def test_path_to_the_json_file_instead_of_the_folder(saved):
    folder, _ = saved
    with pytest.raises(FileNotFoundError, match=r"a saved workflow is a folder holding workflow\.json; pass the "
                       "folder, not a file in it"):
        ts.Workflow.load(str(folder / "workflow.json"))


def test_workflow_json_is_a_folder(tmp_path):
    (tmp_path / "wf" / "workflow.json").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no saved workflow at .*wf'"):
        ts.Workflow.load(str(tmp_path / "wf"))

import json
import os
import socket

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import SchemaError


def recipe():
    cats = ["C1", "C2"] >> ops.Categorify(freq_threshold=3)
    conts = ["I1", "I2"] >> ops.FillMissing(0) >> ops.Clip(min_value=0) >> ops.LogOp() >> ops.Normalize()
    return cats + conts + (["label"] >> ops.AddTags(["target", "binary_classification"]))


def test_output_schema_before_reading_data(small_raw, monkeypatch):
    ds = ts.Dataset(small_raw)
    monkeypatch.setattr(ts.Dataset, "read_piece", lambda *a, **k: pytest.fail("data was read"))
    wf = ts.Workflow(recipe()).fit_schema(ds.schema)
    schema = wf.output_schema
    assert schema.column_names == ["C1", "C2", "I1", "I2", "label"]
    assert [schema[c].dtype for c in schema.column_names] == ["int64", "int64", "float32", "float32", "int64"]
    assert ts.Tags.TARGET in schema["label"].tags and ts.Tags.CONTINUOUS in schema["I1"].tags


def test_missing_column_names_it_and_lists_available(small_raw):
    wf = ts.Workflow(["C1", "nope"] >> ops.Categorify())
    with pytest.raises(SchemaError, match=r"\['nope'\] do not exist; available columns: \['label', 'I1'"):
        wf.fit(ts.Dataset(small_raw))


def test_graph_operators_plus_minus_and_tags(small_raw):
    node = (["C1", "C2"] >> ops.Categorify()) + ["I2", "label"] - ["C2"]
    wf = ts.Workflow(node)
    out = wf.fit(ts.Dataset(small_raw)).transform(small_raw)
    assert list(out.columns) == ["C1", "I2", "label"]
    by_tag = ts.ColumnSelector(tags=[ts.Tags.CATEGORICAL]) >> ops.AddTags(["user"])
    wf2 = ts.Workflow(by_tag + ["label"])
    out2 = wf2.fit(ts.Dataset(out, schema=wf.output_schema)).transform(out)
    assert list(out2.columns) == ["C1", "label"]
    assert ts.Tags.USER in wf2.output_schema["C1"].tags


def test_duplicate_output_column_is_an_error(small_raw):
    node = (["I2"] >> ops.LogOp()) + (["I2"] >> ops.Normalize())
    with pytest.raises(SchemaError, match="'I2' is produced twice"):
        ts.Workflow(node).fit_schema(ts.Dataset(small_raw).schema)


def test_op_class_instead_of_instance():
    # NVTabular's `cols >> Op`: the class with default parameters; one needing parameters is refused
    node = ["a"] >> ops.Categorify
    assert isinstance(node.op, ops.Categorify) and node.op.get_params() == ops.Categorify().get_params()
    with pytest.raises(TypeError, match=r"Bucketize is a class and it needs \['boundaries'\]; apply an instance"):
        ["a"] >> ops.Bucketize


@pytest.mark.parametrize("part_size", [None, 1500, 20_000])
def test_statistics_equal_on_one_and_many_partitions(small_raw, part_size):
    whole = ts.Workflow(recipe()).fit(ts.Dataset(small_raw))
    parts = ts.Workflow(recipe()).fit(ts.Dataset(small_raw, part_size=part_size))
    pd.testing.assert_frame_equal(whole.transform(small_raw), parts.transform(small_raw))


def test_lazy_transform_equals_eager(small_raw):
    wf = ts.Workflow(recipe()).fit(ts.Dataset(small_raw))
    lazy = wf.transform(ts.Dataset(small_raw, part_size=3000))
    assert lazy.npartitions > 1
    pd.testing.assert_frame_equal(lazy.compute(), wf.transform(small_raw))
    pd.testing.assert_frame_equal(lazy.to_ddf().compute().reset_index(drop=True), wf.transform(small_raw))


def test_save_load_identical_output_and_no_pickle(small_raw, tmp_path):
    wf = ts.Workflow(recipe()).fit(ts.Dataset(small_raw))
    wf.save(str(tmp_path / "wf"))
    files = sorted(p.name for p in (tmp_path / "wf").rglob("*") if p.is_file())
    assert all(f.endswith((".json", ".parquet")) for f in files), files
    doc = json.loads((tmp_path / "wf" / "workflow.json").read_text())
    assert doc["format"] == "tabstream.workflow"
    again = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(again.transform(small_raw), wf.transform(small_raw))
    assert again.output_schema == wf.output_schema


def test_load_rejects_unknown_op(small_raw, tmp_path):
    wf = ts.Workflow(["C1"] >> ops.Categorify()).fit(ts.Dataset(small_raw))
    wf.save(str(tmp_path / "wf"))
    doc_path = tmp_path / "wf" / "workflow.json"
    doc = json.loads(doc_path.read_text())
    for node in doc["nodes"]:
        if node["kind"] == "op":
            node["op"]["class"] = "os.system"
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="unknown op 'os.system'"):
        ts.Workflow.load(str(tmp_path / "wf"))


def test_load_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no saved workflow"):
        ts.Workflow.load(str(tmp_path / "nothing"))


def test_fit_on_distributed_client(small_raw, dask_client, dask_dashboard_port_taken):
    """Runs while dask's default dashboard port 8787 is taken (tests/conftest.py):
    the cluster asks the OS for free ports and never falls back with a warning."""
    port = dask_dashboard_port_taken
    with socket.socket() as holder, socket.socket() as probe:
        try:  # free again (another test session held it when ours started): hold it here
            holder.bind(("127.0.0.1", port))
            holder.listen(1)
        except OSError:
            pass  # held by the session fixture, or by another process
        with pytest.raises(OSError):
            probe.bind(("127.0.0.1", port))
        dashboard_port = dask_client.scheduler_info()["services"]["dashboard"]
        assert dashboard_port not in (0, port)
        wf = ts.Workflow(recipe(), client=dask_client).fit(ts.Dataset(small_raw, part_size=3000))
    local = ts.Workflow(recipe()).fit(ts.Dataset(small_raw))
    pd.testing.assert_frame_equal(wf.transform(small_raw), local.transform(small_raw))


def test_fit_memory_is_bounded_by_partitions(small_raw, monkeypatch):
    """Fitting reads one partition per task and never the whole table."""
    ds = ts.Dataset(small_raw, part_size=3000)
    seen = []
    original = ts.Dataset.read_piece

    def spy(self, piece, columns=None, *args, **kwargs):
        table = original(self, piece, columns, *args, **kwargs)
        seen.append(table.num_rows)
        return table

    monkeypatch.setattr(ts.Dataset, "read_piece", spy)
    ts.Workflow(recipe()).fit(ds)
    assert len(seen) == ds.npartitions and max(seen) < len(small_raw)
    assert sum(seen) == len(small_raw)


def test_two_level_fit(small_raw):
    """A statistics op downstream of another one is fitted after it."""
    node = ["I2"] >> ops.Normalize() >> ops.Clip(min_value=0) >> ops.Normalize()
    out = ts.Workflow(node).fit(ts.Dataset(small_raw, part_size=3000)).transform(small_raw)
    x = small_raw["I2"].to_numpy()
    z = np.maximum((x - x.mean()) / x.std(ddof=1), 0).astype(np.float32).astype(np.float64)
    np.testing.assert_allclose(out["I2"].to_numpy(), (z - z.mean()) / z.std(ddof=1), rtol=1e-4, atol=1e-5)


def test_save_keeps_tables_whose_names_differ_only_in_odd_characters(tmp_path):
    """Columns 'a b' and 'a_b' both make a file-name-safe 'a_b': each vocabulary keeps its own file."""
    frame = pd.DataFrame({"a b": ["x", "x", "y"], "a_b": ["p", "q", "q"]})
    wf = ts.Workflow(["a b", "a_b"] >> ops.Categorify()).fit(ts.Dataset(frame))
    wf.save(str(tmp_path / "wf"))
    tables = [t for n in json.loads((tmp_path / "wf" / "workflow.json").read_text())["nodes"]
              for t in n.get("tables", {}).values()]
    assert len(set(tables)) == 2
    out = ts.Workflow.load(str(tmp_path / "wf")).transform(frame)
    # ids by descending frequency, ties by value, after 0 pad, 1 null, 2 OOV
    assert out["a b"].tolist() == [3, 3, 4]
    assert out["a_b"].tolist() == [4, 3, 3]


def test_save_over_an_earlier_save(small_raw, tmp_path):
    """Saving into a folder that holds another workflow replaces it: the stats files of
    the earlier save are removed, and the folder loads as the new workflow."""
    first = ts.Workflow(["C1", "C2"] >> ops.Categorify()).fit(ts.Dataset(small_raw))
    first.save(str(tmp_path / "wf"))
    second = ts.Workflow(["I2"] >> ops.Normalize()).fit(ts.Dataset(small_raw))
    second.save(str(tmp_path / "wf"))
    assert list((tmp_path / "wf" / "stats").iterdir()) == []  # Normalize's state is all JSON
    out = ts.Workflow.load(str(tmp_path / "wf")).transform(small_raw)
    x = small_raw["I2"].to_numpy()
    np.testing.assert_allclose(out["I2"].to_numpy(), (x - x.mean()) / x.std(ddof=1), rtol=1e-5)


def test_interrupted_save_keeps_the_previous_save(small_raw, tmp_path, monkeypatch):
    """A save that fails half way never leaves a workflow.json beside a mix of stats
    files: the previous save stays in place, whole, and no temporary folder is left."""
    import tabstream.pipeline.workflow as workflow_module

    first = ts.Workflow(["C1"] >> ops.Categorify()).fit(ts.Dataset(small_raw))
    first.save(str(tmp_path / "wf"))
    calls = []

    def failing_write(table, where, **kwargs):
        calls.append(table)
        raise OSError("disk full")

    monkeypatch.setattr(workflow_module.pq, "write_table", failing_write)
    with pytest.raises(OSError, match="disk full"):
        ts.Workflow(["C2"] >> ops.Categorify()).fit(ts.Dataset(small_raw)).save(str(tmp_path / "wf"))
    assert len(calls) == 1
    monkeypatch.undo()
    pd.testing.assert_frame_equal(ts.Workflow.load(str(tmp_path / "wf")).transform(small_raw),
                                  first.transform(small_raw))
    assert sorted(os.listdir(tmp_path)) == ["wf"]


def test_save_of_a_value_json_cannot_hold_leaves_the_folder_alone(small_raw, tmp_path):
    good = ts.Workflow(["I2"] >> ops.Normalize()).fit(ts.Dataset(small_raw))
    good.save(str(tmp_path / "wf"))
    bad = ts.Workflow(["I2"] >> ops.AddMetadata(properties={"when": pd.Timestamp("2024-01-01")}))
    bad.fit(ts.Dataset(small_raw))
    with pytest.raises(TypeError, match="cannot save the workflow to .*: a parameter or state value is not JSON"):
        bad.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(again.transform(small_raw), good.transform(small_raw))

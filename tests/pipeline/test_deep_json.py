"""JSON nested deeply in a user's folder is a DataError naming the file, never a
RecursionError (issue 27, item 3): one reader, tabstream.core.jsonfile, at every
place tabstream reads JSON from a folder."""

from __future__ import annotations

import json
import os

import fsspec
import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.core.jsonfile import MAX_DEPTH, json_depth, loads_json
from tabstream.core.merlin import read_merlin_schema

DEEP = 100_000


def nested(depth: int, inner: str = "1") -> str:
    return '{"a": ' * depth + inner + "}" * depth


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 900, DEEP])
def test_too_deep_names_the_file(depth):
    with pytest.raises(DataError, match=f"^x/y.json: JSON nested {depth} levels deep; no saved workflow "
                                        f"is nested more than {MAX_DEPTH} levels"):
        loads_json(nested(depth), "x/y.json", "saved workflow")


def test_depth_counts_brackets_outside_strings_only():
    def walk(value):  # depth of the parsed value, computed the plain way
        if isinstance(value, dict):
            return 1 + max((walk(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((walk(v) for v in value), default=0)
        return 0

    docs = [
        {"a": "[[[[{{{", "b": [[1, {"c": "]]]}"}]], "é": 'x\\"[', "d": []},
        [[[[]]], {"k": "\\\\"}, "\u2603["],
        {"s": "}" * 300, "t": [[[[[[["x"]]]]]]]},
        {},
    ]
    for doc in docs:
        text = json.dumps(doc, ensure_ascii=False)
        assert json_depth(text) == walk(doc)
        assert loads_json(text, "f.json", "test file") == doc
    # exactly MAX_DEPTH is read, with brackets inside strings not counted
    assert loads_json(nested(MAX_DEPTH, '"[[[[[["'), "f.json", "x")["a"]["a"]["a"] is not None


def test_not_utf8_names_the_file():
    with pytest.raises(DataError, match=r"^f.json: not a schema file \(not UTF-8 text"):
        loads_json(b'{"a": "\xff"}', "f.json", "schema file")


def _export(tmp_path):
    frame = pd.DataFrame({"a": np.arange(20, dtype="int64"), "b": np.linspace(0, 1, 20)})
    out = tmp_path / "out"
    ts.Dataset(frame).to_parquet(str(out))
    return frame, out


def test_deep_manifest_is_a_data_error(tmp_path):
    _, out = _export(tmp_path)
    (out / "_manifest.json").write_text('{"files": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(DataError, match=f"{out}/_manifest.json: JSON nested {DEEP + 1} levels deep; "
                                        "no export manifest"):
        _ = ts.Dataset(str(out)).num_rows


def test_deep_schema_json_is_a_data_error(tmp_path):
    frame, out = _export(tmp_path)
    doc = json.loads((out / "_schema.json").read_text())
    doc["columns"][0]["properties"]["x"] = json.loads(nested(MAX_DEPTH + 5))
    (out / "_schema.json").write_text(json.dumps(doc))
    with pytest.raises(DataError, match=f"{out}/_schema.json: JSON nested {MAX_DEPTH + 9} levels deep; no schema file"):
        _ = ts.Dataset(str(out)).schema
    doc["columns"][0]["properties"]["x"] = {"a": {"b": [1]}}  # shallow: read as before
    (out / "_schema.json").write_text(json.dumps(doc))
    assert ts.Dataset(str(out)).schema["a"].properties["x"] == {"a": {"b": [1]}}
    got = ts.Dataset(str(out)).to_ddf().compute().reset_index(drop=True)
    pd.testing.assert_frame_equal(got, frame, check_dtype=False)


def test_deep_workflow_json_is_a_data_error(tmp_path):
    frame = pd.DataFrame({"c": ["x", "y", "x"], "v": [1.0, 2.0, 3.0]})
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["v"] >> ops.Normalize())).fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    path = folder / "workflow.json"
    doc = json.loads(path.read_text())
    doc["nodes"][0]["selector"]["names"] = json.loads("[" * 500 + "]" * 500)
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=f"{path}: JSON nested 50[0-9] levels deep; no saved workflow") as info:
        ts.Workflow.load(str(folder))
    assert "save it again" in info.value.hint
    path.write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(DataError, match=f"{path}: JSON nested {DEEP} levels deep"):
        ts.Workflow.load(str(folder))


def test_deep_merlin_schema_and_schema_from_json(tmp_path):
    _, out = _export(tmp_path)
    os.remove(out / "_schema.json")
    (out / ".merlin").mkdir()
    (out / ".merlin" / "schema.json").write_text('{"feature": ' + "[" * DEEP + "]" * DEEP + "}")
    with pytest.raises(DataError, match=r"\.merlin/schema\.json: JSON nested 100001 levels deep; no Merlin schema"):
        read_merlin_schema(fsspec.filesystem("file"), [str(out / "part_00000.parquet")])
    with pytest.raises(DataError, match="JSON nested 100000 levels deep; no schema is nested"):
        ts.Schema.from_json(nested(DEEP))


def test_deep_parameter_server_file_is_a_data_error(tmp_path):
    from tabstream.train.cache_store import ParameterServer
    from tabstream.train.tables import TableConfig

    ps = ParameterServer(str(tmp_path / "ps"), [TableConfig("t", 10, 4, ("t",), False, "sum")], storage="disk")
    ps.flush()
    del ps
    meta = [p for p in (tmp_path / "ps").iterdir() if p.suffix == ".json"]
    assert len(meta) == 1
    meta[0].write_text("[" * DEEP + "]" * DEEP)
    with pytest.raises(DataError, match=f"{meta[0]}: JSON nested {DEEP} levels deep; no parameter server file"):
        ParameterServer.open(str(tmp_path / "ps"))

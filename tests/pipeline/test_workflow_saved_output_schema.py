"""A saved workflow whose stored output schema differs from what its graph gives
today (the embedding-size rule changed before the first release: workflows saved
then stored dimension 8 where today's rule gives 16) loads with a WorkflowWarning
naming each changed column and both values; an unchanged one loads silently."""

from __future__ import annotations

import json
import warnings

import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import WorkflowWarning


def _saved(tmp_path):
    frame = pd.DataFrame({"s": list("abcabcaab"), "i": [1, 2, 3, 1, 2, 3, 4, 5, 6],
                          "x": [0.5, 1.5, 2.0, 3.0, 1.0, 0.0, 2.5, 4.0, 1.0]})
    wf = ts.Workflow((["s", "i"] >> ops.Categorify()) + (["x"] >> ops.Normalize()))
    wf.fit(ts.Dataset(frame))
    folder = tmp_path / "wf"
    wf.save(str(folder))
    return folder, wf


def test_an_unchanged_workflow_loads_without_a_warning(tmp_path):
    folder, wf = _saved(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", WorkflowWarning)
        loaded = ts.Workflow.load(str(folder))
    assert loaded.output_schema.to_dict() == wf.output_schema.to_dict()


def test_other_saved_embedding_sizes_and_dtypes_are_named(tmp_path):
    folder, wf = _saved(tmp_path)
    doc = json.loads((folder / "workflow.json").read_text())
    columns = {c["name"]: c for c in doc["output_schema"]["columns"]}
    today = {name: c.properties["embedding_sizes"] for name, c in
             ((c.name, c) for c in wf.output_schema) if "embedding_sizes" in c.properties}
    assert set(today) == {"s", "i"}
    old = {**today["s"], "dimension": today["s"]["dimension"] // 2}  # an older rule's size
    columns["s"]["properties"]["embedding_sizes"] = old
    columns["x"]["dtype"] = "float16"
    (folder / "workflow.json").write_text(json.dumps(doc))
    with pytest.warns(WorkflowWarning) as caught:
        loaded = ts.Workflow.load(str(folder))
    message = str(caught[0].message)
    assert f"s: embedding_sizes {old} saved, {today['s']} now" in message
    assert f"x: dtype float16 saved, {wf.output_schema['x'].dtype} now" in message
    assert "i:" not in message  # unchanged columns are not named
    assert str(folder / "workflow.json") in message
    # the graph's own schema stands: today's sizes, as the op computes them
    assert loaded.output_schema["s"].properties["embedding_sizes"] == today["s"]

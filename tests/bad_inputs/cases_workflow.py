"""Saved workflows that were damaged or tampered with, and workflow files a user
gets wrong: through the API and through ``tabstream transform`` / ``fit``."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError


def _raw(tmp):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({
        "C1": pd.array(np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, 200)], dtype="str"),
        "I1": rng.normal(size=200),
    })
    path = tmp / "raw.parquet"
    frame.to_parquet(path, index=False)
    return frame, path


def _saved(tmp):
    """Fit and save a small workflow; returns (folder, raw parquet path, doc)."""
    frame, raw = _raw(tmp)
    wf = ts.Workflow((["C1"] >> ops.Categorify()) + (["I1"] >> ops.Normalize()))
    wf.fit(ts.Dataset(frame)).save(str(tmp / "wf"))
    return tmp / "wf", raw, json.loads((tmp / "wf" / "workflow.json").read_text())


def _op(doc, cls):
    return next(n for n in doc["nodes"] if n["kind"] == "op" and n["op"]["class"] == cls)


def _write(folder, doc):
    (folder / "workflow.json").write_text(json.dumps(doc))


def _tampered_mean(tmp):
    folder, _, doc = _saved(tmp)
    _op(doc, "Normalize")["state"]["means"]["I1"] = "abc"
    _write(folder, doc)
    ts.Workflow.load(str(folder))


def _unknown_kind(tmp):
    folder, _, doc = _saved(tmp)
    doc["nodes"][0]["kind"] = "python"
    _write(folder, doc)
    ts.Workflow.load(str(folder))


def _dotdot_stats_path(tmp):
    folder, _, doc = _saved(tmp)
    _op(doc, "Categorify")["tables"]["vocab.C1"] = "../../etc/vocab.parquet"
    _write(folder, doc)
    ts.Workflow.load(str(folder))


def _symlinked_vocab(tmp):
    folder, _, doc = _saved(tmp)
    path = folder / _op(doc, "Categorify")["tables"]["vocab.C1"]
    path.rename(tmp / "outside.parquet")
    os.symlink(tmp / "outside.parquet", path)
    ts.Workflow.load(str(folder))


def _future_version(tmp):
    folder, _, doc = _saved(tmp)
    doc["version"] = 7
    _write(folder, doc)
    ts.Workflow.load(str(folder))


def _unknown_param(tmp):
    folder, _, doc = _saved(tmp)
    _op(doc, "Categorify")["op"]["params"]["threshold"] = 3
    _write(folder, doc)
    ts.Workflow.load(str(folder))


def _vocab_with_other_columns(tmp):
    folder, _, doc = _saved(tmp)
    pq.write_table(pa.table({"v": [1.5]}), folder / _op(doc, "Categorify")["tables"]["vocab.C1"])
    ts.Workflow.load(str(folder))


def _cli_transform_tampered(tmp):
    folder, raw, doc = _saved(tmp)
    _op(doc, "Normalize")["state"]["stds"]["I1"] = None
    _write(folder, doc)
    cli("transform", folder, raw, tmp / "out", "--quiet")


def _cli_transform_not_json(tmp):
    folder, raw, _ = _saved(tmp)
    (folder / "workflow.json").write_text("version: 1\n")
    cli("transform", folder, raw, tmp / "out", "--quiet")


def _cli_transform_good_after_save(tmp):
    """The untampered folder transforms as the in-memory workflow does."""
    folder, raw, _ = _saved(tmp)
    cli("transform", folder, raw, tmp / "out", "--quiet")
    parts = sorted((tmp / "out").glob("*.parquet"))
    got = pd.concat([pd.read_parquet(p) for p in parts]).sort_values("I1", ignore_index=True)
    frame = pd.read_parquet(raw)
    x = frame["I1"].to_numpy()
    expected = np.sort(((x - x.mean()) / x.std(ddof=1)).astype(np.float32))
    np.testing.assert_allclose(got["I1"].to_numpy(), expected, rtol=1e-5, atol=1e-6)
    assert sorted(got["C1"].unique()) == [3, 4, 5]  # three values, ids after padding/null/OOV


def _cli_workflow_file_is_a_folder(tmp):
    folder, raw, _ = _saved(tmp)
    cli("fit", raw, "--workflow-file", folder, "--quiet")


def _cli_workflow_file_not_a_workflow(tmp):
    _, raw = _raw(tmp)
    (tmp / "wf.py").write_text("workflow = ['C1']\n")
    cli("fit", raw, "--workflow-file", tmp / "wf.py", "--quiet")


def _cli_workflow_file_missing(tmp):
    _, raw = _raw(tmp)
    cli("fit", raw, "--workflow-file", tmp / "nope.py", "--quiet")


def _cli_workflow_file_bad_kwargs(tmp):
    _, raw = _raw(tmp)
    (tmp / "wf.py").write_text("import tabstream as ts\nfrom tabstream import ops\n"
                               "workflow = ts.Workflow(['I1'] >> ops.Normalize())\ndataset_kwargs = ['csv']\n")
    cli("fit", raw, "--workflow-file", tmp / "wf.py", "--quiet")


WF = r"workflow\.json: node \d+: "
CASES = [
    ("tampered mean", _tampered_mean, DataError,
     WF + r"Normalize: state field 'means\.I1' must be float, found 'abc' \(str\)"),
    ("unknown node kind", _unknown_kind, DataError, WF + r"unknown kind 'python'; known kinds: \['concat'"),
    ("stats path with ..", _dotdot_stats_path, DataError,
     WF + r"field 'tables\.vocab\.C1': path '\.\./\.\./etc/vocab\.parquet' leaves the workflow folder"),
    ("stats file symlinked out", _symlinked_vocab, DataError,
     WF + r"field 'tables\.vocab\.C1': path .* leaves the workflow folder \(it resolves to .*outside\.parquet\)"),
    ("format version from the future", _future_version, DataError,
     r"workflow\.json: unknown workflow format version 7; .*upgrade to load it"),
    ("unknown op parameter", _unknown_param, DataError,
     WF + r"field 'op\.params' \(Categorify\): Categorify: unknown parameters \['threshold'\]"),
    ("vocabulary with other columns", _vocab_with_other_columns, DataError,
     WF + r"Categorify: stats file .*vocab\.C1\.parquet: stats table 'vocab\.C1' has no column 'values'"),
    ("cli transform, tampered state", _cli_transform_tampered, CliFailed,
     r"^tabstream transform: DataError: .*workflow\.json: node \d+: Normalize: state field 'stds\.I1' "
     r"must be float, found None \(NoneType\)\n  hint: the saved workflow was edited or damaged"),
    ("cli transform, workflow.json not JSON", _cli_transform_not_json, CliFailed,
     r"^tabstream transform: DataError: .*workflow\.json: not valid JSON \(line 1, column 1"),
    ("cli transform, untampered folder", _cli_transform_good_after_save, None, None),
    ("cli fit, --workflow-file is a folder", _cli_workflow_file_is_a_folder, CliFailed,
     r"ValueError: workflow file '.*wf' is a folder; .*tabstream transform"),
    ("cli fit, workflow is not a Workflow", _cli_workflow_file_not_a_workflow, CliFailed,
     r"TypeError: .*wf\.py: `workflow` must be a tabstream\.Workflow, got list"),
    ("cli fit, workflow file missing", _cli_workflow_file_missing, CliFailed,
     r"FileNotFoundError: workflow file '.*nope\.py' does not exist"),
    ("cli fit, dataset_kwargs not a dict", _cli_workflow_file_bad_kwargs, CliFailed,
     r"TypeError: .*wf\.py: `dataset_kwargs` must be a dict of Dataset arguments, got list"),
]

"""Workflows and requests the in-graph serving export cannot take (tabstream.serving):
each refusal names the op or column, says why, and points at the fix."""

from __future__ import annotations

import numpy as np
import pandas as pd

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import ExportError, SchemaError
from tabstream.serving import build_plan, raw_arrays


def _frame():
    return pd.DataFrame({"c": ["a", "b", "a"], "x": [1.0, np.nan, 2.0], "y": [1, 0, 1]})


def _plan(node_fn):
    def run(tmp):
        build_plan(ts.Workflow(node_fn()).fit(ts.Dataset(_frame())))
    return run


def _missing_request_column(tmp):
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.Normalize())).fit(ts.Dataset(_frame()))
    raw_arrays(pd.DataFrame({"c": ["a"]}), build_plan(wf).inputs, "torch")


def _served_without_label(tmp):
    # not an error: remove_inputs serves requests without the label, ids as the full workflow's
    wf = ts.Workflow((["c"] >> ops.Categorify()) + ["y"]).fit(ts.Dataset(_frame()))
    served = wf.remove_inputs(["y"])
    got = served.transform(pd.DataFrame({"c": ["b", "z", None]}))
    assert got["c"].tolist() == [4, 2, 1]  # b: second most frequent; z unseen; null
    assert served.output_schema.column_names == ["c"]


CASES = [
    ("target_encoding", _plan(lambda: ["c", "y"] >> ops.TargetEncoding(["y"], kfold=1)), ExportError,
     r"TargetEncoding cannot run inside the exported model: it joins .*Workflow.remove_inputs"),
    ("lambda_op", _plan(lambda: ["c"] >> ops.LambdaOp(str.upper)), ExportError,
     r"LambdaOp cannot run inside the exported model: it runs an arbitrary Python function"),
    ("filter_rows", _plan(lambda: ["x"] >> ops.Filter(lambda df: df["x"] > 0)), ExportError,
     r"Filter cannot run inside the exported model: it drops rows"),
    ("combo_categorify", _plan(lambda: [["c", "y"]] >> ops.Categorify(encode_type="combo")), ExportError,
     r"Categorify\(encode_type='combo'\) has no in-graph version yet"),
    ("request_lacks_column", _missing_request_column, SchemaError,
     r"the raw rows lack columns \['x'\] that the artifact takes; they have \['c'\]"),
    ("served_without_label", _served_without_label, None, None),
]

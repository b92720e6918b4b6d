"""List columns in the in-graph serving export (tabstream.serving): what it refuses
(naming the op or column, why, and the fix) and the request layout it builds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import ExportError, SchemaError
from tabstream.serving import build_plan, raw_arrays


def _table():
    return pa.table({"l": pa.array([["a", "b"], [], None, ["a", None]]),
                     "n": pa.array([[1, 2], [3], None, [4, 5]], pa.list_(pa.int64())),
                     "nested": pa.array([[[1]], [[2, 3]], None, []], pa.list_(pa.list_(pa.int64()))),
                     "c": ["x", "y", "x", None]})


def _plan(node_fn):
    def run(tmp):
        build_plan(ts.Workflow(node_fn()).fit(ts.Dataset(_table())))
    return run


def _scalar_sent_for_a_list(tmp):
    wf = ts.Workflow(["l"] >> ops.Categorify()).fit(ts.Dataset(_table()))
    raw_arrays(pd.DataFrame({"l": ["a"]}), build_plan(wf).inputs, "torch")


def _list_request_layout(tmp):
    # not an error: a null list is sent as an empty one; a null element is masked
    wf = ts.Workflow(["l"] >> ops.Categorify()).fit(ts.Dataset(_table()))
    (spec,) = build_plan(wf).inputs
    assert spec.is_list and spec.kind == "string"
    got = raw_arrays(_table(), [spec], "torch")
    elements = [e for row in _table().column("l").to_pylist() if row is not None for e in row]
    assert got["l"].tobytes() == "".join(e or "" for e in elements).encode()
    assert got["l__value_offsets"].tolist() == np.cumsum([0] + [len((e or "").encode()) for e in elements]).tolist()
    assert got["l__offsets"].tolist() == [0, 2, 2, 2, 4]
    assert got["l__mask"].tolist() == [e is not None for e in elements]
    keras = raw_arrays(_table(), [spec], "keras")
    assert keras["l"].tolist() == [(e or "").encode() for e in elements]
    assert keras["l__offsets"].tolist() == [0, 2, 2, 2, 4]


CASES = [
    ("list_of_lists", _plan(lambda: ["nested"] >> ops.ListSlice(1)), ExportError,
     r"raw column 'nested' has a list of .*lists of those: leave it out .*Workflow.remove_inputs"),
    ("cross_of_lists", _plan(lambda: [["n", "c"]] >> ops.HashedCross(11)), ExportError,
     r"HashedCross on list column 'n' has no in-graph version; the in-graph list ops are "
     r"\['Categorify', 'HashBucket', 'ListSlice', 'LogOp', 'Normalize'\].*Workflow.remove_inputs"),
    ("padded_string_slice", _plan(lambda: ["l"] >> ops.ListSlice(0, 2, pad=True, pad_value="")), ExportError,
     r"ListSlice\(pad=True\) on the list of strings 'l' has no in-graph version yet; pad after Categorify"),
    ("scalar_sent_for_list", _scalar_sent_for_a_list, SchemaError,
     r"raw column 'l' is not a list \((large_)?string\), but the artifact takes lists of string there"),
    ("list_request_layout", _list_request_layout, None, None),
]

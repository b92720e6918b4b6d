"""The serving plan (no framework): what it takes, what it refuses, its JSON, and
``Workflow.remove_inputs``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import ExportError
from tabstream.serving import ServingPlan, build_plan


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"c": ["a", "b", "a", None], "x": [1.0, np.nan, -0.0, np.inf],
                         "label": [1, 0, 1, 0]})


def test_remove_inputs_drops_what_the_label_feeds_and_transforms_without_it():
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.FillMissing(0) >> ops.Clip(max_value=5.0))
                     + ["label"] + (["c", "label"] >> ops.HashedCross(11))).fit(ts.Dataset(_frame()))
    served = wf.remove_inputs(["label"])
    assert served.input_columns == ["c", "x"]
    assert served.output_schema.column_names == ["c", "x"]  # the label and the cross it feeds are gone
    raw = _frame().drop(columns=["label"])
    expected = wf.transform(_frame())[["c", "x"]]  # the full workflow, label given
    pd.testing.assert_frame_equal(served.transform(raw), expected)
    assert [i.name for i in build_plan(served).inputs] == ["c", "x"]


def test_remove_inputs_names_unknown_columns():
    wf = ts.Workflow(["c"] >> ops.Categorify()).fit(ts.Dataset(_frame()))
    with pytest.raises(ValueError, match=r"remove_inputs: \['nope'\] are not input columns of the workflow; "
                                         r"its inputs are \['c'\]"):
        wf.remove_inputs(["nope"])
    with pytest.raises(ValueError, match=r"every output of the workflow is computed from \['c'\]"):
        wf.remove_inputs(["c"])


def test_plan_round_trips_through_strict_json():
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.Clip(min_value=-np.inf, max_value=2.0))
                     + (["x"] >> ops.FillMissing(np.inf) >> ops.Rename(postfix="_f"))).fit(ts.Dataset(_frame()))
    plan = build_plan(wf)
    text = plan.to_json()
    assert "Infinity" not in text  # strict JSON: inf is written as {"float": "inf"}
    again = ServingPlan.from_json(text)
    assert again == plan
    fill = next(s for s in again.steps if s["op"] == "fill")
    assert fill["value"] == np.inf


def test_exclude_names_must_be_outputs():
    wf = ts.Workflow(["c"] >> ops.Categorify()).fit(ts.Dataset(_frame()))
    with pytest.raises(ValueError, match=r"exclude names \['label'\], which are not output columns"):
        build_plan(wf, exclude=["label"])


@pytest.mark.parametrize(("node", "match"), [
    (lambda: ["c"] >> ops.Dropna(), r"Dropna cannot run inside the exported model: it drops rows"),
    (lambda: ["x", "c"] >> ops.DifferenceLag("c"), r"DifferenceLag cannot run inside the exported model: it reads"),
    (lambda: ["c", "x"] >> ops.JoinGroupby(cont_cols=["x"]), r"JoinGroupby cannot run inside the exported model"),
])
def test_refused_ops_name_themselves_and_the_fix(node, match):
    wf = ts.Workflow(node()).fit(ts.Dataset(_frame()))
    with pytest.raises(ExportError, match=match + r".*Workflow.remove_inputs"):
        build_plan(wf)


def test_list_columns_are_served_in_the_loaders_layout():
    import pyarrow as pa

    t = pa.table({"tags": pa.array([["a", "b"], [], None, ["a"]]),
                  "x": pa.array([[1.0], [2.0, 3.0], None, []])})
    wf = ts.Workflow((["tags"] >> ops.Categorify()) + (["tags"] >> ops.Categorify() >> ops.ListSlice(0, 2, pad=True)
                                                       >> ops.Rename(postfix="_p"))
                     + (["x"] >> ops.ValueCount() >> ops.LogOp())).fit(ts.Dataset(t))
    plan = build_plan(wf)
    assert [(i.name, i.kind, i.is_list) for i in plan.inputs] == [("tags", "string", True), ("x", "float", True)]
    # what the loader delivers for each (tabstream.loaders.layout.column_layout, a second way)
    from tabstream.loaders.layout import column_layout

    out = wf.transform(t)
    for o in plan.outputs:
        fixed = column_layout(o.name, out.column(o.name).type, wf.output_schema[o.name].properties).fixed
        assert (o.layout, o.length) == (("ragged", None) if fixed is None else ("fixed", fixed[0]))
    assert [o.layout for o in plan.outputs] == ["ragged", "fixed", "ragged"]
    assert ServingPlan.from_json(plan.to_json()) == plan

"""``Workflow.to_torch()`` exported with ``torch.export``: raw columns in, the model's
inputs (or its scores) out, in a fresh process without tabstream, equal to
``Workflow.transform`` (ids exactly, floats to 1e-6) on 10,000 raw rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).parent))
from artifact_cases import (  # noqa: E402
    arrow_rows,
    assert_same,
    expected_features,
    fitted,
    flat_outputs,
    frame,
    nested_outputs,
    run_fresh,
)

from tabstream.core.errors import ExportError  # noqa: E402
from tabstream.serving.inputs import raw_arrays  # noqa: E402
from tabstream.serving.torch import export  # noqa: E402

pytestmark = pytest.mark.torch

RUN = """
import sys
import numpy as np
import torch
program = torch.export.load("artifact.pt2").module()
inputs = {k: torch.from_numpy(v) for k, v in np.load("inputs.npz").items()}
with torch.no_grad():
    out = program(inputs)
flat = {}
for k, v in (out.items() if isinstance(out, dict) else [("scores", out)]):
    # a list column's pair as k.0, k.1 (artifact_cases.nested_outputs reads them back)
    flat.update({f"{k}.{i}": p.numpy() for i, p in enumerate(v)} if isinstance(v, tuple) else {k: v.numpy()})
np.savez("outputs.npz", **flat)
"""


@pytest.fixture(scope="module")
def wf():
    return fitted()


def _tensors(arrays):
    def one(v):
        return torch.from_numpy(np.ascontiguousarray(v).copy())
    return {k: tuple(one(p) for p in v) if isinstance(v, tuple) else one(v) for k, v in arrays.items()}


@pytest.mark.slow  # export, save and a fresh interpreter: about a minute on a busy 2-core machine
def test_exported_features_equal_workflow_transform_in_a_fresh_process(wf, tmp_path):
    module = wf.to_torch()
    # the label (tagged TARGET) is not served, so it is not an input
    assert [i.name for i in module.plan.inputs] == ["s", "t", "i", "g", "f", "tags", "ids", "nums"]
    # traced on a small batch, run on 10,000 other rows
    example = _tensors(raw_arrays(arrow_rows(frame(5, 64, 50), 6), module.plan.inputs, "torch"))
    torch.export.save(export(module, example), str(tmp_path / "artifact.pt2"))
    rows = arrow_rows(frame(1, 10_000, 600), 2)
    np.savez(tmp_path / "inputs.npz", **raw_arrays(rows, module.plan.inputs, "torch"))
    run_fresh(RUN, str(tmp_path))
    got = nested_outputs(dict(np.load(tmp_path / "outputs.npz")))
    assert_same(got, expected_features(wf, rows, [o.name for o in module.plan.outputs]))


def test_eager_module_equals_workflow_transform(wf):
    """The module itself (what the export captures) on the 10,000 rows, and on 1 and 3 rows."""
    module = wf.to_torch()
    for n in (10_000, 1, 3):
        rows = arrow_rows(frame(1, n, 600), 2) if n > 10 else arrow_rows(frame(7, n, 5), 8)
        got = nested_outputs(flat_outputs(module(_tensors(raw_arrays(rows, module.plan.inputs, "torch"))),
                                          lambda t: t.numpy()))
        assert_same(got, expected_features(wf, rows, [o.name for o in module.plan.outputs]))


@pytest.mark.slow  # as above
def test_bundled_model_scores_raw_rows_in_a_fresh_process(wf, tmp_path):
    from tabstream.train.torch import DLRM

    # DLRM takes ids (single, lists ragged and padded) and float32 values: g's, the float
    # lists' and the raw integer lists' outputs are left out
    served = wf.remove_inputs(["g", "nums"])
    module = served.to_torch(exclude=["label", "ids_s"])
    assert {o.name: o.layout for o in module.plan.outputs if o.layout != "scalar"} == \
        {"tags": "ragged", "tags_h": "ragged", "tags_last": "ragged", "ids_p": "fixed"}
    torch.manual_seed(0)
    schema = served.output_schema.without(["label", "ids_s"])
    model = DLRM(schema).eval()
    rows = arrow_rows(frame(3, 500, 100), 4).drop_columns(["g", "nums", "label"])
    arrays = raw_arrays(rows, module.plan.inputs, "torch")
    torch.export.save(export(module, _tensors(arrays), model=model), str(tmp_path / "artifact.pt2"))
    np.savez(tmp_path / "inputs.npz", **arrays)
    run_fresh(RUN, str(tmp_path))
    # the same rows a second way: Workflow.transform in Python, then the eager model
    features = expected_features(served, rows.append_column("label", [np.zeros(500, np.int64)]),
                                 schema.column_names)
    with torch.no_grad():
        expected = model(_tensors(features)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "outputs.npz")["scores"], expected, rtol=0, atol=1e-6)


def test_refused_ops_are_named_with_the_reason():
    import pandas as pd

    import tabstream as ts
    from tabstream import ops

    df = pd.DataFrame({"a": ["x", "y", "x"], "y": [1.0, 0.0, 1.0]})
    wf = ts.Workflow(["a", "y"] >> ops.TargetEncoding(["y"], kfold=1)).fit(ts.Dataset(df))
    with pytest.raises(ExportError, match=r"TargetEncoding cannot run inside the exported model: it joins"):
        wf.to_torch()
    wf = ts.Workflow(["a"] >> ops.LambdaOp(str.upper)).fit(ts.Dataset(df))
    with pytest.raises(ExportError, match=r"LambdaOp cannot run inside the exported model: it runs an arbitrary"):
        wf.to_torch()

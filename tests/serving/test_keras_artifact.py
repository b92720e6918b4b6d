"""``Workflow.to_keras()`` exported as a SavedModel: raw columns in, the model's
inputs (or its scores) out, in a fresh process without tabstream, equal to
``Workflow.transform`` (ids exactly, floats to 1e-6) on 10,000 raw rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

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
    signature_pairs,
)

from tabstream.core.errors import ExportError  # noqa: E402
from tabstream.serving.inputs import raw_arrays  # noqa: E402
from tabstream.serving.keras import export  # noqa: E402

pytestmark = pytest.mark.tensorflow

# inputs.npz holds strings as UTF-8 bytes + offsets (no pickled object arrays);
# the fresh process turns them into tf.string tensors
RUN = """
import sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load("artifact")
arrays = dict(np.load("inputs.npz"))
for name in [n for n, v in arrays.items() if v.dtype == np.uint8]:  # strings as UTF-8 bytes + offsets
    # a list's elements have __value_offsets (its __offsets are row offsets and stay)
    offsets = arrays.pop(name + "__value_offsets", None)
    if offsets is None:
        offsets = arrays.pop(name + "__offsets")
    values = arrays[name]
    arrays[name] = [values[a:b].tobytes() for a, b in zip(offsets[:-1], offsets[1:])]
inputs = {k: tf.constant(v, tf.string, shape=[len(v)]) if isinstance(v, list) else tf.constant(v)
          for k, v in arrays.items()}
out = served.serve(inputs)
flat = {}
for k, v in (out.items() if isinstance(out, dict) else [("scores", out)]):
    # a list column's pair as k.0, k.1 (artifact_cases.nested_outputs reads them back)
    flat.update({f"{k}.{i}": p.numpy() for i, p in enumerate(v)} if isinstance(v, (tuple, list)) else {k: v.numpy()})
np.savez("outputs.npz", **flat)
"""


@pytest.fixture(scope="module")
def wf():
    return fitted()


def _tensors(arrays):
    return {k: tuple(tf.constant(p) for p in v) if isinstance(v, tuple) else tf.constant(v)
            for k, v in arrays.items()}


def test_layer_equals_workflow_transform(wf):
    """The layer itself (what the export captures) on 10,000 rows, and on 1 and 3 rows."""
    layer = wf.to_keras()
    assert [i.name for i in layer.plan.inputs] == ["s", "t", "i", "g", "f", "tags", "ids", "nums"]  # no label
    for n in (10_000, 1, 3):
        rows = arrow_rows(frame(1, n, 600), 2) if n > 10 else arrow_rows(frame(7, n, 5), 8)
        got = nested_outputs(flat_outputs(layer(_tensors(raw_arrays(rows, layer.plan.inputs, "keras"))),
                                          lambda t: t.numpy()))
        assert_same(got, expected_features(wf, rows, [o.name for o in layer.plan.outputs]))


@pytest.mark.slow  # a SavedModel written and a fresh interpreter: about a minute on a busy 2-core machine
def test_saved_model_features_equal_workflow_transform_in_a_fresh_process(wf, tmp_path):
    layer = wf.to_keras()
    export(layer, str(tmp_path / "artifact"))
    rows = arrow_rows(frame(1, 10_000, 600), 2)
    np.savez(tmp_path / "inputs.npz", **raw_arrays(rows, layer.plan.inputs, "torch"))
    run_fresh(RUN, str(tmp_path))
    got = signature_pairs(dict(np.load(tmp_path / "outputs.npz")))
    assert_same(got, expected_features(wf, rows, [o.name for o in layer.plan.outputs]))


@pytest.mark.slow  # as above
def test_bundled_model_scores_raw_rows_in_a_fresh_process(wf, tmp_path):
    from tabstream.train.tensorflow import DLRM

    # DLRM takes ids (single, lists ragged and padded) and float32 values: g's, the float
    # lists' and the raw integer lists' outputs are left out
    served = wf.remove_inputs(["g", "nums"])
    layer = served.to_keras(exclude=["label", "ids_s"])
    schema = served.output_schema.without(["label", "ids_s"])
    model = DLRM(schema, seed=0)
    rows = arrow_rows(frame(3, 500, 100), 4).drop_columns(["g", "nums", "label"])
    features = expected_features(served, rows.append_column("label", [np.zeros(500, np.int64)]),
                                 schema.column_names)
    expected = model(_tensors(features)).numpy()  # Workflow.transform in Python, then the model
    export(layer, str(tmp_path / "artifact"), model=model)
    np.savez(tmp_path / "inputs.npz", **raw_arrays(rows, layer.plan.inputs, "torch"))
    run_fresh(RUN, str(tmp_path))
    scores = np.load(tmp_path / "outputs.npz")["scores"]
    # f <= -1 is clipped to -1 and log1p'd to -inf by the workflow, in both routes
    # alike (the features test above); what a model makes of an infinite input
    # depends on its kernels (eager NaN, the saved graph finite on oneDNN's AVX-512
    # path), so those rows' scores are compared where the features are finite only,
    # to float32's precision: the two graphs may sum in another order (3e-6 apart on
    # scores of 5-8, a few units in the last place)
    finite = np.isfinite(features["f"])
    assert finite.mean() > 0.6
    np.testing.assert_allclose(scores[finite], expected[finite], rtol=1e-5, atol=1e-6)


def test_combo_categorify_is_refused_by_name():
    import pandas as pd

    import tabstream as ts
    from tabstream import ops

    df = pd.DataFrame({"a": ["x", "y", "x"], "b": ["u", "u", "v"]})
    wf = ts.Workflow([["a", "b"]] >> ops.Categorify(encode_type="combo")).fit(ts.Dataset(df))
    with pytest.raises(ExportError, match=r"Categorify\(encode_type='combo'\) has no in-graph version"):
        wf.to_keras()

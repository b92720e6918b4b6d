"""Small workflows at the edges of the artifact's dtypes and op settings: each
served by the torch module and the Keras layer (eager), equal to
``Workflow.transform`` on the same rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from artifact_cases import assert_same, expected_features, flat_outputs, nested_outputs  # noqa: E402

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.core.errors import ExportError  # noqa: E402
from tabstream.serving import build_plan  # noqa: E402
from tabstream.serving.inputs import raw_arrays  # noqa: E402


def _features(wf: ts.Workflow, rows: pa.Table, framework: str) -> dict:
    if framework == "torch":
        torch = pytest.importorskip("torch")
        module = wf.to_torch()
        arrays = raw_arrays(rows, module.plan.inputs, "torch")
        with torch.no_grad():
            out = module({k: torch.from_numpy(v) for k, v in arrays.items()})
        return nested_outputs(flat_outputs(out, lambda t: t.numpy()))
    tf = pytest.importorskip("tensorflow")
    layer = wf.to_keras()
    out = layer({k: tf.constant(v) for k, v in raw_arrays(rows, layer.plan.inputs, "keras").items()})
    return nested_outputs(flat_outputs(out, lambda t: t.numpy()))


def _check(node, rows, framework: str, fit_rows=None) -> None:
    """``node`` fitted on ``fit_rows`` (default ``rows``), served on ``rows``."""
    if not isinstance(rows, pa.Table):
        rows = pa.Table.from_pandas(rows, preserve_index=False)
    wf = ts.Workflow(node).fit(ts.Dataset(rows if fit_rows is None else fit_rows))
    expected = expected_features(wf, rows, [o.name for o in build_plan(wf).outputs])
    assert_same(_features(wf, rows, framework), expected)


@pytest.fixture(params=["torch", "keras"])
def framework(request):
    return request.param


def _half() -> pa.Table:
    # 0.0999755859375 is float16(0.1): a bound or fill value of 0.1 rounds to it
    x = pa.array(np.array([0.5, 0.0999755859375, 2.0, 0.0, -1.0], np.float16), mask=np.array([0, 0, 0, 1, 0], bool))
    return pa.table({"h": x})


def test_float16_fill_value_and_clip_bounds_are_rounded_to_float16(framework):
    _check(["h"] >> ops.FillMissing(0.1) >> ops.HashBucket(1000), _half(), framework)
    _check(["h"] >> ops.FillMissing(0.1) >> ops.Categorify(), _half(), framework)
    _check(["h"] >> ops.Clip(min_value=0.1, max_value=1.9) >> ops.Bucketize([0.1, 1.9]), _half(), framework)
    _check(["h"] >> ops.Clip(min_value=0.1) >> ops.HashBucket(1000), _half(), framework)


def test_filled_flag_feeds_encoders(framework):
    rows = pd.DataFrame({"i": pd.array([1, None, 3, 3], "Int64"), "s": ["a", "b", None, "a"]})
    _check(["i"] >> ops.FillMissing(0, add_binary_cols=True) >> ops.HashBucket(7), rows, framework)
    _check(["i"] >> ops.FillMedian(add_binary_cols=True) >> ops.Categorify(), rows, framework)
    # i_filled of a column without nulls at fit: FillMedian has nothing to fill (always False)
    _check(((["i"] >> ops.FillMissing(0, add_binary_cols=True)) + ["s"])
           >> ops.HashedCross(50, column_groups=[["i_filled", "s"]]), rows, framework)


def test_categorify_num_buckets_per_column(framework):
    fit = pa.Table.from_pandas(pd.DataFrame({"a": ["x", "y", "x", None], "b": ["p", "q", "p", "r"]}))
    rows = pd.DataFrame({"a": ["x", "zz", None, "new"], "b": ["p", "new", None, "q"]})
    _check(["a", "b"] >> ops.Categorify(num_buckets={"a": 5}), rows, framework, fit_rows=fit)


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64"])
def test_categorify_unsigned_id_dtypes(framework, dtype):
    fit = pa.table({"a": ["x", "y", "x"]})
    _check(["a"] >> ops.Categorify(dtype=dtype, num_buckets=3), pd.DataFrame({"a": ["x", "zz", None, "y"]}),
           framework, fit_rows=fit)


@pytest.mark.parametrize("bounds", [(-1e30, 10), (0, 1e19), (-1e19, 1e30)])
def test_int_clip_ignores_bounds_no_value_can_cross(framework, bounds):
    rows = pd.DataFrame({"i": pd.array([1, None, 50, -7], "Int64")})
    _check(["i"] >> ops.Clip(min_value=bounds[0], max_value=bounds[1]), rows, framework)
    rows = pd.DataFrame({"i": pd.array([1, None, 50, -7], "Int32")})
    _check(["i"] >> ops.Clip(min_value=-1e10, max_value=3e9) >> ops.HashBucket(97), rows, framework)


def test_uint64_values_past_int64_hash_and_encode_as_the_workflow(framework):
    rows = pa.table({"u": pa.array([1, 2**63 + 5, None, 3, 2**64 - 1], pa.uint64())})
    fit = pa.table({"u": pa.array([1, 2**63 + 5, None, 3], pa.uint64())})
    _check(["u"] >> ops.Categorify(), rows, framework, fit_rows=fit)
    _check(["u"] >> ops.Categorify(num_buckets=4), rows, framework, fit_rows=fit)
    _check(["u"] >> ops.HashBucket(100), rows, framework)


def _past_int64() -> pa.Table:
    values = [1, 2**63 + 5, None, 3, 2**64 - 1, 2**63 - 1, 2**63 + 100, 2**63 + 2047, 2**63 + 3073]
    lists = [[1, 2**63 + 7], [], None, [5], [2**64 - 2], [0], [2**63 + 1025], [7, 8, 2**64 - 1], [3]]
    return pa.table({"u": pa.array(values, pa.uint64()), "l": pa.array(lists, pa.list_(pa.uint64()))})


@pytest.mark.parametrize("node", [
    ["u"] >> ops.LogOp(), ["u"] >> ops.Normalize(), ["u"] >> ops.NormalizeMinMax(),
    ["u"] >> ops.Bucketize([10.0, 2.0**63, 1.8e19]), ["u"] >> ops.FillMissing(2**63 + 1),
    ["u"] >> ops.FillMedian(), ["u"] >> ops.Clip(min_value=2, max_value=2**63 + 100),
    ["u"] >> ops.Clip(min_value=2**63), ["u"] >> ops.Clip(max_value=2**63 - 2), ["u"] >> ops.Clip(min_value=2.5),
    ["u"] >> ops.FillMissing(2**63 + 1) >> ops.Clip(min_value=2**63 + 50) >> ops.LogOp(),
    ["l"] >> ops.LogOp(), ["l"] >> ops.ListSlice(0, 1), ["l"] >> ops.ListSlice(-2, pad=True, pad_value=2**63 + 9),
], ids=lambda node: repr(node)[:60])
def test_uint64_values_past_int64_compute_as_the_workflow(framework, node):
    # the artifact carries uint64 as int64 bits: arithmetic must not see 2**63 and up
    # as negative (before, LogOp gave NaN, Bucketize bucket 0, Clip left them alone)
    _check(node, _past_int64(), framework)


def test_int64_fill_values_past_2_53_are_exact(framework):
    rows = pa.table({"i": pa.array([1, None, 2**60 + 3], pa.int64())})
    _check(["i"] >> ops.FillMissing(2**60 + 1), rows, framework)


def test_string_outputs_are_refused_by_name():
    lists = pd.DataFrame({"t": [["p", None], [], None, ["q", "p", "r"]], "c": ["a", "b", "a", None]})
    wf = ts.Workflow((["t"] >> ops.ListSlice(-2)) + (["c"] >> ops.Categorify())).fit(ts.Dataset(lists))
    with pytest.raises(ExportError, match=r"output columns \['t'\] are strings .*Categorify or HashBucket"):
        build_plan(wf)
    build_plan(wf, exclude=["t"])  # without it the plan builds
    wf = ts.Workflow(["c"] + (["t"] >> ops.HashBucket(5))).fit(ts.Dataset(lists))
    with pytest.raises(ExportError, match=r"output columns \['c'\] are strings"):
        wf.to_torch()


@pytest.mark.parametrize("fitted", ["float32", "float16"])
def test_a_float64_request_of_a_narrower_fitted_column_is_rounded_as_the_workflow(framework, fitted):
    """Fitted from float32 (or float16) values, sent as float64 as pandas and JSON
    clients send them: rounded to the fitted width first, as Workflow.transform casts
    them. Unrounded, float64 0.1 matched no vocabulary value (every id out of
    vocabulary), and hashed and bucketed as another number."""
    fit = pa.table({"x": pa.array([0.1, 0.2, 0.7, 0.1, None], pa.float32()).cast(fitted)})
    node = ((["x"] >> ops.Categorify())
            + (["x"] >> ops.HashBucket(1000) >> ops.Rename(postfix="_h"))
            + (["x"] >> ops.Bucketize([0.7]) >> ops.Rename(postfix="_b")))
    wf = ts.Workflow(node).fit(ts.Dataset(fit))
    wide = pa.table({"x": pa.array([0.1, 0.2, 0.7, None], pa.float64())})
    narrow = pa.table({"x": wide.column("x").cast(fitted)})  # the same values, as fitted
    names = [o.name for o in build_plan(wf).outputs]
    got = _features(wf, wide, framework)
    assert_same(got, expected_features(wf, wide, names))
    assert_same(got, expected_features(wf, narrow, names))
    ids = np.asarray(got["x"])
    assert len(set(ids[:3].tolist())) == 3 and (ids[:3] >= 3).all()  # in the vocabulary
    # the buckets of the values as fitted (float32 0.7 is below 0.7, float16 0.7 above)
    rounded = np.array([0.1, 0.2, 0.7], fitted).astype(np.float64)
    assert np.asarray(got["x_b"])[:3].tolist() == np.searchsorted([0.7], rounded, side="right").tolist()


def test_a_number_sent_for_a_bool_column_is_true_unless_zero(framework):
    """A bool column served from integers: 2 is True, as Workflow.transform casts it
    (it was an unseen value 2 in the artifact)."""
    fit = pa.table({"b": pa.array([True, False, None, True])})
    node = (["b"] >> ops.Categorify()) + (["b"] >> ops.HashBucket(7) >> ops.Rename(postfix="_h"))
    wf = ts.Workflow(node).fit(ts.Dataset(fit))
    ints = pa.table({"b": pa.array([1, 0, None, 2])})
    bools = pa.table({"b": pa.array([True, False, None, True])})
    names = [o.name for o in build_plan(wf).outputs]
    got = _features(wf, ints, framework)
    assert_same(got, expected_features(wf, ints, names))
    assert_same(got, expected_features(wf, bools, names))

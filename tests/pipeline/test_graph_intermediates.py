"""A partition's evaluation drops each node's output once its last reader has it
(``consumer_counts`` / ``release`` in ``core.graph``): the tables of a chain do not
all live until the partition is done, a node read twice is evaluated once, and the
result is the one pandas computes."""

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
from tabstream import ops
from tabstream.core.graph import consumer_counts, release


def _frame():
    rng = np.random.default_rng(3)
    x = rng.integers(-5, 100, 200).astype("float64")
    x[::7] = np.nan
    return pd.DataFrame({"x": x, "y": rng.integers(0, 9, 200)})


def test_a_chains_earlier_outputs_are_gone_when_its_last_op_runs():
    frame = _frame()
    cache: dict[int, pa.Table] = {}
    seen: list[set[int]] = []

    def spy(col):
        seen.append(set(cache))  # the outputs still held while the last op runs
        return col

    fill, clip, log = ops.FillMissing(0), ops.Clip(min_value=0), ops.LogOp()
    last = ["x"] >> fill >> clip >> log >> ops.LambdaOp(spy)
    graph = last + ["y"]
    wf = ts.Workflow(graph).fit(ts.Dataset(frame))
    table = pa.Table.from_pandas(frame, preserve_index=False)
    log_node = last.parents[0]
    assert log_node.op is log
    seen.clear()  # the fit's own calls
    out = graph.transform(table, wf.input_schema, cache, None, consumer_counts([graph]))
    # the last call is the evaluation (LambdaOp first calls its function on an empty
    # frame for the output's type, before any parent is evaluated)
    assert seen[-1] == {log_node.id}  # FillMissing's and Clip's outputs (and the input's) left
    assert set(cache) == {graph.id}  # only the requested output; its reader is the caller
    expected = np.log1p(frame["x"].fillna(0).clip(lower=0)).astype("float32")
    assert np.allclose(out.column("x").to_numpy(), expected.to_numpy())
    assert out.column("y").to_pylist() == frame["y"].tolist()


def test_an_output_read_twice_is_evaluated_once_and_kept_for_its_second_reader():
    frame = _frame()
    fill = ops.FillMissing(0)
    shared = ["x"] >> fill
    a = shared >> ops.Clip(min_value=10)
    b = shared >> ops.Clip(max_value=20)
    wf = ts.Workflow(a).fit(ts.Dataset(frame))
    calls = []
    real = fill.transform
    fill.transform = lambda t: calls.append(t.num_rows) or real(t)  # this op's evaluations
    table = pa.Table.from_pandas(frame, preserve_index=False)
    cache: dict[int, pa.Table] = {}
    uses = consumer_counts([a, b])
    assert uses[shared.id] == 2
    out_a = a.transform(table, wf.input_schema, cache, None, uses)
    assert shared.id in cache  # b still reads it
    out_b = b.transform(table, wf.input_schema, cache, None, uses)
    assert shared.id not in cache and len(calls) == 1
    release(a, cache, uses)
    release(b, cache, uses)
    assert cache == {}
    filled = frame["x"].fillna(0)
    assert out_a.column("x").to_pylist() == filled.clip(lower=10).tolist()
    assert out_b.column("x").to_pylist() == filled.clip(upper=20).tolist()

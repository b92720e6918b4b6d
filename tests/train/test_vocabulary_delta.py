"""Tables follow the vocabulary (issue 33 item 2): a vocabulary delta's recycled ids
get their rows and optimizer state reset, in the ParameterServer (crash-safe,
exported) and in the in-memory torch and Keras tables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer, initial_rows, vocabulary_resets
from tabstream.train.tables import TableConfig

ROOT = Path(__file__).resolve().parents[2]


def _workflow_and_delta(tmp_path):
    """A workflow whose update recycles ids: capacity 3, day 1 brings d and e."""
    day0, day1 = tmp_path / "d0.parquet", tmp_path / "d1.parquet"
    pd.DataFrame({"C1": list("aaabbbccd")}).to_parquet(day0)
    pd.DataFrame({"C1": list("dddeee")}).to_parquet(day1)
    wf = ts.Workflow(["C1"] >> ops.Categorify(freq_threshold=2, max_size=6))
    wf.fit(ts.Dataset(str(day0)))
    return wf, wf.update(ts.Dataset(str(day1)))


@pytest.mark.parametrize("storage", ["disk", "memory"])
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_server_resets_recycled_rows_and_exports_them(tmp_path, storage, optimizer) -> None:
    wf, delta = _workflow_and_delta(tmp_path)
    recycled = delta["C1"].recycled
    # a and c (ids 3 and 5) were evicted; d and e took their ids
    assert recycled.tolist() == [3, 5]
    ps = ParameterServer(tmp_path / "ps", [TableConfig("C1", 6, 4, ("C1",))], storage=storage,
                         optimizer=optimizer, seed=7)
    ps.apply("C1", [3, 4, 5], np.ones((3, 4), np.float32))
    ps.export_delta(tmp_path / "export0")
    trained = ps.lookup("C1", [4])
    state = ps.optimizer_state("C1", [4])
    assert ps.apply_vocabulary_delta(delta) == {"C1": 2}
    np.testing.assert_array_equal(ps.lookup("C1", recycled), initial_rows(7, "C1", recycled, 4, 0.05))
    np.testing.assert_array_equal(ps.optimizer_state("C1", recycled), np.zeros((2, {"adagrad": 4, "adam": 8}[optimizer])))
    np.testing.assert_array_equal(ps.lookup("C1", [4]), trained)          # b is kept: untouched
    np.testing.assert_array_equal(ps.optimizer_state("C1", [4]), state)
    # the next export carries exactly the reset rows, with their initial values
    ps.export_delta(tmp_path / "export1")
    exported = pd.read_parquet(tmp_path / "export1" / "C1")
    assert exported["key"].tolist() == [3, 5]
    np.testing.assert_array_equal(np.stack(exported["value"].to_numpy()), initial_rows(7, "C1", recycled, 4, 0.05))
    # applied again (a restarted job applies the chain again): nothing happens
    assert ps.apply_vocabulary_delta(delta) == {}
    ps.close()
    reopened = ParameterServer.open(tmp_path / "ps")
    assert reopened.vocabulary_delta == 1
    reopened.close()


def test_server_refuses_a_delta_out_of_order_and_reads_a_saved_chain(tmp_path) -> None:
    wf, first = _workflow_and_delta(tmp_path)
    pd.DataFrame({"C1": list("ffffgggg")}).to_parquet(tmp_path / "d2.parquet")
    second = wf.update(ts.Dataset(str(tmp_path / "d2.parquet")))
    wf.save(str(tmp_path / "wf"))
    ps = ParameterServer(tmp_path / "ps", [TableConfig("C1", 6, 4, ("C1",))])
    with pytest.raises(DataError, match=r"update_00002 follows update_00001, but the last delta this "
                                        r"server applied is update_00000; apply the deltas in order"):
        ps.apply_vocabulary_delta(second)
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    # from the saved folders, in order, by path
    got = [ps.apply_vocabulary_delta(tmp_path / "wf" / "vocabulary" / d.name) for d in loaded.vocabulary_deltas]
    assert got == [{"C1": len(first["C1"].recycled)}, {"C1": len(second["C1"].recycled)}]
    assert ps.vocabulary_delta == 2
    ps.close()


def test_resets_map_vocabularies_to_tables_by_name_or_column() -> None:
    tables = {"u_v": ("u", "v"), "tags": ("tags",), "wide": ("u",)}
    assert {k: v.tolist() for k, v in vocabulary_resets({"tags": [5, 3, 5], "u": [2]}, tables).items()} == \
        {"tags": [3, 5], "u_v": [2], "wide": [2]}
    assert vocabulary_resets({"nothing_here": [1]}, tables) == {}
    with pytest.raises(TypeError, match=r"the ids of 'tags' must be integers, got dtype float64"):
        vocabulary_resets({"tags": [1.5]}, tables)
    with pytest.raises(TypeError, match=r"a vocabulary delta is a VocabularyDelta, the folder of one or a "
                                        r"mapping \{table: ids\}, got list"):
        vocabulary_resets([1, 2], tables)


def test_server_refuses_ids_beyond_its_table(tmp_path) -> None:
    ps = ParameterServer(tmp_path / "ps", [TableConfig("C1", 4, 2, ("C1",))])
    with pytest.raises(ValueError, match=r"table 'C1': id 5 is out of range; the table has 4 rows"):
        ps.apply_vocabulary_delta({"C1": [1, 5]})
    assert ps.version == 0
    ps.close()


_RESETTER = textwrap.dedent("""
    import os, signal, sys, numpy as np
    from tabstream.train.cache_store import ParameterServer
    ps = ParameterServer.open(sys.argv[1])
    ps.apply_vocabulary_delta({"C1": [2, 3]})
    if sys.argv[2] == "flush":
        ps.flush()
    os.kill(os.getpid(), signal.SIGKILL)
""")


@pytest.mark.parametrize("flush", ["flush", "no-flush"])
def test_a_reset_is_crash_safe(tmp_path, flush) -> None:
    """Killed (SIGKILL) after a reset: without a flush the server reopens as it was
    before it; with one, the reset is committed."""
    ps = ParameterServer(tmp_path / "ps", [TableConfig("C1", 8, 4, ("C1",))], seed=3)
    ps.apply("C1", [1, 2, 3], np.full((3, 4), 0.5, np.float32))
    ps.flush()
    trained = ps.lookup("C1", [1, 2, 3])
    ps.close()
    script = tmp_path / "resetter.py"
    script.write_text(_RESETTER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "ps"), flush], env=env, timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ps = ParameterServer.open(tmp_path / "ps")
    expected = trained.copy()
    if flush == "flush":
        expected[1:] = initial_rows(3, "C1", np.array([2, 3]), 4, 0.05)
    np.testing.assert_array_equal(ps.lookup("C1", [1, 2, 3]), expected)
    ps.close()


def _torch_tables():
    from tabstream.train.torch.embeddings import EmbeddingTables

    return EmbeddingTables([TableConfig("C1", 10, 4, ("C1",)), TableConfig("C2", 10, 4, ("C2",))], sparse=False)


@pytest.mark.parametrize("kind", ["adam", "adagrad", "lazyadam", "multi"])
def test_torch_tables_reset_rows_and_optimizer_state(kind) -> None:
    from tabstream.train.torch import LazyAdam, MultiOptimizer

    torch.manual_seed(0)
    tables = _torch_tables()
    if kind == "lazyadam":
        from tabstream.train.torch.embeddings import EmbeddingTables

        tables = EmbeddingTables(tables.configs, sparse=True)
    make = {"adam": lambda p: torch.optim.Adam(p, lr=0.1),
            "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1, initial_accumulator_value=0.25),
            "lazyadam": lambda p: LazyAdam(p, lr=0.1),
            "multi": lambda p: MultiOptimizer(torch.optim.Adam, [(torch.optim.Adagrad, [tables["C1"]])],
                                              model=tables)}[kind]
    opt = make(tables.parameters()) if kind != "multi" else make(None)
    ids = torch.tensor([2, 3, 5])
    out = tables({"C1": ids, "C2": ids})
    (out["C1"].sum() + out["C2"].sum()).backward()
    opt.step()
    weight = tables["C1"].weight
    inner = opt.optimizers["0"] if kind == "multi" else opt
    state_before = {k: v.clone() for k, v in inner.state[weight].items() if torch.is_tensor(v)}
    w_before = weight.detach().clone()
    c2_before = tables["C2"].weight.detach().clone()
    assert tables.apply_vocabulary_delta({"C1": [3]}, optimizer=opt, seed=4) == {"C1": 1}
    expected = w_before.clone()
    expected[3] = torch.from_numpy(initial_rows(4, "C1", np.array([3]), 4, 0.05))
    torch.testing.assert_close(weight.detach(), expected, rtol=0, atol=0)
    torch.testing.assert_close(tables["C2"].weight.detach(), c2_before, rtol=0, atol=0)
    init = 0.25 if kind == "adagrad" else 0.0
    for key, before in state_before.items():
        after = inner.state[weight][key]
        if before.dim() == 0:
            assert torch.equal(after, before)  # step counters stay
            continue
        want = before.clone()
        want[3] = init if key == "sum" else 0.0
        if kind == "multi" and key == "sum":
            want[3] = 0.0  # MultiOptimizer's Adagrad: the default initial_accumulator_value
        torch.testing.assert_close(after, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"table 'C1': id 10 is out of range; the table has 10 rows"):
        tables.reset_rows("C1", [10])
    with pytest.raises(KeyError, match=r"no embedding table 'C9'"):
        tables.reset_rows("C9", [1])


def test_keras_tables_reset_rows_and_optimizer_slots() -> None:
    import keras
    import tensorflow as tf

    from tabstream.train.tensorflow.embeddings import EmbeddingTables
    from tabstream.train.tensorflow.optimizers import MultiOptimizer

    def multi(tables):  # C1 under an Adagrad entry of a MultiOptimizer
        return MultiOptimizer(keras.optimizers.Adam(0.1), [
            (keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25), [tables.tables["C1"]])])

    for make in (lambda t: keras.optimizers.Adam(0.1),
                 lambda t: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25), multi):
        tables = EmbeddingTables([TableConfig("C1", 10, 4, ("C1",)), TableConfig("C2", 10, 4, ("C2",))], seed=1)
        opt = make(tables)
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tables.lookup("C1", {"C1": tf.constant([3, 5])})) + \
                tf.reduce_sum(tables.lookup("C2", {"C2": tf.constant([3])}))
        variables = tables.trainable_variables
        opt.apply(tape.gradient(loss, variables), variables)
        var = tables.tables["C1"].embeddings
        slots = {v.name: v.numpy().copy() for v in opt.variables if tuple(v.shape) == (10, 4)}
        if make is multi:  # C1's Adagrad accumulator is among the MultiOptimizer's slots
            assert any(n.startswith("C1_") and "accumulator" in n for n in slots), sorted(slots)
        before = var.numpy().copy()
        assert tables.apply_vocabulary_delta({"C1": [3]}, optimizer=opt) == {"C1": 1}
        after = var.numpy()
        changed = np.flatnonzero((after != before).any(axis=1))
        assert changed.tolist() == [3] and np.abs(after[3]).max() <= 0.05
        for v in opt.variables:
            if v.name not in slots:
                continue
            want = slots[v.name].copy()
            if v.name.startswith("C1_"):
                want[3] = 0.25 if "accumulator" in v.name else 0.0
            np.testing.assert_array_equal(v.numpy(), want)


def _keras_optimizer(kind, tables):
    import keras

    from tabstream.train.tensorflow.optimizers import LazyAdam, MultiOptimizer

    if kind == "multi-ftrl":  # C1 under an Ftrl entry of a MultiOptimizer
        return MultiOptimizer(keras.optimizers.Adam(0.1), [
            (keras.optimizers.Ftrl(0.1, initial_accumulator_value=0.1), [tables.tables["C1"]])])
    return {"ftrl": lambda: keras.optimizers.Ftrl(0.1, initial_accumulator_value=0.1),
            "adamax": lambda: keras.optimizers.Adamax(0.1),
            "rmsprop-centered": lambda: keras.optimizers.RMSprop(0.1, momentum=0.5, centered=True),
            "adadelta": lambda: keras.optimizers.Adadelta(1.0),
            "adam-amsgrad": lambda: keras.optimizers.Adam(0.1, amsgrad=True),
            "adam-ema": lambda: keras.optimizers.Adam(0.1, use_ema=True, ema_momentum=0.5),
            "adagrad": lambda: keras.optimizers.Adagrad(0.1, initial_accumulator_value=0.25),
            "lazyadam": lambda: LazyAdam(0.1)}[kind]()


@pytest.mark.parametrize("kind", ["ftrl", "adamax", "rmsprop-centered", "adadelta", "adam-amsgrad",
                                  "adam-ema", "adagrad", "lazyadam", "multi-ftrl"])
def test_keras_reset_row_steps_like_a_row_never_trained(kind) -> None:
    """After reset_rows, every per-row slot of the row is what a fresh row has: one
    step on it equals one step, with the same weights and gradient, on a row the
    optimizer never saw (row 5). An EMA's average of a fresh row is its weight."""
    import tensorflow as tf

    from tabstream.train.tensorflow.embeddings import EmbeddingTables

    tables = EmbeddingTables([TableConfig("C1", 6, 2, ("C1",)), TableConfig("C2", 6, 2, ("C2",))], seed=1)
    opt = _keras_optimizer(kind, tables)
    variables = tables.trainable_variables
    var = tables.tables["C1"].embeddings

    def step(ids, scale):  # a linear loss: the gradient of each row looked up is `scale`
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tables.lookup("C1", {"C1": tf.constant(ids)}) * scale) + \
                tf.reduce_sum(tables.lookup("C2", {"C2": tf.constant(ids)}))
        opt.apply(tape.gradient(loss, variables), variables)

    step([3, 4], tf.constant([[0.5, -1.5], [2.0, 0.25]]))
    step([3, 4], tf.constant([[-1.0, 0.75], [0.5, 1.0]]))
    tables.reset_rows("C1", [3], optimizer=opt)
    if kind == "adam-ema":
        average = next(v for v in opt.variables if v.name == "C1_embeddings_average")
        np.testing.assert_array_equal(average.numpy()[3], var.numpy()[3])
    w = var.numpy()
    w[5] = w[3]
    var.assign(w)
    step([3, 5], tf.constant([[0.3, -0.7], [0.3, -0.7]]))
    np.testing.assert_allclose(var.numpy()[3], var.numpy()[5], rtol=1e-6, atol=1e-7)

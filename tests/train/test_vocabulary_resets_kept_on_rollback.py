"""A vocabulary delta applied after a checkpoint survives loading that checkpoint.

Loading a training checkpoint rolls the ParameterServer back to the version the
checkpoint was taken at. Before, that also undid a vocabulary delta applied after
it (``fit_lists``' ``on_list_end``, or between two ``fit(resume=True)`` calls): a
recycled id then kept its old value's trained row, and the server forgot the delta.
Expected rows are computed a second way: the rows read at the checkpoint, with the
reset ids replaced by ``initial_rows``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch

from tabstream.core.errors import DataError
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.pipeline.vocabulary_delta import VocabularyChanges, VocabularyDelta
from tabstream.train.cache_store import ParameterServer, initial_rows
from tabstream.train.tables import TableConfig

DIM = 4


def _delta(sequence: int, ids: list[int]) -> VocabularyDelta:
    values = pa.array([f"v{sequence}_{i}" for i in ids])
    return VocabularyDelta(sequence, {"C1": VocabularyChanges(
        ("C1",), pa.table({"id": ids, "value": values}), pa.table({"id": ids, "value": values}))})


def _server(path, storage="disk", optimizer="adagrad"):
    return ParameterServer(path, [TableConfig("C1", 10, DIM, ("C1",)), TableConfig("C2", 6, DIM, ("C2",))],
                           storage=storage, optimizer=optimizer, lr=0.3, seed=5)


def _train(ps, ids, value):
    ps.apply("C1", ids, np.full((len(ids), DIM), value, np.float32))
    ps.apply("C2", [1], np.full((1, DIM), value, np.float32))


def _expected(rows, ids):
    out = rows.copy()
    out[ids] = initial_rows(5, "C1", np.array(ids), DIM, 0.05)
    return out


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
@pytest.mark.parametrize("committed", [True, False])
def test_rollback_to_the_previous_commit_replays_the_resets(tmp_path, optimizer, committed):
    ps = _server(tmp_path / "ps", optimizer=optimizer)
    _train(ps, [1, 2, 3, 4], 0.5)
    checkpoint = ps.flush()  # a training checkpoint taken here
    at_checkpoint = ps.lookup("C1", np.arange(10))
    c2_at_checkpoint = ps.lookup("C2", np.arange(6))
    _train(ps, [2, 5], -1.0)  # trained after it: undone by the rollback
    assert ps.apply_vocabulary_delta(_delta(1, [3, 7])) == {"C1": 2}
    if committed:
        ps.flush()
        ps.rollback_to(checkpoint)
    else:
        ps.rollback_to(ps.mark)  # the checkpoint is the last commit
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(10)), _expected(at_checkpoint, [3, 7]))
    np.testing.assert_array_equal(ps.lookup("C2", np.arange(6)), c2_at_checkpoint)
    np.testing.assert_array_equal(ps.optimizer_state("C1", [3, 7]), 0)
    assert ps.vocabulary_delta == 1 and not ps.trained_since_commit
    # committed: a reopened server holds it, and the next delta follows it
    ps.close()
    ps = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(10)), _expected(at_checkpoint, [3, 7]))
    assert ps.apply_vocabulary_delta(_delta(1, [3, 7])) == {}  # applied already
    assert ps.apply_vocabulary_delta(_delta(2, [1])) == {"C1": 1}
    ps.close()


def test_a_reopened_server_replays_the_resets_of_its_last_commit(tmp_path):
    """The process dies after committing the delta; the restarted job loads the
    checkpoint taken before it."""
    ps = _server(tmp_path / "ps")
    _train(ps, [1, 2, 3], 0.25)
    checkpoint = ps.flush()
    at_checkpoint = ps.lookup("C1", np.arange(10))
    _train(ps, [3], 2.0)
    ps.apply_vocabulary_delta(_delta(1, [2]))
    ps.flush()
    ps.close()
    ps = ParameterServer.open(tmp_path / "ps")
    ps.rollback_to(checkpoint)
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(10)), _expected(at_checkpoint, [2]))
    assert ps.vocabulary_delta == 1
    ps.rollback_to(checkpoint)  # loading the same checkpoint again: the same rows
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(10)), _expected(at_checkpoint, [2]))
    ps.close()


def test_memory_server_keeps_uncommitted_resets_on_rollback_to_its_commit(tmp_path):
    ps = _server(tmp_path / "ps", storage="memory")
    _train(ps, [1, 2], 0.5)
    checkpoint = ps.flush()
    at_checkpoint = ps.lookup("C1", np.arange(10))
    _train(ps, [1], 3.0)
    ps.apply_vocabulary_delta(_delta(1, [1, 9]))
    ps.rollback_to(checkpoint)
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(10)), _expected(at_checkpoint, [1, 9]))
    assert ps.vocabulary_delta == 1
    ps.close()


def test_uncommitted_training_still_refuses_a_checkpoint_load(tmp_path):
    from tabstream.train.torch import CachedEmbeddings

    ps = _server(tmp_path / "ps")
    emb = CachedEmbeddings(ps, 4)
    state = emb.state_dict()  # commits
    ps.apply_vocabulary_delta(_delta(1, [3]))
    emb.load_state_dict(state)  # resets alone: loaded, the reset kept
    np.testing.assert_array_equal(ps.lookup("C1", [3]), initial_rows(5, "C1", np.array([3]), DIM, 0.05))
    _train(ps, [2], 1.0)
    with pytest.raises(DataError, match="holds uncommitted updates"):
        emb.load_state_dict(state)
    ps.close()


# -- the fit loops: a delta applied between file lists -------------------------

def _schema():
    def cat(name):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], properties={"domain": {"min": 0, "max": 9}})
    return Schema([cat("C1"), cat("C2"), ColumnSchema("click", "float32", tags=[Tags.TARGET])])


class _Spy:
    """Records row 4 of C1 as the server holds it when an update of it arrives."""

    def __init__(self, ps):
        self.ps, self.rows, self._apply = ps, [], ps.apply
        ps.apply = self

    def __call__(self, table, ids, grads):
        if table == "C1" and 4 in np.asarray(ids):
            self.rows.append(self.ps.lookup("C1", [4])[0].copy())
        return self._apply(table, ids, grads)


def test_torch_fit_lists_trains_the_next_list_on_the_reset_row(tmp_path):
    from tabstream.train.torch import DLRM, CachedEmbeddings, table_configs_from_schema
    from tabstream.train.torch.continuous import fit_lists

    class Day(list):
        def __init__(self, name, ids):
            super().__init__([({"C1": torch.tensor(ids), "C2": torch.tensor([0, 1])}, torch.tensor([1.0, 0.0]))])
            self.data_id = name

    schema = _schema()
    ps = ParameterServer(tmp_path / "ps", table_configs_from_schema(schema.without(["click"]), dim=8),
                         optimizer="adagrad", lr=0.5, seed=0)
    torch.manual_seed(0)
    model = DLRM(schema, embedding_dim=8, embeddings=CachedEmbeddings(ps, 10))
    spy = _Spy(ps)

    def on_list_end(position, loader, history):
        if position == 0:
            ps.apply_vocabulary_delta(_delta(1, [4]))

    fit_lists(model, [Day("mon", [4, 5]), Day("tue", [4, 6])], torch.optim.Adam(model.parameters()),
              checkpoint_dir=tmp_path / "ck", on_list_end=on_list_end, progress=False)
    assert len(spy.rows) == 2
    np.testing.assert_array_equal(spy.rows[1], initial_rows(0, "C1", np.array([4]), 8, ps.init_scale)[0])
    assert ps.vocabulary_delta == 1
    ps.close()


@pytest.mark.parametrize("flush", [False, True])
def test_keras_fit_lists_trains_the_next_list_on_the_reset_row(tmp_path, flush):
    tf = pytest.importorskip("tensorflow")
    import keras

    from tabstream.train import table_configs_from_schema
    from tabstream.train.tensorflow import DLRM, CachedEmbeddings
    from tabstream.train.tensorflow.continuous import fit_lists

    class Day(list):
        def __init__(self, name, ids):
            super().__init__([({"C1": tf.constant(ids, tf.int64), "C2": tf.constant([0, 1], tf.int64)},
                               tf.constant([1.0, 0.0]))])
            self.data_id = name

    schema = _schema()
    ps = ParameterServer(tmp_path / "ps", table_configs_from_schema(schema.without(["click"]), dim=8),
                         optimizer="adagrad", lr=0.5, seed=0)
    keras.utils.set_random_seed(0)
    model = DLRM(schema, embedding_dim=8, embeddings=CachedEmbeddings(ps, cache_rows=10), seed=0)
    spy = _Spy(ps)

    def on_list_end(position, loader, history):
        if position == 0:
            ps.apply_vocabulary_delta(_delta(1, [4]))
            if flush:
                ps.flush()

    # before, without a flush: a SchemaError that blamed the model; with one, the
    # reset was undone
    fit_lists(model, [Day("mon", [4, 5]), Day("tue", [4, 6])], keras.optimizers.Adam(1e-3),
              checkpoint_dir=tmp_path / "ck", on_list_end=on_list_end, progress=False)
    assert len(spy.rows) == 2
    np.testing.assert_array_equal(spy.rows[1], initial_rows(0, "C1", np.array([4]), 8, ps.init_scale)[0])
    assert ps.vocabulary_delta == 1
    ps.close()

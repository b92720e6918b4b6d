"""The hooks a Keras model may give ``tabstream.train.tensorflow.fit`` (what a
model-parallel wrapper or an embedding cache plugs into): they are called where
documented, and a model using them trains as the default step does."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import DLRM, LazyAdam, fit  # noqa: E402
from tabstream.train.tensorflow.fit import checkpoint_position, default_replica_step  # noqa: E402

pytestmark = [pytest.mark.tensorflow]


def schema():
    cats = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": 9}}) for n in ("C1", "C2")]
    return Schema([*cats, ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def batches(n=5):
    rng = np.random.default_rng(0)
    return [({c: tf.constant(rng.integers(0, 10, 4)) for c in ("C1", "C2")},
             tf.constant(rng.integers(0, 2, 4).astype(np.float32))) for _ in range(n)]


class Hooked(DLRM):
    """Counts each hook; its step is the default one with the gradient routed
    through the hook (as a sharded-table wrapper would)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = {"replica": 0, "before": 0, "after": 0, "checkpoint": 0}

    def fit_replica_step(self, features, labels, loss_sum, optimizer):
        self.calls["replica"] += 1  # Python side: once per trace
        return default_replica_step(self, optimizer, loss_sum, features, labels)

    def fit_before_step(self, features, labels):
        assert set(features) == {"C1", "C2"}
        self.calls["before"] += 1

    def fit_after_step(self):
        self.calls["after"] += 1

    def fit_before_checkpoint(self):
        self.calls["checkpoint"] += 1


class MemoryCheckpoints:
    """Checkpoint files kept in memory, every worker writing its own."""

    every_worker_writes = True

    def __init__(self, directory, model, optimizer):
        self.dir, self.model, self.optimizer, self.saved = directory, model, optimizer, None

    def exists(self):
        return self.saved is not None

    def needed_bytes(self):
        return 0

    def save(self, state):
        self.saved = ([np.array(w) for w in self.model.get_weights()],
                      [np.array(v.numpy()) for v in self.optimizer.variables], dict(state))

    def load(self):
        weights, slots, state = self.saved
        self.model.set_weights(weights)
        for var, value in zip(self.optimizer.variables, slots, strict=True):
            var.assign(value)
        return state


def test_hooks_are_called_and_train_as_the_default_step(tmp_path):
    plain = DLRM(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    fit(plain, batches(), LazyAdam(0.05), epochs=2, progress=False)
    hooked = Hooked(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    fit(hooked, batches(), LazyAdam(0.05), epochs=2, checkpoint_dir=tmp_path,
        checkpoint_every=2, progress=False)
    # 2 epochs of 5 steps; checkpoints at steps 2 and 4 and at each epoch's end
    assert hooked.calls == {"replica": 1, "before": 10, "after": 10, "checkpoint": 6}
    for a, b in zip(plain.get_weights(), hooked.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert checkpoint_position(tmp_path) == (2, 0)


def test_a_model_may_bring_its_own_checkpoints(tmp_path):
    store = {}

    class Own(DLRM):
        def fit_checkpoints(self, directory, optimizer):
            if "ck" not in store:
                store["ck"] = MemoryCheckpoints(directory, self, optimizer)
            store["ck"].model, store["ck"].optimizer = self, optimizer
            return store["ck"]

    data = batches(6)
    whole = DLRM(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    fit(whole, data, LazyAdam(0.05), progress=False)

    class Stop(Exception):
        pass

    def first_four():
        for i, batch in enumerate(data):
            if i == 4:
                raise Stop
            yield batch

    model = Own(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    with pytest.raises(Stop):
        fit(model, first_four(), LazyAdam(0.05), checkpoint_dir=tmp_path, checkpoint_every=3,
            progress=False)
    assert store["ck"].saved[2]["step"] == 3
    model = Own(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=7)
    fit(model, data, LazyAdam(0.05), checkpoint_dir=tmp_path, resume=True, progress=False)
    for a, b in zip(whole.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    assert not any(tmp_path.iterdir())  # nothing of the chief's files was written

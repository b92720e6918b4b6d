"""Keras' ``compile(jit_compile="auto")`` turns XLA on when a GPU is visible, and XLA
drops the tables' id check: tabstream's Keras models with categorical features
resolve "auto" to False, while an explicit ``jit_compile=True`` is still taken
(documented as skipping the check). No GPU here: the resolution is tested with a
GPU listed by a stand-in ``tf.config.list_physical_devices``, and the check itself
on CPU with jit_compile False and True."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import categorical, retrieval_data  # noqa: E402

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import DCN, DLRM, LazyAdam, TwoTower, WideAndDeep  # noqa: E402

pytestmark = pytest.mark.tensorflow

SCHEMA = Schema([categorical("C1", 1000), categorical("C2", 20),
                 ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                 ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])


@pytest.fixture
def a_gpu_is_listed(monkeypatch):
    real = tf.config.list_physical_devices
    gpu = tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")

    def listed(device_type=None):
        found = real(device_type)
        return found + [gpu] if device_type in (None, "GPU") else found

    monkeypatch.setattr(tf.config, "list_physical_devices", listed)


def models():
    schema, _, _ = retrieval_data(seed=0, rows=8)
    return [DLRM(SCHEMA, embedding_dim=8, seed=0), DCN(SCHEMA, seed=0),
            WideAndDeep(SCHEMA, seed=0), TwoTower(schema, tower=(8,), seed=0)]


def test_auto_resolves_to_no_xla_for_models_with_id_checked_tables(a_gpu_is_listed):
    plain = keras.Sequential([keras.layers.Dense(1)])
    plain.compile(optimizer="sgd", loss="mse")
    assert plain.jit_compile is True  # what Keras' "auto" gives where a GPU is listed
    for model in models():
        assert model.jit_compile is False, type(model).__name__  # uncompiled: predict's setting
        model.compile(optimizer=LazyAdam(), loss=None if isinstance(model, TwoTower) else "mse")
        assert model.jit_compile is False, type(model).__name__
        model.compile(optimizer=LazyAdam(), jit_compile=True)  # explicit: taken, no id check
        assert model.jit_compile is True, type(model).__name__


def bad_ids_dataset():
    rng = np.random.default_rng(0)
    n = 32
    features = {"C1": np.full(n, 5000), "C2": rng.integers(0, 20, n),
                "I1": rng.standard_normal(n).astype(np.float32)}
    labels = rng.integers(0, 2, n).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(16)


def compiled(jit_compile):
    model = DLRM(SCHEMA, embedding_dim=8, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    kwargs = {} if jit_compile == "auto" else {"jit_compile": jit_compile}
    model.compile(optimizer=LazyAdam(), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  **kwargs)
    return model


@pytest.mark.parametrize("jit_compile", ["auto", False])
def test_the_id_check_runs_by_default_and_without_xla(jit_compile, a_gpu_is_listed):
    # with a GPU listed, Keras alone would compile "auto" with XLA (on this CPU)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"categorical feature .+C1.+: id.+5000.+is outside embedding table"):
        compiled(jit_compile).fit(bad_ids_dataset(), epochs=1, verbose=0, shuffle=False)


def test_explicit_xla_skips_the_id_check_as_documented():
    history = compiled(True).fit(bad_ids_dataset(), epochs=1, verbose=0, shuffle=False)
    assert np.isfinite(history.history["loss"][-1])

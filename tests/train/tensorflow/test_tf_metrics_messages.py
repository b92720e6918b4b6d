"""What new Keras users meet first: ``LogLoss`` is the mean over rows (however the
rows are split into batches, and on a dataset of unknown length), ``EmbeddingTables``
names every list layout it takes, and Keras' own ``model.fit`` under
``MultiWorkerMirroredStrategy`` says at once that ``tabstream.train.tensorflow.fit``
is the way."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    EmbeddingTables,
    LogLoss,
    TableConfig,
    binary_classification_metrics,
)

pytestmark = [pytest.mark.tensorflow]
ROOT = Path(__file__).resolve().parents[3]


def numpy_log_loss(y, z, w=None, from_logits=True):
    y, z = np.asarray(y, np.float64).reshape(-1), np.asarray(z, np.float64).reshape(-1)
    if from_logits:
        per_row = np.logaddexp(0.0, z) - y * z
    else:
        p = np.clip(z, 1e-7, 1 - 1e-7)
        per_row = -(y * np.log(p) + (1 - y) * np.log(1 - p))
    w = np.ones_like(per_row) if w is None else np.asarray(w, np.float64).reshape(-1)
    return float((per_row * w).sum() / w.sum())


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("from_logits", [True, False])
def test_logloss_is_the_mean_over_rows_however_batched(seed, from_logits):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 11).astype(np.float32)
    z = (rng.normal(size=11) * 2 if from_logits else rng.random(11)).astype(np.float32)
    w = rng.random(11).astype(np.float32)
    once = LogLoss(from_logits=from_logits)
    once.update_state(y, z)
    parts = LogLoss(from_logits=from_logits)
    parts.update_state(y[:2], z[:2, None])      # [B, 1] predictions, [B] labels
    parts.update_state(y[2:, None], z[2:])      # and the reverse
    parts.update_state(y[:0], z[:0])            # an empty batch counts nothing
    expected = numpy_log_loss(y, z, from_logits=from_logits)
    assert float(once.result()) == pytest.approx(expected, rel=1e-6)
    assert float(parts.result()) == pytest.approx(expected, rel=1e-6)
    weighted = LogLoss(from_logits=from_logits)
    weighted.update_state(y[:4], z[:4], sample_weight=w[:4])
    weighted.update_state(y[4:], z[4:], sample_weight=w[4:])
    assert float(weighted.result()) == pytest.approx(
        numpy_log_loss(y, z, w, from_logits=from_logits), rel=1e-6)
    once.reset_state()
    assert float(once.result()) == 0.0


# Keras' own notice when a dataset of unknown length ends (it then stops the loop)
@pytest.mark.filterwarnings("ignore:Your input ran out of data:UserWarning")
def test_logloss_of_keras_evaluate_on_a_dataset_of_unknown_length():
    from tabstream.core.schema import ColumnSchema, Schema, Tags

    schema = Schema([ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                                  properties={"domain": {"min": 0, "max": 9}}) for n in ("C1", "C2")]
                    + [ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    rng = np.random.default_rng(3)
    ids = {n: rng.integers(0, 10, 23) for n in ("C1", "C2")}
    labels = rng.integers(0, 2, 23).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((ids, labels))
    data = data.filter(lambda f, y: True).batch(5)   # 5 batches, the last of 3 rows
    assert int(data.cardinality()) == int(tf.data.UNKNOWN_CARDINALITY)
    model = DLRM(schema, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    model.compile(keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=binary_classification_metrics())
    results = model.evaluate(data, verbose=0, return_dict=True)
    logits = np.asarray(model({n: tf.constant(v) for n, v in ids.items()})).reshape(-1)
    assert results["logloss"] == pytest.approx(numpy_log_loss(labels, logits), rel=1e-5)


@pytest.mark.parametrize("shape", [(2, 3), (2, 2, 3)])
def test_a_dense_list_without_a_mask_names_every_accepted_form(shape):
    tables = EmbeddingTables([TableConfig("tags", 10, 4, ("tags",), is_list=True)])
    ids = tf.zeros(shape, tf.int64)
    with pytest.raises(ValueError, match=(
            rf"list feature 'tags' arrived as .*{shape[0]}, {shape[1]}.* without a mask.*"
            r"\(padded, mask\), both \[B, L\] .* or both \[B, F, L\] \(lists of lists\).*"
            r"'tags__mask'.*\(values, offsets\).*'tags__values' and 'tags__offsets'.*"
            r"RaggedTensor.*SparseTensor")):
        tables({"tags": ids})


def test_each_form_named_is_accepted():
    """The forms the message names all work, and pool to the same vectors."""
    tables = EmbeddingTables([TableConfig("tags", 10, 4, ("tags",), is_list=True)])
    padded = tf.constant([[1, 2, 0], [3, 0, 0]], tf.int64)
    mask = tf.constant([[1, 1, 0], [1, 0, 0]])
    values, offsets = tf.constant([1, 2, 3], tf.int64), tf.constant([0, 2, 3], tf.int64)
    forms = [{"tags": (padded, mask)}, {"tags": padded, "tags__mask": mask},
             {"tags": (values, offsets)}, {"tags__values": values, "tags__offsets": offsets},
             {"tags": tf.RaggedTensor.from_row_splits(values, offsets)},
             {"tags": tf.RaggedTensor.from_row_splits(values, offsets).to_sparse()}]
    outs = [np.asarray(tables(f)["tags"]) for f in forms]
    table = np.asarray(tables.table_for("tags").embeddings.numpy())
    for out in outs:  # the default combiner sums: rows 1 + 2, and row 3, by numpy
        np.testing.assert_allclose(out, [table[1] + table[2], table[3]], rtol=1e-6)
    three = tables({"tags": (tf.reshape(padded, [2, 1, 3]), tf.reshape(mask, [2, 1, 3]))})["tags"]
    np.testing.assert_allclose(np.asarray(three)[:, 0], outs[0], rtol=1e-6)


def test_keras_fit_under_multi_worker_mirrored_strategy_names_tabstream_fit(tmp_path):
    # A one-worker MultiWorkerMirroredStrategy runs in one process; it must be created
    # before TensorFlow runs anything, hence a fresh interpreter.
    script = textwrap.dedent("""
        import keras, tensorflow as tf
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        from tabstream.core.schema import ColumnSchema, Schema, Tags
        from tabstream.train.tensorflow import DLRM, LazyAdam, fit
        schema = Schema([ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                                      properties={"domain": {"min": 0, "max": 9}})
                         for n in ("C1", "C2")] + [ColumnSchema("click", "float32", tags=[Tags.TARGET])])
        ids = tf.constant([1, 2], tf.int64)
        data = tf.data.Dataset.from_tensors(({"C1": ids, "C2": ids},
                                             tf.constant([1.0, 0.0]))).repeat(2)
        with strategy.scope():
            model = DLRM(schema, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
            model.compile(LazyAdam(0.01), loss=keras.losses.BinaryCrossentropy(from_logits=True))
        try:
            model.fit(data, epochs=1, verbose=0)
        except RuntimeError as exc:
            print("REFUSED:", exc)
        with strategy.scope():
            optimizer = LazyAdam(0.01)
        history = fit(model, list(data), optimizer, progress=False, strategy=strategy)
        print("TRAINED:", history["samples"])
    """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3", OMP_NUM_THREADS="1")
    env.pop("TF_CONFIG", None)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("REFUSED: DLRM.fit (Keras' own training loop) does not run under "
            "tf.distribute.MultiWorkerMirroredStrategy in Keras 3. Train with "
            "tabstream.train.tensorflow.fit(model, loader, optimizer, strategy=strategy)"
            ) in done.stdout, done.stdout + done.stderr[-3000:]
    assert "TRAINED: [4]" in done.stdout  # the way it names works on that strategy


def test_repeated_fit_and_evaluate_do_not_retrace(caplog):
    """Each epoch's validation and each fit (one per file list in fit_lists) reuse
    the model's compiled functions: TensorFlow logs no retracing warning, and the
    model trains as before (the same weights as one fit of all the epochs)."""
    import logging

    from tabstream.core.schema import ColumnSchema, Schema, Tags
    from tabstream.train.tensorflow import LazyAdam, evaluate, fit

    schema = Schema([ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                                  properties={"domain": {"min": 0, "max": 9}}) for n in ("C1", "C2")]
                    + [ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    rng = np.random.default_rng(5)
    data = [({n: tf.constant(rng.integers(0, 10, 4)) for n in ("C1", "C2")},
             tf.constant(rng.integers(0, 2, 4).astype(np.float32))) for _ in range(2)]

    def build():
        return DLRM(schema, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0), LazyAdam(0.05)

    whole, opt = build()
    fit(whole, data, opt, epochs=7, progress=False)
    model, opt = build()
    with caplog.at_level(logging.WARNING, logger="tensorflow"):
        for _ in range(7):
            fit(model, data, opt, valid_loader=data, progress=False)
            evaluate(model, data)
    assert not [r for r in caplog.records if "retracing" in r.getMessage()]
    for a, b in zip(whole.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

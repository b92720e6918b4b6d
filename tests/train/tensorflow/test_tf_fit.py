import importlib

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import ranking_data, roc_auc  # noqa: E402

# the module (the package's attribute ``fit`` is the function)
fit_module = importlib.import_module("tabstream.train.tensorflow.fit")
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    LazyAdam,
    LogLoss,
    ThroughputCallback,
    binary_classification_metrics,
)


def numpy_logloss(labels, logits):
    p = 1.0 / (1.0 + np.exp(-logits.reshape(-1).astype(np.float64)))
    p = np.clip(p, 1e-7, 1 - 1e-7)
    y = labels.reshape(-1)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


@pytest.mark.slow
def test_fit_reports_auc_logloss_and_throughput(capsys):
    schema, features, labels, _ = ranking_data(seed=1, rows=3_000)

    def data(rows, batch):
        # the list column arrives ragged, as a loader may deliver it
        sliced = {k: tf.constant(v[rows]) for k, v in features.items()}
        sliced["tags"] = tf.RaggedTensor.from_tensor(sliced["tags"], padding=0)
        return tf.data.Dataset.from_tensor_slices((sliced, labels[rows])).ragged_batch(batch)

    model = DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(16,), seed=0)
    model.compile(
        optimizer=LazyAdam(0.01),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=binary_classification_metrics(),
    )
    throughput = ThroughputCallback(batch_size=250)
    valid = slice(2_000, None)
    history = model.fit(
        data(slice(0, 2_000), 250),
        validation_data=data(valid, 500),
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[throughput],
    )
    h = history.history
    for key in ("loss", "auc", "logloss", "val_loss", "val_auc", "val_logloss", "samples_per_sec"):
        assert len(h[key]) == 2, key
    assert h["samples_per_sec"] == throughput.samples_per_sec
    assert all(rate > 0 for rate in h["samples_per_sec"])
    assert capsys.readouterr().out.count("samples/s") == 2
    # The validation metrics are those of the final weights: recompute them from predictions.
    logits = model.predict(data(valid, 500), verbose=0)
    assert h["val_logloss"][-1] == pytest.approx(numpy_logloss(labels[valid], logits), rel=1e-4)
    assert h["val_auc"][-1] == pytest.approx(roc_auc(labels[valid], logits), abs=0.01)


class FakeClock:
    def __init__(self, times):
        self.times = list(times)

    def __call__(self):
        return self.times.pop(0)


def test_throughput_counts_batches_between_epoch_start_and_last_batch(monkeypatch):
    callback = ThroughputCallback(batch_size=100, verbose=0)
    monkeypatch.setattr(fit_module.time, "perf_counter", FakeClock([10.0, 11.0, 12.0, 14.0]))
    callback.on_epoch_begin(0)
    for step in range(3):
        callback.on_train_batch_end(step)
    logs = {}
    callback.on_epoch_end(0, logs)  # validation time after the last batch is not counted
    assert logs["samples_per_sec"] == pytest.approx(300 / 4.0)

    exact = ThroughputCallback(num_samples=250, verbose=0)
    monkeypatch.setattr(fit_module.time, "perf_counter", FakeClock([0.0, 2.0, 5.0]))
    exact.on_epoch_begin(0)
    exact.on_train_batch_end(0)
    exact.on_train_batch_end(1)  # batch size unknown: the epoch's rows are given
    exact.on_epoch_end(0, {})
    assert exact.samples_per_sec == [pytest.approx(50.0)]


def test_throughput_callback_needs_a_sample_count():
    with pytest.raises(ValueError, match="needs batch_size or num_samples"):
        ThroughputCallback()
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        ThroughputCallback(batch_size=0)


@pytest.mark.parametrize("label_shape", [(6,), (6, 1)])
def test_logloss_accepts_flat_or_column_labels(label_shape):
    labels = np.array([0, 1, 1, 0, 1, 0], np.float32)
    logits = np.array([-2.0, 1.5, 0.2, 0.3, 3.0, -0.1], np.float32).reshape(6, 1)
    metric = LogLoss()
    metric.update_state(labels.reshape(label_shape), logits)
    assert float(metric.result()) == pytest.approx(numpy_logloss(labels, logits), rel=1e-5)
    auc = keras.metrics.AUC(from_logits=True, num_thresholds=2001)
    auc.update_state(labels.reshape(label_shape), logits)
    assert float(auc.result()) == pytest.approx(roc_auc(labels, logits), abs=1e-3)

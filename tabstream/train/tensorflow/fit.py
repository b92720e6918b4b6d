"""Keras ``fit`` helpers: binary-classification metrics for logit models and a
callback that measures training throughput.

>>> model.compile(optimizer, loss=keras.losses.BinaryCrossentropy(from_logits=True),
...               metrics=binary_classification_metrics())
>>> history = model.fit(train, validation_data=valid, epochs=2,
...                     callbacks=[ThroughputCallback(batch_size=8192)])
>>> history.history["samples_per_sec"]            # one value per epoch
[412345.6, 498765.4]
"""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf

__all__ = ["LogLoss", "ThroughputCallback", "binary_classification_metrics"]


@keras.saving.register_keras_serializable(package="tabstream")
class LogLoss(keras.metrics.BinaryCrossentropy):
    """Mean binary cross-entropy that accepts labels ``[B]`` with predictions ``[B, 1]``
    (and the reverse); ``keras.metrics.BinaryCrossentropy`` requires equal ranks."""

    def __init__(self, name: str = "logloss", from_logits: bool = True, **kwargs: Any) -> None:
        super().__init__(name=name, from_logits=from_logits, **kwargs)

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        y_pred = tf.convert_to_tensor(y_pred)
        y_true = tf.reshape(tf.cast(y_true, y_pred.dtype), tf.shape(y_pred))
        if sample_weight is not None:
            sample_weight = tf.reshape(sample_weight, tf.shape(y_pred)[:1])
        super().update_state(y_true, y_pred, sample_weight=sample_weight)


def binary_classification_metrics(from_logits: bool = True) -> list[keras.metrics.Metric]:
    """``[AUC(name="auc"), LogLoss(name="logloss")]`` for models that output logits
    (the bundled ranking models do); ``from_logits=False`` for probabilities."""
    return [
        keras.metrics.AUC(from_logits=from_logits, name="auc"),
        LogLoss(from_logits=from_logits),
    ]


class ThroughputCallback(keras.callbacks.Callback):
    """Training samples per second, per epoch.

    Time runs from the start of the epoch to the end of its last training batch
    (validation excluded). Samples are ``num_samples`` when given (the rows of one
    epoch), else ``batches * batch_size`` (which counts a short last batch as full).
    Each epoch's value goes to ``logs["samples_per_sec"]`` (so into
    ``History.history``), to ``self.samples_per_sec`` and, with ``verbose``, to stdout.
    """

    def __init__(
        self, batch_size: int | None = None, num_samples: int | None = None, verbose: int = 1
    ) -> None:
        super().__init__()
        if batch_size is None and num_samples is None:
            raise ValueError("ThroughputCallback needs batch_size or num_samples to count samples")
        for label, value in (("batch_size", batch_size), ("num_samples", num_samples)):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"ThroughputCallback: {label} must be a positive int, got {value!r}")
        self.batch_size = batch_size
        self.num_samples = num_samples
        self.verbose = verbose
        self.samples_per_sec: list[float] = []
        self._start = 0.0
        self._last = 0.0
        self._batches = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._start = self._last = time.perf_counter()
        self._batches = 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # ``batch`` is the epoch's step index (the last one of an execution when
        # steps_per_execution > 1, where this is called once per execution).
        self._batches = batch + 1
        self._last = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._batches == 0:
            return
        if self.num_samples is not None:
            samples = self.num_samples
        else:
            samples = self._batches * int(self.batch_size or 0)
        elapsed = max(self._last - self._start, 1e-9)
        rate = samples / elapsed
        self.samples_per_sec.append(rate)
        if logs is not None:
            logs["samples_per_sec"] = rate
        if self.verbose:
            print(f"epoch {epoch + 1}: {samples} samples in {elapsed:.2f} s, {rate:,.0f} samples/s")

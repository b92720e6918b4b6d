"""Training Keras models: :func:`fit`, a custom loop that also runs data-parallel
under ``tf.distribute`` strategies, and helpers for Keras' own ``model.fit``
(binary-classification metrics for logit models, a throughput callback).

>>> import keras
>>> import tensorflow as tf
>>> from tabstream.core.schema import ColumnSchema, Schema, Tags
>>> def categorical(name, n):
...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
...                         properties={"domain": {"min": 0, "max": n - 1}})
>>> schema = Schema([categorical("C1", 200_000), categorical("C2", 50),
...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
...                  ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])
>>> features = {"C1": tf.constant([3, 199_999, 3, 42], tf.int64),
...             "C2": tf.constant([0, 7, 49, 7], tf.int64), "I1": tf.constant([0.5, -1.0, 2.0, 0.0])}
>>> labels = tf.constant([1.0, 0.0, 1.0, 0.0])
>>> train = tf.data.Dataset.from_tensors((features, labels)).repeat(4)   # or the tabstream loader
>>> keras.utils.set_random_seed(0)
>>> import tempfile
>>> from tabstream.train.tensorflow import DLRM, LazyAdam
>>> ckpt = tempfile.TemporaryDirectory()
>>> model = DLRM(schema, embedding_dim=8)
>>> history = fit(model, train, LazyAdam(1e-2), epochs=2, valid_loader=train,
...               checkpoint_dir=ckpt.name, progress=False)
>>> history["epoch"], len(history["val_auc"])      # val_auc: exact AUC over every validation row
([1, 2], 2)
>>> history["val_loss"][1] < history["val_loss"][0]
True
>>> ckpt.cleanup()

Keras 3's ``model.fit`` does not run under ``MultiWorkerMirroredStrategy`` (it fails
converting ``PerReplica`` values; the bundled models refuse it at once, naming
:func:`fit`); :func:`fit` does (see ``docs/keras-distributed.md``). It is the same
loop as torch's (:mod:`tabstream.train.loop`); this module holds the Keras step,
checkpoint files and collectives.
Keras' own loop works on one process:

>>> model = DLRM(schema, embedding_dim=8)
>>> model.compile(LazyAdam(1e-2), loss=keras.losses.BinaryCrossentropy(from_logits=True),
...               metrics=binary_classification_metrics())
>>> history = model.fit(train, validation_data=train, epochs=2, verbose=0, shuffle=False,
...                     callbacks=[ThroughputCallback(batch_size=4)])
epoch 1: 16 samples in ... s, ... samples/s
epoch 2: 16 samples in ... s, ... samples/s
>>> len(history.history["samples_per_sec"])       # one value per epoch
2
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import weakref
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.jsonfile import read_json_file
from tabstream.train.checks import (
    CheckpointError,
    check_checkpoint_dir,
    checkpoint_write,
    label_error,
    label_name,
)
from tabstream.train.loop import LoopOptions, NonFiniteLossError, NothingToTrainWarning, Step
from tabstream.train.loop import run as run_loop
from tabstream.train.metrics import log_loss, roc_auc
from tabstream.train.tensorflow.embeddings import ID_CHECK_MARK
from tabstream.train.tensorflow.optimizers import sum_repeated_ids

__all__ = [
    "CheckpointError",
    "LogLoss",
    "NonFiniteLossError",
    "NothingToTrainWarning",
    "ThroughputCallback",
    "binary_classification_metrics",
    "check_checkpoint_format",
    "checkpoint_position",
    "default_replica_step",
    "evaluate",
    "fit",
]


@keras.saving.register_keras_serializable(package="tabstream")
class LogLoss(keras.metrics.Metric):
    """Binary cross-entropy averaged over every row seen (not over batch means):
    ``sum over rows of w * bce / sum of w``. Labels ``[B]`` or ``[B, 1]``,
    predictions either shape (logits by default, ``from_logits=False`` for
    probabilities); a batch of 0 rows (the end of a dataset of unknown length)
    changes nothing.

    >>> m = LogLoss()
    >>> m.update_state([1.0, 0.0, 1.0], [[0.0], [0.0], [2.0]])
    >>> m.update_state([0.0], [-1.0])
    >>> round(float(m.result()), 4)       # the mean over the 4 rows
    0.4566
    """

    def __init__(self, name: str = "logloss", from_logits: bool = True, **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.from_logits = from_logits
        self.total = self.add_variable(shape=(), initializer="zeros", dtype="float64", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", dtype="float64", name="count")

    def update_state(self, y_true: Any, y_pred: Any, sample_weight: Any = None) -> None:
        z = tf.reshape(tf.cast(tf.convert_to_tensor(y_pred), tf.float64), [-1])
        y = tf.reshape(tf.cast(tf.convert_to_tensor(y_true), tf.float64), [-1])
        if self.from_logits:  # log(1 + e^z) - y z, without overflow
            per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z)
        else:
            eps = keras.config.epsilon()
            p = tf.clip_by_value(z, eps, 1.0 - eps)
            per_row = -(y * tf.math.log(p) + (1.0 - y) * tf.math.log(1.0 - p))
        if sample_weight is None:
            weight = tf.ones_like(per_row)
        else:
            weight = tf.reshape(tf.cast(tf.convert_to_tensor(sample_weight), tf.float64), [-1])
            weight = tf.broadcast_to(weight, tf.shape(per_row))
        self.total.assign_add(tf.reduce_sum(per_row * weight))
        self.count.assign_add(tf.reduce_sum(weight))

    def result(self) -> tf.Tensor:
        return tf.cast(tf.math.divide_no_nan(self.total, self.count), tf.float32)

    def reset_state(self) -> None:
        self.total.assign(0.0)
        self.count.assign(0.0)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "from_logits": self.from_logits}


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


# -- the custom training loop -------------------------------------------------

CHECKPOINT_PREFIX = "checkpoint"
_FORMAT = 1  # of checkpoint.json; a newer one is refused (check_checkpoint_format), as torch's


def check_checkpoint_format(state: Any, path: Path) -> dict[str, Any]:
    """``state`` read from ``path`` (``checkpoint.json``, or a HybridParallel
    worker's ``state.json``) when it is a checkpoint state of the format this
    tabstream writes; else a :class:`DataError` saying
    whose it is and what to do (a newer tabstream's: upgrade)."""
    found = state.get("format") if isinstance(state, dict) else type(state).__name__
    if isinstance(state, dict) and found == _FORMAT and not isinstance(found, bool):
        return state
    if isinstance(found, int) and not isinstance(found, bool) and found > _FORMAT:
        raise DataError(f"fit: {path} is a checkpoint of format {found}, written by a newer "
                        f"tabstream; this tabstream reads format {_FORMAT}: upgrade tabstream to "
                        "resume from it, or start over with resume=False in another checkpoint_dir",
                        hint="upgrade tabstream, or start over with resume=False")
    raise DataError(f"fit: {path} is not a tabstream Keras checkpoint state (format {found!r}, "
                    f"expected {_FORMAT}); remove it, or start over with resume=False",
                    hint="start over with resume=False")


LossFn = Callable[[tf.Tensor, tf.Tensor], tf.Tensor]


def _binary_crossentropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """Per-row binary cross-entropy from logits, ``[B]``."""
    logits = tf.reshape(logits, [-1])
    labels = tf.cast(tf.reshape(labels, [-1]), logits.dtype)
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)


def _has_own_loss(model: Any) -> bool:
    return getattr(type(model), "compute_loss", keras.Model.compute_loss) is not \
        keras.Model.compute_loss


def _unpack(batch: Any, where: str) -> tuple[Any, Any]:
    if isinstance(batch, tuple) and len(batch) == 2 and isinstance(batch[0], dict):
        return batch
    if isinstance(batch, dict):
        return batch, None
    raise TypeError(
        f"{where}: each batch must be (features dict, labels) or a features dict, got "
        f"{type(batch).__name__}"
    )


def _one_target(labels: Any) -> Any:
    """Labels of one target given as a dict come out as that target's tensor (as
    torch's ``fit`` does); a dict of several targets stays a dict (for a
    ``loss_fn`` that takes it)."""
    if isinstance(labels, dict) and len(labels) == 1:
        return next(iter(labels.values()))
    return labels


def _refuse_several_targets(labels: Any, where: str) -> None:
    """The default losses (binary cross-entropy, a model's ``compute_loss``) take
    one target; say what to pass for several."""
    if isinstance(labels, dict):
        raise TypeError(
            f"{where}: labels is a dict of {len(labels)} targets {sorted(labels)}; pass a "
            "loss_fn that takes (logits, labels dict)"
        )


LOSS_SHAPE_MARK = "loss_fn returned"


def summed_loss(loss: Any, rows: tf.Tensor, where: str = "fit") -> tf.Tensor:
    """The summed loss of a batch of ``rows`` rows from what a ``loss_fn`` returned:
    a scalar is the batch mean (times ``rows``), a ``[rows]`` (or ``[rows, 1]``) tensor
    one loss per row (summed); another shape is refused (when tracing, or at the step for a length
    known only then). The loop divides the sum by the rows, so each row weighs the
    same either way.

    >>> float(summed_loss(tf.constant([1.0, 2.0, 6.0]), 3)), float(summed_loss(tf.constant(3.0), 3))
    (9.0, 9.0)
    """
    loss = tf.convert_to_tensor(loss)
    rank = loss.shape.rank
    if rank == 2 and loss.shape[1] == 1:  # [B, 1]: one loss per row, as column labels give
        loss, rank = tf.reshape(loss, [-1]), 1
    if rank == 0:
        return loss * tf.cast(rows, loss.dtype)
    if rank == 1:
        n = loss.shape[0]
        static_rows = tf.get_static_value(rows)
        if n is not None and static_rows is not None and n != int(static_rows):
            raise ValueError(_loss_shape_message(where, list(loss.shape), int(static_rows)))
        check = tf.debugging.assert_equal(
            tf.shape(loss)[0], tf.cast(rows, tf.int32),
            message=f"{where}: {LOSS_SHAPE_MARK} one value per row for a batch of another "
            "number of rows; return a scalar (the batch mean) or one loss per row, shape [B]")
        with tf.control_dependencies([check]):
            return tf.reduce_sum(loss)
    shape = "of unknown rank" if rank is None else f"of shape {list(loss.shape)}"
    raise ValueError(f"{where}: {LOSS_SHAPE_MARK} a tensor {shape}; return a scalar (the "
                     "batch mean) or one loss per row, shape [B]")


def _loss_shape_message(where: str, shape: list[Any], rows: int) -> str:
    return (f"{where}: {LOSS_SHAPE_MARK} a tensor of shape {shape} for a batch of {rows} rows; "
            f"return a scalar (the batch mean) or one loss per row, shape [{rows}]")


def _per_row(loss: Any, rows: int, where: str) -> np.ndarray:
    """``[rows]`` per-row losses from what a ``loss_fn`` returned (eagerly): a
    scalar batch mean stands for each of the rows."""
    value = np.asarray(tf.convert_to_tensor(loss).numpy(), np.float64)
    if value.ndim == 2 and value.shape[1] == 1:  # [B, 1]: one loss per row
        value = value[:, 0]
    if value.ndim == 0:
        return np.full(rows, float(value))
    if value.ndim == 1 and value.shape[0] == rows:
        return value
    raise ValueError(_loss_shape_message(where, list(value.shape), rows))


def batch_rows(features: Any, labels: Any) -> tf.Tensor:
    if isinstance(labels, dict):  # several targets: each holds one value per row
        labels = next(iter(labels.values()), None)
    if labels is not None:
        return tf.shape(tf.reshape(labels, [-1]))[0]
    first = next(iter(features.values()))
    if isinstance(first, tuple):  # (values, offsets) or (padded, mask)
        return tf.shape(first[1])[0] - (1 if first[1].shape.rank == 1 else 0)
    return tf.shape(first)[0]


def _open_spec(structure: Any) -> Any:
    """``tf.TensorSpec`` of each tensor in ``structure``, every dimension ``None``."""
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), structure
    )


def _worker(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """(this worker's index, number of workers); (0, 1) without a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0, 1
    jobs = resolver.cluster_spec().as_dict()
    chiefs = len(jobs.get("chief", []))
    workers = chiefs + len(jobs.get("worker", []))
    if resolver.task_type == "chief":
        return 0, workers
    return chiefs + int(resolver.task_id), workers


def _check_strategy(model: Any, strategy: tf.distribute.Strategy) -> None:
    for var in model.trainable_variables:
        value = getattr(var, "value", var)
        if not strategy.extended.variable_created_in_scope(value):
            raise ValueError(
                f"fit: variable {var.path!r} of {type(model).__name__} was not created under "
                f"the strategy {type(strategy).__name__} given to fit; create the model (and "
                "the optimizer) inside `with strategy.scope():`, or leave it unbuilt and "
                "fit builds it there"
            )


_COMPILED: weakref.WeakKeyDictionary[Any, dict[str, tuple[Any, Any]]] = weakref.WeakKeyDictionary()


def _compiled(owner: Any, kind: str, key: Any, make: Callable[[], Any]) -> Any:
    """The compiled function ``make()`` of ``owner`` (a model or a strategy) for
    ``kind``, kept while ``owner`` lives and reused while ``key`` stays the same: a
    new ``fit`` or ``evaluate`` on the same model (each epoch's validation, each
    file list of ``fit_lists``) does not trace again, and TensorFlow warns of no
    retracing. One per kind and owner (the last key), so nothing piles up. The
    functions refer to their owner weakly (a reference from the value to the key
    would keep both alive for ever)."""
    per_owner = _COMPILED.setdefault(owner, {})
    found = per_owner.get(kind)
    if found is not None and found[0] == key:
        return found[1]
    fn = make()
    per_owner[kind] = (key, fn)
    return fn


def _spec_key(structure: Any) -> str:
    return repr(_open_spec(structure))


def _all_sum(strategy: tf.distribute.Strategy) -> Any:
    """A function summing a 1-D float64 tensor over the workers (one replica each).
    One per strategy, traced once for every length (the validation gather calls it
    with buffers of every size: no retracing)."""
    ref = weakref.ref(strategy)

    def make() -> Any:
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)])
        def all_sum(x: tf.Tensor) -> tf.Tensor:
            here = ref()
            per_replica = here.run(tf.identity, args=(x,))
            return here.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

        return all_sum

    return _compiled(strategy, "all_sum", None, make)


def _sum_over_workers(strategy: tf.distribute.Strategy, values: Any) -> np.ndarray:
    return _all_sum(strategy)(tf.constant(np.asarray(values, np.float64).reshape(-1))).numpy()


def _id_error(exc: tf.errors.InvalidArgumentError) -> DataError | None:
    """The DataError for an id outside its table that the in-graph check
    (:func:`~tabstream.train.tensorflow.embeddings.check_ids`) raised, else None."""
    text = exc.message if isinstance(exc.message, str) else str(exc)
    if ID_CHECK_MARK not in text:
        return None
    found = re.search(r"assertion failed: \[(.*?)\] \[(-?\d+)\] \[(.*?)\]\s*(?:\n|\[\[|$)",
                      text, re.S)
    if found is None:
        return DataError(text.strip().splitlines()[0])
    head, value, tail = (g.replace("\\'", "'") for g in found.groups())
    return DataError(f"{head} {value} {tail}")


def _loss_shape_error(exc: tf.errors.InvalidArgumentError) -> ValueError | None:
    """The ValueError for a ``loss_fn`` result of the wrong length that
    :func:`summed_loss`'s in-graph check raised, else None."""
    text = exc.message if isinstance(exc.message, str) else str(exc)
    found = re.search(r"(\w+: " + LOSS_SHAPE_MARK + r".*?shape \[B\])", text)
    return ValueError(found.group(1)) if found else None


def _gather_rows(strategy: tf.distribute.Strategy, arrays: list[np.ndarray]) -> list[np.ndarray]:
    """Concatenate 1-D float arrays of every worker, worker 0 first; the same on
    every worker. Workers may hold different numbers of rows: each puts its rows at
    its own offset of a zero buffer and one all-reduce (sum) assembles the whole."""
    rank, workers = _worker(strategy)
    if workers == 1:
        return arrays

    mine = np.zeros(workers, np.float64)
    mine[rank] = len(arrays[0])
    counts = _sum_over_workers(strategy, mine).round().astype(np.int64)
    offsets = np.r_[0, np.cumsum(counts)]
    out = []
    for array in arrays:
        buffer = np.zeros(int(offsets[-1]), np.float64)
        buffer[offsets[rank]:offsets[rank + 1]] = array
        out.append(_sum_over_workers(strategy, buffer).astype(np.float32))
    return out


def evaluate(
    model: Any,
    loader: Iterable[Any],
    loss_fn: LossFn | None = None,
    strategy: tf.distribute.Strategy | None = None,
) -> dict[str, float]:
    """``{"loss", "log_loss", "auc"}`` of a model over every row of ``loader``,
    all workers' rows together under a multi-worker ``strategy`` (the same numbers on
    every worker). AUC and log-loss are exact (:mod:`tabstream.train.metrics`) and
    score the model's logits, or for a model with its own loss and a
    ``row_logits(features)`` (``TwoTower``: each row's own user-item score) those;
    ``loss`` is ``loss_fn``'s mean over the rows (binary cross-entropy by default;
    the model's ``compute_loss``, a batch mean, for such a model), as :func:`fit`
    trains it. With labels of several targets (a dict; ``loss_fn`` takes it) AUC
    and log-loss are NaN, as torch's ``evaluate`` gives."""
    strategy = strategy if strategy is not None else tf.distribute.get_strategy()
    own_loss = loss_fn is None and _has_own_loss(model)
    if own_loss and not callable(getattr(model, "row_logits", None)):
        raise TypeError(
            f"evaluate: {type(model).__name__} has its own compute_loss but no "
            "row_logits(features) (one logit per row) for AUC and log-loss; pass a loss_fn "
            "and a model returning logits"
        )
    loss_fn = loss_fn if loss_fn is not None else _binary_crossentropy

    model_ref = weakref.ref(model)

    def replica_logits(features: Any) -> tf.Tensor:
        net: Any = model_ref()
        out = net.row_logits(features) if own_loss else net(features, training=False)
        if not tf.is_tensor(out):
            raise TypeError(
                f"evaluate: {type(net).__name__} returns {type(out).__name__}, not logits; "
                "AUC and log-loss need a model with one logit per row (evaluate a TwoTower "
                "with its recall_at_k)"
            )
        return tf.reshape(out, [-1])

    def predict(features: Any) -> tf.Tensor:
        per_replica = strategy.run(replica_logits, args=(features,))
        return strategy.experimental_local_results(per_replica)[0]

    def replica_own_loss(features: Any, labels: Any) -> tf.Tensor:
        net: Any = model_ref()
        return net.compute_loss(x=features, y=labels, training=False)

    def own_batch_loss(features: Any, labels: Any) -> tf.Tensor:
        per_replica = strategy.run(replica_own_loss, args=(features, labels))
        return strategy.experimental_local_results(per_replica)[0]

    compiled: list[Any] = []
    scores, targets, losses = [], [], []
    name = None
    several = False
    for batch in loader:
        features, given = _unpack(batch, "evaluate")
        labels = _one_target(given)
        if labels is None:
            raise ValueError("evaluate: the loader yields no labels; build it with labels=")
        if own_loss or loss_fn is _binary_crossentropy:
            _refuse_several_targets(labels, "evaluate")
        name = name or label_name(loader, given)
        features = tf.nest.map_structure(tf.convert_to_tensor, features)
        labels = tf.nest.map_structure(tf.convert_to_tensor, labels)
        if not compiled:  # one trace, every dimension open, kept with the model
            spec = _open_spec(features)
            compiled.append(_compiled(model, "evaluate", (id(strategy), repr(spec), own_loss),
                                      partial(tf.function, predict, input_signature=[spec])))
            if own_loss:
                specs = [spec, _open_spec(labels)]
                compiled.append(_compiled(model, "evaluate_loss", (id(strategy), repr(specs)),
                                          partial(tf.function, own_batch_loss,
                                                  input_signature=specs)))
        try:
            logits = compiled[0](features)
            y = labels if isinstance(labels, dict) else tf.cast(tf.reshape(labels, [-1]),
                                                                 logits.dtype)
            loss = compiled[1](features, labels) if own_loss else loss_fn(logits, y)
        except tf.errors.InvalidArgumentError as exc:
            raise (_id_error(exc) or exc) from exc
        rows = int(logits.shape[0])
        losses.append(_per_row(loss, rows, "evaluate"))
        scores.append(logits.numpy())
        if isinstance(y, dict):  # several targets: no one label to score against
            several = True
            targets.append(np.full(rows, np.nan, np.float32))
        else:
            targets.append(y.numpy())
    local = [np.concatenate(a) if a else np.zeros(0, np.float32) for a in (scores, targets, losses)]
    s, y, per_row = _gather_rows(strategy, local)
    if y.size == 0:
        raise ValueError("evaluate: the loader yielded no rows")
    if several:
        return {"loss": float(np.mean(per_row)), "log_loss": float("nan"), "auc": float("nan")}
    bad = y[~np.isfinite(y)]  # every worker holds every row here: all raise together
    if bad.size:
        raise label_error(name, str(float(bad[0])), loader, "in the evaluated data")
    return {"loss": float(np.mean(per_row)), "log_loss": log_loss(y, s), "auc": roc_auc(y, s)}


class _Checkpoints:
    """Weights (``.weights.h5``), optimizer variables (``.npz``, no pickle) and the
    loop's state (``.json``), written by the chief worker alone; every worker reads."""

    def __init__(self, directory: str | os.PathLike[str], model: Any, optimizer: Any) -> None:
        self.dir = Path(directory)
        self.model, self.optimizer = model, optimizer
        self.weights = self.dir / f"{CHECKPOINT_PREFIX}.weights.h5"
        self.slots = self.dir / f"{CHECKPOINT_PREFIX}.optimizer.npz"
        self.state = self.dir / f"{CHECKPOINT_PREFIX}.json"

    def exists(self) -> bool:
        return self.state.exists()

    def needed_bytes(self) -> int:
        """At least what one checkpoint takes: the model's weights."""
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in self.model.weights)

    def save(self, state: dict[str, Any]) -> None:
        # Write all three beside, then rename: a write that fails (a full disk) or a
        # crash while writing leaves the old checkpoint whole and no temporary file.
        tmp_weights = self.dir / f".{CHECKPOINT_PREFIX}.tmp.weights.h5"
        tmp_slots = self.dir / f".{CHECKPOINT_PREFIX}.tmp.optimizer.npz"
        tmp_state = self.dir / f".{CHECKPOINT_PREFIX}.tmp.json"
        with checkpoint_write(self.dir, [tmp_weights, tmp_slots, tmp_state]):
            self.dir.mkdir(parents=True, exist_ok=True)
            self.model.save_weights(tmp_weights)
            slots = {f"v{i:05d}": np.asarray(v.numpy())
                     for i, v in enumerate(self.optimizer.variables)}
            with open(tmp_slots, "wb") as f:
                np.savez(f, **slots)
            tmp_state.write_text(json.dumps({"format": _FORMAT, **state}))
            os.replace(tmp_weights, self.weights)
            os.replace(tmp_slots, self.slots)
            os.replace(tmp_state, self.state)

    def load(self) -> dict[str, Any]:
        try:
            state = check_checkpoint_format(read_json_file(self.state, "checkpoint state"), self.state)
            if state.get("arrays") == "named":  # tabstream reshard --world-size 1 wrote it
                from tabstream.train.tensorflow.reshard import load_named

                load_named(self.dir, self.model, self.optimizer)
                return state
            self.model.load_weights(self.weights)
            with np.load(self.slots, allow_pickle=False) as slots:
                values = [slots[k] for k in sorted(slots.files)]
        except (OSError, ValueError, KeyError) as exc:
            if isinstance(exc, (SchemaError, DataError)):  # said already (load_named)
                raise
            raise SchemaError(
                f"checkpoint {self.dir}: cannot restore {type(self.model).__name__} from it "
                f"({exc}); resume with the model it was written with, or start over with "
                "resume=False"
            ) from exc
        variables = list(self.optimizer.variables)
        if len(values) != len(variables) or any(
            tuple(v.shape) != tuple(a.shape) for v, a in zip(variables, values, strict=False)
        ):
            raise SchemaError(
                f"checkpoint {self.slots}: it holds {len(values)} optimizer variables but this "
                f"{type(self.optimizer).__name__} has {len(variables)} (or their shapes "
                "differ); resume with the optimizer the checkpoint was written with, or start "
                "over with resume=False"
            )
        for var, value in zip(variables, values, strict=True):
            var.assign(value)
        return state


class _LabelCheck:
    """``check(labels)``: ``None`` when every worker's float labels are finite, else
    the first bad value seen here ("nan", "inf"), or words saying it was on another
    worker. One small compiled reduction (summed over the workers) per batch, before
    the step, so that a bad batch is never applied and no worker is left waiting."""

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        self.strategy = strategy
        self.compiled: Any = None

    def __call__(self, labels: Any) -> str | None:
        if isinstance(labels, dict):
            labels = next(iter(labels.values())) if len(labels) == 1 else None
        if labels is None:
            return None
        labels = tf.convert_to_tensor(labels)
        if not labels.dtype.is_floating:
            return None
        if self.compiled is None:
            ref = weakref.ref(self.strategy)

            def count(y: tf.Tensor) -> tf.Tensor:
                strategy = ref()
                per_replica = strategy.run(
                    lambda t: tf.reduce_sum(tf.cast(~tf.math.is_finite(t), tf.float32)), args=(y,))
                return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

            self.compiled = _compiled(
                self.strategy, "label_check", _spec_key(labels),
                lambda: tf.function(count, input_signature=[_open_spec(labels)]))
        if float(self.compiled(labels)) == 0:
            return None
        here = labels.numpy().reshape(-1)
        bad = here[~np.isfinite(here)]
        return str(float(bad[0])) if bad.size else "NaN or inf on another worker"


def _check_writable(checkpoints: Any, strategy: tf.distribute.Strategy) -> None:
    """The writing workers (the chief, or all of them for checkpoints that every
    worker writes) check the checkpoint folder; every worker raises when one cannot."""
    rank, workers = _worker(strategy)
    error: CheckpointError | None = None
    if rank == 0 or getattr(checkpoints, "every_worker_writes", False):
        try:
            check_checkpoint_dir(checkpoints.dir, checkpoints.needed_bytes())
        except CheckpointError as exc:
            error = exc
    _raise_together(strategy, error, f"checkpoint_dir {checkpoints.dir} cannot take "
                    "checkpoints on the chief worker (see its error); pass another checkpoint_dir")


def _raise_together(strategy: tf.distribute.Strategy, error: CheckpointError | None,
                    elsewhere: str) -> None:
    """Raise ``error`` here and a CheckpointError saying ``elsewhere`` on the other
    workers (one small all-reduce under several workers), so that none waits alone."""
    _, workers = _worker(strategy)
    if workers > 1:
        failed = _sum_over_workers(strategy, [0.0 if error is None else 1.0])
        if float(failed[0]) and error is None:
            raise CheckpointError(elsewhere)
    if error is not None:
        raise error


def fit(
    model: Any,
    train_loader: Iterable[Any],
    optimizer: Any,
    epochs: int = 1,
    valid_loader: Iterable[Any] | None = None,
    loss_fn: LossFn | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: bool = True,
    strategy: tf.distribute.Strategy | None = None,
    checkpoint_every: int | None = None,
) -> dict[str, list[float]]:
    """Train a Keras ``model`` with a custom loop; return the history.

    The loop of :func:`tabstream.train.torch.fit` (:mod:`tabstream.train.loop`:
    mid-epoch resume, ``checkpoint_every``, new file lists as new passes, the NaN
    stop on every worker), with Keras 3's step. With a
    ``strategy`` (default: the one in scope, else TensorFlow's default strategy)
    every step runs through ``strategy.run``: under
    ``tf.distribute.MultiWorkerMirroredStrategy`` each worker reads its own shard
    (``tabstream.loaders.tensorflow.Loader`` built inside ``strategy.scope()`` picks
    it) and the gradients are summed over workers, so W workers on batches of ``b``
    rows train like one process on batches of ``W * b`` (the loss is the mean over
    the global batch, a short last batch included).

    Args:
        model: a Keras model returning logits (``[B]`` or ``[B, 1]``), or one with
            its own ``compute_loss`` (``TwoTower``), taken as the mean over its rows;
            with a ``valid_loader`` such a model is scored by its
            ``row_logits(features)`` (``TwoTower``'s: each row's own user-item score,
            as torch's ``TwoTower`` returns), and refused before the first step
            without one.
            Under a strategy, create and build it inside ``strategy.scope()``. A
            ``HybridParallel`` (model-parallel tables), or the model it wraps, trains
            through the wrapper's hooks; every worker then checkpoints its own part,
            and the strategy defaults to the wrapper's.
        train_loader: batches ``(features dict, labels)``, e.g. a tabstream
            ``Loader``; every worker must yield the same number (the loader does).
        optimizer: a Keras optimizer (``LazyAdam``, ``MultiOptimizer``, ...),
            created inside ``strategy.scope()`` under a strategy.
        loss_fn: ``(logits, labels) -> loss``: a scalar (the batch mean) or a
            ``[B]`` tensor of per-row losses (averaged over the rows, as torch's
            ``fit`` takes it); any other shape is refused. ``labels`` is what the
            loader yields: a tensor, or the dict of targets of a loader with
            several labels. Default: the model's ``compute_loss`` if it has one
            (``TwoTower``), else binary cross-entropy on logits (both need one
            target).
        checkpoint_dir: after each epoch (and every ``checkpoint_every`` steps)
            the chief worker writes the weights, the optimizer's variables and the
            loop's position and history there (nothing is pickled).
        resume: continue from the checkpoint in ``checkpoint_dir``, a mid-epoch one
            included (the batches already trained are skipped; start afresh when
            there is no checkpoint yet). Another file list after a finished one is
            a new pass over it (continuous training: ``fit_lists``). A
            ``HybridParallel`` checkpoint of another number of workers or plan
            resumes too (tables and optimizer state resharded; one line on the chief
            says so), as does the single-process checkpoint ``tabstream reshard
            --world-size 1`` writes of one.
        checkpoint_every: also checkpoint every this many steps of an epoch.
        progress: a progress bar per epoch (tqdm, as torch's fit) and a summary line
            (chief only).

    Returns:
        ``{"epoch", "loss", "samples", "samples_per_sec", "time_s"}`` plus, with a
        ``valid_loader``, ``{"val_loss", "val_log_loss", "val_auc"}`` (computed over
        all workers' rows: identical on every worker); one entry per epoch, the
        epochs before a resume included. ``loss`` and ``samples`` count all workers.

    Raises:
        NonFiniteLossError: (a ``FloatingPointError``) when the loss is NaN or
            infinite on any worker, naming the epoch and step (every worker raises).
        DataError: a NaN/inf label (naming the column, and the file and row of the
            first one for a tabstream loader; checked before the step, which is
            not applied), or an id outside its embedding table.
        CheckpointError: (an ``OSError``) ``checkpoint_dir`` cannot be written,
            before the first step; or a checkpoint write failed (the previous
            checkpoint is kept, no temporary file is left).
    """
    options = LoopOptions(epochs=epochs, valid_loader=valid_loader, checkpoint_dir=checkpoint_dir,
                          resume=resume, progress=progress, checkpoint_every=checkpoint_every)
    options.check()
    # a model wrapped by HybridParallel trains through its wrapper (its fit_* hooks)
    model = getattr(model, "fit_target", None) or model
    wrapper = not isinstance(model, keras.Model) and callable(getattr(model, "fit_build", None))
    if not isinstance(model, keras.Model) and not wrapper:
        raise TypeError(f"fit: model must be a keras.Model, got {type(model).__name__} (a "
                        "HybridParallel of a Keras model is taken too)")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"fit: optimizer must be a keras optimizer (LazyAdam, MultiOptimizer, ...), got "
            f"{type(optimizer).__name__}"
        )
    if strategy is None:
        strategy = model.distribute_strategy if wrapper else tf.distribute.get_strategy()
    if not isinstance(strategy, tf.distribute.Strategy):
        raise TypeError(
            f"fit: strategy must be a tf.distribute.Strategy, got {type(strategy).__name__}"
        )
    if (valid_loader is not None and loss_fn is None and _has_own_loss(model)
            and not callable(getattr(model, "row_logits", None))):
        # refused before the first step, not after an epoch's training
        raise TypeError(
            f"fit: valid_loader= needs one logit per row for AUC and log-loss, and "
            f"{type(model).__name__} has its own compute_loss but no row_logits(features); "
            "add one, or validate it yourself (TwoTower: recall_at_k)"
        )
    trainer = _KerasTrainer(model, optimizer, train_loader, loss_fn, strategy, checkpoint_dir)
    return run_loop(trainer, train_loader, options)


def default_replica_step(model: Any, optimizer: Any, loss_sum: Callable[[Any, Any], tf.Tensor],
                         features: Any, labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """One replica's step of :func:`fit`: the gradient of the mean loss over the
    global batch (all replicas' rows), applied; returns ``(this replica's summed
    loss, its rows)``. ``loss_sum(features, labels)`` is the summed loss of the
    replica's rows.

    A model may replace it with a method ``fit_replica_step(features, labels,
    loss_sum, optimizer)`` returning the same pair (for example to scale or route
    gradients of sharded or cached tables), calling this function for the rest."""
    local = tf.cast(batch_rows(features, labels), tf.float32)
    total = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, local)
    with tf.GradientTape() as tape:
        summed = loss_sum(features, labels)
        # The mean over the global batch: Keras sums the replicas' gradients.
        loss = summed / tf.maximum(total, 1.0)
    grads = tape.gradient(loss, model.trainable_variables)
    sum_repeated_ids(optimizer).apply(grads, model.trainable_variables)
    return summed, local


class _KerasTrainer:
    """The Keras work of :func:`fit` (:class:`tabstream.train.loop.Trainer`): one
    compiled step through ``strategy.run``, the chief's checkpoint files, sums over
    the workers, :func:`evaluate`.

    Hooks a model may define (all optional): ``fit_replica_step`` (in the compiled
    step, see :func:`default_replica_step`), ``fit_global_step(features, labels,
    loss_sum, optimizer)`` (in place of the compiled step's ``strategy.run``: it runs
    that itself and returns the per-replica ``(summed loss, rows)``; a wrapper
    updating variables outside the replica context, as ``HybridParallel`` does its
    shards), ``fit_build(features, optimizer, strategy)`` (in place of building the
    model and the optimizer; a wrapper that is no ``keras.Model`` has it),
    ``fit_before_step(features, labels)``
    and ``fit_after_step()`` (eager, on the host, around each compiled step: a
    cache staging rows and sending their updates), ``fit_before_checkpoint()``
    (every worker, before each checkpoint is written), and ``fit_checkpoints(directory,
    optimizer)`` returning the checkpoint files to use instead of the chief's
    (an object like ``_Checkpoints``: ``dir``, ``exists()``, ``needed_bytes()``,
    ``save(state)``, ``load() -> state``; with ``every_worker_writes = True`` every
    worker saves its own part, e.g. its shards)."""

    def __init__(self, model: Any, optimizer: Any, loader: Any, loss_fn: LossFn | None,
                 strategy: tf.distribute.Strategy,
                 checkpoint_dir: str | os.PathLike[str] | None) -> None:
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.loss_fn, self.strategy = loss_fn, strategy
        self.rank, self.world = _worker(strategy)
        self.own_loss = loss_fn is None and _has_own_loss(model)
        self.checkpoints: Any = None
        if checkpoint_dir is not None:
            make = getattr(model, "fit_checkpoints", None)
            self.checkpoints = (make(checkpoint_dir, optimizer) if callable(make)
                                else _Checkpoints(checkpoint_dir, model, optimizer))
        self.checkpoint_path = self.checkpoints.dir if self.checkpoints is not None else None
        self.label_check = _LabelCheck(strategy)
        self.compiled: Any = None
        self.ready = False
        self.resume_note: str | None = None
        #: what reads the next batch's rows during a step (a ParameterServer's cache)
        self._readers = _prefetchers(model)
        self.prefetches = bool(self._readers)
        if model.built:
            self.build(None)
        elif hasattr(model, "example_batch"):  # the bundled models: build before any resume
            self.build(model.example_batch())

    def build(self, features: Any) -> None:
        self.ready = True
        hook = getattr(self.model, "fit_build", None)
        if callable(hook):
            hook(features, self.optimizer, self.strategy)
            return
        # Variables made here, inside the scope, are mirrored (and, under
        # MultiWorkerMirroredStrategy, start from the chief's initial values).
        with self.strategy.scope():
            if not self.model.built:
                self.model(features, training=False)
            _check_strategy(self.model, self.strategy)
            if not self.optimizer.built:
                self.optimizer.build(self.model.trainable_variables)

    # -- checkpoints
    def check_writable(self) -> None:
        assert self.checkpoints is not None
        _check_writable(self.checkpoints, self.strategy)

    def checkpoint_exists(self) -> bool:
        return self.checkpoints is not None and self.checkpoints.exists()

    def load(self) -> dict[str, Any]:
        assert self.checkpoints is not None
        state = self.checkpoints.load()
        # what loading did to the model's state (resharded tables), for the loop's line
        self.resume_note = getattr(self.checkpoints, "resume_note", None)
        return state

    def save(self, state: dict[str, Any]) -> None:
        assert self.checkpoints is not None
        before = getattr(self.model, "fit_before_checkpoint", None)
        if callable(before):
            before()
        failure = None
        if self.rank == 0 or getattr(self.checkpoints, "every_worker_writes", False):
            try:
                self.checkpoints.save(state)
            except CheckpointError as exc:
                failure = exc
        _raise_together(self.strategy, failure, f"checkpoint_dir {self.checkpoints.dir}: the "
                        "chief could not write its checkpoint (see its error); the previous "
                        "one is kept")

    # -- steps
    def begin_epoch(self) -> None:
        """Nothing to switch: Keras layers take ``training`` per call (torch's
        trainer sets train mode here)."""

    def prefetch(self, batch: Any) -> None:
        """The loop hands the next batch before this step: the caches read its rows
        they lack while this step runs (:meth:`CachedEmbeddings.prefetch`)."""
        features, _ = _unpack(batch, "fit")
        for read_ahead in self._readers:
            read_ahead(features)

    def _compiled_step(self, features: Any, labels: Any) -> Any:
        """The compiled step for batches like this one, kept with the model (a
        later ``fit`` with the same optimizer, loss and strategy reuses it)."""
        key = (id(self.optimizer), id(self.loss_fn), self.own_loss, id(self.strategy),
               _spec_key(features), None if labels is None else _spec_key(labels))
        return _compiled(self.model, "fit", key, lambda: self._make_step(features, labels))

    def _make_step(self, features: Any, labels: Any) -> Any:
        model_ref, optimizer, strategy = weakref.ref(self.model), self.optimizer, self.strategy
        own_loss = self.own_loss
        per_row_loss = self.loss_fn if self.loss_fn is not None else _binary_crossentropy

        def loss_sum(f: Any, y: Any) -> tf.Tensor:
            model = model_ref()
            if own_loss:
                rows = tf.cast(batch_rows(f, y), tf.float32)
                return model.compute_loss(x=f, y=y, training=True) * rows
            return summed_loss(per_row_loss(model(f, training=True), y), batch_rows(f, y))

        def replica_step(f: Any, y: Any) -> tuple[tf.Tensor, tf.Tensor]:
            model = model_ref()
            hook = getattr(model, "fit_replica_step", None)
            if callable(hook):
                return hook(f, y, loss_sum, optimizer)
            return default_replica_step(model, optimizer, loss_sum, f, y)

        def global_step(f: Any, y: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            hook = getattr(model_ref(), "fit_global_step", None)
            if callable(hook):
                summed, rows = hook(f, y, loss_sum, optimizer)
            else:
                summed, rows = strategy.run(replica_step, args=(f, y))
            here = tf.add_n([tf.cast(v, tf.float64)
                             for v in strategy.experimental_local_results(summed)])
            here_rows = tf.add_n([tf.cast(v, tf.float64)
                                  for v in strategy.experimental_local_results(rows)])
            everywhere = strategy.reduce(tf.distribute.ReduceOp.SUM, summed, axis=None)
            return here, here_rows, everywhere

        # One trace for every batch: the signature of the first batch with every
        # dimension left open (list columns change length from batch to batch).
        if labels is None:
            return tf.function(lambda f: global_step(f, None),
                               input_signature=[_open_spec(features)])
        return tf.function(global_step,
                           input_signature=[_open_spec(features), _open_spec(labels)])

    def step(self, batch: Any, where: str) -> Step:
        features, given = _unpack(batch, "fit")
        labels = _one_target(given)
        if labels is None and not self.own_loss:
            raise ValueError("fit: the loader yields no labels; build it with labels=")
        if self.loss_fn is None:
            _refuse_several_targets(labels, "fit")
        if not self.ready:
            self.build(features)
        # on every worker together: each count is summed over them
        targets = labels.items() if isinstance(labels, dict) else [(None, labels)]
        for target, values in targets:
            bad = self.label_check(values)
            if bad is not None:
                raise label_error(target or label_name(self.loader, given), bad, self.loader,
                                  where)
        before = getattr(self.model, "fit_before_step", None)
        if callable(before):
            before(features, labels)
        features = tf.nest.map_structure(tf.convert_to_tensor, features)
        labels = None if labels is None else tf.nest.map_structure(tf.convert_to_tensor, labels)
        if self.compiled is None:
            self.compiled = self._compiled_step(features, labels)
        args = (features,) if labels is None else (features, labels)
        try:
            here, rows, everywhere = (float(v) for v in self.compiled(*args))
        except tf.errors.InvalidArgumentError as exc:
            raise (_id_error(exc) or _loss_shape_error(exc) or exc) from exc
        after = getattr(self.model, "fit_after_step", None)
        if callable(after):
            after()
        # the loss summed over the workers is NaN on every worker when it is on one
        return Step(here, int(rows), finite=math.isfinite(everywhere), shown=str(everywhere),
                    applied=True)

    def all_sum(self, values: list[float]) -> list[float]:
        if self.world == 1:
            return list(values)
        return [float(v) for v in _sum_over_workers(self.strategy, values)]

    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        return evaluate(self.model, loader, loss_fn=self.loss_fn, strategy=self.strategy)


def _prefetchers(model: Any) -> list[Any]:
    """What reads a batch's rows ahead: the model's ``fit_prefetch(features)`` when
    it has one, else each :class:`CachedEmbeddings`' ``prefetch``."""
    hook = getattr(model, "fit_prefetch", None)
    if callable(hook):
        return [hook]
    if not isinstance(model, keras.Model):
        return []
    from tabstream.train.tensorflow.cache import cached_layers

    return [layer.prefetch for layer in cached_layers(model)]


def checkpoint_position(checkpoint_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(epochs completed, batches done in the next epoch)`` of the Keras checkpoint
    in ``checkpoint_dir``, or ``None`` when there is none (as torch's
    ``checkpoint_position``).

    >>> import tempfile
    >>> checkpoint_position(tempfile.gettempdir() + "/no-such-checkpoint") is None
    True
    """
    path = Path(checkpoint_dir) / f"{CHECKPOINT_PREFIX}.json"
    if not path.exists():
        return None
    state = check_checkpoint_format(read_json_file(path, "checkpoint state"), path)
    return int(state["epoch"]), int(state.get("step", 0))


def refuse_keras_fit(model: Any) -> None:
    """Called by the bundled models' ``fit`` (Keras' own loop): under
    ``MultiWorkerMirroredStrategy`` Keras 3's ``model.fit`` cannot run (it fails deep
    inside converting ``PerReplica`` values), and a model wrapped by ``HybridParallel``
    would train its dense part only (its sharded tables are no Keras weights), so
    say at once what does."""
    if getattr(model, "fit_target", None) is not None:
        raise RuntimeError(
            f"{type(model).__name__}.fit (Keras' own training loop) cannot train a model "
            "wrapped by HybridParallel: its sharded tables are not Keras weights and would "
            "stay untrained. Train with tabstream.train.tensorflow.fit(model, loader, "
            "optimizer): the same model-parallel step, with validation, checkpoints and "
            "resume (see docs/distributed-training.md)"
        )
    strategy = model.distribute_strategy
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        raise RuntimeError(
            f"{type(model).__name__}.fit (Keras' own training loop) does not run under "
            "tf.distribute.MultiWorkerMirroredStrategy in Keras 3. Train with "
            "tabstream.train.tensorflow.fit(model, loader, optimizer, strategy=strategy) "
            "instead: the same data-parallel training, with validation, checkpoints and "
            "resume (see docs/keras-distributed.md)"
        )

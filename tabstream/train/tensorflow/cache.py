"""Keras embedding tables served by a :class:`~tabstream.train.ParameterServer`
through a bounded cache of hot rows, for tables larger than memory: the Keras
twin of :class:`tabstream.train.torch.CachedEmbeddings`, over the same server.

    >>> import tempfile
    >>> import tensorflow as tf
    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> def categorical(name, n):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("C1", 1000), categorical("C2", 50),
    ...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
    ...                  ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    >>> features = {"C1": tf.constant([3, 999, 3, 42], tf.int64),
    ...             "C2": tf.constant([0, 7, 49, 7], tf.int64), "I1": tf.constant([0.5, -1.0, 2.0, 0.0])}
    >>> labels = tf.constant([1.0, 0.0, 1.0, 0.0])
    >>> from tabstream.train import ParameterServer, table_configs_from_schema
    >>> from tabstream.train.tensorflow import DLRM, fit
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ps = ParameterServer(tmp.name + "/ps", table_configs_from_schema(schema, dim=8),
    ...                      storage="disk", optimizer="adagrad", lr=0.05)
    >>> emb = CachedEmbeddings(ps, cache_rows=100)       # at most 100 rows per table in memory
    >>> model = DLRM(schema, embedding_dim=8, embeddings=emb, seed=0)   # dense part: any optimizer
    >>> history = fit(model, [(features, labels)] * 3, keras.optimizers.Adam(1e-3),
    ...               checkpoint_dir=tmp.name + "/ck", progress=False)
    >>> ps.touched("C1").tolist()                        # rows 3, 42 and 999 were trained
    [3, 42, 999]
    >>> emb.cached_rows                                  # C1: row 0 too (fit builds on zeros)
    {'C1': 4, 'C2': 3}
    >>> ps.close(); tmp.cleanup()

The layer takes batches in every layout :class:`EmbeddingTables` takes (it
parses them with the same code) and returns ``{feature: [B, dim]}``.

How a step goes, inside the step :func:`~tabstream.train.tensorflow.fit`
compiles: each table's rows in the cache live in a non-trainable variable
``[cache_rows, dim]``; a lookup hands its ids to the host
(``tf.numpy_function``), which answers their slots in that variable, reading
the misses from the server and evicting the least recently used rows not used
by the step so far; the misses are written into the variable and the rows are
gathered from it in-graph. The gradient of the loss with respect to the cache
variables (an ``IndexedSlices`` over the slots looked up) is summed per slot
and handed to the host again, which maps the slots back to ids and runs the
server's fused optimizer (:meth:`ParameterServer.apply`, Adagrad or LazyAdam's
rule); the new rows are written back into the variable. The model's optimizer
sees only the dense part. Host calls are needed inside the graph because the
ids of a batch are only known there, in every layout and in every compiled
function (``fit``'s step, ``evaluate``, ``predict``).

The cache is write-through, as torch's: every update is in the server when
the step ends, so an eviction writes nothing and a crash loses no row that was
only cached. Saving the model's weights (``fit``'s checkpoints) commits the
server (``ps.flush()``) and records its version instead of the cached rows;
loading them rolls the server back to that version when it went past it (the
undo log of one commit is kept, as for torch).

Limits: one training replica (a ``MirroredStrategy`` or
``MultiWorkerMirroredStrategy`` of several replicas is refused, naming what
works); the distinct ids of one table in one training step must fit in
``cache_rows``; Keras' own ``model.fit`` is refused (train with
:func:`~tabstream.train.tensorflow.fit`); ``model.export`` cannot carry the
host calls.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from functools import partial
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.core.errors import DataError, SchemaError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.row_cache import RowCache, check_cache_args, served_tables
from tabstream.train.tables import TableConfig
from tabstream.train.tensorflow._autograph import no_autograph as _no_autograph
from tabstream.train.tensorflow.embeddings import (
    VALUES_SUFFIX,
    EmbeddingTable,
    EmbeddingTables,
    check_ids,
)

__all__ = ["CachedEmbeddings", "ParameterServer", "cached_layers", "refuse_keras_fit_cached",
           "replica_step"]

Features = Mapping[str, Any]


class _CachedTable:
    """One table of a :class:`CachedEmbeddings`, with :class:`EmbeddingTable`'s
    lookup interface (``table(ids)``, ``pool``, ``_gather``), so that
    :meth:`EmbeddingTables.lookup` parses every layout for it."""

    def __init__(self, owner: CachedEmbeddings, config: TableConfig, variable: Any) -> None:
        self.owner, self.config, self.variable = owner, config, variable

    @property
    def dim(self) -> int:
        return self.config.dim

    @property
    def cardinality(self) -> int:
        return self.config.cardinality

    # the same single-hot call and pooling as an in-memory table, over _gather below
    __call__ = EmbeddingTable.call
    pool = EmbeddingTable.pool

    def _gather(self, ids: tf.Tensor, feature: str | None = None) -> tf.Tensor:
        ids = check_ids(ids, self.config, feature or self.config.name)
        flat = tf.reshape(tf.cast(ids, tf.int64), [-1])
        stage = partial(self.owner._stage, self.config.name, self.owner._pinning)
        slots, new_slots, new_rows = tf.numpy_function(
            stage, [flat], [tf.int64, tf.int64, tf.float32], stateful=True,
            name=f"cache_stage_{self.config.name}")
        slots.set_shape([None])
        new_slots.set_shape([None])
        new_rows.set_shape([None, self.config.dim])
        var = self.variable.value
        var.scatter_update(tf.IndexedSlices(new_rows, new_slots))
        # a gather from the variable: its gradient is an IndexedSlices over the slots
        return tf.gather(var, slots)


class CachedEmbeddings(keras.layers.Layer):
    """A Keras layer like :class:`EmbeddingTables` whose rows live in ``ps``.

    Args:
        ps: the parameter server holding every table's rows and optimizer state
            (``tabstream.train.ParameterServer``; the torch cache's too).
        cache_rows: at most this many rows per table are kept in the layer (and at
            least the distinct ids of a table in one training step).
        tables: the server's tables this layer serves; by default, for each
            feature, the first table that lists it (Wide&Deep's wide tables are
            served by a second layer with ``tables=``, which the model makes).
        list_features: the multi-hot features; by default those each table's
            config marks as lists (:meth:`TableConfig.is_list_feature`).

    ``hit_rate`` (cache hits over lookups since construction), ``cached_rows``
    and ``table_names``/``feature_names``/``output_dims`` describe it. Train it
    with :func:`~tabstream.train.tensorflow.fit` (the bundled models' replica
    step sends the gradients of the rows looked up to the server).
    """

    def __init__(self, ps: ParameterServer, cache_rows: int = 1_000_000, tables: Any = None,
                 list_features: Any = None, name: str = "cached_embeddings", **kwargs: Any) -> None:
        check_cache_args(ps, cache_rows)
        _refuse_replicas(tf.distribute.get_strategy(), "CachedEmbeddings")
        super().__init__(name=name, **kwargs)
        self.ps = ps
        self.cache_rows = cache_rows
        self.configs: tuple[TableConfig, ...]
        self.configs, self._feature_to_table = served_tables(ps, tables)
        if list_features is None:
            list_features = [f for c in self.configs for f in c.feature_names if c.is_list_feature(f)]
        self.list_features = frozenset(list_features)
        unknown = sorted(self.list_features - set(self._feature_to_table))
        if unknown:
            raise SchemaError(f"CachedEmbeddings: list_features {unknown} are in no table it "
                              f"serves; it serves {sorted(self._feature_to_table)}")
        self._caches = {c.name: RowCache(min(cache_rows, c.cardinality), 0) for c in self.configs}
        self._tables: dict[str, _CachedTable] = {}
        for i, cfg in enumerate(self.configs):
            var = self.add_weight(shape=(self._caches[cfg.name].capacity, cfg.dim),
                                  initializer="zeros", trainable=False, name=f"cache_{i}")
            self._tables[cfg.name] = _CachedTable(self, cfg, var)
        self._pinned: dict[str, set[int]] = {c.name: set() for c in self.configs}
        self._pinning = False  # set per call: training lookups pin their slots for the step
        #: table -> the next batch's ids the cache lacked (prefetch), read ahead at its apply
        self._upcoming: dict[str, np.ndarray] = {}
        self._host_lock = threading.Lock()
        self._load_error: Exception | None = None
        self.built = True
        ps.attach(self._on_server_event)

    def build(self, input_shape: Any = None) -> None:
        self.built = True

    # -- EmbeddingTables' interface -------------------------------------------

    @property
    def table_names(self) -> list[str]:
        return [c.name for c in self.configs]

    @property
    def feature_names(self) -> list[str]:
        return list(self._feature_to_table)

    @property
    def feature_to_table(self) -> dict[str, str]:
        return dict(self._feature_to_table)

    @property
    def output_dims(self) -> dict[str, int]:
        dims = {c.name: c.dim for c in self.configs}
        return {f: dims[t] for f, t in self._feature_to_table.items()}

    @property
    def hit_rate(self) -> float:
        hits = sum(c.hits for c in self._caches.values())
        total = hits + sum(c.misses for c in self._caches.values())
        return hits / total if total else float("nan")

    @property
    def cached_rows(self) -> dict[str, int]:
        return {name: len(c) for name, c in self._caches.items()}

    @property
    def cache_variables(self) -> dict[str, Any]:
        """Table name -> the variable holding its cached rows (gradients go to the
        server, never to a Keras optimizer: the variables are not trainable)."""
        return {name: t.variable for name, t in self._tables.items()}

    def table_for(self, feature: str) -> _CachedTable:
        try:
            return self._tables[self._feature_to_table[feature]]
        except KeyError:
            raise KeyError(f"no embedding table for feature {feature!r}; known: "
                           f"{self.feature_names}") from None

    # every layout EmbeddingTables accepts, parsed by its own code over _CachedTable
    lookup = EmbeddingTables.lookup

    @_no_autograph
    def call(self, features: Features, only: tuple[str, ...] | None = None,
             training: bool | None = None) -> dict[str, tf.Tensor]:
        names = list(self._feature_to_table) if only is None else list(only)
        missing = [f for f in names if f not in features and f + VALUES_SUFFIX not in features]
        if missing:
            raise SchemaError(f"CachedEmbeddings: features {missing} are missing from the "
                              f"input; got {sorted(features)}")
        self._pinning = bool(training)
        try:
            return {f: self.lookup(f, features) for f in names}
        finally:
            self._pinning = False

    def prefetch(self, features: Features) -> None:
        """Have the rows of ``features`` (the next batch) that the cache lacks read in
        a background thread (:meth:`ParameterServer.read_ahead`) while the current
        step runs, from the moment the step has looked up its own rows of each table
        (its update of the table, on the host, which reads ahead the ids the cache
        lacks then): the next step's lookups take them from there. Optional; the answers are the same without it.
        :func:`~tabstream.train.tensorflow.fit` calls it with each next batch.

            emb.prefetch(next_features)       # before the current step
            fit's step on features            # reads the next batch's misses meanwhile

        Ids of every layout are read as given (a padded list's padding too: a few
        extra rows read); ids outside a table are left to the step to refuse."""
        by_table: dict[str, list[np.ndarray]] = {}
        for feature, table in self._feature_to_table.items():
            ids = _host_ids(feature, features)
            if ids is not None:
                by_table.setdefault(table, []).append(ids)
        upcoming = {}
        with self._host_lock:
            for table, parts in by_table.items():
                uniq = np.unique(np.concatenate(parts))
                n = self._tables[table].cardinality
                upcoming[table] = uniq[(uniq >= 0) & (uniq < n)]
            self._upcoming = upcoming

    def subset(self, feature_names: Any) -> _CachedSubset:
        """A view serving only ``feature_names`` (each tower of a two-tower model
        looks up its own features); the rows, the cache and the server stay this
        layer's."""
        names = list(feature_names)
        unknown = sorted(set(names) - set(self._feature_to_table))
        if unknown:
            raise SchemaError(f"CachedEmbeddings.subset: features {unknown} are not served; "
                              f"it serves {self.feature_names}")
        return _CachedSubset(self, names)

    # -- the host side of a step ---------------------------------------------

    def _stage(self, table: str, pin: bool, ids: np.ndarray) -> tuple[np.ndarray, ...]:
        """The slots of ``ids`` in ``table``'s cache variable, and the slots and rows
        of the misses (read from the server) to write there first."""
        with self._host_lock:
            cache = self._caches[table]
            uniq, inverse = np.unique(ids, return_inverse=True)
            cache.clock += 1
            slots = cache.find(uniq)
            hit = slots >= 0
            cache.hits += int(hit.sum())
            cache.misses += int((~hit).sum())
            cache.used[slots[hit]] = cache.clock
            pinned = self._pinned[table]
            missing = uniq[~hit]
            new_slots = np.zeros(0, np.int64)
            rows = np.zeros((0, self._tables[table].dim), np.float32)
            if len(missing):
                keep = np.union1d(slots[hit], np.fromiter(pinned, np.int64, len(pinned)))
                if len(missing) > cache.capacity - len(keep):
                    raise ValueError(
                        f"CachedEmbeddings: table {table!r} needs {len(keep) + len(missing)} "
                        f"rows in its cache in one step (the distinct ids of its lookups), more "
                        f"than cache_rows={self.cache_rows} holds; raise cache_rows or lower the "
                        "batch size"
                    )
                new_slots = cache.place(missing, keep)
                rows = self.ps.lookup(table, missing)
                slots[~hit] = new_slots
            if pin:
                pinned.update(slots.tolist())
            return slots[inverse.reshape(-1)], new_slots, rows

    def _begin_step(self) -> np.ndarray:
        with self._host_lock:
            for pinned in self._pinned.values():
                pinned.clear()
        return np.zeros((), np.int64)

    def _apply(self, table: str, slots: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """One optimizer step of ``table`` in the server on the rows in ``slots``
        (distinct) with gradients ``grads``; returns their new rows, in slot order."""
        with self._host_lock:
            cache = self._caches[table]
            ids = cache.keys[slots]
            if (ids < 0).any():  # cannot happen: the step's slots are pinned
                raise RuntimeError(f"CachedEmbeddings: a slot of table {table!r} lost its row "
                                   "during the step")
            new = self.ps.apply(table, ids, grads)  # in the order of np.unique(ids)
            self._pinned[table].clear()
            upcoming = self._upcoming.pop(table, None)
            if upcoming is not None:  # the step's lookups are done: read the next batch's
                missing = upcoming[cache.find(upcoming) < 0]  # ids this step left uncached
                if len(missing):
                    self.ps.read_ahead(table, missing)
            return new[np.searchsorted(np.unique(ids), ids)]

    def apply_gradients(self, grads: Mapping[str, Any]) -> None:
        """In the step: send each table's gradient (``IndexedSlices`` over its cache
        variable, or None) to the server and write the new rows back. Every table
        takes one step, with no rows when it had none (as in-memory LazyAdam's
        step counter)."""
        for name, table in self._tables.items():
            grad = grads.get(name)
            if grad is None:
                slots = tf.zeros([0], tf.int64)
                values = tf.zeros([0, table.dim], tf.float32)
            else:
                slots, position = tf.unique(tf.cast(grad.indices, tf.int64))
                values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(slots)[0])
            new = tf.numpy_function(partial(self._apply, name), [slots, values], tf.float32,
                                    stateful=True, name=f"cache_apply_{name}")
            new.set_shape([None, table.dim])
            table.variable.value.scatter_update(tf.IndexedSlices(new, slots))

    def begin_step(self) -> None:
        """In the step, before its lookups: nothing is pinned yet."""
        tf.numpy_function(self._begin_step, [], tf.int64, stateful=True)

    def _on_server_event(self, event: str, *args: Any) -> None:
        if event == "reset":  # the server went back to an earlier version
            with self._host_lock:
                for name, cache in self._caches.items():
                    cache.keys[:] = -1
                    cache.slot.clear()
                    cache.free = list(range(cache.capacity - 1, -1, -1))
                    self._pinned[name].clear()
        elif event == "stage":
            table, ids, rows = args
            if table not in self._caches:
                return  # a table of the server another layer serves
            with self._host_lock:
                cache = self._caches[table]
                fresh = cache.find(ids) < 0
                room = max(cache.capacity - len(cache), 0)
                ids, rows = ids[fresh][:room], rows[fresh][:room]
                slots = cache.place(ids)
            if len(slots):
                self._tables[table].variable.value.scatter_update(
                    tf.IndexedSlices(tf.constant(rows), tf.constant(slots)))

    # -- checkpoints ------------------------------------------------------------

    def save_own_variables(self, store: Any) -> None:
        """What a checkpoint keeps of this layer: the server's version, committed
        now (the cached rows are the server's and are not saved)."""
        store["ps_version"] = np.array(self.ps.flush(), np.int64)

    def load_own_variables(self, store: Any) -> None:
        """Roll the server back to the version the weights were saved at (Keras'
        loader retries a layer that failed through its other paths, with no
        entry there: the first failure is what is raised again)."""
        if "ps_version" not in store:
            raise self._load_error or SchemaError(
                f"CachedEmbeddings {self.name!r}: the saved weights hold no parameter server "
                "version; they were not saved from a model with this CachedEmbeddings"
            )
        self._load_error = None
        wanted = int(np.asarray(store["ps_version"]))
        if wanted != self.ps.version:
            if self.ps.trained_since_commit:  # resets alone are kept by the rollback
                self._load_error = DataError(
                    f"parameter server {self.ps.path} holds uncommitted updates (version "
                    f"{self.ps.version}, last commit {self.ps.mark}); reopen it with "
                    "ParameterServer.open before loading a checkpoint"
                )
                raise self._load_error
            self.ps.rollback_to(wanted)


class _CachedSubset:
    """Some features of a :class:`CachedEmbeddings`, looked up through it (not a
    layer: the owner registers the base layer once)."""

    def __init__(self, base: CachedEmbeddings, feature_names: list[str]) -> None:
        self.base, self.names = base, tuple(feature_names)

    @property
    def feature_names(self) -> list[str]:
        return list(self.names)

    @property
    def output_dims(self) -> dict[str, int]:
        dims = self.base.output_dims
        return {f: dims[f] for f in self.names}

    def __call__(self, features: Features, training: bool | None = None) -> dict[str, tf.Tensor]:
        return self.base(features, only=self.names, training=training)


def _host_ids(feature: str, features: Features) -> np.ndarray | None:
    """The ids of ``feature`` in a batch as flat int64 numpy (a ragged pair's values,
    a padded pair's ids), None when the batch lacks it or they are not integers."""
    x = features.get(feature)
    if x is None:
        x = features.get(feature + VALUES_SUFFIX)
    if isinstance(x, (tuple, list)) and x:
        x = x[0]
    x = getattr(x, "flat_values", x)  # a tf.RaggedTensor
    if x is None:
        return None
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        return None
    return arr.reshape(-1).astype(np.int64, copy=False)


def cached_layers(model: Any) -> list[CachedEmbeddings]:
    """The :class:`CachedEmbeddings` layers of ``model``, each once."""
    found: list[CachedEmbeddings] = []
    for layer in model._flatten_layers(include_self=True, recursive=True):
        if isinstance(layer, CachedEmbeddings) and all(layer is not f for f in found):
            found.append(layer)
    return found


def replica_step(model: Any, optimizer: Any, loss_sum: Any, features: Any,
                 labels: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """``fit``'s replica step for a model with :class:`CachedEmbeddings` (the bundled
    models' ``fit_replica_step``): :func:`default_replica_step` for the dense part,
    plus the cache variables' gradients sent to their servers."""
    from tabstream.train.tensorflow.fit import batch_rows, default_replica_step

    layers = cached_layers(model)
    if not layers:
        return default_replica_step(model, optimizer, loss_sum, features, labels)
    _refuse_replicas(tf.distribute.get_strategy(), f"fit: {type(model).__name__}")
    for layer in layers:
        layer.begin_step()
    local = tf.cast(batch_rows(features, labels), tf.float32)
    caches = [(layer, name, var) for layer in layers for name, var in layer.cache_variables.items()]
    with tf.GradientTape() as tape:
        for _, _, var in caches:
            tape.watch(var.value)
        summed = loss_sum(features, labels)
        loss = summed / tf.maximum(local, 1.0)
    dense = model.trainable_variables
    grads = tape.gradient(loss, [*dense, *(var.value for _, _, var in caches)])
    optimizer.apply(grads[:len(dense)], dense)
    per_layer: dict[int, dict[str, Any]] = {}
    for (layer, name, _), grad in zip(caches, grads[len(dense):], strict=True):
        per_layer.setdefault(id(layer), {})[name] = grad
    for layer in layers:
        layer.apply_gradients(per_layer.get(id(layer), {}))
    return summed, local


def _refuse_replicas(strategy: tf.distribute.Strategy, who: str) -> None:
    if strategy.num_replicas_in_sync > 1:
        raise ValueError(
            f"{who}: tables served through a ParameterServer (CachedEmbeddings) train on one "
            f"replica; the strategy {type(strategy).__name__} runs "
            f"{strategy.num_replicas_in_sync}. Train on one process and device (no strategy, "
            "or tf.distribute.OneDeviceStrategy), or use in-memory tables (EmbeddingTables) "
            "to train data-parallel"
        )


def refuse_keras_fit_cached(model: Any) -> None:
    """Keras' own ``model.fit`` would not send the cache's gradients to the server
    (its rows would never train): refuse it, naming :func:`fit`."""
    if cached_layers(model):
        raise RuntimeError(
            f"{type(model).__name__}.fit (Keras' own training loop) cannot train tables "
            "served by CachedEmbeddings: their gradients go to the parameter server in "
            "tabstream's step. Train with tabstream.train.tensorflow.fit(model, loader, "
            "optimizer) instead"
        )

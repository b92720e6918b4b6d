"""Model-parallel embedding tables for the bundled Keras models under
``tf.distribute.MultiWorkerMirroredStrategy`` (one replica per worker).

The embedding tables are split over the workers by the same
:func:`~tabstream.train.sharding.plan_sharding` as in PyTorch (whole tables, row
ranges or column slices; small tables replicated), while the dense part stays
mirrored (data-parallel). Every worker builds the model from the same seed inside
``strategy.scope()``::

    strategy = tf.distribute.MultiWorkerMirroredStrategy()   # TF_CONFIG names the workers
    with strategy.scope():
        model = HybridParallel(DLRM(schema, seed=0), plan="auto")  # or {"C1": "row_wise"}
        optimizer = MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(), large_tables)])
    fit(model, loader, optimizer, checkpoint_dir="ck/", resume=True)   # tabstream's fit
    # or a loop of your own:
    step = model.train_step(optimizer)             # a tf.function of (features, labels)
    for features, labels in batches:               # this worker's rows of each global batch
        loss = step(features, labels)              # the mean over the global batch
    model.full_weights()                           # {variable path: whole array}, every worker
    model.save_checkpoint("ck/"); model.restore_checkpoint("ck/", optimizer)

:func:`tabstream.train.tensorflow.fit` trains the wrapper, or the model it wraps,
through its hooks (``fit_build``, ``fit_global_step``, ``fit_checkpoints``): every
worker checkpoints its own part, and a resume continues mid-epoch.

How a lookup of a sharded table flows (``W`` workers, worker ``r`` holding ``B_r``
rows; :mod:`tabstream.train.tensorflow.exchange` has the details): each id goes only
to the workers that own its table, its row range or a column slice (one all-gather
of the counts, one all-to-all of the ids, TensorFlow's own collective); each owner
pools what its shard holds per requesting row (the whole vector, partial sums over
its rows, or its columns); one all-to-all sends the pooled vectors back, and the
worker adds them into its rows (dividing by the list lengths for
``combiner="mean"``). The backward all-to-all sends the gradients the reverse way, so
each shard receives exactly the gradient of the rows that used it.
``HybridParallel(..., exchange="all_gather")`` keeps the former path (every id to
every worker, vectors by all-reduce); :meth:`HybridParallel.comm_stats` counts the
bytes either moves.

Per-id lookups (``combiner=None``) go the same way with one "row" per id.

The shards are plain (not mirrored) variables of each worker; a copy of the
optimizer built from its config (the same rules, its own slots) updates them
outside the replica context, so their gradients are never summed over workers.
The step's loss on worker ``r`` is its rows' loss sum divided by the global row
count: summed over workers (as Keras sums the mirrored gradients, and as the
exchange's backward gathers each shard's from every worker), that is the gradient of the
global mean.
Training therefore follows the path of one process on the concatenated global
batch (worker 0's rows first), whatever the workers' batch sizes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.core.errors import TabstreamError
from tabstream.core.jsonfile import read_json_file
from tabstream.train.checks import CheckpointError, checkpoint_write
from tabstream.train.sharding import (
    SHARDING_TYPES,
    ShardingPlan,
    TablePlacement,
    plan_sharding,
    resolve_plan,
)
from tabstream.train.tables import TableConfig
from tabstream.train.tensorflow.embeddings import EmbeddingTables, check_ids, sum_duplicate_rows
from tabstream.train.tensorflow.exchange import (
    COUNTERS,
    EXCHANGES,
    Collectives,
    Lookup,
    all_gather_exchange,
    all_to_all_exchange,
    comm_dict,
)
from tabstream.train.tensorflow.optimizers import MultiOptimizer, sum_repeated_ids

__all__ = ["HybridParallel", "SHARDING_TYPES", "ShardedEmbeddingTables", "ShardingPlan",
           "TablePlacement", "plan_sharding", "reshard"]


def _worker_of(strategy: tf.distribute.Strategy) -> tuple[int, int]:
    """``(this worker's index, number of workers)``; ``(0, 1)`` without a cluster."""
    resolver = getattr(strategy, "cluster_resolver", None)
    world = int(strategy.num_replicas_in_sync)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return 0, world
    spec = resolver.cluster_spec().as_dict()
    workers = len(spec.get("chief", [])) + len(spec.get("worker", []))
    if workers != world:
        raise ValueError(
            f"HybridParallel needs one replica per worker, but the strategy has {world} "
            f"replicas over {workers} workers; give each worker one device "
            "(CUDA_VISIBLE_DEVICES) or none"
        )
    task_type, task_id = resolver.task_type, int(resolver.task_id or 0)
    if task_type == "worker" and "chief" in spec:
        task_id += 1
    return task_id, world


def _outside_strategy(fn: Callable[[], Any]) -> Any:
    """``fn()`` run where no tf.distribute strategy is in scope (a scope is
    per-thread): variables made there are plain, and optimizers made there update
    plain variables. What a shard and its optimizer state need."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name="tabstream-shards")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class _ShardedTable:
    """One sharded table as :meth:`EmbeddingTables.lookup` sees a table: ``_gather``
    (per-id vectors) and ``pool`` (pooled lists) run the exchange of the module
    docstring; the layouts are read by the same code as for a local table."""

    def __init__(self, config: TableConfig, placement: TablePlacement, rank: int,
                 world_size: int, shard: keras.Variable | None, anchor: keras.Variable | None,
                 batch: _Batch, stats: tf.Variable | None) -> None:
        self.config = config
        self.placement = placement
        self.rank = rank
        self.world_size = world_size
        self.shard = shard
        self.anchor = anchor
        self.batch = batch
        self.stats = stats

    @property
    def dim(self) -> int:
        return self.config.dim

    def __call__(self, ids: Any, feature: str | None = None) -> tf.Tensor:
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 2 and ids.shape[1] == 1:
            ids = tf.squeeze(ids, axis=1)
        if ids.shape.rank != 1:
            raise ValueError(
                f"table {self.config.name!r}: single-hot lookups take ids of shape [B] or "
                f"[B, 1], got {ids.shape}; pass list features through EmbeddingTables"
            )
        return self._gather(ids, feature)

    def _gather(self, ids: tf.Tensor, feature: str | None = None) -> tf.Tensor:
        if self.batch.replaying:
            return self.batch.next_result()
        ids = tf.reshape(check_ids(ids, self.config, feature or self.config.name), [-1])
        n = tf.shape(ids, out_type=tf.int64)[0]
        return self._exchange(ids, tf.range(n), n, mean=False, single=True)

    def pool(self, values: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor,
             feature: str | None = None) -> tf.Tensor:
        if self.batch.replaying:
            return self.batch.next_result()
        values = check_ids(values, self.config, feature or self.config.name)
        return self._exchange(values, row_ids, nrows, mean=self.config.combiner == "mean")

    def _exchange(self, values: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor,
                  mean: bool, single: bool = False) -> tf.Tensor:
        ctx = tf.distribute.get_replica_context()
        if ctx is None:
            raise ValueError(
                "HybridParallel: a sharded table is looked up in the cross-replica context; "
                "call the model inside strategy.run (HybridParallel.train_step and "
                "HybridParallel.predict do)"
            )
        values = tf.cast(tf.reshape(values, [-1]), tf.int64)
        row_ids = tf.cast(tf.reshape(row_ids, [-1]), tf.int64)
        nrows = tf.cast(nrows, tf.int64)
        if self.batch.recording:  # exchanged with the call's other lookups
            self.batch.record(Lookup(values, row_ids, nrows, self.placement, self.config.dim,
                                     self.shard, single), mean)
            return tf.zeros(tf.stack([nrows, tf.constant(self.config.dim, tf.int64)]))
        mine = all_gather_exchange(values, row_ids, nrows, contribution=self._contribution,
                                   rank=self.rank, world=self.world_size, stats=self.stats)
        return _divided(mine, row_ids, nrows) if mean else mine

    def _contribution(self, values: tf.Tensor, rows: tf.Tensor, total: tf.Tensor) -> tf.Tensor:
        cfg, place = self.config, self.placement
        zeros = tf.zeros(tf.stack([total, tf.constant(cfg.dim, tf.int64)]), tf.float32)
        if self.shard is None:
            # Zeros that depend on a (zero-gradient) variable, so that the backward
            # all-reduce of this exchange runs here too: every worker must call the
            # same collectives in the same order, or they pair up wrongly.
            assert self.anchor is not None  # made for every worker lacking a shard
            return zeros * tf.cast(self.anchor.value, zeros.dtype)
        weights = self.shard.value
        if place.kind == "table_wise":
            return tf.math.unsorted_segment_sum(tf.gather(weights, values), rows, total)
        start, stop = place.ranges[self.rank]
        if place.kind == "row_wise":
            keep = tf.logical_and(values >= start, values < stop)
            part = tf.gather(weights, tf.boolean_mask(values, keep) - start)
            return tf.math.unsorted_segment_sum(part, tf.boolean_mask(rows, keep), total)
        part = tf.math.unsorted_segment_sum(tf.gather(weights, values), rows, total)
        return tf.pad(part, [[0, 0], [start, cfg.dim - stop]])


def _divided(pooled: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor) -> tf.Tensor:
    """``combiner="mean"``: each row's sum divided by its list's length."""
    counts = tf.math.unsorted_segment_sum(tf.ones_like(row_ids, pooled.dtype), row_ids, nrows)
    return pooled / tf.maximum(counts, 1.0)[:, None]


class _Batch:
    """The sharded lookups of one call of :class:`ShardedEmbeddingTables`, exchanged
    together (``exchange="all_to_all"``: one all-gather and two all-to-alls for all
    features, not per feature). A first pass of :meth:`EmbeddingTables.lookup` over
    the features records what each asks for (:meth:`record`; placeholders are
    returned, unused); one exchange serves them all; a second pass hands the
    results out in the same order (:meth:`next_result`)."""

    def __init__(self) -> None:
        self.recording = False
        self.replaying = False
        self.pending: list[tuple[Lookup, bool]] = []
        self._results: list[tf.Tensor] = []

    def record(self, lookup: Lookup, mean: bool) -> None:
        self.pending.append((lookup, mean))

    def replay(self, results: list[tf.Tensor]) -> None:
        self.pending, self._results = [], list(results)
        self.replaying = True

    def next_result(self) -> tf.Tensor:
        if not self._results:
            raise RuntimeError("HybridParallel: the second pass over the features asked for "
                               "more lookups than the first recorded")
        return self._results.pop(0)

    def reset(self) -> None:
        self.recording = self.replaying = False
        self.pending, self._results = [], []

    def finish(self) -> None:
        left = len(self._results)
        self.reset()
        if left:
            raise RuntimeError(f"HybridParallel: {left} recorded lookups were not handed out")


class _LookupView:
    """What :meth:`EmbeddingTables.lookup` reads of its layer (``table_for`` and
    ``list_features``), over sharded tables, so that every accepted input layout is
    read by that one piece of code."""

    def __init__(self, tables: dict[str, Any], feature_to_table: dict[str, str],
                 list_features: set[str]) -> None:
        self._tables = tables
        self._feature_to_table = feature_to_table
        self.list_features = list_features

    def table_for(self, feature: str) -> Any:
        return self._tables[self._feature_to_table[feature]]


class ShardedEmbeddingTables(keras.layers.Layer):
    """Stands in for an :class:`EmbeddingTables` inside a model wrapped by
    :class:`HybridParallel`: the same ``call(features) -> {feature: [B, dim]}`` in the
    same feature order. ``replicated`` is an :class:`EmbeddingTables` (mirrored) of the
    ``data_parallel`` tables; ``shards[table]`` is this worker's plain variable of a
    sharded table (absent where it holds none); ``paths[table]`` the path of the
    table's variable in the unwrapped model. ``exchange`` is how a sharded lookup
    travels: ``"all_to_all"`` (each id to its owners only) or ``"all_gather"`` (every
    id to every worker; :mod:`tabstream.train.tensorflow.exchange`); ``comm_total``
    counts the bytes (int64, :data:`~tabstream.train.tensorflow.exchange.COUNTERS`)."""

    def __init__(self, tables: EmbeddingTables, plan: ShardingPlan, rank: int,
                 exchange: str = "all_to_all", **kwargs: Any) -> None:
        if exchange not in EXCHANGES:
            raise ValueError(f"HybridParallel: exchange={exchange!r} is not one of "
                             f"{list(EXCHANGES)}")
        kwargs.setdefault("name", tables.name)
        super().__init__(**kwargs)
        self.exchange = exchange
        self.configs = list(tables.configs)
        self.plan = plan
        self.rank = rank
        self.feature_names = list(tables.feature_names)
        self.list_features = set(tables.list_features)
        by_table = {t.config.name: t for t in tables.tables.values()}
        self._feature_to_table = {f: tables.table_for(f).config.name for f in self.feature_names}
        replicated = [c for c in self.configs if plan[c.name] == "data_parallel"]
        self.replicated: EmbeddingTables | None = None
        if replicated:
            names = {c.name for c in replicated}
            self.replicated = EmbeddingTables(
                replicated, list_features=[f for f in self.list_features
                                           if self._feature_to_table[f] in names],
                name=f"{tables.name}_replicated")
            for cfg in replicated:  # the model's own (mirrored) initial weights
                self.replicated.tables[cfg.name].embeddings.assign(by_table[cfg.name].embeddings)
        # kept off Keras' tracking: plain variables, not the model's mirrored weights
        paths = {c.name: by_table[c.name].embeddings.path for c in self.configs}
        pieces = {}
        for cfg in self.configs:
            if plan[cfg.name] == "data_parallel":
                continue
            place = plan.placements[cfg.name]
            for k, a, b in place.pieces():
                if k == rank:
                    full = by_table[cfg.name].embeddings.numpy()
                    pieces[cfg.name] = (full if place.kind == "table_wise" else
                                        full[a:b] if place.kind == "row_wise" else full[:, a:b])

        needs_anchor = any(plan[c.name] != "data_parallel" and c.name not in pieces
                           for c in self.configs)

        def make_shards() -> tuple[dict[str, keras.Variable], keras.Variable | None,
                                   list[tf.Variable]]:
            out = {}
            for name, value in pieces.items():
                scope, _, leaf = paths[name].rpartition("/")
                with keras.name_scope(scope or name):
                    out[name] = keras.Variable(np.ascontiguousarray(value), name=leaf,
                                               dtype="float32")
            anchor = None
            if needs_anchor:
                with keras.name_scope(self.name):
                    anchor = keras.Variable(0.0, name="exchange_anchor", dtype="float32")
            # byte counters (total, and the total when the last step began) and steps
            counters = [tf.Variable(tf.zeros([len(COUNTERS)], tf.int64), trainable=False,
                                    name=f"{self.name}_comm_{what}") for what in ("total", "start")]
            counters.append(tf.Variable(tf.zeros([], tf.int64), trainable=False,
                                        name=f"{self.name}_comm_steps"))
            return out, anchor, counters

        shards, anchor, counters = _outside_strategy(make_shards)
        object.__setattr__(self, "shards", shards)
        object.__setattr__(self, "anchor", anchor)
        object.__setattr__(self, "paths", paths)
        for attr, var in zip(("comm_total", "comm_start", "comm_steps"), counters, strict=True):
            object.__setattr__(self, attr, var)
        object.__setattr__(self, "_batch", _Batch())
        object.__setattr__(self, "_collectives", None)  # made at the first exchange
        sharded = {c.name: _ShardedTable(c, plan.placements[c.name], rank, plan.world_size,
                                         self.shards.get(c.name), anchor, self._batch,
                                         self.comm_total)
                   for c in self.configs if plan[c.name] != "data_parallel"}
        object.__setattr__(self, "_view", _LookupView(sharded, self._feature_to_table,
                                                      self.list_features))
        self.built = True

    def build(self, input_shape: Any = None) -> None:
        self.built = True

    def call(self, features: Mapping[str, Any]) -> dict[str, Any]:
        sharded = [f for f in self.feature_names
                   if self.plan[self._feature_to_table[f]] != "data_parallel"]
        batch = self._batch
        try:
            if sharded and self.exchange == "all_to_all" and self.plan.world_size > 1:
                batch.recording = True
                for f in sharded:
                    EmbeddingTables.lookup(self._view, f, features)
                batch.recording = False
                batch.replay(self._exchange(batch.pending))
            out = {}
            for f in self.feature_names:
                if f not in sharded:
                    assert self.replicated is not None  # holds every data_parallel table
                    out[f] = self.replicated.lookup(f, features)
                else:
                    out[f] = EmbeddingTables.lookup(self._view, f, features)
        except BaseException:
            batch.reset()  # the next call starts clean; the error goes on
            raise
        batch.finish()
        return out

    def _exchange(self, pending: list[tuple[Lookup, bool]]) -> list[tf.Tensor]:
        """The recorded lookups in one all-to-all exchange, ``combiner="mean"`` divided."""
        if self._collectives is None:
            object.__setattr__(self, "_collectives", Collectives(tf.distribute.get_strategy()))
        pooled = all_to_all_exchange([look for look, _ in pending], rank=self.rank,
                                     anchor=self.anchor, coll=self._collectives,
                                     stats=self.comm_total)
        return [_divided(p, look.row_ids, look.nrows) if mean else p
                for p, (look, mean) in zip(pooled, pending, strict=True)]


def _replace_layer(model: keras.Model, attr: str, old: keras.layers.Layer,
                   new: keras.layers.Layer) -> None:
    """``model.<attr> = new`` in place of the sub-layer ``old``, which stops being one
    of the model's layers (its variables leave ``model.weights``). Keras 3 untracks a
    deleted attribute only when it is a variable, so the layer is untracked here
    through the model's tracker, then checked gone through the public ``layers``."""
    tracker = getattr(model, "_tracker", None)
    if tracker is None or not callable(getattr(tracker, "untrack", None)):
        raise TypeError(f"HybridParallel: cannot replace the layer {attr!r} of "
                        f"{type(model).__name__} with this Keras version ({keras.__version__})")
    tracker.untrack(old)
    object.__delattr__(model, attr)
    setattr(model, attr, new)
    if any(layer is old for layer in model.layers):
        raise TypeError(f"HybridParallel: the layer {attr!r} of {type(model).__name__} is still "
                        f"tracked after its replacement (Keras {keras.__version__})")


def _open_spec(value: Any) -> Any:
    """``tf.TensorSpec``s of ``value`` with every dimension open: one trace serves
    every batch (each worker must trace its collectives alike, whatever its batch)."""
    return tf.nest.map_structure(
        lambda t: tf.TensorSpec([None] * t.shape.rank, t.dtype), value)


def _split_optimizer(optimizer: keras.optimizers.Optimizer, shard_paths: set[str],
                     mirrored_paths: set[str]) -> tuple[Any, Any, tuple[list[int], list[int]]]:
    """``(optimizer for the mirrored variables, copy for the shards, numbers)``. A
    :class:`MultiOptimizer` is cut into two by its claims (as variable paths);
    ``numbers`` gives, for each part, the index in ``optimizer.optimizers`` of each of
    its optimizers (what checkpoints name them by)."""
    if not isinstance(optimizer, MultiOptimizer):
        config = optimizer.get_config()
        return (sum_repeated_ids(optimizer), lambda: type(optimizer).from_config(config),
                ([0], [0]))
    config = optimizer.get_config()

    def part(paths: set[str]) -> tuple[dict[str, Any], list[int]]:
        entries, numbers = [], [0]
        for i, (ser, claims) in enumerate(config["optimizers_and_blocks"]):
            kept = [c for c in claims if any(p == c or p.startswith(c + "/") for p in paths)]
            if kept:
                entries.append([ser, kept])
                numbers.append(i + 1)
        return {**config, "optimizers_and_blocks": entries}, numbers

    (mirrored, m_numbers), (shard, s_numbers) = part(mirrored_paths), part(shard_paths)
    return (MultiOptimizer.from_config(mirrored), lambda: MultiOptimizer.from_config(shard),
            (m_numbers, s_numbers))


def _binary_crossentropy(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    return tf.nn.sigmoid_cross_entropy_with_logits(tf.cast(labels, logits.dtype), logits)


class HybridParallel:
    """Shards a bundled Keras model's embedding tables over the workers of a
    ``MultiWorkerMirroredStrategy``; the rest stays mirrored. Build it inside
    ``strategy.scope()`` on every worker, from the same seed, on a model not yet
    called (its first call builds the dense layers, mirrored).

    Args:
        model: a Keras model holding :class:`EmbeddingTables` layers (``DLRM``,
            ``DCN``, ``WideAndDeep``).
        plan: a :class:`ShardingPlan`, a strategy name (``"auto"``, ``"table_wise"``,
            ``"row_wise"``, ``"column_wise"``, ``"data_parallel"``), ``{table: type}``
            overriding ``"auto"`` for those tables, or ``None`` (``"auto"``).
        strategy: default: the strategy in scope.
        exchange: how a sharded table's lookup travels: ``"all_to_all"`` (default;
            each id only to the workers owning its table, rows or columns, through
            TensorFlow's collective all-to-all) or ``"all_gather"`` (every id to every
            worker, vectors by all-reduce; the former path). See
            :mod:`tabstream.train.tensorflow.exchange`; :meth:`comm_stats` counts bytes.

    ``model(features)`` works inside ``strategy.run``; :meth:`train_step` and
    :meth:`predict` do that. ``trainable_variables`` are the mirrored ones,
    ``shard_variables`` this worker's shards. :func:`tabstream.train.tensorflow.fit`
    trains the wrapper, or the wrapped model (which then names its wrapper as
    ``model.fit_target``); Keras' own ``model.fit`` is refused for it.
    """

    def __init__(self, model: keras.Model, plan: Any = None,
                 strategy: tf.distribute.Strategy | None = None,
                 exchange: str = "all_to_all") -> None:
        if not isinstance(model, keras.Model):
            raise TypeError(f"HybridParallel wraps a keras.Model, got {type(model).__name__}")
        if exchange not in EXCHANGES:
            raise ValueError(f"HybridParallel: exchange={exchange!r} is not one of "
                             f"{list(EXCHANGES)}")
        if model.built:
            raise ValueError(
                f"HybridParallel: {model.name!r} has been called already; wrap the model "
                "right after constructing it (inside strategy.scope()), before its first call"
            )
        self.strategy = strategy if strategy is not None else tf.distribute.get_strategy()
        self.rank, self.world_size = _worker_of(self.strategy)
        self.plan = resolve_plan(plan, model, self.world_size)
        self.model = model
        self.sharded: dict[str, ShardedEmbeddingTables] = {}
        for attr, value in list(vars(model).items()):
            if isinstance(value, EmbeddingTables):
                with self.strategy.scope():
                    sharded = ShardedEmbeddingTables(value, self.plan, self.rank,
                                                     exchange=exchange)
                _replace_layer(model, attr, value, sharded)
                self.sharded[attr] = sharded
        if not self.sharded:
            raise ValueError(f"HybridParallel: {type(model).__name__} has no EmbeddingTables "
                             "attribute to shard")
        unknown = set(self.plan) - {c.name for s in self.sharded.values() for c in s.configs}
        if unknown:
            raise ValueError(f"HybridParallel: the plan names tables {sorted(unknown)} that "
                             "the model does not have")
        self._steps: dict[str, Any] = {}
        self._optimizers: tuple[Any, Any, Any] | None = None
        self._numbers: tuple[list[int], list[int]] | None = None
        # fit(model) on the wrapped model trains through this wrapper (its own step
        # would leave the shards untouched); Keras' model.fit is refused for it
        object.__setattr__(model, "fit_target", self)

    # -- variables ------------------------------------------------------------
    @property
    def shard_variables(self) -> list[keras.Variable]:
        """This worker's shards (plain variables), in table order, and the zero
        scalar (``exchange_anchor``) of a worker lacking some table's shard."""
        out = []
        for s in self.sharded.values():
            out.extend(s.shards.values())
            if s.anchor is not None:
                out.append(s.anchor)
        return out

    @property
    def trainable_variables(self) -> list[Any]:
        """The mirrored (data-parallel) variables: dense layers and replicated tables."""
        return list(self.model.trainable_variables)

    @property
    def built(self) -> bool:
        return bool(self.model.built)

    @property
    def distribute_strategy(self) -> tf.distribute.Strategy:
        """The strategy the wrapper was built under (``fit``'s default for it)."""
        return self.strategy

    def example_batch(self, batch_size: int = 2) -> dict[str, Any]:
        """The wrapped model's ``example_batch`` (zeros shaped like its inputs)."""
        make = getattr(self.model, "example_batch", None)
        if not callable(make):
            raise TypeError(f"HybridParallel: {type(self.model).__name__} has no example_batch; "
                            "call build(features) with a batch of its inputs")
        return make(batch_size)

    def build(self, features: Mapping[str, Any] | None) -> None:
        """Create the dense layers (mirrored) by one call on ``features``
        (collective: every worker calls it; default: the model's ``example_batch``)."""
        if self.model.built:
            return
        if features is None:
            features = self.example_batch()
        features = tf.nest.map_structure(tf.convert_to_tensor, features)

        @tf.function(autograph=False)
        def call(x: Any) -> Any:
            return self.strategy.run(lambda f: self.model(f, training=False), args=(x,))

        with self.strategy.scope():
            call(features)

    def __call__(self, features: Mapping[str, Any], training: bool = False) -> Any:
        return self.model(features, training=training)

    # -- training ---------------------------------------------------------------
    def optimizers(self, optimizer: keras.optimizers.Optimizer) -> tuple[Any, Any]:
        """``(mirrored, shards)``: what updates the mirrored variables (``optimizer``
        itself, or for a :class:`MultiOptimizer` its entries that claim them) and
        the copy that updates this worker's shards (built outside the strategy)."""
        if self._optimizers is not None and self._optimizers[2] is optimizer:
            return self._optimizers[0], self._optimizers[1]
        self._numbers = None
        shard_paths = {v.path for v in self.shard_variables} | {
            s.paths[c.name] for s in self.sharded.values() for c in s.configs
            if self.plan[c.name] != "data_parallel"}
        mirrored_paths = {v.path for v in self.trainable_variables}
        with self.strategy.scope():
            mirrored, make_shard_opt, numbers = _split_optimizer(optimizer, shard_paths,
                                                                 mirrored_paths)
            mirrored.build(self.trainable_variables)
        shards = self.shard_variables

        def make() -> Any:
            opt = make_shard_opt()
            opt.build(shards)
            return opt

        shard_opt = _outside_strategy(make)
        self._optimizers = (mirrored, shard_opt, optimizer)
        self._numbers = numbers
        return mirrored, shard_opt

    def optimizer_numbers(self, optimizer: keras.optimizers.Optimizer
                          ) -> tuple[list[int], list[int]]:
        """For the two parts of :meth:`optimizers` (mirrored, shards): the index in
        ``optimizer.optimizers`` (0 for a plain optimizer) of each of their optimizers."""
        self.optimizers(optimizer)
        assert self._numbers is not None
        return self._numbers

    # -- the hooks of tabstream.train.tensorflow.fit ------------------------------
    def fit_build(self, features: Mapping[str, Any] | None, optimizer: Any,
                  strategy: tf.distribute.Strategy) -> None:
        """Build the model and the optimizer's two parts before ``fit`` trains (or
        resumes); ``strategy`` must be the one the wrapper was built under."""
        if strategy is not self.strategy:
            raise ValueError(
                f"fit: this HybridParallel was built under {type(self.strategy).__name__} "
                f"(id {id(self.strategy)}), but fit was given {type(strategy).__name__} "
                f"(id {id(strategy)}); pass strategy= the one in whose scope the model was "
                "wrapped, or leave it out (fit then uses that one)"
            )
        self.build(features)
        self.optimizers(optimizer)

    def fit_checkpoints(self, directory: str | os.PathLike[str],
                        optimizer: keras.optimizers.Optimizer) -> _HybridCheckpoints:
        """``fit``'s checkpoint files: every worker writes its own part (see
        :class:`_HybridCheckpoints`)."""
        return _HybridCheckpoints(self, directory, optimizer)

    def fit_global_step(self, features: Any, labels: Any,
                        loss_sum: Callable[[Any, Any], tf.Tensor],
                        optimizer: keras.optimizers.Optimizer) -> tuple[Any, Any]:
        """One step of the global batch, in the cross-replica context of a compiled
        function (the hook :func:`tabstream.train.tensorflow.fit` calls in place of its
        ``strategy.run``): ``strategy.run`` of this worker's gradient of the mean
        loss over the global batch, the mirrored variables updated there (Keras sums
        their gradients over the workers), then this worker's shards updated outside
        the replica context, where their gradients are not summed. Returns the
        per-replica ``(summed loss of this worker's rows, its rows)``.
        ``loss_sum(features, labels)`` is the summed loss of a worker's rows."""
        mirrored, shard_opt = self.optimizers(optimizer)
        mirrored_vars, shards = self.trainable_variables, self.shard_variables

        def replica(f: Any, y: Any) -> Any:
            ctx = tf.distribute.get_replica_context()
            local = tf.cast(tf.shape(tf.reshape(y, [-1]))[0], tf.float32)
            total = ctx.all_reduce(tf.distribute.ReduceOp.SUM, local)
            with tf.GradientTape() as tape:
                summed = loss_sum(f, y)
                # summed over workers, this is the global mean's gradient
                loss = summed / tf.maximum(total, 1.0)
            grads = tape.gradient(loss, mirrored_vars + shards)
            mirrored.apply(grads[:len(mirrored_vars)], mirrored_vars)
            return summed, local, grads[len(mirrored_vars):]

        for s in self.sharded.values():  # comm_stats' "last": from here
            s.comm_start.assign(s.comm_total.read_value())
            s.comm_steps.assign_add(1)
        summed, rows, shard_grads = self.strategy.run(replica, args=(features, labels))
        if shards:
            # one row per id: Keras' own optimizers take an IndexedSlices' rows as
            # distinct ids (a repeated id would get the squares of its parts)
            shard_opt.apply([_one_row_per_id(self.strategy.experimental_local_results(g)[0])
                             for g in shard_grads], shards)
        return summed, rows

    def train_step(self, optimizer: keras.optimizers.Optimizer,
                   loss_fn: Callable[[Any, Any], tf.Tensor] | None = None) -> Callable[..., Any]:
        """A compiled step ``(features, labels) -> mean loss over the global batch``
        for this worker's rows. ``loss_fn(labels, outputs)`` (Keras' order: the
        labels first, unlike :func:`~tabstream.train.tensorflow.fit`'s
        ``loss_fn(logits, labels)``) returns one loss per row, shape ``[B]``, or a
        scalar, the mean over this worker's rows (default: binary cross-entropy on
        logits, per row); either way each row of the global batch weighs the same.
        Traced once (every dimension open), so workers whose batch sizes differ stay
        in step."""
        from tabstream.train.tensorflow.fit import batch_rows, summed_loss

        per_row = loss_fn or _binary_crossentropy
        strategy = self.strategy
        state: dict[str, Any] = {}

        def loss_sum(f: Any, y: Any) -> tf.Tensor:
            return summed_loss(per_row(y, self.model(f, training=True)), batch_rows(f, y),
                               "HybridParallel.train_step")

        def global_step(features: Any, labels: Any) -> tf.Tensor:
            loss_sum_, rows = self.fit_global_step(features, labels, loss_sum, optimizer)
            total = tf.distribute.ReduceOp.SUM
            return (strategy.reduce(total, loss_sum_, axis=None)
                    / strategy.reduce(total, rows, axis=None))

        def step(features: Any, labels: Any) -> tf.Tensor:
            features = tf.nest.map_structure(tf.convert_to_tensor, features)
            labels = tf.convert_to_tensor(labels)
            if "compiled" not in state:
                self.build(features)
                self.optimizers(optimizer)  # built before the trace
                state["compiled"] = tf.function(
                    global_step, input_signature=[_open_spec(features), _open_spec(labels)],
                    autograph=False)
            return state["compiled"](features, labels)

        return step

    def predict(self, features: Mapping[str, Any]) -> np.ndarray:
        """This worker's outputs for its ``features`` (collective: every worker calls
        it, each with its own rows)."""
        features = tf.nest.map_structure(tf.convert_to_tensor, features)
        self.build(features)
        if "predict" not in self._steps:
            strategy = self.strategy

            def run(x: Any) -> Any:
                out = strategy.run(lambda f: self.model(f, training=False), args=(x,))
                return strategy.experimental_local_results(out)[0]

            self._steps["predict"] = tf.function(run, input_signature=[_open_spec(features)],
                                                 autograph=False)
        return self._steps["predict"](features).numpy()

    def comm_stats(self) -> dict[str, Any]:
        """Bytes this worker's embedding exchanges sent to and received from the other
        workers (its chunks to itself are not counted), as torch's
        ``HybridParallel.comm_stats()``: ``{"steps": n, "last": {...}, "total": {...}}``,
        ``"last"`` since the last training step began (its forward and backward),
        ``"total"`` since construction. Each holds ``<kind>_sent`` and
        ``<kind>_received`` for the kinds ``sizes`` (int64 counts), ``ids`` (int64 ids
        and bag lengths), ``vectors`` (float32 pooled vectors back to the rows'
        worker) and ``gradients`` (their gradients, backward), as they travel:
        padded to the largest chunk of any pair of workers, which TensorFlow's
        all-to-all needs; ``ids_payload_sent`` / ``vectors_payload_sent`` are the
        part that is not padding; ``sent`` / ``received`` sum the kinds. The
        mirrored variables' gradient all-reduce is not included::

            stats = model.comm_stats()
            stats["last"]["ids_sent"], stats["total"]["sent"] / stats["steps"]
        """
        total = np.zeros(len(COUNTERS), np.int64)
        start = np.zeros(len(COUNTERS), np.int64)
        steps = 0
        for s in self.sharded.values():
            total += s.comm_total.numpy()
            start += s.comm_start.numpy()
            steps = max(steps, int(s.comm_steps.numpy()))
        return {"steps": steps, "last": comm_dict(total - start), "total": comm_dict(total)}

    # -- whole weights ----------------------------------------------------------
    def full_weights(self) -> dict[str, np.ndarray]:
        """Collective (every worker calls it): ``{variable path: array}`` of the
        unwrapped model, every table whole, the same on every worker."""
        out = {v.path: np.asarray(v.numpy()) for v in self.model.weights}
        for s in self.sharded.values():
            if s.replicated is not None:  # under the unwrapped model's paths
                for cfg in s.replicated.configs:
                    table = s.replicated.tables[cfg.name].embeddings
                    out.pop(table.path, None)
                    out[s.paths[cfg.name]] = np.asarray(table.numpy())
        # each worker places its shards in zero tables; their sum over the workers
        # is every whole table (x + 0 is exact), on every worker: one all-reduce
        paths, wholes = [], []
        for s in self.sharded.values():
            for cfg in s.configs:
                if self.plan[cfg.name] != "data_parallel":
                    paths.append(s.paths[cfg.name])
                    wholes.append(self._placed_shard(s, cfg))
        if wholes:
            if "full" not in self._steps:
                strategy = self.strategy

                def total(*xs: tf.Tensor) -> Any:
                    # tf.identity: tensors on this replica's device (arguments have none)
                    out = strategy.run(lambda *v: tf.distribute.get_replica_context().all_reduce(
                        tf.distribute.ReduceOp.SUM, [tf.identity(t) for t in v]), args=xs)
                    return strategy.experimental_local_results(out)[0]

                self._steps["full"] = tf.function(total, autograph=False, input_signature=[
                    tf.TensorSpec(w.shape, tf.float32) for w in wholes])
            summed = self._steps["full"](*[tf.constant(w) for w in wholes])
            out.update({p: np.asarray(t.numpy()) for p, t in zip(paths, summed, strict=True)})
        return out

    def _placed_shard(self, sharded: ShardedEmbeddingTables, cfg: TableConfig) -> np.ndarray:
        """This worker's shard of a table inside a zero array of the whole table's shape."""
        place = self.plan.placements[cfg.name]
        whole = np.zeros((cfg.cardinality, cfg.dim), np.float32)
        mine = sharded.shards.get(cfg.name)
        if mine is not None:
            if place.kind == "table_wise":
                whole[:] = mine.numpy()
            else:
                a, b = place.ranges[self.rank]
                if place.kind == "row_wise":
                    whole[a:b] = mine.numpy()
                else:
                    whole[:, a:b] = mine.numpy()
        return whole

    # -- checkpoints ------------------------------------------------------------
    def _checkpoint(self, optimizer: keras.optimizers.Optimizer | None) -> tf.train.Checkpoint:
        parts: dict[str, Any] = {
            "model": self.model,
            "shards": {name: v.value for s in self.sharded.values()
                       for name, v in s.shards.items()},
        }
        if optimizer is not None:
            mirrored, shard_opt = self.optimizers(optimizer)
            parts["optimizer"] = mirrored
            parts["shard_optimizer"] = shard_opt
        return tf.train.Checkpoint(**parts)

    def save_checkpoint(self, directory: str | os.PathLike[str],
                        optimizer: keras.optimizers.Optimizer | None = None) -> str:
        """Each worker writes its own part (its regions of the tables and of their
        optimizer state, plus the mirrored weights and their optimizer state) to
        ``directory/worker-<rank>-of-<W>`` and returns its path;
        :meth:`restore_checkpoint` reads the parts back, on any number of workers and
        with any plan (:mod:`tabstream.train.tensorflow.reshard`)."""
        return self.write_part(self.part_dir(directory), optimizer)

    def restore_checkpoint(self, directory: str | os.PathLike[str],
                           optimizer: keras.optimizers.Optimizer | None = None) -> None:
        """Read the parts written by :meth:`save_checkpoint` (by this many workers or
        another, with this plan or another); training then continues where it stopped."""
        directory = os.fspath(directory)
        parts = _parts_in(Path(directory))
        if not parts:
            found = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
            raise CheckpointError(
                f"HybridParallel: {directory!r} has no part for worker {self.rank} "
                f"of {self.world_size} (found {found}); restore with the plan and number of "
                "workers it was saved with"
            )
        world = self.world_size if self.world_size in parts else max(parts)
        self.read_parts(parts[world], optimizer, where=directory)

    def part_dir(self, directory: str | os.PathLike[str]) -> str:
        """This worker's folder in a checkpoint ``directory``."""
        return os.path.join(os.fspath(directory), f"worker-{self.rank}-of-{self.world_size}")

    def write_part(self, part: str, optimizer: keras.optimizers.Optimizer | None) -> str:
        """Write this worker's weights, shards and optimizer state into ``part``, in
        whole-table coordinates (:func:`tabstream.train.tensorflow.reshard.write_wrapper`)."""
        from tabstream.train.tensorflow.reshard import write_wrapper

        self.build(None)
        write_wrapper(self, optimizer, part)
        return part

    def read_parts(self, parts: Sequence[str | os.PathLike[str]],
                   optimizer: keras.optimizers.Optimizer | None, where: str) -> Any:
        """Read the saves ``parts`` (one per worker that wrote them, in worker order)
        into this worker's variables; returns what was done (``Restored``: the world
        size that wrote them, whether anything was resharded, the bytes read). A part of
        an older version (a TensorFlow checkpoint of this worker's variables) is read as
        written: the same plan and number of workers only."""
        from tabstream.train.tensorflow.reshard import (
            Restored,
            is_keras_checkpoint,
            restore_wrapper,
        )

        folders = [Path(p) for p in parts]
        first = folders[self.rank] if len(folders) == self.world_size else folders[0]
        if is_keras_checkpoint(first):
            return restore_wrapper(self, optimizer, folders, where)
        if len(folders) != self.world_size:
            raise CheckpointError(
                f"HybridParallel: the checkpoint in {where!r} was written by {len(folders)} "
                f"workers in an older format, which resumes on as many workers only; resume "
                f"it once on {len(folders)} workers with this version (its next save can be "
                "resharded)"
            )
        self.read_part(os.fspath(folders[self.rank]), optimizer, where)
        return Restored(len(folders), False, 0)

    def read_part(self, part: str, optimizer: keras.optimizers.Optimizer | None,
                  where: str) -> None:
        """Read this worker's part of the older format (a TensorFlow checkpoint written
        with the same plan; ``where`` names the checkpoint in errors)."""
        with open(os.path.join(part, "plan.json")) as fh:
            saved = json.load(fh)
        if saved["plan"] != dict(self.plan):
            raise CheckpointError(
                f"HybridParallel: the checkpoint in {where!r} was saved with "
                f"plan {saved['plan']}, this model has {dict(self.plan)}; build the model "
                "with the plan it was saved with"
            )
        self.build(None)
        self._checkpoint(optimizer).read(os.path.join(part, "ckpt")).assert_consumed()

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """Collective: ``values`` (float64) summed over the workers."""
        values = np.asarray(values, np.float64)
        if self.world_size == 1:
            return values
        if "all_sum" not in self._steps:
            strategy = self.strategy

            def total(x: tf.Tensor) -> Any:
                out = strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.identity(v)), args=(x,))
                return strategy.experimental_local_results(out)[0]

            self._steps["all_sum"] = tf.function(total, autograph=False, input_signature=[
                tf.TensorSpec(None, tf.float64)])
        return np.asarray(self._steps["all_sum"](tf.constant(values)).numpy())


class _HybridCheckpoints:
    """The checkpoint files of ``fit`` for a :class:`HybridParallel`: every worker
    writes its own part (its regions of the tables and of their optimizer state in
    whole-table coordinates, the mirrored weights, the loop's state)::

        checkpoint_dir/worker-<rank>-of-<W>/step-<global step>-<epoch>-<batch>/
            00000.npy ..., index.json, state.json (written last)

    A save goes to a hidden folder renamed into place, and the part keeps the
    previous save until the next one is whole, so a worker dying in the middle of
    a save leaves every worker holding a save they all have. :meth:`load` (every
    worker together) restores the newest save that every worker holds whole; when
    the newest whole save was written by another number of workers (the folders
    ``worker-<r>-of-<W'>``), it is resharded to this run's workers and plan
    (:mod:`tabstream.train.tensorflow.reshard`) and :attr:`resume_note` says so.

    A run that did not resume (``resume=False``, or nothing to resume) starts over:
    once its first save is whole, each worker removes the parts that other numbers of
    workers wrote there (its own part keeps only the new save), so a later resume
    continues this run, never an older one with a higher global step."""

    every_worker_writes = True

    def __init__(self, wrapper: HybridParallel, directory: str | os.PathLike[str],
                 optimizer: keras.optimizers.Optimizer) -> None:
        self.wrapper, self.optimizer = wrapper, optimizer
        self.dir = Path(directory)
        self.part = Path(wrapper.part_dir(directory))
        self._previous: str | None = None  # the save before the newest, kept until the next
        self._chosen: tuple[int, tuple[int, int, int], list[Path]] | None = None
        #: what loading did to the tables (resharded), for the loop's resume line
        self.resume_note: str | None = None
        #: whether this run continues a save (load) or started over; an older run's
        #: parts are removed at the first save of a run that started over
        self._resumed = False
        self._saved = False

    def _saves(self) -> dict[tuple[int, int, int], Path]:
        """This worker's whole saves by (global step, epoch, batch)."""
        from tabstream.train.tensorflow.reshard import saves_of

        return saves_of(self.part)

    def _common(self) -> tuple[tuple[int, int, int] | None, list[list[tuple[int, int, int]]]]:
        """Collective: the newest save every worker holds, and each worker's saves."""
        w = self.wrapper
        mine = sorted(self._saves())[-_KEPT:]
        table = np.full((w.world_size, _KEPT, 3), 0.0)
        table[w.rank, :, :] = -1.0
        for i, key in enumerate(mine):
            table[w.rank, i] = key
        table = w.all_sum(table.reshape(-1)).reshape(w.world_size, _KEPT, 3)
        per_worker = [sorted(tuple(int(x) for x in row) for row in table[r] if row[0] >= 0)
                      for r in range(w.world_size)]
        common = set(per_worker[0]).intersection(*map(set, per_worker[1:]))
        return (max(common) if common else None), per_worker

    def _elsewhere(self) -> tuple[int, tuple[int, int, int], list[Path]] | None:
        """Collective: the newest save written whole by another number of workers
        (found on the filesystem, which every worker must see alike)."""
        from tabstream.train.tensorflow.reshard import complete_saves

        w = self.wrapper
        found = complete_saves(self.dir)
        found.pop(w.world_size, None)
        best = max(((world, key, folders) for world, (key, folders) in found.items()),
                   key=lambda item: item[1], default=None)
        mine = np.array([1.0, best[0], *best[1]] if best else [0.0] * 5)
        if not np.array_equal(w.all_sum(mine), mine * w.world_size):
            raise CheckpointError(
                f"checkpoint_dir {self.dir}: the workers see different saves of another number "
                "of workers there; resuming on another number of workers reads the other "
                "workers' parts, so checkpoint_dir must be a folder every worker sees (a shared "
                "filesystem)"
            )
        return best

    def _choose(self) -> tuple[int, tuple[int, int, int], list[Path]] | None:
        """Collective: ``(world size, key, save folders)`` of the save to resume."""
        w = self.wrapper
        newest, per_worker = self._common()
        other = self._elsewhere()
        if other is not None and (newest is None or other[1] > newest):
            return other
        if newest is None:
            if any(per_worker):
                held = {f"worker {r}": [f"step-{a}-{b}-{c}" for a, b, c in saves]
                        for r, saves in enumerate(per_worker)}
                raise CheckpointError(
                    f"checkpoint_dir {self.dir}: no save is held whole by all "
                    f"{w.world_size} workers ({held}); were its parts written by another run? "
                    "Resume with the folder each worker wrote, or start over with "
                    "resume=False (or another checkpoint_dir)"
                )
            return None
        name = f"step-{newest[0]}-{newest[1]}-{newest[2]}"
        return w.world_size, newest, [self.dir / f"worker-{r}-of-{w.world_size}" / name
                                      for r in range(w.world_size)]

    def exists(self) -> bool:
        """Collective: whether there is a checkpoint to resume (refused when some
        workers hold saves and no save is held by all)."""
        self._chosen = self._choose()
        return self._chosen is not None

    def needed_bytes(self) -> int:
        """At least this worker's part: the mirrored weights and its shards."""
        variables = list(self.wrapper.model.weights) + self.wrapper.shard_variables
        return sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in variables)

    def save(self, state: dict[str, Any]) -> None:
        key = f"step-{int(state['global_step'])}-{int(state['epoch'])}-{int(state['step'])}"
        final, tmp = self.part / key, self.part / f".tmp-{key}"
        try:
            with checkpoint_write(self.dir, []):
                shutil.rmtree(tmp, ignore_errors=True)
                self.wrapper.write_part(os.fspath(tmp), self.optimizer)
                (tmp / "state.json").write_text(json.dumps({"format": 1, **state}))
                if final.exists():  # the same position saved again (a rerun)
                    shutil.rmtree(final)
                os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        for old in self._saves().values():  # keep this save and the one before it
            if old.name not in (key, self._previous):
                shutil.rmtree(old, ignore_errors=True)
        self._previous = key
        if not self._resumed and not self._saved:
            self._forget_other_runs()
        self._saved = True

    def _forget_other_runs(self) -> None:
        """Remove the parts of other numbers of workers (earlier runs): this run
        started over, and a resume must not pick their saves (their global steps may
        be higher than this run's). Every worker of the run may do it; whichever
        comes second finds less or nothing to remove."""
        if not self.dir.is_dir():
            return
        for entry in self.dir.iterdir():
            found = re.fullmatch(r"worker-(\d+)-of-(\d+)", entry.name)
            if found and int(found[2]) != self.wrapper.world_size and entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)

    def load(self) -> dict[str, Any]:
        from tabstream.train.tensorflow.fit import check_checkpoint_format

        w = self.wrapper
        chosen = self._chosen if self._chosen is not None else self._choose()
        self._chosen = None
        if chosen is None:
            raise CheckpointError(f"checkpoint_dir {self.dir}: worker {w.rank} holds no save "
                                  "to resume from")
        world, _, folders = chosen
        own = folders[w.rank] if world == w.world_size else folders[min(w.rank, world - 1)]
        try:
            state = check_checkpoint_format(read_json_file(own / "state.json", "checkpoint state"),
                                            own / "state.json")
            restored = w.read_parts(folders, self.optimizer, where=os.fspath(self.dir))
        except (OSError, ValueError, KeyError, AssertionError) as exc:
            if isinstance(exc, TabstreamError):
                raise
            raise CheckpointError(
                f"checkpoint {own}: cannot restore {type(w.model).__name__} "
                f"from it ({exc}); resume with the model, plan and optimizer it was written "
                "with, or start over with resume=False"
            ) from exc
        trained_by = state.get("world")
        self.resume_note = restored.note(self.dir, w.world_size, w.rank,
                                         None if trained_by is None else int(trained_by))
        self._previous = own.name if world == w.world_size else None
        self._resumed = True
        return dict(state)


def _parts_in(directory: Path) -> dict[int, list[Path]]:
    """``{W: [worker-0-of-W, ...]}`` for every W whose every part is in ``directory``
    (the folders :meth:`HybridParallel.save_checkpoint` writes)."""
    found: dict[int, dict[int, Path]] = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            m = re.fullmatch(r"worker-(\d+)-of-(\d+)", entry.name)
            if m and ((entry / "index.json").is_file() or (entry / "plan.json").is_file()):
                found.setdefault(int(m[2]), {})[int(m[1])] = entry
    return {w: [ranks[r] for r in range(w)] for w, ranks in found.items()
            if sorted(ranks) == list(range(w))}


def reshard(src: str | os.PathLike[str], dst: str | os.PathLike[str], world_size: int,
            plan: ShardingPlan | Mapping[str, str] | str | None = None) -> Path:
    """Convert the checkpoint a Keras :class:`HybridParallel` ``fit`` wrote in ``src``
    for ``world_size`` workers (and ``plan``) into ``dst``; ``world_size=1`` gives a
    checkpoint that single-process ``fit(resume=True)`` of the unwrapped model
    accepts. See :func:`tabstream.train.tensorflow.reshard.reshard`."""
    from tabstream.train.tensorflow.reshard import reshard as _reshard

    return _reshard(src, dst, world_size, plan)


#: saves each worker keeps (the newest and the one before it)
_KEPT = 2


def _one_row_per_id(grad: Any) -> Any:
    return sum_duplicate_rows(grad) if isinstance(grad, tf.IndexedSlices) else grad

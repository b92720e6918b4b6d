"""The exchanges of a sharded table's lookup in the Keras
:class:`~tabstream.train.tensorflow.distributed.HybridParallel`, and the count of
the bytes they move.

TensorFlow has a collective all-to-all (``CollectiveAllToAllV2``,
``collective_ops.all_to_all_v2``) that runs on CPU over the gRPC channels of a
``MultiWorkerMirroredStrategy`` as well as on GPUs, but tf.distribute does not
offer it. :class:`Collectives` launches it with the strategy's own collective
launcher (its group key, its next instance key, its ordering token): the keys
every all-reduce and all-gather of the step draws from, so the all-to-alls pair
up across workers as those do. Its constraints shape the exchange: every worker
passes one shape ``[W, C, ...]`` (chunk ``k`` goes to worker ``k``), so the
chunks are padded to the largest count of any pair of workers; and a chunk of
``C = 0`` crashes the process (TensorFlow 2.21), so ``C >= 1``.

One lookup of a sharded table (``exchange="all_to_all"``, worker ``r`` of ``W``,
holding ``B_r`` rows)::

    route    each id goes to the owner of its table (table_wise), of its row range
             (row_wise), or to the owner of every column slice (column_wise); the
             ids sent to one owner are sorted by row and grouped in bags (a row's
             ids for that owner)
    sizes    all-gather of [W, 2] int64: the ids and bags this worker sends each
             worker (every worker then knows the paddings)
    ids      all-to-all of int64 [W, C (+ K)]: the ids, then the bag lengths (left
             out for per-id lookups, where every id is its own bag)
    pool     each owner pools, per requesting worker and bag, what its shard holds:
             the whole vector, partial sums over its rows, or its columns
    vectors  all-to-all of float32 [W, V]: the pooled bags back to their rows'
             worker, which adds them into its rows (placing column slices at their
             columns); differentiable: backward sends the gradients the reverse way
             (``gradients``), so each shard receives exactly its bags' gradients

``exchange="all_gather"`` (the former path) all-gathers every id to every worker,
each worker pools what its shard holds for all ``sum(B_r)`` rows, and one
all-reduce of ``[sum(B_r), dim]`` gives every row's vector.

:data:`COUNTERS` names what each worker counts, in bytes it sends to / receives
from the *other* workers (its chunk to itself is a local copy): ``<kind>_sent``,
``<kind>_received`` for the kinds ``sizes``, ``ids``, ``vectors``, ``gradients``,
counted as they travel (padding included), and ``ids_payload_sent``,
``vectors_payload_sent``: the part of them that is not padding. The all-gather
path's counts take an all-gather as its piece delivered to each other worker and
an all-reduce of ``n`` bytes as a ring's ``2 (W - 1) n / W`` sent and received.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from tabstream.train.sharding import TablePlacement

__all__ = ["COUNTERS", "EXCHANGES", "KINDS", "Collectives", "all_gather_exchange",
           "all_to_all_exchange", "comm_dict"]

#: the ways a sharded lookup can travel
EXCHANGES = ("all_to_all", "all_gather")
#: the exchanges of one step, in the order they run
KINDS = ("sizes", "ids", "vectors", "gradients")
#: the byte counters of one worker, in the order of its counter variable
COUNTERS = (*(f"{k}_{d}" for k in KINDS for d in ("sent", "received")),
            "ids_payload_sent", "vectors_payload_sent")
_AT = {name: i for i, name in enumerate(COUNTERS)}


def comm_dict(counts: Any) -> dict[str, int]:
    """``{counter: bytes}`` of a counter vector, plus the sums ``sent`` / ``received``
    over the kinds."""
    out = {name: int(counts[i]) for i, name in enumerate(COUNTERS)}
    out["sent"] = sum(out[f"{k}_sent"] for k in KINDS)
    out["received"] = sum(out[f"{k}_received"] for k in KINDS)
    return out


class Collectives:
    """The all-to-all of this worker's replica, launched with the collective keys
    and ordering token of the strategy's own launcher (see the module docstring).

    TensorFlow keeps that launcher private (``CollectiveAllReduce._launchers``, a
    ``CollectiveReplicaLauncher``); what is read of it is checked here, so a
    TensorFlow that moved it gives this error, not a hang."""

    _NEEDED = ("_group_key", "_group_size", "_device", "_next_instance_key",
               "_get_ordering_token")

    def __init__(self, strategy: tf.distribute.Strategy) -> None:
        cross = vars(strategy.extended).get("_cross_device_ops")
        launchers = vars(cross).get("_launchers") if cross is not None else None
        if not launchers or len(launchers) != 1 or not all(
                hasattr(launchers[0], a) for a in self._NEEDED):
            raise TypeError(
                f"HybridParallel: exchange='all_to_all' launches TensorFlow's collective "
                f"all-to-all through the collective launcher of MultiWorkerMirroredStrategy "
                f"(one device per worker), which {type(strategy).__name__} under TensorFlow "
                f"{tf.__version__} does not have; build HybridParallel(..., "
                "exchange='all_gather') or run under MultiWorkerMirroredStrategy"
            )
        self._launcher = launchers[0]

    @property
    def world_size(self) -> int:
        return int(self._launcher._group_size)

    def all_to_all(self, t: tf.Tensor) -> tf.Tensor:
        """``t[k]`` goes to worker ``k``; ``out[k]`` came from worker ``k``. Every worker
        passes one shape, with ``t.shape[0] == W`` and no zero dimension."""
        from tensorflow.python.ops import collective_ops

        launcher = self._launcher
        key = launcher._next_instance_key()
        with tf.device(launcher._device):
            return collective_ops.all_to_all_v2(
                t, launcher._group_size, launcher._group_key, key,
                ordering_token=launcher._get_ordering_token())


def _count(stats: tf.Variable | None, **bytes_: Any) -> list[Any]:
    """``assign_add`` of the named counters (int64 scalars) to ``stats``."""
    if stats is None:
        return []
    delta = tf.scatter_nd([[_AT[k]] for k in bytes_],
                          tf.stack([tf.cast(v, tf.int64) for v in bytes_.values()]),
                          [len(COUNTERS)])
    return [stats.assign_add(delta)]


def _vectors_back(coll: Collectives, send: tf.Tensor, stats: tf.Variable | None,
                  chunk_bytes: tf.Tensor) -> tf.Tensor:
    """The differentiable all-to-all of the pooled vectors; its gradient is the
    all-to-all of the gradients the reverse way (counted as ``gradients``)."""

    @tf.custom_gradient
    def exchange(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            with tf.control_dependencies(_count(stats, gradients_sent=chunk_bytes,
                                                gradients_received=chunk_bytes)):
                return coll.all_to_all(dy)

        return coll.all_to_all(x), grad

    return exchange(send)


def all_to_all_exchange(values: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor, *,
                        placement: TablePlacement, dim: int, rank: int,
                        shard: Any, anchor: Any, coll: Collectives,
                        stats: tf.Variable | None, single: bool) -> tf.Tensor:
    """``[nrows, dim]``: row ``i`` is the sum of the vectors of the ids ``values[j]``
    with ``row_ids[j] == i`` (int64, ``nrows`` a scalar), each id looked up by the
    worker that owns it. ``single``: every id is its own row (``row_ids`` is
    ``range(n)``), so no bag lengths travel. ``shard`` is this worker's variable of
    the table (None where it holds none; then the zero scalar ``anchor`` keeps the
    backward all-to-all running here, as every worker must run it)."""
    w = coll.world_size
    pieces = placement.pieces()
    owners = [k for k, _, _ in pieces]
    if len(set(owners)) != len(owners):
        raise ValueError(f"HybridParallel: {placement} gives a worker two pieces of one table")
    widths = [0] * w
    for k, a, b in pieces:
        widths[k] = b - a if placement.kind == "column_wise" else dim
    safe_rows = tf.maximum(nrows, 1)
    # route: the owner of every (id, row), sorted by (owner, row)
    if placement.kind == "row_wise":
        starts = tf.constant([a for _, a, _ in pieces], tf.int64)
        piece = tf.searchsorted(starts, values, side="right") - 1
        dest = tf.gather(tf.constant(owners, tf.int64), piece)
        ids, rows = values, row_ids
    else:  # the whole table's owner, or every column slice's owner
        n = tf.size(values, out_type=tf.int64)
        dest = tf.repeat(tf.constant(owners, tf.int64), tf.fill([len(owners)], n))
        ids, rows = tf.tile(values, [len(owners)]), tf.tile(row_ids, [len(owners)])
    key = dest * safe_rows + rows
    order = tf.argsort(key, stable=True)
    ids, key, dest = tf.gather(ids, order), tf.gather(key, order), tf.gather(dest, order)
    ones = tf.ones_like(dest)
    sent_ids = tf.math.unsorted_segment_sum(ones, dest, w)             # [W]
    if single:
        bag_key, bag_dest, sent_bags = key, dest, sent_ids
    else:
        bag_key, bag_of_id = tf.unique(key, out_idx=tf.int64)
        lengths = tf.math.unsorted_segment_sum(ones, bag_of_id, tf.size(bag_key))
        bag_dest = bag_key // safe_rows
        sent_bags = tf.math.unsorted_segment_sum(tf.ones_like(bag_dest), bag_dest, w)
    bag_row = bag_key % safe_rows
    # sizes: every worker's counts to every worker, so all agree on the paddings
    ctx = tf.distribute.get_replica_context()
    table = ctx.all_gather(tf.stack([sent_ids, sent_bags], axis=1)[None], axis=0)  # [src, dst, 2]
    width = tf.constant(widths, tf.int64)
    c_max = tf.maximum(tf.reduce_max(table[:, :, 0]), 1)
    k_max = c_max if single else tf.maximum(tf.reduce_max(table[:, :, 1]), 1)
    v_max = tf.maximum(tf.reduce_max(table[:, :, 1] * width[None, :]), 1)
    # ids: chunk k = the ids for worker k, padded to c_max (then its bag lengths)
    first = tf.cumsum(sent_ids, exclusive=True)
    pos = tf.range(tf.size(ids, out_type=tf.int64)) - tf.gather(first, dest)
    message = tf.scatter_nd(tf.stack([dest, pos], axis=1), ids, tf.stack([w, c_max]))
    if not single:
        bag_first = tf.cumsum(sent_bags, exclusive=True)
        bag_pos = tf.range(tf.size(bag_dest, out_type=tf.int64)) - tf.gather(bag_first, bag_dest)
        message = tf.concat([message, tf.scatter_nd(tf.stack([bag_dest, bag_pos], axis=1),
                                                    lengths, tf.stack([w, k_max]))], axis=1)
    others = tf.constant(w - 1, tf.int64)
    id_chunk = 8 * (c_max if single else c_max + k_max)
    mine = tf.one_hot(rank, w, on_value=0, off_value=1, dtype=tf.int64)  # 1 for other workers
    payload = tf.reduce_sum(mine * (sent_ids if single else sent_ids + sent_bags)) * 8
    counted = _count(stats, sizes_sent=others * w * 16, sizes_received=others * w * 16,
                     ids_sent=others * id_chunk, ids_received=others * id_chunk,
                     ids_payload_sent=payload)
    with tf.control_dependencies(counted):
        received = coll.all_to_all(message)
    # pool what this worker owns, per requesting worker and bag
    got_ids, got_bags = table[:, rank, 0], table[:, rank, 1]
    my_width = widths[rank]
    if shard is None:
        # zeros that depend on a (zero-gradient) variable, so the backward all-to-all
        # of this exchange runs here too: every worker must run the same collectives
        assert anchor is not None  # made for every worker lacking a shard
        send = tf.zeros(tf.stack([tf.constant(w, tf.int64), v_max])) * tf.cast(anchor.value,
                                                                             tf.float32)
    else:
        valid = tf.range(c_max)[None, :] < got_ids[:, None]
        in_ids = tf.boolean_mask(received[:, :c_max], valid)
        if single:
            bag = tf.boolean_mask(tf.reshape(tf.range(w * c_max), [w, c_max]), valid)
        else:
            bag = tf.repeat(tf.range(w * k_max), tf.reshape(received[:, c_max:], [-1]))
        if placement.kind == "row_wise":
            in_ids = in_ids - dict((k, a) for k, a, _ in pieces)[rank]
        pooled = tf.math.unsorted_segment_sum(tf.gather(shard.value, in_ids), bag, w * k_max)
        flat = tf.reshape(pooled, tf.stack([tf.constant(w, tf.int64), k_max * my_width]))
        send = tf.pad(flat, [[0, 0], [0, tf.maximum(v_max - k_max * my_width, 0)]])[:, :v_max]
    vec_chunk = 4 * v_max
    counted = _count(stats, vectors_sent=others * vec_chunk, vectors_received=others * vec_chunk,
                     vectors_payload_sent=tf.reduce_sum(mine * got_bags) * my_width * 4)
    with tf.control_dependencies(counted):
        back = _vectors_back(coll, send, stats, others * vec_chunk)
    # each owner's bags into their rows (column slices at their columns)
    bag_first = tf.cumsum(sent_bags, exclusive=True)
    out = None
    for k, a, b in pieces:
        count = sent_bags[k]
        vec = tf.reshape(back[k, :count * widths[k]], tf.stack([count, widths[k]]))
        at = bag_row[bag_first[k]:bag_first[k] + count]
        part = tf.math.unsorted_segment_sum(vec, at, nrows)
        if placement.kind == "column_wise":
            part = tf.pad(part, [[0, 0], [a, dim - b]])
        out = part if out is None else out + part
    assert out is not None  # a sharded table has at least one piece
    return out


def all_gather_exchange(values: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor, *,
                        contribution: Any, rank: int, world: int,
                        stats: tf.Variable | None) -> tf.Tensor:
    """The former exchange (module docstring): ``[nrows, dim]`` for this worker's rows.
    ``contribution(all_values, global_rows, total)`` is what this worker's shard adds
    to every row of the global batch."""
    ctx = tf.distribute.get_replica_context()
    sizes = ctx.all_gather(tf.stack([nrows, tf.size(values, out_type=tf.int64)])[None], axis=0)
    all_values = ctx.all_gather(values, axis=0)
    all_rows = ctx.all_gather(row_ids, axis=0)
    starts = tf.cumsum(sizes[:, 0], exclusive=True)
    owner = tf.repeat(tf.range(tf.shape(sizes)[0]), sizes[:, 1])
    global_rows = all_rows + tf.gather(starts, owner)
    total = tf.reduce_sum(sizes[:, 0])
    contrib = contribution(all_values, global_rows, total)
    others = world - 1
    n = tf.size(values, out_type=tf.int64)
    everyone = tf.reduce_sum(sizes[:, 1])
    ring = 2 * others * total * tf.cast(tf.shape(contrib)[1], tf.int64) * 4 // world
    counted = _count(stats, sizes_sent=others * 16, sizes_received=others * 16,
                     ids_sent=others * n * 16, ids_received=(everyone - n) * 16,
                     ids_payload_sent=others * n * 16, vectors_sent=ring,
                     vectors_received=ring, vectors_payload_sent=ring)
    with tf.control_dependencies(counted):
        contrib = tf.identity(contrib)

    @tf.custom_gradient
    def reduce(x: tf.Tensor) -> Any:
        def grad(dy: tf.Tensor) -> tf.Tensor:
            with tf.control_dependencies(_count(stats, gradients_sent=ring,
                                                gradients_received=ring)):
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, dy)

        return ctx.all_reduce(tf.distribute.ReduceOp.SUM, x), grad

    pooled = reduce(contrib)
    return pooled[starts[rank]:starts[rank] + nrows]

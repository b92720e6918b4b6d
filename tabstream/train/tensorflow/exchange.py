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

The sharded lookups of one call of the embedding layer (``exchange="all_to_all"``,
worker ``r`` of ``W``, holding ``B_r`` rows; ``Q`` lookups, one per sharded
feature) travel together, in one exchange::

    route    each id goes to the owner of its table (table_wise), of its row range
             (row_wise), or to the owner of every column slice (column_wise); the
             ids sent to one owner are sorted by row and grouped in bags (a row's
             ids for that owner)
    sizes    all-gather of [W, Q, 2] int64: the ids and bags this worker sends each
             worker for each lookup (every worker then knows the layouts)
    ids      all-to-all of int64 [W, C]: for each lookup in turn, its ids, then its
             bag lengths (left out for per-id lookups, where every id is its own
             bag); C the longest message of any pair of workers
    pool     each owner pools, per requesting worker and bag, what its shard holds:
             the whole vector, partial sums over its rows, or its columns
    vectors  all-to-all of float32 [W, V]: the pooled bags back to their rows'
             worker, which adds them into its rows (placing column slices at their
             columns); differentiable: backward sends the gradients the reverse way
             (``gradients``), so each shard receives exactly its bags' gradients

``exchange="all_gather"`` (the former path), per lookup: all-gather every id to
every worker, each worker pools what its shard holds for all ``sum(B_r)`` rows,
and one all-reduce of ``[sum(B_r), dim]`` gives every row's vector.

:data:`COUNTERS` names what each worker counts, in bytes it sends to / receives
from the *other* workers (its chunk to itself is a local copy): ``<kind>_sent``,
``<kind>_received`` for the kinds ``sizes``, ``ids``, ``vectors``, ``gradients``,
counted as they travel (padding included), and ``ids_payload_sent``,
``vectors_payload_sent``: the part of them that is not padding. The all-gather
path's counts take an all-gather as its piece delivered to each other worker and
an all-reduce of ``n`` bytes as a ring's ``2 (W - 1) n / W`` sent and received.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import tensorflow as tf

from tabstream.train.sharding import TablePlacement

__all__ = ["COUNTERS", "Collectives", "EXCHANGES", "KINDS", "Lookup", "all_gather_exchange",
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


class Lookup(NamedTuple):
    """One sharded lookup of an exchange: ``[nrows, dim]`` where row ``i`` sums the
    vectors of the ids ``values[j]`` with ``row_ids[j] == i`` (int64). ``single``:
    every id is its own row (``row_ids`` is ``range(n)``), so no bag lengths travel.
    ``shard`` is this worker's variable of the table (None where it holds none)."""

    values: tf.Tensor
    row_ids: tf.Tensor
    nrows: tf.Tensor
    placement: TablePlacement
    dim: int
    shard: Any
    single: bool


class _Routed(NamedTuple):
    """One lookup's ids in the order they travel (by owner, then row), its bags."""

    ids: tf.Tensor        # [m] sorted by (owner, row)
    dest: tf.Tensor       # [m] the owner of each
    lengths: tf.Tensor    # [bags] ids per bag (unused when single)
    bag_dest: tf.Tensor   # [bags]
    bag_row: tf.Tensor    # [bags] the requesting row of each bag
    sent_ids: tf.Tensor   # [W]
    sent_bags: tf.Tensor  # [W]
    widths: list[int]     # the columns each worker sends back (0: not an owner)


def _route(look: Lookup, w: int) -> _Routed:
    pieces = look.placement.pieces()
    owners = [k for k, _, _ in pieces]
    if len(set(owners)) != len(owners):
        raise ValueError(f"HybridParallel: {look.placement} gives a worker two pieces of "
                         "one table")
    widths = [0] * w
    for k, a, b in pieces:
        widths[k] = b - a if look.placement.kind == "column_wise" else look.dim
    safe_rows = tf.maximum(look.nrows, 1)
    if look.placement.kind == "row_wise":
        starts = tf.constant([a for _, a, _ in pieces], tf.int64)
        piece = tf.searchsorted(starts, look.values, side="right") - 1
        dest = tf.gather(tf.constant(owners, tf.int64), piece)
        ids, rows = look.values, look.row_ids
    else:  # the whole table's owner, or every column slice's owner
        n = tf.size(look.values, out_type=tf.int64)
        dest = tf.repeat(tf.constant(owners, tf.int64), tf.fill([len(owners)], n))
        ids = tf.tile(look.values, [len(owners)])
        rows = tf.tile(look.row_ids, [len(owners)])
    key = dest * safe_rows + rows
    order = tf.argsort(key, stable=True)
    ids, key, dest = tf.gather(ids, order), tf.gather(key, order), tf.gather(dest, order)
    ones = tf.ones_like(dest)
    sent_ids = tf.math.unsorted_segment_sum(ones, dest, w)
    if look.single:
        bag_key, lengths, bag_dest, sent_bags = key, ones, dest, sent_ids
    else:
        bag_key, bag_of_id = tf.unique(key, out_idx=tf.int64)
        lengths = tf.math.unsorted_segment_sum(ones, bag_of_id, tf.size(bag_key))
        bag_dest = bag_key // safe_rows
        sent_bags = tf.math.unsorted_segment_sum(tf.ones_like(bag_dest), bag_dest, w)
    return _Routed(ids, dest, lengths, bag_dest, bag_key % safe_rows, sent_ids, sent_bags,
                   widths)


def _placed(dest: tf.Tensor, counts: tf.Tensor, offsets: tf.Tensor) -> tf.Tensor:
    """``[m, 2]`` (worker, column) of each element of a run sorted by ``dest``, where
    ``counts[k]`` go to worker ``k`` and start at column ``offsets[k]``."""
    first = tf.cumsum(counts, exclusive=True)
    pos = tf.range(tf.size(dest, out_type=tf.int64)) - tf.gather(first, dest)
    return tf.stack([dest, pos + tf.gather(offsets, dest)], axis=1)


def all_to_all_exchange(lookups: list[Lookup], *, rank: int, anchor: Any,
                        coll: Collectives, stats: tf.Variable | None) -> list[tf.Tensor]:
    """Every lookup of ``lookups`` (one per sharded feature of a call), in one
    exchange: one all-gather of the counts, one all-to-all of the ids of them all,
    one of the pooled vectors back (module docstring). ``anchor``: the zero scalar
    variable of a worker lacking some table's shard, which keeps the backward
    all-to-all running there (every worker must run it)."""
    w = coll.world_size
    routed = [_route(look, w) for look in lookups]
    q = len(lookups)
    # sizes: [src, dst, lookup, (ids, bags)], so every worker agrees on the layouts
    mine = tf.stack([tf.stack([r.sent_ids, r.sent_bags], axis=1) for r in routed], axis=1)
    ctx = tf.distribute.get_replica_context()
    table = ctx.all_gather(mine[None], axis=0)
    single = tf.constant([look.single for look in lookups])
    # ids message: per lookup, its ids then (unless single) its bag lengths
    words = table[:, :, :, 0] + tf.where(single, tf.zeros_like(table[:, :, :, 1]),
                                         table[:, :, :, 1])          # [src, dst, lookup]
    offsets = tf.cumsum(words, axis=2, exclusive=True)
    c_max = tf.maximum(tf.reduce_max(tf.reduce_sum(words, axis=2)), 1)
    width = tf.constant([r.widths for r in routed], tf.int64)        # [lookup, worker]
    floats = table[:, :, :, 1] * tf.transpose(width)[None, :, :]     # [src, dst, lookup]
    v_offsets = tf.cumsum(floats, axis=2, exclusive=True)
    v_max = tf.maximum(tf.reduce_max(tf.reduce_sum(floats, axis=2)), 1)
    where, what = [], []
    for j, (look, r) in enumerate(zip(lookups, routed, strict=True)):
        start = offsets[rank, :, j]
        where.append(_placed(r.dest, r.sent_ids, start))
        what.append(r.ids)
        if not look.single:
            where.append(_placed(r.bag_dest, r.sent_bags, start + r.sent_ids))
            what.append(r.lengths)
    message = tf.scatter_nd(tf.concat(where, axis=0), tf.concat(what, axis=0),
                            tf.stack([w, c_max]))
    others = tf.constant(w - 1, tf.int64)
    to_others = tf.one_hot(rank, w, on_value=0, off_value=1, dtype=tf.int64)
    counted = _count(stats, sizes_sent=others * w * q * 16, sizes_received=others * w * q * 16,
                     ids_sent=others * c_max * 8, ids_received=others * c_max * 8,
                     ids_payload_sent=tf.reduce_sum(to_others * tf.reduce_sum(words[rank],
                                                                              axis=1)) * 8)
    with tf.control_dependencies(counted):
        received = coll.all_to_all(message)
    # pool what this worker owns, per requesting worker and bag
    column = tf.range(c_max)[None, :]
    ends = []
    send = None
    for j, (look, r) in enumerate(zip(lookups, routed, strict=True)):
        if look.shard is None or r.widths[rank] == 0:
            continue
        start, got_ids, got_bags = offsets[:, rank, j], table[:, rank, j, 0], table[:, rank, j, 1]
        in_ids = tf.boolean_mask(received, (column >= start[:, None])
                                 & (column < (start + got_ids)[:, None]))
        nbags = tf.reduce_sum(got_bags)
        if look.single:
            bag = tf.range(nbags)
        else:
            at = start + got_ids
            lengths = tf.boolean_mask(received, (column >= at[:, None])
                                      & (column < (at + got_bags)[:, None]))
            bag = tf.repeat(tf.range(nbags), lengths)
        if look.placement.kind == "row_wise":
            in_ids = in_ids - dict((k, a) for k, a, _ in look.placement.pieces())[rank]
        pooled = tf.math.unsorted_segment_sum(tf.gather(look.shard.value, in_ids), bag, nbags)
        # bag i (source-major) of source s goes to (s, v_offsets[s, rank, j] + b * width + c)
        cols = r.widths[rank]
        src = tf.repeat(tf.range(w, dtype=tf.int64), got_bags)
        b = tf.range(nbags) - tf.gather(tf.cumsum(got_bags, exclusive=True), src)
        base = tf.gather(v_offsets[:, rank, j], src) + b * cols
        idx = tf.stack([tf.repeat(src, cols),
                        tf.reshape(base[:, None] + tf.range(cols, dtype=tf.int64)[None, :],
                                   [-1])], axis=1)
        ends.append(tf.reduce_sum(to_others * got_bags) * cols * 4)
        part = tf.scatter_nd(idx, tf.reshape(pooled, [-1]), tf.stack([w, v_max]))
        send = part if send is None else send + part
    if send is None:
        # zeros that depend on a (zero-gradient) variable, so the backward all-to-all
        # of this exchange runs here too: every worker must run the same collectives
        assert anchor is not None  # made for every worker lacking a shard
        send = tf.zeros(tf.stack([tf.constant(w, tf.int64), v_max])) * tf.cast(anchor.value,
                                                                             tf.float32)
    chunk = others * v_max * 4
    counted = _count(stats, vectors_sent=chunk, vectors_received=chunk,
                     vectors_payload_sent=tf.add_n(ends) if ends else tf.constant(0, tf.int64))
    with tf.control_dependencies(counted):
        back = _vectors_back(coll, send, stats, chunk)
    # each owner's bags into their rows (column slices at their columns)
    out = []
    for j, (look, r) in enumerate(zip(lookups, routed, strict=True)):
        bag_first = tf.cumsum(r.sent_bags, exclusive=True)
        total = None
        for k, a, b_ in look.placement.pieces():
            count, cols = r.sent_bags[k], r.widths[k]
            at = v_offsets[rank, k, j]
            vec = tf.reshape(back[k, at:at + count * cols], tf.stack([count, cols]))
            rows = r.bag_row[bag_first[k]:bag_first[k] + count]
            part = tf.math.unsorted_segment_sum(vec, rows, look.nrows)
            if look.placement.kind == "column_wise":
                part = tf.pad(part, [[0, 0], [a, look.dim - b_]])
            total = part if total is None else total + part
        assert total is not None  # a sharded table has at least one piece
        out.append(total)
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

"""Cutting chunks into batches: rows of the chunk's row groups copied into batch
buffers, and a finished batch put in its delivered form.

A *chunk* (:class:`Chunk`) holds the columns read from a few row groups; the
loader deals its rows out to batches (:class:`BatchBuilder`, one or two chunks'
rows each) as *segments* (which rows of the chunk go where in which batch), then
:meth:`Chunk.fill` copies them, column by column, releasing each source column
once copied. :func:`finish_batch` turns a complete batch's columns into the
``(features, labels)`` the loader yields (see :mod:`tabstream.loaders.layout`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.core.threads import kept_pool, map_shared, usable_cpus
from tabstream.loaders.layout import (
    Batch,
    Layout,
    pad_lists,
    pad_nested,
    ragged,
    ragged_nested,
    resize,
    take_lists,
)
from tabstream.loaders.memory import BatchPool, Recycler, empty, permutation

__all__ = ["BatchBuilder", "Chunk", "Segment", "batch_rows_rng", "column_block", "finish_batch",
           "flat_names", "flatten_lists", "shuffle_within", "within_order"]


def _fill_threads(cores: int | None = None) -> int:
    """Threads copying a chunk's narrow columns into its batches, a column each at a
    time (numpy's take and slice copies release the GIL). The copies of a shuffled
    2M-row Criteo epoch take about 0.6 s of CPU on one thread, while Arrow decodes
    the row groups on every core: on a machine of many cores that one thread would
    set the pace (not measured yet: the benchmark machine has 2 cores). Half the
    cores, at most 4 (the copies are bound by memory); one below 4 cores, where the
    decoding keeps the cores busy anyway (on 2 cores, 2 threads gave the same epoch
    time for 5% more CPU: benchmarks/RESULTS.md, session 24). ``cores``: the CPUs the
    process may use (default: :func:`~tabstream.core.threads.usable_cpus`, which
    counts a container's CPU limit, not the host's cores)."""
    cores = usable_cpus() if cores is None else cores
    return 1 if cores < 4 else min(4, cores // 2)


_FILL_THREADS = _fill_threads()


# The key that sets the within-batch generators apart from the epoch plan's
# (tabstream.loaders.plan draws from (seed, epoch, stream, ...) with small streams).
_WITHIN_BATCH = 0x62617463


# Where a batch's rows come from in one chunk: (batch, first row in the batch,
# the chunk rows: sorted indices when shuffling, else a range).
Segment = tuple["BatchBuilder", int, "np.ndarray | slice"]


class Chunk:
    """The pieces read for one chunk (numpy arrays for scalar columns, arrow arrays
    for lists), kept apart: batches gather from them directly, which saves
    concatenating the whole chunk first."""

    def __init__(self, parts: list[dict[str, Any]], sizes: list[int]) -> None:
        self.parts = parts
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_rows = int(self.bounds[-1])

    def _per_part(self, segments: list[Segment]) -> list[list[Segment]]:
        """Each segment cut at the pieces' bounds, rows made local to the piece."""
        out: list[list[Segment]] = [[] for _ in self.parts]
        for builder, at, rows in segments:
            if isinstance(rows, slice):
                for p, (b0, b1) in enumerate(zip(self.bounds[:-1], self.bounds[1:], strict=True)):
                    s, e = max(rows.start, int(b0)), min(rows.stop, int(b1))
                    if s < e:
                        out[p].append((builder, at + s - rows.start, slice(s - b0, e - b0)))
            else:
                splits = np.searchsorted(rows, self.bounds)
                for p in range(len(self.parts)):
                    a, b = int(splits[p]), int(splits[p + 1])
                    if a < b:
                        # `rows` is this segment's own array: made local in place
                        local = rows[a:b]
                        if self.bounds[p]:
                            local -= self.bounds[p]
                        out[p].append((builder, at + a, local))
        return out

    def fill(self, segments: list[Segment], done: list[BatchBuilder],
             recycler: Recycler | None = None) -> Iterator[BatchBuilder]:
        """Copy the segments' rows into their batches, then forget the data; yields
        those of ``done`` (the batches this chunk completes) that the wide columns'
        pass completes, as it completes them; the caller hands out the others once
        the chunk's data is gone (and its row groups' read budget released).

        Narrow columns go column by column: one source column stays in cache while
        it feeds every batch of the chunk (2-4x faster than batch by batch), and
        each column is dropped once copied, so the chunk's memory is handed over to
        its batches instead of being held twice. Wide columns (a multi-hot block far
        larger than any cache) gain nothing from that order, so they go batch by
        batch after the narrow ones, each batch handed out as soon as it is
        complete: one or two of their batches exist at a time instead of all the
        chunk's, and the buffers the consumer gives back are reused at once (see
        :class:`BatchPool`)."""
        # shuffled batches whose rows all come from this chunk: assembled in storage
        # order in a scratch buffer, then put in their own order with one take
        # (see _fill_whole); a batch across two chunks is filled in storage order
        # and permuted once complete, whatever its columns' width; only the wide
        # columns of a batch whose rows all come from this chunk scatter its rows
        # to their places
        whole = {id(b) for b, rows in _rows_by_builder(segments).items()
                 if b.order is not None and rows == b.size}
        per_part = self._per_part(segments)
        names = list(self.parts[0])
        first = self.parts[0]
        wide = [n for n in names if isinstance(first[n], np.ndarray)
                and first[n].nbytes // max(1, len(first[n])) * self.num_rows > _WIDE_COLUMN_BYTES]
        # each whole batch's pieces: (builder, [(chunk piece, at, rows), ...])
        by_builder: dict[int, tuple[BatchBuilder, list[tuple[int, int, np.ndarray | slice]]]] = {}
        for p, segs in enumerate(per_part):
            for builder, at, rows in segs:
                if id(builder) in whole:
                    by_builder.setdefault(id(builder), (builder, []))[1].append((p, at, rows))

        def fill_column(name: str) -> None:
            dense = isinstance(first[name], np.ndarray)
            if dense and by_builder:
                cols = [part[name] for part in self.parts]
                for builder, pieces in by_builder.values():
                    _fill_whole(cols, builder, name, pieces)
                del cols
            for part, segs in zip(self.parts, per_part, strict=True):
                col = part.pop(name)
                for builder, at, rows in segs:
                    if not dense:
                        _copy_rows(col, builder, name, at, rows)
                    elif id(builder) not in whole:
                        # a batch across two chunks: its rows in storage order now,
                        # in its own order when complete (BatchBuilder.permute);
                        # unless an earlier chunk, which found the column wide, put
                        # its rows straight to their places: then these go so too
                        _copy_rows(col, builder, name, at, rows,
                                   in_order=name not in builder.scattered)
                if recycler is not None:
                    recycler.give_back(col)
                del col

        # each column on its own (its batches' buffers, its scratch buffer per thread)
        narrow = [n for n in names if n not in wide]
        threads = min(_FILL_THREADS, len(narrow))
        if threads <= 1:
            for name in narrow:
                fill_column(name)
        else:  # a task per thread, every threads-th column each: a task costs about 25 us
            map_shared(lambda share: [fill_column(name) for name in share],
                       [narrow[i::threads] for i in range(threads)], threads, kept_pool("fill", _FILL_THREADS))
        by_builder.clear()
        pending = set(map(id, done))
        if wide:
            # a batch's segments, part by part, in the order the batches are cut
            by_batch: dict[int, list[tuple[int, int, np.ndarray | slice]]] = {}
            builders: dict[int, BatchBuilder] = {}
            for p, segs in enumerate(per_part):
                for builder, at, rows in segs:
                    by_batch.setdefault(id(builder), []).append((p, at, rows))
                    builders[id(builder)] = builder
            for key, pieces in by_batch.items():
                builder = builders[key]
                spans = builder.order is not None and key not in whole
                for name in wide:
                    if key in whole and len(pieces) == 1:
                        # every row from one piece: one take in the batch's own order
                        # (a wide row is long enough that reading rows out of order
                        # costs nothing; 2.5x faster than a gather and a scatter)
                        p, _, rows = pieces[0]
                        self.parts[p][name].take(rows[builder.order], axis=0,
                                                 out=builder.column(name), mode="clip")
                        continue
                    # a batch across two chunks: its rows straight to their places,
                    # and the other chunk's likewise (BatchBuilder.scattered), unless
                    # an earlier chunk found the column narrow and copied its rows in
                    # storage order: then in storage order too, permuted once
                    # complete (a permutation of rows already in their places would
                    # move them again)
                    in_order = spans and name in builder.in_order
                    if spans and not in_order:
                        builder.scattered.add(name)
                    for p, at, rows in pieces:
                        _copy_rows(self.parts[p][name], builder, name, at, rows, in_order=in_order)
                if key in pending:
                    pending.discard(key)
                    yield builder
            for part in self.parts:
                for name in wide:
                    col = part.pop(name)
                    if recycler is not None:
                        recycler.give_back(col)
                    del col
            del builders, by_batch


def _rows_by_builder(segments: list[Segment]) -> dict[BatchBuilder, int]:
    """How many of each batch's rows the segments hold."""
    out: dict[BatchBuilder, int] = {}
    for builder, _at, rows in segments:
        n = (rows.stop - rows.start) if isinstance(rows, slice) else len(rows)
        out[builder] = out.get(builder, 0) + n
    return out


def _fill_whole(cols: Sequence[np.ndarray], builder: BatchBuilder, name: str,
                pieces: list[tuple[int, int, np.ndarray | slice]]) -> None:
    """Column ``name`` of a shuffled batch whose rows all come from this chunk:
    gathered in storage order into this thread's scratch buffer (``pieces``: the
    chunk piece, where in the in-order assembly, which rows), then taken in the
    batch's own order into the batch. Two gathers, both cache-friendly: the first
    reads the chunk's column nearly in sequence, the second reads a batch-sized
    buffer that is still in cache. Against the in-order gather plus a scatter it
    replaces, alone on 40 columns: 0.28-0.41 against 0.60-0.97 s per 2M rows; the
    whole epoch in benchmarks/RESULTS.md (session 19)."""
    col0 = cols[0]
    per_row = col0.size // max(1, len(col0))
    scratch = _scratch(builder.size * per_row, col0.dtype).reshape((builder.size, *col0.shape[1:]))
    for p, at, rows in pieces:
        _gather(cols[p], rows, scratch, at)
    scratch.take(builder.order, axis=0, out=builder.column(name), mode="clip")


# A dense column whose rows in one chunk take more bytes than this is copied into
# its batches batch by batch (see Chunk.fill): past the caches, the column-by-column
# order saves nothing and holds every batch of the chunk at once.
_WIDE_COLUMN_BYTES = 16 * 2**20


def _copy_rows(col: Any, builder: BatchBuilder, name: str, at: int,
               rows: np.ndarray | slice, in_order: bool = False) -> None:
    """Rows ``rows`` of a chunk piece's column into ``builder`` from its row ``at``;
    ``in_order``: a dense column of a shuffled batch copied in storage order, to be
    put in the batch's order when it is complete (see :meth:`BatchBuilder.permute`)."""
    if in_order:
        builder.in_order.add(name)
    if isinstance(col, pa.Array):
        if builder.order is not None and not isinstance(rows, slice):
            # shuffled: the rows are taken once, in the batch's own order, when the
            # batch is complete (BatchBuilder.permute), straight from the chunks'
            # columns: a take in storage order, then a concatenation and a take in
            # the batch's order were two more copies of every value
            builder.lists[name].append((col, at, rows))
        else:
            builder.lists[name].append(col.slice(rows.start, rows.stop - rows.start)
                                       if isinstance(rows, slice) else take_lists(col, rows))
    elif not in_order and builder.dest is not None:
        # shuffled within: the rows go straight to their places in the batch's own
        # order (an in-order gather, then a scatter inside the batch), one pass
        # less than gathering in order and permuting the complete batch
        n = (rows.stop - rows.start) if isinstance(rows, slice) else len(rows)
        where = builder.dest[at:at + n]
        out = builder.column(name)
        if isinstance(rows, slice):
            out[where] = col[rows]
        else:
            # in blocks that stay in the core's cache between the gather and the
            # scatter: one 64 MB block of 8 KB rows cost 18 ms a batch, 1 MB
            # blocks 12 ms (benchmarks/RESULTS.md, session 29)
            per_row = col.size // max(1, len(col))
            step = max(1, _SCATTER_BLOCK_BYTES // max(1, per_row * col.itemsize))
            gathered = _scratch(min(n, step) * per_row, col.dtype).reshape((-1, *col.shape[1:]))
            for s in range(0, n, step):
                part = gathered[:min(step, n - s)]
                col.take(rows[s:s + step], axis=0, out=part, mode="clip")
                out[where[s:s + step]] = part
    else:
        _gather(col, rows, builder.column(name), at)


# Rows gathered, then scattered to their places in a batch, go in blocks of about
# this many bytes (see _copy_rows).
_SCATTER_BLOCK_BYTES = 2**20


def _gather(col: np.ndarray, rows: np.ndarray | slice, out: np.ndarray, at: int) -> None:
    """Rows ``rows`` of ``col`` into ``out`` from its row ``at``, in their order."""
    if isinstance(rows, slice):
        out[at:at + rows.stop - rows.start] = col[rows]
    else:
        # mode="clip" writes straight into `out` ("raise" buffers a copy); the
        # indices are in range by construction.
        col.take(rows, axis=0, out=out[at:at + len(rows)], mode="clip")


_SCRATCH = threading.local()


def _scratch(size: int, dtype: np.dtype) -> np.ndarray:
    """``size`` items of ``dtype`` from this thread's scratch buffer (grown as needed,
    reused: no page faults per segment)."""
    nbytes = size * dtype.itemsize
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _SCRATCH.buf = empty(max(nbytes, 1), np.dtype(np.uint8))
    return buf[:nbytes].view(dtype)

class BatchBuilder:
    """One batch being assembled from one or two chunks; its columns are allocated
    when first written, so a chunk's memory moves into its batches column by column.
    ``dtypes`` maps a dense column to its dtype and per-row shape (``()`` for a
    scalar, ``(L,)`` or ``(F, L)`` for a fixed-length list)."""

    def __init__(self, dtypes: dict[str, tuple[np.dtype, tuple[int, ...]]], lists: list[str],
                 size: int, pool: BatchPool | None = None,
                 blocks: Mapping[str, tuple[int, int, int]] | None = None,
                 index: int = 0, order: np.ndarray | None = None) -> None:
        self.size = size
        self.index = index  # the batch's position in the rank's epoch
        # ``order``: the batch's own row order (see shuffle_within), applied as the
        # dense columns are filled: row ``j`` of the in-order assembly goes to
        # ``dest[j]``, so that ``column[i]`` is assembled row ``order[i]``
        self.order = order
        self._dest: np.ndarray | None = None
        # dense columns filled in storage order although ``order`` is given (the
        # batch spans two chunks): permuted when the batch is complete
        self.in_order: set[str] = set()
        # dense columns of a batch across chunks whose rows went straight to their
        # places (the first chunk found them wide): the later chunks' rows go so too
        self.scattered: set[str] = set()
        self.dtypes = dtypes
        self.pool = pool
        # name -> (block, row, rows): scalar columns delivered as rows of one buffer
        # (see Loader.set_column_blocks), allocated when its first column is written
        self.blocks = blocks or {}
        self.held: dict[int, np.ndarray] = {}
        self.out: dict[str, np.ndarray] = {}
        # columns are filled on several threads (Chunk.fill): one allocates a block
        self._lock = threading.Lock()
        # list columns: arrow arrays, or (chunk column, at, rows) while shuffled (_copy_rows)
        self.lists: dict[str, list[Any]] = {n: [] for n in lists}

    @property
    def dest(self) -> np.ndarray | None:
        """Where row ``j`` of the in-order assembly goes (the inverse of ``order``),
        made when first needed: only wide columns scatter (see Chunk.fill)."""
        if self._dest is None and self.order is not None:
            self._dest = np.empty_like(self.order)
            self._dest[self.order] = np.arange(len(self.order), dtype=self.order.dtype)
        return self._dest

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self.pool is not None:
            return self.pool.empty(shape, dtype)
        return empty(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)

    def column(self, name: str) -> np.ndarray:
        col = self.out.get(name)
        if col is None:
            dtype, shape = self.dtypes[name]
            block = self.blocks.get(name)
            if block is None:
                col = self.out[name] = self._allocate((self.size, *shape), dtype)
            else:
                key, row, rows = block
                with self._lock:  # the block's columns are filled on several threads
                    held = self.held.get(key)
                    if held is None:
                        held = self.held[key] = self._allocate((rows, self.size), dtype)
                col = self.out[name] = held[row]
        return col

    def permute(self, order: np.ndarray) -> None:
        """Put the batch's rows in ``order`` (a permutation of ``range(size)``), in
        place: each dense column (a block's buffer as a whole) gathered into one
        scratch buffer and copied back, list columns with arrow's take. In place,
        not into fresh buffers: those cost page faults and pool churn, 4x the
        gather itself (measured 29 against 7 ms CPU for 40 columns of 65,536 rows).
        Of a builder given that ``order``, only the dense columns filled in storage
        order (``in_order``) are permuted: the others are in their places already."""
        # (array, the axis its rows are on): a block holds a batch row per column
        if self.order is None:
            dense = [(held, 1) for held in self.held.values()] + [
                (col, 0) for name, col in self.out.items() if name not in self.blocks]
        else:  # only those filled in storage order (see Chunk.fill)
            dense = [(self.out[name], 0) for name in sorted(self.in_order)]
        for arr, axis in dense:
            # copied out in sequence, then taken back: the random reads hit the
            # fresh copy in cache, not the batch's column, written long before
            tmp = _scratch(arr.size, arr.dtype).reshape(arr.shape)
            tmp[...] = arr
            tmp.take(order, axis=axis, out=arr, mode="clip")
        for name, parts in self.lists.items():
            if parts and isinstance(parts[0], tuple):  # (chunk column, at, rows): see _copy_rows
                parts = sorted(parts, key=lambda part: part[1])
                bases = np.cumsum([0] + [len(col) for col, _, _ in parts])
                assembled = np.concatenate([rows + base
                                            for (_, _, rows), base in zip(parts, bases, strict=False)])
                self.lists[name] = [take_lists([col for col, _, _ in parts], assembled[order],
                                               self.pool)]
                continue
            col = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
            self.lists[name] = [take_lists(col, order)]


def batch_rows_rng(seed: int, epoch: int, rank: int, batch: int) -> np.random.Generator:
    """The generator whose ``permutation(rows)`` orders the rows inside batch ``batch``
    of ``rank``'s ``epoch`` when shuffling (see :func:`shuffle_within`)."""
    return np.random.default_rng([seed, epoch, _WITHIN_BATCH, rank, batch])


def shuffle_within(builder: BatchBuilder, seed: int, epoch: int, rank: int) -> None:
    """Shuffle the rows inside a complete batch. The plan decides which rows share a
    batch and gathers them in storage order (the fast, in-order gather); this puts
    them in an order of their own, drawn from ``(seed, epoch, rank, batch index)``,
    so a shuffled batch is reproducible and still holds each of its rows once.

    >>> b = BatchBuilder({"x": (np.dtype(np.int64), ())}, [], 4)
    >>> b.column("x")[:] = [10, 11, 12, 13]
    >>> shuffle_within(b, seed=0, epoch=0, rank=0)
    >>> sorted(b.out["x"].tolist()), b.out["x"].tolist() == [10, 11, 12, 13]
    ([10, 11, 12, 13], False)
    """
    order = builder.order
    if order is None:
        order = permutation(batch_rows_rng(seed, epoch, rank, builder.index), builder.size)
    builder.permute(order)


def within_order(seed: int, epoch: int, rank: int, batch: int, size: int) -> np.ndarray:
    """Batch ``batch``'s own row order (what :func:`shuffle_within` applies), to build
    it in that order from the start (``BatchBuilder(order=...)``)."""
    return permutation(batch_rows_rng(seed, epoch, rank, batch), size)


def column_block(columns: Sequence[np.ndarray]) -> np.ndarray | None:
    """The ``(len(columns), rows)`` buffer whose rows ``columns`` are, in order (a
    batch's columns of one block, see :meth:`Loader.set_column_blocks`), as a view
    that keeps it alive; None where they are not such rows (then the caller hands
    them on one by one)."""
    if not columns:
        return None
    first = columns[0]
    owner = first.base
    if (not isinstance(owner, np.ndarray) or owner.dtype != np.uint8 or owner.ndim != 1
            or first.ndim != 1):
        return None
    row_bytes = first.nbytes
    start = first.__array_interface__["data"][0] - owner.__array_interface__["data"][0]
    for i, col in enumerate(columns):
        if (col.base is not owner or col.dtype != first.dtype or col.shape != first.shape
                or not col.flags.c_contiguous
                or col.__array_interface__["data"][0]
                != owner.__array_interface__["data"][0] + start + i * row_bytes):
            return None
    return owner[start:start + len(columns) * row_bytes].view(first.dtype).reshape(
        len(columns), len(first))


def flat_names(name: str, depth: int) -> list[str]:
    """The entries a ragged list column of ``depth`` becomes in the flat layout."""
    offsets = ["offsets"] if depth == 1 else ["outer_offsets", "inner_offsets"]
    return [f"{name}__{part}" for part in ["values", *offsets]]


def flatten_lists(features: dict[str, Any], layouts: Mapping[str, Layout],
                  lengths: Mapping[str, Any]) -> dict[str, Any]:
    """Ragged list features ``{"tags": (values, offsets)}`` as merlin-dataloader's
    ``{"tags__values": values, "tags__offsets": offsets}``, in the features' order.

    >>> flatten_lists({"tags": ("v", "o"), "C1": "c"},
    ...               {"tags": Layout(np.dtype(np.int64), 1), "C1": Layout(np.dtype(np.int64), 0)},
    ...               {})
    {'tags__values': 'v', 'tags__offsets': 'o', 'C1': 'c'}
    """
    out: dict[str, Any] = {}
    for name, value in features.items():
        layout = layouts[name]
        if layout.depth and name not in lengths:
            out.update(zip(flat_names(name, layout.depth), value, strict=True))
        else:
            out[name] = value
    return out


def finish_batch(builder: BatchBuilder, layouts: Mapping[str, Layout], lengths: Mapping[str, Any],
                 feature_names: Sequence[str], label_names: Sequence[str],
                 flat_lists: bool = False) -> Batch:
    """A complete batch as ``(features, labels)``: list columns as ``(values,
    offsets)`` (or nested offsets), or padded to ``lengths`` (see
    :func:`tabstream.loaders.layout.pad_lengths`), fixed-length ones cut or padded
    to theirs; ``labels`` one array, a dict, or None. ``flat_lists``: ragged list
    features as ``name__values``/``name__offsets`` entries instead (see
    :data:`tabstream.loaders.options.LIST_LAYOUTS`)."""
    batch: dict[str, Any] = dict(builder.out)
    for name, parts in builder.lists.items():
        col = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        length = lengths.get(name)
        if layouts[name].depth == 2:
            nested = ragged_nested(col)
            batch[name] = nested if length is None else pad_nested(*nested, length)
            continue
        values, offsets = ragged(col)
        batch[name] = (values, offsets) if length is None else pad_lists(values, offsets, length)
    for name, layout in layouts.items():
        if layout.fixed is not None:
            shape = lengths[name]
            batch[name] = resize(batch[name], shape if isinstance(shape, tuple) else (shape,))
    features = {n: batch[n] for n in feature_names}
    if flat_lists:
        features = flatten_lists(features, layouts, lengths)
    if not label_names:
        return features, None
    if len(label_names) == 1:
        return features, batch[label_names[0]]
    return features, {n: batch[n] for n in label_names}

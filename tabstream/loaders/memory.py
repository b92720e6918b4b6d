"""The loader's memory: where its arrays come from and how much it holds at once.

Two halves. *Allocation*: every large array the loader makes (read buffers, batch
columns, permutations, sorted row indices, masks) comes from arrow's memory pool
(:func:`empty`), and the large ones are reused within an epoch: read buffers by
:class:`Recycler` once a chunk is copied into its batches, batch buffers by
:class:`BatchPool` once the consumer drops the batch. *Budget*: the decoded size of
each row group, estimated from the column types and the footers
(:func:`decoded_sizes`), bounds a chunk with its copies and the read-ahead under
``Loader.chunk_bytes`` (:func:`epoch_budget`), and sizes the pools.
"""

from __future__ import annotations

import collections
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.core.dtypes import is_list_type
from tabstream.loaders import plan

__all__ = ["BatchPool", "EpochBudget", "Recycler", "decoded_sizes", "empty", "epoch_budget",
           "permutation", "sorted_copy", "zeros"]


def empty(size: int, dtype: np.dtype) -> np.ndarray:
    """A writable array in memory from arrow's pool.

    The chunks being read live in that pool too, so the memory a chunk gives up as
    its columns are copied out is reused by the batches: pages already touched (a
    page fault per fresh 4 KiB would cost about half of a shuffled batch) and one
    allocator's high-water mark instead of two. Freed with its last array or tensor.
    Arrow's buffers are 64-byte aligned, which TensorFlow needs to take a numpy array
    over without copying it (numpy's own allocations are 16-byte aligned: copied).

    The loader's other large temporaries (permutations, sorted row indices) come
    from here too, not from numpy's allocator (the C library's ``malloc``): a
    process may fix ``malloc``'s mmap threshold, and TensorFlow does, at 128 KiB,
    whenever its generator dataset op (behind ``from_generator`` and the TF loader)
    is built (``ApplyPython311MemoryPatch``, in the op's kernel constructor).
    From then on every ``malloc`` of 128 KiB or more in a thread whose heap has no
    room is a fresh ``mmap``, zeroed page by page and unmapped on ``free``; for the
    loader that was a 512 KiB - 800 KiB mapping per batch and per chunk.
    """
    dtype = np.dtype(dtype)
    return np.frombuffer(pa.allocate_buffer(max(size, 1) * dtype.itemsize), dtype)[:size]


# Rows per step when filling a range: numpy's temporary stays small (64 KiB), far
# under any malloc mmap threshold (see empty).
_RANGE_STEP = 8192


def permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)`` (the same numbers: numpy shuffles a range in place),
    in arrow's pool (see :func:`empty`)."""
    out = empty(n, np.dtype(np.int64))
    for start in range(0, n, _RANGE_STEP):
        stop = min(n, start + _RANGE_STEP)
        out[start:stop] = np.arange(start, stop, dtype=np.int64)
    rng.shuffle(out)
    return out


def sorted_copy(a: np.ndarray) -> np.ndarray:
    """``np.sort(a)`` in arrow's pool (see :func:`empty`)."""
    out = empty(len(a), a.dtype)
    out[:] = a
    out.sort()
    return out


class Recycler:
    """Row-group read buffers handed back once a chunk's rows are copied into its
    batches, for the next large row group to be read into.

    A 16,384-row group of 100 x 10 multi-hot ids is a 131 MB buffer; allocated afresh
    for every row group, each of its pages is a page fault and a page the kernel
    zeroes (arrow's allocator returns blocks that large to the system on free).
    Anonymous ``mmap``s of 4 KiB pages instead of arrow's pool (mimalloc asks for
    huge pages) were tried for these and the batch buffers: on the benchmark VM they
    won when free memory had not been touched lately and lost right after another
    process freed gigabytes, the state the multi-hot benchmark runs in
    (benchmarks/RESULTS.md, loader section of session 7).
    Only these buffers are recycled: nothing but the chunk refers to them (batches
    get copies), so once the chunk is filled they are free. Batch arrays come back
    only once the consumer drops them (see :class:`BatchPool`).
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []   # flat uint8 buffers
        self._lists: BatchPool | None = None
        self._lent: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(array): (array, buffer)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, capacity: int = 0) -> np.ndarray:
        """An uninitialized array of ``shape`` (like :func:`empty`), in a recycled
        buffer when one is large enough (at most twice the size, or ``capacity``
        bytes). A fresh buffer holds at least ``capacity`` bytes: sized for the
        largest row group, it serves every later one (a file's last, shorter row
        group would otherwise leave a buffer too small for the next full one)."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        nbytes = max(size, 1) * dtype.itemsize
        buffer = None
        with self._lock:
            fits = [i for i, b in enumerate(self._free)
                    if nbytes <= len(b) <= max(2 * nbytes, capacity)]
            if fits:
                buffer = self._free.pop(min(fits, key=lambda i: len(self._free[i])))
        if buffer is None:
            buffer = empty(max(nbytes, capacity), np.dtype(np.uint8))
        array = buffer[:nbytes].view(dtype)[:size].reshape(shape)
        with self._lock:
            self._lent[id(array)] = (array, buffer)
        return array

    @property
    def lists(self) -> BatchPool:
        """The buffers a list column read in slices is put together in (see
        :class:`~tabstream.loaders.layout.ListGatherer`): they come back once no
        batch refers to the column any more. Made when first asked for."""
        with self._lock:
            if self._lists is None:
                self._lists = BatchPool(self._keep)
            return self._lists

    def forget(self, array: Any) -> None:
        """``array`` will not be handed back (it was cut or copied): let it go."""
        with self._lock:
            self._lent.pop(id(array), None)

    def give_back(self, array: Any) -> None:
        """``array`` (from :meth:`empty`) is no longer used by anyone."""
        with self._lock:
            lent = self._lent.pop(id(array), None)
            if lent is not None and len(self._free) < self._keep:
                self._free.append(lent[1])


class BatchPool:
    """Batch column buffers that come back once the consumer drops the batch.

    A batch column handed out is a view of a fresh numpy array made over a pooled
    arrow buffer; numpy makes every later view of it (slices, reshapes, ``view``)
    refer to that array, and torch's ``from_numpy`` and the DLPack capsule behind a
    TensorFlow tensor hold it too. ``weakref.finalize`` on that array puts the buffer
    back in the pool only when nothing can reach the array any more, so a batch the
    consumer still holds, in any form, is never written to again.

    Why: arrow's allocator (mimalloc) returns large freed blocks to the system
    (``madvise(MADV_DONTNEED)``) and asks for huge pages on its arenas, so every
    fresh 65 MB multi-hot batch is page faults, zeroed pages and, on a fragmented
    machine, the kernel compacting memory: that system time was larger than the
    loader's own work. At most ``keep`` buffers of each size are kept (what the
    loader holds at once anyway: the batches being filled, the prefetch queue and
    the consumer's); others are freed as before.
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        # nbytes -> buffers; a deque appends and pops atomically, so the finalizers
        # (which may run inside a garbage collection in any thread, even while this
        # thread holds the lock) never need the lock
        self._free: dict[int, collections.deque] = {}
        self.allocated = 0   # fresh buffers, for the tests

    def empty(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """An uninitialized array of ``shape`` (64-byte aligned, like :func:`empty`)."""
        dtype = np.dtype(dtype)
        size = int(np.prod(shape, dtype=np.int64))
        nbytes = max(size, 1) * dtype.itemsize
        free = self._free.get(nbytes)
        if free is None:
            with self._lock:
                free = self._free.setdefault(nbytes, collections.deque(maxlen=self._keep))
        try:
            buffer = free.pop()
        except IndexError:
            # a buffer object, not a numpy array (see `owner` below)
            buffer = pa.allocate_buffer(nbytes)
            with self._lock:  # batches are filled on several threads
                self.allocated += 1
        # a fresh array over a buffer object that is no numpy array: numpy makes every
        # view of `owner` refer to `owner` itself (over an array, to that array)
        owner = np.frombuffer(buffer, np.uint8, count=nbytes)
        weakref.finalize(owner, free.append, buffer).atexit = False
        return owner.view(dtype)[:size].reshape(shape)


def zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros of ``shape`` in arrow's pool (see :func:`empty`)."""
    out = empty(int(np.prod(shape, dtype=np.int64)), np.dtype(dtype)).reshape(shape)
    out.fill(0)
    return out


def decoded_sizes(source: Any, present: Sequence[Sequence[str]]) -> list[tuple[float, float]]:
    """Per unit (row group) of ``source``: the decoded bytes of the columns read
    (``present[file]``, the columns read that the unit's file holds), and those of
    the largest of them. Fixed-width columns count from their type, others from the
    footer's uncompressed size."""
    out = []
    for unit in source.units:
        md = source.metadata[unit.file].row_group(unit.row_group)
        # A list column's leaf ("tags.list.element") counts for "tags": the larger of
        # its stored size and its values at the leaf type's width (a dictionary-
        # encoded multi-hot column stores a quarter of what it decodes to).
        paths: dict[str, float] = {}
        for i in range(md.num_columns):
            col = md.column(i)
            top = col.path_in_schema.split(".")[0]
            paths[top] = paths.get(top, 0) + col.total_uncompressed_size
            leaf = source.arrow_types.get(top)
            while leaf is not None and is_list_type(leaf):
                leaf = leaf.value_type
            if leaf is not None and top in paths and pa.types.is_primitive(leaf) \
                    and not pa.types.is_boolean(leaf) and "." in col.path_in_schema:
                paths[top] = max(paths[top], col.num_values * leaf.bit_width / 8)
        sizes = []
        for name in present[unit.file]:
            t = source.arrow_types[name]
            width = t.bit_width if pa.types.is_primitive(t) and not pa.types.is_boolean(t) else 0
            sizes.append(unit.stored_rows * width / 8 if width else float(paths.get(name, 0)))
        out.append((float(sum(sizes)), max(sizes, default=0.0)))
    return out


@dataclass(frozen=True)
class EpochBudget:
    """How one epoch on one rank holds its memory: ``chunks``, its pieces cut into
    chunks; ``read_ahead``, the row groups the reader may hold at once (the largest
    chunk's plus one read ahead); ``pool_keep``, the free batch buffers kept per
    size; ``recycler_keep``, the free read buffers kept."""

    chunks: list[list[plan.Piece]]
    read_ahead: int
    pool_keep: int
    recycler_keep: int


def epoch_budget(pieces: Sequence[plan.Piece], unit_bytes: Sequence[float],
                 unit_rows: Sequence[int], parts_per_chunk: int, chunk_bytes: float,
                 batch_size: int, prefetch: int, columns: int) -> EpochBudget:
    """The :class:`EpochBudget` of ``pieces`` (in reading order), given the decoded
    bytes and the rows of every unit, the loader's settings, the size of its first
    batch and the number of columns delivered."""
    piece_bytes = [unit_bytes[p.unit] * p.num_rows / max(1, unit_rows[p.unit]) for p in pieces]
    # What a chunk costs: its row groups, the batches they are copied into (as
    # many bytes again: a column is freed only once copied) and the row group
    # read ahead meanwhile; together they stay under chunk_bytes.
    ahead = max(piece_bytes, default=0.0)
    chunks = [list(pieces[a:b]) for a, b in plan.chunk_bounds(
        [2 * b for b in piece_bytes], parts_per_chunk, chunk_bytes - ahead)]
    # batches are assembled in pooled buffers, at most as many kept free as one
    # chunk's batches plus those queued and held by the consumer
    chunk_rows = max((sum(p.num_rows for p in c) for c in chunks), default=0)
    pool_keep = -(-chunk_rows // max(1, batch_size)) + prefetch + 3
    # One row group is read ahead of the chunk being cut into batches: the
    # reading never waits as long as cutting a chunk takes less time than
    # reading a row group, and at most parts_per_chunk + 1 are held.
    read_ahead = max((len(c) for c in chunks), default=1) + 1
    # a read takes a recycled buffer before allocating one, so the buffers in
    # use or free never exceed the reader's budget of row groups
    return EpochBudget(chunks, read_ahead, pool_keep, read_ahead * columns)

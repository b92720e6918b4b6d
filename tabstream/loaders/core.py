"""The framework-neutral loader: parquet row groups in, shuffled numpy batches out.

One epoch on one rank (see :mod:`tabstream.loaders.plan` for the sharding):

1. lay the row groups out in the epoch's order and take this rank's slice of rows;
2. read them in a background thread (two when one wide column dominates the row
   groups: parquet decodes a column on one thread), at most one row group ahead of
   the chunk being batched;
3. take ``parts_per_chunk`` row groups at a time (a *chunk*), deal its rows out to
   batches at random with a generator drawn from ``(seed, epoch, rank, chunk)``
   (a batch may span two chunks), and copy them column by column, releasing each
   source column once copied (wide columns, such as multi-hot blocks, batch by
   batch, each batch handed out once complete);
4. hand the batches to the consumer through a queue of ``prefetch`` batches, from
   a second background thread.

Memory is bounded by the chunk size, whatever the dataset size: at most
``parts_per_chunk + 1`` row groups read, one chunk's worth of batches being
handed out, and ``prefetch`` + 2 batches in the queue and in the consumer's hands
(``Loader.chunk_bytes`` bounds a chunk with its copies and the read-ahead). Row
group and batch buffers are reused within an epoch: a batch's buffers only once
nothing refers to the batch any more (see ``_BatchPool``). An error in a
background thread is raised in the consumer at the next batch; abandoning an
iteration stops the threads.

Yielded structure, for ``batch_size=3`` and a schema with an id ``C1``, a float
``I1``, a list ``tags`` and the target ``label``::

    features = {"C1": array([7, 3, 9]),                       # int64, shape (3,)
                "I1": array([0.5, 0.1, 0.2], dtype=float32),
                "tags": (array([4, 5, 6]), array([0, 2, 2, 3]))}  # (values, offsets)
    labels = array([1, 0, 0])

With ``pad=True`` a list column is ``(padded, mask)`` instead, both of shape
``(batch, max_len)``: ``(array([[4, 5], [0, 0], [6, 0]]), array([[T, T], [F, F], [T, F]]))``.
``labels`` is one array for one label column, a dict for several, ``None`` for none.

Fixed-length lists (a fixed-size list type, or a schema ``value_count`` with
``min == max``) are read as one dense block per row group, reshaped from the
values buffer, and delivered as ``(dense, mask)`` of shape ``(batch, L)`` with an
all-true mask (one shared array per shape: do not write to it), whatever ``pad``:
no per-row padding work. Lists of lists
(``list<list<number>>``) come as ``(values, outer_offsets, inner_offsets)``: row
``i`` holds the inner lists ``outer_offsets[i]:outer_offsets[i + 1]``, inner list
``j`` the values ``inner_offsets[j]:inner_offsets[j + 1]``; padded (``pad=`` a
``(F, L)`` pair, or fixed-size types) or fixed, they are ``(dense, mask)`` of shape
``(batch, F, L)``::

    "slots": (array([1, 2, 3]), array([0, 2, 3]), array([0, 1, 1, 3]))
    # row 0 = [[1], []], row 1 = [[2, 3]]; padded to (2, 2):
    # [[[1, 0], [0, 0]], [[2, 3], [0, 0]]], mask [[[T, F], [F, F]], [[T, T], [F, F]]]
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabstream.core.dtypes import is_list_type
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.core.pages import small_pages
from tabstream.core.schema import Schema, Tags
from tabstream.loaders import plan
from tabstream.loaders.source import ParquetSource, open_source

__all__ = ["Batch", "BatchIterator", "Layout", "Loader", "column_block", "pad_lists", "pad_nested"]

# (features, labels): see the module docstring.
Batch = tuple[dict[str, Any], Any]


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _select(schema: Schema, spec: Any, what: str) -> list[str]:
    """Column names for a selection: a name, a tag, a list mixing both, or a
    ``ColumnSelector`` (anything with ``resolve(schema)``)."""
    if hasattr(spec, "resolve"):
        return list(dict.fromkeys(spec.resolve(schema)))
    if isinstance(spec, (str, Tags)):
        spec = [spec]
    names: list[str] = []
    for item in spec:
        if isinstance(item, Tags):
            picked = schema.select_by_tag(item).column_names
            if not picked:
                raise SchemaError(f"no column of the schema is tagged {item.value!r} "
                                 f"(for {what}); columns: {schema.column_names}")
        elif isinstance(item, str):
            if item not in schema:
                raise SchemaError(f"{what} column {item!r} is not in the dataset schema; "
                                 f"available: {schema.column_names}")
            picked = [item]
        else:
            raise TypeError(f"{what} must be column names or Tags, got {item!r}")
        names.extend(n for n in picked if n not in names)
    return names


# Where a batch's rows come from in one chunk: (batch, first row in the batch,
# the chunk rows: sorted indices when shuffling, else a range).
_Segment = tuple["_BatchBuilder", int, "np.ndarray | slice"]


class _Chunk:
    """The pieces read for one chunk (numpy arrays for scalar columns, arrow arrays
    for lists), kept apart: batches gather from them directly, which saves
    concatenating the whole chunk first."""

    def __init__(self, parts: list[dict[str, Any]], sizes: list[int]) -> None:
        self.parts = parts
        self.bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.num_rows = int(self.bounds[-1])

    def _per_part(self, segments: list[_Segment]) -> list[list[_Segment]]:
        """Each segment cut at the pieces' bounds, rows made local to the piece."""
        out: list[list[_Segment]] = [[] for _ in self.parts]
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

    def fill(self, segments: list[_Segment], done: list[_BatchBuilder],
             recycler: _Recycler | None = None) -> Iterator[_BatchBuilder]:
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
        :class:`_BatchPool`)."""
        per_part = self._per_part(segments)
        names = list(self.parts[0])
        first = self.parts[0]
        wide = [n for n in names if isinstance(first[n], np.ndarray)
                and first[n].nbytes // max(1, len(first[n])) * self.num_rows > _WIDE_COLUMN_BYTES]
        for name in names:
            if name in wide:
                continue
            for part, segs in zip(self.parts, per_part, strict=True):
                col = part.pop(name)
                for builder, at, rows in segs:
                    _copy_rows(col, builder, name, at, rows)
                if recycler is not None:
                    recycler.give_back(col)
                del col
        pending = set(map(id, done))
        if wide:
            # a batch's segments, part by part, in the order the batches are cut
            by_batch: dict[int, list[tuple[int, int, np.ndarray | slice]]] = {}
            builders: dict[int, _BatchBuilder] = {}
            for p, segs in enumerate(per_part):
                for builder, at, rows in segs:
                    by_batch.setdefault(id(builder), []).append((p, at, rows))
                    builders[id(builder)] = builder
            for key, pieces in by_batch.items():
                builder = builders[key]
                for name in wide:
                    for p, at, rows in pieces:
                        _copy_rows(self.parts[p][name], builder, name, at, rows)
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


# A dense column whose rows in one chunk take more bytes than this is copied into
# its batches batch by batch (see _Chunk.fill): past the caches, the column-by-column
# order saves nothing and holds every batch of the chunk at once.
_WIDE_COLUMN_BYTES = 16 * 2**20


def _copy_rows(col: Any, builder: _BatchBuilder, name: str, at: int,
               rows: np.ndarray | slice) -> None:
    """Rows ``rows`` of a chunk piece's column into ``builder`` from its row ``at``."""
    if isinstance(col, pa.Array):
        builder.lists[name].append(col.slice(rows.start, rows.stop - rows.start)
                                   if isinstance(rows, slice) else pc.take(col, rows))
    elif isinstance(rows, slice):
        builder.column(name)[at:at + rows.stop - rows.start] = col[rows]
    else:
        # mode="clip" writes straight into `out` ("raise" buffers a copy); the
        # indices are in range by construction.
        col.take(rows, axis=0, out=builder.column(name)[at:at + len(rows)], mode="clip")


def _empty(size: int, dtype: np.dtype) -> np.ndarray:
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
# under any malloc mmap threshold (see _empty).
_RANGE_STEP = 8192


def _permutation(rng: np.random.Generator, n: int) -> np.ndarray:
    """``rng.permutation(n)`` (the same numbers: numpy shuffles a range in place),
    in arrow's pool (see :func:`_empty`)."""
    out = _empty(n, np.dtype(np.int64))
    for start in range(0, n, _RANGE_STEP):
        stop = min(n, start + _RANGE_STEP)
        out[start:stop] = np.arange(start, stop, dtype=np.int64)
    rng.shuffle(out)
    return out


def _sorted(a: np.ndarray) -> np.ndarray:
    """``np.sort(a)`` in arrow's pool (see :func:`_empty`)."""
    out = _empty(len(a), a.dtype)
    out[:] = a
    out.sort()
    return out


class _Recycler:
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
    only once the consumer drops them (see :class:`_BatchPool`).
    """

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._free: list[np.ndarray] = []   # flat uint8 buffers
        self._lent: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(array): (array, buffer)

    def empty(self, shape: tuple[int, ...], dtype: np.dtype, capacity: int = 0) -> np.ndarray:
        """An uninitialized array of ``shape`` (like :func:`_empty`), in a recycled
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
            buffer = _empty(max(nbytes, capacity), np.dtype(np.uint8))
        array = buffer[:nbytes].view(dtype)[:size].reshape(shape)
        with self._lock:
            self._lent[id(array)] = (array, buffer)
        return array

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


class _BatchPool:
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
        """An uninitialized array of ``shape`` (64-byte aligned, like :func:`_empty`)."""
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
            self.allocated += 1
        # a fresh array over a buffer object that is no numpy array: numpy makes every
        # view of `owner` refer to `owner` itself (over an array, to that array)
        owner = np.frombuffer(buffer, np.uint8, count=nbytes)
        weakref.finalize(owner, free.append, buffer).atexit = False
        return owner.view(dtype)[:size].reshape(shape)


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


def _zeros(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Zeros of ``shape`` in arrow's pool (see :func:`_empty`)."""
    out = _empty(int(np.prod(shape, dtype=np.int64)), np.dtype(dtype)).reshape(shape)
    out.fill(0)
    return out


def _shifted(offsets: np.ndarray, start: int) -> np.ndarray:
    """``offsets - start`` as int64 in arrow's pool (see :func:`_empty`)."""
    out = _empty(len(offsets), np.dtype(np.int64))
    np.subtract(offsets, start, out=out, casting="unsafe")
    return out


class _BatchBuilder:
    """One batch being assembled from one or two chunks; its columns are allocated
    when first written, so a chunk's memory moves into its batches column by column.
    ``dtypes`` maps a dense column to its dtype and per-row shape (``()`` for a
    scalar, ``(L,)`` or ``(F, L)`` for a fixed-length list)."""

    def __init__(self, dtypes: dict[str, tuple[np.dtype, tuple[int, ...]]], lists: list[str],
                 size: int, pool: _BatchPool | None = None,
                 blocks: Mapping[str, tuple[int, int, int]] | None = None) -> None:
        self.size = size
        self.dtypes = dtypes
        self.pool = pool
        # name -> (block, row, rows): scalar columns delivered as rows of one buffer
        # (see Loader.set_column_blocks), allocated when its first column is written
        self.blocks = blocks or {}
        self.held: dict[int, np.ndarray] = {}
        self.out: dict[str, np.ndarray] = {}
        self.lists: dict[str, list[pa.Array]] = {n: [] for n in lists}

    def _allocate(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        if self.pool is not None:
            return self.pool.empty(shape, dtype)
        return _empty(int(np.prod(shape, dtype=np.int64)), dtype).reshape(shape)

    def column(self, name: str) -> np.ndarray:
        col = self.out.get(name)
        if col is None:
            dtype, shape = self.dtypes[name]
            block = self.blocks.get(name)
            if block is None:
                col = self.out[name] = self._allocate((self.size, *shape), dtype)
            else:
                key, row, rows = block
                held = self.held.get(key)
                if held is None:
                    held = self.held[key] = self._allocate((rows, self.size), dtype)
                col = self.out[name] = held[row]
        return col


@dataclass(frozen=True)
class Layout:
    """How a selected column is delivered: ``dtype`` of its numbers, ``depth`` (0 a
    scalar, 1 a list, 2 a list of lists) and ``fixed``, the per-row shape when every
    row has the same one (``(L,)`` or ``(F, L)``), else ``None``."""

    dtype: np.dtype
    depth: int
    fixed: tuple[int, ...] | None = None


def _column_layout(name: str, t: pa.DataType, properties: Mapping[str, Any]) -> Layout:
    """The layout of a column of arrow type ``t`` and schema ``properties`` (see
    :class:`Layout`); raises a TypeError for what the loaders cannot deliver.

    A level is fixed when its arrow type is a fixed-size list, or when the schema
    says so: ``value_count`` with ``min == max`` (the outer level), or ``shape``, the
    per-row dims (``[F, L]``, a leading batch ``None`` allowed, ``None`` for a ragged
    level). Plain lists with a schema shape read about 3x faster from parquet than
    fixed-size list types, which the parquet reader rebuilds row by row."""
    sizes: list[int | None] = []
    leaf = t
    while is_list_type(leaf):
        sizes.append(leaf.list_size if pa.types.is_fixed_size_list(leaf) else None)
        leaf = leaf.value_type
    plain = leaf.value_type if pa.types.is_dictionary(leaf) else leaf
    if pa.types.is_struct(plain) or pa.types.is_map(plain):
        raise TypeError(_record_column_message(name, t, plain))
    if not (pa.types.is_integer(leaf) or pa.types.is_floating(leaf) or pa.types.is_boolean(leaf)) \
            or len(sizes) > 2:
        raise TypeError(
            f"column {name!r} has type {t}; loaders deliver numbers, lists of numbers and "
            "lists of lists of numbers: encode it first (e.g. ops.Categorify) or leave it "
            "out with features=/labels="
        )
    dtype = np.dtype(leaf.to_pandas_dtype())
    value_count = properties.get("value_count")
    if sizes and sizes[0] is None and isinstance(value_count, Mapping):
        lo, hi = value_count.get("min"), value_count.get("max")
        if lo is not None and lo == hi and int(hi) > 0:
            sizes[0] = int(hi)
    shape = properties.get("shape")
    if shape is not None and sizes:
        dims = list(shape)[1:] if len(shape) == len(sizes) + 1 and shape[0] is None else list(shape)
        if len(dims) != len(sizes) or any(d is not None and (not isinstance(d, int) or d < 1)
                                          for d in dims):
            raise SchemaError(f"column {name!r}: the schema's shape {list(shape)} does not fit "
                              f"its type {t}: expected {len(sizes)} dims (ints >= 1 or None)")
        sizes = [s if s is not None else d for s, d in zip(sizes, dims, strict=True)]
    fixed = tuple(int(n) for n in sizes) if sizes and None not in sizes else None
    return Layout(dtype, len(sizes), fixed)


def _record_column_message(name: str, t: pa.DataType, record: pa.DataType) -> str:
    """Why a struct or map column (or a list of them) cannot be loaded, and what to do.
    Categorify and the continuous ops refuse such a column too: its fields must become
    plain columns before the data reaches tabstream."""
    kind = "a struct" if pa.types.is_struct(record) else "a map"
    if pa.types.is_struct(record):
        fix = (f"flatten it into one column per field ({', '.join(repr(f'{name}.{f.name}') for f in record)}; "
               "e.g. pyarrow's Table.flatten()) before making the Dataset")
    else:
        fix = ("split it into two list columns, its keys and its values (a pyarrow MapArray's "
               ".keys and .items with its .offsets), before making the Dataset")
    return (f"column {name!r} is {kind} column (type {t}): the loaders deliver numbers, lists of "
            f"numbers and lists of lists of numbers (Categorify and the continuous ops refuse "
            f"struct and map columns too): {fix}, or leave it out with features=/labels=")


def _numbers(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric arrow array as a (read-only) numpy array, without pyarrow's
    ``to_numpy``: that imports pandas on its first call (+45 MB of RSS in a loader
    process). Numbers are a view of the values buffer (the array's offset
    honoured); booleans are unpacked from their bits; null floats become NaN.
    Callers check that other columns hold no nulls.

    >>> _numbers(pa.array([1.5, None, 2.0])).tolist()
    [1.5, nan, 2.0]
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    t = arr.type
    if arr.null_count and pa.types.is_floating(t):
        arr = pc.fill_null(arr, pa.scalar(float("nan"), t))
    boolean = pa.types.is_boolean(t)
    dtype = np.dtype(bool) if boolean else np.dtype(t.to_pandas_dtype())
    data = arr.buffers()[1]
    if len(arr) == 0 or data is None:
        return np.zeros(len(arr), dtype)
    if boolean:
        bits = np.frombuffer(data, np.uint8)
        return np.unpackbits(bits, count=arr.offset + len(arr),
                             bitorder="little")[arr.offset:].view(bool)
    return np.frombuffer(data, dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _fixed_dense(arr: pa.Array, shape: tuple[int, ...], name: str, where: str,
                 first_row: int = 0) -> np.ndarray:
    """A fixed-length list column as a dense ``(rows, *shape)`` array: the values
    buffer reshaped, after checking (vectorized) that every row has that shape.
    ``arr`` holds the rows from ``first_row`` on of ``where`` (for the messages)."""
    if arr.null_count:
        row = first_row + int(np.flatnonzero(_numbers(arr.is_null()))[0])
        raise DataError(f"column {name!r} is a fixed-length list of shape {shape} but row {row} "
                        f"of {where} is null; fill it before export or declare it ragged")
    rows = len(arr)
    level = arr
    for depth, size in enumerate(shape):
        if pa.types.is_fixed_size_list(level.type):
            level = level.flatten()  # honours the array's offset
            continue
        offsets = _numbers(level.offsets)
        # arrow's kernels, not np.diff: their temporaries come from arrow's pool
        # (see _empty), and this runs on every row group read
        lengths = pc.list_value_length(level)
        bad = pc.not_equal(lengths, pa.scalar(size, lengths.type))
        if pc.any(bad).as_py():
            at = pc.index(bad, True).as_py()
            kind = "list" if depth == 0 else "inner list"
            first = first_row * int(np.prod(shape[:depth], dtype=np.int64))
            raise DataError(
                f"column {name!r}: the schema says every {kind} holds {size} values "
                f"(value_count min == max, or shape), but {kind} {first + at} of {where} "
                f"holds {lengths[at].as_py()} ({pc.sum(bad).as_py()} such); fix the schema or "
                "the data"
            )
        level = level.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if level.null_count and depth + 1 < len(shape):
            raise DataError(f"column {name!r} has null inner lists in {where}; a fixed-length "
                            "list of lists cannot hold them")
    if level.null_count and not pa.types.is_floating(level.type):
        raise DataError(
            f"column {name!r} has {level.null_count} null values in {where}; only float "
            "columns may hold nulls (as NaN): fill them before export (e.g. ops.FillMissing)"
        )
    return _numbers(level).reshape((rows, *shape))


def _ragged_nested(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list-of-lists array as ``(values, outer_offsets, inner_offsets)``, both
    offsets starting at 0."""
    outer = _numbers(arr.offsets)
    lo, hi = int(outer[0]), int(outer[-1])
    inner_lists = arr.values.slice(lo, hi - lo)
    inner = _numbers(inner_lists.offsets)
    vlo, vhi = int(inner[0]), int(inner[-1])
    return _values(inner_lists.values, vlo, vhi), _shifted(outer, lo), _shifted(inner, vlo)


def pad_nested(values: np.ndarray, outer: np.ndarray, inner: np.ndarray,
               shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Ragged lists of lists as a zero-padded ``(rows, F, L)`` array and its mask;
    longer lists keep their first ``F`` inner lists and ``L`` values.

    >>> padded, mask = pad_nested(np.array([1, 2, 3]), np.array([0, 2, 3]),
    ...                           np.array([0, 1, 1, 3]), (2, 2))
    >>> padded.tolist(), mask.sum(axis=2).tolist()
    ([[[1, 0], [0, 0]], [[2, 3], [0, 0]]], [[1, 0], [2, 0]])
    """
    f, length = shape
    rows = len(outer) - 1
    n_inner = len(inner) - 1
    outer_len, inner_len = np.diff(outer), np.diff(inner)
    row_of = np.repeat(np.arange(rows), outer_len)            # per inner list
    field = np.arange(n_inner) - np.repeat(outer[:-1], outer_len)
    list_of = np.repeat(np.arange(n_inner), inner_len)         # per value
    pos = np.arange(len(values)) - np.repeat(inner[:-1], inner_len)
    keep = (pos < length) & (field[list_of] < f)
    padded = _zeros((rows, f, length), values.dtype)
    padded[row_of[list_of[keep]], field[list_of[keep]], pos[keep]] = values[keep]
    mask = _zeros((rows, f, length), np.dtype(bool))
    shown = field < f
    mask[row_of[shown], field[shown]] = np.arange(length) < np.minimum(inner_len[shown], length)[:, None]
    return padded, mask


@functools.lru_cache(maxsize=16)
def _all_true(shape: tuple[int, ...]) -> np.ndarray:
    """The all-true mask of a fixed-length column's batch: one array per shape,
    shared by every batch of that shape (filling a fresh one costs about as much as
    gathering the ids). Do not write to it."""
    mask = _empty(int(np.prod(shape, dtype=np.int64)), np.dtype(bool)).reshape(shape)
    mask.fill(True)
    return mask


def _resize(dense: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-shape batch ``(rows, *fixed)`` cut or zero-padded to ``(rows, *shape)``,
    with its mask: a view plus a constant mask when nothing needs padding."""
    fixed = dense.shape[1:]
    if fixed == shape:
        return dense, _all_true(dense.shape)
    out = _zeros((len(dense), *shape), dense.dtype)
    mask = _zeros(out.shape, np.dtype(bool))
    common = (slice(None), *(slice(0, min(a, b)) for a, b in zip(fixed, shape, strict=True)))
    out[common] = dense[common]
    mask[common] = True
    return out, mask


def _writable(a: np.ndarray) -> np.ndarray:
    # Arrow buffers are read-only; frameworks want arrays they may own.
    return a if a.flags.writeable else a.copy()


def _values(arr: pa.Array, lo: int, hi: int) -> np.ndarray:
    """``arr[lo:hi]`` (numbers) as a writable numpy array: a view of arrow's buffer
    when that buffer is mutable (the batch's own, fresh from take/concat or the
    read), else a copy. Saves a copy of every list value per batch."""
    t = arr.type
    buffers = arr.buffers()
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)) \
            and len(buffers) == 2 and buffers[1] is not None and buffers[1].is_mutable:
        dtype = np.dtype(t.to_pandas_dtype())
        return np.frombuffer(buffers[1], dtype, count=hi - lo,
                             offset=(arr.offset + lo) * dtype.itemsize)
    return _writable(_numbers(arr)[lo:hi])


def _ragged(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list array as ``(values, offsets)`` with ``offsets[0] == 0``."""
    offsets = _numbers(arr.offsets)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return _values(arr.values, lo, hi), _shifted(offsets, lo)


def _plain_lists(arr: pa.Array) -> pa.Array:
    """A (possibly nested, fixed-size or large) list array as ``list`` arrays at
    every level, null lists made empty: a null list holds no values."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
    child = arr.values if not pa.types.is_fixed_size_list(arr.type) else arr.flatten()
    if is_list_type(child.type):
        if pa.types.is_fixed_size_list(arr.type):
            offsets = pa.array(np.arange(len(arr) + 1, dtype=np.int32) * arr.type.list_size)
        else:
            offsets = arr.offsets
            start = offsets[0].as_py()
            if start:
                child = child.slice(start, offsets[-1].as_py() - start)
                offsets = pc.subtract(offsets, start)
            else:
                child = child.slice(0, offsets[-1].as_py())
        child = _plain_lists(child)
        kind = pa.LargeListArray if offsets.type == pa.int64() else pa.ListArray
        return kind.from_arrays(offsets, child)
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        return arr.cast(pa.list_(arr.type.value_type))
    return arr


def pad_lists(values: np.ndarray, offsets: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Ragged lists as a zero-padded ``(rows, length)`` array and its mask; longer
    lists keep their first ``length`` values.

    >>> pad_lists(np.array([4, 5, 6]), np.array([0, 2, 2, 3]), 2)[0].tolist()
    [[4, 5], [0, 0], [6, 0]]
    """
    rows = len(offsets) - 1
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(rows), lengths)
    pos = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
    keep = pos < length
    padded = _zeros((rows, length), values.dtype)
    padded[row[keep], pos[keep]] = values[keep]
    mask = _empty(rows * length, np.dtype(bool)).reshape(rows, length)
    np.less(np.arange(length), np.minimum(lengths, length)[:, None], out=mask)
    return padded, mask


# Ops whose transform changes the number of rows: refused as online transforms.
_ROW_CHANGING_OPS = ("Filter", "Dropna", "Groupby")


def _split_transforms(data: Any, transforms: Any) -> tuple[Any, Any]:
    """``(dataset, fitted workflow or None)`` from the loader's ``data`` and
    ``transforms`` arguments (``data`` may be ``workflow.transform(dataset)``)."""
    if transforms is None and "tabstream.pipeline.workflow" not in sys.modules:
        # Nothing can be a Workflow's output before its module is imported; skipping
        # the import (dask and the ops, about 0.3 s) keeps a plain loader's first
        # batch fast.
        return data, None
    from tabstream.pipeline.workflow import TransformedDataset, Workflow

    if isinstance(data, TransformedDataset):
        if transforms is not None:
            raise ValueError("data is already workflow.transform(dataset); pass transforms= "
                             "only with an untransformed dataset")
        data, transforms = data.dataset, data.workflow
    if transforms is None:
        return data, None
    if not isinstance(transforms, Workflow):
        raise TypeError(f"transforms must be a fitted tabstream.Workflow, got "
                        f"{type(transforms).__name__}")
    changing = sorted({type(n.op).__name__ for n in transforms.output_node.walk()
                       if n.kind == "op" and type(n.op).__name__ in _ROW_CHANGING_OPS})
    if changing:
        raise ValueError(
            f"the workflow given to the loader holds {changing}, which change the number "
            "of rows; a loader plans equal batches per rank from the row counts before "
            "reading, so it cannot run them online: export with "
            "workflow.transform(ds).to_parquet(...) and load that folder"
        )
    try:
        # Workflow has no public "is fitted" check yet; transform_table runs this one
        transforms._check_fitted()
    except NotFittedError as exc:
        raise NotFittedError(
            f"the workflow given to the loader is not fitted ({exc}); statistics ops "
            "(Categorify, Normalize, ...) need workflow.fit(train_dataset) first: a loader "
            "never fits them on the chunks it reads"
        ) from exc
    return data, transforms


class Loader:
    """Shuffled, sharded numpy batches from exported parquet.

    Args:
        data: a parquet ``tabstream.Dataset``, split or filtered or not (the loader
            yields exactly its rows), or an export directory, a glob, a parquet file or
            a list of files (any fsspec URL), read as ``Dataset(data, engine="parquet")``:
            the export's manifest is checked and its schema file used.
        batch_size: rows per batch (see :mod:`tabstream.loaders.plan` for the last ones).
        shuffle: shuffle row groups and rows within chunks, differently each epoch.
        seed: the shuffle is a function of ``(seed, epoch)``: same on every rank, same
            on every run. Must be the same on all ranks.
        parts_per_chunk: row groups read and shuffled together; more is a better
            shuffle and more memory. A chunk also stays under :attr:`chunk_bytes`,
            counting its batch copies and the read-ahead (fewer row groups when
            they are large; one at least).
        global_size, global_rank: number of ranks and this one's index (default 1, 0;
            the torch and TensorFlow loaders default to the active process group or
            strategy).
        drop_last: drop the rows that do not fill a batch on every rank instead of
            delivering every row exactly once.
        features: the feature columns: names and/or :class:`Tags` (the columns with
            that tag), or a ``ColumnSelector``. Default: every schema column that is
            not a label.
        labels: label columns, same forms. Default: the columns tagged ``TARGET``.
        pad: ``True`` delivers list columns as ``(padded, mask)`` of the schema's
            ``value_count`` max length; a dict ``{name: length}`` gives lengths, and
            ``{name: (F, L)}`` the shape of a list-of-lists column. Fixed-length
            columns (see the module docstring) are dense whatever ``pad`` says.
        prefetch: batches prepared ahead of the consumer.
        storage_options: fsspec options when ``data`` is a path.
        transforms: a fitted ``tabstream.Workflow`` applied to each row group as it is
            read (``Workflow.transform_table``), so light ops (Categorify lookups,
            HashBucket, Normalize...) run online; ``Loader(workflow.transform(ds))``
            does the same. Features and labels are chosen among its output columns.
            Row-count-changing ops (Filter, Dropna, Groupby) are refused: the
            equal-batches plan counts rows before reading them.

    Epochs: each ``iter(loader)`` runs the next epoch (0, 1, 2, ...);
    ``set_epoch(n)`` makes the next iteration run epoch ``n`` (then ``n+1``...), as
    with ``DistributedSampler``. ``len(loader)`` is the number of batches this rank
    yields per epoch, the same on every rank.
    """

    #: Upper bound on the bytes one chunk costs: its decoded row groups (estimated
    #: from the column types and the footers), the batches they are copied into (as
    #: many bytes again) and the row group read ahead meanwhile, so that memory stays
    #: bounded whatever the files' row-group size. 96 MiB takes 2 row groups per
    #: chunk up to 75k Criteo rows each (268 bytes a row), 1 above: a torch loader
    #: then peaks under 500 MB with the imports (260 MB for python and torch) and
    #: the allocator's slack (measured on 100k-row groups; 2 of those peaked at
    #: 520-600 MB). A single row group larger than the bound is still read whole.
    chunk_bytes: int = 96 * 2**20

    def __init__(
        self,
        data: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        parts_per_chunk: int = 2,
        global_size: int | None = None,
        global_rank: int | None = None,
        drop_last: bool = False,
        *,
        features: Any = None,
        labels: Any = None,
        pad: bool | Mapping[str, Any] = False,
        prefetch: int = 2,
        storage_options: dict | None = None,
        transforms: Any = None,
    ) -> None:
        self.batch_size = _check_int("batch_size", batch_size, 1)
        self.seed = _check_int("seed", seed, 0)
        self.parts_per_chunk = _check_int("parts_per_chunk", parts_per_chunk, 1)
        self.prefetch = _check_int("prefetch", prefetch, 1)
        self.global_size = _check_int("global_size", 1 if global_size is None else global_size, 1)
        self.global_rank = _check_int("global_rank", 0 if global_rank is None else global_rank, 0)
        if self.global_rank >= self.global_size:
            raise ValueError(f"global_rank must be < global_size={self.global_size}, "
                             f"got {self.global_rank}")
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)

        data, self.transforms = _split_transforms(data, transforms)
        self.source: ParquetSource = open_source(data, storage_options)
        full = self.source.schema if self.transforms is None else self.transforms.output_schema
        self.label_names = (_select(full, Tags.TARGET, "labels")
                            if labels is None and full.select_by_tag(Tags.TARGET)
                            else _select(full, labels or [], "labels"))
        if features is None:
            self.feature_names = [n for n in full.column_names if n not in self.label_names]
        else:
            self.feature_names = _select(full, features, "features")
        both = set(self.feature_names) & set(self.label_names)
        if both:
            raise ValueError(f"columns {sorted(both)} are selected both as features and labels")
        if not self.feature_names and not self.label_names:
            raise ValueError("no columns selected: pass features= and/or labels=")
        self.columns = self.feature_names + self.label_names
        self.schema = full.select_by_name(self.columns)
        # The columns read from the files: the selected ones, or the workflow's inputs.
        read = self.columns if self.transforms is None else list(self.transforms.input_columns)
        self.source.check_columns(read)
        self._target = pa.schema([pa.field(n, self.source.arrow_types[n]) for n in read])
        # Per file, the columns to read it holds (the same list object when all).
        self._present: list[list[str]] = []
        self._conforms: list[bool] = []  # whether a file's row groups need _conform
        for i in range(len(self.source.files)):
            held = self.source.file_types(i)
            cols = [n for n in read if n in held]
            self._present.append(read if len(cols) == len(read) else cols)
            self._conforms.append(len(cols) < len(read) or any(
                held[n] != self.source.arrow_types[n] for n in cols))
        types = (self.source.arrow_types if self.transforms is None
                 else self._transformed_types())
        self.layouts: dict[str, Layout] = {
            n: _column_layout(n, types[n], self.schema[n].properties)
            for n in self.columns}
        self.pad_lengths = self._pad_lengths(pad)

        self.num_rows = self.source.num_rows
        self._share = plan.split_rows(self.num_rows, self.batch_size, self.global_size,
                                      self.drop_last)[self.global_rank]
        self._epoch = 0
        self._column_blocks: list[list[str]] = []

    # -- configuration -------------------------------------------------------
    def set_column_blocks(self, blocks: Sequence[Sequence[str]]) -> None:
        """Assemble each group of ``blocks`` (scalar columns of one dtype) in one
        ``(len(group), batch)`` buffer per batch, a column per row, in the group's
        order. Batches still hold one array per column, each a row of that buffer;
        :func:`column_block` gives the buffer back. For a consumer that hands a batch
        on as few arrays as it can: the TensorFlow loader passes a buffer per dtype
        through ``tf.py_function`` instead of one tensor per column. Applies to the
        epochs started after the call; ``[]`` turns it off."""
        seen: set[str] = set()
        groups = [list(g) for g in blocks]
        for group in groups:
            for name in group:
                layout = self.layouts.get(name)
                if layout is None or layout.depth:
                    raise ValueError(f"column block {group}: {name!r} is not a selected scalar "
                                     f"column; scalar columns: "
                                     f"{[n for n in self.columns if not self.layouts[n].depth]}")
                if name in seen:
                    raise ValueError(f"column {name!r} is in two column blocks")
                seen.add(name)
            dtypes = sorted({str(self.layouts[n].dtype) for n in group})
            if len(dtypes) > 1:
                raise ValueError(f"column block {group} mixes dtypes {dtypes}: one dtype per block")
        self._column_blocks = [g for g in groups if g]

    def _transformed_types(self) -> dict[str, pa.DataType]:
        """The arrow types the workflow outputs, from transforming an empty table of
        the dataset's input types (no data read)."""
        assert self.transforms is not None
        empty = self._target.empty_table()
        try:
            out = self.transforms.transform_table(empty)
        except Exception as exc:
            raise DataError(f"the loader's transforms failed on an empty table of the "
                            f"dataset's columns {self._target.names}: {exc}") from exc
        types = {f.name: f.type for f in out.schema}
        missing = [n for n in self.columns if n not in types]
        if missing:
            raise SchemaError(f"the workflow's output schema lists {missing} but its transform "
                              f"does not produce them; it produces {list(types)}")
        return types

    def _pad_lengths(self, pad: bool | Mapping[str, Any]) -> dict[str, Any]:
        """``{name: length}`` for padded lists, ``{name: (F, L)}`` for padded lists of
        lists; fixed-length columns always get an entry (their shape unless ``pad``
        gives another)."""
        given = dict(pad) if isinstance(pad, Mapping) else {}
        lists = [n for n in self.columns if self.layouts[n].depth]
        unknown = sorted(set(given) - set(lists))
        if unknown:
            raise ValueError(f"pad names {unknown}, which are not selected list columns; "
                             f"list columns: {lists}")
        lengths: dict[str, Any] = {}
        for name in lists:
            layout = self.layouts[name]
            length = given.get(name)
            if length is None and layout.fixed is not None:
                length = layout.fixed
            elif length is None and not pad:
                continue
            elif length is None and layout.depth == 1:
                length = (self.schema[name].properties.get("value_count") or {}).get("max")
            if length is None:
                shape = "length" if layout.depth == 1 else "(inner lists, values)"
                raise ValueError(
                    f"list column {name!r} has no "
                    + ("value_count max in the schema" if layout.depth == 1
                       else "fixed-size list type")
                    + f" to pad to; pass pad={{{name!r}: {shape}}}"
                )
            if layout.depth == 1:
                if isinstance(length, tuple) and len(length) == 1:
                    length = length[0]
                lengths[name] = _check_int(f"pad length of {name!r}", length, 1)
            else:
                if not (isinstance(length, Sequence) and len(length) == 2):
                    raise TypeError(f"pad for the list-of-lists column {name!r} must be a pair "
                                    f"(inner lists, values per inner list), got {length!r}")
                lengths[name] = tuple(_check_int(f"pad length of {name!r}", v, 1) for v in length)
        return lengths

    def column_dtype(self, name: str) -> tuple[np.dtype, bool]:
        """The numpy dtype of a selected column's values and whether it is a list."""
        layout = self.layouts[name]
        return layout.dtype, layout.depth > 0

    def column_layout(self, name: str) -> Layout:
        """How a selected column is delivered (see :class:`Layout`)."""
        return self.layouts[name]

    # -- epochs ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (later ones continue from there)."""
        self._epoch = _check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        return self._share.num_batches

    @property
    def rows_per_epoch(self) -> int:
        """Rows this rank delivers per epoch."""
        return self._share.num_rows

    def next_epoch(self) -> int:
        """Claim the epoch for a new iteration and advance the counter."""
        epoch = self._epoch
        self._epoch += 1
        return epoch

    def __iter__(self) -> Iterator[Batch]:
        return self.iter_epoch(self.next_epoch())

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.source.files)} files, {self.num_rows} rows, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"rank {self.global_rank}/{self.global_size}, {len(self)} batches)")

    # -- planning and reading -------------------------------------------------
    def pieces(self, epoch: int) -> list[plan.Piece]:
        """This rank's pieces of row groups for ``epoch``, in reading order."""
        units = self.source.units
        order = plan.unit_order(len(units), self.seed, epoch, self.shuffle)
        return plan.rank_pieces([u.num_rows for u in units], order,
                                self._share.start, self._share.stop)

    def _unit_bytes(self) -> list[float]:
        """Decoded bytes of the columns read, per unit (row group): fixed-width
        columns from their type, others from the footer's uncompressed size."""
        return [total for total, _ in self._unit_sizes()]

    def _unit_sizes(self) -> list[tuple[float, float]]:
        """Per unit (row group): the decoded bytes of the columns read, and those of
        the largest of them (see :meth:`_unit_bytes`)."""
        cached = self.__dict__.get("_unit_sizes_cache")
        if cached is not None:
            return cached
        out = []
        for unit in self.source.units:
            md = self.source.metadata[unit.file].row_group(unit.row_group)
            # A list column's leaf ("tags.list.element") counts for "tags": the larger of
            # its stored size and its values at the leaf type's width (a dictionary-
            # encoded multi-hot column stores a quarter of what it decodes to).
            paths: dict[str, float] = {}
            for i in range(md.num_columns):
                col = md.column(i)
                top = col.path_in_schema.split(".")[0]
                paths[top] = paths.get(top, 0) + col.total_uncompressed_size
                leaf = self.source.arrow_types.get(top)
                while leaf is not None and is_list_type(leaf):
                    leaf = leaf.value_type
                if leaf is not None and top in paths and pa.types.is_primitive(leaf) \
                        and not pa.types.is_boolean(leaf) and "." in col.path_in_schema:
                    paths[top] = max(paths[top], col.num_values * leaf.bit_width / 8)
            sizes = []
            for name in self._present[unit.file]:
                t = self.source.arrow_types[name]
                width = t.bit_width if pa.types.is_primitive(t) and not pa.types.is_boolean(t) else 0
                sizes.append(unit.stored_rows * width / 8 if width else float(paths.get(name, 0)))
            out.append((float(sum(sizes)), max(sizes, default=0.0)))
        self.__dict__["_unit_sizes_cache"] = out
        return out

    def _read_threads(self) -> int:
        """Row groups read at once. Parquet decodes the columns of one row group in
        parallel, one column per thread: when no column holds more than half of a
        row group's bytes, one read keeps two cores busy and a second concurrent one
        would only hold another row group in memory. A row group dominated by one
        wide column (multi-hot ids) decodes on one thread, so two are read at once,
        each decoded in its reading thread (see :meth:`_read_piece`)."""
        serial = any(widest * 2 > total for total, widest in self._unit_sizes())
        return _READ_THREADS if serial else 1

    @functools.cached_property
    def _max_rows(self) -> int:
        """The most rows a row group holds."""
        return max(u.stored_rows for u in self.source.units)

    def _batch_rows(self, unit_index: int) -> int:
        """Rows per read for a large row group, 0 to read it whole (see _read_batched).
        Row groups that need converting, filtering or transforming are read whole."""
        unit = self.source.units[unit_index]
        total = self._unit_sizes()[unit_index][0]
        if (total <= _WHOLE_READ_BYTES or self._conforms[unit.file] or unit.mask is not None
                or self.transforms is not None or not self._present[unit.file]):
            return 0
        return max(1, int(unit.stored_rows * _READ_BATCH_BYTES / total))

    def _open(self, unit: Any, path: str) -> pq.ParquetFile:
        try:
            return self.source.open(unit.file)
        except FileNotFoundError:
            raise FileNotFoundError(f"parquet file not found: {path!r}") from None
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc

    def _read_whole(self, unit: Any, path: str, use_threads: bool = True) -> dict[str, Any]:
        present = self._present[unit.file]
        parquet = self._open(unit, path)
        try:
            table = parquet.read_row_group(unit.row_group, columns=present,
                                           use_threads=use_threads)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc
        if table.num_rows != unit.stored_rows and present:
            raise DataError(f"row group {unit.row_group} of {path!r} has {table.num_rows} rows, "
                             f"its footer says {unit.stored_rows}: the file is corrupt")
        if self._conforms[unit.file]:
            table = self._conform(table, unit, path)
        keep = unit.keep()
        if keep is not None:  # a split or filtered Dataset: only its own rows
            table = table.filter(pa.array(keep))
        if self.transforms is not None:
            table = self._transform(table, unit.row_group, path)
        return {name: self._column(name, table.column(name), unit, path) for name in self.columns}

    def _read_batched(self, unit: Any, path: str, batch_rows: int,
                      recycler: _Recycler | None = None,
                      use_threads: bool = True) -> dict[str, Any]:
        """A large row group read ``batch_rows`` at a time, its numbers copied into
        one buffer per column allocated up front (list columns kept as arrow).

        Read whole, parquet decodes a column into buffers that grow by doubling,
        so a 130 MB multi-hot column touches several times its size in fresh pages,
        and fresh pages are what the first epoch mostly pays for (the kernel zeroes
        each one). Read in slices, the slices' memory is reused from one to the
        next and only the final buffers are new."""
        rows = unit.stored_rows
        dense: dict[str, np.ndarray] = {}
        lists: dict[str, list[pa.Array]] = {}
        at = 0
        parquet = self._open(unit, path)
        try:
            batches = parquet.iter_batches(
                batch_size=batch_rows, row_groups=[unit.row_group],
                columns=self._present[unit.file], use_threads=use_threads)
            for batch in batches:
                n = batch.num_rows
                if at + n > rows:
                    break
                for name in self.columns:
                    col = self._column(name, batch.column(name), unit, path, at)
                    if isinstance(col, np.ndarray):
                        out = dense.get(name)
                        if out is None:
                            shape = (rows, *col.shape[1:])
                            row_bytes = col.itemsize * int(np.prod(shape[1:], dtype=np.int64))
                            out = dense[name] = (
                                recycler.empty(shape, col.dtype, self._max_rows * row_bytes)
                                if recycler is not None
                                else _empty(rows * int(np.prod(shape[1:], dtype=np.int64)),
                                            col.dtype).reshape(shape))
                        out[at:at + n] = col
                    else:
                        lists.setdefault(name, []).append(col)
                at += n
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc
        if at != rows:
            raise DataError(f"row group {unit.row_group} of {path!r} has a different number of "
                            f"rows than its footer says ({rows}): the file is corrupt")
        out_cols: dict[str, Any] = dict(dense)
        for name, parts in lists.items():
            out_cols[name] = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
        return {name: out_cols[name] for name in self.columns}

    def _column(self, name: str, col: pa.Array | pa.ChunkedArray, unit: Any, path: str,
                first_row: int = 0) -> Any:
        """One column of a row group (or of rows from ``first_row`` on) in the form
        batches are cut from: numpy for numbers and fixed-length lists, plain arrow
        lists for ragged ones; nulls checked."""
        layout = self.layouts[name]
        if isinstance(col, pa.ChunkedArray) and (layout.depth or layout.fixed is not None):
            col = col.combine_chunks()
        if layout.fixed is not None:
            return _fixed_dense(col, layout.fixed, name,
                                f"row group {unit.row_group} of {path!r}", first_row)
        if layout.depth:
            arr = _plain_lists(col)
            leaf = arr.values if layout.depth == 1 else arr.values.values
            self._check_nulls(name, leaf, path, unit.row_group)
            return arr
        self._check_nulls(name, col, path, unit.row_group)
        return _numbers(col)

    def _read_piece(self, piece: plan.Piece, epoch: int,
                    recycler: _Recycler | None = None,
                    use_threads: bool = True) -> dict[str, Any]:
        """One piece's rows, column by column. ``use_threads=False`` decodes in the
        calling thread instead of arrow's CPU pool: for concurrent reads (see
        :meth:`_read_threads`). That pool is shared by the whole process and sized
        from ``OMP_NUM_THREADS`` when set, so under ``OMP_NUM_THREADS=1`` (usual in
        training jobs, to keep torch's own threads down) two reads through it
        decode one after the other: a multi-hot row group took 150-190 ms instead
        of 80-100 ms, and a second core stayed idle."""
        unit = self.source.units[piece.unit]
        path = self.source.files[unit.file]
        batch_rows = self._batch_rows(piece.unit)
        out = (self._read_batched(unit, path, batch_rows, recycler, use_threads) if batch_rows
               else self._read_whole(unit, path, use_threads))
        if piece.num_rows == unit.num_rows:
            return out
        if recycler is not None:  # the rows kept are cut or copied out below
            for arr in out.values():
                recycler.forget(arr)
        rows: np.ndarray | slice
        if self.shuffle:
            perm = _permutation(plan.unit_rows_rng(self.seed, epoch, piece.unit), unit.num_rows)
            rows = _sorted(perm[piece.start:piece.stop])
        else:
            rows = slice(piece.start, piece.stop)
        for name, arr in out.items():
            if isinstance(arr, np.ndarray) and not isinstance(rows, slice):
                out[name] = arr.take(rows, axis=0, mode="clip",
                                     out=_empty(len(rows) * (arr.size // max(1, len(arr))),
                                                arr.dtype).reshape((len(rows), *arr.shape[1:])))
            elif isinstance(arr, np.ndarray):
                out[name] = arr[rows]
            elif isinstance(rows, slice):
                out[name] = arr.slice(rows.start, rows.stop - rows.start)
            else:
                out[name] = pc.take(arr, rows)
        return out

    def _transform(self, table: pa.Table, row_group: int, path: str) -> pa.Table:
        rows = table.num_rows
        try:
            table = self.transforms.transform_table(table)
        except Exception as exc:
            raise DataError(f"the loader's transforms failed on row group {row_group} of "
                            f"{path!r}: {exc}") from exc
        if table.num_rows != rows:
            raise DataError(
                f"the loader's transforms turned the {rows} rows of row group {row_group} of "
                f"{path!r} into {table.num_rows}; online transforms must keep every row (the "
                "plan gives every rank equal batches from the row counts): export with "
                "workflow.transform(ds).to_parquet(...) and load that instead"
            )
        return table

    def _conform(self, table: pa.Table, unit: Any, path: str) -> pa.Table:
        """One file's row group in the Dataset's unified types; a column the file
        lacks is null (NaN for floats; an error below for other types)."""
        arrays = [table.column(f.name) if f.name in table.column_names
                  else pa.nulls(unit.stored_rows, f.type) for f in self._target]
        try:
            return pa.Table.from_arrays(arrays, schema=None, names=self._target.names).cast(self._target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataError(f"row group {unit.row_group} of {path!r}: cannot convert to the "
                            f"dataset's types {self._target}: {exc}") from exc

    @staticmethod
    def _check_nulls(name: str, arr: Any, path: str, row_group: int) -> None:
        if arr.null_count and not pa.types.is_floating(arr.type):
            raise DataError(
                f"column {name!r} has {arr.null_count} nulls in row group {row_group} of "
                f"{path!r}; only float columns may hold nulls (as NaN): fill them before "
                "export (e.g. ops.FillMissing)"
            )

    def _finish(self, builder: _BatchBuilder) -> Batch:
        batch: dict[str, Any] = dict(builder.out)
        for name, parts in builder.lists.items():
            col = pa.concat_arrays(parts) if len(parts) > 1 else parts[0]
            length = self.pad_lengths.get(name)
            if self.layouts[name].depth == 2:
                nested = _ragged_nested(col)
                batch[name] = nested if length is None else pad_nested(*nested, length)
                continue
            values, offsets = _ragged(col)
            batch[name] = (values, offsets) if length is None else pad_lists(values, offsets, length)
        for name, layout in self.layouts.items():
            if layout.fixed is not None:
                shape = self.pad_lengths[name]
                batch[name] = _resize(batch[name], shape if isinstance(shape, tuple) else (shape,))
        features = {n: batch[n] for n in self.feature_names}
        if not self.label_names:
            return features, None
        if len(self.label_names) == 1:
            return features, batch[self.label_names[0]]
        return features, {n: batch[n] for n in self.label_names}

    def _batches(self, epoch: int) -> Iterator[Batch]:
        """This rank's batches for ``epoch``, cut in the calling thread from row
        groups read by a helper thread.

        With shuffling, each batch takes the next ``batch_size`` entries of the
        chunk's random permutation, sorted: which rows share a batch is random,
        their order inside it follows the chunk (an in-order gather is about twice
        as fast, and a batch's row order does not matter to a gradient step).
        """
        pieces = self.pieces(epoch)
        unit_bytes = self._unit_bytes()
        piece_bytes = [unit_bytes[p.unit] * p.num_rows / max(1, self.source.units[p.unit].num_rows)
                       for p in pieces]
        # What a chunk costs: its row groups, the batches they are copied into (as
        # many bytes again: a column is freed only once copied) and the row group
        # read ahead meanwhile; together they stay under chunk_bytes.
        ahead = max(piece_bytes, default=0.0)
        chunks = [pieces[a:b] for a, b in plan.chunk_bounds(
            [2 * b for b in piece_bytes], self.parts_per_chunk, self.chunk_bytes - ahead)]
        lists = [n for n in self.columns
                 if self.layouts[n].depth and self.layouts[n].fixed is None]
        dtypes = {n: (self.layouts[n].dtype, self.layouts[n].fixed or ())
                  for n in self.columns if n not in lists}
        sizes = self._share.batch_sizes()
        size = next(sizes, 0)
        # batches are assembled in pooled buffers, at most as many kept free as one
        # chunk's batches plus those queued and held by the consumer
        chunk_rows = max((sum(p.num_rows for p in c) for c in chunks), default=0)
        pool = _BatchPool(keep=-(-chunk_rows // max(1, size)) + self.prefetch + 3)
        blocks = {n: (k, row, len(group)) for k, group in enumerate(self._column_blocks)
                  for row, n in enumerate(group)}
        builder = _BatchBuilder(dtypes, lists, size, pool, blocks)
        filled = 0
        # One row group is read ahead of the chunk being cut into batches: the
        # reading never waits as long as cutting a chunk takes less time than
        # reading a row group, and at most parts_per_chunk + 1 are held.
        budget = max((len(c) for c in chunks), default=1) + 1
        # a read takes a recycled buffer before allocating one, so the buffers in
        # use or free never exceed the reader's budget of row groups
        recycler = _Recycler(keep=budget * len(self.columns))
        threads = self._read_threads()
        reader = _PieceReader(
            lambda piece: self._read_piece(piece, epoch, recycler, use_threads=threads == 1),
            pieces, budget=budget, threads=threads)
        try:
            for k, chunk_pieces in enumerate(chunks):
                chunk = _Chunk([reader.get() for _ in chunk_pieces],
                               [p.num_rows for p in chunk_pieces])
                order = (_permutation(plan.chunk_rng(self.seed, epoch, self.global_rank, k),
                                      chunk.num_rows) if self.shuffle else None)
                segments: list[_Segment] = []
                done: list[_BatchBuilder] = []
                pos = 0
                while pos < chunk.num_rows and size:
                    take = min(size - filled, chunk.num_rows - pos)
                    rows = (slice(pos, pos + take) if order is None
                            else _sorted(order[pos:pos + take]))
                    segments.append((builder, filled, rows))
                    pos += take
                    filled += take
                    if filled == size:
                        done.append(builder)
                        size, filled = next(sizes, 0), 0
                        if size:
                            builder = _BatchBuilder(dtypes, lists, size, pool, blocks)
                handed: set[int] = set()
                for finished in chunk.fill(segments, done, recycler):
                    handed.add(id(finished))
                    yield from self._hand_out(finished)
                rest = [b for b in done if id(b) not in handed]
                # the chunk's columns are all dropped by now: the reader may fill its
                # budget again while the rest of the chunk's batches are consumed
                del chunk, segments, done
                reader.release(len(chunk_pieces))
                for finished in rest:
                    yield from self._hand_out(finished)
                del rest
        finally:
            reader.close()
        if size:  # the plan and the files disagree: never yield a short epoch silently
            raise RuntimeError(f"rank {self.global_rank} ran out of rows before its last batch; "
                               "were the files modified while loading?")

    def _hand_out(self, finished: _BatchBuilder) -> Iterator[Batch]:
        batch = self._finish(finished)
        # the batch's arrays are the consumer's now: a builder kept in a list of
        # finished batches must not keep their buffers from the pool
        finished.out, finished.lists, finished.held = {}, {}, {}
        del finished
        yield batch

    def iter_epoch(self, epoch: int,
                   transform: Callable[[Batch], Any] | None = None) -> BatchIterator:
        """Iterate ``epoch`` without touching the epoch counter. ``transform`` is
        applied to each batch in the background thread (e.g. to build tensors)."""
        return BatchIterator(self._batches(epoch), transform, self.prefetch)


# Threads decoding row groups at once: parquet decodes one column chunk on one
# thread, so a single wide column (multi-hot ids) needs concurrent row groups to
# use a second core. Memory stays bounded by the reader's budget.
_READ_THREADS = 2
# how long closing a loader waits for its threads to end (they stop at their next
# step: within a read of one row group)
_JOIN_TIMEOUT_S = 30.0
# the loaders' threads still running, and the events that stop them (weak: a thread
# leaves the set when it ends; its event lives as long as the thread holds it)
_RUNNING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_STOPS: weakref.WeakSet[threading.Event] = weakref.WeakSet()


def _start(thread: threading.Thread, stop: threading.Event) -> None:
    _STOPS.add(stop)
    _RUNNING.add(thread)
    thread.start()


@atexit.register
def _stop_at_exit() -> None:
    """Stop every loader thread and wait for it while the interpreter still runs
    Python code. An epoch left unfinished (a script that stops after a few batches,
    a fixed number of steps per epoch) is only told to stop when its iterator is
    dropped; a reading thread caught inside Arrow's native code when the process
    exits aborts it (see :func:`_join`): seen as a distributed training example's
    rank exiting with SIGABRT after its last step."""
    for stop in list(_STOPS):
        stop.set()
    _join(list(_RUNNING))
# Row groups larger than this (decoded) are read in slices of about _READ_BATCH_BYTES
# into buffers allocated up front (see Loader._read_batched). Slices of 16 MiB
# decoded into blocks that arrow's allocator hands back to the system once freed,
# so each slice touched fresh pages again (15-26k page faults per 250k-row
# multi-hot epoch against 8-10k with 1-2 MiB slices).
_WHOLE_READ_BYTES = 32 * 2**20
_READ_BATCH_BYTES = 2 * 2**20


class _PieceReader:
    """Reads pieces in ``_READ_THREADS`` daemon threads and hands them out in order,
    holding at most ``budget`` pieces that the consumer has not released yet."""

    def __init__(self, read: Callable[[plan.Piece], Any], pieces: Sequence[plan.Piece],
                 budget: int, threads: int = _READ_THREADS) -> None:
        self._slots = threading.Semaphore(budget)
        self._cond = threading.Condition()
        self._results: dict[int, Any] = {}
        self._next = 0   # the next piece a thread claims
        self._want = 0   # the next piece the consumer gets
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(read, pieces),
                                          name=f"tabstream-read-{k}", daemon=True)
                         for k in range(max(1, min(threads, len(pieces))))]
        for thread in self._threads:
            _start(thread, self._stop)

    @small_pages()  # while the loader reads (see tabstream.core.pages)
    def _run(self, read: Callable[[plan.Piece], Any], pieces: Sequence[plan.Piece]) -> None:
        while True:
            while not self._slots.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            with self._cond:
                index = self._next
                if index >= len(pieces):
                    self._slots.release()
                    return
                self._next += 1
            try:
                item = read(pieces[index])
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                item = _Failure(exc)
            with self._cond:
                self._results[index] = item
                self._cond.notify_all()
            if isinstance(item, _Failure):
                return

    def get(self) -> Any:
        with self._cond:
            while self._want not in self._results:
                self._cond.wait(timeout=0.1)
                if not any(t.is_alive() for t in self._threads) and self._want not in self._results:
                    raise RuntimeError("the loader's reading threads stopped unexpectedly")
            item = self._results.pop(self._want)
            self._want += 1
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def release(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    def close(self) -> None:
        self._stop.set()
        _join(self._threads)


def _join(threads: Sequence[threading.Thread], timeout: float = _JOIN_TIMEOUT_S) -> None:
    """Wait for stopped threads to end (never the calling one), so none is still inside
    Arrow's native reading code when the interpreter exits: a daemon thread caught there
    at exit aborts the process ("terminate called without an active exception")."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(q: queue.Queue, stop: threading.Event, item: Any) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


@small_pages()  # while the loader makes batches (see tabstream.core.pages)
def _produce(q: queue.Queue, stop: threading.Event, batches: Iterable[Any],
             transform: Callable[[Any], Any] | None) -> None:
    # Holds no reference to the BatchIterator, so an abandoned one is collected and
    # its __del__ stops this thread.
    it = iter(batches)
    try:
        for batch in it:
            if transform is not None:
                batch = transform(batch)
            if not _put(q, stop, batch):
                return
        _put(q, stop, _END)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer
        _put(q, stop, _Failure(exc))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


class BatchIterator:
    """One epoch's batches, produced in a daemon thread ``depth`` batches ahead.

    Errors are re-raised in the consumer; ``close()``, or dropping an unfinished
    iterator, stops the thread at its next step.
    """

    def __init__(self, batches: Iterable[Any], transform: Callable[[Any], Any] | None,
                 depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_produce,
                                        args=(self._queue, self._stop, batches, transform),
                                        name="tabstream-loader", daemon=True)
        _start(self._thread, self._stop)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if self._done:  # closed meanwhile, by another thread
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the loader's background thread stopped "
                                       "unexpectedly") from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        """Stop the background thread and wait for it (and its reading threads) to
        end; later ``next()`` calls raise StopIteration."""
        self._done = True
        self._stop.set()
        _join([self._thread])
        # a consumer waiting in another thread ends now instead of at its next poll
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_END)

    def __del__(self) -> None:
        self._stop.set()

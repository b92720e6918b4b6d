"""How a column is delivered: its :class:`Layout` and the arrays of each form.

A selected column is a scalar (one number a row), a list (``(values, offsets)``)
or a list of lists (``(values, outer_offsets, inner_offsets)``); padded
(``pad=``) or fixed-length, a list is ``(dense, mask)`` instead (see
:mod:`tabstream.loaders.core` for the shapes). This module decides a column's
layout from its arrow type and schema properties (:func:`column_layout`), the
lengths lists are padded to (:func:`pad_lengths`), and turns a batch's arrow lists
into those numpy forms (:func:`ragged`, :func:`ragged_nested`, :func:`pad_lists`,
:func:`pad_nested`, :func:`resize`); :func:`numbers` reads arrow numbers as numpy.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import is_list_type
from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema
from tabstream.loaders.memory import empty, zeros
from tabstream.loaders.options import check_int

__all__ = ["Batch", "Layout", "ListGatherer", "column_layout", "numbers", "pad_lengths", "pad_lists",
           "pad_nested", "ragged", "ragged_nested", "resize", "take_lists"]

# (features, labels): see tabstream.loaders.core's docstring.
Batch = tuple[dict[str, Any], Any]


def _shifted(offsets: np.ndarray, start: int) -> np.ndarray:
    """``offsets - start`` as int64 in arrow's pool (see :func:`empty`)."""
    out = empty(len(offsets), np.dtype(np.int64))
    np.subtract(offsets, start, out=out, casting="unsafe")
    return out


@dataclass(frozen=True)
class Layout:
    """How a selected column is delivered: ``dtype`` of its numbers, ``depth`` (0 a
    scalar, 1 a list, 2 a list of lists) and ``fixed``, the per-row shape when every
    row has the same one (``(L,)`` or ``(F, L)``), else ``None``."""

    dtype: np.dtype
    depth: int
    fixed: tuple[int, ...] | None = None


def column_layout(name: str, t: pa.DataType, properties: Mapping[str, Any]) -> Layout:
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

def numbers(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A numeric arrow array as a (read-only) numpy array, without pyarrow's
    ``to_numpy``: that imports pandas on its first call (+45 MB of RSS in a loader
    process). Numbers are a view of the values buffer (the array's offset
    honoured); booleans are unpacked from their bits; null floats become NaN.
    Callers check that other columns hold no nulls.

    >>> numbers(pa.array([1.5, None, 2.0])).tolist()
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

def ragged_nested(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A list-of-lists array as ``(values, outer_offsets, inner_offsets)``, both
    offsets starting at 0."""
    outer = numbers(arr.offsets)
    lo, hi = int(outer[0]), int(outer[-1])
    inner_lists = arr.values.slice(lo, hi - lo)
    inner = numbers(inner_lists.offsets)
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
    padded = zeros((rows, f, length), values.dtype)
    padded[row_of[list_of[keep]], field[list_of[keep]], pos[keep]] = values[keep]
    mask = zeros((rows, f, length), np.dtype(bool))
    shown = field < f
    mask[row_of[shown], field[shown]] = np.arange(length) < np.minimum(inner_len[shown], length)[:, None]
    return padded, mask


@functools.lru_cache(maxsize=16)
def _all_true(shape: tuple[int, ...]) -> np.ndarray:
    """The all-true mask of a fixed-length column's batch: one array per shape,
    shared by every batch of that shape (filling a fresh one costs about as much as
    gathering the ids). Do not write to it."""
    mask = empty(int(np.prod(shape, dtype=np.int64)), np.dtype(bool)).reshape(shape)
    mask.fill(True)
    return mask


def resize(dense: np.ndarray, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A fixed-shape batch ``(rows, *fixed)`` cut or zero-padded to ``(rows, *shape)``,
    with its mask: a view plus a constant mask when nothing needs padding."""
    fixed = dense.shape[1:]
    if fixed == shape:
        return dense, _all_true(dense.shape)
    out = zeros((len(dense), *shape), dense.dtype)
    mask = zeros(out.shape, np.dtype(bool))
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
    return _writable(numbers(arr)[lo:hi])


def _list_type(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _number_type(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _offsets_array(lengths: np.ndarray, large: bool, pool: Any = None) -> pa.Array:
    """Offsets ``[0, cumsum(lengths)...]`` as an arrow int32 (int64: ``large``) array
    (over a buffer of ``pool``, a ``BatchPool``, when given)."""
    dtype = np.dtype(np.int64 if large else np.int32)
    n = len(lengths) + 1
    out = pool.empty((_size_class(n),), dtype)[:n] if pool is not None else empty(n, dtype)
    out[0] = 0
    np.cumsum(lengths, out=out[1:], dtype=out.dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), n, [None, pa.py_buffer(out)])


def _ranges(starts: np.ndarray, lengths: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The ranges ``starts[k] : starts[k] + lengths[k]`` end to end, as int64 indices
    (into ``out`` when given: ``lengths.sum()`` items; no temporary that long).

    >>> _ranges(np.array([5, 9, 0, 2]), np.array([2, 0, 3, 1])).tolist()
    [5, 6, 0, 1, 2, 2]
    """
    nonzero = lengths > 0
    starts, lengths = starts[nonzero], lengths[nonzero]
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    if out is None:
        out = np.empty(total, np.int64)
    if not total:
        return out
    # steps of one, and at each range's first index the jump from the previous
    # range's last: a running sum gives the indices
    out.fill(1)
    out[0] = starts[0]
    out[ends[:-1]] = starts[1:] - (starts[:-1] + lengths[:-1] - 1)
    np.cumsum(out, out=out)
    return out


class _Arena:
    """A thread's scratch memory for one call's temporaries (:func:`take_lists`):
    handed out end to end, all taken back by :meth:`reset`, kept from call to call.
    A multi-hot batch's index temporaries are tens of MB; taken from the allocator
    afresh each time they were fresh pages to fault in (the ragged multi-hot epoch
    of the loader benchmark: about a million page faults, a second of system time)."""

    _local = threading.local()

    def __init__(self) -> None:
        self.buffers: list[np.ndarray] = [empty(1 << 16, np.dtype(np.uint8))]
        self.used = 0

    @classmethod
    def get(cls) -> _Arena:
        arena = getattr(cls._local, "arena", None)
        if arena is None:
            arena = cls._local.arena = cls()
        arena.reset()
        return arena

    def reset(self) -> None:
        """Everything handed out is free again; several buffers become one."""
        if len(self.buffers) > 1:
            size = sum(len(b) for b in self.buffers)
            self.buffers = [empty(size, np.dtype(np.uint8))]
        self.used = 0

    def take(self, n: int, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        nbytes = max(1, n) * dtype.itemsize
        at = -(-self.used // 64) * 64
        if at + nbytes > len(self.buffers[-1]):
            self.buffers.append(empty(max(nbytes, 2 * len(self.buffers[-1])), np.dtype(np.uint8)))
            at = 0
        self.used = at + nbytes
        return self.buffers[-1][at:at + nbytes].view(dtype)[:n]


# values per row from which a list take copies row by row (a slice each) rather
# than gathering through an index of every value (which costs 8 bytes per value)
_ROW_COPY_VALUES = 64


def _size_class(n: int) -> int:
    """``n`` rounded up to at most 1/8 more, so that buffers of ragged batches, whose
    sizes all differ, come back from a pool keyed by size."""
    step = 1 << max(0, n.bit_length() - 4)
    return -(-n // step) * step


def _copy_ranges(srcs: Sequence[np.ndarray], which: np.ndarray | None, starts: np.ndarray,
                 lengths: np.ndarray, pool: Any = None) -> pa.Array:
    """Row ``k``'s range ``starts[k] : starts[k] + lengths[k]`` of ``srcs[which[k]]``
    (``srcs[0]`` when ``which`` is None), end to end, as an arrow array over a
    writable buffer (see :func:`_values`): from ``pool`` (a ``BatchPool``) when given,
    so that the pages of a batch's values are reused, not faulted in afresh."""
    total = int(lengths.sum())
    dtype = srcs[0].dtype
    if pool is not None and total:
        out = pool.empty((_size_class(total),), dtype)[:total]
    else:
        out = empty(total, dtype)
    if total >= _ROW_COPY_VALUES * max(1, len(lengths)):
        at = 0
        picks = [0] * len(lengths) if which is None else which.tolist()
        for k, start, n in zip(picks, starts.tolist(), lengths.tolist(), strict=True):
            out[at:at + n] = srcs[k][start:start + n]
            at += n
    elif total and which is None:
        srcs[0].take(_ranges(starts, lengths), out=out, mode="clip")
    elif total:
        dest = np.cumsum(lengths) - lengths
        for k, src in enumerate(srcs):
            mine = which == k
            out[_ranges(dest[mine], lengths[mine])] = src.take(_ranges(starts[mine], lengths[mine]))
    return pa.Array.from_buffers(pa.from_numpy_dtype(dtype), total, [None, pa.py_buffer(out)])


def _fast_lists(arr: pa.Array) -> bool:
    """A list or list-of-lists array of numbers without nulls at any level."""
    t = arr.type
    if not _list_type(t) or arr.null_count or arr.values.null_count:
        return False
    if _list_type(t.value_type):
        return _number_type(t.value_type.value_type) and not arr.values.values.null_count
    return _number_type(t.value_type)


class ListGatherer:
    """The slices of a list or list-of-lists column, as they are read, copied end to
    end into buffers of ``pool`` (a ``BatchPool``), each slice free to go once added.
    A large row group is read in slices: kept until all are read and then
    concatenated, a 100 x 10 multi-hot row group held 128 MB of slices that the
    allocator handed back to the system at once, fresh pages to fault in again for
    the next one (the ragged multi-hot epoch of the loader benchmark: about 500k page
    faults). ``rows``: the rows expected, to size the buffers. Slices with nulls, or
    of other values than numbers, are kept and concatenated by arrow instead.

    >>> from tabstream.loaders.memory import BatchPool
    >>> g = ListGatherer(BatchPool(2), rows=3)
    >>> g.add(pa.array([[[1], [2, 3]]])); g.add(pa.array([[], [[4]]]))
    >>> g.finish().to_pylist()
    [[[1], [2, 3]], [], [[4]]]
    """

    def __init__(self, pool: Any, rows: int) -> None:
        self.pool = pool
        self.rows = max(1, rows)
        self.type: pa.DataType | None = None
        self.levels: list[list[Any]] = []  # per level: [buffer, used, base]; the leaves last
        self.rows_added = 0
        self.kept: list[pa.Array] = []  # arrow's route (see the class docstring)

    def add(self, arr: pa.Array) -> None:
        if self.kept or self.pool is None or not _fast_lists(arr) or (
                self.type is not None and arr.type != self.type):
            if self.levels and not self.kept:
                self.kept.append(self._built())
            self.kept.append(arr)
            return
        if self.type is None:
            self.type = arr.type
        level, depth = arr, 0
        first_rows = self.rows_added == 0
        self.rows_added += len(arr)
        while True:
            if depth == len(self.levels):
                self.levels.append([None, 0, 0])
            entry = self.levels[depth]
            if not _list_type(level.type):
                self._append(entry, numbers(level), first_rows)
                return
            own = numbers(level.offsets)
            lo, hi = int(own[0]), int(own[-1])
            if entry[0] is None:  # offsets begin with a 0
                self._reserve(entry, 1, own.dtype, first_rows)
                entry[0][0] = 0
                entry[1] = 1
            self._reserve(entry, len(own) - 1, own.dtype, first_rows)
            np.add(own[1:], entry[2] - lo, out=entry[0][entry[1]:entry[1] + len(own) - 1],
                   casting="unsafe")
            entry[1] += len(own) - 1
            entry[2] += hi - lo
            level = level.values.slice(lo, hi - lo)
            depth += 1

    def _append(self, entry: list[Any], values: np.ndarray, first_rows: bool) -> None:
        self._reserve(entry, len(values), values.dtype, first_rows)
        entry[0][entry[1]:entry[1] + len(values)] = values
        entry[1] += len(values)

    def _reserve(self, entry: list[Any], n: int, dtype: np.dtype, first_rows: bool) -> None:
        """Room for ``n`` more items; a buffer is sized for all the rows expected, at
        the rate of the rows seen so far (grown by half as much again when short)."""
        buf, used = entry[0], entry[1]
        if buf is not None and used + n <= len(buf):
            return
        need = used + n
        if first_rows:  # the first slice: this level's items per row so far
            need = max(need, -(-need * self.rows // max(1, self.rows_added)) + 1)
        else:
            need = max(need, len(buf) + len(buf) // 2)
        new = self.pool.empty((_size_class(need),), dtype)
        if used:
            new[:used] = buf[:used]
        entry[0] = new

    def _built(self) -> pa.Array:
        t = self.type
        arrays = []
        for entry in self.levels:
            buf, used = entry[0], entry[1]
            arrays.append(buf[:used])
        leaf_type = t
        types = []
        while _list_type(leaf_type):
            types.append(leaf_type)
            leaf_type = leaf_type.value_type
        out = pa.Array.from_buffers(leaf_type, len(arrays[-1]), [None, pa.py_buffer(arrays[-1])])
        for list_type, offsets in zip(reversed(types), reversed(arrays[:-1]), strict=True):
            offsets_type = pa.int64() if pa.types.is_large_list(list_type) else pa.int32()
            out = type(pa.array([], list_type)).from_arrays(
                pa.Array.from_buffers(offsets_type, len(offsets), [None, pa.py_buffer(offsets)]),
                out, type=list_type)
        return out

    def finish(self) -> pa.Array:
        if self.kept:
            return self.kept[0] if len(self.kept) == 1 else pa.concat_arrays(self.kept)
        return self._built()


def take_lists(arr: pa.Array | Sequence[pa.Array], rows: np.ndarray, pool: Any = None) -> pa.Array:
    """``pc.take(arr, rows)`` for a list or list-of-lists column of numbers without
    nulls, copied a row's values at a time: they are one range at every level, where
    arrow's take rebuilds the column inner list by inner list (a multi-hot batch of
    8,192 rows of 100 x 10 ids: 110 ms in arrow, about a third of that here).
    ``arr`` may be several arrays of one type, ``rows`` then indexing them end to
    end (without concatenating them). Any other column (nulls, strings) goes to
    ``pc.take``. ``pool``: see :func:`_copy_ranges`.

    >>> col = pa.array([[[1, 2], [3]], [], [[4], [], [5, 6]]])
    >>> take_lists(col, np.array([2, 0, 2])).to_pylist()
    [[[4], [], [5, 6]], [[1, 2], [3]], [[4], [], [5, 6]]]
    >>> take_lists([pa.array([[1], [2, 3]]), pa.array([[4]])], np.array([2, 0])).to_pylist()
    [[4], [1]]
    """
    parts = list(arr) if isinstance(arr, (list, tuple)) else [arr]
    if not all(_fast_lists(p) for p in parts) or len({p.type for p in parts}) != 1:
        whole = parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        return pc.take(whole, rows)
    t = parts[0].type
    rows = np.asarray(rows, dtype=np.int64)
    which: np.ndarray | None = None
    local = rows
    if len(parts) > 1:
        bounds = np.cumsum([0] + [len(p) for p in parts])
        which = np.searchsorted(bounds, rows, side="right") - 1
        local = rows - bounds[which]
    selections = [(p, slice(None) if which is None else which == k) for k, p in enumerate(parts)]
    starts, ends = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
    for part, mine in selections:
        outer = numbers(part.offsets)
        starts[mine], ends[mine] = outer[local[mine]], outer[local[mine] + 1]
    lengths = ends - starts
    if not _list_type(t.value_type):
        values = _copy_ranges([numbers(p.values) for p in parts], which, starts, lengths, pool)
    else:
        arena = _Arena.get()
        total = int(lengths.sum())
        first = np.cumsum(lengths) - lengths  # each row's first inner list in the result
        # the taken inner lists' lengths, in the result's order (temporaries in the
        # arena: a batch of 8,192 rows of 100 lists is 819,200 of each)
        inner_lengths = arena.take(total, np.int64)
        vstarts, vlengths = np.empty(len(rows), np.int64), np.empty(len(rows), np.int64)
        for part, mine in selections:
            inner = numbers(part.values.offsets)
            n = int(lengths[mine].sum())
            taken = _ranges(starts[mine], lengths[mine], arena.take(n, np.int64))
            before = arena.take(n, inner.dtype)
            inner.take(taken, out=before, mode="clip")
            taken += 1
            after = arena.take(n, inner.dtype)
            inner.take(taken, out=after, mode="clip")
            if which is None:  # the rows' inner lists are the result's, in order
                np.subtract(after, before, out=inner_lengths)
            else:
                inner_lengths[_ranges(first[mine], lengths[mine], arena.take(n, np.int64))] = \
                    np.subtract(after, before, out=after)
            vstarts[mine] = inner[starts[mine]]
            vlengths[mine] = inner[ends[mine]] - vstarts[mine]
        leaves = _copy_ranges([numbers(p.values.values) for p in parts], which, vstarts,
                              vlengths, pool)
        inner_type = t.value_type
        values = type(parts[0].values).from_arrays(
            _offsets_array(inner_lengths, pa.types.is_large_list(inner_type), pool), leaves,
            type=inner_type)
    return type(parts[0]).from_arrays(_offsets_array(lengths, pa.types.is_large_list(t), pool),
                                      values, type=t)


def ragged(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A list array as ``(values, offsets)`` with ``offsets[0] == 0``."""
    offsets = numbers(arr.offsets)
    lo, hi = int(offsets[0]), int(offsets[-1])
    return _values(arr.values, lo, hi), _shifted(offsets, lo)


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
    padded = zeros((rows, length), values.dtype)
    padded[row[keep], pos[keep]] = values[keep]
    mask = empty(rows * length, np.dtype(bool)).reshape(rows, length)
    np.less(np.arange(length), np.minimum(lengths, length)[:, None], out=mask)
    return padded, mask


def pad_lengths(pad: bool | Mapping[str, Any], layouts: Mapping[str, Layout],
                schema: Schema) -> dict[str, Any]:
    """``{name: length}`` for padded lists, ``{name: (F, L)}`` for padded lists of
    lists, from the loader's ``pad=`` argument, the selected columns' ``layouts``
    (in column order) and their ``schema``; fixed-length columns always get an entry
    (their shape unless ``pad`` gives another)."""
    given = dict(pad) if isinstance(pad, Mapping) else {}
    lists = [n for n, layout in layouts.items() if layout.depth]
    unknown = sorted(set(given) - set(lists))
    if unknown:
        raise ValueError(f"pad names {unknown}, which are not selected list columns; "
                         f"list columns: {lists}")
    lengths: dict[str, Any] = {}
    for name in lists:
        layout = layouts[name]
        length = given.get(name)
        if length is None and layout.fixed is not None:
            length = layout.fixed
        elif length is None and not pad:
            continue
        elif length is None and layout.depth == 1:
            length = (schema[name].properties.get("value_count") or {}).get("max")
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
            lengths[name] = check_int(f"pad length of {name!r}", length, 1)
        else:
            if not (isinstance(length, Sequence) and len(length) == 2):
                raise TypeError(f"pad for the list-of-lists column {name!r} must be a pair "
                                f"(inner lists, values per inner list), got {length!r}")
            lengths[name] = tuple(check_int(f"pad length of {name!r}", v, 1) for v in length)
    return lengths

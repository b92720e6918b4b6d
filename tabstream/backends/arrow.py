"""The CPU backend: pyarrow.compute and numpy kernels on Arrow partitions.

Every kernel works per chunk or per column (vectorized), never per row.

>>> import pyarrow as pa
>>> from tabstream.backends.arrow import ArrowBackend
>>> ArrowBackend().clip(pa.array([-3, None, 7]), 0, 5).to_pylist()
[0, None, 5]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends.base import AGGREGATIONS, Backend, Column, hll_rho, slice_plan
from tabstream.core.dtypes import arrow_to_pandas, sort_indices, widen_half
from tabstream.core.hashing import (
    DEFAULT_SEED,
    HashResult,
    list_offsets_and_values,
    missing_mask,
    murmur3_32,
    murmur3_32_with_nulls,
    normalize_missing,
)

__all__ = ["ArrowBackend"]

# Arrow's hash aggregate names for ours
_ARROW_AGG = {"sum": "sum", "count": "count", "size": "count_all", "mean": "mean",
              "min": "min", "max": "max", "first": "first", "last": "last",
              "std": "stddev", "var": "variance", "list": "list"}
#: options of the aggregations whose Arrow defaults differ from ours
_ARROW_OPTIONS = {"sum": pc.ScalarAggregateOptions(skip_nulls=True, min_count=0),
                  "std": pc.VarianceOptions(ddof=1), "var": pc.VarianceOptions(ddof=1)}
#: aggregations that depend on row order (Arrow computes them single-threaded)
_ORDERED = ("first", "last", "list")


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _combined(column: Column) -> pa.Array:
    """``column`` as one array: a chunked array's only chunk as it is (Arrow's
    ``combine_chunks`` copies even a single chunk: 2.8 ms for 2M int64 values)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


#: offsets' numpy type of Arrow's variable-width types with 32- and 64-bit offsets
_OFFSETS = {pa.string(): np.int32, pa.binary(): np.int32,
            pa.large_string(): np.int64, pa.large_binary(): np.int64}


#: the unsigned integer type of each byte width (fixed-width keys of these widths are
#: hashed as integers)
_UINTS = {1: pa.uint8(), 2: pa.uint16(), 4: pa.uint32(), 8: pa.uint64()}


def _fixed_width_keys(column: Column) -> pa.ChunkedArray | None:
    """The non-null values of a string or binary column, in order, as fixed-width
    keys sharing the column's data buffers, when every value is ``w >= 1`` bytes long
    and every null is empty (as the CSV reader and parquet leave them); else None.
    The keys are unsigned integers of ``w`` bytes for ``w`` in 1, 2, 4, 8, else
    ``fixed_size_binary(w)``. None too when the values would not fit one array of the
    column's type (over 2 GiB with 32-bit offsets).

    Raw logs' categoricals are often ids of one width (Criteo's are 8 hex characters).
    Arrow hashes a fixed-width key without the per-value length bookkeeping of a
    variable-width one: on 8-byte ids viewed as ``uint64``, value counts take about
    0.75x the CPU time (benchmarks/RESULTS.md). The check is a pass over each chunk's
    offsets (and validity bits): about a third of the CPU of Arrow's length kernel and
    min/max, which it replaced.

    Not for Arrow's group-by: its grouper hashes such keys poorly when values share
    bytes (see :func:`_sum_by_key`); Arrow's hash kernels (value counts, dictionary
    encoding) do not."""
    offset_type = _OFFSETS.get(column.type)
    if offset_type is None or len(column) == column.null_count:
        return None
    if isinstance(column, pa.ChunkedArray) and column.num_chunks > 1 \
            and column.get_total_buffer_size() < 2**31:  # (an upper bound of the values' bytes)
        # checked as one array: the check's numpy calls cost about 20 us a chunk, more
        # than copying a chunk of a merge's bucket slices or of a parsed CSV block
        # (16 chunks of 5k values: 448 -> 81 us; 19 chunks of 162k values in all: 485 ->
        # 272 us, the copy included); and the keys come out as one chunk, which the
        # callers' _combined no longer copies
        column = column.combine_chunks()
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    itemsize = np.dtype(offset_type).itemsize
    width, keys, total = 0, [], 0
    for chunk in chunks:
        valid = len(chunk) - chunk.null_count
        if valid == 0:
            continue
        buffers = chunk.buffers()
        offsets = np.frombuffer(buffers[1], offset_type, len(chunk) + 1, chunk.offset * itemsize)
        first, size = int(offsets[0]), int(offsets[-1] - offsets[0])
        if size == 0 or size % valid or (width and size != width * valid):
            return None
        width = size // valid
        lengths = np.diff(offsets)
        if chunk.null_count:
            # every valid value `width` bytes, every null none: the lengths are the
            # validity bits times the width
            bits = np.unpackbits(np.frombuffer(buffers[0], np.uint8), count=chunk.offset + len(chunk),
                                 bitorder="little")[chunk.offset:]
            same = np.array_equal(lengths, bits * offset_type(width))
        else:
            same = bool((lengths == width).all())
        if not same:
            return None
        total += size
        keys.append(pa.Array.from_buffers(_UINTS.get(width, pa.binary(width)), valid,
                                          [None, buffers[2].slice(first, size)]))
    if itemsize == 4 and total >= 2**31:
        return None
    return pa.chunked_array(keys, _UINTS.get(width, pa.binary(width)))


def _variable_width(keys: Column, type_: pa.DataType) -> pa.Array:
    """Fixed-width ``keys`` (no nulls) made by :func:`_fixed_width_keys` back as
    ``type_`` (string or binary, large or not): the same bytes, offsets every ``w``."""
    keys = _combined(keys)
    width, n = keys.type.byte_width, len(keys)
    offsets = np.arange(0, (n + 1) * width, width, dtype=_OFFSETS[type_])
    data = keys.buffers()[1].slice(keys.offset * width, n * width) if n else pa.py_buffer(b"")
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), data])


#: vocabularies with fewer values are looked up as they are by ``encode`` (see
#: _encode_fixed_width)
_FIXED_WIDTH_LOOKUP_MIN = 1 << 15


def _lookup_fixed_width(column: Column, vocabulary: Column) -> np.ndarray | None:
    """Position in ``vocabulary`` (``-1``: not in it) of each non-null value of a
    string/binary column, looked up through the fixed-width views of both (see
    :func:`_fixed_width_keys`); None where either has no such view, or the widths
    differ, or the vocabulary holds a null.

    Arrow hashes a fixed-width key without per-value length bookkeeping: on a block
    of Criteo's 8-character ids (86k rows, 26 columns) ``index_in`` takes 14.1 ms on
    the ``uint64`` views against 24.3 ms on the strings."""
    if column.type not in _OFFSETS or vocabulary.type != column.type or vocabulary.null_count:
        return None
    keys = _fixed_width_keys(column)
    vocabulary_keys = _fixed_width_keys(vocabulary) if keys is not None else None
    if vocabulary_keys is None or vocabulary_keys.type != keys.type:
        return None
    return _combined(pc.index_in(keys, value_set=vocabulary_keys)).fill_null(-1).to_numpy()


def _encode_fixed_width(column: Column, vocabulary: Column) -> pa.Array | None:
    """``index_in`` of a string/binary column through :func:`_lookup_fixed_width`,
    None where that does not apply or the vocabulary has fewer than
    :data:`_FIXED_WIDTH_LOOKUP_MIN` values.

    The lookup's set is built from the vocabulary for every partition, and integer
    keys build it about twice as fast as strings (a 145k-value vocabulary, 125k
    values: 11.8 -> 5.8 ms), which pays once vocabularies grow with the data: the
    Criteo recipe's transform of 6 partitions at 16M rows 962-1065 -> 611-643 ms CPU.
    With small vocabularies putting the nulls back into an array with nulls costs
    more than the views save (2M rows, every vocabulary under 32k values: 300 -> 328
    ms); :meth:`ArrowBackend.encode_ids`, which fills them in, views every size."""
    if len(vocabulary) < _FIXED_WIDTH_LOOKUP_MIN:
        return None
    found = _lookup_fixed_width(column, vocabulary)
    if found is None:
        return None
    if not column.null_count:
        return pa.array(found, mask=found < 0).cast(pa.int64())
    ids = np.full(len(column), -1, dtype=np.int64)  # nulls stay null: -1 is masked below
    ids[_validity(column)] = found
    return pa.array(ids, mask=ids < 0)


#: vocabularies with fewer values get no index (:meth:`ArrowBackend.vocabulary_index`):
#: ``index_in`` builds their set for each call in less time than the rest of the lookup
_INDEX_MIN = 1 << 15


class _VocabularyIndex:
    """A hash table over a vocabulary's keys (pandas' index engine), built once and
    probed by every partition's :meth:`ArrowBackend.encode_ids`: ``index_in`` builds
    its set from the vocabulary for each call, which costs more as vocabularies grow
    with the data (benchmarks/RESULTS.md, session 12). ``fixed``: the keys are the
    fixed-width views of a string/binary vocabulary (:func:`_fixed_width_keys`), of
    type ``key_type``; else integers of type ``key_type`` as they are. Holds about 32
    bytes per value (keys, positions, the table's slots) for as long as it is kept."""

    __slots__ = ("fixed", "key_type", "table")

    def __init__(self, fixed: bool, key_type: pa.DataType, keys: np.ndarray) -> None:
        import pandas as pd

        self.fixed, self.key_type = fixed, key_type
        self.table = pd.Index(keys, copy=False)

    def positions(self, column: pa.Array) -> tuple[np.ndarray, bool] | None:
        """Position (-1: absent) of each value of ``column`` and whether they cover
        its non-null values only (``True``) or every row (nulls' entries then mean
        nothing); None where the column's values are not this index's kind of key."""
        if self.fixed:
            if column.type not in _OFFSETS:
                return None
            keys = _fixed_width_keys(column)
            if keys is None:  # values of several widths (or bytes in a null's slot)
                return self._positions_of_width(column), True
            if keys.type != self.key_type:  # every value of another width: none is in it
                return np.full(len(column) - column.null_count, -1, dtype=np.intp), True
            return self.table.get_indexer(_combined(keys).to_numpy()), True
        data = column.buffers()[1] if column.type == self.key_type else None
        if data is None:
            return None
        # every row's slot, nulls' included: the caller overwrites those
        values = np.frombuffer(data, column.type.to_pandas_dtype(), len(column),
                               column.offset * column.type.byte_width)
        return self.table.get_indexer(values), False

    def _positions_of_width(self, column: pa.Array) -> np.ndarray:
        """:meth:`positions` of a string/binary column whose values differ in width:
        the values of the vocabulary's width are looked up (their bytes gathered into
        keys), every other one is absent."""
        take, keys = _keys_of_width(column, self.key_type.byte_width)
        found = np.full(len(column), -1, dtype=np.intp)
        found[take] = self.table.get_indexer(keys)
        return found[_validity(column)] if column.null_count else found


def _keys_of_width(column: pa.Array, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Which values of a string/binary array are not null and exactly ``width`` bytes
    long (1, 2, 4 or 8: a numpy bool per row), and those values' bytes as unsigned
    integers of that width (the views of :func:`_fixed_width_keys`), in order."""
    buffers = column.buffers()
    offset_type = _OFFSETS[column.type]
    offsets = np.frombuffer(buffers[1], offset_type, len(column) + 1,
                            column.offset * np.dtype(offset_type).itemsize)
    take = np.diff(offsets) == width
    if column.null_count:
        take &= _validity(column)
    starts = offsets[:-1][take]
    data = np.frombuffer(buffers[2], np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    keys = np.ascontiguousarray(data[starts[:, None] + np.arange(width)]).view(f"u{width}").ravel()
    return take, keys


#: odd 64-bit multiplier of the spill buckets' hash (2**64 over the golden ratio)
_BUCKET_MULTIPLIER = np.uint64(0x9E3779B97F4A7C15)


def _multiplied_buckets(keys: np.ndarray, buckets: int) -> np.ndarray:
    """Bucket in ``[0, buckets)`` (``int64``) of each ``uint64`` key: the top 32 bits of
    the key times :data:`_BUCKET_MULTIPLIER` (they depend on every bit of the key),
    scaled to ``buckets``."""
    h = keys * _BUCKET_MULTIPLIER  # wraps modulo 2**64
    h >>= np.uint64(32)
    h *= np.uint64(buckets)
    h >>= np.uint64(32)
    return h.view(np.int64)  # below 2**32: the same numbers, a type bincount takes


#: what a vocabulary index costs per value while it is built (keys, pandas' hash
#: table and its growth), with room to spare: measured about 32 bytes once built
_INDEX_BYTES_PER_VALUE = 96


def _room_for(nbytes: int) -> bool:
    """Whether the address-space limit (``RLIMIT_AS``, ``ulimit -v``) leaves ``nbytes``.

    pandas' hash tables do not check their allocations: under a limit reached
    while one grows, the process dies of a segmentation fault instead of raising
    MemoryError. Asked first, the index is left out and the lookup goes through
    Arrow, whose allocations fail as ``ArrowMemoryError`` (one line saying memory ran
    out, from the pipeline)."""
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return True
    try:
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return True
    return used + nbytes <= soft


def _vocabulary_index(vocabulary: Column) -> _VocabularyIndex | None:
    vocabulary = _combined(vocabulary)
    if len(vocabulary) < _INDEX_MIN or vocabulary.null_count:
        return None
    if not _room_for(len(vocabulary) * _INDEX_BYTES_PER_VALUE):
        return None  # index_in then: Arrow's allocations fail as errors, pandas' do not
    if vocabulary.type in _OFFSETS:
        keys = _fixed_width_keys(vocabulary)
        if keys is None or not pa.types.is_unsigned_integer(keys.type):
            return None
        index = _VocabularyIndex(True, keys.type, _combined(keys).to_numpy())
    elif pa.types.is_integer(vocabulary.type):
        index = _VocabularyIndex(False, vocabulary.type, vocabulary.to_numpy())
    else:
        return None
    if not index.table.is_unique:  # repeated values: no index
        return None
    # pandas fills its hash table at the first lookup (is_unique of a sorted
    # vocabulary does not): filled here, so that no partition pays for it
    index.table.get_indexer(index.table[:1])
    return index


def _validity(column: Column) -> np.ndarray:
    """A numpy bool per row of ``column``: not null."""
    return _combined(pc.is_valid(column)).to_numpy(zero_copy_only=False)


def _sum_by_key(table: pa.Table, key: str, aggregations: Sequence[tuple[str, str, str]]) -> pa.Table | None:
    """Integer sums per distinct key (a group-by of ``sum`` and ``size`` aggregations
    only) by a hash kernel and ``np.bincount``; None (use Arrow's group-by) unless the
    key is a string, binary or integer column without nulls and the summed values are
    signed integers without nulls whose sums stay exact in float64 (below 2**53).

    The merge of partial value counts is such a group-by. Arrow's group-by (acero's
    grouper) costs more per call and hashes fixed-width keys poorly when values share
    their leading or trailing bytes (zero-padded ids "00009c40" viewed as integers:
    147 ms against 1.4 ms here for 56k rows); the dictionary-encode kernel does not.
    Keys of one byte width are encoded as fixed-width views (see
    :func:`_fixed_width_keys`). Groups come out in first-seen order, as Arrow's do."""
    keys = table.column(key)
    if keys.null_count or len(keys) == 0 or not (keys.type in _OFFSETS or pa.types.is_integer(keys.type)):
        return None
    weights: list[np.ndarray | None] = []
    for column, agg, _ in aggregations:
        if agg == "size":  # rows per key: no weights
            weights.append(None)
            continue
        values = table.column(column)
        if not pa.types.is_signed_integer(values.type) or values.null_count:  # Arrow: int64 sums
            return None
        values = np.asarray(_combined(values).to_numpy(), dtype=np.float64)
        if len(values) and float(np.abs(values).max()) * len(values) >= 2.0**53:
            return None
        weights.append(values)
    fixed = _fixed_width_keys(keys) if keys.type in _OFFSETS else None
    encoded = pc.dictionary_encode(_combined(fixed if fixed is not None else keys))
    indices, distinct = encoded.indices.to_numpy(), encoded.dictionary
    data = {key: _variable_width(distinct, keys.type) if fixed is not None else distinct}
    for (_, _, out_name), values in zip(aggregations, weights, strict=True):
        summed = np.bincount(indices, weights=values, minlength=len(distinct))
        data[out_name] = pa.array(summed if values is None else summed.astype(np.int64))
    return pa.table(data)


def _to_float64(column: Column) -> np.ndarray:
    """Values as float64 with nulls as NaN: float32/float64 without nulls are converted
    by numpy straight into one array (no Arrow cast, no concatenated copy)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not column.null_count and column.type in (pa.float32(), pa.float64()):
        out = np.empty(len(column), dtype=np.float64)
        at = 0
        for chunk in chunks:
            out[at:at + len(chunk)] = chunk.to_numpy()
            at += len(chunk)
        return out
    # integers past 2**53 rounded to the nearest float64, as numpy converts them
    return np.asarray(pc.cast(column, pa.float64(), safe=False).to_numpy(zero_copy_only=False), dtype=np.float64)


#: integers below this have their float32 log1p in a table (see _log1p_float32)
_LOG1P_TABLE_SIZE = 1 << 16
_LOG1P_TABLE: list[np.ndarray] = []


def _log1p_float32(x: np.ndarray) -> np.ndarray:
    """``np.log1p(x)`` in float64, as float32 (below -1 NaN, at -1 -inf).

    Integers in ``[0, 65536)`` are looked up in a table of exactly those float32
    values (256 KiB, made once per process): counts in logs are mostly small, and a
    gather takes 4.1 against 14.4 ns per value for the logarithm (Criteo's 13
    columns after FillMissing and Clip, benchmarks/RESULTS.md, session 18); the
    other values are computed as before."""
    if x.dtype.kind not in "iu" or x.dtype == np.uint64:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log1p(x, dtype=np.float64).astype(np.float32)
    if not _LOG1P_TABLE:
        _LOG1P_TABLE.append(np.log1p(np.arange(_LOG1P_TABLE_SIZE, dtype=np.float64)).astype(np.float32))
    out = _LOG1P_TABLE[0].take(x, mode="clip")
    # the values outside the table: negative, or 2**16 and above (one shift finds both
    # in 4- and 8-byte integers; narrower ones hold nothing above it)
    outside = np.flatnonzero(x >> 16 if x.dtype.itemsize >= 4 else x < 0)
    if outside.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            out[outside] = np.log1p(x[outside], dtype=np.float64).astype(np.float32)
    return out


def _scalar_as(value: Any, arrow_type: pa.DataType) -> pa.Scalar:
    """``value`` as a scalar of ``arrow_type``. A Python int is made in that type
    directly: inferred first, 2**63 and up (a uint64 fill or bound) would overflow
    int64."""
    if isinstance(value, int) and not isinstance(value, bool) and pa.types.is_integer(arrow_type):
        return pa.scalar(value, arrow_type)
    return pa.scalar(value).cast(arrow_type)


class ArrowBackend(Backend):
    """pyarrow + numpy on the CPU; always available."""

    name = "arrow"
    gpu = False

    # -- missing values --------------------------------------------------------
    def normalize_missing(self, column: Column) -> Column:
        return normalize_missing(column)

    def is_missing(self, column: Column) -> Column:
        return pc.fill_null(missing_mask(column), False)

    def fill_missing(self, column: Column, value: Any) -> Column:
        fill = _scalar_as(value, column.type)
        if pa.types.is_floating(column.type):
            return pc.if_else(self.is_missing(column), fill, column)
        return pc.fill_null(column, fill)

    # -- element-wise arithmetic ---------------------------------------------
    def clip(self, column: Column, lower: Any | None, upper: Any | None) -> Column:
        # skip_nulls=False keeps nulls null; Arrow's min/max treat NaN as missing and
        # would replace it with the bound, so NaN is put back (as pandas' clip keeps it).
        if column.type == pa.float16():
            # no half-float min/max in Arrow: on float32 with the bounds as float16
            # has them, rounded back (every value is a float16 one, so exactly)
            def half(bound: Any | None) -> Any | None:
                return None if bound is None else pa.scalar(bound).cast(pa.float16()).cast(pa.float32()).as_py()

            return self.clip(column.cast(pa.float32()), half(lower), half(upper)).cast(pa.float16())
        out = column
        if lower is not None:
            out = pc.max_element_wise(out, _scalar_as(lower, column.type), skip_nulls=False)
        if upper is not None:
            out = pc.min_element_wise(out, _scalar_as(upper, column.type), skip_nulls=False)
        if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            out = pc.if_else(pc.is_nan(column), column, out)
        return out

    def log1p(self, column: Column) -> Column:
        # numpy's log1p with a float64 loop is ~7x faster here than pc.log1p on a
        # cast copy, and gives the same float32 values.
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        if not column.null_count and len(chunks) > 1 and (
                pa.types.is_integer(column.type) or column.type in (pa.float32(), pa.float64())):
            # no nulls (FillMissing ran first): one numpy call over all chunks, one
            # chunk out (a parsed TSV block has ~20 chunks: 1.06 -> 0.4 ms per column)
            x = np.concatenate([chunk.to_numpy() for chunk in chunks])
            return pa.chunked_array([pa.array(_log1p_float32(x))])
        out_chunks = []
        for chunk in chunks:
            if pa.types.is_boolean(chunk.type):
                chunk = chunk.cast(pa.int8())  # so that nulls can be filled with 0 below
            mask = chunk.is_null().to_numpy(zero_copy_only=False) if chunk.null_count else None
            values = pc.fill_null(chunk, 0) if mask is not None else chunk
            out_chunks.append(pa.array(_log1p_float32(values.to_numpy(zero_copy_only=False)), mask=mask))
        return pa.chunked_array(out_chunks, type=pa.float32())

    def moments(self, column: Column) -> tuple[int, float, float]:
        x = _to_float64(column)
        finite = np.isfinite(x)
        if not finite.all():
            x = x[finite]
        n = len(x)
        if not n:
            return 0, 0.0, 0.0
        # shifted by the first value: a constant column's mean is then that value
        # exactly and its m2 exactly 0 (x.mean() of 0.3s lands a rounding step off,
        # and the leftover deviations made a std of 1e-17 that Normalize divided by)
        deviations = np.subtract(x, x[0])
        offset = float(deviations.mean())
        deviations -= offset
        np.square(deviations, out=deviations)
        return n, float(x[0]) + offset, float(deviations.sum())

    def standardize(self, column: Column, mean: float, std: float) -> Column:
        # integers past 2**53 rounded to the nearest float64 (numpy's conversion;
        # Arrow's safe cast refuses them)
        x = pc.subtract(pc.cast(column, pa.float64(), safe=False), mean)
        if std > 0:
            x = pc.divide(x, std)
        return x.cast(pa.float32())

    # -- categorical -----------------------------------------------------------
    def value_counts(self, column: Column) -> pa.Table:
        if pa.types.is_dictionary(column.type) and not _is_list(column.type.value_type):
            return self._dictionary_value_counts(column)
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        column = normalize_missing(column)
        if _is_list(column.type):
            column = pc.list_flatten(column)
        keys = _fixed_width_keys(column)
        if keys is not None:
            vc = pc.value_counts(keys)
            return pa.table({"values": _variable_width(vc.field("values"), column.type),
                             "counts": vc.field("counts").cast(pa.int64())})
        # float16 counted as float32 (exact): pyarrow before 26 has no half-float kernel
        vc = pc.value_counts(widen_half(column))
        table = pa.table({"values": vc.field("values").cast(column.type),
                          "counts": vc.field("counts").cast(pa.int64())})
        return table.filter(pc.is_valid(table["values"]))

    def _dictionary_value_counts(self, column: Column) -> pa.Table:
        """Counts of a dictionary column without decoding it: per chunk, a bincount of
        the indices names how often each dictionary entry is used; the chunks'
        dictionaries (normalized: a NaN entry is missing, ``-0.0`` is ``0.0``) are then
        encoded once together, which maps equal entries (across chunks whose
        dictionaries differ, or repeated within one) to one id, and a weighted
        bincount sums their counts. Cheaper than a hash aggregation of the used
        entries: one hash pass over the dictionaries, no group-by machinery."""
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        value_type = column.type.value_type
        dictionaries, counts = [], []
        for chunk in chunks:
            size = len(chunk.dictionary)
            if size == 0 or chunk.null_count == len(chunk):
                continue
            indices = chunk.indices
            if indices.null_count:
                indices = indices.drop_null()
            dictionaries.append(chunk.dictionary)
            counts.append(np.bincount(indices.to_numpy(), minlength=size))
        if not dictionaries:
            return pa.table({"values": pa.array([], value_type), "counts": pa.array([], pa.int64())})
        entries = normalize_missing(pa.concat_arrays(dictionaries) if len(dictionaries) > 1 else dictionaries[0])
        uses = np.concatenate(counts) if len(counts) > 1 else counts[0]
        encoded = pc.dictionary_encode(entries)  # a null (or NaN) entry gets a null id
        ids = encoded.indices
        if ids.null_count:
            valid = ids.is_valid().to_numpy(zero_copy_only=False)
            ids, uses = ids.filter(pa.array(valid)), uses[valid]
        distinct = encoded.dictionary
        # float64 weights are exact: a partition holds far fewer than 2**53 rows
        sums = np.bincount(ids.to_numpy(), weights=uses, minlength=len(distinct)).astype(np.int64)
        used = np.flatnonzero(sums)
        return pa.table({"values": distinct.take(pa.array(used)).cast(value_type),
                         "counts": pa.array(sums[used])})

    def vocabulary_index(self, vocabulary: pa.Array) -> _VocabularyIndex | None:
        return _vocabulary_index(vocabulary)

    def vocabulary_positions(self, index: Any, column: Column) -> tuple[np.ndarray, bool] | None:
        return index.positions(_combined(column)) if isinstance(index, _VocabularyIndex) else None

    def encode_ids(self, column: Column, vocabulary: pa.Array, start: int, missing: int,
                   unknown: int, index: Any = None) -> pa.Array:
        # One numpy pass per rule instead of Arrow's add, is_null, coalesce and
        # if_else over int64 arrays with validity bitmaps: Categorify's encoding of a
        # block of 86k rows and 26 columns 34.1 -> 28.2 ms, of which the lookup takes
        # 19.2 (benchmarks/RESULTS.md).
        hit = None
        if not pa.types.is_dictionary(column.type):
            column = _combined(column)
            hit = self.vocabulary_positions(index, column) if index is not None else None
            if hit is None:
                found = _lookup_fixed_width(column, vocabulary)
                hit = None if found is None else (found, True)  # the non-null rows only
        if hit is None:
            hit = _combined(self.encode(column, vocabulary)).fill_null(-1).to_numpy(), False  # every row
        found, fixed = hit
        ids = found.astype(np.int64)
        ids += start
        np.copyto(ids, unknown, where=found < 0)
        if column.null_count:
            valid = _validity(column)
            if fixed:
                all_rows = np.full(len(column), missing, dtype=np.int64)
                all_rows[valid] = ids
                ids = all_rows
            else:
                ids[~valid] = missing
        return pa.array(ids)

    def encode(self, column: Column, vocabulary: pa.Array) -> pa.Array:
        if pa.types.is_dictionary(column.type):
            # each chunk's dictionary is looked up once, then gathered by index
            chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
            out = [self.encode(chunk.dictionary, vocabulary).take(chunk.indices) for chunk in chunks]
            return pa.concat_arrays(out) if out else pa.array([], pa.int64())
        fixed = _encode_fixed_width(column, vocabulary)
        if fixed is not None:
            return fixed
        # float16 keys: looked up on an exact float32 view (no half-float kernels)
        return pc.index_in(widen_half(column), value_set=widen_half(vocabulary)).cast(pa.int64())

    def murmur3(self, column: Column, seed: int = DEFAULT_SEED) -> HashResult:
        return murmur3_32_with_nulls(column, seed)

    def spill_buckets(self, column: Column, buckets: int) -> np.ndarray:
        """An integer (the value modulo 2**64, whatever its type), and a string or
        binary value of exactly 8 bytes (read as a ``uint64``): a multiplicative hash
        (:func:`_multiplied_buckets`); any other value: murmur3, as in the base class.
        Criteo's ids are 8 hex characters: numpy's murmur3 of a 125k-value partial took
        1.73 ms, the multiplication about 0.13 (benchmarks/RESULTS.md, session 20)."""
        column = _combined(column)
        if pa.types.is_integer(column.type):
            keys = column.fill_null(0).to_numpy() if column.null_count else column.to_numpy()
            keys = keys.astype(np.int64, copy=False).view(np.uint64) if keys.dtype.kind == "i" else \
                keys.astype(np.uint64, copy=False)
            out = _multiplied_buckets(keys, buckets)
            if column.null_count:
                out[~_validity(column)] = 0
            return out
        if column.type not in _OFFSETS:
            return super().spill_buckets(column, buckets)
        if not column.null_count:
            keys = _fixed_width_keys(column)
            if keys is not None and keys.type == pa.uint64():  # every value 8 bytes
                return _multiplied_buckets(_combined(keys).to_numpy(), buckets)
        out = super().spill_buckets(column, buckets)
        eight, keys = _keys_of_width(column, 8)
        out[eight] = _multiplied_buckets(keys, buckets)
        return out

    # -- relational ------------------------------------------------------------
    def groupby_aggregate(self, table: pa.Table, keys: Sequence[str],
                          aggregations: Sequence[tuple[str, str, str]]) -> pa.Table:
        specs = []
        for column, agg, _ in aggregations:
            if agg not in AGGREGATIONS:
                raise ValueError(f"unknown aggregation {agg!r}; expected one of {list(AGGREGATIONS)}")
            if agg == "size":
                specs.append(([], "count_all"))
            elif agg in _ARROW_OPTIONS:
                specs.append((column, _ARROW_AGG[agg], _ARROW_OPTIONS[agg]))
            else:
                specs.append((column, _ARROW_AGG[agg]))
        if len(keys) == 1 and all(agg in ("sum", "size") for _, agg, _ in aggregations):
            summed = _sum_by_key(table, keys[0], aggregations)
            if summed is not None:
                return summed
        use_threads = not any(agg in _ORDERED for _, agg, _ in aggregations)
        grouped = table.group_by(list(keys), use_threads=use_threads).aggregate(specs)
        # Arrow names outputs "<column>_<agg>" (or "count_all"); recent versions put
        # the keys first, older ones last: find the aggregates by position either way
        first = len(keys) if grouped.column_names[:len(keys)] == list(keys) else 0
        data = {k: grouped.column(k) for k in keys}
        for i, (_, _, out_name) in enumerate(aggregations):
            data[out_name] = grouped.column(first + i)
        return pa.table(data)

    def join(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
             how: str = "left") -> pa.Table:
        if how not in ("left", "inner"):
            raise ValueError(f"join: how must be 'left' or 'inner', got {how!r}")
        order = "__tabstream_row__"
        while order in left.column_names or order in right.column_names:
            order += "_"
        numbered = left.append_column(order, pa.array(np.arange(left.num_rows, dtype=np.int64)))
        joined = numbered.join(right, list(keys), join_type="left outer" if how == "left" else "inner",
                               use_threads=True, coalesce_keys=True)
        joined = joined.take(pc.sort_indices(joined.column(order)))
        names = left.column_names + [c for c in right.column_names if c not in keys]
        return joined.select(names)

    # -- lists -----------------------------------------------------------------
    def list_flatten(self, column: Column) -> pa.Array:
        return list_offsets_and_values(_combined(column))[1]

    def list_offsets(self, column: Column) -> pa.Array:
        return list_offsets_and_values(_combined(column))[0]

    # -- rows ------------------------------------------------------------------
    def take(self, table: pa.Table, indices: np.ndarray | pa.Array) -> pa.Table:
        return table.take(indices)

    def filter(self, table: pa.Table, mask: Column | np.ndarray) -> pa.Table:
        if isinstance(mask, np.ndarray):
            mask = pa.array(mask, type=pa.bool_())
        return table.filter(pc.fill_null(mask, False))

    def concat(self, tables: Sequence[pa.Table]) -> pa.Table:
        return pa.concat_tables(list(tables), promote_options="permissive")

    # -- user functions ----------------------------------------------------------
    def to_frame(self, table: pa.Table) -> Any:
        return arrow_to_pandas(table)

    def from_frame(self, frame: Any) -> pa.Table:
        return pa.Table.from_pandas(frame, preserve_index=False)

    def from_user_column(self, values: Any) -> pa.Array:
        return pa.array(values, from_pandas=True)

    # -- kernels added for issue 9 (ops behind the backend) ---------------------------
    def digitize(self, column: Column, boundaries: Sequence[float]) -> pa.Array:
        x = _to_float64(column)
        ids = np.searchsorted(np.asarray(boundaries, dtype=np.float64), x, side="right")
        return pa.array(ids.astype(np.int64), mask=np.isnan(x))

    def join_indices(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
                     how: str = "left") -> tuple[pa.Array, pa.Array]:
        if how not in ("left", "inner"):
            raise ValueError(f"join_indices: how must be 'left' or 'inner', got {how!r}")
        lrow, rrow = "__tabstream_left_row__", "__tabstream_right_row__"
        numbered_left = left.select(list(keys)).append_column(
            lrow, pa.array(np.arange(left.num_rows, dtype=np.int64)))
        numbered_right = right.select(list(keys)).append_column(
            rrow, pa.array(np.arange(right.num_rows, dtype=np.int64)))
        # Acero's hash join never matches a null key (SQL equality)
        joined = numbered_left.join(numbered_right, list(keys),
                                    join_type="left outer" if how == "left" else "inner",
                                    use_threads=True)
        left_rows, right_rows = _combined(joined.column(lrow)), _combined(joined.column(rrow))
        if left.num_rows * (right.num_rows + 1) < 2**62:
            # one int64 sort key (left row, then right row): ~2x faster than sort_by
            # on two columns; an unmatched left row (null right row) has one pair only
            key = (left_rows.to_numpy() * (right.num_rows + 1)
                   + pc.fill_null(right_rows, 0).to_numpy(zero_copy_only=False))
            order = pa.array(np.argsort(key, kind="stable"))
        else:
            order = pc.sort_indices(joined, [(lrow, "ascending"), (rrow, "ascending")])
        return left_rows.take(order), right_rows.take(order)

    def list_lengths(self, column: Column) -> pa.Array:
        return pc.fill_null(pc.list_value_length(_combined(column)), 0).cast(pa.int64())

    def list_slice(self, column: Column, start: int, end: int | None,
                   pad_length: int | None = None, pad_value: Any = None) -> pa.Array:
        arr = _combined(column)
        list_type = arr.type if pa.types.is_large_list(arr.type) else pa.list_(arr.type.value_type)
        arr = arr.cast(list_type)
        offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        new_offsets, idx = slice_plan(offsets, valid, start, end, pad_length, np)
        values = arr.values
        if pad_length is not None:
            # pad elements point at one pad value appended to the values
            idx = np.where(idx < 0, len(values), idx)
            values = pa.concat_arrays([values, pa.array([_scalar_as(pad_value, values.type)])])
        taken = values.take(pa.array(idx, type=pa.int64()))
        cls = pa.LargeListArray if pa.types.is_large_list(list_type) else pa.ListArray
        offset_type = pa.int64() if pa.types.is_large_list(list_type) else pa.int32()
        mask = None if pad_length is not None else pa.array(~valid)
        return cls.from_arrays(pa.array(new_offsets, type=offset_type), taken, mask=mask)

    def hll_registers(self, column: Column, precision: int) -> np.ndarray:
        regs = np.zeros(1 << precision, dtype=np.uint8)
        if column.null_count:
            hashes, is_null = self.murmur3(column)
            hashes = np.asarray(hashes)[~np.asarray(is_null, dtype=bool)]
        else:
            hashes = murmur3_32(column)  # the same hashes without a null mask
        register, rank = hll_rho(np.asarray(hashes), precision, np)
        np.maximum.at(regs, register, rank)
        return regs

    def distinct(self, column: Column) -> pa.Array:
        return _combined(pc.unique(column)).drop_null()

    def min_max(self, column: Column) -> tuple[Any, Any]:
        values = _combined(column)
        if _is_list(values.type):
            values = pc.list_flatten(values)
        mm = pc.min_max(values)
        return mm["min"].as_py(), mm["max"].as_py()

    def cast(self, column: Column, type_: pa.DataType) -> pa.Array:
        return _combined(column).cast(type_)

    def split_strings(self, column: Column, separator: str) -> pa.Array:
        column = _combined(column).cast(pa.string())
        split = pc.split_pattern(column, separator)
        return pc.if_else(pc.equal(column, ""), pa.scalar([], type=split.type), split)

    def sort_indices(self, table: pa.Table, sort_keys: Sequence[tuple[str, str]]) -> pa.Array:
        for _, order in sort_keys:
            if order not in ("ascending", "descending"):
                raise ValueError(f"sort_indices: order must be 'ascending' or 'descending', got {order!r}")
        # Arrow's sort is stable; float16 keys are sorted as exact float32
        return sort_indices(table, [(name, order, "at_end") for name, order in sort_keys]).cast(pa.int64())

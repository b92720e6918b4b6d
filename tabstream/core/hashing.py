"""The project's one stable hash: MurmurHash3 x86_32, vectorized with numpy.

``HashBucket``, ``HashedCross`` and ``Categorify(num_buckets=...)`` all hash
through this module, so a value lands in the same bucket on every machine, in
every partition, in every release, and on a future cudf backend.

Algorithm
---------
MurmurHash3 ``x86_32`` exactly as published (block constants ``0xcc9e2d51`` and
``0x1b873593``, ``fmix32`` finalizer), default seed ``0``, applied to the byte
encoding below. The result is the unsigned 32-bit hash as ``numpy.uint32``; it
equals ``mmh3.hash(encoded_bytes, seed, signed=False)``.

Byte encoding of one value
--------------------------
- **strings** (``string``, ``large_string``, ``string_view``, numpy ``U``/``T``,
  Python ``str``): their UTF-8 bytes, no terminator, no length prefix.
- **binary** (``binary``, ``large_binary``, ``binary_view``, ``fixed_size_binary``,
  numpy ``S``, Python ``bytes``): the bytes themselves.
- **integers** of any width and signedness, and **bool** (``False`` -> 0,
  ``True`` -> 1): the value modulo 2**64 as 8 little-endian bytes, i.e. the
  bytes of the value as a two's-complement ``int64`` (a ``uint64`` above
  2**63 - 1 keeps its own 8 bytes). So ``int8(5)``, ``uint64(5)`` and ``5``
  hash alike, and ``-1`` is ``ff ff ff ff ff ff ff ff``.
- **floats** of any width: the 8 little-endian bytes of the IEEE-754 ``float64``
  value (``float16``/``float32`` are widened exactly first), with ``-0.0``
  replaced by ``0.0`` and every NaN replaced by the canonical quiet NaN
  ``0x7ff8000000000000``. ``1.0`` and ``1`` hash differently.
- **temporal** arrow types (date, time, timestamp, duration): their stored
  integer (days, or ticks of the type's unit), encoded as an integer above.
  The unit therefore matters: a ``timestamp[s]`` and a ``timestamp[ms]`` of the
  same instant hash differently.
- **dictionary** arrays: the encoding of the dictionary value, never the index.
- **nulls** are not hashed: their slot in the result is ``0``. A real value can
  hash to ``0`` too (probability 2**-32), so callers that care (Categorify maps
  nulls to index ``1``) use :func:`murmur3_32_with_nulls` and its mask, never
  ``hash == 0``.

What counts as null follows the container: arrow nulls; pandas' missing values
(``None``, ``NaN`` and ``NaT`` in a pandas ``Series`` are all null, as in
``Series.isna()``); ``None`` in a numpy object array. A NaN inside a numpy float
array or a pyarrow float array is a value, hashed as the canonical NaN; so is
``NaT`` in a numpy ``datetime64`` array (its stored integer, ``-2**63``).

The ops do not rely on that: "missing is missing" is their rule, so
``Categorify``, ``HashBucket`` and ``HashedCross`` first pass their columns
through :func:`normalize_missing` (NaN -> null, ``-0.0`` -> ``0.0``, in flat
float columns, float lists and float dictionaries) and hash what remains. The
hash itself is unchanged, so the known answers above stay valid.

Lists are hashed element-wise with :func:`murmur3_32_list`, which returns the
hashes of the flattened values plus offsets to re-wrap them.

Reproducing it elsewhere
------------------------
Any reference MurmurHash3_x86_32 over the encoded bytes gives these hashes
(``mmh3.hash(b, seed, signed=False)``, Guava's ``murmur3_32_fixed().hashBytes``).
cudf's ``hash_values(method="murmur3", seed=s)`` runs the same algorithm but,
per its 2024-2025 sources (not run here: pin it with a known-answer test when
the cudf backend lands), hashes each
column at its native width (int32 as 4 bytes, bool as 1 byte, float32 as 4
bytes) and returns ``s ^ (m + 0x9e3779b9 + (s << 6) + (s >> 2))`` for a
one-column table, where ``m`` is the murmur3 hash. A cudf backend therefore
casts to ``int64``/``float64`` first and recovers
``m = ((r ^ s) - 0x9e3779b9 - (s << 6) - (s >> 2)) mod 2**32`` from the result
``r``. Spark's ``hash`` is *not* compatible (seed 42, 4-byte ints, and its own
handling of a string's trailing bytes).

Combining hashes (crosses)
--------------------------
``hash_combine(h1, h2)`` is MurmurHash3 x86_32 with seed ``0`` of the 8 bytes
``h1.to_bytes(4, "little") + h2.to_bytes(4, "little")``; that is, the hash of the
integer ``h1 + (h2 << 32)`` under the integer encoding above. Crosses of more
columns fold left: ``hash_combine(hash_combine(a, b), c)``. Order matters.

Example
-------
>>> import pyarrow as pa
>>> murmur3_32(pa.array(["", "hello", None]))
array([        0, 613153351,         0], dtype=uint32)
>>> murmur3_32_with_nulls(pa.array(["hello", None])).is_null
array([False,  True])

Cost
----
Whole-array numpy work in cache-sized passes of rows; no Python loop per value.
Strings are processed one 4-byte block index at a time over all strings of the
pass still that long (a pass of equal-length strings, e.g. hex ids, reads each
block as one strided view). When fewer than ``_SERIAL_ROWS`` strings of a pass
remain (the long tail of a URL column) their last blocks are mixed one Python
int at a time, which beats ~14 numpy calls per block. Built for categorical
values (ids, words, URLs); megabyte blobs work but hash at only ~5-20 MB/s.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import is_list_type

__all__ = ["DEFAULT_SEED", "HashResult", "ListHashes", "hash_combine", "list_offsets_and_values",
           "murmur3_32", "murmur3_32_list", "murmur3_32_with_nulls", "normalize_missing"]

DEFAULT_SEED = 0

# Reference constants of MurmurHash3 x86_32.
_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_M = np.uint32(5)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)

# Low-byte masks for a tail of 0..3 bytes.
_TAIL_MASKS = np.array([0x0, 0xFF, 0xFFFF, 0xFFFFFF], dtype=np.uint32)

# Bits of the one NaN every NaN is rewritten to before hashing.
_CANONICAL_NAN = np.array(0x7FF8000000000000, dtype=np.uint64).view(np.float64)

# Work is done in passes of rows so that a pass's temporaries stay in cache
# (~2x faster than streaming 10M-row temporaries). Fixed-width values: a few
# uint32 arrays of 64Ki rows (256 KiB each).
_ROWS_PER_PASS = 1 << 16
# Strings: per-row sort keys, indices and a word table 4x the pass's bytes;
# 16Ki rows keeps short strings' passes near 1 MiB. Long strings are capped
# in bytes, but generously: with fewer rows per pass the per-block numpy
# calls, not memory, become the cost.
_STRING_ROWS_PER_PASS = 1 << 14
_BYTES_PER_PASS = 1 << 22
# Below this many rows still to mix, strings finish block by block in Python
# ints (~0.3 us per block) instead of ~14 numpy calls per block (~15 us).
_SERIAL_ROWS = 32
_SERIAL_SEGMENT = 1 << 16


class HashResult(NamedTuple):
    """Hashes of a column and its null mask.

    ``hashes`` is ``uint32`` with ``0`` at null rows; ``is_null`` is ``bool``.
    """

    hashes: np.ndarray
    is_null: np.ndarray


class ListHashes(NamedTuple):
    """Element hashes of a list column, flattened, and how to re-wrap them.

    Row ``i`` holds ``values[offsets[i]:offsets[i + 1]]``. ``offsets`` is
    ``int64``, starts at 0 and has one entry more than there are rows.
    ``is_null`` marks null elements (their hash is ``0``), ``row_is_null``
    marks null lists (which are empty in ``values``).

    >>> import pyarrow as pa
    >>> r = murmur3_32_list(pa.array([["a", None], None, ["a"]]))
    >>> r.values, r.offsets
    (array([1009084850,          0, 1009084850], dtype=uint32), array([0, 2, 2, 3]))
    >>> r.is_null, r.row_is_null
    (array([False,  True, False]), array([False,  True, False]))
    """

    values: np.ndarray
    offsets: np.ndarray
    is_null: np.ndarray
    row_is_null: np.ndarray


# --------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------


def murmur3_32(values, seed: int = DEFAULT_SEED) -> np.ndarray:
    """MurmurHash3 x86_32 of every value; ``0`` where the value is null.

    ``values``: a pyarrow Array or ChunkedArray, a numpy array, a pandas Series
    (numpy, nullable, ``str``, categorical or ``ArrowDtype``), or a list.
    See the module docstring for the byte encoding of each type.

    >>> import numpy as np, pyarrow as pa
    >>> murmur3_32(np.array([0, -1], dtype=np.int8))
    array([1669671676, 1651860712], dtype=uint32)
    >>> murmur3_32(pa.array(["a", None]), seed=1)
    array([1485495528,          0], dtype=uint32)
    """
    return murmur3_32_with_nulls(values, seed).hashes


def murmur3_32_with_nulls(values, seed: int = DEFAULT_SEED) -> HashResult:
    """Like :func:`murmur3_32`, also returning the null mask it used.

    >>> import pandas as pd
    >>> murmur3_32_with_nulls(pd.Series([1.5, None]))
    HashResult(hashes=array([4034560987,          0], dtype=uint32), is_null=array([False,  True]))
    """
    seed = _check_seed(seed)
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf" and values.ndim == 1:
        # Plain numbers never go through arrow: no copy, no nulls.
        return HashResult(_hash_numeric(values, seed), np.zeros(len(values), dtype=bool))
    chunks = _arrow_chunks(values, "murmur3_32")
    results = [_hash_arrow(chunk, seed) for chunk in chunks]
    return _concat_results(results)


def murmur3_32_list(values, seed: int = DEFAULT_SEED) -> ListHashes:
    """Hash the elements of a list column; return them flat with offsets.

    ``values``: a pyarrow list / large_list / fixed_size_list Array or
    ChunkedArray, a pandas Series of lists, or a list of lists. Elements are
    encoded exactly as :func:`murmur3_32` encodes a flat column of them.

    >>> import pyarrow as pa
    >>> murmur3_32_list(pa.array([[1, 2], []])).offsets
    array([0, 2, 2])
    """
    seed = _check_seed(seed)
    chunks = _arrow_chunks(values, "murmur3_32_list")
    parts, offsets, row_nulls, base = [], [np.zeros(1, dtype=np.int64)], [], 0
    for chunk in chunks:
        if not is_list_type(chunk.type):
            raise TypeError(
                f"murmur3_32_list: expected a list column, got {chunk.type}; "
                "use murmur3_32 for flat columns"
            )
        # flatten() honours the slice offset and drops the contents of null
        # lists, so lengths with nulls as 0 give offsets that match it.
        flat = chunk.flatten()
        if is_list_type(flat.type):
            raise TypeError(
                f"murmur3_32_list: nested list type {chunk.type} is not supported; "
                "flatten it to one level first"
            )
        lengths = pc.list_value_length(chunk).fill_null(0).to_numpy(zero_copy_only=False)
        offsets.append(base + np.cumsum(lengths, dtype=np.int64))
        base += len(flat)
        parts.append(_hash_arrow(flat, seed))
        row_nulls.append(_null_mask(chunk))
    flat_result = _concat_results(parts)
    return ListHashes(
        values=flat_result.hashes,
        offsets=np.concatenate(offsets),
        is_null=flat_result.is_null,
        row_is_null=_concat_bool(row_nulls),
    )


def hash_combine(h1, h2) -> np.ndarray:
    """Combine two uint32 hash columns into one: murmur3 of ``h1 || h2``.

    Exactly ``mmh3.hash(h1.to_bytes(4, "little") + h2.to_bytes(4, "little"), 0,
    signed=False)`` per row; inputs broadcast like numpy arrays. Not symmetric:
    ``hash_combine(a, b) != hash_combine(b, a)`` in general.

    >>> hash_combine(np.array([0, 1], dtype=np.uint32), np.uint32(2))
    array([3773527930, 3278122630], dtype=uint32)
    """
    a, b = np.broadcast_arrays(_as_uint32(h1, "h1"), _as_uint32(h2, "h2"))
    words = np.empty(a.shape + (2,), dtype="<u4")
    words[..., 0] = a
    words[..., 1] = b
    flat = words.reshape(-1, 2)
    return _hash_word_pairs(flat[:, 0], flat[:, 1], 0).reshape(a.shape)


def normalize_missing(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The ops' one view of missing values: NaN becomes null, ``-0.0`` becomes ``0.0``.

    Applies to floating columns, to the elements of list columns of floats and to
    dictionaries of floats (decoded to their value type); any other column is
    returned unchanged (an empty string, ``inf`` and ``-inf`` stay values).

    >>> import pyarrow as pa
    >>> normalize_missing(pa.array([1.5, float("nan"), -0.0, None])).to_pylist()
    [1.5, None, 0.0, None]
    >>> normalize_missing(pa.array([[float("nan"), 2.0], None])).to_pylist()
    [[None, 2.0], None]
    """
    if isinstance(values, pa.ChunkedArray):
        if not _has_floats(values.type):
            return values
        return pa.chunked_array([normalize_missing(c) for c in values.chunks], type=_normalized_type(values.type))
    t = values.type
    if pa.types.is_dictionary(t):
        return normalize_missing(values.cast(t.value_type)) if _has_floats(t.value_type) else values
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        if not _has_floats(t.value_type):
            return values
        offsets, child = list_offsets_and_values(values)
        mask = values.is_null() if values.null_count else None
        return type(values).from_arrays(offsets, normalize_missing(child), mask=mask)
    if pa.types.is_fixed_size_list(t):
        if not _has_floats(t.value_type):
            return values
        mask = values.is_null() if values.null_count else None
        flat = normalize_missing(values.values.slice(values.offset * t.list_size, len(values) * t.list_size))
        return pa.FixedSizeListArray.from_arrays(flat, t.list_size, mask=mask)
    if not pa.types.is_floating(t):
        return values
    if t == pa.float16():  # no compute kernels for half floats: widen exactly and back
        return normalize_missing(values.cast(pa.float32())).cast(t)
    zero = pa.scalar(0.0, t)
    values = pc.if_else(pc.equal(values, zero), zero, values)  # -0.0 == 0.0: clears the sign
    return pc.if_else(pc.is_nan(values), pa.scalar(None, t), values)


def missing_mask(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """True where a value is missing (null, or NaN in a float column); never null.

    >>> import pyarrow as pa
    >>> missing_mask(pa.array([1.5, float("nan"), None])).to_pylist()
    [False, True, True]
    """
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    return pc.is_null(values, nan_is_null=True)


def list_offsets_and_values(values: pa.Array) -> tuple[pa.Array, pa.Array]:
    """``(offsets from 0, child values)`` of a (large) list array, slice-safe.

    Unlike ``flatten()``, the child keeps the slots of null lists that cover a
    range, so ``from_arrays(offsets, f(child), mask=...)`` re-wraps any
    element-wise ``f`` of the child exactly.
    """
    offsets = values.offsets
    start, stop = offsets[0].as_py(), offsets[-1].as_py()
    return pc.subtract(offsets, offsets[0]), values.values.slice(start, stop - start)


def _has_floats(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        return _has_floats(t.value_type)
    if is_list_type(t):
        return _has_floats(t.value_type)
    return pa.types.is_floating(t)


def _normalized_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) and _has_floats(t) else t


# --------------------------------------------------------------------------
# input normalization
# --------------------------------------------------------------------------


def _check_seed(seed) -> int:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"seed must be an int in [0, 2**32), got {type(seed).__name__} {seed!r}")
    if not 0 <= int(seed) < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    return int(seed)


def _as_uint32(h, name: str) -> np.ndarray:
    arr = np.asarray(h)
    if arr.dtype == np.uint32:
        return arr
    if arr.dtype.kind not in "iu":
        raise TypeError(f"hash_combine: {name} must hold uint32 hashes, got dtype {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() > 0xFFFFFFFF):
        raise ValueError(
            f"hash_combine: {name} has values outside [0, 2**32); pass the uint32 "
            "output of murmur3_32"
        )
    return arr.astype(np.uint32)


def _arrow_chunks(values, where: str) -> list[pa.Array]:
    """Turn any supported input into a list of pyarrow Arrays."""
    if isinstance(values, pa.ChunkedArray):
        return list(values.chunks) or [pa.array([], type=values.type)]
    if isinstance(values, pa.Array):
        return [values]
    if isinstance(values, np.ndarray):
        if values.ndim != 1:
            raise ValueError(f"{where}: expected a 1-d array, got shape {values.shape}")
        if values.dtype.kind in "UST":
            # pyarrow reads numpy U/S arrays as C strings, cutting values at
            # their first NUL, and cannot read StringDType; Python objects
            # carry numpy's own values (only trailing NULs dropped).
            values = values.astype(object)
        if values.dtype.kind in "mM":
            values = values.view(np.int64)  # NaT is a value here, as in numpy itself
    try:
        # For a pandas Series, pa.array follows pandas: NaN/None/NaT become nulls.
        converted = pa.array(values)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        kind = type(values).__name__
        dtype = getattr(values, "dtype", None)
        raise TypeError(
            f"{where}: cannot read {kind}"
            + (f" of dtype {dtype}" if dtype is not None else "")
            + " as a column of one type; pass a pyarrow Array, a numpy array or a "
            "pandas Series of strings, bytes, integers, floats or bools"
        ) from exc
    if isinstance(converted, pa.ChunkedArray):
        return list(converted.chunks) or [pa.array([], type=converted.type)]
    return [converted]


def _null_mask(arr: pa.Array) -> np.ndarray:
    if arr.null_count == 0:
        return np.zeros(len(arr), dtype=bool)
    return arr.is_null().to_numpy(zero_copy_only=False)


def _concat_bool(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


def _concat_results(results: list[HashResult]) -> HashResult:
    if len(results) == 1:
        return results[0]
    if not results:
        return HashResult(np.zeros(0, dtype=np.uint32), np.zeros(0, dtype=bool))
    return HashResult(
        np.concatenate([r.hashes for r in results]),
        np.concatenate([r.is_null for r in results]),
    )


# --------------------------------------------------------------------------
# arrow dispatch
# --------------------------------------------------------------------------


def _hash_arrow(arr: pa.Array, seed: int) -> HashResult:
    """Hash one arrow Array (any offset), zeroing null slots."""
    t = arr.type
    if pa.types.is_dictionary(t):
        return _hash_dictionary(arr, seed)
    hasher = _hasher_for(t)
    is_null = _null_mask(arr)
    if arr.null_count == len(arr):  # also covers empty arrays and pa.null()
        return HashResult(np.zeros(len(arr), dtype=np.uint32), is_null)
    hashes = hasher(arr, seed)
    if arr.null_count:
        hashes[is_null] = 0  # null slots may hold any bytes in arrow
    return HashResult(hashes, is_null)


def _hasher_for(t: pa.DataType):
    """The function hashing non-dictionary arrays of type ``t``."""
    if pa.types.is_string(t) or pa.types.is_binary(t):
        return lambda arr, seed: _hash_bytes(*_binary_buffers(arr, np.int32), seed)
    if pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        return lambda arr, seed: _hash_bytes(*_binary_buffers(arr, np.int64), seed)
    if pa.types.is_string_view(t) or pa.types.is_binary_view(t):
        return lambda arr, seed: _hash_bytes(
            *_binary_buffers(arr.cast(pa.large_binary()), np.int64), seed
        )
    if pa.types.is_fixed_size_binary(t):
        return lambda arr, seed: _hash_bytes(*_fixed_binary_buffers(arr), seed)
    if pa.types.is_boolean(t):
        return lambda arr, seed: _hash_numeric(
            arr.fill_null(False).to_numpy(zero_copy_only=False), seed
        )
    is_interval = pa.types.is_interval(t)  # 16-byte structs, not one integer
    if (
        pa.types.is_integer(t)
        or pa.types.is_floating(t)
        or (pa.types.is_temporal(t) and not is_interval)
    ):
        return lambda arr, seed: _hash_numeric(_fixed_width_values(arr), seed)
    if pa.types.is_null(t):
        return lambda arr, seed: np.zeros(len(arr), dtype=np.uint32)
    if is_list_type(t):
        raise TypeError(
            f"murmur3_32: got a list column ({t}); use murmur3_32_list, which hashes "
            "the elements and returns offsets to re-wrap them"
        )
    raise TypeError(
        f"murmur3_32: cannot hash arrow type {t}; supported: string, binary, "
        "integer, floating, bool, date/time/timestamp/duration, and dictionaries of those"
    )


def _hash_dictionary(arr: pa.DictionaryArray, seed: int) -> HashResult:
    """Hash each dictionary entry once, then gather by index."""
    if len(arr.dictionary) == 0:  # then every index is null
        return HashResult(np.zeros(len(arr), dtype=np.uint32), np.ones(len(arr), dtype=bool))
    dict_hashes, dict_nulls = _hash_arrow(arr.dictionary, seed)
    indices = arr.indices.fill_null(0).to_numpy(zero_copy_only=False)
    is_null = _null_mask(arr.indices) | dict_nulls[indices]
    hashes = dict_hashes[indices]
    hashes[is_null] = 0
    return HashResult(hashes, is_null)


def _binary_buffers(arr: pa.Array, offset_type) -> tuple[np.ndarray, np.ndarray]:
    """(data bytes, offsets from 0) of a string/binary array, zero-copy."""
    buffers = arr.buffers()
    offsets = np.frombuffer(
        buffers[1],
        dtype=offset_type,
        count=len(arr) + 1,
        offset=arr.offset * np.dtype(offset_type).itemsize,
    )
    start, stop = int(offsets[0]), int(offsets[-1])
    if buffers[2] is None or stop == start:
        data = np.zeros(0, dtype=np.uint8)
    else:
        data = np.frombuffer(buffers[2], dtype=np.uint8, count=stop - start, offset=start)
    return data, offsets.astype(np.int64) - start


def _fixed_binary_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    width = arr.type.byte_width
    start = arr.offset * width
    data = np.frombuffer(arr.buffers()[1], dtype=np.uint8, count=len(arr) * width, offset=start)
    return data, np.arange(len(arr) + 1, dtype=np.int64) * width


def _fixed_width_values(arr: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of an int/float/temporal array's value buffer."""
    t = arr.type
    if pa.types.is_floating(t):
        dtype = np.dtype(f"f{t.bit_width // 8}")
    elif pa.types.is_unsigned_integer(t):
        dtype = np.dtype(f"u{t.bit_width // 8}")
    else:  # signed ints and temporal types, whose storage is a signed int
        dtype = np.dtype(f"i{t.bit_width // 8}")
    return np.frombuffer(
        arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize
    )


# --------------------------------------------------------------------------
# fixed-width values: two 32-bit blocks per value
# --------------------------------------------------------------------------


def _hash_numeric(values: np.ndarray, seed: int) -> np.ndarray:
    """Hash bool/int/float numpy values through their 8-byte encoding.

    >>> _hash_numeric(np.array([1], dtype=np.uint8), 0)  # bytes 01 00 00 00 00 00 00 00
    array([1392991556], dtype=uint32)
    >>> _hash_numeric(np.array([1.0]), 0)  # bytes of float64 1.0: a different hash
    array([4152582287], dtype=uint32)
    """
    kind = values.dtype.kind
    if kind == "f":
        eight = _normalized_float64(values)
    elif kind == "u":
        eight = np.ascontiguousarray(values, dtype="<u8")
    elif kind in "ib":
        eight = np.ascontiguousarray(values, dtype="<i8")
    else:
        raise TypeError(f"murmur3_32: cannot hash numpy dtype {values.dtype}")
    words = eight.view("<u4").reshape(-1, 2)  # little-endian: low word first
    return _hash_word_pairs(words[:, 0], words[:, 1], seed)


def _normalized_float64(values: np.ndarray) -> np.ndarray:
    """float64 copy with -0.0 -> 0.0 and every NaN -> the canonical NaN."""
    # Widening a signaling NaN raises the FP "invalid" flag; every NaN is
    # replaced just below, so that one flag is expected here and only here.
    with np.errstate(invalid="ignore"):
        out = np.array(values, dtype="<f8", copy=True)
    np.copyto(out, 0.0, where=out == 0.0)  # -0.0 == 0.0, so this also clears the sign
    np.copyto(out, _CANONICAL_NAN, where=np.isnan(out))
    return out


def _hash_word_pairs(lo: np.ndarray, hi: np.ndarray, seed: int) -> np.ndarray:
    """murmur3 of the 8 bytes ``lo || hi`` (two uint32 blocks) per row."""
    n = len(lo)
    out = np.empty(n, dtype=np.uint32)
    scratch = _Scratch(min(n, _ROWS_PER_PASS))
    for r0 in range(0, n, _ROWS_PER_PASS):
        r1 = min(r0 + _ROWS_PER_PASS, n)
        h = out[r0:r1]
        h.fill(seed)
        k, tmp, _ = scratch.take(r1 - r0)
        _mix_block(h, lo[r0:r1], k, tmp)
        _mix_block(h, hi[r0:r1], k, tmp)
        _finalize(h, np.uint32(8), tmp)
    return out


# --------------------------------------------------------------------------
# variable-length bytes
# --------------------------------------------------------------------------


def _hash_bytes(data: np.ndarray, offsets: np.ndarray, seed: int) -> np.ndarray:
    """murmur3 of ``data[offsets[i]:offsets[i+1]]`` for each row ``i``.

    ``data`` is uint8, ``offsets`` int64 starting at 0.

    >>> _hash_bytes(np.frombuffer(b"hello", np.uint8), np.array([0, 0, 5]), 0)
    array([        0, 613153351], dtype=uint32)
    """
    n = len(offsets) - 1
    out = np.empty(n, dtype=np.uint32)
    scratch = _Scratch(min(n, _STRING_ROWS_PER_PASS))
    r0 = 0
    while r0 < n:
        r1 = _pass_end(offsets, r0)
        part = offsets[r0 : r1 + 1]
        lo, hi = int(part[0]), int(part[-1])
        out[r0:r1] = _hash_bytes_pass(data[lo:hi], part - lo, seed, scratch.take(r1 - r0))
        r0 = r1
    return out


def _pass_end(offsets: np.ndarray, r0: int) -> int:
    """End row of the pass starting at ``r0``: bounded in rows and in bytes."""
    n = len(offsets) - 1
    by_bytes = int(np.searchsorted(offsets, offsets[r0] + _BYTES_PER_PASS, side="right")) - 1
    return max(r0 + 1, min(r0 + _STRING_ROWS_PER_PASS, n, by_bytes))


def _hash_bytes_pass(data, offsets, seed, work) -> np.ndarray:
    """One cache-sized pass of :func:`_hash_bytes`."""
    lengths = np.diff(offsets)
    if lengths.min() == lengths.max():
        h = np.full(len(lengths), seed, dtype=np.uint32)
        _mix_fixed_length(h, data, int(lengths[0]), work)
        _finalize(h, lengths.astype(np.uint32), work[1])
        return h
    return _hash_variable_length(data, offsets[:-1], lengths, seed, work)


def _mix_fixed_length(h, data: np.ndarray, length: int, work) -> None:
    """All strings ``length`` bytes long (hex ids): strided views, no gathers.

    Block ``j`` of row ``i`` is the word at byte ``i * length + 4 * j``, so one
    block of every row is a single strided (unaligned) ``<u4`` view.
    """
    n = len(h)
    k, tmp, _ = work
    n_blocks = length // 4
    if n < _SERIAL_ROWS:  # a few long strings: per-step numpy overhead dominates
        starts = np.arange(n, dtype=np.int64) * length
        _mix_serial(h, data, starts, 0, np.full(n, n_blocks))
    elif n_blocks:
        words = np.ndarray(shape=(len(data) - 3,), dtype="<u4", buffer=data, offset=0, strides=(1,))
        for j in range(n_blocks):
            first = 4 * j
            _mix_block(h, words[first : first + length * (n - 1) + 1 : length], k, tmp)
    tail = length % 4
    if tail:
        # The tail bytes are columns of the (rows, length) byte matrix.
        cols = data.reshape(n, length)[:, length - tail :]
        k[:] = cols[:, 0]
        for b in range(1, tail):
            np.bitwise_or(k, cols[:, b].astype(np.uint32) << np.uint32(8 * b), out=k)
        _mix_tail(h, k, tmp)


def _hash_variable_length(data, starts, lengths, seed, work) -> np.ndarray:
    """Mixed lengths: block j is mixed into the strings that have a block j.

    Rows are hashed sorted longest-first, so the rows that still have a block
    ``j`` are a prefix and each step works on a slice instead of masking all
    rows; one scatter puts the hashes back in row order at the end. Once fewer
    than ``_SERIAL_ROWS`` rows are left (the long tail of a URL column), their
    remaining blocks go through :func:`_mix_serial`.
    """
    k, tmp, idx = work
    n = len(lengths)
    n_blocks = lengths >> 2
    max_blocks = int(n_blocks.max())
    key = max_blocks - n_blocks
    # A uint16 key makes numpy use its radix sort (~5x faster than on int64).
    order = np.argsort(key.astype(np.uint16) if max_blocks < 2**16 else key, kind="stable")
    lengths, n_blocks, starts = lengths[order], n_blocks[order], starts[order]
    words = _ShiftedWords(data)
    first = words.index(starts)
    h = np.full(n, seed, dtype=np.uint32)
    minus_blocks = -n_blocks  # ascending, for searchsorted
    for j in range(max_blocks):
        c = int(np.searchsorted(minus_blocks, -j, side="left"))  # rows with > j blocks
        if c < _SERIAL_ROWS:
            _mix_serial(h[:c], data, starts[:c], j, n_blocks[:c])
            break
        np.add(first[:c], j, out=idx[:c])
        words.take(idx[:c], out=k[:c])
        _mix_loaded(h[:c], k[:c], tmp[:c])
    tails = lengths & 3
    if tails.any():
        # Bytes past a string's end belong to the next string or are padding;
        # the mask keeps only the string's own 0..3 tail bytes.
        np.add(first, n_blocks, out=idx)
        words.take(idx, out=k)
        np.bitwise_and(k, _TAIL_MASKS[tails], out=k)
        _mix_tail(h, k, tmp)
    _finalize(h, lengths.astype(np.uint32), tmp)
    out = np.empty(n, dtype=np.uint32)
    out[order] = h
    return out


def _mix_serial(h, data, starts, first_block: int, n_blocks) -> None:
    """Blocks ``first_block..n_blocks[r]-1`` of a few rows, one row at a time.

    For a handful of long strings, ~12 numpy calls per block cost more than
    the serial part of murmur3 in Python ints. Block scrambling stays
    vectorized over each row's blocks (a contiguous ``<u4`` view), and is
    done in segments so a huge string never needs a huge temporary.
    """
    for r in range(len(h)):
        x = int(h[r])
        for b0 in range(first_block, int(n_blocks[r]), _SERIAL_SEGMENT):
            b1 = min(b0 + _SERIAL_SEGMENT, int(n_blocks[r]))
            s = int(starts[r]) + 4 * b0
            k = data[s : s + 4 * (b1 - b0)].view("<u4").copy()
            _scramble(k, np.empty_like(k))
            for kv in k.tolist():
                x ^= kv
                x = ((x << 13) | (x >> 19)) & 0xFFFFFFFF
                x = (x * 5 + 0xE6546B64) & 0xFFFFFFFF
        h[r] = x


class _ShiftedWords:
    """Every little-endian 4-byte window of a byte buffer, as aligned uint32.

    Row ``a`` of ``table`` (flattened) holds the words starting at bytes
    ``a, a + 4, a + 8, ...``; the word at byte ``p`` is
    ``table[(p % 4) * m + p // 4]``. Gathering from this aligned copy is ~5x
    faster than gathering from an unaligned 1-byte-strided view, and the zero
    padding makes windows past the end readable.
    """

    def __init__(self, data: np.ndarray):
        self.m = len(data) // 4 + 1
        padded = np.zeros(4 * self.m + 4, dtype=np.uint8)
        padded[: len(data)] = data
        table = np.empty((4, self.m), dtype=np.uint32)
        for a in range(4):
            table[a] = padded[a : a + 4 * self.m].view("<u4")
        self.table = table.reshape(-1)

    def take(self, indices: np.ndarray, out: np.ndarray) -> None:
        # Indices are valid by construction; mode="clip" skips numpy's
        # buffered bounds check (which copies through a temporary).
        np.take(self.table, indices, out=out, mode="clip")

    def index(self, positions: np.ndarray) -> np.ndarray:
        """Table index of the word at each byte position; +j is block j."""
        return (positions & 3) * self.m + (positions >> 2)


# --------------------------------------------------------------------------
# the MurmurHash3 x86_32 steps, in place on uint32 arrays
# --------------------------------------------------------------------------


class _Scratch:
    """Reusable work arrays (block, temporary, gather index): no per-pass allocation."""

    def __init__(self, size: int):
        self.k = np.empty(size, dtype=np.uint32)
        self.tmp = np.empty(size, dtype=np.uint32)
        self.idx = np.empty(size, dtype=np.intp)

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.k[:n], self.tmp[:n], self.idx[:n]


def _rotl(x: np.ndarray, r: int, tmp: np.ndarray) -> None:
    """x = rotate_left(x, r), in place (uint32)."""
    np.right_shift(x, np.uint32(32 - r), out=tmp)
    np.left_shift(x, np.uint32(r), out=x)
    np.bitwise_or(x, tmp, out=x)


def _scramble(k: np.ndarray, tmp: np.ndarray, source: np.ndarray | None = None) -> None:
    """k = rotl(source * c1, 15) * c2 (source defaults to k); uint32 wraps mod 2**32."""
    np.multiply(k if source is None else source, _C1, out=k)
    _rotl(k, 15, tmp)
    np.multiply(k, _C2, out=k)


def _absorb(h: np.ndarray, k: np.ndarray, tmp: np.ndarray) -> None:
    """h = rotl(h ^ k, 13) * 5 + n, for a scrambled block k."""
    np.bitwise_xor(h, k, out=h)
    _rotl(h, 13, tmp)
    np.multiply(h, _M, out=h)
    np.add(h, _N, out=h)


def _mix_block(h: np.ndarray, block: np.ndarray, k: np.ndarray, tmp: np.ndarray) -> None:
    """Body step for one 4-byte block (any view); ``k`` and ``tmp`` are scratch."""
    _scramble(k, tmp, source=block)  # reads the view once, no separate copy
    _absorb(h, k, tmp)


def _mix_loaded(h: np.ndarray, k: np.ndarray, tmp: np.ndarray) -> None:
    """:func:`_mix_block` for a block already in ``k`` (which it overwrites)."""
    _scramble(k, tmp)
    _absorb(h, k, tmp)


def _mix_tail(h: np.ndarray, k: np.ndarray, tmp: np.ndarray) -> None:
    """Tail step: h ^= scramble(k). A zero k (no tail) leaves h unchanged."""
    _scramble(k, tmp)
    np.bitwise_xor(h, k, out=h)


def _finalize(h: np.ndarray, length, tmp: np.ndarray) -> None:
    """h ^= byte length, then the fmix32 avalanche."""
    np.bitwise_xor(h, length, out=h)
    for shift, factor in ((16, _F1), (13, _F2), (16, None)):
        np.right_shift(h, np.uint32(shift), out=tmp)
        np.bitwise_xor(h, tmp, out=h)
        if factor is not None:
            np.multiply(h, factor, out=h)

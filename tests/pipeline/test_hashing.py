"""Known-answer tests for tabstream's one stable hash (MurmurHash3 x86_32).

Expected values come from two places that share no code with the module: the
``mmh3`` package (a C binding of the reference implementation) and the small
pure-Python ``ref_murmur3_32`` below, written from the published algorithm. A
few published test vectors pin both.
"""

from __future__ import annotations

import contextlib
import math
import struct

import mmh3
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabstream.core import hashing
from tabstream.core.hashing import (
    hash_combine,
    murmur3_32,
    murmur3_32_list,
    murmur3_32_with_nulls,
    normalize_missing,
)

SETTINGS = settings(max_examples=50, deadline=None)
MASK32 = 0xFFFFFFFF
CANONICAL_NAN_BYTES = (0x7FF8000000000000).to_bytes(8, "little")


# --------------------------------------------------------------------------
# independent references
# --------------------------------------------------------------------------


def ref_murmur3_32(data: bytes, seed: int = 0) -> int:
    """MurmurHash3 x86_32, one Python int at a time, from the published algorithm."""

    def rotl(x: int, r: int) -> int:
        return ((x << r) | (x >> (32 - r))) & MASK32

    def scramble(k: int) -> int:
        return (rotl((k * 0xCC9E2D51) & MASK32, 15) * 0x1B873593) & MASK32

    h = seed
    body = len(data) - len(data) % 4
    for i in range(0, body, 4):
        h ^= scramble(int.from_bytes(data[i : i + 4], "little"))
        h = (rotl(h, 13) * 5 + 0xE6546B64) & MASK32
    if len(data) > body:
        h ^= scramble(int.from_bytes(data[body:], "little"))
    h ^= len(data) & MASK32
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & MASK32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def encode(value) -> bytes:
    """The documented byte encoding of one non-null value."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bool, int, np.integer, np.bool_)):
        return (int(value) % 2**64).to_bytes(8, "little")
    f = float(value)
    if math.isnan(f):
        return CANONICAL_NAN_BYTES
    return struct.pack("<d", 0.0 if f == 0.0 else f)


def expected(values, seed: int = 0) -> np.ndarray:
    """mmh3 of each value's encoding; 0 for None."""
    return np.array(
        [0 if v is None else mmh3.hash(encode(v), seed, signed=False) for v in values],
        dtype=np.uint32,
    )


def sliced(values: list, type_: pa.DataType, pad: int) -> pa.Array:
    """``values`` as an arrow array with a non-zero offset into its buffers."""
    filler = values[:1] * pad if values else []
    return pa.array(filler + values + filler, type=type_).slice(pad, len(values))


def chunked(values: list, type_: pa.DataType, cuts: list[int], pad: int) -> pa.ChunkedArray:
    """``values`` split at ``cuts`` into sliced chunks."""
    bounds = [0, *sorted(c % (len(values) + 1) for c in cuts), len(values)]
    parts = [values[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    return pa.chunked_array([sliced(p, type_, pad) for p in parts], type=type_)


texts = st.text(max_size=40)
cuts = st.lists(st.integers(0, 200), max_size=4)
pads = st.integers(0, 5)


# --------------------------------------------------------------------------
# the references themselves
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "seed", "value"),
    [
        # Widely published MurmurHash3_x86_32 test vectors.
        (b"", 0, 0),
        (b"", 1, 0x514E28B7),
        (b"", 0xFFFFFFFF, 0x81F16F39),
        (b"\x00\x00\x00\x00", 0, 0x2362F9DE),
        (b"aaaa", 0x9747B28C, 0x5A97808A),
        (b"a", 0x9747B28C, 0x7FA09EA6),
        (b"ab", 0x9747B28C, 0x74875592),
        (b"abc", 0x9747B28C, 0xC84A62DD),
        (b"abcd", 0x9747B28C, 0xF0478627),
        (b"Hello, world!", 0x9747B28C, 0x24884CBA),
        (b"The quick brown fox jumps over the lazy dog", 0x9747B28C, 0x2FA826CD),
        (b"hello", 0, 613153351),
    ],
)
def test_published_vectors(data, seed, value):
    assert ref_murmur3_32(data, seed) == value
    assert mmh3.hash(data, seed, signed=False) == value
    assert murmur3_32(pa.array([data], pa.binary()), seed=seed).tolist() == [value]


@SETTINGS
@given(st.binary(max_size=64), st.integers(0, MASK32))
def test_reference_matches_mmh3(data, seed):
    assert ref_murmur3_32(data, seed) == mmh3.hash(data, seed, signed=False)


def test_literal_examples_from_the_brief():
    assert murmur3_32(pa.array([b""], pa.binary())).tolist() == [0]
    assert murmur3_32(pa.array(["hello"])).tolist() == [613153351]
    assert murmur3_32(pa.array(["", "hello", None])).dtype == np.uint32


# --------------------------------------------------------------------------
# strings and binary
# --------------------------------------------------------------------------


STRING_TYPES = [pa.string(), pa.large_string(), pa.string_view()]


@SETTINGS
@given(
    st.lists(st.none() | texts, max_size=60),
    cuts,
    pads,
    st.sampled_from(STRING_TYPES),
    st.integers(0, MASK32),
)
def test_strings_match_mmh3_across_chunks_offsets_and_nulls(values, cut, pad, type_, seed):
    arr = chunked(values, type_, cut, pad)
    result = murmur3_32_with_nulls(arr, seed=seed)
    np.testing.assert_array_equal(result.hashes, expected(values, seed))
    np.testing.assert_array_equal(result.is_null, [v is None for v in values])


@SETTINGS
@given(st.lists(st.none() | st.binary(max_size=40), max_size=60), pads)
def test_binary_matches_mmh3(values, pad):
    for type_ in (pa.binary(), pa.large_binary(), pa.binary_view()):
        np.testing.assert_array_equal(murmur3_32(sliced(values, type_, pad)), expected(values))


@SETTINGS
@given(st.integers(0, 13), st.integers(0, 40), pads, st.data())
def test_fixed_length_fast_path(length, n, pad, data):
    """Columns whose strings all have one length (hex ids) take the strided path."""
    values = data.draw(
        st.lists(st.binary(min_size=length, max_size=length), min_size=n, max_size=n)
    )
    arr = sliced(values, pa.binary(), pad)
    np.testing.assert_array_equal(murmur3_32(arr, seed=7), expected(values, 7))
    fixed = sliced(values, pa.binary(length), pad) if length else None
    if fixed is not None:
        np.testing.assert_array_equal(murmur3_32(fixed, seed=7), expected(values, 7))


def test_hex_ids():
    values = [f"{i * 2654435761 % 2**32:08x}" for i in range(5000)]
    np.testing.assert_array_equal(murmur3_32(pa.array(values)), expected(values))


@contextlib.contextmanager
def tiny_passes():
    """Shrink the pass sizes so small inputs cross many pass boundaries."""
    names = ["_ROWS_PER_PASS", "_STRING_ROWS_PER_PASS", "_BYTES_PER_PASS", "_SERIAL_ROWS"]
    saved = {name: getattr(hashing, name) for name in names}
    for name, value in zip(names, [5, 7, 64, 3], strict=True):
        setattr(hashing, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(hashing, name, value)


@SETTINGS
@given(st.lists(st.binary(max_size=200), min_size=1, max_size=80), st.integers(0, MASK32))
def test_many_small_passes(values, seed):
    """Tiny passes: every pass boundary, serial tail and ragged step is exercised."""
    arr = pa.array(values, pa.binary())
    ints = list(range(-11, 12))
    with tiny_passes():
        got = murmur3_32(arr, seed=seed)
        got_ints = murmur3_32(np.array(ints), seed=seed)
    np.testing.assert_array_equal(got, expected(values, seed))
    np.testing.assert_array_equal(got_ints, expected(ints, seed))


def test_long_strings_and_long_tails():
    rng = np.random.default_rng(0)
    lengths = np.minimum(rng.lognormal(3.0, 1.2, 3000).astype(int), 5000)
    lengths[17] = 70_000  # one long outlier: the serial tail path
    values = [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in lengths]
    np.testing.assert_array_equal(
        murmur3_32(pa.array(values, pa.binary()), seed=3), expected(values, 3)
    )
    one = [values[17]]  # a pass of one row, alone
    np.testing.assert_array_equal(murmur3_32(pa.array(one, pa.binary())), expected(one))


def test_null_slots_with_garbage_bytes_hash_to_zero():
    # Arrow allows a null slot to span bytes; they must not leak into the hash.
    offsets = pa.py_buffer(np.array([0, 3, 6, 9], dtype=np.int32).tobytes())
    validity = pa.py_buffer(np.packbits([1, 0, 1], bitorder="little").tobytes())
    arr = pa.Array.from_buffers(pa.string(), 3, [validity, offsets, pa.py_buffer(b"abcxyzdef")])
    result = murmur3_32_with_nulls(arr)
    np.testing.assert_array_equal(result.hashes, expected(["abc", None, "def"]))
    np.testing.assert_array_equal(result.is_null, [False, True, False])


# --------------------------------------------------------------------------
# integers, bools, floats, temporal
# --------------------------------------------------------------------------


INT_DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


@SETTINGS
@given(st.sampled_from(INT_DTYPES), st.data(), pads, cuts)
def test_integers_match_mmh3(dtype, data, pad, cut):
    info = np.iinfo(dtype)
    ints = st.integers(int(info.min), int(info.max))
    values = data.draw(st.lists(ints, max_size=50))
    np.testing.assert_array_equal(murmur3_32(np.array(values, dtype=dtype)), expected(values))
    with_nulls = data.draw(st.lists(st.none() | ints, max_size=50))
    arr = chunked(with_nulls, pa.from_numpy_dtype(np.dtype(dtype)), cut, pad)
    np.testing.assert_array_equal(murmur3_32(arr), expected(with_nulls))


def test_integer_edge_values():
    values = [0, 1, -1, 2**63 - 1, -(2**63)]
    np.testing.assert_array_equal(murmur3_32(np.array(values, dtype=np.int64)), expected(values))
    big = [2**64 - 1, 2**63, 12345]
    np.testing.assert_array_equal(murmur3_32(np.array(big, dtype=np.uint64)), expected(big))
    # uint64 2**64-1 and int64 -1 share their 8 bytes, hence their hash.
    assert murmur3_32(np.array([2**64 - 1], np.uint64))[0] == murmur3_32(np.array([-1]))[0]


def test_same_integer_any_width_same_hash():
    per_dtype = {d: murmur3_32(np.array([0, 5, 100], dtype=d)).tolist() for d in INT_DTYPES}
    assert len({tuple(v) for v in per_dtype.values()}) == 1
    assert murmur3_32(pa.array([True, False, None])).tolist() == [*expected([1, 0]), 0]
    np.testing.assert_array_equal(murmur3_32(np.array([True, False])), expected([1, 0]))


@SETTINGS
@given(st.sampled_from([16, 32, 64]), st.data())
def test_floats_match_mmh3(width, data):
    values = data.draw(st.lists(st.floats(width=width), max_size=50))
    arr = np.array(values, dtype=f"float{width}")
    np.testing.assert_array_equal(murmur3_32(arr), expected([float(v) for v in arr]))
    arrow = pa.array(arr)  # NaN stays a value in arrow
    np.testing.assert_array_equal(murmur3_32(arrow), expected([float(v) for v in arr]))


def test_float_normalization():
    nan_bits = np.array(
        [0x7FF8000000000000, 0xFFF8000000000000, 0x7FF0000000000001, 0x7FF8DEADBEEF0001],
        dtype=np.uint64,
    )
    nans = murmur3_32(nan_bits.view(np.float64))
    canonical = mmh3.hash(CANONICAL_NAN_BYTES, 0, signed=False)
    assert nans.tolist() == [canonical] * 4
    f32_nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001], dtype=np.uint32).view(np.float32)
    assert murmur3_32(f32_nans).tolist() == [canonical] * 3
    zeros = murmur3_32(np.array([0.0, -0.0]))
    assert zeros[0] == zeros[1] == mmh3.hash(bytes(8), 0, signed=False)
    infs = murmur3_32(np.array([np.inf, -np.inf], dtype=np.float32))
    np.testing.assert_array_equal(infs, expected([math.inf, -math.inf]))
    # 1.0 and 1 are different values: only the integer encoding is shared.
    assert murmur3_32(np.array([1.0]))[0] != murmur3_32(np.array([1]))[0]


def test_temporal_types_hash_their_stored_integer():
    ticks = [0, 1_700_000_000_000, -5, None]
    ts = pa.array(ticks, pa.timestamp("ms"))
    np.testing.assert_array_equal(murmur3_32(ts), expected(ticks))
    days = [0, 19000, None]
    np.testing.assert_array_equal(murmur3_32(pa.array(days, pa.date32())), expected(days))
    np.testing.assert_array_equal(
        murmur3_32(np.array([0, 10], dtype="datetime64[s]")), expected([0, 10])
    )


# --------------------------------------------------------------------------
# containers: numpy, pandas, dictionaries, chunks
# --------------------------------------------------------------------------


def test_numpy_string_arrays():
    values = ["", "a", "héllo", "数据", "x" * 33, "a\x00b", "\x00x"]  # embedded NULs kept
    for arr in (
        np.array(values),
        np.array(values, dtype=object),
        np.array(values, dtype=np.dtypes.StringDType()),
    ):
        np.testing.assert_array_equal(murmur3_32(arr), expected(values))
    raw = [b"", b"ab", b"\x00\xff", b"a\x00b"]
    np.testing.assert_array_equal(murmur3_32(np.array(raw, dtype="S")), expected(raw))
    with_none = np.array(["a", None], dtype=object)
    assert murmur3_32_with_nulls(with_none).is_null.tolist() == [False, True]


def test_pandas_series_follow_pandas_missing_values():
    values = ["a", None, "bcde"]
    for series in (
        pd.Series(values, dtype="str"),
        pd.Series(values, dtype=pd.ArrowDtype(pa.string())),
        pd.Series(values, dtype="category"),
        pd.Series(values, dtype=object),
    ):
        result = murmur3_32_with_nulls(series)
        np.testing.assert_array_equal(result.hashes, expected(values))
        assert result.is_null.tolist() == [False, True, False]
    floats = murmur3_32_with_nulls(pd.Series([1.5, np.nan]))  # NaN is missing in pandas
    assert floats.is_null.tolist() == [False, True]
    assert floats.hashes.tolist() == expected([1.5, None]).tolist()
    ints = pd.Series([3, None, -4], dtype="Int64")
    np.testing.assert_array_equal(murmur3_32(ints), expected([3, None, -4]))


@SETTINGS
@given(st.lists(st.none() | st.sampled_from(["a", "bb", "", "long value 123"]), max_size=40), pads)
def test_dictionary_arrays_hash_values_not_indices(values, pad):
    padded = pa.array(["pad"] * pad + values + ["pad"], pa.string()).dictionary_encode()
    for arr in (
        sliced(values, pa.string(), pad).dictionary_encode(),
        padded.slice(pad, len(values)),
    ):
        result = murmur3_32_with_nulls(arr)
        np.testing.assert_array_equal(result.hashes, expected(values))
        np.testing.assert_array_equal(result.is_null, [v is None for v in values])


def test_dictionary_with_null_entry():
    arr = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 0]), pa.array(["a", None]))
    result = murmur3_32_with_nulls(arr)
    np.testing.assert_array_equal(result.hashes, expected(["a", None, None, "a"]))
    assert result.is_null.tolist() == [False, True, True, False]


@SETTINGS
@given(st.lists(st.none() | texts, min_size=1, max_size=40), cuts, pads)
def test_hash_depends_only_on_the_value(values, cut, pad):
    """Same value, same hash: in any row, chunk, slice or order."""
    whole = murmur3_32(pa.array(values, pa.string()))
    parts = murmur3_32(chunked(values, pa.large_string(), cut, pad))
    backwards = murmur3_32(pa.array(values[::-1], pa.string()))
    np.testing.assert_array_equal(whole, parts)
    np.testing.assert_array_equal(whole, backwards[::-1])
    by_value = {}
    for v, h in zip(values, whole.tolist(), strict=True):
        assert by_value.setdefault(v, h) == h


def test_empty_and_all_null_inputs():
    for empty in (
        pa.array([], pa.string()),
        pa.chunked_array([], pa.int64()),
        np.array([], dtype=np.int64),
        pd.Series([], dtype="str"),
        [],
    ):
        result = murmur3_32_with_nulls(empty)
        assert result.hashes.dtype == np.uint32 and len(result.hashes) == 0
    result = murmur3_32_with_nulls(pa.array([None, None], pa.string()))
    assert result.hashes.tolist() == [0, 0] and result.is_null.tolist() == [True, True]
    assert murmur3_32(pa.nulls(3)).tolist() == [0, 0, 0]


def test_seeds_change_the_hash():
    values = ["", "a", "hello", "0123abcd"]
    by_seed = [murmur3_32(pa.array(values), seed=s) for s in (0, 1, 42, MASK32)]
    for a in range(len(by_seed)):
        for b in range(a + 1, len(by_seed)):
            assert (by_seed[a] != by_seed[b]).all()
    ints = [murmur3_32(np.array([7, -7]), seed=s) for s in (0, 1)]
    assert (ints[0] != ints[1]).all()
    np.testing.assert_array_equal(murmur3_32(np.array([7, -7]), seed=1), expected([7, -7], 1))


# --------------------------------------------------------------------------
# list columns
# --------------------------------------------------------------------------


def expected_list(rows, seed=0):
    flat = [v for row in rows if row is not None for v in row]
    lengths = [0 if row is None else len(row) for row in rows]
    return expected(flat, seed), np.concatenate([[0], np.cumsum(lengths)]), flat


@SETTINGS
@given(st.lists(st.none() | st.lists(st.none() | texts, max_size=5), max_size=25), cuts, pads)
def test_list_hashes_and_offsets(rows, cut, pad):
    for type_ in (pa.list_(pa.string()), pa.large_list(pa.large_string())):
        result = murmur3_32_list(chunked(rows, type_, cut, pad), seed=5)
        hashes, offsets, flat = expected_list(rows, seed=5)
        np.testing.assert_array_equal(result.values, hashes)
        np.testing.assert_array_equal(result.offsets, offsets)
        np.testing.assert_array_equal(result.is_null, [v is None for v in flat])
        np.testing.assert_array_equal(result.row_is_null, [r is None for r in rows])


def test_list_inputs():
    rows = [[1, 2], None, [-3, None]]
    result = murmur3_32_list(pa.array(rows, pa.list_(pa.int64(), 2)))
    hashes, offsets, _ = expected_list(rows)
    np.testing.assert_array_equal(result.values, hashes)
    np.testing.assert_array_equal(result.offsets, offsets)
    from_pandas = murmur3_32_list(pd.Series([["a"], [], ["b", "c"]]))
    np.testing.assert_array_equal(from_pandas.values, expected(["a", "b", "c"]))
    np.testing.assert_array_equal(from_pandas.offsets, [0, 1, 1, 3])


# --------------------------------------------------------------------------
# hash_combine
# --------------------------------------------------------------------------


def ref_combine(h1: int, h2: int) -> int:
    return ref_murmur3_32(h1.to_bytes(4, "little") + h2.to_bytes(4, "little"), 0)


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, MASK32), st.integers(0, MASK32)), max_size=40))
def test_hash_combine_known_answers(pairs):
    h1 = np.array([a for a, _ in pairs], dtype=np.uint32)
    h2 = np.array([b for _, b in pairs], dtype=np.uint32)
    got = hash_combine(h1, h2)
    assert got.dtype == np.uint32
    assert got.tolist() == [ref_combine(a, b) for a, b in pairs]
    # The documented identity: the integer h1 + (h2 << 32) under the int encoding.
    as_int = (h1.astype(np.uint64) | (h2.astype(np.uint64) << np.uint64(32))).astype(np.uint64)
    np.testing.assert_array_equal(got, murmur3_32(as_int))


def test_hash_combine_pinned_and_shapes():
    assert hash_combine(0, 0).tolist() == ref_murmur3_32(bytes(8))
    got = hash_combine(np.array([0, 1], dtype=np.uint32), np.uint32(2))
    assert got.tolist() == [ref_combine(0, 2), ref_combine(1, 2)]
    assert hash_combine(1, 2) != hash_combine(2, 1)  # order matters
    grid = hash_combine(np.arange(3, dtype=np.uint32)[:, None], np.arange(4, dtype=np.uint32))
    assert grid.shape == (3, 4) and grid[2, 3] == ref_combine(2, 3)
    cross = hash_combine(hash_combine(murmur3_32(pa.array(["a"])), murmur3_32(np.array([3]))), 9)
    assert cross.tolist() == [ref_combine(ref_combine(1009084850, expected([3])[0].item()), 9)]


# --------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seed", "error", "match"),
    [
        (-1, ValueError, r"seed must be in \[0, 2\*\*32\), got -1"),
        (2**32, ValueError, r"seed must be in \[0, 2\*\*32\)"),
        ("0", TypeError, r"seed must be an int .* got str '0'"),
        (True, TypeError, r"seed must be an int"),
        (1.0, TypeError, r"seed must be an int"),
    ],
)
def test_bad_seed(seed, error, match):
    with pytest.raises(error, match=match):
        murmur3_32(pa.array(["a"]), seed=seed)


def test_unsupported_inputs():
    with pytest.raises(TypeError, match=r"got a list column .* use murmur3_32_list"):
        murmur3_32(pa.array([[1]]))
    with pytest.raises(TypeError, match=r"expected a list column, got string; use murmur3_32"):
        murmur3_32_list(pa.array(["a"]))
    with pytest.raises(TypeError, match=r"nested list type .* not supported"):
        murmur3_32_list(pa.array([[[1]]]))
    with pytest.raises(TypeError, match=r"cannot hash arrow type decimal128"):
        murmur3_32(pa.array([1], pa.decimal128(5, 2)))
    with pytest.raises(TypeError, match=r"cannot hash arrow type month_day_nano_interval"):
        murmur3_32(pa.array([(1, 2, 3)], pa.month_day_nano_interval()))
    with pytest.raises(TypeError, match=r"cannot read list as a column of one type"):
        murmur3_32(["a", 1])
    with pytest.raises(ValueError, match=r"expected a 1-d array, got shape \(2, 2\)"):
        murmur3_32(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises(TypeError, match=r"h1 must hold uint32 hashes, got dtype float64"):
        hash_combine(np.array([1.0]), 1)
    with pytest.raises(ValueError, match=r"h2 has values outside \[0, 2\*\*32\)"):
        hash_combine(1, -1)


# --------------------------------------------------------------------------
# normalize_missing: what the ops hash and count
# --------------------------------------------------------------------------


def ref_normalized(values):
    """NaN/None -> None, -0.0 -> 0.0, everything else as is (plain Python)."""
    out = []
    for v in values:
        if v is None or (isinstance(v, float) and math.isnan(v)):
            out.append(None)
        elif isinstance(v, float) and v == 0.0:
            out.append(0.0)
        else:
            out.append(v)
    return out


def signs(values):
    return [None if v is None else math.copysign(1.0, v) for v in values]


# width=16: every generated value is exact in float16, float32 and float64
FLOAT_ELEMENTS = st.none() | st.sampled_from([0.0, -0.0, math.nan, -math.nan, math.inf, -math.inf]) | st.floats(
    allow_nan=False, allow_infinity=False, width=16)


@SETTINGS
@given(values=st.lists(FLOAT_ELEMENTS, max_size=40), cut=st.integers(0, 40),
       type_=st.sampled_from([pa.float16(), pa.float32(), pa.float64()]))
def test_normalize_missing_flat_and_chunked(values, cut, type_):
    arr = pa.array(values, type_, from_pandas=False)
    got = normalize_missing(arr)
    assert got.type == type_
    expected = ref_normalized(arr.to_pylist())
    assert got.to_pylist() == expected and signs(got.to_pylist()) == signs(expected)
    cut = min(cut, len(values))
    chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)], type=type_)
    assert normalize_missing(chunked).to_pylist() == expected
    # what the ops hash: -0.0 and 0.0 alike, NaN missing; the hash itself is unchanged
    result = murmur3_32_with_nulls(got)
    assert result.is_null.tolist() == [v is None for v in expected]


@SETTINGS
@given(rows=st.lists(st.none() | st.lists(FLOAT_ELEMENTS, max_size=4), max_size=12),
       start=st.integers(0, 12), large=st.booleans())
def test_normalize_missing_lists_keep_rows_and_slices(rows, start, large):
    type_ = (pa.large_list if large else pa.list_)(pa.float64())
    arr = pa.array(rows, type_, from_pandas=False).slice(min(start, len(rows)))
    got = normalize_missing(arr)
    assert got.type == type_
    expected = [None if r is None else ref_normalized(r) for r in arr.to_pylist()]
    assert got.to_pylist() == expected
    assert [None if r is None else signs(r) for r in got.to_pylist()] == [
        None if r is None else signs(r) for r in expected]


def test_normalize_missing_dictionaries_fixed_size_lists_and_other_types():
    d = pa.array([1.0, math.nan, -0.0, None], pa.float32()).dictionary_encode()
    assert normalize_missing(d).to_pylist() == [1.0, None, 0.0, None]
    fixed = pa.array([[math.nan, -0.0], None, [1.0, 2.0]], pa.list_(pa.float64(), 2)).slice(1)
    assert normalize_missing(fixed).to_pylist() == [None, [1.0, 2.0]]
    strings = pa.array(["", "nan", None, "-0.0"])
    assert normalize_missing(strings) is strings  # text is never reinterpreted
    ints = pa.array([[0, -1], None])
    assert normalize_missing(ints) is ints

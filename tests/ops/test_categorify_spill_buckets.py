"""The spill bucket of a value (``ArrowBackend.spill_buckets``, Categorify's spills) depends on the value alone: every partial of a
fit (any width mix, nulls, chunks, slices, string or binary, 32- or 64-bit offsets)
puts it in the bucket a plain-Python reference computes for that value."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from tabstream.backends.arrow import ArrowBackend
from tabstream.core.hashing import murmur3_32

MULTIPLIER = 0x9E3779B97F4A7C15
_spill_bucket_ids = ArrowBackend().spill_buckets


def reference_bucket(value, arrow_type: pa.DataType, buckets: int) -> int:
    if value is None:
        return 0
    if pa.types.is_integer(arrow_type):
        key = value % 2**64
    else:
        raw = value.encode() if isinstance(value, str) else value
        if len(raw) != 8:
            return int(murmur3_32(pa.array([value], arrow_type))[0]) % buckets
        key = int.from_bytes(raw, "little")
    return (((key * MULTIPLIER) % 2**64 >> 32) * buckets) >> 32


texts = st.one_of(st.text(min_size=0, max_size=12),
                  st.text(alphabet="0123456789abcdef", min_size=8, max_size=8))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), buckets=st.integers(1, 300),
       type_=st.sampled_from([pa.string(), pa.large_string(), pa.binary(), pa.large_binary()]))
def test_string_buckets_follow_the_value(data, buckets, type_):
    values = data.draw(st.lists(st.one_of(st.none(), texts), min_size=0, max_size=40))
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        values = [None if v is None else v.encode() for v in values]
    array = pa.array(values, type_)
    start = data.draw(st.integers(0, len(values)))
    stop = data.draw(st.integers(start, len(values)))
    cut = data.draw(st.integers(start, stop))
    sliced = array.slice(start, stop - start)
    chunked = pa.chunked_array([array.slice(start, cut - start), array.slice(cut, stop - cut)], type_)
    expected = [reference_bucket(v, type_, buckets) for v in values[start:stop]]
    for column in (sliced, chunked):
        got = _spill_bucket_ids(column, buckets)
        assert got.dtype == np.int64
        assert got.tolist() == expected


@settings(max_examples=100, deadline=None)
@given(data=st.data(), buckets=st.integers(1, 300),
       type_=st.sampled_from([pa.int8(), pa.int32(), pa.int64(), pa.uint16(), pa.uint64()]))
def test_integer_buckets_follow_the_value_whatever_the_type(data, buckets, type_):
    lo = 0 if pa.types.is_unsigned_integer(type_) else -(2 ** (type_.bit_width - 1))
    hi = 2 ** type_.bit_width - 1 if lo == 0 else 2 ** (type_.bit_width - 1) - 1
    values = data.draw(st.lists(st.one_of(st.none(), st.integers(lo, hi)), max_size=40))
    got = _spill_bucket_ids(pa.array(values, type_), buckets)
    assert got.tolist() == [reference_bucket(v, type_, buckets) for v in values]
    # the same number in another integer type lands in the same bucket
    small = [v for v in values if v is not None and 0 <= v < 128]
    assert (_spill_bucket_ids(pa.array(small, type_), buckets).tolist()
            == _spill_bucket_ids(pa.array(small, pa.int64()), buckets).tolist())


def test_other_types_take_murmur3_and_buckets_spread():
    floats = pa.array([1.5, None, -2.0])
    assert _spill_bucket_ids(floats, 7).tolist() == [int(murmur3_32(pa.array([1.5]))[0]) % 7, 0,
                                                     int(murmur3_32(pa.array([-2.0]))[0]) % 7]
    # Criteo-like ids, and zero-padded ones sharing their leading bytes: no bucket empty
    # or holding more than twice its share
    rng = np.random.default_rng(3)
    for ids in ([f"{x:08x}" for x in rng.integers(0, 2**32, 20_000)],
                [f"{x:08d}" for x in range(20_000)]):
        counts = np.bincount(_spill_bucket_ids(pa.array(ids), 32), minlength=32)
        assert counts.min() > 0 and counts.max() < 2 * len(ids) / 32, counts

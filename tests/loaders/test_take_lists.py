"""``take_lists`` (the loader's take of list columns) against arrow's ``pc.take``."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabstream.loaders.layout import take_lists
from tabstream.loaders.memory import BatchPool

# ragged rows: short lists (gathered through an index) and long ones (copied row by row)
_ROW = st.lists(st.integers(-5, 5), max_size=3) | st.lists(st.integers(-5, 5), min_size=60,
                                                           max_size=90)
_NESTED_ROW = st.lists(st.lists(st.integers(-5, 5), max_size=4), max_size=4)
_TYPES = {
    "list": pa.list_(pa.int64()),
    "large_list": pa.large_list(pa.float32()),
    "list_of_lists": pa.list_(pa.list_(pa.int32())),
    "large_of_list": pa.large_list(pa.list_(pa.float64())),
}


def _part(data, t):
    nested = pa.types.is_list(t.value_type)
    rows = data.draw(st.lists(_NESTED_ROW if nested else _ROW, min_size=1, max_size=30))
    arr = pa.array(rows, t)
    # a slice: offsets that do not start at 0 and children read from the middle
    start = data.draw(st.integers(0, len(arr) - 1))
    return arr.slice(start, data.draw(st.integers(1, len(arr) - start)))


@settings(max_examples=80, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(_TYPES)), n_parts=st.integers(1, 3),
       pooled=st.booleans())
def test_take_lists_equals_arrow_take(data, kind, n_parts, pooled):
    t = _TYPES[kind]
    parts = [_part(data, t) for _ in range(n_parts)]
    whole = pa.concat_arrays(parts)
    idx = np.array(data.draw(st.lists(st.integers(0, len(whole) - 1), max_size=60)), np.int64)
    pool = BatchPool(keep=4) if pooled else None
    got = take_lists(parts if n_parts > 1 else parts[0], idx, pool)
    want = pc.take(whole, pa.array(idx, pa.int64()))
    assert got.type == want.type
    assert got.to_pylist() == want.to_pylist()


@pytest.mark.parametrize("arr", [
    pa.array([[1, None], [2]]),                     # a null value
    pa.array([[1], None, [2]]),                     # a null row
    pa.array([[[1], None], [[2]]]),                 # a null inner list
    pa.array([["a", "b"], ["c"]]),                  # not numbers
    pa.array([1, 2, 3]),                            # not a list
])
def test_other_columns_are_taken_by_arrow(arr):
    idx = np.array([1, 0, 1])
    assert take_lists(arr, idx).to_pylist() == pc.take(arr, idx).to_pylist()


def test_taken_values_are_a_fresh_mutable_buffer():
    # the batch's ragged values are then handed out without a copy (layout._values)
    arr = pa.array([[1, 2, 3] * 30, [4] * 70])
    out = take_lists(arr, np.array([1, 0]))
    assert out.values.buffers()[1].is_mutable
    assert out.to_pylist() == [[4] * 70, [1, 2, 3] * 30]


# -- ListGatherer: a row group's list slices put together as they are read --------------
def _maybe_null_part(data, t):
    """A slice as `_part`, sometimes holding a null row or a null value (arrow's route)."""
    arr = _part(data, t)
    if data.draw(st.integers(0, 5)) == 0:
        rows = arr.to_pylist()
        at = data.draw(st.integers(0, len(rows) - 1))
        if data.draw(st.booleans()):
            rows[at] = None
        else:
            rows[at] = [None] if not pa.types.is_list(t.value_type) else [[None]]
        arr = pa.array(rows, t)
    return arr


@settings(max_examples=80, deadline=None)
@given(data=st.data(), kind=st.sampled_from(sorted(_TYPES)), n_parts=st.integers(1, 6),
       hint=st.sampled_from([0.1, 1.0, 3.0]))
def test_list_gatherer_equals_arrow_concat(data, kind, n_parts, hint):
    """Any slices (offsets not at 0, children from the middle, a null here and there)
    gathered into one array equal arrow's concatenation; the rows expected (``hint``
    of the true count) only sizes the buffers: too few grow them. Arrays gathered
    earlier from the same pool keep their values while later ones reuse its buffers."""
    from tabstream.loaders.layout import ListGatherer

    t = _TYPES[kind]
    pool = BatchPool(keep=2)
    kept = []
    for _round in range(3):
        parts = [_maybe_null_part(data, t) for _ in range(n_parts)]
        want = pa.concat_arrays(parts)
        g = ListGatherer(pool, rows=max(1, int(len(want) * hint)))
        for p in parts:
            g.add(p)
        got = g.finish()
        got.validate(full=True)
        assert got.type == want.type
        assert got.to_pylist() == want.to_pylist()
        if data.draw(st.booleans()):
            kept.append((got, want.to_pylist()))  # alive while later rounds run
        del got, g
    for arr, values in kept:
        assert arr.to_pylist() == values


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-50, 50), st.integers(0, 6)), max_size=30), st.booleans())
def test_ranges_into_a_buffer(pairs, into):
    from tabstream.loaders.layout import _ranges

    starts = np.array([s for s, _ in pairs], np.int64)
    lengths = np.array([n for _, n in pairs], np.int64)
    want = [i for s, n in pairs for i in range(s, s + n)]
    out = np.full(len(want), -999, np.int64) if into else None
    got = _ranges(starts, lengths, out)
    assert got.tolist() == want
    if into:
        assert got is out


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(0, 5000), st.sampled_from(["i1", "i4", "i8", "f8"])),
                         max_size=8), max_size=6))
def test_arena_hands_out_separate_memory_until_reset(rounds):
    """Every array taken between two resets keeps what was written to it, whatever
    was taken after it (sizes past the buffer make a new one); a reset frees them all."""
    from tabstream.loaders.layout import _Arena

    arena = _Arena()
    for sizes in rounds:
        arena.reset()
        taken = []
        for k, (n, dtype) in enumerate(sizes):
            a = arena.take(n, dtype)
            assert a.shape == (n,) and a.dtype == np.dtype(dtype)
            assert a.ctypes.data % 64 == 0
            a[:] = k + 1
            taken.append((a, k + 1))
        for a, value in taken:
            assert (a == value).all()

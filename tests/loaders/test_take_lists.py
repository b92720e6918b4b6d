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

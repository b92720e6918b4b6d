"""The sharding policy of tabstream.loaders.plan, checked over many shapes."""

from __future__ import annotations

import doctest

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tabstream.loaders.layout
import tabstream.loaders.plan
from tabstream.loaders.plan import chunk_bounds, rank_pieces, split_rows, unit_order


def _infeasible(n: int, b: int, w: int, drop_last: bool) -> bool:
    if drop_last:
        return n < w * b
    tail = n - w * (-(-n // (w * b)) - 1) * b
    return n < w or (b == 1 and tail < w)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), b=st.integers(1, 200), w=st.integers(1, 6), drop_last=st.booleans())
def test_split_rows_policy(n: int, b: int, w: int, drop_last: bool) -> None:
    if _infeasible(n, b, w, drop_last):
        with pytest.raises(ValueError, match="rows"):
            split_rows(n, b, w, drop_last)
        return
    shares = split_rows(n, b, w, drop_last)
    assert len(shares) == w
    # contiguous, disjoint slices of the stream, starting at 0
    assert shares[0].start == 0
    for left, right in zip(shares, shares[1:], strict=False):
        assert left.stop == right.start
    counts = {s.num_batches for s in shares}
    assert len(counts) == 1, "every rank must yield the same number of batches"
    for s in shares:
        sizes = list(s.batch_sizes())
        assert sum(sizes) == s.num_rows
        assert all(1 <= k <= b for k in sizes)
    if drop_last:
        assert counts == {n // (w * b)}
        assert all(k == b for s in shares for k in s.batch_sizes())
        assert n - shares[-1].stop < w * b
    else:
        assert shares[-1].stop == n, "every row is delivered"
        assert counts == {-(-n // (w * b))}
        for s in shares:  # all but the last one or two batches are full
            sizes = list(s.batch_sizes())
            assert all(k == b for k in sizes[:-2])


def test_split_rows_remainder_dealt_evenly() -> None:
    # 2 full rounds of 4 ranks x 10 rows, then 7 rows left: 2, 2, 2, 1
    shares = split_rows(87, 10, 4, drop_last=False)
    assert [list(s.batch_sizes()) for s in shares] == [[10, 10, 2], [10, 10, 2], [10, 10, 2],
                                                       [10, 10, 1]]


def test_split_rows_splits_a_full_batch_when_fewer_rows_than_ranks_remain() -> None:
    # 1 full round of 4 x 10 rows, then 2 rows: ranks 2 and 3 split their batch
    shares = split_rows(42, 10, 4, drop_last=False)
    assert [list(s.batch_sizes()) for s in shares] == [[10, 1], [10, 1], [5, 5], [5, 5]]


def test_split_rows_errors() -> None:
    with pytest.raises(ValueError, match="fewer than the 3 ranks"):
        split_rows(2, 10, 3, drop_last=False)
    with pytest.raises(ValueError, match="drop_last=True the 5 rows give no batch"):
        split_rows(5, 10, 1, drop_last=True)
    with pytest.raises(ValueError, match="batch_size=1 with 5 rows over 2 ranks"):
        split_rows(5, 1, 2, drop_last=False)
    with pytest.raises(ValueError, match="no rows"):
        split_rows(0, 1, 1, drop_last=False)


@settings(max_examples=100, deadline=None)
@given(rows=st.lists(st.integers(1, 50), min_size=1, max_size=20), seed=st.integers(0, 2**32),
       data=st.data())
def test_rank_pieces_cover_the_slice(rows: list[int], seed: int, data: st.DataObject) -> None:
    total = sum(rows)
    start = data.draw(st.integers(0, total - 1))
    stop = data.draw(st.integers(start + 1, total))
    order = unit_order(len(rows), seed, 0, shuffle=True)
    pieces = rank_pieces(rows, order, start, stop)
    assert sum(p.num_rows for p in pieces) == stop - start
    # the pieces are the stream positions [start, stop) of the units laid out in order
    stream = np.concatenate([np.full(rows[u], u) for u in order])
    assert [p.unit for p in pieces] == list(dict.fromkeys(stream[start:stop]))
    assert all(0 <= p.start < p.stop <= rows[p.unit] for p in pieces)


def test_unit_order_depends_on_seed_and_epoch() -> None:
    a = unit_order(50, 0, 0, shuffle=True)
    assert np.array_equal(a, unit_order(50, 0, 0, shuffle=True))
    assert not np.array_equal(a, unit_order(50, 0, 1, shuffle=True))
    assert not np.array_equal(a, unit_order(50, 1, 0, shuffle=True))
    assert np.array_equal(unit_order(5, 3, 9, shuffle=False), np.arange(5))


@pytest.mark.parametrize("module", [tabstream.loaders.plan, tabstream.loaders.layout])
def test_docstring_examples(module: object) -> None:
    result = doctest.testmod(module)  # type: ignore[arg-type]
    assert result.failed == 0


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(0, 100), max_size=30), parts=st.integers(1, 5),
       max_bytes=st.integers(1, 250))
def test_chunk_bounds_cover_in_order_within_limits(sizes: list[int], parts: int,
                                                   max_bytes: int) -> None:
    bounds = chunk_bounds(sizes, parts, max_bytes)
    # contiguous, in order, every piece once
    assert [i for a, b in bounds for i in range(a, b)] == list(range(len(sizes)))
    for k, (a, b) in enumerate(bounds):
        assert 1 <= b - a <= parts
        assert b - a == 1 or sum(sizes[a:b]) <= max_bytes
        if k + 1 < len(bounds):  # greedy: the next piece did not fit
            assert b - a == parts or sum(sizes[a:b + 1]) > max_bytes


@pytest.mark.parametrize("size,parts,max_bytes", [(10, 2, 100), (10, 4, 25), (30, 3, 10)])
def test_chunk_bounds_equal_sizes(size: int, parts: int, max_bytes: int) -> None:
    per_chunk = min(parts, max(1, max_bytes // size))
    expected = [(a, min(a + per_chunk, 11)) for a in range(0, 11, per_chunk)]
    assert chunk_bounds([size] * 11, parts, max_bytes) == expected

"""A loader's position in an epoch is world-size free (tabstream.loaders.plan):
after k batches on W ranks, a resume on W' ranks (any batch size) delivers exactly
the rows not delivered yet, each once, with equal batch counts per rank.

The reference is plain Python: the epoch stream as a list of (unit, row) ids, each
rank's rows read piece by piece in the reader's order and dealt out chunk by chunk
as the loader deals them; the plan's position functions are checked against it."""

from __future__ import annotations

import doctest
from collections import Counter

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import tabstream.loaders.plan
from tabstream.loaders.plan import (
    EpochPosition,
    Piece,
    chunk_bounds,
    chunk_rng,
    delivered_rows,
    layout_digest,
    rank_pieces,
    resume_split,
    select_pieces,
    split_rows,
    unit_order,
    unit_rows_permutation,
)


def test_doctests() -> None:
    assert doctest.testmod(tabstream.loaders.plan).failed == 0


class Data:
    """Units of ``rows`` rows; epoch ``epoch`` of a ``seed``; plain-Python stream."""

    def __init__(self, rows: list[int], seed: int, epoch: int, shuffle: bool) -> None:
        self.rows, self.seed, self.epoch, self.shuffle = rows, seed, epoch, shuffle
        self.order = unit_order(len(rows), seed, epoch, shuffle)
        self.stream: list[tuple[int, int]] = []  # position -> (unit, row in the file)
        for u in self.order:
            u = int(u)
            within = (unit_rows_permutation(rows[u], seed, epoch, u) if shuffle
                      else range(rows[u]))
            self.stream += [(u, int(r)) for r in within]

    def read(self, piece: Piece) -> list[tuple[int, int]]:
        """The rows of a piece in the order the reader returns them."""
        n = self.rows[piece.unit]
        if piece.start == 0 and piece.stop == n:
            return [(piece.unit, r) for r in range(n)]
        if self.shuffle:
            perm = unit_rows_permutation(n, self.seed, self.epoch, piece.unit)
            return [(piece.unit, int(r)) for r in sorted(perm[piece.start:piece.stop])]
        return [(piece.unit, r) for r in range(piece.start, piece.stop)]

    def deal(self, pieces, per_chunk: int, rank: int) -> tuple[list[tuple[int, int]], list[int]]:
        """A rank's rows in the order its batches take them, and its chunk lengths."""
        lengths = [b - a for a, b in chunk_bounds([1.0] * len(pieces), per_chunk, 1e9)]
        out, at = [], 0
        for k, length in enumerate(lengths):
            kept = []
            for piece, keep in pieces[at:at + length]:
                rows = self.read(piece)
                kept += rows if keep is None else [r for r, ok in zip(rows, keep) if ok]
            at += length
            if self.shuffle:
                kept = [kept[i] for i in chunk_rng(self.seed, self.epoch, rank, k).permutation(len(kept))]
            out += kept
        return out, lengths


def _position(data: Data) -> EpochPosition:
    return EpochPosition(data.epoch, len(data.stream), data.seed, data.shuffle,
                         layout_digest(data.rows), np.empty((0, 2), np.int64))


def _run(data: Data, start: EpochPosition, w: int, b: int, drop_last: bool, per_chunk: int,
         steps: int | None):
    """``steps`` batches (all when None) on each of ``w`` ranks from ``start``: the
    rows delivered, the batch count per rank, and the new position."""
    remaining = start.remaining()
    shares = resume_split(start.num_rows - start.num_delivered, b, w, drop_last)
    counts = {s.num_batches for s in shares}
    assert len(counts) == 1, "every rank yields the same number of batches"
    seen, position = [], start
    for rank, share in enumerate(shares):
        sel = tabstream.loaders.plan._slice(remaining, share.start, share.stop)
        pieces = select_pieces(data.rows, data.order, sel, data.seed, data.epoch, data.shuffle)
        dealt, lengths = data.deal(pieces, per_chunk, rank)
        sizes = list(share.batch_sizes())
        assert len(dealt) == sum(sizes) == share.num_rows
        k = len(sizes) if steps is None else min(steps, len(sizes))
        consumed = sum(sizes[:k])
        seen += dealt[:consumed]
        got = delivered_rows(pieces, lengths, data.rows, data.order, consumed, seed=data.seed,
                             epoch=data.epoch, rank=rank, shuffle=data.shuffle)
        expected = sorted(data.stream.index(r) for r in dealt[:consumed])
        assert [p for a, z in got.tolist() for p in range(a, z)] == expected
        position = position.with_delivered(got)
    return seen, counts.pop(), position


def _check_resume(rows, seed, epoch, shuffle, hops, drop_last, per_chunk) -> None:
    """``hops``: [(W, B, steps), ...]; the last runs to the end of the epoch."""
    data = Data(rows, seed, epoch, shuffle)
    position, seen = _position(data), []
    for i, (w, b, steps) in enumerate(hops):
        last = i == len(hops) - 1
        got, _, position = _run(data, position, w, b, drop_last, per_chunk, None if last else steps)
        seen += got
        position = EpochPosition.from_dict(position.to_dict())  # what a checkpoint holds
    counts = Counter(seen)
    assert max(counts.values(), default=1) == 1, "no row is delivered twice"
    if drop_last:
        w, b, _ = hops[-1]
        assert len(data.stream) - len(counts) < w * b  # fewer than one global batch left out
    else:
        assert set(counts) == set(data.stream), "every row is delivered"


@pytest.mark.parametrize(("w", "w2"), [(1, 2), (2, 1), (2, 3), (3, 2), (4, 3)])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_resume_on_another_world_size(w: int, w2: int, shuffle: bool, drop_last: bool) -> None:
    rows = [37, 5, 64, 12, 40, 1, 29]            # 188 rows, ranks split row groups
    b = 12 // w                                  # the global batch stays 12 rows
    b2 = 12 // w2
    total = split_rows(188, b, w, drop_last)[0].num_batches
    for steps in range(total + 1):               # every stopping point, the ends included
        _check_resume(rows, seed=3, epoch=1, shuffle=shuffle, drop_last=drop_last, per_chunk=2,
                      hops=[(w, b, steps), (w2, b2, None)])


@settings(max_examples=150, deadline=None)
@given(rows=st.lists(st.integers(1, 40), min_size=1, max_size=8), seed=st.integers(0, 2**31),
       epoch=st.integers(0, 3), shuffle=st.booleans(), drop_last=st.booleans(),
       per_chunk=st.integers(1, 3),
       hops=st.lists(st.tuples(st.integers(1, 4), st.integers(1, 9), st.integers(0, 6)),
                     min_size=2, max_size=4))
def test_resume_any_hops(rows, seed, epoch, shuffle, drop_last, per_chunk, hops) -> None:
    """Several changes in one epoch (W -> W' -> W'' ...), any batch sizes."""
    try:
        _check_resume(rows, seed, epoch, shuffle, hops, drop_last, per_chunk)
    except ValueError as exc:   # fewer rows left than ranks, or batch_size=1 leftovers
        assume("ranks" not in str(exc) and "batch_size=1" not in str(exc))
        raise


def test_select_pieces_of_one_range_are_rank_pieces() -> None:
    rows = [5, 3, 4, 9]
    order = unit_order(4, 1, 0, True)
    for start, stop in [(0, 21), (2, 11), (6, 7), (9, 21)]:
        got = select_pieces(rows, order, np.array([[start, stop]]), 1, 0, True)
        assert [p for p, _ in got] == rank_pieces(rows, order, start, stop)
        assert all(keep is None for _, keep in got)


def test_resume_split_of_nothing_left() -> None:
    assert [s.num_batches for s in resume_split(0, 4, 3, False)] == [0, 0, 0]
    assert [s.num_batches for s in resume_split(11, 4, 3, True)] == [0, 0, 0]
    with pytest.raises(ValueError, match="fewer than the 3 ranks"):
        resume_split(2, 4, 3, False)


def test_position_round_trip_and_damage() -> None:
    p = EpochPosition(2, 100, 5, True, "abc", np.array([[0, 10], [20, 21], [50, 99]]))
    back = EpochPosition.from_dict(p.to_dict())
    assert back.delivered.tolist() == [[0, 10], [20, 21], [50, 99]]
    assert (back.epoch, back.num_rows, back.seed, back.shuffle, back.layout) == (2, 100, 5, True, "abc")
    assert p.remaining().tolist() == [[10, 20], [21, 50], [99, 100]]
    with pytest.raises(ValueError, match=r"not a loader position \(format None"):
        EpochPosition.from_dict({"epoch": 1})
    with pytest.raises(ValueError, match="loader position is damaged"):
        EpochPosition.from_dict({**p.to_dict(), "delivered": "%%%"})
    with pytest.raises(ValueError, match="not sorted, disjoint positions of the 50-row stream"):
        EpochPosition.from_dict({**p.to_dict(), "num_rows": 50})


# -- the loader: position() and set_position() ----------------------------------------

FILES, GROUPS = (300, 1, 170, 90), (40, 1, 60, 25)   # 561 rows in 14 row groups


def _loaders(export, w, b, shuffle, drop_last=False, seed=5):
    from tabstream.loaders import Loader

    return [Loader(str(export), b, shuffle=shuffle, seed=seed, parts_per_chunk=2, global_size=w,
                   global_rank=r, drop_last=drop_last) for r in range(w)]


def _take(loaders, epoch, steps=None):
    """Row ids of the first ``steps`` batches (all when None) of each rank; checks that
    every rank yields the same number and that each row's columns belong to it."""
    ids, counts = [], set()
    for loader in loaders:
        if loader.epoch != epoch:
            loader.set_epoch(epoch)
        n = 0
        for features, labels in loader:
            if steps is not None and n == steps:
                break
            np.testing.assert_array_equal(labels, features["row_id"] % 2)
            ids += features["row_id"].tolist()
            n += 1
        counts.add(n)
    assert len(counts) == 1, f"ranks yielded {counts} batches"
    return ids


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize(("w", "w2"), [(1, 2), (2, 1), (2, 3), (3, 2), (4, 3)])
def test_loader_resumes_on_another_world_size(testdata, tmp_path, shuffle, w, w2) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    before = _loaders(export, w, 24 // w, shuffle)
    steps = len(before[0]) // 2 + 1
    seen = _take(before, 1, steps)
    states = [loader.position(1, steps) for loader in before]
    assert all(s == states[0] for s in states), "every rank computes the same position"
    assert states[0]["rows_delivered"] == len(seen)
    after = _loaders(export, w2, 24 // w2, shuffle)
    for loader in after:
        loader.set_position(states[0])
    assert {len(loader) for loader in after} == {-(-(561 - len(seen)) // 24)}
    seen += _take(after, 1)
    assert sorted(seen) == list(range(561)), "every row of the epoch exactly once"
    # the next epoch is the usual one on w2 ranks
    fresh = _loaders(export, w2, 24 // w2, shuffle)
    assert _take(after, 2) == _take(fresh, 2)


def test_loader_resumes_twice_in_one_epoch(testdata, tmp_path) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    first = _loaders(export, 2, 16, True)
    seen = _take(first, 0, 5)
    second = _loaders(export, 3, 7, True)
    for loader in second:
        loader.set_position(first[0].position(0, 5))
    seen += _take(second, 0, 4)
    third = _loaders(export, 1, 50, True)
    third[0].set_position(second[1].position(0, 4))
    seen += _take(third, 0)
    assert sorted(seen) == list(range(561))


def test_position_at_zero_is_where_the_iteration_started(testdata, tmp_path) -> None:
    """The same world size replays a resumed epoch from its start position: the
    batches after k are the ones an uninterrupted run yields."""
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    first = _loaders(export, 2, 16, True)
    _take(first, 0, 3)
    state = first[0].position(0, 3)
    run = _loaders(export, 3, 8, True)
    for loader in run:
        loader.set_position(state)
    whole = [[f["row_id"].tolist() for f, _ in loader] for loader in run]
    start = run[0].position(0, 0)
    assert start == state
    again = _loaders(export, 3, 8, True)
    for loader in again:
        loader.set_position(start)
    assert [[f["row_id"].tolist() for f, _ in loader] for loader in again] == whole


def test_drop_last_resume_leaves_out_less_than_one_global_batch(testdata, tmp_path) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    first = _loaders(export, 3, 10, True, drop_last=True)
    seen = _take(first, 0, 7)
    second = _loaders(export, 2, 15, True, drop_last=True)
    for loader in second:
        loader.set_position(first[0].position(0, 7))
    seen += _take(second, 0)
    assert len(set(seen)) == len(seen) and 561 - len(seen) < 30


def test_set_position_refuses_other_data_or_shuffle(testdata, tmp_path) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    other = testdata.write_export(tmp_path / "o", (300, 1, 170, 91), GROUPS)
    state = _loaders(export, 2, 8, True)[0].position(0, 2)
    with pytest.raises(ValueError, match=r"taken with seed 5, this loader has 6: build the "
                                         r"loader with seed=5"):
        _loaders(export, 1, 16, True, seed=6)[0].set_position(state)
    with pytest.raises(ValueError, match="taken with shuffle True, this loader has False"):
        _loaders(export, 1, 16, False)[0].set_position(state)
    with pytest.raises(ValueError, match="taken with rows 561, this loader has 562: load the data"):
        _loaders(other, 1, 16, True)[0].set_position(state)
    with pytest.raises(ValueError, match="batches=99 is more than the 18 batches of epoch 0"):
        _loaders(export, 2, 16, True)[0].position(0, 99)


def test_position_keeps_the_batch_size_of_the_epoch_running(testdata, tmp_path) -> None:
    """``loader.batch_size = n`` applies to the next epochs: the position of the epoch
    running is still counted in its own batches."""
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    loader = _loaders(export, 1, 16, True)[0]
    seen = []
    for i, (features, _) in enumerate(loader):
        if i == 3:
            break
        seen += features["row_id"].tolist()
    loader.batch_size = 10
    state = loader.position(0, 3)
    assert state["rows_delivered"] == 48
    rest = _loaders(export, 2, 8, True)
    for other in rest:
        other.set_position(state)
    assert sorted(seen + _take(rest, 0)) == list(range(561))

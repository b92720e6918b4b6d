"""Epoch planning: which rows each rank reads, and in which batch sizes.

Pure functions over row counts, no I/O, so the sharding invariants can be tested
exhaustively.

The dataset is a list of *units* (one parquet row group each). For an epoch the
units are put in an order (a permutation drawn from ``(seed, epoch)`` when
shuffling, file order otherwise) and their rows are laid end to end into one
*stream* of ``N`` rows. Every rank computes the same stream and takes one
contiguous slice of it, so no two ranks share a row and no row is skipped:

    units (rows):   A(5) B(3) C(4)            order for this epoch: C A B
    stream:         C0 C1 C2 C3 A0 A1 A2 A3 A4 B0 B1 B2       (N = 12)
    W=2, B=4:       rank 0: C0..C3 A0 A1      rank 1: A2..A4 B0..B2
                    batches 4+2               batches 4+2

A rank may read only part of a row group (``A`` above); which rows of a shared
unit go to which rank is decided by a permutation of that unit drawn from
``(seed, epoch, unit)``, identical on every rank.

Batch counts (``W`` ranks, batch size ``B``, ``N`` rows):

* ``drop_last=True``: every rank yields ``N // (W*B)`` full batches; the last
  ``N % (W*B)`` rows of the stream are not delivered this epoch (which rows those
  are changes with the epoch when shuffling).
* ``drop_last=False``: every row is delivered exactly once and every rank yields
  ``nb = ceil(N / (W*B))`` batches. The first ``nb - 1`` rounds are full batches
  on every rank; the ``T = N - W*(nb-1)*B`` remaining rows are dealt out evenly,
  so rank ``r`` gets ``T // W + (r < T % W)`` rows in its last batch (sizes differ
  by at most one across ranks). When ``T < W`` some ranks would get an empty last
  batch; those ranks split their last full batch in two halves instead
  (``ceil(B/2)`` and ``floor(B/2)`` rows), so no batch is ever empty. Only when
  that is impossible (fewer rows than ranks, or ``B == 1`` and ``N`` not a
  multiple of ``W``) is a :class:`ValueError` raised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Piece", "RankShare", "chunk_bounds", "rank_pieces", "split_rows", "unit_order",
           "unit_rows_permutation", "unit_rows_rng"]

# Distinct streams for the generators drawn from one (seed, epoch).
_UNIT_ORDER, _UNIT_SPLIT, _CHUNK = 0, 1, 2


@dataclass(frozen=True)
class RankShare:
    """The rows ``[start, stop)`` of the epoch stream one rank receives, and how
    they are cut into batches: ``num_full`` batches of ``batch_size`` rows, then
    one batch per entry of ``tail``."""

    start: int
    stop: int
    batch_size: int
    num_full: int
    tail: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        return self.stop - self.start

    @property
    def num_batches(self) -> int:
        return self.num_full + len(self.tail)

    def batch_sizes(self) -> Iterator[int]:
        for _ in range(self.num_full):
            yield self.batch_size
        yield from self.tail


def split_rows(num_rows: int, batch_size: int, global_size: int, drop_last: bool) -> list[RankShare]:
    """Cut a stream of ``num_rows`` rows into one :class:`RankShare` per rank.

    >>> [(s.start, s.stop, list(s.batch_sizes())) for s in split_rows(10, 3, 2, False)]
    [(0, 5, [3, 2]), (5, 10, [3, 2])]
    >>> [(s.start, s.stop, list(s.batch_sizes())) for s in split_rows(10, 3, 2, True)]
    [(0, 3, [3]), (3, 6, [3])]
    """
    n, b, w = num_rows, batch_size, global_size
    if n <= 0:
        raise ValueError("the dataset has no rows")
    if drop_last:
        nb = n // (w * b)
        if nb == 0:
            raise ValueError(
                f"with drop_last=True the {n} rows give no batch: each of the {w} ranks needs "
                f"at least batch_size={b} rows ({w * b} in all); use drop_last=False or a "
                "smaller batch_size"
            )
        return [RankShare(r * nb * b, (r + 1) * nb * b, b, nb) for r in range(w)]

    nb = -(-n // (w * b))
    tail_rows = n - w * (nb - 1) * b
    if n < w:
        raise ValueError(
            f"the dataset has {n} rows, fewer than the {w} ranks: some rank would get no "
            "batch at all, and ranks with different batch counts hang distributed training"
        )
    shares = []
    start = 0
    for r in range(w):
        extra = tail_rows // w + (r < tail_rows % w)
        if extra > 0:
            share = RankShare(start, start + (nb - 1) * b + extra, b, nb - 1, (extra,))
        elif b >= 2:
            # No remainder row for this rank: split its last full batch in two so
            # that it still yields nb batches, none empty.
            share = RankShare(start, start + (nb - 1) * b, b, nb - 2, (b - b // 2, b // 2))
        else:
            raise ValueError(
                f"batch_size=1 with {n} rows over {w} ranks cannot give every rank the same "
                "number of batches without repeating rows; use drop_last=True, a larger "
                "batch_size, or a row count divisible by global_size"
            )
        shares.append(share)
        start = share.stop
    return shares


@dataclass(frozen=True)
class Piece:
    """Rows ``[start, stop)`` of unit ``unit`` (in that unit's epoch order)."""

    unit: int
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(list(key))


def unit_order(num_units: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order in which the units are laid into the epoch stream."""
    if not shuffle:
        return np.arange(num_units)
    return _rng(seed, epoch, _UNIT_ORDER).permutation(num_units)


def unit_rows_rng(seed: int, epoch: int, unit: int) -> np.random.Generator:
    """The generator whose ``permutation(num_rows)`` is a unit's epoch row order."""
    return _rng(seed, epoch, _UNIT_SPLIT, unit)


def unit_rows_permutation(num_rows: int, seed: int, epoch: int, unit: int) -> np.ndarray:
    """The epoch order of one unit's rows, used when ranks split a unit."""
    return unit_rows_rng(seed, epoch, unit).permutation(num_rows)


def chunk_rng(seed: int, epoch: int, rank: int, chunk: int) -> np.random.Generator:
    """The generator that shuffles one rank's chunk."""
    return _rng(seed, epoch, _CHUNK, rank, chunk)


def rank_pieces(unit_rows: Sequence[int], order: Sequence[int] | np.ndarray, start: int,
                stop: int) -> list[Piece]:
    """The pieces of units covering ``[start, stop)`` of the stream that lays the
    units out in ``order``.

    >>> rank_pieces([5, 3, 4], [2, 0, 1], 6, 12)
    [Piece(unit=0, start=2, stop=5), Piece(unit=1, start=0, stop=3)]
    """
    pieces = []
    offset = 0
    for u in order:
        u = int(u)
        n = int(unit_rows[u])
        lo, hi = max(start, offset), min(stop, offset + n)
        if lo < hi:
            pieces.append(Piece(u, lo - offset, hi - offset))
        offset += n
        if offset >= stop:
            break
    return pieces


def chunk_bounds(piece_bytes: Sequence[float], parts_per_chunk: int,
                 max_bytes: float) -> list[tuple[int, int]]:
    """Cut the pieces, in reading order, into chunks ``[start, stop)`` of at most
    ``parts_per_chunk`` pieces whose sizes add up to at most ``max_bytes``; a piece
    larger than that on its own is a chunk by itself (rows are never split further).

    >>> chunk_bounds([10, 10, 10, 30, 5], parts_per_chunk=2, max_bytes=25)
    [(0, 2), (2, 3), (3, 4), (4, 5)]
    """
    bounds = []
    start, total = 0, 0.0
    for i, size in enumerate(piece_bytes):
        if i > start and (i - start >= parts_per_chunk or total + size > max_bytes):
            bounds.append((start, i))
            start, total = i, 0.0
        total += size
    if start < len(piece_bytes):
        bounds.append((start, len(piece_bytes)))
    return bounds

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

Position in an epoch (for a resume on another number of ranks): the stream is the
same for every world size, so the rows delivered so far are a set of stream
positions, :class:`EpochPosition` (ranges, world-size free). A resumed epoch lays
the positions *not* delivered end to end, in stream order, into a shorter stream
and splits that one as above (:func:`resume_split`), over any number of ranks,
with any batch size; each rank reads the row groups holding its positions and
keeps those rows only (:func:`select_pieces`)::

    stream (N = 12), W=2, B=2, after 1 batch per rank (no shuffle):
        delivered   [0, 2) [6, 8)           remaining  2 3 4 5 8 9 10 11  (8 rows)
    resume on W'=4, B'=1:  rank 0: 2 3   rank 1: 4 5   rank 2: 8 9   rank 3: 10 11

With shuffling a rank's rows are dealt to batches at random within a chunk, so the
rows a rank delivered are whole chunks plus a random part of the next one
(:func:`delivered_rows` replays that draw); the position holds them exactly.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["EpochPosition", "Piece", "RankShare", "chunk_bounds", "delivered_rows", "rank_pieces",
           "read_order", "resume_split", "select_pieces", "split_rows", "unit_order",
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


# -- position in an epoch -------------------------------------------------------------
#
# Sets of stream positions are kept as ranges: an int64 array of shape (k, 2) of
# [start, stop) pairs, sorted, disjoint and not touching (see _ranges).

_POSITION_FORMAT = "tabstream.loaders.position/1"


def _ranges(pairs: Any) -> np.ndarray:
    """``pairs`` as ranges: empty ones dropped, overlapping or touching ones merged."""
    r = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    r = r[r[:, 1] > r[:, 0]]
    if len(r) == 0:
        return np.empty((0, 2), dtype=np.int64)
    r = r[np.argsort(r[:, 0], kind="stable")]
    stops = np.maximum.accumulate(r[:, 1])
    new = np.ones(len(r), dtype=bool)
    new[1:] = r[1:, 0] > stops[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(r) - 1)
    return np.stack([r[first, 0], stops[last]], axis=1)


def _ranges_of_positions(positions: np.ndarray) -> np.ndarray:
    """Ranges of a sorted array of distinct positions."""
    pos = np.asarray(positions, dtype=np.int64)
    if len(pos) == 0:
        return np.empty((0, 2), dtype=np.int64)
    breaks = np.flatnonzero(np.diff(pos) != 1)
    return np.stack([pos[np.append(0, breaks + 1)], pos[np.append(breaks, len(pos) - 1)] + 1], axis=1)


def _count(r: np.ndarray) -> int:
    return int((r[:, 1] - r[:, 0]).sum())


def _complement(r: np.ndarray, n: int) -> np.ndarray:
    """The positions of ``[0, n)`` not in ``r``."""
    return _ranges(np.stack([np.append(0, r[:, 1]), np.append(r[:, 0], n)], axis=1))


def _slice(r: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The ``lo``-th to ``hi - 1``-th positions of ``r`` (in increasing order), as ranges."""
    if lo >= hi:
        return np.empty((0, 2), dtype=np.int64)
    ends = np.cumsum(r[:, 1] - r[:, 0])
    starts = ends - (r[:, 1] - r[:, 0])
    i = int(np.searchsorted(ends, lo, side="right"))
    j = int(np.searchsorted(ends, hi - 1, side="right"))
    out = r[i:j + 1].copy()
    out[0, 0] = r[i, 0] + lo - starts[i]
    out[-1, 1] = r[j, 0] + hi - starts[j]
    return out


def _contains(r: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Which of the positions ``x`` are in ``r``."""
    i = np.searchsorted(r[:, 0], x, side="right") - 1
    inside = i >= 0
    inside[inside] = x[inside] < r[i[inside], 1]
    return inside


def layout_digest(unit_rows: Sequence[int]) -> str:
    """A short digest of the units' row counts: the epoch stream is a function of
    them (and of ``seed``, ``epoch`` and ``shuffle``)."""
    data = np.asarray(unit_rows, dtype="<i8").tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


@dataclass(frozen=True, eq=False)
class EpochPosition:
    """The rows of epoch ``epoch`` delivered so far, as ranges of stream positions
    (``delivered``, an int64 array of ``[start, stop)`` pairs), with what the
    stream is a function of: the row count, ``seed``, ``shuffle`` and the digest of
    the units' row counts (:func:`layout_digest`). Nothing in it depends on the
    number of ranks or the batch size.

    ``to_dict()`` is plain values (the ranges delta-encoded, compressed and in
    base64: chunk-aligned positions take a few bytes, a random part of a chunk
    about a bit per row of that chunk), ``from_dict`` checks and reads it back.

    >>> p = EpochPosition(0, 12, 0, False, "x", _ranges([[0, 2], [6, 8]]))
    >>> p.num_delivered, p.remaining().tolist()
    (4, [[2, 6], [8, 12]])
    >>> EpochPosition.from_dict(p.to_dict()).delivered.tolist()
    [[0, 2], [6, 8]]
    """

    epoch: int
    num_rows: int
    seed: int
    shuffle: bool
    layout: str
    delivered: np.ndarray

    @property
    def num_delivered(self) -> int:
        return _count(self.delivered)

    def remaining(self) -> np.ndarray:
        """The stream positions not delivered yet, as ranges."""
        return _complement(self.delivered, self.num_rows)

    def with_delivered(self, ranges: np.ndarray) -> EpochPosition:
        """This position with the positions of ``ranges`` delivered too."""
        both = _ranges(np.concatenate([self.delivered, np.asarray(ranges, np.int64).reshape(-1, 2)]))
        return EpochPosition(self.epoch, self.num_rows, self.seed, self.shuffle, self.layout, both)

    def to_dict(self) -> dict[str, Any]:
        flat = self.delivered.reshape(-1)
        deltas = np.diff(np.append(np.int64(0), flat)).astype("<i8")
        text = base64.b64encode(zlib.compress(deltas.tobytes(), 6)).decode("ascii")
        return {"format": _POSITION_FORMAT, "epoch": self.epoch, "num_rows": self.num_rows,
                "seed": self.seed, "shuffle": self.shuffle, "layout": self.layout,
                "rows_delivered": self.num_delivered, "delivered": text}

    @classmethod
    def from_dict(cls, state: Mapping[str, Any]) -> EpochPosition:
        """Read back :meth:`to_dict`'s output; a :class:`ValueError` says what is wrong."""
        if not isinstance(state, Mapping) or state.get("format") != _POSITION_FORMAT:
            found = state.get("format") if isinstance(state, Mapping) else type(state).__name__
            raise ValueError(f"not a loader position (format {found!r}, expected "
                             f"{_POSITION_FORMAT!r}): pass what Loader.position(...) returned")
        try:
            raw = zlib.decompress(base64.b64decode(state["delivered"], validate=True))
            flat = np.cumsum(np.frombuffer(raw, dtype="<i8")).astype(np.int64)
            num_rows = int(state["num_rows"])
            position = cls(int(state["epoch"]), num_rows, int(state["seed"]),
                           bool(state["shuffle"]), str(state["layout"]), flat.reshape(-1, 2))
        except (KeyError, TypeError, ValueError, zlib.error, binascii.Error) as exc:
            raise ValueError(f"loader position is damaged ({type(exc).__name__}: {exc}); pass "
                             "what Loader.position(...) returned, unchanged") from exc
        r = position.delivered
        ok = (len(flat) % 2 == 0 and (len(r) == 0 or (r[0, 0] >= 0 and r[-1, 1] <= num_rows))
              and bool(np.all(np.diff(flat) > 0)) and position.num_delivered
              == int(state.get("rows_delivered", position.num_delivered)))
        if not ok:
            raise ValueError(f"loader position is damaged: its ranges are not sorted, disjoint "
                             f"positions of the {num_rows}-row stream; pass what "
                             "Loader.position(...) returned, unchanged")
        return position


def resume_split(num_remaining: int, batch_size: int, global_size: int,
                 drop_last: bool) -> list[RankShare]:
    """:func:`split_rows` of the ``num_remaining`` rows a resumed epoch delivers (its
    shares index the remaining positions, in stream order). No rows left, or with
    ``drop_last`` fewer than one batch per rank, is an epoch of no batch."""
    n, b, w = num_remaining, batch_size, global_size
    if n == 0 or (drop_last and n < w * b):
        return [RankShare(0, 0, b, 0) for _ in range(w)]
    return split_rows(n, b, w, drop_last)


def read_order(piece: Piece, unit_num_rows: int, seed: int, epoch: int,
               shuffle: bool) -> np.ndarray:
    """The epoch-order offsets (``0 .. unit_num_rows``) of a piece's rows, in the
    order :meth:`tabstream.loaders.reading.RowGroupReader.read_piece` returns them:
    a whole unit in file order, a part of one (with shuffling) in file order of the
    rows ``unit_rows_permutation(...)[start:stop]``."""
    if not shuffle:
        return np.arange(piece.start, piece.stop, dtype=np.int64)
    perm = unit_rows_permutation(unit_num_rows, seed, epoch, piece.unit)
    inverse = np.empty(unit_num_rows, dtype=np.int64)
    inverse[perm] = np.arange(unit_num_rows, dtype=np.int64)
    if piece.start == 0 and piece.stop == unit_num_rows:
        return inverse
    return inverse[np.sort(perm[piece.start:piece.stop])]


def _unit_offsets(unit_rows: Sequence[int], order: Sequence[int] | np.ndarray) -> np.ndarray:
    """The stream position of each unit's first row (indexed by unit)."""
    rows = np.asarray(unit_rows, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    offsets = np.empty(len(rows), dtype=np.int64)
    offsets[order] = np.cumsum(rows[order]) - rows[order]
    return offsets


def select_pieces(unit_rows: Sequence[int], order: Sequence[int] | np.ndarray,
                  selection: np.ndarray, seed: int, epoch: int,
                  shuffle: bool) -> list[tuple[Piece, np.ndarray | None]]:
    """The pieces holding the stream positions of ``selection`` (ranges), one per
    unit touched, in stream order, each with which of its rows (in read order, see
    :func:`read_order`) to keep: ``None`` when all of them.

    >>> [(p, k if k is None else k.tolist()) for p, k in
    ...  select_pieces([5, 3, 4], [2, 0, 1], _ranges([[1, 3], [5, 6], [7, 12]]), 0, 0, False)]
    [(Piece(unit=2, start=1, stop=3), None), (Piece(unit=0, start=1, stop=5), [True, False, True, True]), (Piece(unit=1, start=0, stop=3), None)]
    """
    rows = np.asarray(unit_rows, dtype=np.int64)
    order = np.asarray(order, dtype=np.int64)
    sel = np.asarray(selection, dtype=np.int64).reshape(-1, 2)
    out: list[tuple[Piece, np.ndarray | None]] = []
    if len(sel) == 0:
        return out
    lens = rows[order]
    ustart = np.cumsum(lens) - lens
    uend = ustart + lens
    first = np.searchsorted(sel[:, 1], ustart, side="right")
    stop = np.searchsorted(sel[:, 0], uend, side="left")
    for k in np.flatnonzero(stop > first):
        sub = np.clip(sel[first[k]:stop[k]], ustart[k], uend[k])
        unit, n = int(order[k]), int(lens[k])
        piece = Piece(unit, int(sub[0, 0] - ustart[k]), int(sub[-1, 1] - ustart[k]))
        keep = None
        if _count(sub) != piece.num_rows:
            keep = _contains(sub, ustart[k] + read_order(piece, n, seed, epoch, shuffle))
        out.append((piece, keep))
    return out


def delivered_rows(pieces: Sequence[tuple[Piece, np.ndarray | None]], chunk_lengths: Sequence[int],
                   unit_rows: Sequence[int], order: Sequence[int] | np.ndarray, consumed: int,
                   *, seed: int, epoch: int, rank: int, shuffle: bool) -> np.ndarray:
    """The stream positions (ranges) a rank has delivered once ``consumed`` rows of
    its epoch are in its batches: the rank reads ``pieces`` (with their keep masks,
    as from :func:`select_pieces`) in chunks of ``chunk_lengths`` pieces, and deals
    each chunk's kept rows out in the order the loader does: that of
    ``chunk_rng(seed, epoch, rank, chunk).permutation(kept rows)`` when shuffling,
    read order otherwise."""
    offsets = _unit_offsets(unit_rows, order)
    rows = np.asarray(unit_rows, dtype=np.int64)
    parts: list[np.ndarray] = []
    left, at = int(consumed), 0

    def positions(piece: Piece, local: np.ndarray | None) -> np.ndarray:
        offs = read_order(piece, int(rows[piece.unit]), seed, epoch, shuffle)
        return offsets[piece.unit] + (offs if local is None else offs[local])

    for k, length in enumerate(chunk_lengths):
        if left == 0:
            break
        chunk = pieces[at:at + length]
        at += length
        kept = [np.arange(p.num_rows) if keep is None else np.flatnonzero(keep)
                for p, keep in chunk]
        n = sum(len(x) for x in kept)
        if left >= n:
            for (piece, keep), local in zip(chunk, kept, strict=True):
                if keep is None:
                    start = offsets[piece.unit] + piece.start
                    parts.append(np.array([[start, start + piece.num_rows]], dtype=np.int64))
                else:
                    parts.append(_ranges_of_positions(np.sort(positions(piece, local))))
            left -= n
            continue
        taken = (chunk_rng(seed, epoch, rank, k).permutation(n)[:left] if shuffle
                 else np.arange(left))
        owner = np.repeat(np.arange(len(chunk)), [len(x) for x in kept])[taken]
        flat = np.concatenate(kept)[taken]
        for j in np.unique(owner):
            parts.append(_ranges_of_positions(np.sort(positions(chunk[j][0], flat[owner == j]))))
        left = 0
    if left:
        raise ValueError(f"rank {rank} holds fewer rows than the {consumed} said consumed")
    return _ranges(np.concatenate(parts)) if parts else np.empty((0, 2), dtype=np.int64)

"""MurmurHash3 x86_32 over tensors, written once for Keras and torch.

The same algorithm and byte encoding as :mod:`tabstream.core.hashing` (integers as
8 little-endian bytes, floats as their float64 bits with ``-0.0`` folded into
``0.0``, strings as their UTF-8 bytes), so an artifact's ids equal
``Workflow.transform``'s. Values are int64 tensors holding unsigned 32-bit numbers;
every product is split in 16-bit halves, so nothing overflows int64 in either
framework (or, where a framework's int64 product wraps, ``K.mul32``). A framework
passes a small kernel object ``K`` (see
:class:`tabstream.serving.torch._K` and :class:`tabstream.serving.keras._K`):
``band, bor, bxor, shl, shr`` (arithmetic shift), ``gather``, ``where``,
``full_like`` and ``loop(count, body, state)``.

Strings are hashed in one pass over the batch's flat bytes: block ``j`` of every
string that has one is mixed in at loop step ``j`` (as the numpy version does),
the loop running as many steps as the longest string has 4-byte blocks.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MASK", "MISSING_PART", "hash_bytes", "hash_combine", "hash_int64"]

MASK = 0xFFFFFFFF
_C1, _C2, _N = 0xCC9E2D51, 0x1B873593, 0xE6546B64
_F1, _F2 = 0x85EBCA6B, 0xC2B2AE35
#: what a missing part folds into a HashedCross (tabstream.ops.hashing)
MISSING_PART = 0x9E3779B9


def mul32(K: Any, a: Any, c: int) -> Any:
    """``a * c mod 2**32`` for ``0 <= a < 2**32``: ``K.mul32`` when the framework's int64
    product wraps (torch), else in 16-bit halves, without int64 overflow."""
    if hasattr(K, "mul32"):
        return K.mul32(a, c)
    lo = K.band(a, 0xFFFF)
    hi = K.shr(a, 16)
    return K.band(lo * c + K.shl(K.band(hi * c, 0xFFFF), 16), MASK)


def rotl(K: Any, x: Any, r: int) -> Any:
    return K.band(K.bor(K.shl(x, r), K.shr(x, 32 - r)), MASK)


def scramble(K: Any, k: Any) -> Any:
    return mul32(K, rotl(K, mul32(K, k, _C1), 15), _C2)


def absorb(K: Any, h: Any, k: Any) -> Any:
    """One body step: ``h = rotl(h ^ scramble(k), 13) * 5 + n``."""
    h = rotl(K, K.bxor(h, scramble(K, k)), 13)
    return K.band(mul32(K, h, 5) + _N, MASK)


def fmix(K: Any, h: Any, length: Any) -> Any:
    h = K.bxor(h, length)
    h = mul32(K, K.bxor(h, K.shr(h, 16)), _F1)
    h = mul32(K, K.bxor(h, K.shr(h, 13)), _F2)
    return K.bxor(h, K.shr(h, 16))


def hash_int64(K: Any, v: Any, seed: int = 0) -> Any:
    """murmur3 of the 8 little-endian bytes of each int64 ``v`` (also float64 bits)."""
    h = K.full_like(v, seed)
    h = absorb(K, h, K.band(v, MASK))
    h = absorb(K, h, K.band(K.shr(v, 32), MASK))
    return fmix(K, h, 8)


def hash_combine(K: Any, h1: Any, h2: Any) -> Any:
    """murmur3 of the 8 bytes ``h1 || h2`` (the project's hash_combine)."""
    h = K.full_like(h1, 0)
    return fmix(K, absorb(K, absorb(K, h, h1), h2), 8)


def hash_bytes(K: Any, data: Any, starts: Any, lengths: Any, seeds: tuple[int, ...] = (0,)) -> list[Any]:
    """murmur3 of ``data[starts[i]:starts[i] + lengths[i]]`` per row, once per seed.

    ``data``: int64 byte values, followed by at least 4 zeros (reads past a string's
    end are masked off, but must stay in bounds); ``starts``, ``lengths``: int64 ``[B]``.
    """
    n_blocks = K.shr(lengths, 2)

    def word(pos: Any) -> Any:
        w = K.gather(data, pos)
        for b in (1, 2, 3):
            w = K.bor(w, K.shl(K.gather(data, pos + b), 8 * b))
        return w

    def body(j: Any, hs: list[Any]) -> list[Any]:
        k = word(starts + 4 * j)
        has = j < n_blocks
        return [K.where(has, absorb(K, h, k), h) for h in hs]

    hs = K.loop(n_blocks, body, [K.full_like(lengths, s) for s in seeds])
    tail = K.band(lengths, 3)
    end = starts + 4 * n_blocks
    k = K.full_like(lengths, 0)
    for b in (0, 1, 2):
        byte = K.gather(data, end + b)
        k = K.where(tail > b, K.bor(k, K.shl(byte, 8 * b)), k)
    tailed = tail > 0
    out = []
    for h in hs:
        h = K.where(tailed, K.bxor(h, scramble(K, k)), h)
        out.append(fmix(K, h, lengths))
    return out

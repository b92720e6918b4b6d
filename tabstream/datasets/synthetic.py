"""Synthetic click logs shaped like Criteo's and like an e-commerce interaction log.

Labels are drawn from a hidden logistic model of the features, so a model trained
on the data has something to learn, and ``return_probability=True`` hands back
the true click probabilities (the oracle a model's AUC can be compared with).

Criteo-like rows (``generate_data("criteo", n)``)::

    label  I1    I2  ...  I13   C1        C2        ...  C26
    0      <NA>  3   ...  12    68fd1e64  80e26c9b  ...  <NA>
    1      2     -1  ...  <NA>  05db9164  0b153874  ...  4cf72387
    int64  ArrowDtype(int64), nulls   ArrowDtype(string): 8 lowercase hex chars, nulls

Multi-hot rows (``generate_data("multi-hot", n, slots=100, nnz=10, vocabulary=8192)``),
the layout of sparse-feature click models: ``slots`` feature fields of ``nnz`` ids
each, ids in ``[0, vocabulary)`` (power-law, id 0 the most frequent: a real id)::

    label  multi_hot                                   (layout="nested", the default)
    1      [[0, 17, 3, ...], [5, 0, 0, ...], ...]      fixed_size_list<fixed_size_list<int64, nnz>, slots>
    int64

    label  S1             S2            ...  S100     (layout="columns")
    1      [0, 17, 3 ...]  [5, 0, 0 ...]  ...          fixed_size_list<int64, nnz> each

E-commerce rows (``generate_data("e-commerce", n)``)::

    user_id  item_id  user_age_bucket  user_country  user_activity  item_category  item_brand  item_price  device  click
    48213    90121    3                US            4.21           7              181         23.99       mobile  0

Reproducibility does not depend on how rows are cut into files or chunks: the
random draws of row ``i`` come from the fixed block ``i // BLOCK_ROWS`` (a numpy
Generator seeded with ``SeedSequence([seed, stream, block])``, one stream per
column), and everything attached to a category value (its effect on the click,
an item's brand, a user's country) is a hash of ``(seed, column, value)``. A
categorical's hex spelling is a fixed bijection of (column, value), whatever the seed.
"""

from __future__ import annotations

import functools
import math
import operator
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tabstream.core.errors import listed

__all__ = [
    "CRITEO_CATEGORICAL",
    "CRITEO_COLUMNS",
    "CRITEO_CONTINUOUS",
    "CRITEO_DTYPES",
    "CRITEO_LABEL",
    "DATASET_NAMES",
    "ECOMMERCE_COLUMNS",
    "ECOMMERCE_DTYPES",
    "ECOMMERCE_LABEL",
    "ECOMMERCE_TAGS",
    "earlier_run_files",
    "generate_data",
    "write_data",
]

# Rows whose random draws share one generator. Changing it changes every dataset.
BLOCK_ROWS = 1 << 16
# Categoricals with at most this many values get per-value lookup tables (hex
# spellings, click effects), computed once per process instead of once per row.
_TABLE_MAX_VOCAB = 1 << 19
# Most rows held in memory at once by write_data (one criteo chunk is ~450 MB in Arrow).
DEFAULT_CHUNK_ROWS = 1 << 20

DATASET_NAMES = ("criteo", "e-commerce", "multi-hot")
_ALIASES = {"criteo": "criteo", "e-commerce": "e-commerce", "ecommerce": "e-commerce",
            "multi-hot": "multi-hot", "multihot": "multi-hot"}
_FORMATS = ("parquet", "tsv")

CRITEO_LABEL = "label"
CRITEO_CONTINUOUS = [f"I{i}" for i in range(1, 14)]
CRITEO_CATEGORICAL = [f"C{i}" for i in range(1, 27)]
CRITEO_COLUMNS = [CRITEO_LABEL, *CRITEO_CONTINUOUS, *CRITEO_CATEGORICAL]
CRITEO_DTYPES = {
    CRITEO_LABEL: "int64",
    **{c: "int64" for c in CRITEO_CONTINUOUS},
    **{c: "string" for c in CRITEO_CATEGORICAL},
}

ECOMMERCE_LABEL = "click"
ECOMMERCE_DTYPES = {
    "user_id": "int64",
    "item_id": "int64",
    "user_age_bucket": "int64",
    "user_country": "string",
    "user_activity": "float64",
    "item_category": "int64",
    "item_brand": "int64",
    "item_price": "float64",
    "device": "string",
    ECOMMERCE_LABEL: "int64",
}
ECOMMERCE_COLUMNS = list(ECOMMERCE_DTYPES)
ECOMMERCE_TAGS = {
    "user_id": ["user", "user_id", "categorical"],
    "item_id": ["item", "item_id", "categorical"],
    "user_age_bucket": ["user", "categorical"],
    "user_country": ["user", "categorical"],
    "user_activity": ["user", "continuous"],
    "item_category": ["item", "categorical"],
    "item_brand": ["item", "categorical"],
    "item_price": ["item", "continuous"],
    "device": ["context", "categorical"],
    ECOMMERCE_LABEL: ["target", "binary_classification"],
}


# --------------------------------------------------------------------------- hashing

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _mix64_int(x: int) -> int:
    """splitmix64's finalizer on a Python int (numpy scalars would warn on overflow)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _key(*parts: int | str) -> int:
    """A 64-bit key for (seed, purpose, column, ...); stable across processes, unlike hash()."""
    h = 0
    for part in parts:
        value = zlib.crc32(part.encode()) if isinstance(part, str) else part
        h = _mix64_int(h + _GOLDEN64 + (value & _MASK64))
    return h


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, elementwise on a uint64 array (wraps mod 2**64; modifies x)."""
    x ^= x >> 30
    x *= 0xBF58476D1CE4E5B9
    x ^= x >> 27
    x *= 0x94D049BB133111EB
    x ^= x >> 31
    return x


def _hash_uniform(key: int, ids: np.ndarray) -> np.ndarray:
    """Uniform floats in (0, 1), one per id, a fixed function of (key, id).

    ids: (n,) integers (negative ones are fine) -> (n,) float64.
    This is splitmix64's output for state ``key + id * golden``: ids are consecutive
    counters of a well-mixed stream, so neighbouring ids get unrelated values.
    """
    h = ids.astype(np.uint64) * np.uint64(_GOLDEN64) + np.uint64(key)
    h = _mix64(h) >> 11  # the top 53 bits fill a double's mantissa exactly
    return (h.astype(np.float64) + 0.5) * 2.0**-53


def _hash_normal(key: int, ids: np.ndarray, dims: int = 1) -> np.ndarray:
    """Near-normal values (mean 0, std 1), a fixed function of (key, id, dim).

    (n,) ids -> (n, dims) float64. Each value is the standardized sum of the four
    16-bit quarters of one 64-bit hash (Irwin-Hall, 4 terms): far cheaper than
    Box-Muller, and bounded by +-3.46, which suits hidden effects.
    """
    out = np.empty((len(ids), dims))
    base = ids.astype(np.uint64) * np.uint64(_GOLDEN64)
    for d in range(dims):
        h = _mix64(base + np.uint64(_key(key, d)))
        total = (h & 0xFFFF) + ((h >> 16) & 0xFFFF) + ((h >> 32) & 0xFFFF) + (h >> 48)
        # quarters are uniform on 0..65535: the sum has mean 131070, std ~65536 / sqrt(3)
        out[:, d] = (total.astype(np.float64) - 131070.0) * (math.sqrt(3.0) / 65536.0)
    return out


# ------------------------------------------------------------------ row-block randomness


def _block_draws(
    seed: int,
    stream: str,
    start: int,
    stop: int,
    draw: Callable[[np.random.Generator, int], tuple[np.ndarray, ...]],
) -> list[np.ndarray]:
    """The random arrays of rows [start, stop) of one stream (usually one column).

    ``draw(rng, n)`` makes a tuple of (n,) arrays. It is called once per whole block
    of BLOCK_ROWS rows with that block's own generator and the result is sliced, so
    row i gets the same values however the range is cut.
    """
    stream_id = zlib.crc32(stream.encode())
    parts: list[tuple[np.ndarray, ...]] = []
    for block in range(start // BLOCK_ROWS, -(-stop // BLOCK_ROWS)):
        rng = np.random.default_rng(np.random.SeedSequence([seed, stream_id, block]))
        lo = max(start - block * BLOCK_ROWS, 0)
        hi = min(stop - block * BLOCK_ROWS, BLOCK_ROWS)
        parts.append(tuple(a[lo:hi] for a in draw(rng, BLOCK_ROWS)))
    if not parts:  # empty range: right dtypes, no rows
        parts.append(draw(np.random.default_rng(0), 0))
    return [np.concatenate(arrays) for arrays in zip(*parts, strict=True)]


def _powerlaw_ranks(u: np.ndarray, size: int, exponent: float) -> np.ndarray:
    """Map uniforms u in [0, 1) to ranks in [0, size) with P(rank r) ~ (r + 1) ** -exponent.

    Inverse CDF of the density (x + 1) ** -exponent on [0, size], floored: rank 0
    is the most frequent value, a bounded Zipf law. (n,) float -> (n,) int64.
    Computed in u's precision: float32 (3x faster) is plenty for small sizes.
    """
    real = u.dtype.type
    if abs(exponent - 1.0) < 1e-12:
        x = np.expm1(u * real(math.log1p(size)))
    else:
        a = 1.0 - exponent
        x = np.power(real(1.0) + u * real((size + 1.0) ** a - 1.0), real(1.0 / a)) - real(1.0)
    return np.minimum(x.astype(np.int64), size - 1)  # floor; guard rounding at u -> 1


def _drifted(ranks: np.ndarray, start: int, size: int, drift: float) -> np.ndarray:
    """Popularity ranks of rows ``start, start + 1, ...`` -> the values they stand for
    under ``drift``: at row ``i`` rank ``r`` is value ``(r + floor(i * drift / 1000)) %
    size``, so the popular values move through the vocabulary as rows go by (a day's
    new ids). ``ranks`` is (n, ...) with rows first; drift 0 changes nothing."""
    if not drift:
        return ranks
    rows = np.arange(start, start + len(ranks), dtype=np.float64)
    shift = np.floor(rows * (drift / 1000.0)).astype(np.int64) % size
    return (ranks + shift.reshape((-1,) + (1,) * (ranks.ndim - 1))) % size


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _bernoulli(seed: int, stream: str, start: int, stop: int, prob: np.ndarray) -> np.ndarray:
    """(n,) probabilities -> (n,) int64 0/1 labels, drawn from the rows' own blocks."""
    (u,) = _block_draws(seed, stream, start, stop, lambda rng, n: (rng.random(n),))
    return (u < prob).astype(np.int64)


# --------------------------------------------------------------------- hex categoricals


def _hex_table() -> np.ndarray:
    """(65536,) uint32 whose bytes spell each 16-bit value as 4 lowercase hex chars."""
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    values = np.arange(1 << 16)
    nibbles = np.stack([(values >> shift) & 15 for shift in (12, 8, 4, 0)], axis=1)
    return np.ascontiguousarray(digits[nibbles]).view(np.uint32).ravel()


_HEX4 = _hex_table()


def _hex_codes(column: str, ranks: np.ndarray) -> np.ndarray:
    """The 32-bit code spelled in the data for each rank of ``column``: (n,) -> (n,) uint32.

    A fixed bijection of uint32 per column (add a column key, then murmur3's
    finalizer, whose steps are each invertible), so distinct values never collide.
    """
    x = ranks.astype(np.uint32) + np.uint32(zlib.crc32(column.encode()))
    x ^= x >> 16
    x *= np.uint32(0x85EBCA6B)
    x ^= x >> 13
    x *= np.uint32(0xC2B2AE35)
    x ^= x >> 16
    return x


def _spell_hex(codes: np.ndarray) -> np.ndarray:
    """(n,) uint32 codes -> (n,) uint64 words whose 8 bytes are the code in lowercase hex."""
    words = np.empty((len(codes), 2), dtype=np.uint32)  # high then low 16 bits
    words[:, 0] = _HEX4[codes >> 16]
    words[:, 1] = _HEX4[codes & 0xFFFF]
    return words.view(np.uint64).ravel()


@functools.lru_cache(maxsize=64)
def _hex_word_table(column: str, vocab: int) -> np.ndarray:
    """The spelled words of all ranks of a small-vocabulary column: (vocab,) uint64."""
    table = _spell_hex(_hex_codes(column, np.arange(vocab)))
    table.flags.writeable = False  # shared by every later call
    return table


def _hex_words(column: str, ranks: np.ndarray, vocab: int) -> np.ndarray:
    """(n,) ranks -> (n,) uint64 words spelling each rank's hex string (8 ASCII bytes)."""
    if vocab <= _TABLE_MAX_VOCAB:
        return _hex_word_table(column, vocab)[ranks]
    return _spell_hex(_hex_codes(column, ranks))


def _strings_from_words(words: np.ndarray, valid: np.ndarray | None = None) -> pa.StringArray:
    """(n,) uint64 words -> Arrow strings of their 8 bytes, null where not valid.

    Built straight from buffers instead of n Python strings; null slots are empty.
    """
    n = len(words)
    if valid is None or valid.all():
        offsets = np.arange(0, 8 * n + 1, 8, dtype=np.int32)
        return pa.StringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(words))
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(valid.astype(np.int32) * 8, out=offsets[1:])
    return pa.StringArray.from_buffers(
        n,
        pa.py_buffer(offsets),
        pa.py_buffer(np.ascontiguousarray(words[valid])),
        null_bitmap=pa.py_buffer(np.packbits(valid, bitorder="little")),
        null_count=int(n - np.count_nonzero(valid)),
    )


# ------------------------------------------------------------------------------ criteo


@dataclass(frozen=True)
class _CatSpec:
    vocab: int  # distinct values the column can take
    exponent: float  # Zipf exponent of value popularity
    missing: float  # fraction of null rows
    effect: float  # std of the logit effect of the most frequent values


@dataclass(frozen=True)
class _ContSpec:
    mu: float  # a count is floor(exp(mu + sigma * z)), z logistic with std ~1: heavy tailed
    sigma: float
    missing: float
    negative: float  # fraction of rows replaced by -1, -2 or -3 (as in Criteo's I2)
    weight: float  # logit weight of the standardized log1p(max(count, 0))


# Vocabulary sizes and missing rates follow the Kaggle Criteo data (its few columns
# missing more than 45% are capped there). Huge vocabularies get flatter laws so
# that, at small row counts, most of their rows are values seen once.
_CRITEO_CAT_SPECS = {
    name: _CatSpec(vocab, exponent, missing, effect)
    for name, (vocab, exponent, missing, effect) in zip(
        CRITEO_CATEGORICAL,
        [
            (1460, 1.05, 0.0, 0.63),
            (583, 1.05, 0.0, 0.54),
            (10_000_000, 0.8, 0.03, 0.45),
            (2_000_000, 0.8, 0.03, 0.36),
            (305, 1.1, 0.0, 0.54),
            (24, 1.2, 0.12, 0.54),
            (12517, 1.0, 0.0, 0.45),
            (633, 1.05, 0.0, 0.36),
            (3, 1.2, 0.0, 0.36),
            (93145, 0.9, 0.0, 0.45),
            (5683, 1.0, 0.0, 0.54),
            (8_000_000, 0.8, 0.03, 0.0),
            (3194, 1.0, 0.0, 0.45),
            (27, 1.2, 0.0, 0.54),
            (14992, 1.0, 0.0, 0.45),
            (5_400_000, 0.8, 0.03, 0.0),
            (10, 1.2, 0.0, 0.54),
            (5652, 1.0, 0.0, 0.45),
            (2173, 1.05, 0.44, 0.36),
            (4, 1.2, 0.44, 0.36),
            (7_000_000, 0.8, 0.03, 0.0),
            (18, 1.2, 0.45, 0.36),
            (15, 1.2, 0.0, 0.54),
            (286_000, 0.9, 0.03, 0.36),
            (105, 1.1, 0.44, 0.45),
            (142_000, 0.9, 0.44, 0.27),
        ],
        strict=True,
    )
}

_CRITEO_CONT_SPECS = {
    name: _ContSpec(*spec)
    for name, spec in zip(
        CRITEO_CONTINUOUS,
        [
            (0.3, 1.2, 0.45, 0.0, 0.36),
            (1.2, 1.8, 0.0, 0.08, 0.0),
            (1.6, 1.5, 0.21, 0.0, -0.18),
            (1.5, 1.0, 0.22, 0.0, 0.0),
            (7.5, 2.0, 0.03, 0.0, -0.12),
            (3.5, 1.6, 0.22, 0.0, 0.24),
            (1.2, 1.5, 0.04, 0.0, 0.3),
            (2.2, 1.0, 0.0005, 0.0, 0.0),
            (3.5, 1.4, 0.04, 0.0, 0.0),
            (-0.5, 0.8, 0.45, 0.0, 0.18),
            (0.6, 1.0, 0.04, 0.0, 0.36),
            (-0.8, 1.2, 0.45, 0.0, 0.0),
            (1.7, 1.1, 0.22, 0.0, -0.24),
        ],
        strict=True,
    )
}

# Logit intercept, chosen so that about a quarter of criteo rows are clicks.
_CRITEO_BIAS = -2.4


def _criteo_counts(seed: int, column: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Heavy-tailed integer counts of rows [start, stop): ((n,) int64 values, (n,) bool valid)."""
    spec = _CRITEO_CONT_SPECS[column]
    u_value, u_state = _block_draws(
        seed,
        column,
        start,
        stop,
        # float32 draws: counts need no more precision, and they are twice as cheap
        lambda rng, n: (rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)),
    )
    # a logistic variable (scaled to std ~1) costs one log instead of a normal draw
    u_value = np.clip(u_value, np.float32(2**-24), np.float32(1 - 2**-24))
    z = np.float32(0.55) * (np.log(u_value) - np.log1p(-u_value))
    values = np.floor(np.exp(np.float32(spec.mu) + np.float32(spec.sigma) * z)).astype(np.int64)
    # u_state splits into [0, missing): null, [missing, missing + negative): -1, -2 or -3
    if spec.negative > 0:
        negative = (u_state >= spec.missing) & (u_state < spec.missing + spec.negative)
        fraction = (u_state[negative] - spec.missing) / spec.negative
        values[negative] = -1 - np.minimum((fraction * 3).astype(np.int64), 2)
    return values, u_state >= spec.missing


def _criteo_ranks(seed: int, column: str, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """Popularity ranks of a categorical's values: ((n,) int64 ranks, (n,) bool valid)."""
    spec = _CRITEO_CAT_SPECS[column]
    # float32 resolves the rarest values of a small vocabulary; huge ones need float64
    real = np.float32 if spec.vocab <= _TABLE_MAX_VOCAB else np.float64
    if spec.missing == 0:
        (u_rank,) = _block_draws(
            seed, column, start, stop, lambda rng, n: (rng.random(n, dtype=real),)
        )
        valid = np.ones(len(u_rank), dtype=bool)
    else:
        u_rank, u_missing = _block_draws(
            seed,
            column,
            start,
            stop,
            lambda rng, n: (rng.random(n, dtype=real), rng.random(n, dtype=np.float32)),
        )
        valid = u_missing >= spec.missing
    return _powerlaw_ranks(u_rank, spec.vocab, spec.exponent), valid


def _value_effects(seed: int, column: str, ranks: np.ndarray) -> np.ndarray:
    """Logit effect of each value of a categorical: (n,) ranks -> (n,) float64.

    A near-normal draw fixed by (seed, column, value), shrunk for rarer values; a
    null is a value of its own (rank -1).
    """
    scale = _CRITEO_CAT_SPECS[column].effect / (1.0 + 0.25 * np.log1p(np.maximum(ranks, 0)))
    return scale * _hash_normal(_key(seed, "effect", column), ranks)[:, 0]


@functools.lru_cache(maxsize=64)
def _effect_table(seed: int, column: str) -> np.ndarray:
    """Effects of all values of a column, ``table[rank + 1]`` (index 0 is null): (vocab + 1,)."""
    table = _value_effects(seed, column, np.arange(-1, _CRITEO_CAT_SPECS[column].vocab))
    table.flags.writeable = False  # shared by every later call
    return table


def _category_effects(seed: int, column: str, ranks: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Logit contribution of each row's value: (n,) ranks, (n,) valid -> (n,) float64."""
    if _CRITEO_CAT_SPECS[column].vocab <= _TABLE_MAX_VOCAB:
        table = _effect_table(seed, column)
        effects, null_effect = table[1:][ranks], table[0]
    else:
        effects = _value_effects(seed, column, ranks)
        null_effect = _value_effects(seed, column, np.array([-1]))[0]
    effects[~valid] = null_effect
    return effects


def _criteo_table(seed: int, start: int, stop: int, drift: float = 0.0) -> tuple[pa.Table, np.ndarray]:
    """Rows [start, stop) of the criteo-like data: (Arrow table, (n,) float64 probabilities)."""
    n = stop - start
    logit = np.full(n, _CRITEO_BIAS)
    columns: dict[str, pa.Array] = {}
    for name, spec in _CRITEO_CONT_SPECS.items():
        values, valid = _criteo_counts(seed, name, start, stop)
        if spec.weight:
            # what a model sees after FillMissing(0) >> Clip(0) >> LogOp: missing counts as 0
            logged = np.log1p(np.where(valid, np.maximum(values, 0), 0))
            logit += spec.weight * (logged - spec.mu) / spec.sigma
        columns[name] = pa.array(values, mask=~valid)
    for name, cat_spec in _CRITEO_CAT_SPECS.items():
        ranks, valid = _criteo_ranks(seed, name, start, stop)
        ranks = _drifted(ranks, start, cat_spec.vocab, drift)
        if cat_spec.effect:
            logit += _category_effects(seed, name, ranks, valid)
        columns[name] = _strings_from_words(_hex_words(name, ranks, cat_spec.vocab), valid)
    prob = _sigmoid(logit)
    label = _bernoulli(seed, CRITEO_LABEL, start, stop, prob)
    return pa.table({CRITEO_LABEL: label, **columns}), prob


# -------------------------------------------------------------------------- e-commerce

_NUM_USERS = 2_000_000
_NUM_ITEMS = 500_000
_USER_EXPONENT = 0.85
_ITEM_EXPONENT = 0.9
# ids are a scrambled rank (rank * prime + offset mod size): popularity is not id order
_ID_PRIME = 2_654_435_761
_LATENT_DIM = 8

_AGE_WEIGHTS = np.array([0.08, 0.22, 0.25, 0.18, 0.12, 0.09, 0.06])
_AGE_MISSING = 0.1  # fraction of users whose age is unknown (a null)
_COUNTRIES = tuple("US GB DE FR BR IN JP CA ES IT MX NL PL SE AU".split())
_COUNTRY_WEIGHTS = 1.0 / np.arange(1, len(_COUNTRIES) + 1)
_NUM_CATEGORIES = 40
_BRANDS_PER_CATEGORY = 25
_DEVICES = ("mobile", "desktop", "tablet")
_DEVICE_WEIGHTS = np.array([0.6, 0.3, 0.1])
_DEVICE_EFFECTS = np.array([0.0, 0.25, -0.15])
_ECOMMERCE_BIAS = -1.6


def _pick(u: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Uniforms (n,) -> indices (n,) drawn with the given (unnormalized) weights."""
    cumulative = np.cumsum(weights) / np.sum(weights)
    return np.minimum(np.searchsorted(cumulative, u, side="right"), len(weights) - 1)


def _scramble(ranks: np.ndarray, size: int) -> np.ndarray:
    """A fixed bijection of [0, size): popularity rank -> id. (n,) int64 -> (n,) int64."""
    return (ranks * (_ID_PRIME % size) + size // 3) % size


@dataclass(frozen=True)
class _Users:
    """Per-row user attributes, each (n,); every one a fixed function of the user id."""

    id: np.ndarray
    age: np.ndarray  # 0..6, -1 when unknown
    country: np.ndarray  # index into _COUNTRIES
    activity: np.ndarray


@dataclass(frozen=True)
class _Items:
    """Per-row item attributes, each (n,); every one a fixed function of the item id."""

    id: np.ndarray
    category: np.ndarray
    brand: np.ndarray  # brands belong to one category: category * _BRANDS_PER_CATEGORY + k
    price: np.ndarray


def _users(seed: int, ranks: np.ndarray) -> _Users:
    ids = _scramble(ranks, _NUM_USERS)
    age = _pick(_hash_uniform(_key(seed, "age"), ids), _AGE_WEIGHTS)
    age = np.where(_hash_uniform(_key(seed, "age missing"), ids) < _AGE_MISSING, -1, age)
    country = _pick(_hash_uniform(_key(seed, "country"), ids), _COUNTRY_WEIGHTS)
    # frequent users are the active ones
    noise = _hash_normal(_key(seed, "activity"), ids)[:, 0]
    activity = np.round(20.0 * (ranks + 1.0) ** -0.25 * np.exp(0.4 * noise), 2)
    return _Users(ids, age, country, activity)


def _items(seed: int, ranks: np.ndarray) -> _Items:
    ids = _scramble(ranks, _NUM_ITEMS)
    category = _powerlaw_ranks(_hash_uniform(_key(seed, "category"), ids), _NUM_CATEGORIES, 0.8)
    in_category = _powerlaw_ranks(
        _hash_uniform(_key(seed, "brand"), ids), _BRANDS_PER_CATEGORY, 1.0
    )
    brand = category * _BRANDS_PER_CATEGORY + in_category
    category_price = (
        2.5 + _hash_normal(_key(seed, "category price"), np.arange(_NUM_CATEGORIES))[category, 0]
    )
    noise = _hash_normal(_key(seed, "price"), ids)[:, 0]
    price = np.maximum(np.round(np.exp(category_price + 0.5 * noise), 2), 0.01)  # log-safe
    return _Items(ids, category, brand, price)


def _ecommerce_logit(seed: int, users: _Users, items: _Items, device: np.ndarray) -> np.ndarray:
    """The hidden click model: per-row logit (n,) float64.

    User and item get latent vectors (unit variance per dimension) mixed from their
    attributes' vectors and their own, so the affinity is learnable from ids and
    from attributes; a two-tower model's dot product can represent it.
    """
    dim = _LATENT_DIM

    def attribute_vectors(purpose: str, values: np.ndarray, size: int) -> np.ndarray:
        # few distinct values: hash each once, then index (value -1, a null, is row 0)
        table = _hash_normal(_key(seed, purpose), np.arange(-1, size), dim)
        return table[values + 1]

    user_vec = (
        0.5 * attribute_vectors("country vec", users.country, len(_COUNTRIES))
        + 0.5 * attribute_vectors("age vec", users.age, len(_AGE_WEIGHTS))
        + math.sqrt(0.5) * _hash_normal(_key(seed, "user vec"), users.id, dim)
    )
    item_vec = (
        0.6 * attribute_vectors("category vec", items.category, _NUM_CATEGORIES)
        + 0.4 * attribute_vectors("brand vec", items.brand, _NUM_CATEGORIES * _BRANDS_PER_CATEGORY)
        + math.sqrt(0.48) * _hash_normal(_key(seed, "item vec"), items.id, dim)
    )
    affinity = np.einsum("nd,nd->n", user_vec, item_vec) / math.sqrt(dim)
    item_bias = 0.4 * _hash_normal(_key(seed, "item bias"), items.id)[:, 0]
    return (
        _ECOMMERCE_BIAS
        + 1.4 * affinity
        + item_bias
        + _DEVICE_EFFECTS[device]
        - 0.3 * (np.log(items.price) - 2.5)
        + 0.2 * (np.log(users.activity + 0.01) - 1.5)
    )


def _ecommerce_table(seed: int, start: int, stop: int, drift: float = 0.0) -> tuple[pa.Table, np.ndarray]:
    """Rows [start, stop) of the e-commerce-like data: (Arrow table, (n,) float64 probabilities)."""
    u_user, u_item, u_device = _block_draws(
        seed,
        "interaction",
        start,
        stop,
        lambda rng, n: (rng.random(n), rng.random(n), rng.random(n)),
    )
    users = _users(seed, _drifted(_powerlaw_ranks(u_user, _NUM_USERS, _USER_EXPONENT), start, _NUM_USERS, drift))
    items = _items(seed, _drifted(_powerlaw_ranks(u_item, _NUM_ITEMS, _ITEM_EXPONENT), start, _NUM_ITEMS, drift))
    device = _pick(u_device, _DEVICE_WEIGHTS)
    prob = _sigmoid(_ecommerce_logit(seed, users, items, device))
    columns = {
        "user_id": pa.array(users.id),
        "item_id": pa.array(items.id),
        "user_age_bucket": pa.array(users.age, mask=users.age < 0),
        "user_country": pc.take(pa.array(_COUNTRIES), pa.array(users.country)),
        "user_activity": pa.array(users.activity),
        "item_category": pa.array(items.category),
        "item_brand": pa.array(items.brand),
        "item_price": pa.array(items.price),
        "device": pc.take(pa.array(_DEVICES), pa.array(device)),
        ECOMMERCE_LABEL: pa.array(_bernoulli(seed, ECOMMERCE_LABEL, start, stop, prob)),
    }
    return pa.table(columns), prob


# ------------------------------------------------------------------------- public API

# ------------------------------------------------------------------------- multi-hot

MULTIHOT_LABEL = "label"
MULTIHOT_COLUMN = "multi_hot"
# Rows per generator for the multi-hot ids: a block of slots * nnz ids per row is
# large, so its blocks are smaller than BLOCK_ROWS (a 65,536-row block of 1,000 ids
# would hold 500 MB).
_MULTIHOT_BLOCK = 1024
_MULTIHOT_EXPONENT = 1.05
_MULTIHOT_BIAS = -1.0


@functools.lru_cache(maxsize=4)
def _multihot_effects(seed: int, slots: int, vocabulary: int) -> np.ndarray:
    """(slots, vocabulary) hidden effect of each id of each slot on the click."""
    ids = np.arange(vocabulary)
    return np.stack([_hash_normal(_key(seed, "multi-hot", s), ids)[:, 0]
                     for s in range(slots)]).astype(np.float32)


def _multihot_table(seed: int, start: int, stop: int, *, slots: int = 100, nnz: int = 10,
                    vocabulary: int = 8192, layout: str = "nested",
                    drift: float = 0.0) -> tuple[pa.Table, np.ndarray]:
    """Rows [start, stop): ``slots`` x ``nnz`` ids per row plus a logistic label."""
    n = stop - start
    stream = _key(seed, "multi-hot-ids", slots, nnz, vocabulary) & 0xFFFFFFFF
    blocks = []
    for block in range(start // _MULTIHOT_BLOCK, -(-stop // _MULTIHOT_BLOCK)):
        rng = np.random.default_rng(np.random.SeedSequence([seed, stream, block]))
        u = rng.random((_MULTIHOT_BLOCK, slots, nnz), dtype=np.float32)
        lo = max(start - block * _MULTIHOT_BLOCK, 0)
        hi = min(stop - block * _MULTIHOT_BLOCK, _MULTIHOT_BLOCK)
        blocks.append(_powerlaw_ranks(u[lo:hi], vocabulary, _MULTIHOT_EXPONENT))
    ids = np.concatenate(blocks) if blocks else np.zeros((0, slots, nnz), np.int64)
    ids = _drifted(ids, start, vocabulary, drift)
    effects = _multihot_effects(seed, slots, vocabulary)
    total = np.zeros(n)
    for s in range(slots):  # one slot's small table at a time stays in cache
        total += np.take(effects[s], ids[:, s]).sum(axis=1)
    logit = _MULTIHOT_BIAS + total * (2.0 / math.sqrt(slots * nnz))
    prob = _sigmoid(logit)
    label = _bernoulli(seed, "multi-hot-label", start, stop, prob)
    flat = pa.array(ids.reshape(-1))
    columns: dict[str, pa.Array] = {MULTIHOT_LABEL: pa.array(label)}
    if layout == "nested":
        columns[MULTIHOT_COLUMN] = pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(flat, nnz), slots)
    else:
        for s in range(slots):
            columns[f"S{s + 1}"] = pa.FixedSizeListArray.from_arrays(
                pa.array(ids[:, s].reshape(-1)), nnz)
    assert len(label) == n
    return pa.table(columns), prob


def _multihot_options(key: str, options: dict[str, Any]) -> dict[str, Any]:
    """The checked keyword options of ``generate_data``/``write_data``: only the
    multi-hot dataset takes any."""
    if key != "multi-hot":
        if options:
            raise TypeError(f"dataset {key!r} takes no options {sorted(options)}; only "
                            "'multi-hot' takes slots=, nnz=, vocabulary=, layout=")
        return {}
    unknown = sorted(set(options) - {"slots", "nnz", "vocabulary", "layout"})
    if unknown:
        raise TypeError(f"unknown multi-hot options {unknown}; expected slots=, nnz=, "
                        "vocabulary=, layout=")
    out = {name: _check_int(name, options.get(name, default), 1)
           for name, default in (("slots", 100), ("nnz", 10), ("vocabulary", 8192))}
    layout = options.get("layout", "nested")
    if layout not in ("nested", "columns"):
        raise ValueError(f"layout must be 'nested' or 'columns', got {layout!r}")
    out["layout"] = layout
    return out


_TABLE_MAKERS = {"criteo": _criteo_table, "e-commerce": _ecommerce_table,
                 "multi-hot": _multihot_table}
_LABELS = {"criteo": CRITEO_LABEL, "e-commerce": ECOMMERCE_LABEL, "multi-hot": MULTIHOT_LABEL}


def _canonical_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"dataset name must be a str, got {type(name).__name__}: {name!r}")
    try:
        return _ALIASES[name.lower()]
    except KeyError:
        valid = ", ".join(repr(n) for n in DATASET_NAMES)
        raise ValueError(
            f"unknown synthetic dataset {name!r}; valid names: {valid} ('ecommerce' also works)"
        ) from None


def _check_int(what: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be an int, got bool {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(value).__name__}: {value!r}") from None
    if value < minimum:
        raise ValueError(f"{what} must be >= {minimum}, got {value}")
    return value


def _generate_table(name: str, start: int, stop: int, seed: int,
                    **options: Any) -> tuple[pa.Table, np.ndarray]:
    """Rows [start, stop) of dataset ``name`` as (Arrow table, (n,) float64 probabilities).

    The one place rows are made; write_data calls it once per chunk. ``options``:
    the dataset's (multi-hot) and ``drift`` when not 0.
    """
    return _TABLE_MAKERS[name](seed, start, stop, **options)


def _check_drift(drift: Any) -> float:
    if isinstance(drift, bool) or not isinstance(drift, (int, float)) or not math.isfinite(drift) or drift < 0:
        raise ValueError(f"drift must be a finite number >= 0 (ranks the popular values move per "
                         f"1,000 rows), got {drift!r}")
    return float(drift)


def _ranges(start: int, stop: int, step: int) -> Iterator[tuple[int, int]]:
    """[start, stop) cut into consecutive pieces of at most ``step`` rows."""
    for lo in range(start, stop, step):
        yield lo, min(lo + step, stop)


def generate_data(
    name: str,
    num_rows: int,
    seed: int = 0,
    return_probability: bool = False,
    *,
    start_row: int = 0,
    drift: float = 0.0,
    **options: Any,
) -> pd.DataFrame | tuple[pd.DataFrame, np.ndarray]:
    """Generate ``num_rows`` synthetic rows in memory.

    Args:
        name: ``"criteo"``, ``"e-commerce"`` (``"ecommerce"`` too) or ``"multi-hot"``.
        num_rows: rows to make.
        seed: non-negative int; the same seed gives the same rows.
        return_probability: also return the true click probability of each row.
        start_row: first row of the stream to return; rows [start_row, start_row +
            num_rows) equal the same rows of a longer call, so e.g. a validation set
            can continue where a training set stopped (same hidden model).
        drift: ids that drift, as in daily logs: at row ``i`` a categorical's
            popularity rank ``r`` stands for value ``(r + floor(i * drift / 1000))``
            modulo its vocabulary, so the popular values move on by ``drift`` values
            every 1,000 rows (Criteo's categoricals, e-commerce users and items,
            multi-hot ids). A value keeps its effect on the click. 0: no drift.
        options: multi-hot only: ``slots=100``, ``nnz=10`` ids per slot,
            ``vocabulary=8192`` ids per slot, ``layout="nested"`` (one
            ``multi_hot`` column of ``(slots, nnz)``) or ``"columns"`` (``S1`` ...).

    Returns:
        A DataFrame (columns ``CRITEO_COLUMNS`` or ``ECOMMERCE_COLUMNS``, in that
        order; the label is numpy int64, features are ``pd.ArrowDtype`` with real
        nulls), and with ``return_probability`` a ``(num_rows,)`` float64 array.

    >>> df = generate_data("criteo", 3)
    >>> list(df.columns[:3]), str(df["I1"].dtype), str(df["C1"].dtype)
    (['label', 'I1', 'I2'], 'int64[pyarrow]', 'string[pyarrow]')
    """
    key = _canonical_name(name)
    num_rows = _check_int("num_rows", num_rows, 0)
    seed = _check_int("seed", seed, 0)
    start_row = _check_int("start_row", start_row, 0)
    options = _multihot_options(key, options)
    if _check_drift(drift):
        options["drift"] = float(drift)
    stop = start_row + num_rows
    pieces = [
        _generate_table(key, lo, hi, seed, **options)
        for lo, hi in (list(_ranges(start_row, stop, DEFAULT_CHUNK_ROWS)) or [(start_row, stop)])
    ]
    table = pa.concat_tables([t for t, _ in pieces])
    label = _LABELS[key]
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    frame[label] = table.column(label).to_numpy().astype(np.int64)
    if return_probability:
        return frame, np.concatenate([p for _, p in pieces])
    return frame


def _plain_columns(name: str) -> frozenset[str]:
    """Columns of dataset ``name`` too varied for a parquet dictionary to pay off.

    The writer would build a dictionary, overflow it and fall back to plain pages:
    skipping that saves about a quarter of criteo's write time.
    """
    if name != "criteo":
        return frozenset()
    return frozenset(c for c, spec in _CRITEO_CAT_SPECS.items() if spec.vocab > _TABLE_MAX_VOCAB)


# A null is written as an empty field. pyarrow 26 takes that as ``null_string=""``;
# older releases (>= 17, our floor; the GPU image has 25) have no such option and
# already write nulls as empty fields.
_TSV_KWARGS = {"include_header": False, "delimiter": "\t", "quoting_style": "none"}
try:
    _TSV_OPTIONS = pacsv.WriteOptions(**_TSV_KWARGS, null_string="")
except TypeError:
    _TSV_OPTIONS = pacsv.WriteOptions(**_TSV_KWARGS)


#: what :func:`write_data` writes into its folder: data files, the ``.tmp`` file of one
#: being written (left by a killed run), and the same in ``probabilities/``
_OWN_FILE = re.compile(r"part_\d{5,}\.(?:parquet|tsv)(?:\.tmp)?")
_PROB_DIR = "probabilities"


def earlier_run_files(output_dir: str) -> tuple[list[str], list[str]]:
    """The files an earlier :func:`write_data` left in ``output_dir`` (paths, to be
    removed before writing) and the other entries (names relative to the folder):
    their rows would be read with the new ones, and they are not this writer's to
    remove.

    ``output_dir``: ``part_00000.tsv  probabilities/part_00000.parquet  notes.txt``
    -> (the two paths, ``["notes.txt"]``).
    """
    if not os.path.lexists(output_dir):
        return [], []
    if not os.path.isdir(output_dir):
        raise FileExistsError(f"cannot write synthetic data to {output_dir!r}: it exists and is "
                              "not a folder; pass a new or empty folder")
    own: list[str] = []
    foreign: list[str] = []
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if _OWN_FILE.fullmatch(name) and os.path.isfile(path) and not os.path.islink(path):
            own.append(path)
        elif name == _PROB_DIR and os.path.isdir(path) and not os.path.islink(path):
            for sub in sorted(os.listdir(path)):
                sub_path = os.path.join(path, sub)
                if _OWN_FILE.fullmatch(sub) and os.path.isfile(sub_path) and not os.path.islink(sub_path):
                    own.append(sub_path)
                else:
                    foreign.append(f"{_PROB_DIR}/{sub}")
        else:
            foreign.append(name)
    return own, foreign


class _AtomicFile:
    """Writes Arrow tables to ``path`` through ``path + '.tmp'``, renamed on success.

    Opened lazily on the first table, so the schema comes from the data.
    """

    def __init__(
        self, path: str, fmt: str, row_group_size: int, plain: frozenset[str] = frozenset()
    ) -> None:
        self.path, self.fmt, self.row_group_size = path, fmt, row_group_size
        self.plain = plain  # parquet columns written without a dictionary
        self.tmp = path + ".tmp"
        self.writer: pq.ParquetWriter | pacsv.CSVWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self.fmt == "parquet":
            if self.writer is None:
                dictionary = [c for c in table.column_names if c not in self.plain]
                self.writer = pq.ParquetWriter(self.tmp, table.schema, use_dictionary=dictionary)
            self.writer.write_table(table, row_group_size=self.row_group_size)
        else:
            if self.writer is None:
                self.writer = pacsv.CSVWriter(self.tmp, table.schema, write_options=_TSV_OPTIONS)
            self.writer.write_table(table)

    def __enter__(self) -> _AtomicFile:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self.writer is None:  # nothing was written (an unused probabilities file)
            return
        self.writer.close()
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            os.remove(self.tmp)


def write_data(
    name: str,
    output_dir: str | os.PathLike[str],
    num_rows: int,
    num_files: int = 1,
    fmt: str = "parquet",
    seed: int = 0,
    row_group_size: int = 100_000,
    *,
    return_probability: bool = False,
    start_row: int = 0,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    drift: float = 0.0,
    **options: Any,
) -> list[str]:
    """Write ``num_rows`` synthetic rows to ``num_files`` files, in bounded memory.

    Files are ``output_dir/part_00000.parquet`` (or ``.tsv``), ... holding
    consecutive row ranges; row i is the same whatever ``num_files`` or
    ``chunk_rows``, and concatenating the TSV files gives the bytes of one file.
    TSV is Criteo's raw format: no header, tab separated, empty field = null,
    columns in ``CRITEO_COLUMNS`` / ``ECOMMERCE_COLUMNS`` order; read it back with
    ``CRITEO_DTYPES`` / ``ECOMMERCE_DTYPES``.

    Args:
        name, seed, start_row, drift: as in :func:`generate_data` (with ``drift``,
            the files of consecutive rows are consecutive "days" of drifting ids).
        output_dir: local folder, created if needed. A folder of an earlier run
            (``part_*`` files, ``probabilities/``) has those files removed first, so
            it holds only this run's; a folder holding anything else is refused
            (FileExistsError naming the entries) before anything is written or removed.
        num_files: 1 <= num_files <= num_rows.
        fmt: ``"parquet"`` or ``"tsv"``.
        row_group_size: parquet rows per row group (capped by ``chunk_rows``).
        return_probability: also write ``output_dir/probabilities/part_00000.parquet``
            ..., one float64 column ``"probability"`` aligned row for row with the
            data files (the oracle for AUC checks).
        chunk_rows: most rows generated and held at once (rounded down to whole
            row groups); memory grows with it, not with ``num_rows``.
        options: as in :func:`generate_data` (multi-hot only).

    Returns:
        The data files' paths, in row order.
    """
    key = _canonical_name(name)
    num_rows = _check_int("num_rows", num_rows, 1)
    num_files = _check_int("num_files", num_files, 1)
    seed = _check_int("seed", seed, 0)
    row_group_size = _check_int("row_group_size", row_group_size, 1)
    start_row = _check_int("start_row", start_row, 0)
    chunk_rows = _check_int("chunk_rows", chunk_rows, 1)
    options = _multihot_options(key, options)
    if _check_drift(drift):
        options["drift"] = float(drift)
    if key == "multi-hot" and fmt != "parquet":
        raise ValueError("the multi-hot dataset holds lists: write it with fmt='parquet'")
    if num_files > num_rows:
        raise ValueError(
            f"num_files={num_files} is more than num_rows={num_rows}; every file needs a row"
        )
    if fmt not in _FORMATS:
        raise ValueError(f"unknown fmt {fmt!r}; expected one of: {', '.join(_FORMATS)}")
    # whole row groups per chunk, so the files' layout does not depend on chunk_rows
    if row_group_size <= chunk_rows:
        chunk_rows -= chunk_rows % row_group_size

    output_dir = os.fspath(output_dir)
    # the files of an earlier run would be read with this run's rows
    stale, foreign = earlier_run_files(output_dir)
    if foreign:
        raise FileExistsError(
            f"cannot write synthetic data to {output_dir!r}: the folder holds {listed(foreign)}, "
            "which are not files of an earlier synthetic run (part_NNNNN.parquet or .tsv, "
            "probabilities/) and would be read as rows with the new ones; write into a new or "
            "empty folder, or move them out")
    for path in stale:
        os.remove(path)
    os.makedirs(output_dir, exist_ok=True)
    prob_dir = os.path.join(output_dir, _PROB_DIR)
    if return_probability:
        os.makedirs(prob_dir, exist_ok=True)
    elif os.path.isdir(prob_dir) and not os.listdir(prob_dir):
        os.rmdir(prob_dir)  # emptied above: an earlier run's
    paths = []
    for index in range(num_files):
        lo = start_row + index * num_rows // num_files
        hi = start_row + (index + 1) * num_rows // num_files
        path = os.path.join(output_dir, f"part_{index:05d}.{fmt}")
        prob_path = os.path.join(prob_dir, f"part_{index:05d}.parquet")
        with (
            _AtomicFile(path, fmt, row_group_size, _plain_columns(key)) as data_file,
            _AtomicFile(prob_path, "parquet", row_group_size) as prob_file,
        ):
            for c_lo, c_hi in _ranges(lo, hi, chunk_rows):
                table, prob = _generate_table(key, c_lo, c_hi, seed, **options)
                data_file.write(table)
                if return_probability:
                    prob_file.write(pa.table({"probability": prob}))
                del table, prob  # free the chunk before making the next
        paths.append(path)
    return paths

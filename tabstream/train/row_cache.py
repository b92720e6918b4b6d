"""What the torch and Keras ``CachedEmbeddings`` share, numpy only (no
framework): the bookkeeping of a bounded cache of one table's rows
(:class:`RowCache`) and the choice of the server's tables a cache serves
(:func:`served_tables`).

A cache of one table holds at most ``capacity`` rows in slots ``0..capacity-1``;
``slot`` maps a cached id to its slot, ``keys`` a slot to its id (``-1``: free),
``used`` the clock of its last use. Rows are evicted least recently used first.

    >>> cache = RowCache(capacity=2, dim=1)
    >>> cache.put(np.array([10, 11]), np.array([[1.0], [2.0]], np.float32))
    >>> cache.clock += 1; cache.used[cache.find(np.array([11]))] = cache.clock   # 11 used again
    >>> cache.put(np.array([12]), np.array([[3.0]], np.float32))   # evicts 10, the oldest
    >>> cache.find(np.array([10, 11, 12])).tolist()
    [-1, 1, 0]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tabstream.core.errors import SchemaError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig

__all__ = ["RowCache", "check_cache_args", "served_tables"]


class RowCache:
    """At most ``capacity`` rows of one table, least recently used evicted first."""

    def __init__(self, capacity: int, dim: int) -> None:
        self.capacity = capacity
        self.rows = np.zeros((capacity, dim), np.float32)
        self.keys = np.full(capacity, -1, np.int64)
        self.used = np.zeros(capacity, np.int64)
        self.slot: dict[int, int] = {}
        self.free = list(range(capacity - 1, -1, -1))
        self.clock = 0
        self.hits = self.misses = 0

    def find(self, ids: np.ndarray) -> np.ndarray:
        get = self.slot.get
        return np.fromiter((get(i, -1) for i in ids.tolist()), np.int64, len(ids))

    def put(self, ids: np.ndarray, rows: np.ndarray, keep: np.ndarray | None = None) -> None:
        """Cache ``rows`` of ``ids`` (none of them cached yet), evicting the least
        recently used cached rows but never the slots in ``keep`` (the batch's hits).
        Ids beyond the room left are not cached (they were served all the same)."""
        slots = self.place(ids, keep)
        self.rows[slots] = rows[:len(slots)]

    def place(self, ids: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
        """Give slots to ``ids`` (none of them cached yet), as :meth:`put` does, and
        return them: one per id, for the first ``capacity - len(keep)`` ids. The
        caller writes their rows (a cache whose rows live elsewhere, e.g. in a
        Keras variable, is made with ``dim=0``)."""
        keep = np.zeros(0, np.int64) if keep is None else np.unique(keep)
        n = min(len(ids), self.capacity - len(keep))
        ids = ids[:n]
        need = n - len(self.free)
        if need > 0:
            # victims are taken from occupied slots only: a free slot chosen here
            # would go on the free list twice and two ids would share it
            candidates = np.setdiff1d(np.flatnonzero(self.keys >= 0), keep, assume_unique=True)
            victims = candidates[np.argpartition(self.used[candidates], need - 1)[:need]]
            for key in self.keys[victims].tolist():
                del self.slot[key]
            self.keys[victims] = -1
            self.free.extend(victims.tolist())
        slots = np.array([self.free.pop() for _ in range(n)], np.int64)
        self.keys[slots] = ids
        self.used[slots] = self.clock
        self.slot.update(zip(ids.tolist(), slots.tolist()))
        return slots

    def check(self) -> None:
        """Assert the bookkeeping: each slot holds at most one id, each cached id
        one slot, and free + used slots = capacity (for tests)."""
        occupied = np.flatnonzero(self.keys >= 0)
        assert len(set(self.free)) == len(self.free), "a slot is on the free list twice"
        assert not set(self.free) & set(occupied.tolist()), "a free slot holds an id"
        assert len(self.free) + len(occupied) == self.capacity, "free + used != capacity"
        assert len(self.slot) == len(occupied), "cached ids and occupied slots differ"
        assert all(self.keys[s] == k for k, s in self.slot.items()), "an id points at another's slot"

    def clear(self) -> None:
        self.keys[:] = -1
        self.slot.clear()
        self.free = list(range(self.capacity - 1, -1, -1))

    def __len__(self) -> int:
        return len(self.slot)


def check_cache_args(ps: Any, cache_rows: Any) -> None:
    """``CachedEmbeddings``' two arguments: a :class:`ParameterServer` and an int >= 1."""
    if not isinstance(ps, ParameterServer):
        raise TypeError(f"CachedEmbeddings: ps must be a ParameterServer, got {type(ps).__name__}")
    if isinstance(cache_rows, bool) or not isinstance(cache_rows, int) or cache_rows < 1:
        raise ValueError(f"CachedEmbeddings: cache_rows must be an int >= 1, got {cache_rows!r}")


def served_tables(ps: ParameterServer, tables: Any) -> tuple[tuple[TableConfig, ...], dict[str, str]]:
    """``(configs, feature -> table)`` of the tables of ``ps`` a cache serves:
    ``tables`` (a name or names), or by default, for each feature, the first table
    that lists it (a server may hold a second table for a feature, as Wide&Deep's
    wide tables, served by a second cache with ``tables=``)."""
    if tables is None:
        names = list(dict.fromkeys(ps.feature_to_table.values()))
        names += [c.name for c in ps.configs if not c.feature_names]
    else:
        names = [tables] if isinstance(tables, str) else list(tables)
        unknown = sorted(set(names) - {c.name for c in ps.configs})
        if unknown:
            raise SchemaError(f"CachedEmbeddings: parameter server {ps.path} has no tables "
                              f"{unknown}; it has {[c.name for c in ps.configs]}")
    configs = tuple(c for c in ps.configs if c.name in names)
    feature_to_table: dict[str, str] = {}
    for cfg in configs:
        for f in cfg.feature_names:
            if f in feature_to_table:
                raise ValueError(
                    f"CachedEmbeddings: feature {f!r} is in tables {feature_to_table[f]!r} and "
                    f"{cfg.name!r}; serve them with two modules (tables=...)"
                )
            feature_to_table[f] = cfg.name
    return configs, feature_to_table

"""The id -> slot index of a disk ParameterServer table (format 3, packed records).

A table's records are packed in its slot file in the order rows were first
written; ``<table>.slots.i64`` holds the id of each slot, in slot order (slot k
is the k-th entry), appended as slots are given out. At open the entries up to
the committed count are read and sorted into this index: a sorted id array and
the slot of each, plus a small sorted array of the ids added since, merged in
when it grows past a sixteenth of the main one (an insertion of sorted ids into
a sorted array, no sort). Lookups are vectorised binary searches
(``np.searchsorted``); 16 bytes per row ever written.

    >>> index = SlotIndex()
    >>> index.add(np.array([40, 7]), np.array([0, 1]))
    >>> index.find(np.array([7, 8, 40])).tolist()       # -1: no slot (never written)
    [1, -1, 0]
    >>> index.keep_below(1)                             # slots >= 1 cut (a rollback)
    >>> index.find(np.array([7, 40])).tolist()
    [-1, 0]
"""

from __future__ import annotations

import numpy as np

__all__ = ["SlotIndex"]

_EMPTY = np.zeros(0, np.int64)


def _probe(keys: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """``values`` of ``ids`` in sorted ``keys``, -1 where absent."""
    if not len(keys):
        return np.full(len(ids), -1, np.int64)
    at = np.searchsorted(keys, ids)
    np.minimum(at, len(keys) - 1, out=at)
    return np.where(keys[at] == ids, values[at], -1)


def _insert(keys: np.ndarray, values: np.ndarray, new_keys: np.ndarray,
            new_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``new_keys`` (absent from ``keys``) inserted in order."""
    order = np.argsort(new_keys, kind="stable")
    new_keys, new_values = new_keys[order], new_values[order]
    at = np.searchsorted(keys, new_keys)
    return np.insert(keys, at, new_keys), np.insert(values, at, new_values)


class SlotIndex:
    """Which slot holds each written id (see the module's docstring)."""

    def __init__(self, ids: np.ndarray | None = None) -> None:
        """``ids``: the id of each slot, in slot order (slot k holds ``ids[k]``)."""
        if ids is None or not len(ids):
            base = (_EMPTY, _EMPTY)
        else:
            order = np.argsort(ids, kind="stable")
            base = (np.asarray(ids, np.int64)[order], order.astype(np.int64))
        # one tuple, replaced whole: a reader in another thread (read_ahead) sees
        # the index before or after an add, never half of one
        self._state = (*base, _EMPTY, _EMPTY)

    def __len__(self) -> int:
        return len(self._state[0]) + len(self._state[2])

    def repeated(self) -> int | None:
        """An id that more than one slot holds (None: each id has one slot), among
        those given at construction; ``add`` takes only ids that have no slot.

        >>> SlotIndex(np.array([4, 0, 0])).repeated(), SlotIndex(np.array([4, 0])).repeated()
        (0, None)
        """
        ids = self._state[0]
        same = np.flatnonzero(ids[1:] == ids[:-1])
        return int(ids[same[0]]) if len(same) else None

    def find(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each of ``ids`` (int64), -1 for ids that have none."""
        base_ids, base_slots, delta_ids, delta_slots = self._state
        out = _probe(base_ids, base_slots, ids)
        if len(delta_ids):
            out = np.where(out < 0, _probe(delta_ids, delta_slots, ids), out)
        return out

    def add(self, ids: np.ndarray, slots: np.ndarray) -> None:
        """Record new ``ids`` (none of them already here) at ``slots``."""
        if not len(ids):
            return
        base_ids, base_slots, delta_ids, delta_slots = self._state
        delta_ids, delta_slots = _insert(delta_ids, delta_slots, np.asarray(ids, np.int64),
                                         np.asarray(slots, np.int64))
        if len(delta_ids) > max(1 << 14, len(base_ids) >> 4):
            base_ids, base_slots = _insert(base_ids, base_slots, delta_ids, delta_slots)
            delta_ids, delta_slots = _EMPTY, _EMPTY
        self._state = (base_ids, base_slots, delta_ids, delta_slots)

    def keep_below(self, count: int) -> None:
        """Drop the ids of slots ``>= count`` (slots given out after a mark)."""
        base_ids, base_slots, delta_ids, delta_slots = self._state
        keep, keep_delta = base_slots < count, delta_slots < count
        self._state = (base_ids[keep], base_slots[keep], delta_ids[keep_delta],
                       delta_slots[keep_delta])

"""The living vocabulary's policy: admission, eviction and id recycling (no framework).

A vocabulary is a list of *slots* (slot ``p`` is Categorify's id ``first + p``) plus
the *candidates*: values counted but not (yet) in the vocabulary. Every value,
kept or candidate, has a running count (the sum of its counts since it was last
evicted, the fit's included), a score (the running count, or under
``eviction="decay"`` the decayed count) and the last update it was seen in (the
fit is update 0). :func:`fold` folds one update's counts into a vocabulary:

1. ``eviction="decay"``: every score is multiplied by ``decay`` first.
2. The counts are added to the values' running counts and scores; kept values
   keep their slot, unseen ones become candidates.
3. Candidates whose score reaches ``freq_threshold`` are *eligible*, best first
   (score descending, then value ascending: the fit's order).
4. Without a ``capacity`` every eligible value is admitted into a new slot, and
   nothing is evicted. With one, eligible values first fill the free slots; the
   rest may each evict a kept value:

   * ``"lru"`` (least recently seen): kept values not seen in the last ``window``
     updates are evictable, the least recently seen first (then lowest score, then
     value); each remaining eligible value evicts one of them while any are left.
   * ``"decay"`` (lowest decayed count): kept values ranked by score ascending
     (then least recently seen, then value); an eligible value evicts the lowest
     ranked one left while its score is strictly higher.

5. The admitted values, best first, take the evicted slots in ascending order
   (their ids are *recycled*), then new slots at the end. Evicted values are
   forgotten: seen again, they count from zero as new candidates. Eligible values
   left without a slot stay candidates.

So the slots of kept values never change, the vocabulary never exceeds
``capacity``, and slots leave no holes (a slot is freed only for a value taking it).

>>> import pyarrow as pa
>>> vocab = Vocabulary.fitted(pa.table({"values": ["a", "b"], "counts": [5, 3]}),
...                           pa.table({"values": ["c"], "counts": [1]}))
>>> policy = VocabularyPolicy(freq_threshold=2, capacity=2)
>>> vocab, change = fold(vocab, pa.table({"values": ["a", "c"], "counts": [1, 4]}), policy)
>>> vocab.values.to_pylist(), change.admitted["value"].to_pylist(), change.evicted["value"].to_pylist()
(['a', 'c'], ['c'], ['b'])
>>> change.recycled.tolist()         # b's slot went to c
[1]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import sort_indices, widen_half

__all__ = ["EVICTIONS", "Vocabulary", "VocabularyChange", "VocabularyPolicy", "fold"]

#: the eviction policies
EVICTIONS = ("lru", "decay")


@dataclass(frozen=True)
class VocabularyPolicy:
    """How a vocabulary updates (see the module docs).

    freq_threshold: a candidate is admitted once its score reaches it (0 or 1: at once).
    capacity: the most slots (values) the vocabulary holds; None: no limit, nothing
        is evicted.
    eviction: ``"lru"`` or ``"decay"``.
    window: ``"lru"``: values seen in the last ``window`` updates are never evicted.
    decay: ``"decay"``: scores are multiplied by it at every update, in ``(0, 1]``.
    """

    freq_threshold: int = 0
    capacity: int | None = None
    eviction: str = "lru"
    window: int = 1
    decay: float = 0.5

    def __post_init__(self) -> None:
        check_policy(self.eviction, self.window, self.decay)
        if self.capacity is not None and self.capacity < 1:
            raise ValueError(f"VocabularyPolicy: capacity must be positive or None, got {self.capacity!r}")
        if self.freq_threshold < 0:
            raise ValueError(f"VocabularyPolicy: freq_threshold must be >= 0, got {self.freq_threshold!r}")


def check_policy(eviction: object, window: object, decay: object, who: str = "VocabularyPolicy") -> None:
    """Validate the policy settings (Categorify calls it in its constructor)."""
    if eviction not in EVICTIONS:
        raise ValueError(f"{who}: eviction must be one of {EVICTIONS} (least recently seen, lowest "
                         f"decayed count), got {eviction!r}")
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise ValueError(f"{who}: window must be a positive number of updates, got {window!r}")
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0 < decay <= 1:
        raise ValueError(f"{who}: decay must be a number in (0, 1], got {decay!r}")


def _empty_candidates(value_type: pa.DataType) -> pa.Table:
    return pa.table({"values": pa.array([], value_type), "counts": pa.array([], pa.int64()),
                     "scores": pa.array([], pa.float64()), "last": pa.array([], pa.int64())})


@dataclass(frozen=True)
class Vocabulary:
    """One vocabulary's slots and candidates; tables with columns ``values``,
    ``counts`` (int64 running counts), ``scores`` (float64) and ``last`` (int64, the
    last update seen in). ``slots`` is in slot order; ``candidates`` in no order."""

    slots: pa.Table
    candidates: pa.Table
    step: int = 0

    @classmethod
    def fitted(cls, kept: pa.Table, candidates: pa.Table | None = None, step: int = 0) -> Vocabulary:
        """From a fit's tables ``(values, counts)`` (kept in id order); missing
        ``scores``/``last`` columns are the counts / update 0; null counts (a given
        vocabulary) count 0."""
        return cls(_complete(kept), _complete(candidates) if candidates is not None
                   else _empty_candidates(kept.schema.field("values").type), step)

    @property
    def values(self) -> pa.Array:
        return self.slots["values"].combine_chunks()


def _complete(table: pa.Table) -> pa.Table:
    counts = pc.fill_null(table["counts"], 0).cast(pa.int64()).combine_chunks()
    scores = table["scores"].combine_chunks().cast(pa.float64()) if "scores" in table.column_names \
        else counts.cast(pa.float64())
    last = table["last"].combine_chunks().cast(pa.int64()) if "last" in table.column_names \
        else pa.array(np.zeros(table.num_rows, np.int64))
    return pa.table({"values": table["values"].combine_chunks(), "counts": counts,
                     "scores": scores, "last": last})


@dataclass(frozen=True)
class VocabularyChange:
    """What one update changed: ``admitted`` and ``evicted`` are tables ``(slot,
    value)`` (admitted in admission order, evicted by slot); ``recycled`` the slots
    that changed value (evicted, then given to an admitted value)."""

    admitted: pa.Table
    evicted: pa.Table
    recycled: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def _index_in(values: pa.Array, value_set: pa.Array) -> np.ndarray:
    """Position of each of ``values`` in ``value_set`` (-1: absent)."""
    if not len(values):
        return np.zeros(0, np.int64)
    if not len(value_set):
        return np.full(len(values), -1, np.int64)
    pos = pc.index_in(widen_half(values), value_set=widen_half(value_set))
    return pc.fill_null(pos, -1).to_numpy().astype(np.int64)


def fold(vocab: Vocabulary, counts: pa.Table, policy: VocabularyPolicy) -> tuple[Vocabulary, VocabularyChange]:
    """Fold one update's counts (a table ``(values, counts)``, each value once,
    no missing value) into ``vocab`` (see the module docs); ``vocab`` is unchanged."""
    step = vocab.step + 1
    value_type = vocab.slots.schema.field("values").type
    new_values = counts["values"].combine_chunks()
    if new_values.type != value_type and len(vocab.slots) + len(vocab.candidates):
        new_values = new_values.cast(value_type)
    elif new_values.type != value_type:
        value_type = new_values.type
    new_counts = pc.fill_null(counts["counts"], 0).cast(pa.int64()).combine_chunks().to_numpy()
    factor = policy.decay if policy.eviction == "decay" else 1.0

    # 1-2: kept values
    s_counts = vocab.slots["counts"].to_numpy().copy()
    s_scores = vocab.slots["scores"].to_numpy().copy() * factor
    s_last = vocab.slots["last"].to_numpy().copy()
    pos = _index_in(new_values, vocab.values)
    hit = pos >= 0
    np.add.at(s_counts, pos[hit], new_counts[hit])
    np.add.at(s_scores, pos[hit], new_counts[hit].astype(np.float64))
    s_last[pos[hit]] = step
    # candidates, old and new
    cand = vocab.candidates
    c_values = cand["values"].combine_chunks()
    if c_values.type != value_type:
        c_values = c_values.cast(value_type)
    c_counts = cand["counts"].to_numpy().copy()
    c_scores = cand["scores"].to_numpy().copy() * factor
    c_last = cand["last"].to_numpy().copy()
    rest = np.flatnonzero(~hit)
    rest_values = new_values.take(pa.array(rest, pa.int64()))
    cpos = _index_in(rest_values, c_values)
    old = cpos >= 0
    np.add.at(c_counts, cpos[old], new_counts[rest[old]])
    np.add.at(c_scores, cpos[old], new_counts[rest[old]].astype(np.float64))
    c_last[cpos[old]] = step
    fresh = rest[~old]
    c_values = pa.concat_arrays([c_values, new_values.take(pa.array(fresh, pa.int64()))])
    c_counts = np.concatenate([c_counts, new_counts[fresh]])
    c_scores = np.concatenate([c_scores, new_counts[fresh].astype(np.float64)])
    c_last = np.concatenate([c_last, np.full(len(fresh), step, np.int64)])

    # 3: eligible candidates, best first
    eligible = np.flatnonzero(c_scores >= policy.freq_threshold) if policy.freq_threshold > 0 \
        else np.arange(len(c_values))
    if len(eligible):
        keys = pa.table({"s": c_scores[eligible], "v": c_values.take(pa.array(eligible, pa.int64()))})
        eligible = eligible[sort_indices(keys, [("s", "descending"), ("v", "ascending")]).to_numpy()]

    # 4: free slots, then evictions
    n_slots = len(s_counts)
    free = len(eligible) if policy.capacity is None else max(policy.capacity - n_slots, 0)
    n_free = min(free, len(eligible))
    waiting = eligible[n_free:]
    evicted = np.zeros(0, np.int64)
    if len(waiting) and n_slots:
        slot_values = vocab.values
        if policy.eviction == "lru":
            evictable = np.flatnonzero(s_last <= step - policy.window)
            order = [("l", "ascending"), ("s", "ascending"), ("v", "ascending")]
        else:
            evictable = np.arange(n_slots)
            order = [("s", "ascending"), ("l", "ascending"), ("v", "ascending")]
        if len(evictable):
            keys = pa.table({"s": s_scores[evictable], "l": s_last[evictable],
                             "v": slot_values.take(pa.array(evictable, pa.int64()))})
            evictable = evictable[sort_indices(keys, order).to_numpy()]
            k = min(len(waiting), len(evictable))
            if policy.eviction == "decay":
                beats = c_scores[waiting[:k]] > s_scores[evictable[:k]]
                k = int(np.argmin(beats)) if not beats.all() else k
            evicted = evictable[:k]
    admitted = eligible[:n_free + len(evicted)]

    # 5: slots for the admitted: the evicted ones ascending, then new ones
    recycled = np.sort(evicted)
    slots = np.concatenate([recycled, np.arange(n_slots, n_slots + len(admitted) - len(recycled))])
    slots = slots.astype(np.int64)
    old_values = vocab.values
    evicted_table = pa.table({"slot": pa.array(recycled, pa.int64()),
                              "value": old_values.take(pa.array(recycled, pa.int64()))})
    adm = pa.array(admitted, pa.int64())
    admitted_values = c_values.take(adm)
    grow = len(slots) - len(recycled)
    out_values = pa.concat_arrays([old_values if old_values.type == value_type else old_values.cast(value_type),
                                   pa.nulls(grow, value_type)])
    if len(slots):
        # replace slot values: positions ``slots`` take ``admitted_values``
        index = np.arange(len(out_values))
        source = np.full(len(out_values), -1, np.int64)
        source[slots] = np.arange(len(slots))
        mask = source >= 0
        merged = pa.concat_arrays([out_values, admitted_values])
        index[mask] = len(out_values) + source[mask]
        out_values = merged.take(pa.array(index, pa.int64()))
    out_counts = np.concatenate([s_counts, np.zeros(grow, np.int64)])
    out_scores = np.concatenate([s_scores, np.zeros(grow, np.float64)])
    out_last = np.concatenate([s_last, np.zeros(grow, np.int64)])
    out_counts[slots] = c_counts[admitted]
    out_scores[slots] = c_scores[admitted]
    out_last[slots] = c_last[admitted]
    keep = np.ones(len(c_values), bool)
    keep[admitted] = False
    kept_idx = pa.array(np.flatnonzero(keep), pa.int64())
    new_slots = pa.table({"values": out_values, "counts": out_counts, "scores": out_scores, "last": out_last})
    new_cand = pa.table({"values": c_values.take(kept_idx), "counts": c_counts[keep],
                         "scores": c_scores[keep], "last": c_last[keep]})
    change = VocabularyChange(pa.table({"slot": pa.array(slots, pa.int64()), "value": admitted_values}),
                              evicted_table, recycled)
    return replace(vocab, slots=new_slots, candidates=new_cand, step=step), change

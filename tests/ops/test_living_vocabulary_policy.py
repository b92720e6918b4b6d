"""The living vocabulary's policy (tabstream.ops.vocabulary_policy) against a
plain-Python reference of the same rules: dicts, sorted(), one value at a time."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabstream.ops.vocabulary_policy import Vocabulary, VocabularyPolicy, fold


class Reference:
    """The policy written the obvious way: kept = {slot: value}, per value its
    running count, score and last update."""

    def __init__(self, kept: list[tuple[str, int]], candidates: list[tuple[str, int]], policy: VocabularyPolicy):
        self.policy = policy
        self.slot = {v: i for i, (v, _) in enumerate(kept)}
        self.info = {v: [c, float(c), 0] for v, c in kept}  # count, score, last
        self.cand = {v: [c, float(c), 0] for v, c in candidates}
        self.step = 0

    def update(self, counts: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
        p = self.policy
        self.step += 1
        t = self.step
        if p.eviction == "decay":
            for d in (self.info, self.cand):
                for rec in d.values():
                    rec[1] = rec[1] * p.decay
        for v, c in counts.items():
            rec = self.info.get(v) or self.cand.setdefault(v, [0, 0.0, t])
            rec[0] += c
            rec[1] += float(c)
            rec[2] = t
        eligible = sorted((v for v, r in self.cand.items() if p.freq_threshold <= 0 or r[1] >= p.freq_threshold),
                          key=lambda v: (-self.cand[v][1], v))
        free = len(eligible) if p.capacity is None else max(p.capacity - len(self.slot), 0)
        n_free = min(free, len(eligible))
        waiting = eligible[n_free:]
        if p.eviction == "lru":
            evictable = sorted((v for v in self.slot if self.info[v][2] <= t - p.window),
                               key=lambda v: (self.info[v][2], self.info[v][1], v))
        else:
            evictable = sorted(self.slot, key=lambda v: (self.info[v][1], self.info[v][2], v))
        evicted = []
        for w, e in zip(waiting, evictable):
            if p.eviction == "decay" and not self.cand[w][1] > self.info[e][1]:
                break
            evicted.append(e)
        freed = sorted(self.slot.pop(e) for e in evicted)
        for e in evicted:
            del self.info[e]
        admitted = eligible[:n_free + len(evicted)]
        next_slot = len(self.slot) + len(freed)
        out = {}
        for v in admitted:
            if freed:
                s = freed.pop(0)
            else:
                s, next_slot = next_slot, next_slot + 1
            self.slot[v] = s
            self.info[v] = self.cand.pop(v)
            out[v] = s
        return out, {e: None for e in evicted}  # type: ignore[misc]


def _table(counts: dict[str, int]) -> pa.Table:
    return pa.table({"values": pa.array(list(counts), pa.string()),
                     "counts": pa.array(list(counts.values()), pa.int64())})


def _run(policy: VocabularyPolicy, fit: dict[str, int], days: list[dict[str, int]]) -> None:
    """Fold ``days`` into the vocabulary fitted on ``fit`` both ways and compare after
    every update: slots, admitted, evicted, recycled; kept slots never change."""
    ordered = sorted(fit.items(), key=lambda kv: (-kv[1], kv[0]))
    limit = policy.capacity
    kept = [(v, c) for v, c in ordered if policy.freq_threshold <= 0 or c >= policy.freq_threshold][:limit]
    cands = [(v, c) for v, c in ordered if (v, c) not in kept]
    ref = Reference(kept, cands, policy)
    vocab = Vocabulary.fitted(_table(dict(kept)) if kept else pa.table(
        {"values": pa.array([], pa.string()), "counts": pa.array([], pa.int64())}), _table(dict(cands)))
    for day in days:
        before = dict(zip(vocab.values.to_pylist(), range(len(vocab.slots))))
        vocab, change = fold(vocab, _table(day), policy)
        admitted, evicted = ref.update(day)
        slots = vocab.values.to_pylist()
        assert {v: i for i, v in enumerate(slots)} == ref.slot
        assert dict(zip(change.admitted["value"].to_pylist(), change.admitted["slot"].to_pylist())) == admitted
        assert set(change.evicted["value"].to_pylist()) == set(evicted)
        assert sorted(change.recycled.tolist()) == sorted(before[e] for e in evicted)
        # kept values keep their slot; recycled slots come from evicted values
        for v, s in before.items():
            if v not in evicted:
                assert slots[s] == v
        assert set(change.recycled.tolist()) <= {before[e] for e in evicted}
        if policy.capacity is not None:
            assert len(slots) <= policy.capacity
        assert None not in slots  # no hole
        np.testing.assert_array_equal(vocab.slots["counts"].to_numpy(), [ref.info[v][0] for v in slots])
        np.testing.assert_array_equal(vocab.slots["scores"].to_numpy(), [ref.info[v][1] for v in slots])
        cand = dict(zip(vocab.candidates["values"].to_pylist(), vocab.candidates["counts"].to_pylist()))
        assert cand == {v: r[0] for v, r in ref.cand.items()}


@pytest.mark.parametrize("eviction", ["lru", "decay"])
@pytest.mark.parametrize("seed", [0, 1])
def test_ten_updates_match_the_reference(eviction: str, seed: int) -> None:
    rng = random.Random(seed)
    # drifting ids: day d draws mostly from values d*5 .. d*5+30
    def day(d: int) -> dict[str, int]:
        out: dict[str, int] = {}
        for _ in range(200):
            v = f"v{d * 5 + int(rng.expovariate(0.1)) % 30:03d}"
            out[v] = out.get(v, 0) + 1
        return out

    policy = VocabularyPolicy(freq_threshold=4, capacity=20, eviction=eviction, window=2, decay=0.7)
    _run(policy, day(0), [day(d) for d in range(1, 11)])


def test_without_capacity_nothing_is_evicted_and_day_one_counts() -> None:
    policy = VocabularyPolicy(freq_threshold=3)
    fit = {"a": 5, "b": 2}                       # b: 2 < 3, a candidate
    vocab = Vocabulary.fitted(_table({"a": 5}), _table({"b": 2}))
    vocab, change = fold(vocab, _table({"b": 1, "c": 2}), policy)   # b: 2 + 1 = 3, admitted
    assert change.admitted["value"].to_pylist() == ["b"] and change.admitted["slot"].to_pylist() == [1]
    assert change.evicted.num_rows == 0 and vocab.values.to_pylist() == ["a", "b"]
    _run(policy, fit, [{"c": 1}, {"c": 2, "d": 9}, {"a": 1}])


@settings(max_examples=60, deadline=None)
@given(
    eviction=st.sampled_from(["lru", "decay"]),
    threshold=st.integers(0, 4),
    capacity=st.one_of(st.none(), st.integers(1, 6)),
    window=st.integers(1, 3),
    decay=st.sampled_from([0.5, 0.9, 1.0]),
    fit=st.dictionaries(st.sampled_from("abcdefghij"), st.integers(1, 6), max_size=8),
    days=st.lists(st.dictionaries(st.sampled_from("abcdefghijklmn"), st.integers(1, 6), max_size=8),
                  min_size=1, max_size=8),
)
def test_random_update_sequences_match_the_reference(eviction, threshold, capacity, window, decay, fit, days):
    policy = VocabularyPolicy(freq_threshold=threshold, capacity=capacity, eviction=eviction,
                              window=window, decay=decay)
    _run(policy, fit, days)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"eviction": "lfu"}, r"eviction must be one of \('lru', 'decay'\)"),
    ({"window": 0}, "window must be a positive number of updates, got 0"),
    ({"decay": 1.5}, r"decay must be a number in \(0, 1\], got 1.5"),
    ({"capacity": 0}, "capacity must be positive or None, got 0"),
])
def test_bad_policy_settings(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VocabularyPolicy(**kwargs)

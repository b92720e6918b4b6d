"""The living vocabulary's policy (tabstream.ops.vocabulary_policy) against a
plain-Python reference of the same rules: dicts, sorted(), one value at a time."""

from __future__ import annotations

import os
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


# -- Workflow.update: the whole path (dask fit machinery, state, save/load) ----------

import collections  # noqa: E402
import json  # noqa: E402

import pandas as pd  # noqa: E402

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.core.errors import DataError, NotFittedError, SchemaError  # noqa: E402


def _drifting_days(tmp_path, seed: int, days: int = 11, rows: int = 300) -> list[list[str]]:
    """Per day two parquet files; day d draws ids mostly from d*4 .. d*4+25 (drift)."""
    rng = random.Random(seed)
    out = []
    for d in range(days):
        values = [f"u{d * 4 + int(rng.expovariate(0.12)) % 25:03d}" if rng.random() > 0.05 else None
                  for _ in range(rows)]
        files = []
        for half in range(2):
            path = tmp_path / f"day{d:02d}_{half}.parquet"
            part = values[half * rows // 2:(half + 1) * rows // 2]
            pd.DataFrame({"C1": pd.array(part, dtype="str"), "label": range(len(part))}).to_parquet(path)
            files.append(str(path))
        out.append(files)
    return out


def _counts(files: list[str]) -> dict[str, int]:
    frame = pd.concat([pd.read_parquet(f) for f in files])
    return dict(collections.Counter(v for v in frame["C1"] if isinstance(v, str)))


@pytest.mark.parametrize(("eviction", "seed"), [("lru", 0), ("decay", 1)])
def test_workflow_update_ten_days_against_the_reference(tmp_path, eviction: str, seed: int) -> None:
    """Fit on day 0, update with days 1..10: after every update the ids equal the
    plain-Python reference's (start index 3 + slot; out of vocabulary 2), kept values
    keep their ids, the delta lists what the reference admitted and evicted."""
    days = _drifting_days(tmp_path, seed)
    op = ops.Categorify(freq_threshold=3, max_size=3 + 12, eviction=eviction, window=2, decay=0.8)
    wf = ts.Workflow((["C1"] >> op) + ["label"])
    wf.fit(ts.Dataset(days[0]))
    policy = VocabularyPolicy(freq_threshold=3, capacity=12, eviction=eviction, window=2, decay=0.8)
    fit = sorted(_counts(days[0]).items(), key=lambda kv: (-kv[1], kv[0]))
    kept = [(v, c) for v, c in fit if c >= 3][:12]
    ref = Reference(kept, [kv for kv in fit if kv not in kept], policy)
    universe = sorted({v for files in days for v in _counts(files)})
    probe = pd.DataFrame({"C1": pd.array(universe + [None], dtype="str"), "label": 0})
    before = dict(zip(universe, wf.transform(probe)["C1"].tolist()))
    for d, files in enumerate(days[1:], start=1):
        delta = wf.update(ts.Dataset(files))
        admitted, evicted = ref.update(_counts(files))
        ids = wf.transform(probe)["C1"].tolist()
        assert ids[-1] == 1  # missing stays missing
        got = dict(zip(universe, ids))
        assert got == {v: 3 + ref.slot[v] if v in ref.slot else 2 for v in universe}, f"day {d}"
        for v, i in before.items():  # kept values keep their ids
            if i >= 3 and v not in evicted:
                assert got[v] == i
        changes = delta["C1"]
        assert dict(zip(changes.admitted["value"].to_pylist(), changes.admitted["id"].to_pylist())) == \
            {v: 3 + s for v, s in admitted.items()}
        assert sorted(changes.evicted["value"].to_pylist()) == sorted(evicted)
        assert set(changes.recycled.tolist()) == {before[v] for v in evicted} & {3 + s for s in admitted.values()}
        assert delta.sequence == d and delta.previous == (f"update_{d - 1:05d}" if d > 1 else None)
        card = wf.output_schema["C1"].properties["embedding_sizes"]["cardinality"]
        assert card == 3 + len(ref.slot) <= 15
        before = got


def test_joint_group_and_list_column_update(tmp_path) -> None:
    """A joint group counts both columns into one vocabulary; a list column counts
    its elements; both keep ids and report their changes under every column."""
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    pd.DataFrame({"u": ["x", "x", "y"], "v": ["y", "z", "z"], "tags": [["p"], ["p", "q"], []]}).to_parquet(first)
    pd.DataFrame({"u": ["w", "w", "x"], "v": ["w", "q", "q"], "tags": [["r", "r"], ["p"], ["r"]]}).to_parquet(second)
    wf = ts.Workflow(([["u", "v"]] >> ops.Categorify(freq_threshold=2)) + (["tags"] >> ops.Categorify(freq_threshold=2)))
    wf.fit(ts.Dataset(str(first)))
    old = wf.transform(pd.read_parquet(first))
    delta = wf.update(ts.Dataset(str(second)))
    # joint: x 3, y 2, z 2 at fit (ids 3, 4, 5); update: w 3 and q 2 admitted
    assert delta["u"] is delta["v"] is delta["u_v"]
    assert dict(zip(delta["u"].admitted["value"].to_pylist(), delta["u"].admitted["id"].to_pylist())) == \
        {"w": 6, "q": 7}
    # tags: p 2 at fit (id 3), q 1 is a candidate; update: r 3 admitted (4), q stays at 1
    assert delta["tags"].admitted.to_pylist() == [{"id": 4, "value": "r"}]
    assert delta.summary() == {"u": {"admitted": 2, "evicted": 0, "recycled": 0},
                               "v": {"admitted": 2, "evicted": 0, "recycled": 0},
                               "tags": {"admitted": 1, "evicted": 0, "recycled": 0}}
    new = wf.transform(pd.read_parquet(first))
    pd.testing.assert_frame_equal(new, old)   # the fit's values keep their ids


def _fitted(tmp_path, **kwargs):
    days = _drifting_days(tmp_path, 3, days=6, rows=200)
    wf = ts.Workflow((["C1"] >> ops.Categorify(freq_threshold=2, max_size=12, **kwargs)) + ["label"])
    return wf.fit(ts.Dataset(days[0])), days


def test_save_load_round_trips_state_and_the_delta_chain(tmp_path) -> None:
    """Saved after 3 updates and loaded, the workflow continues exactly as the one
    that was not saved (candidates, last-seen and scores round-trip), and the chain
    of deltas comes back, each naming its predecessor."""
    wf, days = _fitted(tmp_path, eviction="decay", decay=0.5)
    for files in days[1:4]:
        wf.update(ts.Dataset(files))
    wf.save(str(tmp_path / "wf"))
    names = sorted(os.listdir(tmp_path / "wf" / "vocabulary"))
    assert names == ["update_00001", "update_00002", "update_00003"]
    docs = [json.loads((tmp_path / "wf" / "vocabulary" / n / "_delta.json").read_text()) for n in names]
    assert [d["previous"] for d in docs] == [None, "update_00001", "update_00002"]
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    assert [d.summary() for d in loaded.vocabulary_deltas] == [d.summary() for d in wf.vocabulary_deltas]
    for a, b in zip(loaded.vocabulary_deltas, wf.vocabulary_deltas):
        assert a["C1"].admitted.equals(b["C1"].admitted) and a["C1"].evicted.equals(b["C1"].evicted)
    for files in days[4:]:
        da, db = wf.update(ts.Dataset(files)), loaded.update(ts.Dataset(files))
        assert da["C1"].admitted.equals(db["C1"].admitted) and da["C1"].evicted.equals(db["C1"].evicted)
    probe = pd.concat([pd.read_parquet(f) for files in days for f in files])
    pd.testing.assert_frame_equal(wf.transform(probe), loaded.transform(probe))
    # a new fit starts a new chain
    assert wf.fit(ts.Dataset(days[0])).vocabulary_deltas == []


def test_a_categorify_saved_before_living_vocabularies_loads_and_updates(tmp_path) -> None:
    """A workflow.json without the new state fields and tables (as saved before this
    change) loads, transforms as before, and updates (candidates counted from then)."""
    wf, days = _fitted(tmp_path, keep_candidates=False)
    wf.save(str(tmp_path / "wf"))
    doc_path = tmp_path / "wf" / "workflow.json"
    doc = json.loads(doc_path.read_text())
    node = next(n for n in doc["nodes"] if n["kind"] == "op")
    assert node["state"] == {"vocabularies": ["C1"], "candidates": [], "updates": 0}
    node["state"] = {"vocabularies": ["C1"]}
    node["op"]["params"] = {k: v for k, v in node["op"]["params"].items()
                            if k not in ("eviction", "window", "decay", "keep_candidates")}
    doc_path.write_text(json.dumps(doc))
    old = ts.Workflow.load(str(tmp_path / "wf"))
    probe = pd.concat([pd.read_parquet(f) for f in days[1]])
    pd.testing.assert_frame_equal(old.transform(probe), wf.transform(probe))
    da, db = old.update(ts.Dataset(days[1])), wf.update(ts.Dataset(days[1]))
    assert da["C1"].admitted.equals(db["C1"].admitted) and da["C1"].evicted.equals(db["C1"].evicted)


def test_update_refuses_what_it_cannot_do(tmp_path) -> None:
    days = _drifting_days(tmp_path, 4, days=2, rows=50)
    with pytest.raises(NotFittedError, match=r"workflow is not fitted; call fit\(dataset\) first"):
        ts.Workflow(["C1"] >> ops.Categorify()).update(ts.Dataset(days[1]))
    wf = ts.Workflow((["C1"] >> ops.Categorify()) + (["label"] >> ops.Normalize()))
    wf.fit(ts.Dataset(days[0]))
    with pytest.raises(ValueError, match=r"Normalize \(node \d+\) cannot update their statistics .*"
                                         r"others='keep'"):
        wf.update(ts.Dataset(days[1]))
    assert wf.vocabulary_deltas == []
    norm = next(n.op for n in wf.output_node.walk() if n.kind == "op" and isinstance(n.op, ops.Normalize))
    stats = norm.get_state()
    wf.update(ts.Dataset(days[1]), others="keep")
    assert norm.get_state() == stats and len(wf.vocabulary_deltas) == 1
    single = ts.Workflow(["C1", "label"] >> ops.Categorify(single_table=True)).fit(ts.Dataset(days[0]))
    with pytest.raises(ValueError, match=r"node \d+: Categorify\(single_table=True\) cannot update"):
        single.update(ts.Dataset(days[1]))
    other = tmp_path / "ints.parquet"
    pd.DataFrame({"C1": [1, 2], "label": [0, 1]}).to_parquet(other)
    with pytest.raises(SchemaError, match=r"column 'C1' of .* is int64, but the workflow was fitted on string"):
        wf.update(ts.Dataset(str(other)), others="keep")
    with pytest.raises(ValueError, match="others must be 'refuse' or 'keep', got 'skip'"):
        wf.update(ts.Dataset(days[1]), others="skip")


def test_a_broken_delta_chain_is_refused_at_load(tmp_path) -> None:
    wf, days = _fitted(tmp_path)
    wf.update(ts.Dataset(days[1]))
    wf.update(ts.Dataset(days[2]))
    wf.save(str(tmp_path / "wf"))
    path = tmp_path / "wf" / "vocabulary" / "update_00002" / "_delta.json"
    doc = json.loads(path.read_text())
    doc["previous"] = None
    path.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"vocabulary delta update_00002 is update 2 after None; the chain "
                                        r"expects update 2 after 'update_00001'"):
        ts.Workflow.load(str(tmp_path / "wf"))


def test_delta_write_is_whole_and_written_once(tmp_path) -> None:
    from tabstream.pipeline.vocabulary_delta import VocabularyDelta

    wf, days = _fitted(tmp_path)
    delta = wf.update(ts.Dataset(days[1]))
    folder = delta.write(str(tmp_path / "deltas"))
    assert sorted(os.listdir(tmp_path / "deltas")) == ["update_00001"]
    back = VocabularyDelta.read(folder)
    assert back.summary() == delta.summary() and back["C1"].admitted.equals(delta["C1"].admitted)
    with pytest.raises(DataError, match=r"update_00001 already exists; each update is written once"):
        delta.write(str(tmp_path / "deltas"))


def test_spilled_counts_update_like_in_memory_ones(tmp_path) -> None:
    """With spill_rows small, the fit and every update merge spilled buckets: the
    ids, candidates and deltas equal those of the in-memory path."""
    days = _drifting_days(tmp_path, 5, days=4, rows=400)
    results = []
    for spill in ({}, {"spill_rows": 4, "spill_buckets": 3, "spill_dir": str(tmp_path / "spill")}):
        wf = ts.Workflow((["C1"] >> ops.Categorify(freq_threshold=2, max_size=14, **spill)) + ["label"])
        wf.fit(ts.Dataset(days[0], part_size="2KB"))
        deltas = [wf.update(ts.Dataset(files, part_size="2KB")) for files in days[1:]]
        op = next(n.op for n in wf.output_node.walk() if n.kind == "op")
        results.append((op.tables["C1"], op.candidates["C1"], deltas))
    (va, ca, da), (vb, cb, db) = results
    assert va.equals(vb)  # kept values in id order; candidates in no order
    assert ca.sort_by("values").equals(cb.sort_by("values"))
    for a, b in zip(da, db):
        assert a["C1"].admitted.equals(b["C1"].admitted) and a["C1"].evicted.equals(b["C1"].evicted)


@pytest.mark.slow
def test_update_on_a_dask_cluster_equals_the_threaded_run(tmp_path, dask_dashboard_port_taken) -> None:
    """Workflow.update with a distributed Client (two worker processes): the same
    deltas and ids as the threaded scheduler."""
    from distributed import Client, LocalCluster

    days = _drifting_days(tmp_path, 6, days=4, rows=200)
    results = []
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=False) as client:
        for c in (None, client):
            wf = ts.Workflow((["C1"] >> ops.Categorify(freq_threshold=2, max_size=13)) + ["label"], client=c)
            wf.fit(ts.Dataset(days[0]))
            deltas = [wf.update(ts.Dataset(files)) for files in days[1:]]
            probe = pd.concat([pd.read_parquet(f) for files in days for f in files])
            results.append(([(d["C1"].admitted, d["C1"].evicted) for d in deltas], wf.transform(probe)))
    (da, ta), (db, tb) = results
    for (a1, e1), (a2, e2) in zip(da, db):
        assert a1.equals(a2) and e1.equals(e2)
    pd.testing.assert_frame_equal(ta, tb)


def test_update_writes_its_delta_at_once_or_changes_nothing(tmp_path) -> None:
    from tabstream.pipeline.vocabulary_delta import VocabularyDelta

    wf, days = _fitted(tmp_path)
    probe = pd.concat([pd.read_parquet(f) for files in days for f in files])
    delta = wf.update(ts.Dataset(days[1]), delta_dir=str(tmp_path / "deltas"))
    back = VocabularyDelta.read(str(tmp_path / "deltas" / "update_00001"))
    assert back["C1"].admitted.equals(delta["C1"].admitted) and back.previous is None
    before = wf.transform(probe)
    (tmp_path / "deltas" / "update_00002").mkdir()
    (tmp_path / "deltas" / "update_00002" / "_delta.json").write_text("{}")  # taken already
    with pytest.raises(DataError, match=r"update_00002 already exists; each update is written once"):
        wf.update(ts.Dataset(days[2]), delta_dir=str(tmp_path / "deltas"))
    pd.testing.assert_frame_equal(wf.transform(probe), before)  # nothing changed
    assert len(wf.vocabulary_deltas) == 1

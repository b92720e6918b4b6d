"""CachedEmbeddings against plain in-memory tables under random operation sequences.

A Hypothesis state machine drives a cached module (any cache size from 1 row)
and a reference: ``EmbeddingTables`` with sparse gradients and torch's own
sparse optimizer (Adagrad or LazyAdam) on the same initial rows. Rules train,
look up in eval mode, look up with gradients off in train mode, stage rows,
read the next batch's rows ahead (``CachedEmbeddings.prefetch``, with a commit
in between or not) and any rows ahead (``ParameterServer.read_ahead``, left for a
later rule), commit, reset rows as a vocabulary delta does, roll back (which keeps
the resets made since the version it goes back to), and reopen the server after a
simulated crash. After every
rule the cached module's answers equal the reference's and ``ps.lookup``'s,
the server's rows equal the reference's weights, and each cache's bookkeeping
holds (one id per slot, free + used = capacity).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tabstream.train.tables import TableConfig
from tabstream.train.torch import CachedEmbeddings, EmbeddingTables, LazyAdam, ParameterServer

A_ROWS, B_ROWS, DIM = 12, 9, 3
LAYOUTS = ("ragged", "padded", "keys", "mask_key")


def configs(combiner):
    return [TableConfig("a", A_ROWS, DIM, ("a",)),
            TableConfig("b", B_ROWS, DIM, ("b", "b2"), is_list=True, combiner=combiner)]


def batch_of(a_ids, b_lists, b2_ids, layout):
    """One batch: single-hot ``a``, list ``b`` in ``layout``, single-hot ``b2``
    sharing table ``b`` (two features of one table)."""
    features = {"a": torch.tensor(a_ids, dtype=torch.long),
                "b2": torch.tensor(b2_ids, dtype=torch.long)}
    lengths = [len(x) for x in b_lists]
    values = torch.tensor([v for x in b_lists for v in x], dtype=torch.long)
    offsets = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.long)
    if layout == "ragged":
        features["b"] = (values, offsets)
    elif layout == "keys":
        features["b__values"], features["b__offsets"] = values, offsets
    else:
        width = max(max(lengths), 1)
        padded = torch.zeros((len(b_lists), width), dtype=torch.long)
        mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
        padded[mask] = values
        if layout == "padded":
            features["b"] = (padded, mask)
        else:
            features["b"], features["b__mask"] = padded, mask
    return features


@st.composite
def batches(draw):
    n = draw(st.integers(1, 5))
    a_ids = draw(st.lists(st.integers(0, A_ROWS - 1), min_size=n, max_size=n))
    b_lists = draw(st.lists(st.lists(st.integers(0, B_ROWS - 1), max_size=3), min_size=n, max_size=n))
    b2_ids = draw(st.lists(st.integers(0, B_ROWS - 1), min_size=n, max_size=n))
    return a_ids, b_lists, b2_ids


def assert_close(got, expected, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=2e-5, atol=2e-6,
                               err_msg=what)


class CacheMachine(RuleBasedStateMachine):
    """One cached module and its in-memory reference, stepped together."""

    @initialize(cache_rows=st.integers(1, 14), optimizer=st.sampled_from(["adagrad", "adam"]),
                storage=st.sampled_from(["memory", "disk"]), combiner=st.sampled_from(["sum", "mean"]),
                layout=st.sampled_from(LAYOUTS))
    def setup(self, cache_rows, optimizer, storage, combiner, layout):
        self.tmp = Path(tempfile.mkdtemp())
        self.cache_rows, self.layout, self.storage = cache_rows, layout, storage
        self.cfgs = configs(combiner)
        self.ps = ParameterServer(self.tmp / "ps", self.cfgs, storage=storage, optimizer=optimizer,
                                  lr=0.1)
        self.emb = CachedEmbeddings(self.ps, cache_rows)
        self.ref = EmbeddingTables(self.cfgs, sparse=True)
        with torch.no_grad():
            for cfg in self.cfgs:
                self.ref[cfg.name].weight.copy_(
                    torch.from_numpy(self.ps.lookup(cfg.name, np.arange(cfg.cardinality))))
        params = [self.ref[c.name].weight for c in self.cfgs]
        self.opt = (torch.optim.Adagrad(params, lr=0.1) if optimizer == "adagrad"
                    else LazyAdam(params, lr=0.1))
        self.marks = {0: self._reference_state()}  # server version -> reference then
        self.step = 0
        # ids of table "a" reset since the last commit, and by the last commit
        self.pending_resets: list[int] = []
        self.commit_resets: list[int] = []

    def teardown(self):
        if hasattr(self, "ps"):
            self.ps.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _reference_state(self):
        return ({k: v.clone() for k, v in self.ref.state_dict().items()},
                copy.deepcopy(self.opt.state_dict()))

    def _restore_reference(self, version):
        weights, opt_state = self.marks[version]
        self.ref.load_state_dict(weights)
        self.opt.load_state_dict(copy.deepcopy(opt_state))

    def _features(self, batch):
        return batch_of(*batch, self.layout)

    # -- rules ----------------------------------------------------------------

    @rule(batch=batches())
    def train(self, batch):
        features = self._features(batch)
        self.emb.train()
        self.step += 1
        rng = np.random.default_rng(self.step)
        self.opt.zero_grad()
        got, expected = self.emb(features), self.ref(features)
        for name in ("a", "b", "b2"):
            assert_close(got[name].detach(), expected[name].detach(), f"train forward {name}")
        coefs = {k: torch.as_tensor(rng.normal(size=tuple(v.shape)), dtype=torch.float32)
                 for k, v in expected.items()}
        sum((got[k] * coefs[k]).sum() for k in got).backward()
        sum((expected[k] * coefs[k]).sum() for k in expected).backward()
        with torch.sparse.check_sparse_tensor_invariants(enable=True):
            self.opt.step()

    @rule(batch=batches(), mode=st.sampled_from(["eval", "no_grad"]))
    def look_up(self, batch, mode):
        features = self._features(batch)
        if mode == "eval":
            self.emb.eval()
        with torch.no_grad():
            got, expected = self.emb(features), self.ref(features)
        self.emb.train()
        for name in ("a", "b", "b2"):
            assert_close(got[name], expected[name], f"{mode} lookup {name}")
        assert_close(got["a"], self.ps.lookup("a", batch[0]), "a against ps.lookup")
        assert_close(got["b2"], self.ps.lookup("b", batch[2]), "b2 against ps.lookup")

    @rule(batch=batches(), next_batch=batches(), flush_between=st.booleans())
    def train_with_the_next_batch_read_ahead(self, batch, next_batch, flush_between):
        """The pipelined step: the next batch's misses are read ahead while this
        batch trains (its update may write rows being read), a commit may come in
        between, then the next batch trains on what was read ahead."""
        self.emb.prefetch(self._features(next_batch))
        self.train(batch)
        if flush_between:
            self.flush()
        self.train(next_batch)

    @rule(ids=st.lists(st.integers(0, A_ROWS - 1), max_size=20), table=st.sampled_from(["a", "b"]))
    def read_ahead(self, ids, table):
        """Rows read ahead and left unused until some later rule reads the table
        (a lookup, an update, a commit, a rollback or a crash)."""
        self.ps.read_ahead(table, [i % (A_ROWS if table == "a" else B_ROWS) for i in ids])

    @rule(ids=st.lists(st.integers(0, A_ROWS - 1), max_size=20))
    def prefetch(self, ids):
        self.ps.prefetch({"a": ids, "b2": [i % B_ROWS for i in ids]})

    @rule()
    def flush(self):
        changed = self.ps.version != self.ps.mark
        version = self.ps.flush()
        self.marks[version] = self._reference_state()
        if changed:
            self.commit_resets, self.pending_resets = self.pending_resets, []

    @rule(ids=st.lists(st.integers(0, A_ROWS - 1), min_size=1, max_size=4))
    def reset_rows(self, ids):
        """A vocabulary delta recycled ``ids``: rows and optimizer state start over."""
        self.ps.apply_vocabulary_delta({"a": ids})
        self.ref.reset_rows("a", ids, optimizer=self.opt, seed=self.ps.seed)
        self.pending_resets += ids

    def _replayed(self, ids):
        """The reference after a rollback that made the resets ``ids`` again (and
        committed them)."""
        if ids:
            self.ref.reset_rows("a", sorted(set(ids)), optimizer=self.opt, seed=self.ps.seed)
            self.marks[self.ps.mark] = self._reference_state()
        self.commit_resets, self.pending_resets = sorted(set(ids)), []

    @precondition(lambda self: self.storage == "disk")
    @rule()
    def roll_back(self):
        """A checkpoint taken at the previous commit is loaded (disk servers keep
        the undo log of one commit)."""
        previous = self.ps.previous_mark
        if previous is None:
            return
        replay = self.pending_resets + self.commit_resets
        self.ps.rollback_to(previous)
        self._restore_reference(previous)
        self._replayed(replay)

    @rule()
    def roll_back_to_the_last_commit(self):
        """A checkpoint taken at the last commit is loaded: the updates since are
        undone, the resets since are kept."""
        replay = list(self.pending_resets)
        commit = self.commit_resets
        self.ps.rollback_to(self.ps.mark)
        self._restore_reference(self.ps.previous_mark if replay else self.ps.mark)
        self._replayed(replay)
        if not replay:
            self.commit_resets = commit

    @rule()
    def crash_and_reopen(self):
        """The process dies (nothing flushed since the last commit survives); a
        new process reopens the server and builds a new cache over it."""
        self.ps.close()
        del self.emb
        self.ps = ParameterServer.open(self.tmp / "ps")
        self.emb = CachedEmbeddings(self.ps, self.cache_rows)
        self._restore_reference(self.ps.version)
        self.pending_resets = []

    # -- after every rule ---------------------------------------------------------

    @invariant()
    def server_rows_equal_the_reference(self):
        if not hasattr(self, "ps"):
            return
        for cfg in self.cfgs:
            assert_close(self.ps.lookup(cfg.name, np.arange(cfg.cardinality)),
                         self.ref[cfg.name].weight.detach(), f"server rows of {cfg.name}")

    @invariant()
    def cache_bookkeeping_holds(self):
        if not hasattr(self, "emb"):
            return
        for name, cache in self.emb._caches.items():
            cache.check()
            assert len(cache) <= self.cache_rows
            # every cached row is the server's row
            ids = np.array(sorted(cache.slot), np.int64)
            if len(ids):
                slots = np.array([cache.slot[i] for i in ids.tolist()])
                assert_close(cache.rows[slots], self.ps.lookup(name, ids), f"cached rows of {name}")


CacheMachine.TestCase.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_cache_against_in_memory_tables = CacheMachine.TestCase


def test_the_reported_eviction_serves_each_id_its_own_row(tmp_path):
    """Issue 28's reproduction: misses beyond the free slots while some are free."""
    ps = ParameterServer(tmp_path / "ps", [TableConfig("t", 100, 4, ("t",))])
    emb = CachedEmbeddings(ps, cache_rows=4).eval()
    with torch.no_grad():
        emb({"t": torch.tensor([0, 1, 2])})
        emb({"t": torch.tensor([3, 4, 5])})
        got = emb({"t": torch.tensor([3, 4, 5])})["t"]
    np.testing.assert_array_equal(got.numpy(), ps.lookup("t", [3, 4, 5]))
    emb._caches["t"].check()
    assert emb.cached_rows == {"t": 4}


@pytest.mark.parametrize("capacity", [1, 2, 5])
def test_put_keeps_the_batch_hits_and_evicts_least_recently_used(capacity):
    from tabstream.train.row_cache import RowCache

    cache = RowCache(capacity, 2)
    rows = np.arange(40, dtype=np.float32).reshape(20, 2)
    for clock, i in enumerate(range(capacity), start=1):
        cache.clock = clock
        cache.put(np.array([i]), rows[i:i + 1])
    cache.clock += 1
    hit_slot = cache.find(np.array([0]))
    cache.put(np.array([10, 11, 12]), rows[10:13], keep=hit_slot)
    cache.check()
    assert 0 in cache.slot  # the hit stays
    expected_new = min(3, capacity - 1)
    assert [i for i in (10, 11, 12) if i in cache.slot] == [10, 11, 12][:expected_new]
    for key, slot in cache.slot.items():
        np.testing.assert_array_equal(cache.rows[slot], rows[key])

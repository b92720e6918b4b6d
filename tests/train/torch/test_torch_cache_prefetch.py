"""fit reads the next batch's rows ahead (CachedEmbeddings.prefetch): the same
weights and server rows as without, across epochs, commits, a mid-epoch resume
and the NaN stop."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_data import categorical, continuous, target

from tabstream.core.schema import Schema
from tabstream.train.loop import NonFiniteLossError
from tabstream.train.torch import (
    DLRM,
    CachedEmbeddings,
    ParameterServer,
    fit,
    table_configs_from_schema,
)

SCHEMA = Schema([categorical("C1", 60), categorical("C2", 30, is_list=True), continuous("I1"),
                 target()])


def batches(seed, n=7, size=16):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = rng.integers(0, 4, size)
        features = {"C1": torch.as_tensor(rng.integers(0, 60, size)),
                    "C2": (torch.as_tensor(rng.integers(0, 30, lengths.sum())),
                           torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]))),
                    "I1": torch.as_tensor(rng.normal(size=size), dtype=torch.float32)}
        out.append((features, torch.as_tensor(rng.integers(0, 2, size), dtype=torch.float32)))
    return out


class Crashing(list):
    """Its batches, failing when batch ``at`` of epoch ``epoch`` is asked for."""

    def __init__(self, data, epoch, at):
        super().__init__(data)
        self.epoch, self.at, self.now = epoch, at, 0

    def set_epoch(self, epoch):
        self.now = epoch

    def __iter__(self):
        for i, batch in enumerate(list.__iter__(self)):
            if self.now == self.epoch and i == self.at:
                raise KeyboardInterrupt("crash")
            yield batch


def build(folder, reopen=False):
    configs = table_configs_from_schema(SCHEMA.without(["click"]), dim=8)
    ps = (ParameterServer.open(folder) if reopen else
          ParameterServer(folder, configs, storage="disk", optimizer="adam", lr=0.05))
    torch.manual_seed(0)
    emb = CachedEmbeddings(ps, cache_rows=6)  # small: most ids of a batch miss
    model = DLRM(SCHEMA, embedding_dim=8, embeddings=emb)
    return ps, emb, model, torch.optim.Adam(model.parameters(), lr=0.01)


def counting(ps):
    """Count the real server's reads ahead (the server itself does the reading)."""
    calls = []
    real = ps.read_ahead

    def read_ahead(table, ids):
        calls.append((table, np.asarray(ids).copy()))
        real(table, ids)

    ps.read_ahead = read_ahead
    return calls


def server_state(ps):
    out = {}
    for table, n in (("C1", 60), ("C2", 30)):
        out[table] = ps.lookup(table, np.arange(n))
        out[table + "/state"] = ps.optimizer_state(table, np.arange(n))
    return out


def assert_same(a_ps, a_model, b_ps, b_model):
    a, b = server_state(a_ps), server_state(b_ps)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    b_state = b_model.state_dict()
    for key, value in a_model.state_dict().items():
        if not key.endswith("ps_version"):
            torch.testing.assert_close(value, b_state[key], rtol=0, atol=0)


def test_fit_prefetches_the_next_batch_and_trains_exactly_as_without(tmp_path):
    data = batches(0)
    # without prefetch: the module's prefetch does nothing
    ref_ps, ref_emb, ref_model, ref_opt = build(tmp_path / "ref")
    ref_emb.prefetch = lambda features: None
    fit(ref_model, data, ref_opt, epochs=3, checkpoint_dir=tmp_path / "ref_ck", checkpoint_every=3,
        progress=False)

    ps, emb, model, opt = build(tmp_path / "ps")
    calls = counting(ps)
    with pytest.raises(KeyboardInterrupt):  # a crash inside epoch 2, after a mid-epoch commit
        fit(model, Crashing(data, epoch=1, at=5), opt, epochs=3, checkpoint_dir=tmp_path / "ck",
            checkpoint_every=3, progress=False)
    # epoch 1: 6 next batches; epoch 2: batches 1..4 are handed ahead before the
    # crash while fetching batch 5 (the loop holds one batch ahead)
    tables_per_call = {t for t, _ in calls}
    assert tables_per_call == {"C1", "C2"}
    c1_calls = [ids for t, ids in calls if t == "C1"]
    assert 1 <= len(c1_calls) <= 6 + 4
    # what was read ahead is among the next batches' ids, never ids of no batch
    all_c1 = np.unique(np.concatenate([f["C1"].numpy() for f, _ in data]))
    assert all(np.isin(ids, all_c1).all() for ids in c1_calls)
    ps.close()

    ps, emb, model, opt = build(tmp_path / "ps", reopen=True)
    calls = counting(ps)
    fit(model, data, opt, epochs=3, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)
    assert calls  # the resumed run reads ahead too
    assert_same(ref_ps, ref_model, ps, model)


def test_prefetch_hands_the_cache_misses_of_the_next_batch(tmp_path):
    """Each read ahead of C1 is the next batch's ids that no batch up to the current
    one had (a cache as large as the table keeps every row it read; the misses
    are taken after the current forward has read its own rows)."""
    data = batches(1, n=5)
    configs = table_configs_from_schema(SCHEMA.without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="disk", optimizer="adam", lr=0.05)
    calls = counting(ps)
    torch.manual_seed(0)
    model = DLRM(SCHEMA, embedding_dim=8, embeddings=CachedEmbeddings(ps, cache_rows=60))
    fit(model, data, torch.optim.Adam(model.parameters(), lr=0.01), progress=False)
    ids = [np.unique(f["C1"].numpy()) for f, _ in data]
    expected, seen = [], ids[0]
    for nxt in ids[1:]:
        new = np.setdiff1d(nxt, seen)
        if len(new):
            expected.append(new)
        seen = np.union1d(seen, nxt)
    got = [ids for t, ids in calls if t == "C1"]
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)


def test_nan_stop_with_prefetch_leaves_the_server_as_without(tmp_path):
    data = batches(2, n=5)
    data[3][0]["I1"][0] = float("nan")
    states = []
    for name, prefetching in (("ref", False), ("ps", True)):
        ps, emb, model, opt = build(tmp_path / name)
        if not prefetching:
            emb.prefetch = lambda features: None
        calls = counting(ps)
        with pytest.raises(NonFiniteLossError, match=r"at epoch 1/1, step 4"):
            fit(model, data, opt, progress=False)
        assert bool(calls) == prefetching
        states.append((ps, model))
    assert_same(*states[0], *states[1])


def test_the_next_batch_is_handed_over_after_the_current_forward(tmp_path):
    """A read ahead is taken by the next lookup of its table: handed over before
    the current forward, that forward would take it and the next batch would read
    its rows again. So each step runs: forward, then the next batch's prefetch."""
    data = batches(3, n=4)
    ps, emb, model, opt = build(tmp_path / "ps")
    events = []
    real_prefetch = emb.prefetch

    def prefetch(features):
        events.append("prefetch")
        real_prefetch(features)

    emb.prefetch = prefetch
    emb.register_forward_pre_hook(lambda module, args: events.append("forward"))
    fit(model, data, opt, progress=False)
    assert events == ["forward", "prefetch"] * (len(data) - 1) + ["forward"]

"""Keras fit reads the next batch's rows ahead (CachedEmbeddings.prefetch): the
same weights and server rows as without, across epochs, commits and a mid-epoch
resume; the reads ahead counted on a real ParameterServer."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tf_synthetic import categorical

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import ParameterServer, table_configs_from_schema
from tabstream.train.tensorflow import DLRM, CachedEmbeddings, fit

SCHEMA = Schema([categorical("C1", 120), categorical("C2", 40, is_list=True),
                 ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                 ColumnSchema("click", "float32", tags=[Tags.TARGET])])
CARD = {"C1": 120, "C2": 40}


def batches(seed, n=6, size=8):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        lengths = rng.integers(0, 3, size)
        features = {"C1": tf.constant(rng.integers(0, 120, size), tf.int64),
                    "C2": (tf.constant(rng.integers(0, 40, lengths.sum()), tf.int64),
                           tf.constant(np.concatenate([[0], np.cumsum(lengths)]), tf.int64)),
                    "I1": tf.constant(rng.normal(size=size), tf.float32)}
        out.append((features, tf.constant(rng.integers(0, 2, size), tf.float32)))
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


def build(folder, reopen=False, prefetch=True):
    configs = table_configs_from_schema(SCHEMA.without(["click"]), dim=8)
    ps = (ParameterServer.open(folder) if reopen else
          ParameterServer(folder, configs, storage="disk", optimizer="adam", lr=0.05))
    emb = CachedEmbeddings(ps, cache_rows=16)  # the distinct ids of a step, few more
    model = DLRM(SCHEMA, embedding_dim=8, seed=0, embeddings=emb)
    if not prefetch:  # the model's own hook, doing nothing, replaces the layer's
        model.fit_prefetch = lambda features: None
    calls = []
    real = ps.read_ahead

    def read_ahead(table, ids):  # the real server reads; the test counts
        calls.append((table, np.asarray(ids).copy()))
        real(table, ids)

    ps.read_ahead = read_ahead
    return ps, model, keras.optimizers.Adam(0.01), calls


def test_keras_fit_prefetches_and_trains_exactly_as_without(tmp_path):
    data = batches(0)
    ref_ps, ref_model, ref_opt, ref_calls = build(tmp_path / "ref", prefetch=False)
    fit(ref_model, data, ref_opt, epochs=3, checkpoint_dir=tmp_path / "ref_ck",
        checkpoint_every=2, progress=False)
    assert ref_calls == []

    ps, model, opt, calls = build(tmp_path / "ps")
    with pytest.raises(KeyboardInterrupt):  # inside epoch 2, after a mid-epoch commit
        fit(model, Crashing(data, epoch=1, at=4), opt, epochs=3, checkpoint_dir=tmp_path / "ck",
            checkpoint_every=2, progress=False)
    assert {t for t, _ in calls} == {"C1", "C2"}
    # read ahead: only ids of the batches, within each table
    for table, ids in calls:
        assert len(ids) and ids.min() >= 0 and ids.max() < CARD[table]
    all_c1 = np.unique(np.concatenate([f["C1"].numpy() for f, _ in data]))
    assert all(np.isin(ids, all_c1).all() for t, ids in calls if t == "C1")
    ps.close()

    ps, model, opt, calls = build(tmp_path / "ps", reopen=True)
    fit(model, data, opt, epochs=3, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)
    assert calls
    for table, n in CARD.items():
        np.testing.assert_array_equal(ps.lookup(table, np.arange(n)),
                                      ref_ps.lookup(table, np.arange(n)), err_msg=table)
        np.testing.assert_array_equal(ps.optimizer_state(table, np.arange(n)),
                                      ref_ps.optimizer_state(table, np.arange(n)), err_msg=table)
    for a, b in zip(ref_model.trainable_variables, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


def test_keras_prefetch_reads_the_next_batch_misses(tmp_path):
    """One fit over fresh tables: each read ahead of C1 is the next batch's ids
    that no batch up to the current one had (a cache of 120 rows keeps every row
    it read; the misses are taken once the current step has looked up its own)."""
    data = batches(1, n=4)
    configs = table_configs_from_schema(SCHEMA.without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="disk", optimizer="adam", lr=0.05)
    calls = []
    real = ps.read_ahead
    ps.read_ahead = lambda table, ids: (calls.append((table, np.asarray(ids).copy())),
                                        real(table, ids))
    model = DLRM(SCHEMA, embedding_dim=8, seed=0, embeddings=CachedEmbeddings(ps, cache_rows=120))
    fit(model, data, keras.optimizers.Adam(0.01), progress=False)
    got = [ids for t, ids in calls if t == "C1"]
    ids = [np.unique(f["C1"].numpy()) for f, _ in data]
    seen = np.unique(np.concatenate([ids[0], [0]]))  # fit builds the model on zeros: row 0
    expected = []
    for nxt in ids[1:]:
        new = np.setdiff1d(nxt, seen)
        if len(new):
            expected.append(new)
        seen = np.union1d(seen, nxt)
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_array_equal(g, e)

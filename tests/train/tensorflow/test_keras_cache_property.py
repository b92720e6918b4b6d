"""Keras CachedEmbeddings against a plain numpy reference under random operation
sequences.

A Hypothesis state machine drives a cached layer (any cache size from the
rows of one step up) and a reference: every table as a numpy array with the
server's rule (Adagrad or Adam, torch's formulas) written out in numpy. Rules
train one step (the layer's lookups in training mode, the gradient of a random
linear function of the outputs sent to the server as ``fit``'s step does),
look up in inference mode, stage rows, commit, roll back (disk) and reopen the
server after a simulated crash. Every layout a list feature is accepted in is
drawn, and one table serves two features. After every rule the server's rows
equal the reference's, each cached row (in its slot of the layer's variable)
is the server's row, and the bookkeeping holds (one id per slot, free + used =
capacity, no more rows than ``cache_rows``).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path

import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from tabstream.train import ParameterServer, TableConfig
from tabstream.train.tensorflow import CachedEmbeddings

A_ROWS, B_ROWS, DIM = 12, 9, 3
MAX_BATCH, MAX_LIST = 4, 3
LAYOUTS = ("ragged", "padded", "keys", "mask_key", "ragged_tensor", "sparse")
LR, BETAS, EPS = 0.1, (0.9, 0.999), 1e-8


def configs(combiner):
    return [TableConfig("a", A_ROWS, DIM, ("a",)),
            TableConfig("b", B_ROWS, DIM, ("b", "b2"), is_list=True, combiner=combiner)]


def batch_of(a_ids, b_lists, b2_ids, layout):
    """One batch: single-hot ``a``, list ``b`` in ``layout``, single-hot ``b2``
    sharing table ``b``."""
    features = {"a": tf.constant(a_ids, tf.int64), "b2": tf.constant(b2_ids, tf.int64)}
    lengths = [len(x) for x in b_lists]
    values = np.array([v for x in b_lists for v in x], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    if layout == "ragged":
        features["b"] = (tf.constant(values), tf.constant(offsets))
    elif layout == "keys":
        features["b__values"], features["b__offsets"] = tf.constant(values), tf.constant(offsets)
    elif layout == "ragged_tensor":
        features["b"] = tf.RaggedTensor.from_row_splits(tf.constant(values), tf.constant(offsets))
    elif layout == "sparse":
        features["b"] = tf.RaggedTensor.from_row_splits(
            tf.constant(values), tf.constant(offsets)).to_sparse()
    else:
        width = max(max(lengths), 1)
        mask = np.arange(width)[None, :] < np.array(lengths)[:, None]
        padded = np.full((len(b_lists), width), B_ROWS - 1, np.int64)  # padding: any id
        padded[mask] = values
        if layout == "padded":
            features["b"] = (tf.constant(padded), tf.constant(mask))
        else:
            features["b"], features["b__mask"] = tf.constant(padded), tf.constant(mask)
    return features


@st.composite
def batches(draw):
    n = draw(st.integers(1, MAX_BATCH))
    a_ids = draw(st.lists(st.integers(0, A_ROWS - 1), min_size=n, max_size=n))
    b_lists = draw(st.lists(st.lists(st.integers(0, B_ROWS - 1), max_size=MAX_LIST),
                            min_size=n, max_size=n))
    b2_ids = draw(st.lists(st.integers(0, B_ROWS - 1), min_size=n, max_size=n))
    return a_ids, b_lists, b2_ids


class Reference:
    """The tables and the server's optimizer in plain numpy."""

    def __init__(self, ps, cfgs, optimizer, combiner):
        self.optimizer, self.combiner = optimizer, combiner
        self.w = {c.name: ps.lookup(c.name, np.arange(c.cardinality)) for c in cfgs}
        k = 1 if optimizer == "adagrad" else 2
        self.s = {c.name: np.zeros((c.cardinality, k * DIM), np.float32) for c in cfgs}
        self.steps = {c.name: 0 for c in cfgs}

    def copy(self):
        other = object.__new__(Reference)
        other.optimizer, other.combiner = self.optimizer, self.combiner
        other.w = {k: v.copy() for k, v in self.w.items()}
        other.s = {k: v.copy() for k, v in self.s.items()}
        other.steps = dict(self.steps)
        return other

    def lookup(self, batch):
        a_ids, b_lists, b2_ids = batch
        pooled = []
        for ids in b_lists:
            rows = self.w["b"][ids].sum(axis=0) if ids else np.zeros(DIM, np.float32)
            pooled.append(rows / max(len(ids), 1) if self.combiner == "mean" else rows)
        return {"a": self.w["a"][a_ids], "b": np.array(pooled, np.float32).reshape(-1, DIM),
                "b2": self.w["b"][b2_ids]}

    def train(self, batch, coefs):
        """One step on ``loss = sum(out[k] * coefs[k])``: its gradient per row."""
        a_ids, b_lists, b2_ids = batch
        grads = {"a": np.zeros_like(self.w["a"]), "b": np.zeros_like(self.w["b"])}
        np.add.at(grads["a"], a_ids, coefs["a"])
        np.add.at(grads["b"], b2_ids, coefs["b2"])
        for row, ids in enumerate(b_lists):
            scale = 1.0 / len(ids) if ids and self.combiner == "mean" else 1.0
            for i in ids:
                grads["b"][i] += coefs["b"][row] * scale
        touched = {"a": sorted(set(a_ids)), "b": sorted({*b2_ids, *(i for x in b_lists for i in x)})}
        for name, rows in touched.items():
            self.steps[name] += 1
            g = grads[name][rows]
            w, s = self.w[name][rows], self.s[name][rows]
            if self.optimizer == "adagrad":
                s = s + g * g
                w = w - LR * g / (np.sqrt(s) + 1e-10)
            else:
                t, (b1, b2) = self.steps[name], BETAS
                m = s[:, :DIM] + (g - s[:, :DIM]) * (1 - b1)
                v = s[:, DIM:] * b2 + (1 - b2) * g * g
                w = w - LR / (1 - b1**t) * m / (np.sqrt(v) / math.sqrt(1 - b2**t) + EPS)
                s = np.concatenate([m, v], axis=1)
            self.w[name][rows], self.s[name][rows] = w, s


def assert_close(got, expected, what):
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=2e-5, atol=2e-6,
                               err_msg=what)


class KerasCacheMachine(RuleBasedStateMachine):
    """One cached layer and its numpy reference, stepped together."""

    @initialize(cache_rows=st.integers(MAX_BATCH * (MAX_LIST + 1), 20),
                optimizer=st.sampled_from(["adagrad", "adam"]),
                storage=st.sampled_from(["memory", "disk"]), combiner=st.sampled_from(["sum", "mean"]),
                layout=st.sampled_from(LAYOUTS))
    def setup(self, cache_rows, optimizer, storage, combiner, layout):
        self.tmp = Path(tempfile.mkdtemp())
        self.cache_rows, self.layout, self.storage = cache_rows, layout, storage
        self.cfgs = configs(combiner)
        self.ps = ParameterServer(self.tmp / "ps", self.cfgs, storage=storage, optimizer=optimizer,
                                  lr=LR, betas=BETAS, eps=EPS if optimizer == "adam" else None)
        self.emb = CachedEmbeddings(self.ps, cache_rows, list_features=["b"])
        self.ref = Reference(self.ps, self.cfgs, optimizer, combiner)
        self.marks = {0: self.ref.copy()}  # server version -> reference then
        self.step = 0

    def teardown(self):
        if hasattr(self, "ps"):
            self.ps.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    # -- rules ----------------------------------------------------------------

    @rule(batch=batches())
    def train(self, batch):
        """One training step as ``fit``'s replica step makes it for these tables."""
        features = batch_of(*batch, self.layout)
        self.step += 1
        rng = np.random.default_rng(self.step)
        expected = self.ref.lookup(batch)
        coefs = {k: rng.normal(size=v.shape).astype(np.float32) for k, v in expected.items()}
        variables = self.emb.cache_variables
        self.emb.begin_step()
        with tf.GradientTape() as tape:
            for var in variables.values():
                tape.watch(var.value)
            got = self.emb(features, training=True)
            loss = tf.add_n([tf.reduce_sum(got[k] * coefs[k]) for k in got])
        for name in ("a", "b", "b2"):
            assert_close(got[name], expected[name], f"train forward {name}")
        grads = tape.gradient(loss, [v.value for v in variables.values()])
        self.emb.apply_gradients(dict(zip(variables, grads, strict=True)))
        self.ref.train(batch, coefs)

    @rule(batch=batches())
    def look_up(self, batch):
        got = self.emb(batch_of(*batch, self.layout), training=False)
        expected = self.ref.lookup(batch)
        for name in ("a", "b", "b2"):
            assert_close(got[name], expected[name], f"lookup {name}")
        assert_close(got["a"], self.ps.lookup("a", batch[0]), "a against ps.lookup")

    @rule(ids=st.lists(st.integers(0, A_ROWS - 1), max_size=20))
    def prefetch(self, ids):
        self.ps.prefetch({"a": ids, "b2": [i % B_ROWS for i in ids]})

    @rule()
    def flush(self):
        version = self.ps.flush()
        self.marks[version] = self.ref.copy()

    @precondition(lambda self: self.storage == "disk")
    @rule()
    def roll_back(self):
        """A checkpoint taken at the previous commit is loaded (disk servers keep
        the undo log of one commit)."""
        previous = self.ps.previous_mark
        if previous is None:
            return
        self.ps.rollback_to(previous)
        self.ref = self.marks[previous].copy()

    @rule()
    def crash_and_reopen(self):
        """The process dies (nothing since the last commit survives); a new process
        reopens the server and builds a new layer over it."""
        self.ps.close()
        del self.emb
        self.ps = ParameterServer.open(self.tmp / "ps")
        self.emb = CachedEmbeddings(self.ps, self.cache_rows, list_features=["b"])
        self.ref = self.marks[self.ps.version].copy()

    # -- after every rule -------------------------------------------------------

    @invariant()
    def server_rows_equal_the_reference(self):
        if not hasattr(self, "ps"):
            return
        for cfg in self.cfgs:
            assert_close(self.ps.lookup(cfg.name, np.arange(cfg.cardinality)),
                         self.ref.w[cfg.name], f"server rows of {cfg.name}")

    @invariant()
    def cached_rows_are_the_servers(self):
        if not hasattr(self, "emb"):
            return
        for name, cache in self.emb._caches.items():
            cache.check()
            assert len(cache) <= self.cache_rows
            ids = np.array(sorted(cache.slot), np.int64)
            if len(ids):
                slots = [cache.slot[i] for i in ids.tolist()]
                assert_close(self.emb.cache_variables[name].numpy()[slots],
                             self.ps.lookup(name, ids), f"cached rows of {name}")


KerasCacheMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_keras_cache_against_a_numpy_reference = KerasCacheMachine.TestCase

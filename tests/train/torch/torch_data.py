"""Small synthetic data sets with a known signal, as lists of (features, labels)
batches, and schema helpers for the torch training tests."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tabstream.core.schema import ColumnSchema, Schema, Tags


def categorical(name, cardinality, tags=(), is_list=False):
    return ColumnSchema(
        name, "int64", tags=[Tags.CATEGORICAL, *tags], is_list=is_list,
        properties={"domain": {"min": 0, "max": cardinality - 1}},
    )


def continuous(name, tags=()):
    return ColumnSchema(name, "float32", tags=[Tags.CONTINUOUS, *tags])


def target(name="click"):
    return ColumnSchema(name, "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])


@dataclass
class Synthetic:
    schema: Schema
    train: list          # [(features, labels), ...]
    valid: list
    oracle_auc: float    # AUC of the true click probabilities on the validation rows


def _sigmoid(z):
    return 1.0 / (1.0 + np.exp(-z))


def _auc(y, s):
    """Brute-force pairwise AUC (an independent check of the rank-based one)."""
    pos, neg = s[y > 0.5], s[y <= 0.5]
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).sum() + 0.5 * (diff == 0).sum()) / (len(pos) * len(neg)))


def batches(columns, labels, batch_size, lists=None):
    """Cut numpy columns into (features, labels) torch batches; ``lists`` maps a
    list column to (values, row_lengths) and becomes (values, offsets) tuples."""
    n = len(labels)
    out = []
    for start in range(0, n, batch_size):
        stop = min(start + batch_size, n)
        features = {}
        for name, col in columns.items():
            dtype = torch.int64 if col.dtype.kind in "iu" else torch.float32
            features[name] = torch.as_tensor(col[start:stop], dtype=dtype)
        for name, (values, lengths) in (lists or {}).items():
            row_offsets = np.concatenate([[0], np.cumsum(lengths)])
            lo, hi = row_offsets[start], row_offsets[stop]
            features[name] = (
                torch.as_tensor(values[lo:hi], dtype=torch.int64),
                torch.as_tensor(row_offsets[start:stop + 1] - lo, dtype=torch.int64),
            )
        out.append((features, torch.as_tensor(labels[start:stop], dtype=torch.float32)))
    return out


RANKING_CARDS = {"c_small": 20, "c_mid": 300, "c_big": 3000}


def ranking_schema():
    return Schema([
        *(categorical(name, card) for name, card in RANKING_CARDS.items()),
        categorical("tags", 40, is_list=True),
        continuous("x1"), continuous("x2"), target(),
    ])


def ranking_rows(seed, n):
    """``n`` rows of the ranking data as numpy: (columns, (tag values, tag lengths),
    labels, true probabilities)."""
    rng = np.random.default_rng(seed)
    ids = {name: rng.integers(0, card, n) for name, card in RANKING_CARDS.items()}
    lengths = rng.integers(0, 4, n)
    tag_values = rng.integers(0, 40, lengths.sum())  # 0 is a real tag id, not padding
    x = rng.normal(size=(2, n))
    w_small, w_mid, w_tag = rng.normal(0, 0.8, 20), rng.normal(0, 0.6, 300), rng.normal(0, 0.5, 40)
    u, v = rng.normal(size=(20, 2)), rng.normal(size=(300, 2))
    tag_sum = np.bincount(np.repeat(np.arange(n), lengths), weights=w_tag[tag_values], minlength=n)
    logit = (
        w_small[ids["c_small"]] + w_mid[ids["c_mid"]] + tag_sum + 0.8 * x[0] - 0.5 * x[1]
        + 0.5 * (u[ids["c_small"]] * v[ids["c_mid"]]).sum(1) - 0.5
    )
    p = _sigmoid(logit)
    y = (rng.random(n) < p).astype(np.float32)
    columns = {**ids, "x1": x[0].astype(np.float32), "x2": x[1].astype(np.float32)}
    return columns, (tag_values, lengths), y, p


def make_ranking_data(seed=0, n_train=16_000, n_valid=4_000, batch_size=256):
    """Clicks from a hidden logistic model: per-id effects of c_small, c_mid and the
    multi-hot tags, a c_small x c_mid interaction, two continuous effects; c_big is
    noise. The oracle (true probability) AUC is about 0.83."""
    n = n_train + n_valid
    columns, (tag_values, lengths), y, p = ranking_rows(seed, n)
    offsets = np.r_[0, np.cumsum(lengths)]

    def part(lo, hi):
        cols = {k: c[lo:hi] for k, c in columns.items()}
        lists = {"tags": (tag_values[offsets[lo]:offsets[hi]], lengths[lo:hi])}
        return batches(cols, y[lo:hi], batch_size, lists)

    return Synthetic(ranking_schema(), part(0, n_train), part(n_train, n),
                     _auc(y[n_train:], p[n_train:]))


def make_retrieval_data(seed=0, n_train=12_000, n_valid=2_000, batch_size=256,
                        n_users=500, n_items=200, n_clusters=10):
    """Positive (user, item) interactions: each user has a hidden taste cluster and
    clicks items of that cluster (90%) or a random item (10%). Users and items also
    carry a noisy cluster attribute. recall@10 with 200 items: random 0.05; knowing
    the cluster (20 items each) about 0.45."""
    rng = np.random.default_rng(seed)
    n = n_train + n_valid
    user_cluster = rng.integers(0, n_clusters, n_users)
    item_cluster = np.arange(n_items) % n_clusters
    users = rng.integers(0, n_users, n)
    same = rng.random(n) < 0.9
    by_cluster = [np.flatnonzero(item_cluster == c) for c in range(n_clusters)]
    items = np.where(
        same,
        np.array([rng.choice(by_cluster[c]) for c in user_cluster[users]]),
        rng.integers(0, n_items, n),
    )
    noisy = lambda c: np.where(rng.random(len(c)) < 0.7, c, rng.integers(0, n_clusters, len(c)))  # noqa: E731
    user_attr, item_attr = noisy(user_cluster)[users], noisy(item_cluster)[items]
    columns = {"user_id": users, "user_attr": user_attr, "item_id": items, "item_attr": item_attr}
    y = np.ones(n, dtype=np.float32)
    schema = Schema([
        categorical("user_id", n_users, [Tags.USER_ID]),
        categorical("user_attr", n_clusters, [Tags.USER]),
        categorical("item_id", n_items, [Tags.ITEM_ID]),
        categorical("item_attr", n_clusters, [Tags.ITEM]),
        target(),
    ])
    cut = lambda lo, hi: batches({k: c[lo:hi] for k, c in columns.items()}, y[lo:hi], batch_size)  # noqa: E731
    return Synthetic(schema, cut(0, n_train), cut(n_train, n), float("nan"))


class Crashing:
    """A loader's batches, then a crash (``KeyboardInterrupt``, as a kill stops a
    process) before batch ``at``; ``len``, ``core`` and ``set_epoch`` are the loader's."""

    def __init__(self, loader, at):
        self.loader, self.core, self.at = loader, loader.core, at

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == self.at:
                raise KeyboardInterrupt("crash")
            yield batch

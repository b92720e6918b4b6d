"""Small numpy-generated data with a known signal for the Keras model tests."""

from __future__ import annotations

import numpy as np

from tabstream.core.schema import ColumnSchema, Schema, Tags


def categorical(name: str, cardinality: int, tags=(), is_list: bool = False) -> ColumnSchema:
    return ColumnSchema(
        name,
        "int64",
        tags=[Tags.CATEGORICAL, *tags],
        properties={"domain": {"min": 0, "max": cardinality - 1}},
        is_list=is_list,
    )


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def ranking_data(
    seed: int,
    rows: int = 20_000,
    cardinalities: tuple[int, ...] = (30, 100, 300),
    continuous: int = 2,
    list_cardinality: int = 50,
    max_list_len: int = 4,
) -> tuple[Schema, dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Features, labels and true click probabilities from a hidden logistic model:
    ``logit = sum_c w_c[id_c] + sum_k b_k x_k + 0.5 * sum_{i in list} u[i]``.

    The list column ``tags`` is padded with id 0 (Categorify's padding id) to
    ``max_list_len``; real ids are >= 1; ``tags__mask`` marks the real positions.
    """
    rng = np.random.default_rng(seed)
    cols = []
    features: dict[str, np.ndarray] = {}
    logit = np.zeros(rows)
    for i, card in enumerate(cardinalities):
        name = f"cat_{i}"
        ids = rng.integers(0, card, rows)
        logit += rng.normal(0.0, 1.0, card)[ids]
        features[name] = ids.astype(np.int64)
        cols.append(categorical(name, card))
    for k in range(continuous):
        name = f"cont_{k}"
        x = rng.normal(0.0, 1.0, rows).astype(np.float32)
        logit += rng.choice([-1.0, 1.0]) * 0.8 * x
        features[name] = x
        cols.append(ColumnSchema(name, "float32", tags=[Tags.CONTINUOUS]))
    if list_cardinality:
        lengths = rng.integers(1, max_list_len + 1, rows)
        padded = rng.integers(1, list_cardinality, (rows, max_list_len))
        padded[np.arange(max_list_len)[None, :] >= lengths[:, None]] = 0
        weights = rng.normal(0.0, 1.0, list_cardinality)
        weights[0] = 0.0
        logit += 0.5 * weights[padded].sum(axis=1)
        features["tags"] = padded.astype(np.int64)
        features["tags__mask"] = np.arange(max_list_len)[None, :] < lengths[:, None]
        cols.append(categorical("tags", list_cardinality, is_list=True))
    logit -= logit.mean()
    prob = sigmoid(logit)
    labels = (rng.random(rows) < prob).astype(np.float32)
    cols.append(ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]))
    return Schema(cols), features, labels, prob


def retrieval_data(
    seed: int, rows: int = 20_000, users: int = 200, items: int = 100, latent: int = 4
) -> tuple[Schema, dict[str, np.ndarray], np.ndarray]:
    """Positive (user, item) pairs: each user picks items with probability
    ``softmax(3 * <a_user, b_item>)``. Users also carry a group id (a coarse copy of
    their latent vector's sign pattern), items a category; all rows are positives."""
    rng = np.random.default_rng(seed)
    a = rng.normal(0.0, 1.0, (users, latent))
    b = rng.normal(0.0, 1.0, (items, latent))
    user_group = (a[:, 0] > 0).astype(np.int64) * 2 + (a[:, 1] > 0)
    item_category = (b[:, 0] > 0).astype(np.int64) * 2 + (b[:, 1] > 0)
    logits = 3.0 * a @ b.T / np.sqrt(latent)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    user_ids = rng.integers(0, users, rows)
    cum = probs.cumsum(axis=1)
    item_ids = (rng.random(rows)[:, None] > cum[user_ids]).sum(axis=1).clip(0, items - 1)
    features = {
        "user_id": user_ids.astype(np.int64),
        "user_group": user_group[user_ids],
        "item_id": item_ids.astype(np.int64),
        "item_category": item_category[item_ids],
    }
    schema = Schema(
        [
            categorical("user_id", users, tags=[Tags.USER_ID]),
            categorical("user_group", 4, tags=[Tags.USER]),
            categorical("item_id", items, tags=[Tags.ITEM_ID]),
            categorical("item_category", 4, tags=[Tags.ITEM]),
            ColumnSchema("click", "float32", tags=[Tags.TARGET]),
        ]
    )
    return schema, features, np.ones(rows, dtype=np.float32)


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Exact ROC AUC (Mann-Whitney U with average ranks for ties)."""
    labels = np.asarray(labels).reshape(-1) > 0.5
    scores = np.asarray(scores, dtype=np.float64).reshape(-1)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    pos = labels.sum()
    neg = len(labels) - pos
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))

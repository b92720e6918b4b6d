"""Exact evaluation metrics on whole validation sets (numpy only, no framework).

Both training packages report these, so a model scores the same whichever
framework trained it.

>>> roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
0.75
>>> round(log_loss([0, 1], [0.0, 0.0]), 4)        # logits 0 -> p = 0.5 -> ln 2
0.6931
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["log_loss", "roc_auc"]


def _as_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):  # torch tensor
        x = x.detach().cpu().numpy()
    elif hasattr(x, "numpy"):  # tf tensor
        x = x.numpy()
    return np.asarray(x, dtype=np.float64).reshape(-1)


def roc_auc(labels: Any, scores: Any) -> float:
    """Area under the ROC curve: the probability that a random positive scores
    above a random negative, ties counting one half (Mann-Whitney U from average
    ranks; exact, O(n log n)). ``nan`` when only one class is present."""
    y, s = _as_numpy(labels), _as_numpy(scores)
    if y.shape != s.shape:
        raise ValueError(f"roc_auc: {y.size} labels but {s.size} scores")
    positive = y > 0.5
    n_pos = int(positive.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="mergesort")
    sorted_scores = s[order]
    # average 1-based rank of each run of equal scores
    _, starts, counts = np.unique(sorted_scores, return_index=True, return_counts=True)
    run_rank = starts + (counts + 1) / 2.0
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, counts)
    u = ranks[positive].sum() - n_pos * (n_pos + 1) / 2.0
    return float(u / (n_pos * n_neg))


def log_loss(labels: Any, logits: Any) -> float:
    """Mean binary cross-entropy of ``sigmoid(logits)`` against ``labels`` (natural
    log), computed from logits without overflow: ``log(1 + e^z) - y z``."""
    y, z = _as_numpy(labels), _as_numpy(logits)
    if y.shape != z.shape:
        raise ValueError(f"log_loss: {y.size} labels but {z.size} logits")
    if y.size == 0:
        return float("nan")
    return float(np.mean(np.logaddexp(0.0, z) - y * z))

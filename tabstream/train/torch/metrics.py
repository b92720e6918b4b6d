"""Exact evaluation metrics on whole validation sets (numpy, no extra dependency).

>>> roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8])
0.75
>>> round(log_loss([0, 1], [0.0, 0.0]), 4)        # logits 0 -> p = 0.5 -> ln 2
0.6931
"""

from __future__ import annotations

from tabstream.train.metrics import log_loss, roc_auc

__all__ = ["log_loss", "roc_auc"]

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabstream.train.torch import log_loss, roc_auc  # noqa: E402


def pairwise_auc(y, s):
    pos, neg = s[y == 1], s[y == 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_equals_pairwise_count_with_ties(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 300)
    scores = np.round(rng.normal(size=300) + 0.5 * y, 1)  # rounding makes many ties
    assert roc_auc(y, scores) == pytest.approx(pairwise_auc(y, scores), abs=1e-12)
    assert roc_auc(torch.as_tensor(y), torch.as_tensor(scores)) == pytest.approx(roc_auc(y, scores))


def test_roc_auc_edge_cases():
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert roc_auc([0, 1], [0.5, 0.5]) == 0.5
    assert roc_auc([1, 0], [0.9, 0.1]) == 1.0
    assert np.isnan(roc_auc([1, 1, 1], [0.1, 0.2, 0.3]))
    with pytest.raises(ValueError, match="3 labels but 2 scores"):
        roc_auc([0, 1, 1], [0.1, 0.2])


def test_log_loss_equals_the_textbook_formula_and_survives_large_logits():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 1000)
    z = rng.normal(scale=3, size=1000)
    p = 1 / (1 + np.exp(-z))
    assert log_loss(y, z) == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    assert log_loss([1, 0], [800.0, -800.0]) == pytest.approx(0.0, abs=1e-12)
    assert log_loss([0], [800.0]) == pytest.approx(800.0)

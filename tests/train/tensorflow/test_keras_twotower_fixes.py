"""Keras TwoTower as torch's: a batch without positive rows has a zero loss (and
trains nothing) instead of failing, and ``fit(..., valid_loader=)`` validates it
(``val_loss`` the in-batch loss, ``val_auc``/``val_log_loss`` over each row's own
user-item score). Expected values come from numpy over the towers' outputs."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import retrieval_data, roc_auc  # noqa: E402

from tabstream.train.tensorflow import LazyAdam, TwoTower, evaluate, fit  # noqa: E402

pytestmark = pytest.mark.tensorflow


def data(seed, rows, positive_share=0.6):
    schema, features, _ = retrieval_data(seed=seed, rows=rows, users=30, items=12)
    labels = (np.random.default_rng(seed).random(rows) < positive_share).astype(np.float32)
    return schema, {k: tf.constant(v) for k, v in features.items()}, tf.constant(labels)


def numpy_loss(model, features, labels):
    """The in-batch softmax over the positive rows, written out: ``<q_i, c_j> / T -
    log Q(item_j)``, other rows of the same item left out, the cross-entropy of
    ``j = i`` averaged over the positives (0 without any)."""
    out = model(features, training=False)
    q, c = out["query"].numpy(), out["candidate"].numpy()
    pos = labels.numpy() > 0
    if not pos.any():
        return 0.0
    ids = features["item_id"].numpy()[pos]
    counts = model.item_counts.numpy()
    log_q = np.log(np.maximum(counts[ids], 1.0) / max(counts.sum(), 1.0))
    logits = q[pos] @ c[pos].T / model.temperature - log_q[None, :]
    same = (ids[:, None] == ids[None, :]) & ~np.eye(len(ids), dtype=bool)
    logits = np.where(same, -np.inf, logits).astype(np.float64)
    top = logits.max(axis=1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return float(np.mean(lse - np.diag(logits)))


def test_a_batch_without_positives_has_a_zero_loss_and_trains_nothing():
    schema, features, labels = data(0, 32)
    model = TwoTower(schema, tower=(8,), seed=0)
    zeros = tf.zeros_like(labels)
    assert float(model.compute_loss(x=features, y=zeros)) == 0.0 == numpy_loss(model, features,
                                                                                   zeros)
    # with positives, the loss is still the numpy one (the extra column changes nothing)
    got = float(model.compute_loss(x=features, y=labels, training=False))
    assert got == pytest.approx(numpy_loss(model, features, labels), rel=1e-5)
    before = [v.numpy().copy() for v in model.trainable_variables]
    history = fit(model, [(features, zeros)], LazyAdam(0.01), progress=False)
    assert history["loss"] == [0.0]
    for b, v in zip(before, model.trainable_variables, strict=True):
        np.testing.assert_array_equal(v.numpy(), b, err_msg=v.path)  # torch: no grads, no step
    # and a later batch with positives trains as usual
    fit(model, [(features, labels)], LazyAdam(0.01), progress=False)
    assert any(not np.array_equal(v.numpy(), b)
               for b, v in zip(before, model.trainable_variables, strict=True))


def test_fit_validates_a_two_tower_as_torch_does():
    schema, train_f, train_y = data(1, 64)
    _, va, ya = data(2, 24)
    _, vb, yb = data(3, 16)
    valid = [(va, ya), (vb, yb)]
    model = TwoTower(schema, tower=(8,), seed=0)
    history = fit(model, [(train_f, train_y)], LazyAdam(0.01), valid_loader=valid, progress=False)
    # the batches' in-batch losses, weighted by their rows (as torch's evaluate)
    expected_loss = (numpy_loss(model, va, ya) * 24 + numpy_loss(model, vb, yb) * 16) / 40
    assert history["val_loss"][0] == pytest.approx(expected_loss, rel=1e-5)
    scores, labels = [], []
    for f, y in valid:
        out = model(f, training=False)
        scores.append(np.sum(out["query"].numpy() * out["candidate"].numpy(), axis=1)
                      / model.temperature)
        labels.append(y.numpy())
    z, y = np.concatenate(scores).astype(np.float64), np.concatenate(labels)
    assert history["val_auc"][0] == pytest.approx(roc_auc(y, z), rel=1e-6)
    log_loss = float(np.mean(np.logaddexp(0.0, z) - y * z))
    assert history["val_log_loss"][0] == pytest.approx(log_loss, rel=1e-5)
    np.testing.assert_allclose(model.row_logits(va).numpy(), scores[0], rtol=1e-6)
    assert evaluate(model, valid)["auc"] == pytest.approx(roc_auc(y, z), rel=1e-6)

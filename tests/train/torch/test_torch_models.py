import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_data import categorical, make_retrieval_data, target  # noqa: E402

from tabstream.core.schema import Schema, Tags  # noqa: E402
from tabstream.train.torch import (  # noqa: E402
    DCN,
    DLRM,
    CrossNetwork,
    DotInteraction,
    LazyAdam,
    TwoTower,
    WideAndDeep,
    evaluate,
    fit,
    recall_at_k,
)

MODELS = {
    "dlrm": lambda s: DLRM(s, embedding_dim=16),
    "dcn-stacked": lambda s: DCN(s, structure="stacked"),
    "dcn-parallel": lambda s: DCN(s, structure="parallel", low_rank=8),
    "wide-and-deep": lambda s: WideAndDeep(s),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_learns_the_hidden_signal(name, ranking_data):
    """One epoch on 16k rows. A constant predictor scores AUC 0.5 and the true
    probabilities about 0.83; the model must reach 0.70 and come within 0.10 of
    the oracle (it typically lands 0.05 below it)."""
    torch.manual_seed(0)
    model = MODELS[name](ranking_data.schema)
    history = fit(model, ranking_data.train, LazyAdam(model.parameters(), lr=5e-3), epochs=1,
                  valid_loader=ranking_data.valid, progress=False)
    auc = history["val_auc"][-1]
    assert auc >= 0.70
    assert auc >= ranking_data.oracle_auc - 0.10
    # log-loss beats predicting the base rate for everyone
    y = torch.cat([labels for _, labels in ranking_data.valid]).numpy()
    base = y.mean()
    constant_log_loss = -(base * np.log(base) + (1 - base) * np.log(1 - base))
    assert history["val_log_loss"][-1] < constant_log_loss - 0.05
    # training, not a lucky initialization, got it there
    torch.manual_seed(0)
    before = evaluate(MODELS[name](ranking_data.schema), ranking_data.valid)["auc"]
    assert auc >= before + 0.05


def test_models_return_one_logit_per_row(ranking_data):
    features, labels = ranking_data.valid[0]
    for make in MODELS.values():
        out = make(ranking_data.schema)(features)
        assert out.shape == labels.shape and out.dtype == torch.float32


def test_dot_interaction_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 4, 5)).astype(np.float32)
    got = DotInteraction(4)(torch.as_tensor(x)).numpy()
    expected = [[x[b, i] @ x[b, j] for i in range(4) for j in range(i + 1, 4)] for b in range(3)]
    np.testing.assert_allclose(got, np.array(expected), rtol=1e-5)


def test_cross_network_matches_the_formula():
    torch.manual_seed(0)
    net = CrossNetwork(6, num_layers=2)
    x0 = torch.randn(4, 6)
    expected = x0.numpy().astype(np.float64)
    xl = expected
    for layer in net.layers:
        w, b = layer.weight.detach().numpy(), layer.bias.detach().numpy()
        xl = expected * (xl @ w.T + b) + xl
    np.testing.assert_allclose(net(x0).detach().numpy(), xl, rtol=1e-4, atol=1e-5)


def test_dlrm_needs_two_vectors():
    with pytest.raises(ValueError, match="DLRM needs at least two vectors"):
        DLRM(Schema([categorical("a", 10), target()]))
    with pytest.raises(ValueError, match="structure must be 'stacked' or 'parallel'"):
        DCN(Schema([categorical("a", 10)]), structure="diagonal")


def test_wide_columns_select_the_linear_part(ranking_data):
    model = WideAndDeep(ranking_data.schema, wide_columns=["c_small", "x1"])
    assert list(model.wide_inputs.embeddings.keys()) == ["c_small"]
    assert model.wide_inputs.embeddings["c_small"].embedding_dim == 1
    assert model.wide_linear.in_features == 1


def test_two_tower_learns_to_retrieve(retrieval_data):
    """200 candidate items: random ranking gives recall@10 = 0.05; knowing each
    user's taste cluster (20 items) gives about 0.45."""
    torch.manual_seed(0)
    model = TwoTower(retrieval_data.schema, output_dim=16)
    fit(model, retrieval_data.train, LazyAdam(model.parameters(), lr=1e-2), epochs=2,
        progress=False)
    recall = recall_at_k(model, retrieval_data.valid, k=10)
    assert recall >= 0.30
    assert model.recall_at_k(retrieval_data.valid, k=10) == recall


def test_two_tower_loss_is_in_batch_softmax():
    data = make_retrieval_data(seed=1, n_train=64, n_valid=0, batch_size=64, n_items=20)
    features, labels = data.train[0]
    labels = labels.clone()
    labels[::4] = 0  # a quarter of the rows are not positives
    torch.manual_seed(0)
    model = TwoTower(data.schema, output_dim=8, temperature=0.2, logq_correction=False)
    loss = model.compute_loss(features, labels)

    q = model.query_embeddings(features).detach().numpy()
    i = model.item_embeddings(features).detach().numpy()
    items = features["item_id"].numpy()
    pos = np.flatnonzero(labels.numpy() > 0.5)
    total = 0.0
    for a in pos:
        # negatives: the other positive rows' items, unless it is the same item
        others = [b for b in pos if b == a or items[b] != items[a]]
        scores = np.array([q[a] @ i[b] for b in others]) / 0.2
        total += np.log(np.exp(scores).sum()) - q[a] @ i[a] / 0.2
    np.testing.assert_allclose(loss.detach().item(), total / len(pos), rtol=1e-4)
    np.testing.assert_allclose(model(features).detach().numpy(), (q * i).sum(1) / 0.2, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("steps", [1, 2])
def test_two_tower_loss_with_logq_correction(steps):
    data = make_retrieval_data(seed=1, n_train=64, n_valid=0, batch_size=64, n_items=20)
    features, labels = data.train[0]
    labels = labels.clone()
    labels[::4] = 0
    torch.manual_seed(0)
    model = TwoTower(data.schema, output_dim=8, temperature=0.2)
    for _ in range(steps - 1):  # an earlier step saw the same positives
        model.compute_loss(features, labels)
    loss = model.compute_loss(features, labels)

    q = model.query_embeddings(features).detach().numpy()
    i = model.item_embeddings(features).detach().numpy()
    items = features["item_id"].numpy()
    pos = np.flatnonzero(labels.numpy() > 0.5)
    # positives' items counted once per step (this one included)
    counts = steps * np.bincount(items[pos], minlength=len(model.item_counts)).astype(np.float64)
    np.testing.assert_array_equal(model.item_counts.numpy(), counts)
    with np.errstate(divide="ignore"):  # items no positive holds: log 0, never looked up
        log_q = np.log(counts / counts.sum())
    total = 0.0
    for a in pos:
        others = [b for b in pos if b == a or items[b] != items[a]]
        scores = np.array([q[a] @ i[b] / 0.2 - log_q[items[b]] for b in others])
        total += np.log(np.exp(scores).sum()) - (q[a] @ i[a] / 0.2 - log_q[items[a]])
    np.testing.assert_allclose(loss.detach().item(), total / len(pos), rtol=1e-4)


def test_two_tower_does_not_count_items_in_eval_mode():
    data = make_retrieval_data(seed=1, n_train=64, n_valid=0, batch_size=64, n_items=20)
    features, labels = data.train[0]
    model = TwoTower(data.schema, output_dim=8).eval()
    model.compute_loss(features, labels)
    assert float(model.item_counts.sum()) == 0.0


def test_recall_at_k_matches_brute_force():
    data = make_retrieval_data(seed=2, n_train=0, n_valid=300, batch_size=64, n_items=50)
    torch.manual_seed(0)
    model = TwoTower(data.schema, output_dim=8)
    q = np.concatenate([model.query_embeddings(f).detach().numpy() for f, _ in data.valid])
    i = np.concatenate([model.item_embeddings(f).detach().numpy() for f, _ in data.valid])
    items = np.concatenate([f["item_id"].numpy() for f, _ in data.valid])
    candidates = {item: i[np.flatnonzero(items == item)[0]] for item in np.unique(items)}
    for k in (1, 5, 20):
        hits = 0
        for row in range(len(q)):
            scores = {item: q[row] @ emb for item, emb in candidates.items()}
            best = sorted(scores, key=scores.get, reverse=True)[:k]
            hits += items[row] in best
        assert recall_at_k(model, data.valid, k=k) == pytest.approx(hits / len(q))


def test_two_tower_needs_user_and_item_columns():
    schema = Schema([categorical("user_id", 10, [Tags.USER_ID]), categorical("x", 5), target()])
    with pytest.raises(ValueError, match=r"TwoTower needs columns tagged USER and columns tagged "
                                         r"ITEM.*ITEM \[\]"):
        TwoTower(schema)


def test_continuous_inputs_are_used(ranking_data):
    """The same ids with other continuous values give other logits."""
    model = DLRM(ranking_data.schema)
    features, _ = ranking_data.valid[0]
    shifted = {**features, "x1": features["x1"] + 1.0}
    assert not torch.allclose(model(features), model(shifted))
    assert set(model.inputs.continuous_names) == {"x1", "x2"}
    assert "click" not in model.inputs.embeddings.feature_names


def test_two_tower_trains_without_labels(retrieval_data):
    """A loader of positive interactions only may yield (features, None)."""
    unlabeled = [(features, None) for features, _ in retrieval_data.train[:10]]
    torch.manual_seed(0)
    model = TwoTower(retrieval_data.schema, output_dim=8)
    history = fit(model, unlabeled, LazyAdam(model.parameters(), lr=1e-2), progress=False)
    assert history["samples"] == [sum(len(f["user_id"]) for f, _ in unlabeled)]
    labeled = [(f, torch.ones(len(f["user_id"]))) for f, _ in unlabeled]
    assert recall_at_k(model, unlabeled, k=5) == recall_at_k(model, labeled, k=5)

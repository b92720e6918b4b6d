import io
from functools import partial

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_data import categorical, continuous  # noqa: E402

from tabstream.core.schema import Schema  # noqa: E402
from tabstream.train.torch import (  # noqa: E402
    DLRM,
    LazyAdam,
    MultiOptimizer,
    split_embeddings_on_size,
    table_configs_from_schema,
)


def lazy_adam_reference(w0, steps, lr, betas, eps, weight_decay):
    """The lazy Adam rule, one row at a time in numpy (float64).
    ``steps``: list of (ids, per-occurrence gradients)."""
    b1, b2 = betas
    w, m, v = w0.astype(np.float64).copy(), np.zeros(w0.shape), np.zeros(w0.shape)
    for t, (ids, grads) in enumerate(steps, start=1):
        summed = {}
        for i, g in zip(ids, grads):  # duplicate ids in a batch: gradients add up
            summed[i] = summed.get(i, 0.0) + g
        for r, g in summed.items():
            g = g + weight_decay * w[r]
            m[r] = b1 * m[r] + (1 - b1) * g
            v[r] = b2 * v[r] + (1 - b2) * g * g
            m_hat, v_hat = m[r] / (1 - b1**t), v[r] / (1 - b2**t)
            w[r] = w[r] - lr * m_hat / (np.sqrt(v_hat) + eps)
    return w, m, v


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_lazy_adam_matches_numpy_reference(seed, weight_decay):
    rng = np.random.default_rng(seed)
    rows, dim, lr, betas, eps = 50, 4, 0.05, (0.9, 0.99), 1e-6
    w0 = rng.normal(size=(rows, dim)).astype(np.float32)
    steps = []
    for _ in range(6):
        ids = rng.integers(0, 20, 12)  # rows 20..49 never appear
        ids[1] = ids[0]  # at least one duplicate per batch
        steps.append((ids, rng.normal(size=(12, dim))))

    table = torch.nn.Embedding(rows, dim, sparse=True)
    with torch.no_grad():
        table.weight.copy_(torch.as_tensor(w0))
    opt = LazyAdam(table.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    for ids, grads in steps:
        opt.zero_grad()
        # d/dE of sum(E[ids] * G) is G per occurrence
        (table(torch.as_tensor(ids)) * torch.as_tensor(grads, dtype=torch.float32)).sum().backward()
        assert table.weight.grad.is_sparse
        opt.step()

    w, m, v = lazy_adam_reference(w0, steps, lr, betas, eps, weight_decay)
    state = opt.state[table.weight]
    np.testing.assert_allclose(table.weight.detach().numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state["exp_avg"].numpy(), m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(state["exp_avg_sq"].numpy(), v, rtol=1e-5, atol=1e-9)
    # rows never in a batch: weights bit-identical, moments zero
    assert np.array_equal(table.weight.detach().numpy()[20:], w0[20:])
    assert not state["exp_avg"][20:].any() and not state["exp_avg_sq"][20:].any()
    assert state["step"] == len(steps)


def test_lazy_adam_equals_torch_adam_when_every_row_is_present():
    rng = np.random.default_rng(4)
    w0 = torch.as_tensor(rng.normal(size=(10, 3)), dtype=torch.float32)
    sparse_table = torch.nn.Embedding(10, 3, sparse=True)
    dense_table = torch.nn.Embedding(10, 3, sparse=False)
    dense_lazy = torch.nn.Linear(3, 2)
    dense_ref = torch.nn.Linear(3, 2)
    with torch.no_grad():
        sparse_table.weight.copy_(w0)
        dense_table.weight.copy_(w0)
        dense_ref.load_state_dict(dense_lazy.state_dict())
    lazy = LazyAdam([*sparse_table.parameters(), *dense_lazy.parameters()], lr=0.01)
    adam = torch.optim.Adam([*dense_table.parameters(), *dense_ref.parameters()], lr=0.01)
    for _ in range(5):
        ids = torch.as_tensor(np.concatenate([rng.permutation(10), rng.integers(0, 10, 5)]))
        x = torch.as_tensor(rng.normal(size=(4, 3)), dtype=torch.float32)
        for table, linear, opt in ((sparse_table, dense_lazy, lazy), (dense_table, dense_ref, adam)):
            opt.zero_grad()
            (table(ids).pow(2).sum() + linear(x).pow(2).sum()).backward()
            opt.step()
    torch.testing.assert_close(sparse_table.weight, dense_table.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dense_lazy.weight, dense_ref.weight, rtol=1e-5, atol=1e-6)


def test_lazy_adam_rejects_bad_settings():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError, match="lr must be >= 0"):
        LazyAdam(p, lr=-1)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        LazyAdam(p, betas=(0.9, 1.0))


# -- MultiOptimizer -----------------------------------------------------------

SCHEMA = Schema([categorical("user", 5000), categorical("item", 3000), categorical("cat", 20),
                 continuous("x")])


def make_model(seed=0):
    torch.manual_seed(seed)
    return DLRM(SCHEMA, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), sparse_threshold=1000)


def batch(rng, n=64):
    features = {"user": torch.as_tensor(rng.integers(0, 5000, n)),
                "item": torch.as_tensor(rng.integers(0, 3000, n)),
                "cat": torch.as_tensor(rng.integers(0, 20, n)),
                "x": torch.as_tensor(rng.normal(size=n), dtype=torch.float32)}
    return features, torch.as_tensor(rng.random(n) < 0.3, dtype=torch.float32)


def make_optimizer(model):
    large, _ = split_embeddings_on_size(model, threshold=1000)
    return MultiOptimizer(partial(torch.optim.Adam, lr=1e-2),
                          [(partial(LazyAdam, lr=5e-2), large)], model=model)


def train_steps(model, opt, batches):
    for features, labels in batches:
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(features), labels)
        loss.backward()
        opt.step()


def test_claims_split_the_model():
    model = make_model()
    opt = make_optimizer(model)
    names = {p: n for n, p in model.named_parameters()}
    held = {k: {names[p] for g in o.param_groups for p in g["params"]} for k, o in opt.optimizers.items()}
    large = {"inputs.embeddings.user.weight", "inputs.embeddings.item.weight"}
    assert held["0"] == large
    assert held["default"] == set(names.values()) - large
    assert isinstance(opt.optimizers["0"], LazyAdam)
    assert isinstance(opt.optimizers["default"], torch.optim.Adam)
    # the same claims through names and TableConfigs
    configs = [c for c in table_configs_from_schema(SCHEMA, dim=8) if c.cardinality > 1000]
    for claim in (configs, ["user", "item"], ["inputs.embeddings.user", "inputs.embeddings.item.weight"]):
        other = MultiOptimizer(torch.optim.Adam, [(LazyAdam, claim)], model=model)
        assert {names[p] for p in other.optimizers["0"].param_groups[0]["params"]} == large


def test_a_parameter_claimed_twice_is_rejected():
    model = make_model()
    large, _ = split_embeddings_on_size(model, threshold=1000)
    with pytest.raises(ValueError, match=r"'inputs\.embeddings\.user\.weight' is claimed by "
                                         r"optimizer '0' and by optimizer '1'"):
        MultiOptimizer(torch.optim.Adam, [(LazyAdam, large), (torch.optim.SGD, large[0])],
                       model=model)


def test_unfit_optimizers_and_leftovers_are_rejected():
    model = make_model()  # user and item tables have sparse gradients
    with pytest.raises(ValueError, match=r"'inputs\.embeddings\.user\.weight' has sparse gradients "
                                         r"but optimizer 'default' is a Adam"):
        MultiOptimizer(torch.optim.Adam, [], model=model)
    with pytest.raises(ValueError, match="has dense gradients but optimizer '0' is a SparseAdam"):
        MultiOptimizer(LazyAdam, [(torch.optim.SparseAdam, model.top)], model=model)
    built = torch.optim.Adam(model.top.parameters())
    with pytest.raises(ValueError, match=r"trainable parameters \[.*\] are updated by no optimizer"):
        MultiOptimizer(built, [], model=model)
    with pytest.raises(ValueError, match="'nope', which is no embedding table"):
        MultiOptimizer(LazyAdam, [(LazyAdam, "nope")], model=model)
    with pytest.raises(ValueError, match="needs model="):
        MultiOptimizer(LazyAdam, [(LazyAdam, model.top)])
    with pytest.raises(ValueError, match="built on other parameters"):
        MultiOptimizer(LazyAdam, [(LazyAdam(model.top.parameters()), model.bottom)], model=model)


def test_state_dict_round_trip_resumes_exactly():
    rng = np.random.default_rng(0)
    batches = [batch(rng) for _ in range(8)]

    straight = make_model()
    opt = make_optimizer(straight)
    train_steps(straight, opt, batches)

    first = make_model()
    opt1 = make_optimizer(first)
    train_steps(first, opt1, batches[:3])
    buffer = io.BytesIO()
    torch.save({"model": first.state_dict(), "optimizer": opt1.state_dict()}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer, weights_only=True)
    assert set(saved["optimizer"]["optimizers"]["0"]["state"]) == {
        "inputs.embeddings.user.weight", "inputs.embeddings.item.weight"}

    resumed = make_model(seed=123)  # different initial weights: everything must come from the state
    opt2 = make_optimizer(resumed)
    resumed.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["optimizer"])
    train_steps(resumed, opt2, batches[3:])
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name


def test_load_state_dict_checks_the_layout():
    model = make_model()
    opt = make_optimizer(model)
    state = opt.state_dict()
    other = MultiOptimizer(LazyAdam, [], model=model)
    with pytest.raises(ValueError, match=r"saved optimizers \['default', '0'\] do not match .*\['default'\]"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="not a MultiOptimizer state"):
        opt.load_state_dict(torch.optim.Adam(model.parameters()).state_dict())
    swapped = MultiOptimizer(partial(LazyAdam), [(LazyAdam, split_embeddings_on_size(model, 1000)[0])],
                             model=model)
    with pytest.raises(ValueError, match="optimizer 'default' was a Adam, now a LazyAdam"):
        swapped.load_state_dict(state)


def test_built_optimizers_without_a_model_and_shared_param_groups():
    table = torch.nn.Embedding(100, 4, sparse=True)
    head = torch.nn.Linear(4, 1)
    opt = MultiOptimizer(torch.optim.SGD(head.parameters(), lr=0.1),
                         [(LazyAdam(table.parameters(), lr=0.01), None)])
    assert set(opt.state_dict()["optimizers"]["0"]["param_groups"][0]["params"]) == {"0.0"}
    before = table.weight.detach().clone()
    head(table(torch.tensor([1, 2, 2]))).sum().backward()
    opt.step()
    changed = (table.weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == [1, 2]
    for group in opt.param_groups:
        group["lr"] = 0.5
    assert opt.optimizers["default"].param_groups[0]["lr"] == 0.5
    assert opt.optimizers["0"].param_groups[0]["lr"] == 0.5


@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")  # torch Adagrad, sparse
def test_the_documented_setup_runs():
    """The example of the optimizers module: all tables sparse, LazyAdam for the
    large ones, Adagrad for the small ones, Adam for the dense layers."""
    torch.manual_seed(0)
    model = DLRM(SCHEMA, embedding_dim=8, sparse=True)
    large, small = split_embeddings_on_size(model, threshold=1000)
    opt = MultiOptimizer(partial(torch.optim.Adam, lr=1e-3),
                         [(partial(LazyAdam, lr=1e-2), large),
                          (partial(torch.optim.Adagrad, lr=0.05), small)], model=model)
    assert [type(o).__name__ for o in opt.optimizers.values()] == ["Adam", "LazyAdam", "Adagrad"]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    train_steps(model, opt, [batch(np.random.default_rng(1))])
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == set(before)  # every optimizer stepped its parameters

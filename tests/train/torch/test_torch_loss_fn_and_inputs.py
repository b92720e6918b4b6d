"""torch ``fit``'s ``loss_fn`` (a scalar batch mean or ``[B]`` per-row losses, the
same training either way; another shape refused), labels of several targets handed
to ``loss_fn`` as a dict, and the models' up-front refusals (``combiner=None``,
ragged offsets of ``B`` entries, ``low_rank=0``). Expected weights come from a plain
SGD loop written out here."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from torch_data import categorical, continuous, target  # noqa: E402

from tabstream.core.errors import DataError  # noqa: E402
from tabstream.core.schema import Schema, Tags  # noqa: E402
from tabstream.train.torch import DCN, DLRM, TwoTower, WideAndDeep, evaluate, fit  # noqa: E402

pytestmark = pytest.mark.torch

SCHEMA = Schema([categorical("C1", 30), categorical("C2", 10), continuous("I1"), target()])


def batches(seed, n=3, rows=16, targets=("click",)):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {"C1": torch.as_tensor(rng.integers(0, 30, rows)),
             "C2": torch.as_tensor(rng.integers(0, 10, rows)),
             "I1": torch.as_tensor(rng.normal(size=rows).astype(np.float32))}
        y = {t: torch.as_tensor(rng.integers(0, 2, rows).astype(np.float32)) for t in targets}
        out.append((f, y if len(targets) > 1 else y[targets[0]]))
    return out


def model(seed=0):
    torch.manual_seed(seed)
    return DLRM(SCHEMA, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), sparse=False)


def plain_sgd(net, data, lr, batch_loss):
    """The simpler way: for each batch, the mean loss's gradient, ``w -= lr * g``."""
    losses, rows = [], []
    for f, y in data:
        net.zero_grad()
        loss = batch_loss(net(f), y)
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
        losses.append(float(loss.detach()))
        rows.append(len(f["C1"]))
    return float(np.dot(losses, rows) / np.sum(rows))


def assert_same(a, b):
    for (k, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=0, atol=1e-6, err_msg=k)


def per_row(z, y):
    return F.binary_cross_entropy_with_logits(z, y, reduction="none")


def mean(z, y):
    return F.binary_cross_entropy_with_logits(z, y)


def per_row_column(z, y):
    return per_row(z, y)[:, None]


@pytest.mark.parametrize("loss_fn", [per_row, mean, per_row_column], ids=["per-row", "scalar", "column"])
def test_a_per_row_or_a_scalar_loss_fn_trains_the_batch_mean(loss_fn):
    data = batches(1)
    expected = model()
    expected_loss = plain_sgd(expected, data, 0.5, mean)
    net = model()
    history = fit(net, data, torch.optim.SGD(net.parameters(), lr=0.5), loss_fn=loss_fn,
                  progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-6)
    # evaluate weighs both shapes alike: the mean over every row
    valid = batches(2, n=2, rows=8)
    with torch.no_grad():
        rows = [per_row(net(f), y).numpy() for f, y in valid]
    got = evaluate(net, valid, loss_fn=loss_fn)["loss"]
    assert got == pytest.approx(float(np.concatenate(rows).mean()), rel=1e-6)


@pytest.mark.parametrize(("bad", "shape"), [(lambda z, y: torch.stack([per_row(z, y)] * 2, 1), r"\(16, 2\)"),
                                            (lambda z, y: per_row(z, y)[:-1], r"\(15,\)")])
def test_a_loss_fn_of_another_shape_is_refused_naming_it(bad, shape):
    net = model()
    with pytest.raises(ValueError, match=rf"fit: loss_fn returned a tensor of shape {shape} for a "
                       r"batch of 16 rows; return a scalar \(the batch mean\) or one loss per "
                       r"row, shape \(16,\)"):
        fit(net, batches(1), torch.optim.SGD(net.parameters(), lr=0.5), loss_fn=bad,
            progress=False)


def two_targets(z, y):
    return mean(z, y["click"]) + 0.5 * mean(z, y["buy"])


def test_labels_of_several_targets_reach_the_loss_fn_as_a_dict():
    data = batches(3, targets=("click", "buy"))
    expected = model()
    expected_loss = plain_sgd(expected, data, 0.5, two_targets)
    net = model()
    history = fit(net, data, torch.optim.SGD(net.parameters(), lr=0.5), loss_fn=two_targets,
                  valid_loader=data, progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-6)
    with torch.no_grad():
        valid_loss = np.mean([float(two_targets(net(f), y)) for f, y in data])
    assert history["val_loss"][0] == pytest.approx(valid_loss, rel=1e-6)
    assert np.isnan(history["val_auc"][0])  # no one label to score against


def test_several_targets_without_a_loss_fn_say_what_to_pass():
    net = model()
    with pytest.raises(TypeError, match=r"fit: labels is a dict of 2 targets \['buy', 'click'\]; "
                       r"pass a loss_fn that takes \(logits, labels dict\)"):
        fit(net, batches(3, targets=("click", "buy")), torch.optim.SGD(net.parameters(), lr=0.1),
            progress=False)


def test_a_nan_in_one_of_several_targets_names_it():
    data = batches(3, targets=("click", "buy"))
    data[1][1]["buy"][2] = float("nan")
    net = model()
    with pytest.raises(DataError, match=r"label column 'buy' holds nan at epoch 1/1, step 2"):
        fit(net, data, torch.optim.SGD(net.parameters(), lr=0.1), loss_fn=two_targets,
            progress=False)


def test_a_tabstream_loader_with_two_labels_trains_with_a_dict_loss_fn(tmp_path):
    pd = pytest.importorskip("pandas")
    import tabstream as ts
    from tabstream.loaders.torch import Loader

    n = 32
    pd.DataFrame({"C1": np.arange(n) % 30, "C2": np.arange(n) % 10,
                  "I1": np.linspace(0, 1, n).astype("float32"),
                  "click": (np.arange(n) % 2).astype("float32"),
                  "buy": (np.arange(n) % 3 == 0).astype("float32")}).to_parquet(tmp_path / "p.parquet")
    loader = Loader(ts.Dataset(str(tmp_path / "p.parquet"), engine="parquet"), batch_size=16,
                    labels=["click", "buy"], features=["C1", "C2", "I1"])
    batches_seen = [(f, {k: v.clone() for k, v in y.items()}) for f, y in loader]
    expected = model()
    expected_loss = plain_sgd(expected, batches_seen, 0.5, two_targets)
    net = model()
    history = fit(net, loader, torch.optim.SGD(net.parameters(), lr=0.5), loss_fn=two_targets,
                  progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-6)


# -- refused up front ------------------------------------------------------------------

LIST_SCHEMA = Schema([categorical("C1", 10), categorical("tags", 10, is_list=True),
                      continuous("I1"), target()])


@pytest.mark.parametrize("cls", [DLRM, DCN, WideAndDeep])
def test_combiner_none_is_refused_by_the_ranking_models(cls):
    with pytest.raises(ValueError, match=rf"{cls.__name__}: combiner must be 'sum' or 'mean' .*"
                       r"got None"):
        cls(LIST_SCHEMA, embedding_dim=8, combiner=None)


def test_combiner_none_is_refused_by_two_tower():
    schema = Schema([categorical("u", 5, tags=[Tags.USER]), categorical("i", 5, tags=[Tags.ITEM])])
    with pytest.raises(ValueError, match=r"TwoTower: combiner must be 'sum' or 'mean'"):
        TwoTower(schema, combiner=None)


def ragged_features(offsets, keys=False):
    values = torch.tensor([1, 2, 3])
    tags = ({"tags__values": values, "tags__offsets": torch.tensor(offsets)} if keys
            else {"tags": (values, torch.tensor(offsets))})
    return {"C1": torch.tensor([1, 2]), **tags, "I1": torch.tensor([0.5, -0.5])}


@pytest.mark.parametrize("keys", [False, True], ids=["tuple", "keys"])
def test_ragged_offsets_of_b_entries_name_the_feature_and_the_length(keys):
    torch.manual_seed(0)
    net = DLRM(LIST_SCHEMA, embedding_dim=4)
    # the right offsets: row 0 pools ids 1, 2 and row 1 id 3, as a plain sum shows
    table = net.inputs.embeddings["tags"].weight
    pooled = net.inputs.embeddings(ragged_features([0, 2, 3], keys))["tags"]
    expected = torch.stack([table[1] + table[2], table[3]])
    np.testing.assert_allclose(pooled.detach().numpy(), expected.detach().numpy(), atol=1e-6)
    with pytest.raises(ValueError, match=r"list feature 'tags': offsets has 2 entries, but the "
                       r"batch has 2 rows \(feature 'C1'\); ragged offsets need B \+ 1 = 3 "
                       r"entries"):
        net(ragged_features([0, 3], keys))


def test_dcn_low_rank_zero_is_refused_and_one_is_low_rank():
    with pytest.raises(ValueError, match=r"low_rank must be None \(full-rank layers\) or an int "
                       r">= 1, got 0"):
        DCN(SCHEMA, low_rank=0)
    cross = DCN(SCHEMA, embedding_dim=4, low_rank=1).cross
    assert [tuple(m.weight.shape) for m in cross.layers[0]] == [(1, 9), (9, 1)]


from functools import partial

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_data import categorical, continuous, make_ranking_data, target  # noqa: E402

from tabstream.core.errors import DataError, SchemaError  # noqa: E402
from tabstream.core.schema import Schema  # noqa: E402
from tabstream.train.torch import (  # noqa: E402
    DCN,
    DLRM,
    LazyAdam,
    MultiOptimizer,
    NonFiniteLossError,
    NothingToTrainWarning,
    evaluate,
    fit,
    log_loss,
    roc_auc,
    split_embeddings_on_size,
)
from tabstream.train.torch.fit import CHECKPOINT_FILE, checkpoint_position  # noqa: E402


@pytest.fixture(scope="module")
def small():
    return make_ranking_data(seed=5, n_train=2048, n_valid=512, batch_size=128)


def make(schema, seed=0):
    """DLRM with sparse c_mid/c_big tables; LazyAdam for those, Adam for the rest."""
    torch.manual_seed(seed)
    model = DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(16,), sparse_threshold=300)
    large, _ = split_embeddings_on_size(model, threshold=299)
    optimizer = MultiOptimizer(partial(torch.optim.Adam, lr=3e-3),
                               [(partial(LazyAdam, lr=1e-2), large)], model=model)
    return model, optimizer


class Interrupted(Exception):
    pass


class EpochLoader:
    """A loader with set_epoch whose batch order depends on the epoch; it can be told
    to fail after some batches of some epoch, like a preempted job."""

    def __init__(self, batches, fail_at=None):
        self.batches, self.fail_at, self.epoch, self.epochs_seen = batches, fail_at, 0, []

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.epochs_seen.append(epoch)

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        order = np.random.default_rng(self.epoch).permutation(len(self.batches))
        for n, i in enumerate(order):
            if self.fail_at == (self.epoch, n):
                raise Interrupted
            yield self.batches[i]


def assert_same_parameters(a, b):
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name


def test_history_and_learning(small):
    model, optimizer = make(small.schema)
    loader = EpochLoader(small.train)
    history = fit(model, loader, optimizer, epochs=3, valid_loader=small.valid, progress=False)
    assert loader.epochs_seen == [0, 1, 2]
    assert history["epoch"] == [1, 2, 3]
    assert history["samples"] == [2048] * 3
    assert history["loss"][2] < history["loss"][0]
    assert all(s > 0 for s in history["samples_per_sec"])
    # validation metrics equal the ones computed by hand from the final model
    with torch.no_grad():
        logits = torch.cat([model(f) for f, _ in small.valid]).numpy()
    labels = torch.cat([y for _, y in small.valid]).numpy()
    p = 1 / (1 + np.exp(-logits.astype(np.float64)))
    assert history["val_log_loss"][-1] == pytest.approx(
        -np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)), rel=1e-5)
    assert history["val_loss"][-1] == pytest.approx(history["val_log_loss"][-1], rel=1e-4)
    assert history["val_auc"][-1] == pytest.approx(roc_auc(labels, logits))
    assert history["val_auc"][-1] > 0.6


def test_resume_from_epoch_checkpoint_equals_not_stopping(small, tmp_path):
    straight, opt = make(small.schema)
    expected = fit(straight, EpochLoader(small.train), opt, epochs=3, valid_loader=small.valid,
                   progress=False)

    first, opt1 = make(small.schema)
    fit(first, EpochLoader(small.train), opt1, epochs=1, valid_loader=small.valid,
        checkpoint_dir=tmp_path, progress=False)
    resumed, opt2 = make(small.schema, seed=99)  # fresh objects, other initial weights
    got = fit(resumed, EpochLoader(small.train), opt2, epochs=3, valid_loader=small.valid,
              checkpoint_dir=tmp_path, resume=True, progress=False)
    assert_same_parameters(straight, resumed)
    for key in ("epoch", "loss", "samples", "val_loss", "val_auc"):
        assert got[key] == expected[key], key


def test_resume_mid_epoch_equals_not_stopping(small, tmp_path):
    straight, opt = make(small.schema)
    expected = fit(straight, EpochLoader(small.train), opt, epochs=2, progress=False)

    crashing, opt1 = make(small.schema)
    with pytest.raises(Interrupted):
        fit(crashing, EpochLoader(small.train, fail_at=(1, 11)), opt1, epochs=2,
            checkpoint_dir=tmp_path, checkpoint_every=5, progress=False)
    saved = torch.load(tmp_path / CHECKPOINT_FILE, weights_only=True)  # plain tensors and values
    assert (saved["epoch"], saved["step"]) == (1, 10)

    resumed, opt2 = make(small.schema, seed=7)
    got = fit(resumed, EpochLoader(small.train), opt2, epochs=2, checkpoint_dir=tmp_path,
              resume=True, progress=False)
    assert_same_parameters(straight, resumed)
    assert got["loss"] == expected["loss"]


def test_resume_without_checkpoint_starts_afresh(small, tmp_path):
    a, opt_a = make(small.schema)
    b, opt_b = make(small.schema)
    fit(a, small.train, opt_a, epochs=1, progress=False)
    fit(b, small.train, opt_b, epochs=1, checkpoint_dir=tmp_path / "new", resume=True,
        progress=False)
    assert_same_parameters(a, b)
    assert (tmp_path / "new" / CHECKPOINT_FILE).exists()
    with pytest.raises(ValueError, match=r"fit: resume needs a checkpoint_dir"):
        fit(a, small.train, opt_a, resume=True, progress=False)


def test_resume_when_all_epochs_are_done_trains_nothing_and_says_so(small, tmp_path):
    done, opt = make(small.schema)
    expected = fit(done, EpochLoader(small.train), opt, epochs=2, checkpoint_dir=tmp_path,
                   progress=False)
    assert checkpoint_position(tmp_path) == (2, 0)
    again, opt2 = make(small.schema, seed=3)
    loader = EpochLoader(small.train)
    with pytest.warns(NothingToTrainWarning, match=r"checkpoint .*checkpoint.pt already holds 2 "
                      r"trained epoch\(s\) of this data and epochs=2 were asked for: nothing "
                      r"to train. New data \(another file list\) starts a new pass by itself"):
        got = fit(again, loader, opt2, epochs=2, checkpoint_dir=tmp_path, resume=True,
                  progress=False)
    assert loader.epochs_seen == []  # not one batch read
    assert_same_parameters(done, again)  # the checkpoint's model, loaded
    assert got["loss"] == expected["loss"] and got["epoch"] == [1, 2]
    # asking for more epochs trains just those, as one 3-epoch run would
    straight, opt3 = make(small.schema)
    fit(straight, EpochLoader(small.train), opt3, epochs=3, progress=False)
    more = fit(again, loader, opt2, epochs=3, checkpoint_dir=tmp_path, resume=True,
               progress=False)
    assert loader.epochs_seen == [2] and more["epoch"] == [1, 2, 3]
    assert_same_parameters(straight, again)
    assert checkpoint_position(tmp_path) == (3, 0)
    assert checkpoint_position(tmp_path / "none") is None


class DropoutModel(torch.nn.Module):
    """Logits from the continuous features through dropout: training draws from
    torch's global RNG, so a resumed run equals a straight one only if it restores it."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 1)

    def forward(self, features):
        x = torch.stack([features["x1"], features["x2"]], dim=1)
        return self.linear(torch.nn.functional.dropout(x, 0.5, self.training)).reshape(-1)


def test_resume_restores_the_torch_rng(small, tmp_path):
    torch.manual_seed(0)
    straight = DropoutModel()
    fit(straight, EpochLoader(small.train), torch.optim.SGD(straight.parameters(), lr=0.1),
        epochs=2, progress=False)
    torch.manual_seed(0)
    first = DropoutModel()
    fit(first, EpochLoader(small.train), torch.optim.SGD(first.parameters(), lr=0.1), epochs=1,
        checkpoint_dir=tmp_path, progress=False)
    torch.manual_seed(12345)  # another process, another global RNG state
    resumed = DropoutModel()
    fit(resumed, EpochLoader(small.train), torch.optim.SGD(resumed.parameters(), lr=0.1),
        epochs=2, checkpoint_dir=tmp_path, resume=True, progress=False)
    assert_same_parameters(straight, resumed)


def test_resume_on_a_shorter_loader_says_nothing_was_trained(small, tmp_path):
    crashing, opt1 = make(small.schema)
    with pytest.raises(Interrupted):
        fit(crashing, EpochLoader(small.train, fail_at=(0, 12)), opt1, epochs=1,
            checkpoint_dir=tmp_path, checkpoint_every=10, progress=False)
    assert checkpoint_position(tmp_path) == (0, 10)
    resumed, opt2 = make(small.schema)
    with pytest.warns(NothingToTrainWarning, match=r"stopped after 10 batches of epoch 1, but "
                      r"the loader yields only 4: nothing was trained"):
        fit(resumed, EpochLoader(small.train[:4]), opt2, epochs=1, checkpoint_dir=tmp_path,
            resume=True, progress=False)


def test_resume_refuses_a_checkpoint_of_another_model(small, tmp_path):
    model, opt = make(small.schema)
    fit(model, small.train, opt, epochs=1, checkpoint_dir=tmp_path, progress=False)
    path = str(tmp_path / CHECKPOINT_FILE)
    other = DCN(small.schema, embedding_dim=8)
    with pytest.raises(SchemaError, match=rf"checkpoint {path} was written for a DLRM model, "
                       "not DCN"):
        fit(other, small.train, torch.optim.Adam(other.parameters()), checkpoint_dir=tmp_path,
            resume=True, progress=False)
    wider = DLRM(small.schema, embedding_dim=16, bottom_mlp=(16,), top_mlp=(16,))
    # the wider model's tables, computed a second way from its own parameters
    changed = [k for k, v in wider.state_dict().items() if v.shape != model.state_dict()[k].shape]
    assert changed
    with pytest.raises(SchemaError, match=rf"checkpoint {path} does not match this DLRM .*"
                       rf"'{changed[0]}' has shape .* in the checkpoint, .* in the model"):
        fit(wider, small.train, torch.optim.Adam(wider.parameters()), checkpoint_dir=tmp_path,
            resume=True, progress=False)
    same, _ = make(small.schema)
    plain = torch.optim.SGD(same.parameters(), lr=0.1)
    with pytest.raises(SchemaError, match=rf"checkpoint {path}: its optimizer state does not "
                       "fit this SGD"):
        fit(same, small.train, plain, checkpoint_dir=tmp_path, resume=True, progress=False)


def test_resume_refuses_an_unreadable_or_foreign_checkpoint(small, tmp_path):
    model, opt = make(small.schema)
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(DataError, match=r"cannot read checkpoint .*checkpoint.pt"):
        fit(model, small.train, opt, checkpoint_dir=tmp_path, resume=True, progress=False)
    torch.save({"weights": torch.zeros(2)}, tmp_path / CHECKPOINT_FILE)
    with pytest.raises(DataError, match=r"checkpoint.pt is not a tabstream checkpoint \(format None"):
        fit(model, small.train, opt, checkpoint_dir=tmp_path, resume=True, progress=False)


class PoisonedLoader:
    """Clean batches, except that in the second epoch the third batch has a NaN input."""

    def __init__(self, batches):
        self.batches, self.epoch = batches, 0
        features, labels = batches[2]
        x1 = features["x1"].clone()
        x1[7] = float("nan")
        self.poisoned = ({**features, "x1": x1}, labels)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i, batch in enumerate(self.batches):
            yield self.poisoned if (self.epoch, i) == (1, 2) else batch


def test_nan_loss_stops_with_a_clear_error(small):
    batches = small.train[:5]
    model, optimizer = make(small.schema)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 2/3, step 3 \(global step 8\)"):
        fit(model, PoisonedLoader(batches), optimizer, epochs=3, progress=False)
    assert issubclass(NonFiniteLossError, FloatingPointError)
    # the bad step was not applied: same weights as training on the 7 good batches only
    reference, opt_ref = make(small.schema)
    fit(reference, batches + batches[:2], opt_ref, epochs=1, progress=False)
    assert_same_parameters(model, reference)


def test_plain_adam_on_sparse_tables_says_what_to_use(small):
    torch.manual_seed(0)
    model = DLRM(small.schema, embedding_dim=8, sparse=True)
    with pytest.raises(TypeError, match="use tabstream.train.torch.LazyAdam"):
        fit(model, small.train[:1], torch.optim.Adam(model.parameters()), progress=False)


def test_progress_bar_shows_throughput(small, capsys):
    model, optimizer = make(small.schema)
    fit(model, small.train, optimizer, epochs=1, valid_loader=small.valid, progress=True)
    out = capsys.readouterr()
    text = out.out + out.err
    assert "epoch 1/1" in text and "samples/s" in text and "val_auc" in text


def test_evaluate_and_loader_contract(small):
    model, _ = make(small.schema)
    metrics = evaluate(model, small.valid)
    with torch.no_grad():
        logits = torch.cat([model(f) for f, _ in small.valid])
    labels = torch.cat([y for _, y in small.valid])
    assert metrics["samples"] == 512
    assert metrics["log_loss"] == pytest.approx(log_loss(labels, logits))
    assert metrics["loss"] == pytest.approx(float(torch.nn.functional.binary_cross_entropy_with_logits(
        logits, labels)), rel=1e-5)
    # labels as a one-entry dict (one target) work; several targets need a loss_fn
    as_dict = [(f, {"click": y}) for f, y in small.valid]
    assert evaluate(model, as_dict)["auc"] == pytest.approx(metrics["auc"])
    with pytest.raises(TypeError, match="labels is a dict of 2 targets"):
        evaluate(model, [(f, {"a": y, "b": y}) for f, y in small.valid])
    with pytest.raises(TypeError, match=r"must yield \(features dict, labels\) pairs"):
        fit(model, [torch.zeros(3)], LazyAdam(model.parameters()), progress=False)


def test_custom_loss_fn_is_used():
    schema = Schema([categorical("a", 10), categorical("b", 10), continuous("x"), target()])
    torch.manual_seed(0)
    model = DLRM(schema, embedding_dim=8)
    features = {"a": torch.arange(8) % 10, "b": torch.arange(8) % 3, "x": torch.ones(8)}
    batches = [(features, torch.full((8,), 2.0))]
    mse = lambda logits, y: ((logits - y) ** 2).mean()  # noqa: E731
    history = fit(model, batches * 50, LazyAdam(model.parameters(), lr=0.02), epochs=1,
                  loss_fn=mse, progress=False)
    assert model(features).mean().item() == pytest.approx(2.0, abs=0.2)
    assert history["loss"][0] > 0

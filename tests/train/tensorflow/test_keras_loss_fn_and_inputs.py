"""Keras ``fit``'s ``loss_fn`` (a scalar batch mean or ``[B]`` per-row losses, the
same training either way, as torch's ``fit``; another shape refused), labels of
several targets handed to ``loss_fn`` as a dict, and the up-front refusals of ragged
offsets of ``B`` entries and ``low_rank=0``. Expected weights come from a plain SGD
loop with a GradientTape written out here."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import categorical  # noqa: E402

from tabstream.core.errors import DataError  # noqa: E402
from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import DCN, DLRM, evaluate, fit  # noqa: E402

pytestmark = pytest.mark.tensorflow

CLICK = ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])
SCHEMA = Schema([categorical("C1", 30), categorical("C2", 10),
                 ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]), CLICK])


def batches(seed, n=3, rows=16, targets=("click",)):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {"C1": tf.constant(rng.integers(0, 30, rows)), "C2": tf.constant(rng.integers(0, 10, rows)),
             "I1": tf.constant(rng.normal(size=rows).astype(np.float32))}
        y = {t: tf.constant(rng.integers(0, 2, rows).astype(np.float32)) for t in targets}
        out.append((f, y if len(targets) > 1 else y[targets[0]]))
    return out


def model():
    net = DLRM(SCHEMA, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    net(net.example_batch())
    return net


def per_row(z, y):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=z)


def mean(z, y):
    return tf.reduce_mean(per_row(z, y))


def plain_sgd(net, data, lr, batch_loss):
    """The simpler way: for each batch, the mean loss's gradient, ``w -= lr * g``."""
    losses, rows = [], []
    for f, y in data:
        with tf.GradientTape() as tape:
            loss = batch_loss(net(f, training=True), y)
        grads = tape.gradient(loss, net.trainable_variables)
        for v, g in zip(net.trainable_variables, grads, strict=True):
            v.assign_sub(lr * tf.convert_to_tensor(g))
        losses.append(float(loss))
        rows.append(int(f["C1"].shape[0]))
    return float(np.dot(losses, rows) / np.sum(rows))


def assert_same(a, b):
    for x, y in zip(a.trainable_variables, b.trainable_variables, strict=True):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=0, atol=1e-6, err_msg=x.path)


def per_row_column(z, y):
    return per_row(z, y)[:, None]


@pytest.mark.parametrize("loss_fn", [per_row, mean, per_row_column], ids=["per-row", "scalar", "column"])
def test_a_per_row_or_a_scalar_loss_fn_trains_the_batch_mean(loss_fn):
    data = batches(1)
    expected = model()
    expected_loss = plain_sgd(expected, data, 0.5, mean)
    net = model()
    history = fit(net, data, keras.optimizers.SGD(0.5), loss_fn=loss_fn, progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-5)
    # evaluate weighs both shapes alike: the mean over every row
    valid = batches(2, n=2, rows=8)
    rows = np.concatenate([per_row(net(f), y).numpy() for f, y in valid])
    got = evaluate(net, valid, loss_fn=loss_fn)["loss"]
    assert got == pytest.approx(float(rows.mean()), rel=1e-5)


def test_a_loss_fn_of_another_rank_is_refused_naming_its_shape():
    net = model()
    with pytest.raises(ValueError, match=r"fit: loss_fn returned a tensor of shape \[None, 2\]; "
                       r"return a scalar \(the batch mean\) or one loss per row, shape \[B\]"):
        fit(net, batches(1), keras.optimizers.SGD(0.5),
            loss_fn=lambda z, y: tf.stack([per_row(z, y)] * 2, axis=1), progress=False)


def test_a_per_row_loss_fn_of_another_length_is_refused():
    net = model()
    with pytest.raises(ValueError, match=r"fit: loss_fn returned one value per row for a batch "
                       r"of another number of rows"):
        fit(net, batches(1), keras.optimizers.SGD(0.5),
            loss_fn=lambda z, y: per_row(z, y)[:-1], progress=False)
    with pytest.raises(ValueError, match=r"evaluate: loss_fn returned a tensor of shape \[15\] "
                       r"for a batch of 16 rows"):
        evaluate(net, batches(1), loss_fn=lambda z, y: per_row(z, y)[:-1])


def two_targets(z, y):
    return mean(z, y["click"]) + 0.5 * mean(z, y["buy"])


def test_labels_of_several_targets_reach_the_loss_fn_as_a_dict():
    data = batches(3, targets=("click", "buy"))
    expected = model()
    expected_loss = plain_sgd(expected, data, 0.5, two_targets)
    net = model()
    history = fit(net, data, keras.optimizers.SGD(0.5), loss_fn=two_targets, valid_loader=data,
                  progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-5)
    valid_loss = np.mean([float(two_targets(net(f), y)) for f, y in data])
    assert history["val_loss"][0] == pytest.approx(valid_loss, rel=1e-5)
    assert np.isnan(history["val_auc"][0])  # no one label to score against, as torch


def test_several_targets_without_a_loss_fn_say_what_to_pass():
    with pytest.raises(TypeError, match=r"fit: labels is a dict of 2 targets \['buy', 'click'\]; "
                       r"pass a loss_fn that takes \(logits, labels dict\)"):
        fit(model(), batches(3, targets=("click", "buy")), keras.optimizers.SGD(0.1),
            progress=False)


def test_a_nan_in_one_of_several_targets_names_it():
    data = batches(3, targets=("click", "buy"))
    buy = data[1][1]["buy"].numpy().copy()
    buy[2] = np.nan
    data[1][1]["buy"] = tf.constant(buy)
    with pytest.raises(DataError, match=r"label column 'buy' holds nan at epoch 1/1, step 2"):
        fit(model(), data, keras.optimizers.SGD(0.1), loss_fn=two_targets, progress=False)


def test_a_tabstream_loader_with_two_labels_trains_with_a_dict_loss_fn(tmp_path):
    pd = pytest.importorskip("pandas")
    import tabstream as ts
    from tabstream.loaders.tensorflow import Loader

    n = 32
    pd.DataFrame({"C1": np.arange(n) % 30, "C2": np.arange(n) % 10,
                  "I1": np.linspace(0, 1, n).astype("float32"),
                  "click": (np.arange(n) % 2).astype("float32"),
                  "buy": (np.arange(n) % 3 == 0).astype("float32")}).to_parquet(tmp_path / "p.parquet")
    loader = Loader(ts.Dataset(str(tmp_path / "p.parquet"), engine="parquet"), batch_size=16,
                    labels=["click", "buy"], features=["C1", "C2", "I1"])
    seen = list(loader)
    expected = model()
    expected_loss = plain_sgd(expected, seen, 0.5, two_targets)
    net = model()
    history = fit(net, loader, keras.optimizers.SGD(0.5), loss_fn=two_targets, progress=False)
    assert_same(net, expected)
    assert history["loss"][0] == pytest.approx(expected_loss, rel=1e-5)


# -- refused up front ------------------------------------------------------------------

LIST_SCHEMA = Schema([categorical("C1", 10), categorical("tags", 10, is_list=True),
                      ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]), CLICK])


def ragged(offsets):
    return {"C1": tf.constant([1, 2]), "tags": (tf.constant([1, 2, 3]), tf.constant(offsets)),
            "I1": tf.constant([0.5, -0.5])}


def test_ragged_offsets_of_b_entries_name_the_feature_and_the_length():
    net = DLRM(LIST_SCHEMA, embedding_dim=4, seed=0)
    assert net(ragged([0, 2, 3])).shape == (2,)  # built on the right offsets
    tables = net.embeddings
    pooled = tables(ragged([0, 2, 3]))["tags"].numpy()  # row 0: ids 1, 2; row 1: id 3
    table = tables.tables["tags"].embeddings.numpy()
    np.testing.assert_allclose(pooled, np.stack([table[1] + table[2], table[3]]), atol=1e-6)
    with pytest.raises(ValueError, match=r"list feature 'tags': offsets has 2 entries, but the "
                       r"batch has 2 rows \(feature 'C1'\); ragged offsets need B \+ 1 = 3 "
                       r"entries"):
        net(ragged([0, 3]))
    # inside a tf.function of open shapes: the same words, from the in-graph check
    spec = {"C1": tf.TensorSpec([None], tf.int32),
            "tags": (tf.TensorSpec([None], tf.int32), tf.TensorSpec([None], tf.int32)),
            "I1": tf.TensorSpec([None], tf.float32)}
    traced = tf.function(lambda f: net(f), input_signature=[spec])
    assert traced(ragged([0, 2, 3])).shape == (2,)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"list feature .+tags.+: the offsets"
                       r".+ entries \(x\) differ from the batch.+s rows plus one"):
        traced(ragged([0, 3]))


def test_dcn_low_rank_zero_is_refused_as_in_torch():
    with pytest.raises(ValueError, match=r"low_rank must be None \(full-rank layers\) or an int "
                       r">= 1, got 0"):
        DCN(SCHEMA, low_rank=0)
    net = DCN(SCHEMA, embedding_dim=4, low_rank=1, seed=0)
    net(net.example_batch())
    assert tuple(net.cross.u_0.shape) == (9, 1) and tuple(net.cross.v_0.shape) == (1, 9)

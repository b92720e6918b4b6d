"""``tabstream.train.tensorflow.fit``, the custom loop, on one process (the
two-worker run is in test_tf_distributed.py)."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import ranking_data, roc_auc  # noqa: E402

from tabstream.core.errors import SchemaError  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    LazyAdam,
    MultiOptimizer,
    NonFiniteLossError,
    NothingToTrainWarning,
    evaluate,
    fit,
    split_embeddings_on_size,
)

pytestmark = pytest.mark.tensorflow


def batches(seed: int, rows: int = 384, size: int = 128):
    schema, features, labels, _ = ranking_data(seed, rows=rows, list_cardinality=0)
    out = []
    for start in range(0, rows, size):
        out.append(({k: tf.constant(v[start:start + size]) for k, v in features.items()},
                    tf.constant(labels[start:start + size])))
    return schema, out, features, labels


def model_for(schema):
    return DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=0)


def multi_optimizer(model):
    large, _ = split_embeddings_on_size(model.embeddings, threshold=100)
    return MultiOptimizer(keras.optimizers.Adam(0.01), [(LazyAdam(0.02), large)])


def test_history_is_the_loss_and_exact_metrics_of_the_rows():
    schema, train, features, labels = batches(0)
    _, valid, v_features, v_labels = batches(1, rows=300, size=100)
    model = model_for(schema)
    # learning rate 0: the weights stay as built, so the epoch's loss is the
    # initial model's mean binary cross-entropy over every training row
    history = fit(model, train, keras.optimizers.SGD(0.0), epochs=1, valid_loader=valid,
                  progress=False)
    z = np.asarray(model({k: tf.constant(v) for k, v in features.items()}), np.float64)
    expected = np.mean(np.logaddexp(0.0, z) - labels * z)
    assert history["loss"] == [pytest.approx(expected, rel=1e-5)]
    assert history["samples"] == [384]
    assert history["epoch"] == [1]
    zv = np.asarray(model({k: tf.constant(v) for k, v in v_features.items()}), np.float64)
    assert history["val_auc"] == [pytest.approx(roc_auc(v_labels, zv), abs=1e-9)]
    assert history["val_log_loss"] == [pytest.approx(
        np.mean(np.logaddexp(0.0, zv) - v_labels * zv), rel=1e-5)]
    assert evaluate(model, valid)["auc"] == pytest.approx(roc_auc(v_labels, zv), abs=1e-9)


def test_training_lowers_the_loss():
    schema, train, *_ = batches(2, rows=2048, size=256)
    model = model_for(schema)
    history = fit(model, train, multi_optimizer(model), epochs=3, progress=False)
    assert history["loss"][-1] < history["loss"][0] - 0.02, history["loss"]


def test_resume_continues_as_if_never_stopped(tmp_path):
    schema, train, *_ = batches(3)
    straight = model_for(schema)
    fit(straight, train, multi_optimizer(straight), epochs=2, progress=False)

    first = model_for(schema)
    fit(first, train, multi_optimizer(first), epochs=1, checkpoint_dir=tmp_path, progress=False)
    assert json.loads((tmp_path / "checkpoint.json").read_text())["epoch"] == 1
    resumed = model_for(schema)  # a new process: fresh model and optimizer
    history = fit(resumed, train, multi_optimizer(resumed), epochs=2, checkpoint_dir=tmp_path,
                  resume=True, progress=False)
    assert history["epoch"] == [1, 2]
    # the optimizer's moments came back too: the second epoch's steps are the same
    for a, b in zip(straight.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)

    again = model_for(schema)
    with pytest.warns(NothingToTrainWarning, match="already holds 2 trained epoch"):
        fit(again, train, multi_optimizer(again), epochs=2, checkpoint_dir=tmp_path,
            resume=True, progress=False)


def test_resume_with_another_optimizer_is_refused(tmp_path):
    schema, train, *_ = batches(4)
    model = model_for(schema)
    fit(model, train, multi_optimizer(model), epochs=1, checkpoint_dir=tmp_path, progress=False)
    other = model_for(schema)
    with pytest.raises(SchemaError, match=r"checkpoint\.optimizer\.npz: it holds \d+ optimizer "
                                          r"variables but this SGD has \d+"):
        fit(other, train, keras.optimizers.SGD(0.1, momentum=0.9), epochs=2,
            checkpoint_dir=tmp_path, resume=True, progress=False)


def test_a_nan_loss_stops_with_the_step():
    schema, train, *_ = batches(5)
    features, labels = train[1]
    # A NaN feature may be swallowed by a ReLU (its kernels differ on NaN), and NaN
    # labels are refused before the loss (test_training_inputs): labels of -1 make
    # this loss NaN (sqrt(-1)) and leave it the cross-entropy elsewhere
    train[1] = (features, tf.fill(tf.shape(labels), np.float32(-1.0)))

    def loss_fn(logits, y):
        y = tf.cast(tf.reshape(y, [-1]), tf.float32)
        bce = tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=tf.reshape(logits, [-1]))
        return bce + 0.0 * tf.sqrt(y)

    model = model_for(schema)
    with pytest.raises(NonFiniteLossError, match=r"loss is nan at epoch 1/1, step 2"):
        fit(model, train, LazyAdam(0.01), loss_fn=loss_fn, progress=False)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"epochs": -1}, ValueError, r"fit: epochs must be >= 0, got -1"),
    ({"epochs": 1.5}, TypeError, r"fit: epochs must be an int, got 1\.5"),
    ({"resume": True}, ValueError, r"fit: resume needs a checkpoint_dir"),
    ({"strategy": "mirrored"}, TypeError, r"strategy must be a tf\.distribute\.Strategy, got str"),
])
def test_bad_arguments(kwargs, error, match):
    schema, train, *_ = batches(6, rows=128)
    with pytest.raises(error, match=match):
        fit(model_for(schema), train, LazyAdam(), progress=False, **kwargs)


def test_wrong_model_or_optimizer_types():
    schema, train, *_ = batches(6, rows=128)
    with pytest.raises(TypeError, match=r"fit: model must be a keras\.Model, got function"):
        fit(lambda x: x, train, LazyAdam(), progress=False)
    with pytest.raises(TypeError, match=r"fit: optimizer must be a keras optimizer .* got str"):
        fit(model_for(schema), train, "adam", progress=False)


def test_batches_without_labels_are_refused():
    schema, train, *_ = batches(6, rows=128)
    with pytest.raises(ValueError, match=r"fit: the loader yields no labels"):
        fit(model_for(schema), [f for f, _ in train], LazyAdam(), progress=False)


def test_a_model_built_outside_the_strategy_scope_is_refused():
    schema, train, *_ = batches(7, rows=128)
    model = model_for(schema)
    model(model.example_batch())  # variables made outside any strategy
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with pytest.raises(ValueError, match=r"was not created under the strategy MirroredStrategy"):
        fit(model, train, LazyAdam(), strategy=strategy, progress=False)


def test_one_replica_mirrored_strategy_trains_like_the_default_strategy():
    schema, train, *_ = batches(8)
    plain = model_for(schema)
    fit(plain, train, multi_optimizer(plain), epochs=1, progress=False)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = model_for(schema)
        mirrored(mirrored.example_batch())
        optimizer = multi_optimizer(mirrored)
    fit(mirrored, train, optimizer, epochs=1, strategy=strategy, progress=False)
    for a, b in zip(plain.get_weights(), mirrored.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_two_tower_trains_with_its_own_loss_under_a_strategy():
    from tf_synthetic import retrieval_data

    from tabstream.train.tensorflow import TwoTower

    schema, features, labels = retrieval_data(seed=0, rows=512)
    data = [({k: tf.constant(v[i:i + 128]) for k, v in features.items()},
             tf.constant(labels[i:i + 128])) for i in range(0, 512, 128)]
    plain = TwoTower(schema, tower=(8,), seed=0)
    expected = fit(plain, data, LazyAdam(0.01), progress=False)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    with strategy.scope():
        mirrored = TwoTower(schema, tower=(8,), seed=0)
        mirrored(mirrored.example_batch())
        optimizer = LazyAdam(0.01)
    got = fit(mirrored, data, optimizer, strategy=strategy, progress=False)
    assert got["loss"] == [pytest.approx(expected["loss"][0], rel=1e-5)]
    # the log-Q item counts saw every positive row once
    counts = np.bincount(features["item_id"][labels > 0], minlength=plain.item_counts.shape[0])
    np.testing.assert_array_equal(mirrored.item_counts.numpy(), counts)
    np.testing.assert_array_equal(plain.item_counts.numpy(), counts)


def test_validating_a_model_without_logits_is_refused():
    from tf_synthetic import retrieval_data

    from tabstream.train.tensorflow import TwoTower

    class NoRowLogits(TwoTower):  # TwoTower itself validates (test_keras_twotower_fixes.py)
        row_logits = None

    schema, features, labels = retrieval_data(seed=0, rows=128)
    data = [({k: tf.constant(v) for k, v in features.items()}, tf.constant(labels))]
    model = NoRowLogits(schema, tower=(8,), seed=0)
    with pytest.raises(TypeError, match=r"fit: valid_loader= needs one logit per row .* "
                       r"NoRowLogits has its own compute_loss but no row_logits"):
        fit(model, data, LazyAdam(0.01), valid_loader=data, progress=False)

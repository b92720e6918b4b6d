import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import categorical, ranking_data, retrieval_data, roc_auc  # noqa: E402

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DCN,
    DLRM,
    LazyAdam,
    MultiOptimizer,
    TwoTower,
    WideAndDeep,
    binary_classification_metrics,
    split_embeddings_on_size,
)

SMALL = {
    DLRM: {"embedding_dim": 8, "bottom_mlp": (16,), "top_mlp": (16,)},
    DCN: {"cross_layers": 2, "deep": (16,)},
    WideAndDeep: {"deep": (16,)},
}


def dataset(features, labels, rows, batch):
    sliced = {k: v[rows] for k, v in features.items()}
    return tf.data.Dataset.from_tensor_slices((sliced, labels[rows])).batch(batch)


def optimizer_for(model_cls, model):
    # a different optimizer setup per model, so each is exercised end to end
    if model_cls is DLRM:
        large, _ = split_embeddings_on_size(model.embeddings, threshold=100)
        return MultiOptimizer(keras.optimizers.Adam(0.005), [(LazyAdam(0.01), large)])
    if model_cls is DCN:
        return LazyAdam(0.005)
    return keras.optimizers.Adam(0.005)


@pytest.mark.slow
@pytest.mark.parametrize("model_cls", [DLRM, DCN, WideAndDeep])
def test_ranking_model_learns_the_hidden_signal(model_cls):
    schema, features, labels, prob = ranking_data(seed=0, rows=12_000)
    train, valid = slice(0, 10_000), slice(10_000, None)
    model = model_cls(schema, seed=0, **SMALL[model_cls])
    model.compile(
        optimizer=optimizer_for(model_cls, model),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=binary_classification_metrics(),
    )
    history = model.fit(
        dataset(features, labels, train, 250),
        validation_data=dataset(features, labels, valid, 1000),
        epochs=2,
        shuffle=False,
        verbose=0,
    )
    logits = model.predict(dataset(features, labels, valid, 1000), verbose=0)
    auc = roc_auc(labels[valid], logits)
    oracle = roc_auc(labels[valid], prob[valid])
    # The trivial model scores 0.5; the stated margin is 0.2 (the oracle is about 0.88).
    assert auc >= 0.70, (auc, oracle)
    assert auc <= oracle + 0.02
    # Keras's AUC metric got logits and agrees with the exact AUC (it bins thresholds).
    assert history.history["val_auc"][-1] == pytest.approx(auc, abs=0.01)


@pytest.mark.parametrize("model_cls", [DLRM, DCN, WideAndDeep])
def test_list_feature_layouts_give_the_same_logits(model_cls):
    schema, features, labels, _ = ranking_data(seed=3, rows=64)
    model = model_cls(schema, seed=0, **SMALL[model_cls])
    padded = {k: tf.constant(v) for k, v in features.items()}
    ragged = dict(padded, tags=tf.RaggedTensor.from_tensor(padded["tags"], padding=0))
    tuple_mask = {k: v for k, v in padded.items() if k != "tags__mask"}
    tuple_mask["tags"] = (padded["tags"], padded["tags__mask"])
    out_padded = model(padded).numpy()
    assert out_padded.shape == (64,)  # as the torch models: one logit per row
    np.testing.assert_allclose(model(ragged).numpy(), out_padded, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(model(tuple_mask).numpy(), out_padded, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model_cls", [DLRM, DCN, WideAndDeep])
def test_ranking_model_config_round_trip(model_cls):
    schema, features, _, _ = ranking_data(seed=1, rows=32)
    batch = {k: tf.constant(v) for k, v in features.items()}
    model = model_cls(schema, seed=0, **SMALL[model_cls])
    expected = model(batch).numpy()
    clone = model_cls.from_config(model.get_config())
    clone(batch)
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(batch).numpy(), expected, rtol=1e-6)


@pytest.mark.slow
def test_keras_model_file_round_trip_with_multi_optimizer(tmp_path):
    schema, features, labels, _ = ranking_data(seed=2, rows=256)
    model = DLRM(schema, seed=0, **SMALL[DLRM])
    model.compile(
        optimizer=optimizer_for(DLRM, model), loss=keras.losses.BinaryCrossentropy(from_logits=True)
    )
    model.fit(dataset(features, labels, slice(None), 128), epochs=1, shuffle=False, verbose=0)
    path = str(tmp_path / "dlrm.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    batch = {k: tf.constant(v[:16]) for k, v in features.items()}
    np.testing.assert_allclose(loaded(batch).numpy(), model(batch).numpy(), rtol=1e-6)
    assert isinstance(loaded.optimizer, MultiOptimizer)
    for original, restored in zip(model.optimizer.variables, loaded.optimizer.variables, strict=True):
        np.testing.assert_array_equal(restored.numpy(), original.numpy())
    lazy = loaded.optimizer.optimizers[1]
    assert isinstance(lazy, LazyAdam) and int(lazy.iterations) == 2
    table = loaded.embeddings.tables["cat_2"].embeddings
    assert loaded.optimizer.optimizer_for(table) is lazy


def test_models_explain_unusable_schemas():
    one_cat = Schema([categorical("c", 10), ColumnSchema("y", "float32", tags=[Tags.TARGET])])
    with pytest.raises(ValueError, match="DLRM needs at least two interacting vectors"):
        DLRM(one_cat)
    with pytest.raises(ValueError, match="DCN structure must be"):
        DCN(one_cat, structure="diagonal")
    no_item_id = Schema([categorical("u", 10, tags=[Tags.USER_ID]), categorical("i", 10, tags=[Tags.ITEM])])
    with pytest.raises(ValueError, match="exactly one categorical column tagged ITEM_ID"):
        TwoTower(no_item_id)
    no_user = Schema([categorical("i", 10, tags=[Tags.ITEM_ID])])
    with pytest.raises(ValueError, match="categorical columns tagged USER"):
        TwoTower(no_user)
    list_cont = Schema(
        [categorical("c", 10), ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS], is_list=True)]
    )
    with pytest.raises(ValueError, match=r"continuous list columns \['x'\]"):
        WideAndDeep(list_cont)


# -- TwoTower ------------------------------------------------------------------------

def test_recall_at_k_equals_brute_force():
    schema, features, labels = retrieval_data(seed=4, rows=300)
    model = TwoTower(schema, tower=(16, 8), seed=0)
    data = dataset(features, labels, slice(None), 100)
    ids = features["item_id"]
    _, first = np.unique(ids, return_index=True)
    candidates = {k: features[k][first] for k in ("item_id", "item_category")}
    cand = model.candidate_embeddings({k: tf.constant(v) for k, v in candidates.items()}).numpy()
    query = model.query_embeddings({k: tf.constant(v) for k, v in features.items()}).numpy()
    for k in (1, 5):
        top = np.argsort(-(query @ cand.T), axis=1)[:, :k]
        expected = np.mean([ids[i] in candidates["item_id"][top[i]] for i in range(len(ids))])
        assert model.recall_at_k(data, k=k) == pytest.approx(expected)
        assert model.recall_at_k(data, k=k, candidates=candidates) == pytest.approx(expected)


def test_in_batch_loss_equals_manual_softmax():
    schema, features, labels = retrieval_data(seed=5, rows=8)
    model = TwoTower(schema, tower=(8,), temperature=0.5, seed=0, logq_correction=False)
    x = {k: tf.constant(v) for k, v in features.items()}
    labels = np.array([1, 1, 0, 1, 1, 1, 0, 1], np.float32)
    out = model(x)
    q, c = out["query"].numpy(), out["candidate"].numpy()
    logits = q @ c.T / 0.5
    ids = features["item_id"]
    pos = np.flatnonzero(labels > 0)  # only positive rows: queries and negatives
    expected_rows = []
    for i in pos:
        keep = [j for j in pos if j == i or ids[j] != ids[i]]
        row = logits[i, keep]
        expected_rows.append(np.log(np.exp(row).sum()) - logits[i, i])
    expected = np.mean(expected_rows)
    loss = model.compute_loss(x=x, y=tf.constant(labels), y_pred=out)
    assert float(loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("steps", [1, 2])
def test_in_batch_loss_with_logq_correction_equals_manual_softmax(steps):
    schema, features, _ = retrieval_data(seed=5, rows=8)
    model = TwoTower(schema, tower=(8,), temperature=0.5, seed=0)
    x = {k: tf.constant(v) for k, v in features.items()}
    labels = np.array([1, 1, 0, 1, 1, 1, 0, 1], np.float32)
    out = model(x)
    for _ in range(steps - 1):  # an earlier training step counted the same items once
        model.compute_loss(x=x, y=tf.constant(labels), y_pred=out, training=True)
    q, c = out["query"].numpy(), out["candidate"].numpy()
    ids = features["item_id"]
    # the positive rows' items, counted once per step seen (this one included)
    counts = steps * np.bincount(ids[labels > 0],
                                 minlength=int(model.item_counts.shape[0])).astype(np.float64)
    with np.errstate(divide="ignore"):  # a label-0 row's item may have no count: unused
        log_q = np.log(counts[ids] / counts.sum())
    logits = q @ c.T / 0.5 - log_q[None, :]
    pos = np.flatnonzero(labels > 0)  # only positive rows: queries and negatives
    expected_rows = []
    for i in pos:
        keep = [j for j in pos if j == i or ids[j] != ids[i]]
        row = logits[i, keep]
        expected_rows.append(np.log(np.exp(row).sum()) - logits[i, i])
    expected = np.mean(expected_rows)
    loss = model.compute_loss(x=x, y=tf.constant(labels), y_pred=out, training=True)
    assert float(loss) == pytest.approx(expected, rel=1e-5)
    np.testing.assert_array_equal(model.item_counts.numpy(), counts)


@pytest.mark.slow
def test_two_tower_learns_to_retrieve():
    schema, features, labels = retrieval_data(seed=0, rows=12_000)
    train, valid = slice(0, 10_000), slice(10_000, None)
    model = TwoTower(schema, tower=(32, 16), seed=0)
    large, _ = split_embeddings_on_size(
        [model.user_embeddings.tables["user_id"], model.item_embeddings.tables["item_id"]], 100
    )
    model.compile(optimizer=MultiOptimizer(keras.optimizers.Adam(0.01), [(LazyAdam(0.01), large)]))
    model.fit(dataset(features, labels, train, 250), epochs=3, shuffle=False, verbose=0)
    recall = model.recall_at_k(dataset(features, labels, valid, 1000), k=10)
    # Baselines: random ranking 10 / 100 items; the 10 most popular training items.
    popular = np.argsort(-np.bincount(features["item_id"][train], minlength=100))[:10]
    popularity = np.isin(features["item_id"][valid], popular).mean()
    assert recall >= 3 * 10 / 100
    assert recall >= popularity + 0.1, (recall, popularity)


@pytest.mark.parametrize("model_cls", [DLRM, DCN])  # WideAndDeep takes CachedEmbeddings only
def test_given_embeddings_travel_in_the_config_and_the_model_file(model_cls, tmp_path):
    """A model built with ``embeddings=`` (here 4-wide tables with a mean combiner,
    not what the model builds by itself) is rebuilt with the same tables from its
    config and from a saved ``.keras`` file."""
    from tabstream.train.tensorflow import embedding_tables_from_schema

    schema, features, _, _ = ranking_data(seed=1, rows=32)
    batch = {k: tf.constant(v) for k, v in features.items()}
    cats = schema.select_by_tag(Tags.CATEGORICAL).without(
        [c.name for c in schema.select_by_tag(Tags.TARGET)])
    width = 8 if model_cls is DLRM else 4  # DLRM's dot interaction needs embedding_dim
    tables = embedding_tables_from_schema(cats, dim=width, combiner="mean", seed=3)
    kwargs = {**SMALL[model_cls], "embeddings": tables}
    model = model_cls(schema, seed=0, **kwargs)
    expected = model(batch).numpy()
    shapes = sorted(tuple(w.shape) for w in tables.weights)

    clone = model_cls.from_config(model.get_config())
    clone(batch)
    assert sorted(tuple(w.shape) for w in clone.embeddings.weights) == shapes
    assert {c.combiner for c in clone.embeddings.configs} == {"mean"}
    clone.set_weights(model.get_weights())
    np.testing.assert_allclose(clone(batch).numpy(), expected, rtol=1e-6)

    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_allclose(loaded(batch).numpy(), expected, rtol=1e-6)

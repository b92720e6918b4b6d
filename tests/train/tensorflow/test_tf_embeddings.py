import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tf_synthetic import categorical  # noqa: E402

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tables import TableConfig  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    EmbeddingTable,
    EmbeddingTables,
    embedding_tables_from_schema,
    split_embeddings_on_size,
)


def expected_dim(cardinality: int, multiplier: float = 2.0) -> int:
    raw = math.floor(cardinality**0.25 * multiplier)
    dim = 8
    while dim < raw:
        dim += 8
    return dim


CARDINALITIES = [1, 2, 15, 255, 4096, 50_000]


@pytest.mark.parametrize("multiplier", [2.0, 3.5])
def test_inferred_dims_follow_the_formula(multiplier):
    schema = Schema([categorical(f"c{c}", c) for c in CARDINALITIES])
    tables = embedding_tables_from_schema(schema, multiplier=multiplier, initializer="zeros")
    for c in CARDINALITIES:
        table = tables.tables[f"c{c}"]
        assert table.dim == expected_dim(c, multiplier)
        assert tuple(table.embeddings.shape) == (c, expected_dim(c, multiplier))
    # Spot-check the formula itself where tables would be too big to allocate here.
    assert [expected_dim(c) for c in (10**6, 10**7, 10**8)] == [64, 112, 200]


def test_schema_dimension_is_used_when_sizes_are_not_inferred():
    col = categorical("c", 1000).with_properties(
        embedding_sizes={"cardinality": 1000, "dimension": 24}
    )
    schema = Schema([col])
    assert embedding_tables_from_schema(schema, infer_sizes=False).tables["c"].dim == 24
    assert embedding_tables_from_schema(schema).tables["c"].dim == expected_dim(1000)
    assert embedding_tables_from_schema(schema, dim=4).tables["c"].dim == 4


def test_one_table_per_categorical_feature_and_shared_vocabularies():
    shared = {"name": "item"}
    schema = Schema(
        [
            categorical("user", 1000),
            ColumnSchema("item", "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": 499, **shared}}),
            ColumnSchema("prev_item", "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": 399, **shared}}),
            ColumnSchema("price", "float32", tags=[Tags.CONTINUOUS]),
            categorical("label", 2, tags=[Tags.TARGET]),
        ]
    )
    tables = embedding_tables_from_schema(schema, dim=8)
    assert sorted(tables.tables) == ["item", "user"]
    assert tables.tables["item"].cardinality == 500
    assert sorted(tables.feature_names) == ["item", "prev_item", "user"]
    out = tables({"user": tf.constant([1, 2]), "item": tf.constant([3, 4]),
                  "prev_item": tf.constant([4, 3])})
    np.testing.assert_array_equal(out["item"].numpy()[::-1], out["prev_item"].numpy())
    assert sorted(v.path for v in tables.trainable_variables) == ["item/embeddings", "user/embeddings"]


def test_schema_without_categorical_features_is_rejected():
    schema = Schema([ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS])])
    with pytest.raises(ValueError, match="no categorical feature columns"):
        embedding_tables_from_schema(schema)


def test_single_hot_lookup_is_a_row_gather():
    table = EmbeddingTable(TableConfig("c", 20, 8, ("c",)))
    weights = table.embeddings.numpy()
    ids = np.array([3, 0, 19, 3])
    np.testing.assert_array_equal(table(tf.constant(ids)).numpy(), weights[ids])
    np.testing.assert_array_equal(table(tf.constant(ids[:, None])).numpy(), weights[ids])


def _list_tables(combiner):
    return EmbeddingTables(
        [TableConfig("tags", 30, 8, ("tags",), is_list=True, combiner=combiner)]
    )


def _manual_pool(weights, rows, combiner):
    out = np.zeros((len(rows), weights.shape[1]), dtype=np.float64)
    for i, row in enumerate(rows):
        for j in row:
            out[i] += weights[j]
        if combiner == "mean" and row:
            out[i] /= len(row)
    return out


# id 0 is a real id here, inside lists and alone; the padding is the mask's business
ROWS = [[5, 0, 5], [0], [], [29, 2, 0, 4]]


def _layouts(rows):
    width = max(len(r) for r in rows)
    padded = np.zeros((len(rows), width), dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=bool)
    for i, r in enumerate(rows):
        padded[i, : len(r)] = r
        mask[i, : len(r)] = True
    values = np.array([j for r in rows for j in r], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
    ragged = tf.ragged.constant(rows, dtype=tf.int64)
    return {
        "ragged": {"tags": ragged},
        "padded_with_mask": {"tags": tf.constant(padded), "tags__mask": tf.constant(mask)},
        "padded_mask_tuple": {"tags": (tf.constant(padded), tf.constant(mask))},
        "padded_int_mask_tuple": {"tags": (tf.constant(padded), tf.constant(mask.astype(np.int32)))},
        "values_offsets_tuple": {"tags": (tf.constant(values), tf.constant(offsets))},
        "column_values_offsets_tuple": {"tags": (tf.constant(values[:, None]), tf.constant(offsets))},
        "values_offsets_keys": {"tags__values": tf.constant(values),
                                "tags__offsets": tf.constant(offsets)},
        "sparse": {"tags": ragged.to_sparse()},
    }


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("layout", list(_layouts(ROWS)))
def test_pooled_multi_hot_equals_manual_sum(combiner, layout):
    tables = _list_tables(combiner)
    weights = tables.tables["tags"].embeddings.numpy().astype(np.float64)
    out = tables(_layouts(ROWS)[layout])["tags"].numpy()
    np.testing.assert_allclose(out, _manual_pool(weights, ROWS, combiner), rtol=1e-6, atol=1e-7)


def test_explicit_mask_keeps_id_zero_when_it_is_a_real_id():
    tables = _list_tables("sum")
    weights = tables.tables["tags"].embeddings.numpy().astype(np.float64)
    ids = tf.constant([[0, 3], [4, 0]])
    mask = tf.constant([[True, True], [True, False]])
    out = tables({"tags": ids, "tags__mask": mask})["tags"].numpy()
    np.testing.assert_allclose(out, _manual_pool(weights, [[0, 3], [4]], "sum"), rtol=1e-6)


def test_padded_mask_tuple_keeps_id_zero_and_pools_in_a_tf_function():
    # the layout of tabstream.loaders.tensorflow.Loader(pad=True): (padded, mask)
    tables = _list_tables("mean")
    weights = tables.tables["tags"].embeddings.numpy().astype(np.float64)
    ids = tf.constant([[0, 3], [4, 0], [0, 0]], tf.int64)
    mask = tf.constant([[True, True], [True, False], [False, False]])
    want = _manual_pool(weights, [[0, 3], [4], []], "mean")
    np.testing.assert_allclose(tables({"tags": (ids, mask)})["tags"].numpy(), want, rtol=1e-6)
    spec = tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None, 2], tf.bool)

    @tf.function(input_signature=[spec])
    def pooled(tags):
        return tables({"tags": tags})["tags"]

    np.testing.assert_allclose(pooled((ids, mask)).numpy(), want, rtol=1e-6)


def test_gradient_is_sparse_and_covers_only_the_batch_ids():
    tables = EmbeddingTables(
        [TableConfig("c", 50, 8, ("c",)), TableConfig("tags", 30, 8, ("tags",), is_list=True)]
    )
    # row 1 holds the real id 0; every other 0 is padding (mask false)
    padded = tf.constant([[3, 0, 0], [7, 0, 8], [0, 0, 0]])
    mask = tf.constant([[True, False, False], [True, True, True], [False, False, False]])
    features = {"c": tf.constant([4, 0, 4]), "tags": (padded, mask)}
    with tf.GradientTape() as tape:
        out = tables(features)
        loss = tf.reduce_sum(out["c"]) + 2.0 * tf.reduce_sum(out["tags"])
    grads = tape.gradient(loss, tables.trainable_variables)
    by_path = dict(zip([v.path for v in tables.trainable_variables], grads, strict=True))
    for path, ids in (("c/embeddings", [4, 0, 4]), ("tags/embeddings", [3, 7, 0, 8])):
        grad = by_path[path]
        assert isinstance(grad, tf.IndexedSlices)
        # one row per id (the real id 0 among them); the padded positions are absent
        assert sorted(grad.indices.numpy().tolist()) == sorted(set(ids))
    c = by_path["c/embeddings"]
    summed = dict(zip(c.indices.numpy().tolist(), c.values.numpy()[:, 0].tolist(), strict=True))
    assert summed == {4: 2.0, 0: 1.0}  # id 4's two rows, added up


def test_missing_feature_is_named():
    tables = EmbeddingTables([TableConfig("c", 5, 8, ("c",)), TableConfig("d", 5, 8, ("d",))])
    with pytest.raises(KeyError, match=r"features \['d'\] are missing"):
        tables({"c": tf.constant([1])})


def test_bad_list_inputs_are_explained():
    tables = _list_tables("sum")
    with pytest.raises(ValueError, match="must be \\(values, offsets\\)"):
        tables({"tags": (tf.constant([1]), tf.constant([0, 1]), tf.constant([0]))})
    with pytest.raises(ValueError, match="mask has shape"):
        tables({"tags": (tf.constant([[1, 2]]), tf.constant([[True, True, False]]))})
    with pytest.raises(ValueError, match=r"list feature 'tags' arrived as padded ids of shape "
                       r"\(2, 2\) without a mask; id 0 is a real id.*'tags__mask'"):
        tables({"tags": tf.constant([[1, 0], [0, 0]])})
    with pytest.raises(KeyError, match="no 'tags__offsets'"):
        tables({"tags__values": tf.constant([1, 2])})


def test_split_embeddings_on_size_by_cardinality():
    configs = [TableConfig(f"t{c}", c, 8, (f"t{c}",)) for c in (10, 99, 100, 101, 5000)]
    large, small = split_embeddings_on_size(configs, threshold=100)
    assert [t.cardinality for t in large] == [100, 101, 5000]
    assert [t.cardinality for t in small] == [10, 99]

    tables = EmbeddingTables(configs)
    large_layers, small_layers = split_embeddings_on_size(tables, 100)
    assert all(isinstance(t, EmbeddingTable) for t in large_layers + small_layers)
    assert [t.name for t in large_layers] == ["t100", "t101", "t5000"]
    assert [t.name for t in small_layers] == ["t10", "t99"]

    with pytest.raises(TypeError, match="takes EmbeddingTables"):
        split_embeddings_on_size(["t10"], 100)
    with pytest.raises(ValueError, match="threshold must be >= 1, got 0"):
        split_embeddings_on_size(configs, 0)


def test_tables_are_in_tf_checkpoints(tmp_path):
    configs = [TableConfig(f"t{i}", 10 + i, 8, (f"t{i}",)) for i in range(3)]
    tables = EmbeddingTables(configs)
    path = tf.train.Checkpoint(tables=tables).write(str(tmp_path / "ckpt"))
    saved = {name for name, _ in tf.train.list_variables(path) if name.endswith("VARIABLE_VALUE")}
    assert len(saved) == 3

    restored = EmbeddingTables(configs)
    tf.train.Checkpoint(tables=restored).read(path).assert_consumed()
    for name in tables.tables:
        np.testing.assert_array_equal(
            restored.tables[name].embeddings.numpy(), tables.tables[name].embeddings.numpy()
        )


def test_embedding_tables_config_round_trip():
    configs = [TableConfig("c", 12, 8, ("c", "d")), TableConfig("tags", 9, 8, ("tags",), is_list=True)]
    tables = EmbeddingTables(configs, seed=4)
    clone = EmbeddingTables.from_config(tables.get_config())
    assert clone.configs == tables.configs
    assert clone.list_features == tables.list_features
    for name in tables.tables:  # same seed, same initial values
        np.testing.assert_array_equal(
            clone.tables[name].embeddings.numpy(), tables.tables[name].embeddings.numpy()
        )


def test_list_shaped_input_for_a_scalar_feature_is_explained():
    tables = EmbeddingTables([TableConfig("c", 12, 8, ("c",))])
    with pytest.raises(ValueError, match="feature 'c' is not a list feature"):
        tables({"c": tf.constant([[1, 2], [3, 4]])})


class SumModel(__import__("keras").Model):
    """Embeddings of every feature (one shared table, one of its own, a list
    feature), summed, then a dense layer: a click model small enough to train by hand."""

    def __init__(self):
        super().__init__()
        self.tables = EmbeddingTables(
            [TableConfig("shared", 12, 3, ("a", "b")), TableConfig("own", 9, 3, ("c",)),
             TableConfig("tags", 7, 3, ("t",), combiner="mean")],
            list_features=["t"], initializer="uniform", seed=0)
        self.head = __import__("keras").layers.Dense(1)

    def call(self, features):
        looked_up = self.tables(features)
        return tf.squeeze(self.head(tf.add_n(list(looked_up.values()))), axis=1)


def _repeated_id_batches(steps=3, rows=32):
    rng = np.random.default_rng(5)
    batches = []
    for _ in range(steps):
        lengths = rng.integers(0, 4, rows)
        features = {"a": rng.integers(0, 4, rows), "b": rng.integers(0, 4, rows),  # many repeats
                    "c": rng.integers(0, 3, rows),
                    "t__values": rng.integers(0, 3, int(lengths.sum())),
                    "t__offsets": np.concatenate([[0], np.cumsum(lengths)])}
        batches.append(({k: tf.constant(v) for k, v in features.items()},
                        tf.constant(rng.integers(0, 2, rows).astype(np.float32))))
    return batches


@pytest.mark.parametrize("optimizer", ["Adagrad", "RMSprop", "Ftrl"])
def test_keras_fit_with_keras_optimizers_equals_dense_updates_on_repeated_ids(optimizer):
    """Keras' own optimizers update an IndexedSlices gradient row by row: given a
    repeated id's rows apart, Adagrad/RMSprop/Ftrl mix the squares of the parts
    (0.04 off after one step). The tables hand them one row per id, so Keras' own
    ``fit`` gives the update of the dense gradient, which is taken by hand here."""
    import keras

    batches = _repeated_id_batches()
    loss = keras.losses.BinaryCrossentropy(from_logits=True)

    reference = SumModel()
    reference(batches[0][0])
    fitted = SumModel()
    fitted(batches[0][0])
    fitted.set_weights(reference.get_weights())

    opt = getattr(keras.optimizers, optimizer)(learning_rate=0.1)
    for features, labels in batches:  # by hand: the dense gradient
        with tf.GradientTape() as tape:
            value = loss(labels, reference(features))
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(value, reference.trainable_variables)]
        opt.apply(grads, reference.trainable_variables)

    fitted.compile(optimizer=getattr(keras.optimizers, optimizer)(learning_rate=0.1), loss=loss)
    data = tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=(
        {k: tf.TensorSpec([None], tf.int64) for k in batches[0][0]}, tf.TensorSpec([None], tf.float32))
    ).apply(tf.data.experimental.assert_cardinality(len(batches)))
    fitted.fit(data, epochs=1, verbose=0, shuffle=False)
    for want, got in zip(reference.get_weights(), fitted.get_weights(), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_gradient_has_one_row_per_id_also_for_a_shared_table():
    model = SumModel()
    features, labels = _repeated_id_batches(steps=1)[0]
    with tf.GradientTape() as tape:
        value = tf.reduce_sum(model(features) * labels)
    grads = dict(zip([v.path for v in model.trainable_variables],
                     tape.gradient(value, model.trainable_variables), strict=True))
    for path, grad in grads.items():
        if isinstance(grad, tf.IndexedSlices):
            ids = grad.indices.numpy()
            assert len(ids) == len(np.unique(ids)), path
    shared = next(g for p, g in grads.items() if "shared" in p)
    expected = np.unique(np.concatenate([features["a"].numpy(), features["b"].numpy()]))
    assert sorted(shared.indices.numpy().tolist()) == expected.tolist()

"""The Keras embeddings and models on batches from the real tabstream TensorFlow
loader, with list columns delivered ragged ``(values, offsets)`` and padded
``(padded, mask)``."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from tf_synthetic import categorical  # noqa: E402

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.loaders.tensorflow import Loader  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    EmbeddingTables,
    LazyAdam,
    TableConfig,
    ThroughputCallback,
    binary_classification_metrics,
)

pytestmark = pytest.mark.tensorflow

ROWS = 3_000
MAX_TAGS = 4
TAG_CARD = 40


def schema() -> Schema:
    # value_count max: the length that pad=True pads the list column to
    tags = categorical("tags", TAG_CARD, is_list=True).with_properties(
        value_count={"min": 0, "max": MAX_TAGS})
    return Schema([
        categorical("cat", 25),
        tags,
        ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
        ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
    ])


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """A 3,000-row export (two parquet files) with a categorical, a continuous and a
    list column whose rows hold 0 to MAX_TAGS ids (empty lists included; id 0 is a real
    id in both categorical columns, never padding); returns
    the export and each row's list of ids."""
    rng = np.random.default_rng(0)
    cat = rng.integers(0, 25, ROWS)
    x = rng.normal(0.0, 1.0, ROWS).astype(np.float32)
    lengths = rng.integers(0, MAX_TAGS + 1, ROWS)
    values = rng.integers(0, TAG_CARD, int(lengths.sum()))  # 0 is a real id too
    assert (values == 0).any() and (cat == 0).any()
    offsets = np.r_[0, np.cumsum(lengths)]
    lists = [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    weights = rng.normal(0.0, 1.0, TAG_CARD)
    logit = 0.8 * x + (cat % 3 - 1) + np.array([weights[r].sum() for r in lists]) * 0.5
    y = (rng.random(ROWS) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
    table = pa.table({
        "cat": pa.array(cat.astype(np.int64)),
        "tags": pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)),
                                         pa.array(values.astype(np.int64))),
        "x": pa.array(x),
        "click": pa.array(y),
    })
    path = tmp_path_factory.mktemp("tf_loader_export")
    half = ROWS // 2
    pq.write_table(table.slice(0, half), path / "part_0.parquet", row_group_size=500)
    pq.write_table(table.slice(half), path / "part_1.parquet", row_group_size=500)
    schema().to_json(str(path / "schema.json"))
    return path, lists


def numpy_pool(weights, rows, combiner):
    out = np.zeros((len(rows), weights.shape[1]), dtype=np.float64)
    for i, row in enumerate(rows):
        for j in row:
            out[i] += weights[j]
        if combiner == "mean" and row:
            out[i] /= len(row)
    return out


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
def test_pooled_list_embedding_from_the_loader_equals_numpy(export, pad, combiner):
    path, lists = export
    tables = EmbeddingTables(
        [TableConfig("cat", 25, 8, ("cat",)),
         TableConfig("tags", TAG_CARD, 8, ("tags",), is_list=True, combiner=combiner)],
        seed=0,
    )
    weights = tables.tables["tags"].embeddings.numpy().astype(np.float64)
    cat_weights = tables.tables["cat"].embeddings.numpy()
    loader = Loader(str(path), batch_size=512, shuffle=False, pad=pad)
    seen = 0
    for features, _ in loader:
        first, second = features["tags"]
        if pad:
            assert first.shape.rank == 2 and first.shape[1] == MAX_TAGS
            assert second.dtype == tf.bool and second.shape == first.shape
        else:
            assert first.shape.rank == 1 and second.shape.rank == 1
            assert second.shape[0] == features["cat"].shape[0] + 1
        out = tables(features)
        rows = lists[seen:seen + features["cat"].shape[0]]
        np.testing.assert_allclose(out["tags"].numpy(), numpy_pool(weights, rows, combiner),
                                   rtol=1e-6, atol=1e-7)
        np.testing.assert_array_equal(out["cat"].numpy(), cat_weights[features["cat"].numpy()])
        seen += len(rows)
    assert seen == ROWS


def test_ragged_and_padded_loader_batches_give_the_same_logits(export):
    path, _ = export
    model = DLRM(schema(), embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=0)
    ragged = Loader(str(path), batch_size=1024, shuffle=False)
    padded = Loader(str(path), batch_size=1024, shuffle=False, pad=True)
    for (f_ragged, _), (f_padded, _) in zip(ragged, padded, strict=True):
        np.testing.assert_allclose(model(f_padded).numpy(), model(f_ragged).numpy(),
                                   rtol=1e-5, atol=1e-6)

    # and inside a tf.function (as Keras fit runs it), where only the specs are known
    @tf.function
    def total(dataset):
        s = tf.constant(0.0)
        for features, _ in dataset:
            s += tf.reduce_sum(model(features))
        return s

    np.testing.assert_allclose(total(padded).numpy(), total(ragged).numpy(), rtol=1e-4)


@pytest.mark.parametrize("pad", [False, True], ids=["ragged", "padded"])
def test_dlrm_fit_on_the_loader_with_metrics_and_throughput(export, pad):
    path, _ = export
    model = DLRM(schema(), embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=0)
    model.compile(
        optimizer=LazyAdam(0.01),
        loss=keras.losses.BinaryCrossentropy(from_logits=True),
        metrics=binary_classification_metrics(),
    )
    train = Loader(str(path), batch_size=500, seed=0, pad=pad, shuffle=True)
    throughput = ThroughputCallback(batch_size=500, verbose=0)
    history = model.fit(train, epochs=1, shuffle=False, verbose=0, callbacks=[throughput])
    h = history.history
    for key in ("loss", "auc", "logloss", "samples_per_sec"):
        assert len(h[key]) == 1, key
    assert np.isfinite(h["loss"][0]) and np.isfinite(h["logloss"][0])
    assert 0.0 <= h["auc"][0] <= 1.0
    assert h["samples_per_sec"] == throughput.samples_per_sec and h["samples_per_sec"][0] > 0
    assert train.epoch == 1

"""Per-id lookups (combiner=None) and pooled lists of lists, against a numpy gather."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from tabstream.train.tables import TableConfig  # noqa: E402
from tabstream.train.tensorflow import EmbeddingTables  # noqa: E402


def _tables(combiner):
    return EmbeddingTables([TableConfig("t", 30, 4, ("x",), is_list=True, combiner=combiner),
                            TableConfig("u", 9, 4, ("y",))], seed=1)


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_per_id_matches_numpy_gather(seed):
    tables = _tables(None)
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, 7)
    lengths[3] = 0
    values = rng.integers(0, 30, lengths.sum())
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    out = tables({"x": (tf.constant(values), tf.constant(offsets)), "y": tf.range(7) % 9})
    vectors, mask = out["x"]
    table = tables.tables["t"].embeddings.numpy()
    width = lengths.max()
    assert vectors.shape == (7, width, 4) and mask.shape == (7, width)
    for row in range(7):
        ids = values[offsets[row]:offsets[row + 1]]
        assert mask[row].numpy().tolist() == [True] * len(ids) + [False] * (width - len(ids))
        np.testing.assert_allclose(vectors[row, :len(ids)].numpy(), table[ids])
        assert not vectors[row, len(ids):].numpy().any()
    assert out["y"].shape == (7, 4)


def test_padded_nested_per_id_and_gradient_rows():
    tables = _tables(None)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 29, (5, 3, 4))
    mask = rng.random((5, 3, 4)) < 0.6
    ids[~mask] = 29   # a padded slot's id must not be looked up
    with tf.GradientTape() as tape:
        vectors, got = tables({"x": (tf.constant(ids), tf.constant(mask)),
                               "y": tf.zeros(5, tf.int64)})["x"]
        loss = tf.reduce_sum(vectors)
    table = tables.tables["t"].embeddings
    want = np.where(mask[..., None], table.numpy()[ids], 0.0)
    np.testing.assert_allclose(vectors.numpy(), want, rtol=1e-6)
    assert np.array_equal(got.numpy(), mask)
    grad = tape.gradient(loss, table)
    assert isinstance(grad, tf.IndexedSlices)
    assert set(grad.indices.numpy().tolist()) == set(ids[mask].tolist())


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_nested_padded_pools_each_inner_list(combiner):
    tables = _tables(combiner)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 30, (6, 2, 3))
    mask = rng.random((6, 2, 3)) < 0.5
    pooled = tables({"x": (tf.constant(ids), tf.constant(mask)),
                     "y": tf.zeros(6, tf.int64)})["x"].numpy()
    table = tables.tables["t"].embeddings.numpy()
    assert pooled.shape == (6, 2, 4)
    for b in range(6):
        for f in range(2):
            rows = table[ids[b, f][mask[b, f]]]
            want = rows.sum(0) if combiner == "sum" else (
                rows.mean(0) if len(rows) else np.zeros(4))
            np.testing.assert_allclose(pooled[b, f], want, rtol=1e-5, atol=1e-7)


def test_nested_ragged_input_is_refused_with_a_hint():
    tables = _tables("sum")
    x = (tf.constant([1, 2]), tf.constant([0, 1], tf.int64), tf.constant([0, 2], tf.int64))
    with pytest.raises(ValueError, match=r"feature 'x': a tuple input must be \(values, "
                                         r"offsets\) or \(padded, mask\), got 3 items; for a "
                                         r"list of lists .*pad=\{'x': \(F, L\)\}"):
        tables({"x": x, "y": tf.zeros(1, tf.int64)})


@pytest.mark.parametrize("combiner", [None, "sum"])
def test_padded_mask_of_another_shape_is_refused(combiner):
    # per-id lookups and pooling check the mask the same way
    tables = _tables(combiner)
    with pytest.raises(ValueError, match=r"list feature 'x': the mask has shape \(2, 3\) but "
                       r"the padded ids have shape \(2, 2\); they must match"):
        tables({"x": (tf.constant([[1, 2], [3, 4]]), tf.constant([[True] * 3] * 2)),
                "y": tf.zeros(2, tf.int64)})

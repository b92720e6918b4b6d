"""Keras' own optimizers take an ``IndexedSlices`` gradient's rows as distinct ids:
given a repeated id's rows apart, Adagrad adds the squares of the parts instead of
the square of their sum. The sharded tables of ``HybridParallel`` hand their
optimizer one row per id, so a hybrid model trained with Keras' Adagrad ends where
the plain model does (whose tables do the same; see test_tf_embeddings)."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")


@pytest.mark.parametrize("plan", ["row_wise", "table_wise"])
def test_sharded_tables_with_keras_adagrad_equal_the_plain_model(plan):
    from hybrid_worker import as_tf, global_batches, make_model

    from tabstream.train.tensorflow import fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    batches = [(as_tf(f), tf.constant(y)) for f, y in global_batches()]
    ids = np.concatenate([np.asarray(f["cat_0"]).ravel() for f, _ in global_batches()])
    assert len(np.unique(ids)) < len(ids)  # the batches repeat ids
    plain = make_model(0)
    fit(plain, batches, keras.optimizers.Adagrad(0.1), progress=False)
    wrapper = HybridParallel(make_model(0), plan=plan)
    fit(wrapper, batches, keras.optimizers.Adagrad(0.1), progress=False)
    weights = wrapper.full_weights()
    for v in plain.weights:
        np.testing.assert_allclose(weights[v.path], v.numpy(), rtol=0, atol=2e-7, err_msg=v.path)

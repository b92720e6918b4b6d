"""Keras: list-ness is a property of each feature, so a single-hot column and a list
column sharing one table (one vocabulary) both parse, cached or in memory. Expected
values are numpy gathers on the same weights."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import ParameterServer, table_configs_from_schema
from tabstream.train.tensorflow import DLRM, CachedEmbeddings, EmbeddingTables


def shared_schema():
    def cat(name, is_list=False):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=is_list,
                            properties={"domain": {"min": 0, "max": 9, "name": "genre"}})
    return Schema([cat("genre"), cat("genres", is_list=True),
                   ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def lists():  # rows [1, 2] and [3]
    return tf.constant([1, 2, 3], tf.int64), tf.constant([0, 2, 3], tf.int64)


@pytest.mark.parametrize("where", ["memory", "cached"])
@pytest.mark.parametrize("shape", [(2,), (2, 1)])
def test_single_hot_and_list_feature_share_a_table(tmp_path, where, shape):
    configs = table_configs_from_schema(shared_schema().without(["click"]), dim=4)
    if where == "memory":
        layer = EmbeddingTables(configs)
        weight = layer.tables["genre"].embeddings.numpy()
        # the per-feature flags survive the layer's config
        assert EmbeddingTables.from_config(layer.get_config()).list_features == {"genres"}
    else:
        ps = ParameterServer(tmp_path / "ps", configs)
        layer = CachedEmbeddings(ps, 8)
        weight = ps.lookup("genre", np.arange(10))
    assert layer.list_features == {"genres"}
    out = layer({"genre": tf.reshape(tf.constant([4, 5], tf.int64), shape), "genres": lists()})
    np.testing.assert_allclose(out["genre"].numpy(), weight[[4, 5]], rtol=1e-6)
    np.testing.assert_allclose(out["genres"].numpy(),
                               np.stack([weight[1] + weight[2], weight[3]]), rtol=1e-6)


def test_dlrm_over_a_cache_of_a_shared_table(tmp_path):
    schema = shared_schema()
    ps = ParameterServer(tmp_path / "ps", table_configs_from_schema(schema.without(["click"]), dim=4))
    model = DLRM(schema, embedding_dim=4, embeddings=CachedEmbeddings(ps, 8))
    out = model({"genre": tf.constant([4, 5], tf.int64), "genres": lists(),
                 "I1": tf.constant([0.1, 0.2])})
    assert tuple(out.shape) == (2,)

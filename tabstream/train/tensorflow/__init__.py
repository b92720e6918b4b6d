"""Keras 3 (TensorFlow backend) training: embedding tables from the schema with
sparse lookups, ``LazyAdam`` and ``MultiOptimizer``, the DLRM / DCN / Wide&Deep /
TwoTower models, and ``fit`` (a custom loop that also runs under
``tf.distribute`` strategies) with its helpers.

Importing this package imports TensorFlow; ``import tabstream`` alone does not.

>>> import keras
>>> import tensorflow as tf
>>> from tabstream.core.schema import ColumnSchema, Schema, Tags
>>> def categorical(name, n):
...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
...                         properties={"domain": {"min": 0, "max": n - 1}})
>>> schema = Schema([categorical("C1", 200_000), categorical("C2", 50),
...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
...                  ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])
>>> features = {"C1": tf.constant([3, 199_999, 3, 42], tf.int64),
...             "C2": tf.constant([0, 7, 49, 7], tf.int64), "I1": tf.constant([0.5, -1.0, 2.0, 0.0])}
>>> labels = tf.constant([1.0, 0.0, 1.0, 0.0])
>>> train = tf.data.Dataset.from_tensors((features, labels)).repeat(4)   # or the tabstream loader
>>> keras.utils.set_random_seed(0)
>>> from tabstream.train.tensorflow import (DLRM, LazyAdam, MultiOptimizer,
...     binary_classification_metrics, split_embeddings_on_size)
>>> model = DLRM(schema, embedding_dim=8)
>>> model(features).shape                      # (B,) logits
TensorShape([4])
>>> large, small = split_embeddings_on_size(model.embeddings, threshold=100_000)
>>> large, small
([<EmbeddingTable name=C1, built=True>], [<EmbeddingTable name=C2, built=True>])
>>> model.compile(optimizer=MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(), large)]),
...               loss=keras.losses.BinaryCrossentropy(from_logits=True),
...               metrics=binary_classification_metrics())
>>> history = model.fit(train, epochs=2, verbose=0, shuffle=False)
>>> sorted(history.history)
['auc', 'logloss', 'loss']
"""

from tabstream.train.tables import TableConfig, infer_embedding_dim, table_configs_from_schema
from tabstream.train.tensorflow.blocks import MLP, CrossNetwork, DotInteraction
from tabstream.train.tensorflow.blocks import CrossNetV2 as CrossNetV2  # the old name, kept
from tabstream.train.tensorflow.cache import CachedEmbeddings, ParameterServer
from tabstream.train.tensorflow.continuous import fit_lists
from tabstream.train.tensorflow.embeddings import (
    EmbeddingTable,
    EmbeddingTables,
    embedding_tables_from_schema,
    split_embeddings_on_size,
)
from tabstream.train.tensorflow.fit import (
    LogLoss,
    NonFiniteLossError,
    NothingToTrainWarning,
    ThroughputCallback,
    binary_classification_metrics,
    evaluate,
    fit,
)
from tabstream.train.tensorflow.models import DCN, DLRM, TwoTower, WideAndDeep
from tabstream.train.tensorflow.optimizers import LazyAdam, MultiOptimizer

__all__ = ["CachedEmbeddings", "CrossNetwork", "DCN", "DLRM", "DotInteraction", "EmbeddingTable",
           "EmbeddingTables", "LazyAdam", "LogLoss", "MLP", "MultiOptimizer",
           "NonFiniteLossError", "NothingToTrainWarning", "ParameterServer", "TableConfig",
           "ThroughputCallback", "TwoTower", "WideAndDeep", "binary_classification_metrics",
           "embedding_tables_from_schema", "evaluate", "fit", "fit_lists", "infer_embedding_dim",
           "split_embeddings_on_size", "table_configs_from_schema"]

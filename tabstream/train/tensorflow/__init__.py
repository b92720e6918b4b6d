"""Keras 3 (TensorFlow backend) training: embedding tables from the schema with
sparse lookups, ``LazyAdam`` and ``MultiOptimizer``, the DLRM / DCN / Wide&Deep /
TwoTower models, and ``fit`` (a custom loop that also runs under
``tf.distribute`` strategies) with its helpers.

Importing this package imports TensorFlow; ``import tabstream`` alone does not.

>>> from tabstream.train.tensorflow import DLRM, LazyAdam, MultiOptimizer, split_embeddings_on_size
>>> model = DLRM(schema, embedding_dim=16)
>>> large, small = split_embeddings_on_size(model.embeddings, threshold=100_000)
>>> model.compile(optimizer=MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(), large)]),
...               loss=keras.losses.BinaryCrossentropy(from_logits=True),
...               metrics=binary_classification_metrics())
"""

from tabstream.train.tables import TableConfig, infer_embedding_dim, table_configs_from_schema
from tabstream.train.tensorflow.blocks import MLP, CrossNetwork, DotInteraction
from tabstream.train.tensorflow.blocks import CrossNetV2 as CrossNetV2  # the old name, kept
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

__all__ = [
    "DCN",
    "DLRM",
    "MLP",
    "CrossNetwork",
    "DotInteraction",
    "EmbeddingTable",
    "EmbeddingTables",
    "LazyAdam",
    "LogLoss",
    "MultiOptimizer",
    "NonFiniteLossError",
    "NothingToTrainWarning",
    "TableConfig",
    "ThroughputCallback",
    "TwoTower",
    "WideAndDeep",
    "binary_classification_metrics",
    "embedding_tables_from_schema",
    "evaluate",
    "fit",
    "infer_embedding_dim",
    "split_embeddings_on_size",
    "table_configs_from_schema",
]

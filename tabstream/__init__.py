"""tabstream: raw recommender logs to training-ready parquet, and shuffled, sharded
batches into PyTorch and Keras 3.

``import tabstream`` imports neither torch nor TensorFlow."""

__version__ = "0.1.0"

from tabstream.errors import DataError, ExportError, NotFittedError, SchemaError, TabstreamError  # noqa: E402
from tabstream.pipeline import (  # noqa: E402
    ColumnSchema,
    ColumnSelector,
    Dataset,
    Node,
    Schema,
    Tags,
    TransformedDataset,
    Workflow,
)

__all__ = [
    "ColumnSchema",
    "ColumnSelector",
    "DataError",
    "Dataset",
    "ExportError",
    "Node",
    "NotFittedError",
    "Schema",
    "SchemaError",
    "TabstreamError",
    "Tags",
    "TransformedDataset",
    "Workflow",
    "__version__",
]

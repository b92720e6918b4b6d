"""tabstream: raw recommender logs to training-ready parquet, and shuffled, sharded
batches into PyTorch and Keras 3.

``import tabstream`` imports neither torch nor TensorFlow, and the pipeline names
(which need pandas and dask) are imported on first use.
"""

from __future__ import annotations

import sys as _sys
from typing import Any

from tabstream.core import alias_modules as _alias_modules
from tabstream.core import errors as _errors
from tabstream.core import moved_module as _moved_module
from tabstream.core.errors import (
    DataError,
    ExportError,
    NotFittedError,
    SchemaError,
    TabstreamError,
)

# ``tabstream.errors`` moved to ``tabstream.core.errors``; the old path still works,
# with a DeprecationWarning naming the new one.
_alias_modules(_sys.modules[__name__], {"errors": _errors})

__version__ = "0.1.0"

_PIPELINE = ("ColumnSchema", "ColumnSelector", "Dataset", "Node", "Schema", "Tags",
             "TransformedDataset", "Workflow")

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


def __getattr__(name: str) -> Any:
    if name in _PIPELINE:
        import tabstream.pipeline as pipeline

        value = getattr(pipeline, name)
        globals()[name] = value
        return value
    moved = _moved_module(__name__, name)
    if moved is not None:
        return moved
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PIPELINE))

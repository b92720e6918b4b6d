"""Datasets, schemas, graphs, workflows and exports.

Names are imported on first use, so that ``tabstream.pipeline.schema`` (all a
loader needs) can be imported without pandas or dask.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "Dataset": "tabstream.pipeline.dataset",
    "ColumnSelector": "tabstream.pipeline.graph",
    "Node": "tabstream.pipeline.graph",
    "ColumnSchema": "tabstream.pipeline.schema",
    "Schema": "tabstream.pipeline.schema",
    "Tags": "tabstream.pipeline.schema",
    "TransformedDataset": "tabstream.pipeline.workflow",
    "Workflow": "tabstream.pipeline.workflow",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

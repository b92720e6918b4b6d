"""Datasets, schemas, graphs, workflows and exports.

Names are imported on first use, so that ``tabstream.core.schema`` (all a
loader needs) can be imported without pandas or dask. ``schema``, ``dtypes``,
``graph``, ``hashing`` and ``merlin`` moved to :mod:`tabstream.core`; their old paths here
still work, name the same modules, and warn (DeprecationWarning) on first use.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from tabstream.core import alias_modules, moved_module
from tabstream.core import dtypes as _dtypes
from tabstream.core import graph as _graph
from tabstream.core import hashing as _hashing
from tabstream.core import merlin as _merlin
from tabstream.core import schema as _schema

alias_modules(sys.modules[__name__], {"dtypes": _dtypes, "graph": _graph, "hashing": _hashing,
                                      "merlin": _merlin, "schema": _schema})

_LAZY = {
    "Dataset": "tabstream.pipeline.dataset",
    "ColumnSelector": "tabstream.core.graph",
    "Node": "tabstream.core.graph",
    "ColumnSchema": "tabstream.core.schema",
    "Schema": "tabstream.core.schema",
    "Tags": "tabstream.core.schema",
    "TransformedDataset": "tabstream.pipeline.workflow",
    "Workflow": "tabstream.pipeline.workflow",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        moved = moved_module(__name__, name)
        if moved is not None:
            return moved
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

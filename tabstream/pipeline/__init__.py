"""Datasets, schemas, graphs, workflows and exports.

Names are imported on first use, so that ``tabstream.pipeline.schema`` (all a
loader needs) can be imported without pandas or dask. ``schema``, ``dtypes``,
``graph``, ``hashing`` and ``merlin`` moved to :mod:`tabstream.core`; their old paths here
still work and name the same modules.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from tabstream.core import alias_modules, dtypes, graph, hashing, merlin, schema

alias_modules(sys.modules[__name__], {"dtypes": dtypes, "graph": graph, "hashing": hashing,
                                      "merlin": merlin, "schema": schema})

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
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

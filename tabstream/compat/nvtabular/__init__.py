"""NVTabular's top-level names, tabstream underneath: migrating code changes only
its import.

    import tabstream.compat.nvtabular as nvt          # was: import nvtabular as nvt
    from tabstream.compat.nvtabular import ops        # was: from nvtabular import ops

    cats = ["user", "item"] >> ops.Categorify(out_path="stats/")
    conts = ["price"] >> ops.FillMissing() >> ops.LogOp() >> ops.Normalize()
    workflow = nvt.Workflow(cats + conts + ["label"])
    workflow.fit_transform(nvt.Dataset(df)).to_parquet("out/", shuffle=nvt.io.Shuffle.PER_PARTITION)

``Workflow``, ``Dataset``, ``ColumnSelector``, ``Schema``, ``ColumnSchema`` and
``WorkflowNode`` are tabstream's own classes (not wrappers), so what this module
returns works everywhere tabstream's objects do. ``Tags`` is here too (NVTabular
code imports it from ``merlin.schema``). Where tabstream's behaviour differs from
NVTabular 23.08 it is listed in ``docs/nvtabular-differences.md``; NVTabular names
tabstream has no counterpart for raise an ``AttributeError`` that says so.
"""

from __future__ import annotations

import enum
import types
import warnings
from typing import Any

from tabstream.compat.nvtabular import ops
from tabstream.core.graph import ColumnSelector, Node
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.workflow import Workflow

__all__ = ["ColumnGroup", "ColumnSchema", "ColumnSelector", "Dataset", "Schema", "Tags", "Workflow",
           "WorkflowNode", "io", "ops"]

#: NVTabular's workflow node class is tabstream's graph node
WorkflowNode = Node


def ColumnGroup(columns: Any) -> ColumnSelector:  # noqa: N802 - NVTabular's name
    """NVTabular's deprecated ``ColumnGroup``: a :class:`ColumnSelector`."""
    warnings.warn("ColumnGroup is deprecated, use ColumnSelector instead", DeprecationWarning, stacklevel=2)
    return ColumnSelector(columns)


class Shuffle(str, enum.Enum):
    """``merlin.io.Shuffle``: the ``shuffle=`` of an export, as tabstream names it."""

    PER_PARTITION = "per_partition"
    PER_WORKER = "per_worker"
    FULL = "full"

    def __str__(self) -> str:
        return self.value


#: ``nvt.io``: ``nvt.io.Dataset`` and ``nvt.io.Shuffle``
io = types.SimpleNamespace(Dataset=Dataset, Shuffle=Shuffle)

_MISSING = {
    "Distributed": "start a dask.distributed Client yourself and pass Workflow(..., client=client)",
    "Serial": "tabstream runs in threads unless a client is given; nothing to switch off",
    "dispatch": "tabstream's frames are pandas (cudf on a GPU): use them directly",
}


def __getattr__(name: str) -> Any:
    if name in _MISSING:
        raise AttributeError(f"nvtabular.{name} has no tabstream counterpart: {_MISSING[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

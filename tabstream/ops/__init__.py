"""Workflow ops. ``columns >> op`` applies one; see each op's docstring."""

from tabstream.ops.base import ColumnOperator, Operator, StatOperator, registered_ops
from tabstream.ops.categorify import Categorify
from tabstream.ops.continuous import Clip, FillMissing, LogOp, Normalize
from tabstream.ops.hashing import HashBucket, HashedCross
from tabstream.ops.tags import AddMetadata, AddTags

__all__ = [
    "AddMetadata",
    "AddTags",
    "Categorify",
    "Clip",
    "ColumnOperator",
    "FillMissing",
    "HashBucket",
    "HashedCross",
    "LogOp",
    "Normalize",
    "Operator",
    "StatOperator",
    "registered_ops",
]

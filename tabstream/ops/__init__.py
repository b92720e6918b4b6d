"""Workflow ops. ``columns >> op`` applies one; see each op's docstring."""

from tabstream.ops.base import ColumnOperator, Operator, StatOperator, registered_ops
from tabstream.ops.categorify import Categorify
from tabstream.ops.continuous import Clip, FillMissing, LogOp, Normalize
from tabstream.ops.hashing import HashBucket, HashedCross
from tabstream.ops.lists import ListSlice, SplitList, ValueCount
from tabstream.ops.structural import (
    Dropna,
    Filter,
    LambdaOp,
    Rename,
    TagAsItemFeatures,
    TagAsItemID,
    TagAsUserFeatures,
    TagAsUserID,
    register_function,
)
from tabstream.ops.tags import AddMetadata, AddTags

__all__ = [
    "AddMetadata",
    "AddTags",
    "Categorify",
    "Clip",
    "ColumnOperator",
    "Dropna",
    "FillMissing",
    "Filter",
    "HashBucket",
    "HashedCross",
    "LambdaOp",
    "ListSlice",
    "LogOp",
    "Normalize",
    "Operator",
    "Rename",
    "SplitList",
    "StatOperator",
    "TagAsItemFeatures",
    "TagAsItemID",
    "TagAsUserFeatures",
    "TagAsUserID",
    "ValueCount",
    "register_function",
    "registered_ops",
]

"""Workflow ops. ``columns >> op`` applies one; see each op's docstring.

The operator bases moved to :mod:`tabstream.core.operators`; ``tabstream.ops.base``
still works, names the same module and warns (DeprecationWarning).
"""

import sys
from typing import Any

from tabstream.core import alias_modules, moved_module, operators
from tabstream.core.operators import ColumnOperator, Operator, StatOperator, registered_ops
from tabstream.ops.categorify import Categorify
from tabstream.ops.continuous import Clip, FillMissing, LogOp, Normalize
from tabstream.ops.embedding_sizes import get_embedding_sizes
from tabstream.ops.groupby import Groupby
from tabstream.ops.hashing import HashBucket, HashedCross
from tabstream.ops.joins import DifferenceLag, JoinExternal, JoinGroupby, TargetEncoding
from tabstream.ops.lists import ListSlice, SplitList, ValueCount
from tabstream.ops.statistics import (
    Bucketize,
    DataStats,
    DropLowCardinality,
    FillMedian,
    NormalizeMinMax,
    ReduceDtypeSize,
)
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

__all__ = ["AddMetadata", "AddTags", "Bucketize", "Categorify", "Clip", "ColumnOperator",
           "DataStats", "DifferenceLag", "DropLowCardinality", "Dropna", "FillMedian",
           "FillMissing", "Filter", "Groupby", "HashBucket", "HashedCross", "JoinExternal",
           "JoinGroupby", "LambdaOp", "ListSlice", "LogOp", "Normalize", "NormalizeMinMax",
           "Operator", "ReduceDtypeSize", "Rename", "SplitList", "StatOperator",
           "TagAsItemFeatures", "TagAsItemID", "TagAsUserFeatures", "TagAsUserID",
           "TargetEncoding", "ValueCount", "get_embedding_sizes", "register_function",
           "registered_ops"]

alias_modules(sys.modules[__name__], {"base": operators})


def __getattr__(name: str) -> Any:
    moved = moved_module(__name__, name)
    if moved is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return moved

"""``nvtabular.ops``, tabstream's ops underneath: the same classes as
:mod:`tabstream.ops` under NVTabular's names, with NVTabular's extra helpers.

``AddProperties(properties)`` is ``AddMetadata(properties=...)``. NVTabular ops
with no tabstream counterpart (``ColumnSimilarity``) raise an ``AttributeError``
saying so; see ``docs/nvtabular-differences.md``.
"""

from __future__ import annotations

from typing import Any

from tabstream.core.graph import ColumnSelector
from tabstream.ops import (
    AddMetadata,
    AddTags,
    Bucketize,
    Categorify,
    Clip,
    DataStats,
    DifferenceLag,
    DropLowCardinality,
    Dropna,
    FillMedian,
    FillMissing,
    Filter,
    HashBucket,
    HashedCross,
    JoinExternal,
    JoinGroupby,
    LambdaOp,
    ListSlice,
    LogOp,
    Normalize,
    NormalizeMinMax,
    Operator,
    ReduceDtypeSize,
    Rename,
    StatOperator,
    TagAsItemFeatures,
    TagAsItemID,
    TagAsUserFeatures,
    TagAsUserID,
    TargetEncoding,
    ValueCount,
    get_embedding_sizes,
)
from tabstream.ops import Groupby as _Groupby

__all__ = ["AddMetadata", "AddProperties", "AddTags", "Bucketize", "Categorify", "Clip",
           "ColumnSelector", "DataStats", "DifferenceLag", "DropLowCardinality", "Dropna",
           "FillMedian", "FillMissing", "Filter", "Groupby", "HashBucket", "HashedCross",
           "JoinExternal", "JoinGroupby", "LambdaOp", "ListSlice", "LogOp", "Normalize",
           "NormalizeMinMax", "Operator", "ReduceDtypeSize", "Rename", "StatOperator",
           "TagAsItemFeatures", "TagAsItemID", "TagAsUserFeatures", "TagAsUserID",
           "TargetEncoding", "ValueCount", "get_embedding_sizes"]


def Groupby(groupby_cols: Any = None, sort_cols: Any = None, aggs: Any = "list",  # noqa: N802
            name_sep: str = "_", ascending: bool = True) -> _Groupby:
    """NVTabular's ``Groupby``: tabstream's, with NVTabular's default ``name_sep="_"``
    (``item_id_list``; tabstream's own default is ``"-"``)."""
    return _Groupby(groupby_cols=groupby_cols, sort_cols=sort_cols, aggs=aggs, name_sep=name_sep,
                    ascending=ascending)


def AddProperties(properties: dict[str, Any]) -> AddMetadata:  # noqa: N802 - NVTabular's name
    """NVTabular's ``AddProperties``: :class:`AddMetadata` with ``properties`` only."""
    return AddMetadata(properties=properties)


_MISSING = {
    "ColumnSimilarity": "tabstream has no similarity op; compute it in a LambdaOp or after export",
}


def __getattr__(name: str) -> Any:
    if name in _MISSING:
        raise AttributeError(f"nvtabular.ops.{name} has no tabstream counterpart: {_MISSING[name]}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

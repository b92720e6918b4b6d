"""``nvtabular.ops``, tabstream's ops underneath: the same classes as
:mod:`tabstream.ops` under NVTabular's names, with NVTabular's extra helpers.

``Operator`` is the base of a custom op written NVTabular's way (see
``docs/migration.md``, "Custom ops")::

    class Scale(ops.Operator):
        def transform(self, col_selector, df):          # a pandas DataFrame in and out
            for name in col_selector.names:
                df[name] = df[name] * 2.0
            return df

        def column_mapping(self, col_selector):          # optional: output -> its inputs
            return {f"{n}_x2": [n] for n in col_selector.names}

``AddProperties(properties)`` is ``AddMetadata(properties=...)``. NVTabular ops
with no tabstream counterpart (``ColumnSimilarity``) raise an ``AttributeError``
saying so; see ``docs/nvtabular-differences.md``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from tabstream.core.dtypes import arrow_to_pandas, arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.graph import ColumnSelector
from tabstream.core.schema import ColumnSchema, Schema, normalize_tags
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
from tabstream.ops import Operator as _Operator

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


class _NVTabularOperator(_Operator):
    """NVTabular's ``Operator``: the base of custom ops written NVTabular's way.

    Override ``transform(self, col_selector, df)`` (``df`` a pandas DataFrame holding
    the selected columns and the op's dependencies; return a DataFrame) and, when the
    op renames or makes columns, ``column_mapping(col_selector)`` (output name ->
    the input names it reads) or ``output_column_names(col_selector)``. The output
    schema follows NVTabular's rule: each output column takes the dtype, tags and
    properties of its first input, then ``output_dtype``, ``output_tags`` and
    ``output_properties``; without ``output_dtype``, the dtype ``transform`` gives
    on zero rows. Dependencies: ``dependencies`` (a property or a method) lists
    column names or nodes the op reads besides its selection.

    A workflow holding one runs, fits and transforms like any op; saving it needs
    the op's constructor parameters stored under their own names (as every tabstream
    op does) and the class importable.
    """

    #: NVTabular's output declarations, overridden by custom ops
    output_dtype: Any = None
    output_tags: Any = ()
    output_properties: Any = {}

    def transform(self, col_selector: ColumnSelector, df: Any) -> Any:  # type: ignore[override]
        return df

    def column_mapping(self, col_selector: ColumnSelector) -> dict[str, list[str]]:
        """Output column name -> the input columns it is made from (here: each its own)."""
        if type(self).output_column_names is not _NVTabularOperator.output_column_names:
            outs, ins = list(self.output_column_names(col_selector).names), list(col_selector.names)
            if len(outs) == len(ins):
                return {o: [i] for o, i in zip(outs, ins)}
            return {o: ins for o in outs}
        return {name: [name] for name in col_selector.names}

    def output_column_names(self, col_selector: ColumnSelector) -> ColumnSelector:
        return ColumnSelector(list(self.column_mapping(col_selector)))

    def compute_output_schema(self, input_schema: Schema, col_selector: ColumnSelector,  # type: ignore[override]
                              prev_output_schema: Schema | None = None) -> Schema:
        selector = ColumnSelector(col_selector.resolve(input_schema))
        produced = self._dtypes_on_zero_rows(input_schema, selector) if self.output_dtype is None else {}
        out = []
        for name, sources in self.column_mapping(selector).items():
            src = next((input_schema[s] for s in sources if s in input_schema), ColumnSchema(name))
            col = ColumnSchema(name, src.dtype, src.tags | normalize_tags(list(self.output_tags)),
                               {**src.properties, **dict(self.output_properties)}, src.is_list, src.is_ragged)
            if self.output_dtype is not None:
                col = col.with_dtype(ColumnSchema(name, self.output_dtype).dtype)
            elif name in produced:
                col = col.with_dtype(*produced[name])
            out.append(col)
        return Schema(out)

    def _dtypes_on_zero_rows(self, input_schema: Schema, selector: ColumnSelector) -> dict[str, tuple]:
        """``{output: (dtype, is_list)}`` of ``transform`` run on zero rows of the input
        (NVTabular learns changed dtypes on the data; empty when the input's dtypes
        are unknown or the op cannot run on zero rows: the input dtypes stand)."""
        fields = []
        for col in input_schema:
            if col.dtype == "unknown":
                return {}
            t = dtype_to_arrow_type(col.dtype)
            fields.append(pa.field(col.name, pa.list_(t) if col.is_list else t))
        try:
            frame = self.transform(selector, arrow_to_pandas(pa.schema(fields).empty_table()))
            table = pa.Table.from_pandas(frame, preserve_index=False)
        except Exception:  # noqa: BLE001 - the op's own code on zero rows; the input dtypes stand
            return {}
        return {f.name: arrow_type_to_dtype(f.type) for f in table.schema if not pa.types.is_null(f.type)}


#: ``nvt.ops.Operator``
Operator = _NVTabularOperator


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

"""Groupby: one row per key, other columns aggregated (NVTabular's ``Groupby``).

The op behind session-based recipes: group the interactions of a session, keep
the items in time order::

    sessions = ["session_id", "ts", "item_id", "price"] >> ops.Groupby(
        groupby_cols=["session_id"], sort_cols=["ts"],
        aggs={"item_id": ["list", "count"], "price": "mean", "ts": ["first", "last"]})

    session_id  ts  item_id  price          session_id  item_id-list  item_id-count  price-mean  ts-first  ts-last
    1           20  7        1.0            1           [5, 7]        2              1.5         10        20
    2           30  9        NaN     ->     2           [9]           1              NaN         30        30
    1           10  5        2.0

Semantics
---------
* Rows are stably sorted by ``sort_cols`` (``ascending`` applies to all of them;
  missing values last, ties keep the input order) before aggregating, so ``list``
  holds the values in that order. Without ``sort_cols`` the input order is used.
* ``first``/``last`` are the first/last element of ``list``; with
  ``ascending=False`` they are its last/first (NVTabular's rule): ``first`` is the
  earliest row by ``sort_cols`` in either direction, so ``ts-first <= ts-last``.
* Output columns: the ``groupby_cols`` first, then ``<column><name_sep><agg>`` for
  each aggregated column (input order for list/str ``aggs``, dict order for a dict)
  and each aggregation in the order given. Output rows are sorted by the keys
  (ascending, the missing key last).
* Keys: null and NaN are one group (its key is null); ``-0.0`` and ``0.0`` are one
  group (key ``0.0``). List columns cannot be keys.
* ``count`` counts the non-missing values (null and NaN are missing), as pandas
  does; ``sum`` (0 for a group with no values, as pandas), ``mean``, ``std``,
  ``var`` (``ddof=1``), ``min`` and ``max`` skip missing values; a group with no
  values gets null (``sum``: 0).
* ``list``, ``first`` and ``last`` keep every row's value as it is: a null stays
  null, NaN stays NaN. ``list`` of a list column concatenates the rows' lists in
  order (a null list adds nothing); ``first``/``last`` of a list column give the
  first/last row's list.
* ``median`` (exact; the mean of the two middle values for an even count) skips
  missing values, null for a group with none; ``nunique`` counts the distinct
  non-missing values (pandas' ``nunique()``), 0 for a group with none.
* Output dtypes: ``count``/``nunique`` int64; ``mean``/``std``/``var``/``median`` float64; ``sum`` int64
  for integer and bool columns, float64 for floats; ``min``/``max``/``first``/
  ``last`` keep the column's dtype; ``list`` is a ragged list of the element dtype.

Rows of one key spread over several partitions
----------------------------------------------
``transform`` groups one table: correct when the table holds every row of each of
its keys (``workflow.transform(pandas_df)`` or an Arrow table, which are one
partition). For a partitioned :class:`~tabstream.Dataset` the workflow executor
repartitions by key first (see :mod:`tabstream.pipeline.regroup`): the op's input
is computed partition by partition and its rows are scattered to hash buckets of
the key, spilled to parquet; each bucket (every row of its keys, in input order)
is then grouped as one partition. Memory is bounded by one input partition in the
first pass and one bucket in the second, not by the dataset. (NVTabular groups
each partition alone and asks the user to shuffle by key first.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import dtype_to_arrow_type, is_list_type, widen_half
from tabstream.core.errors import SchemaError
from tabstream.core.hashing import hash_combine, murmur3_32, normalize_missing
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Schema, Tags

__all__ = ["AGGREGATIONS", "Groupby", "key_buckets"]

#: every aggregation name Groupby accepts
AGGREGATIONS = ("count", "sum", "mean", "std", "var", "min", "max", "first", "last", "list",
                "median", "nunique")
#: aggregations that need numbers (not lists, not strings)
_NUMERIC = ("sum", "mean", "std", "var", "median")
_ROW = "__groupby_row__"


def _names(value: Any, what: str, required: bool) -> list[str]:
    if value is None:
        value = []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"Groupby: {what} must be a column name or a list of names, got {value!r}")
    for name in value:
        if not isinstance(name, str):
            raise TypeError(f"Groupby: {what} must hold column names (strings), got {name!r}")
    if required and not value:
        raise ValueError(f"Groupby: {what} is required: give the key column(s), e.g. groupby_cols=['session_id']")
    if len(set(value)) != len(value):
        raise ValueError(f"Groupby: {what} names a column twice: {list(value)}")
    return list(value)


def _agg_list(value: Any, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not value:
        raise TypeError(f"Groupby: aggs{where} must be an aggregation name or a non-empty list of names, "
                        f"got {value!r}")
    out: list[str] = []
    for agg in value:
        if not isinstance(agg, str):
            raise TypeError(f"Groupby: aggs{where} must hold aggregation names (strings), got {agg!r}")
        if agg not in AGGREGATIONS:
            raise ValueError(f"Groupby: unknown aggregation {agg!r} in aggs{where}; "
                             f"supported: {list(AGGREGATIONS)}")
        if agg not in out:
            out.append(agg)
    return out


class Groupby(Operator):
    """Group rows by ``groupby_cols`` and aggregate the other selected columns.

    Parameters
    ----------
    groupby_cols:
        Key column name(s); required, and among the selected columns.
    sort_cols:
        Column(s) to sort each group's rows by before aggregating (stable).
    aggs:
        An aggregation name or list of names applied to every selected column that is
        not a key, or a dict ``{column: name or [names]}`` (only those columns are
        kept). Names: ``count, sum, mean, std, var, median, nunique, min, max,
        first, last, list``.
    name_sep:
        Separator of output names: ``item_id-list``.
    ascending:
        Sort direction of ``sort_cols`` (the order of ``list``); ``first``/``last``
        take ``list``'s last/first element when False, as in NVTabular.

    >>> import pyarrow as pa
    >>> t = pa.table({"s": [1, 2, 1], "ts": [20, 30, 10], "item": [7, 9, 5]})
    >>> out = Groupby("s", sort_cols="ts", aggs=["list", "last"]).transform(t)
    >>> for name, column in out.to_pydict().items():
    ...     print(f"{name:9} {column}")
    s         [1, 2]
    ts-list   [[10, 20], [30]]
    ts-last   [20, 30]
    item-list [[5, 7], [9]]
    item-last [7, 9]
    """

    changes_row_count = True

    def __init__(self, groupby_cols: str | Sequence[str] | None = None,
                 sort_cols: str | Sequence[str] | None = None,
                 aggs: str | Sequence[str] | dict[str, str | Sequence[str]] = "list",
                 name_sep: str = "-", ascending: bool = True) -> None:
        self.groupby_cols = _names(groupby_cols, "groupby_cols", required=True)
        self.sort_cols = _names(sort_cols, "sort_cols", required=False)
        if isinstance(aggs, dict):
            if not aggs:
                raise ValueError("Groupby: aggs is an empty dict; name at least one column to aggregate")
            for col in aggs:
                if not isinstance(col, str):
                    raise TypeError(f"Groupby: aggs keys must be column names (strings), got {col!r}")
                if col in self.groupby_cols:
                    raise ValueError(f"Groupby: aggs names the key column {col!r}; keys are kept as they "
                                     "are, aggregate another column (e.g. 'count' of any column)")
            self.aggs: list[str] | dict[str, list[str]] = {
                col: _agg_list(value, f"[{col!r}]") for col, value in aggs.items()}
        else:
            self.aggs = _agg_list(aggs, "")
        if not isinstance(name_sep, str):
            raise TypeError(f"Groupby: name_sep must be a string, got {name_sep!r}")
        if not isinstance(ascending, bool):
            raise TypeError(f"Groupby: ascending must be True or False, got {ascending!r}")
        self.name_sep = name_sep
        self.ascending = ascending

    def dependencies(self) -> list[str]:
        """The keys join the selection (``["item"] >> Groupby("session")`` reads
        ``session`` too), as NVTabular's Groupby does."""
        return list(self.groupby_cols)

    # -- schema -------------------------------------------------------------
    def _plan(self, input_schema: Schema) -> list[tuple[str, list[str]]]:
        names = input_schema.column_names
        for what, cols in (("groupby_cols", self.groupby_cols), ("sort_cols", self.sort_cols)):
            missing = [c for c in cols if c not in input_schema]
            if missing:
                raise SchemaError(f"Groupby: {what} {missing} are not among the columns it is applied to "
                                  f"{names}; select them too, e.g. {names + missing} >> Groupby(...)")
        if isinstance(self.aggs, dict):
            missing = [c for c in self.aggs if c not in input_schema]
            if missing:
                raise SchemaError(f"Groupby: aggs names columns {missing} that are not among the columns "
                                  f"it is applied to {names}")
            return list(self.aggs.items())
        return [(c, list(self.aggs)) for c in names if c not in self.groupby_cols]

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        plan = self._plan(input_schema)
        out = []
        for key in self.groupby_cols:
            col = input_schema[key]
            if col.is_list:
                raise TypeError(f"Groupby: key column {key!r} is a list column; keys must be scalar columns")
            out.append(col)
        for name, aggs in plan:
            col = input_schema[name]
            out += [self._agg_column(col, agg) for agg in aggs]
        return Schema(out)

    def _agg_column(self, col: ColumnSchema, agg: str) -> ColumnSchema:
        name = f"{col.name}{self.name_sep}{agg}"
        numeric = col.dtype.startswith(("int", "uint", "float")) or col.dtype in ("bool", "unknown")
        if agg in _NUMERIC and (col.is_list or not numeric):
            kind = f"{'a list of ' if col.is_list else ''}{col.dtype}"
            raise TypeError(f"Groupby: aggregation {agg!r} needs a numeric column, but {col.name!r} is {kind}; "
                            "use count, min, max, first, last or list")
        if agg in ("min", "max", "nunique") and col.is_list:
            raise TypeError(f"Groupby: aggregation {agg!r} does not apply to the list column {col.name!r}; "
                            "use count, first, last or list")
        props = {k: v for k, v in col.properties.items() if k != "value_count"}
        if agg in ("count", "nunique"):
            return ColumnSchema(name, "int64", {Tags.CONTINUOUS})
        if agg in ("mean", "std", "var", "median"):
            return ColumnSchema(name, "float64", col.tags - {Tags.CATEGORICAL} | {Tags.CONTINUOUS})
        if agg == "sum":
            dtype = "float64" if col.dtype.startswith("float") else "int64"
            return ColumnSchema(name, dtype, col.tags - {Tags.CATEGORICAL} | {Tags.CONTINUOUS})
        if agg == "list":
            return ColumnSchema(name, col.dtype, col.tags, props, is_list=True, is_ragged=True)
        return ColumnSchema(name, col.dtype, col.tags, col.properties, is_list=col.is_list,
                            is_ragged=col.is_ragged)

    # -- transform ----------------------------------------------------------
    def transform(self, table: pa.Table) -> pa.Table:
        from tabstream.core.dtypes import arrow_type_to_dtype

        # dictionary columns (pandas' category, parquet's dictionary pages) decoded:
        # Arrow's group-by, sorts and min/max take their values, not dictionaries
        table = pa.table({n: c.cast(c.type.value_type) if pa.types.is_dictionary(c.type) else c
                          for n, c in zip(table.column_names, table.columns)})
        schema = Schema(ColumnSchema(n, *arrow_type_to_dtype(t)[:1], is_list=is_list_type(t))
                        for n, t in zip(table.column_names, table.schema.types))
        plan = self._plan(schema)
        declared = self.compute_output_schema(schema)
        keys = {k: backend().normalize_missing(table.column(k)) for k in self.groupby_cols}
        if self.sort_cols:
            order = "ascending" if self.ascending else "descending"
            sort_table = pa.table({f"s{i}": backend().normalize_missing(table.column(c))
                                   for i, c in enumerate(self.sort_cols)})
            # stable, missing last (pandas' na_position="last"; NaN counts as missing)
            idx = backend().sort_indices(sort_table, [(f"s{i}", order) for i in range(len(self.sort_cols))])
            table = backend().take(table, idx)
            keys = {k: _take(v, idx) for k, v in keys.items()}

        key_names = [f"k{i}" for i in range(len(self.groupby_cols))]
        work = {name: keys[k] for name, k in zip(key_names, self.groupby_cols)}
        work[_ROW] = pa.array(np.arange(table.num_rows, dtype=np.int64))
        specs = [(_ROW, "list", f"{_ROW}_list"), (_ROW, "min", f"{_ROW}_min"), (_ROW, "max", f"{_ROW}_max")]
        for j, (name, aggs) in enumerate(plan):
            for agg in aggs:
                if agg in ("count", "sum", "mean", "std", "var", "min", "max"):
                    # float16 as float32 (exact): Arrow has no half-float aggregations;
                    # the results are cast to the declared types below
                    work.setdefault(f"v{j}", widen_half(backend().normalize_missing(table.column(name))))
                    specs.append((f"v{j}", agg, f"v{j}_{agg}"))
        grouped = backend().groupby_aggregate(pa.table(work), key_names, specs)
        # rows sorted by key, the missing key last
        key_order = backend().sort_indices(grouped, [(k, "ascending") for k in key_names])
        grouped = backend().take(grouped, key_order)

        rows = grouped.column(f"{_ROW}_list").combine_chunks()
        columns: list[Any] = [grouped.column(f"k{i}") for i in range(len(self.groupby_cols))]
        # NVTabular's first/last: list[0]/list[-1], swapped when ascending=False
        first, last = (f"{_ROW}_min", f"{_ROW}_max") if self.ascending else (f"{_ROW}_max", f"{_ROW}_min")
        for j, (name, aggs) in enumerate(plan):
            source = table.column(name)
            for agg in aggs:
                if agg == "first":
                    columns.append(_take(source, grouped.column(first)))
                elif agg == "last":
                    columns.append(_take(source, grouped.column(last)))
                elif agg == "list":
                    columns.append(_gather_lists(source, rows))
                elif agg in ("median", "nunique"):
                    columns.append(_per_group(source, rows, agg))
                else:
                    columns.append(grouped.column(f"v{j}_{agg}"))
        out = []
        for col, field in zip(columns, declared):
            target = _arrow_type(field, col.type)
            out.append(col if col.type == target else col.cast(target))
        return pa.table(out, names=declared.column_names)


def _take(column: pa.ChunkedArray | pa.Array, indices: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """``column``'s values at ``indices`` (the backend's take)."""
    return backend().take(pa.table({"c": column}), indices).column("c")


def _arrow_type(col: ColumnSchema, produced: pa.DataType) -> pa.DataType:
    """The Arrow type of a declared column; strings and keys keep their own type,
    except that a list of strings is always ``list<string>`` (pandas input holds
    strings as ``large_string``; the output must not depend on the input's origin)."""
    if col.dtype == "string" and col.is_list and is_list_type(produced):
        return pa.list_(pa.string())
    if col.dtype in ("string", "unknown") or col.dtype.startswith("datetime"):
        return produced
    base = dtype_to_arrow_type(col.dtype)
    if col.is_list:
        return produced if not is_list_type(produced) else pa.list_(base)
    return base


def _per_group(source: pa.ChunkedArray, rows: pa.ListArray, agg: str) -> pa.Array:
    """``median`` or ``nunique`` of each group's non-missing values; ``rows`` holds
    each group's row indices."""
    offsets = rows.offsets.to_numpy()
    lengths = np.diff(offsets)
    groups = len(lengths)
    values = backend().normalize_missing(_take(source, rows.flatten()))  # -0.0 is 0.0, NaN null
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    gid = np.repeat(np.arange(groups, dtype=np.int64), lengths)
    valid = np.asarray(pc.is_valid(values).to_numpy(zero_copy_only=False), dtype=bool)
    gid = gid[valid]
    if agg == "nunique":
        codes = pc.dictionary_encode(values.filter(pa.array(valid))).indices.to_numpy(zero_copy_only=False)
        pairs = np.unique(np.stack([gid, codes.astype(np.int64)]), axis=1)
        return pa.array(np.bincount(pairs[0], minlength=groups).astype(np.int64))
    x = np.asarray(pc.cast(values, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)[valid]
    order = np.lexsort((x, gid))
    x = np.append(x[order], 0.0)  # one spare value: a group of none indexes it, masked below
    counts = np.bincount(gid, minlength=groups)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    has = counts > 0
    lo = np.where(has, starts + (counts - 1) // 2, len(x) - 1)
    hi = np.where(has, starts + counts // 2, len(x) - 1)
    return pa.array((x[lo] + x[hi]) / 2, mask=~has)


def _gather_lists(source: pa.ChunkedArray, rows: pa.ListArray) -> pa.Array:
    """Per group, the source values at the group's row indices (in order); list
    values are concatenated."""
    values = _take(source, rows.flatten())
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    offsets = rows.offsets
    if offsets.offset:  # a sliced array: rebase
        offsets = pc.subtract(offsets, offsets[0])
    if is_list_type(values.type):
        inner = pc.list_value_length(values).fill_null(0).to_numpy(zero_copy_only=False)
        bounds = np.concatenate([[0], np.cumsum(inner, dtype=np.int64)])
        flat = pc.list_flatten(values)
        group_offsets = bounds[offsets.to_numpy()]
        return pa.ListArray.from_arrays(pa.array(group_offsets.astype(np.int32)), flat)
    return pa.ListArray.from_arrays(offsets, values)


def key_buckets(table: pa.Table, groupby_cols: Sequence[str], buckets: int) -> np.ndarray:
    """The bucket (``0 <= b < buckets``) of each row's key: equal keys (null and NaN
    alike, ``-0.0`` and ``0.0`` alike) get the same bucket in every partition."""
    h = None
    for name in groupby_cols:
        part = murmur3_32(normalize_missing(table.column(name)))
        h = part if h is None else hash_combine(h, part)
    if h is None:
        return np.zeros(table.num_rows, dtype=np.int64)
    return (np.asarray(h, dtype=np.uint64) % np.uint64(buckets)).astype(np.int64)

"""Hash-based categorical ops: HashBucket and HashedCross.

``HashBucket(num_buckets)`` maps each value to ``murmur3_32(value) % num_buckets``
(see :mod:`tabstream.core.hashing` for the exact byte encoding), so a value
gets the same id in every row, partition, process and run, and on any backend
that implements MurmurHash3 x86_32. A missing value (null, or NaN in a float
column) gets its own id ``num_buckets``, which no value can hash to; the table
therefore has ``num_buckets + 1`` rows (schema cardinality ``num_buckets + 1``,
domain ``[0, num_buckets]``). Id ``0`` is an ordinary bucket here: padding of list
columns is told apart by the loader's mask, not by an id.

>>> import pyarrow as pa
>>> from tabstream.ops import HashBucket
>>> HashBucket(10).transform(pa.table({"c": ["a", "b", "a", None]}))["c"].to_pylist()
[0, 5, 0, 10]

(``h("a") % 10``, ``h("b") % 10``, the same for ``"a"`` again, and ``10`` for null.)

``HashedCross(num_buckets)`` crosses the selected columns (or each nested group)
into one new column ``a_X_b``: ``hash_combine(h(a), h(b)) % num_buckets``, folding
left over more columns. A missing part (null or NaN) does not hash like any value
(``h("")`` is 0, so a missing part must not count as 0): a missing part folds the
marker ``M = 0x9E3779B9`` twice where a value folds its hash once
(``hash_combine(hash_combine(h, M), M)``), and a missing *first* part starts from
``M`` and adds one more fold ``hash_combine(h, M)`` at the end; the row keeps a
cross of the other parts. A row whose parts are *all* missing gets
the missing id ``num_buckets`` (as Categorify's combo encoding gives such a row
the null id). Cardinality ``num_buckets + 1``. List columns cross element by
element (all lists of a row must have the same length; scalars broadcast).

Before hashing, ``-0.0`` becomes ``0.0`` and NaN becomes missing
(:func:`~tabstream.core.hashing.normalize_missing`); ``""`` and ``inf`` are values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.hashing import hash_combine
from tabstream.core.operators import ColumnOperator, Operator
from tabstream.core.schema import ColumnSchema, Schema, Tags, embedding_dim

__all__ = ["HashBucket", "HashedCross"]


class HashBucket(ColumnOperator):
    """Hash each value into ``num_buckets`` ids (an int, or a dict per column).

    Values get ``murmur3_32(value) % num_buckets``; missing values (null, NaN) get
    ``num_buckets``. Output cardinality: ``num_buckets + 1``.
    """

    def __init__(self, num_buckets: int | dict[str, int]) -> None:
        _check_buckets("HashBucket", num_buckets)
        self.num_buckets = num_buckets

    def _buckets(self, name: str) -> int:
        if isinstance(self.num_buckets, dict):
            if name not in self.num_buckets:
                raise KeyError(f"HashBucket: no num_buckets given for column {name!r}")
            return int(self.num_buckets[name])
        return int(self.num_buckets)

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        n = self._buckets(col.name)
        # no domain name (as NVTabular's): tables are then named by the column, so a
        # hashed copy of a column Categorify also encodes gets a table of its own (the
        # column's name here made both share one, hashed ids on vocabulary rows)
        props: dict[str, Any] = {**col.properties, **_hashed_properties(n)}
        out = col.with_dtype("int64").with_tags(Tags.CATEGORICAL).without_tags(Tags.CONTINUOUS)
        return ColumnSchema(out.name, "int64", out.tags, props, is_list=col.is_list, is_ragged=col.is_ragged)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.Array:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        n = self._buckets(name)
        kernels = backend()
        column = kernels.normalize_missing(column)
        if _is_list(column.type):
            offsets, values = kernels.list_offsets(column), kernels.list_flatten(column)
            ids = pa.array(_bucket(values, n))
            return type(column).from_arrays(offsets, ids, mask=column.is_null() if column.null_count else None)
        return pa.array(_bucket(column, n))


def _check_buckets(op: str, num_buckets: Any) -> None:
    items = num_buckets.items() if isinstance(num_buckets, dict) else [(None, num_buckets)]
    for key, n in items:
        where = f" for {key!r}" if key is not None else ""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
            raise TypeError(f"{op}: num_buckets{where} must be a positive integer, got {type(n).__name__} {n!r}")
        if n < 1:
            raise ValueError(f"{op}: num_buckets{where} must be a positive integer, got {n!r}")


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _hashed_properties(n: int, name: str | None = None) -> dict[str, Any]:
    """Schema properties of a hashed column: ids ``[0, n)`` plus the missing id ``n``
    (``name``: the domain's name, when given)."""
    return {
        "num_buckets": n,
        "domain": {"min": 0, "max": n, **({"name": name} if name is not None else {})},
        "embedding_sizes": {"cardinality": n + 1, "dimension": embedding_dim(n + 1)},
    }


def _bucket(values: pa.Array, n: int) -> np.ndarray:
    """``hash % n`` per value, ``n`` where missing (``values`` already normalized)."""
    hashes, is_null = backend().murmur3(values)
    ids = (hashes % np.uint32(n)).astype(np.int64)
    ids[is_null] = n
    return ids


class HashedCross(Operator):
    """Cross columns into hashed ids: ``["a", "b"] >> HashedCross(1000)`` -> ``a_X_b``.

    Nested selections cross each group: ``[["a", "b"], ["a", "c"]] >> HashedCross(100)``
    gives ``a_X_b`` and ``a_X_c``. ``num_buckets`` may be a dict keyed by output name.
    Ids are ``[0, num_buckets)`` for crosses with at least one present part and
    ``num_buckets`` when every part is missing (cardinality ``num_buckets + 1``).
    """

    def __init__(self, num_buckets: int | dict[str, int], column_groups: list | None = None) -> None:
        _check_buckets("HashedCross", num_buckets)
        self.num_buckets = num_buckets
        self.column_groups = [list(g) for g in column_groups] if column_groups else None

    def set_column_groups(self, groups: list) -> None:
        if self.column_groups is None:
            self.column_groups = [list(g) for g in groups if isinstance(g, list)]

    def _groups(self, names: list[str]) -> list[list[str]]:
        groups = self.column_groups or [names]
        for g in groups:
            if len(g) < 2:
                raise ValueError(f"HashedCross needs at least two columns per cross, got {g}")
            missing = [n for n in g if n not in names]
            if missing:
                raise KeyError(f"HashedCross: columns {missing} are not selected; selected: {names}")
        return groups

    def _buckets(self, name: str) -> int:
        if isinstance(self.num_buckets, dict):
            if name not in self.num_buckets:
                raise KeyError(f"HashedCross: no num_buckets given for cross {name!r}")
            return int(self.num_buckets[name])
        return int(self.num_buckets)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        cols = []
        for group in self._groups(input_schema.column_names):
            name = "_X_".join(group)
            n = self._buckets(name)
            is_list = any(input_schema[c].is_list for c in group)
            cols.append(ColumnSchema(name, "int64", [Tags.CATEGORICAL], is_list=is_list, is_ragged=is_list,
                                     properties=_hashed_properties(n, name)))
        return Schema(cols)

    def transform(self, table: pa.Table) -> pa.Table:
        out = {}
        for group in self._groups(table.column_names):
            name = "_X_".join(group)
            n = self._buckets(name)
            columns = [backend().normalize_missing(table.column(c).combine_chunks()) for c in group]
            list_names = [c for c, col in zip(group, columns) if _is_list(col.type)]
            if not list_names:
                out[name] = pa.array(_cross([backend().murmur3(c) for c in columns], n))
                continue
            template = columns[group.index(list_names[0])]
            lengths = pc.list_value_length(template).fill_null(0).to_numpy(zero_copy_only=False)
            for col in list_names[1:]:
                other = columns[group.index(col)]
                other_len = pc.list_value_length(other).fill_null(0).to_numpy(zero_copy_only=False)
                if not np.array_equal(lengths, other_len):
                    raise ValueError(f"HashedCross {name!r}: list column {col!r} has rows whose length "
                                     f"differs from the first list column {list_names[0]!r} of the cross")
            parts = []
            for c in columns:
                if _is_list(c.type):
                    # flatten() drops the slots of null lists, as the lengths above do
                    parts.append(backend().murmur3(pc.list_flatten(c)))
                else:
                    hashes, is_null = backend().murmur3(c)
                    parts.append((np.repeat(hashes, lengths), np.repeat(is_null, lengths)))
            ids = pa.array(_cross(parts, n))
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            out[name] = pa.ListArray.from_arrays(offsets, ids, mask=template.is_null() if template.null_count else None)
        return pa.table(out)


_MISSING_PART = np.uint32(0x9E3779B9)  # see the module docstring


def _cross(parts: list[tuple[np.ndarray, np.ndarray]], n: int) -> np.ndarray:
    """Fold ``(hashes, is_null)`` parts into ids: ``combined % n``, ``n`` where all are missing."""
    first_missing = parts[0][1]
    h = np.where(first_missing, _MISSING_PART, parts[0][0]).astype(np.uint32)
    all_null = first_missing
    for hashes, is_null in parts[1:]:
        folded = hash_combine(h, hashes)
        rows = np.flatnonzero(is_null)
        if rows.size:
            folded[rows] = hash_combine(hash_combine(h[rows], _MISSING_PART), _MISSING_PART)
        h = folded
        all_null = all_null & is_null
    rows = np.flatnonzero(first_missing)
    if rows.size:
        h[rows] = hash_combine(h[rows], _MISSING_PART)
    ids = (h % np.uint32(n)).astype(np.int64)
    ids[all_null] = n
    return ids

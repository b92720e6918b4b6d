"""Hash-based categorical ops: HashBucket and HashedCross.

``HashBucket(num_buckets)`` maps each value to ``murmur3_32(value) % num_buckets``
(see :mod:`tabstream.pipeline.hashing` for the exact byte encoding), so a value
gets the same id in every row, partition, process and run, and on any backend
that implements MurmurHash3 x86_32. Nulls map to id 0.

>>> HashBucket(10).transform(pa.table({"c": ["a", "b", "a", None]}))["c"]
[h("a") % 10, h("b") % 10, h("a") % 10, 0]

``HashedCross(num_buckets)`` crosses the selected columns (or each nested group)
into one new column ``a_X_b``: ``hash_combine(h(a), h(b)) % num_buckets``, folding
left over more columns; a null part contributes hash 0. List columns cross element
by element (all lists of a row must have the same length; scalars broadcast).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.ops.base import ColumnOperator, Operator
from tabstream.pipeline.hashing import hash_combine, murmur3_32
from tabstream.pipeline.schema import ColumnSchema, Schema, Tags
from tabstream.train.tables import infer_embedding_dim

__all__ = ["HashBucket", "HashedCross"]


class HashBucket(ColumnOperator):
    """Hash each value into ``num_buckets`` ids (an int, or a dict per column)."""

    def __init__(self, num_buckets: int | dict[str, int]) -> None:
        values = num_buckets.values() if isinstance(num_buckets, dict) else [num_buckets]
        if any(not isinstance(v, (int, np.integer)) or v < 1 for v in values):
            raise ValueError(f"HashBucket: num_buckets must be a positive integer, got {num_buckets!r}")
        self.num_buckets = num_buckets

    def _buckets(self, name: str) -> int:
        if isinstance(self.num_buckets, dict):
            if name not in self.num_buckets:
                raise KeyError(f"HashBucket: no num_buckets given for column {name!r}")
            return int(self.num_buckets[name])
        return int(self.num_buckets)

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        n = self._buckets(col.name)
        props: dict[str, Any] = {
            **col.properties,
            "num_buckets": n,
            "domain": {"min": 0, "max": n - 1, "name": col.name},
            "embedding_sizes": {"cardinality": n, "dimension": infer_embedding_dim(n)},
        }
        out = col.with_dtype("int64").with_tags(Tags.CATEGORICAL).without_tags(Tags.CONTINUOUS)
        return ColumnSchema(out.name, "int64", out.tags, props, is_list=col.is_list, is_ragged=col.is_ragged)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.Array:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        n = self._buckets(name)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            values = column.flatten()
            ids = _bucket(values, n)
            return type(column).from_arrays(column.offsets, pa.array(ids), mask=column.is_null())
        return pa.array(_bucket(column, n))


def _bucket(values: pa.Array, n: int) -> np.ndarray:
    ids = (murmur3_32(values) % np.uint32(n)).astype(np.int64)
    valid = np.asarray(values.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    ids[~valid] = 0
    return ids


class HashedCross(Operator):
    """Cross columns into hashed ids: ``["a", "b"] >> HashedCross(1000)`` -> ``a_X_b``.

    Nested selections cross each group: ``[["a", "b"], ["a", "c"]] >> HashedCross(100)``
    gives ``a_X_b`` and ``a_X_c``. ``num_buckets`` may be a dict keyed by output name.
    """

    def __init__(self, num_buckets: int | dict[str, int], column_groups: list | None = None) -> None:
        values = num_buckets.values() if isinstance(num_buckets, dict) else [num_buckets]
        if any(not isinstance(v, (int, np.integer)) or v < 1 for v in values):
            raise ValueError(f"HashedCross: num_buckets must be a positive integer, got {num_buckets!r}")
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
            cols.append(ColumnSchema(
                name, "int64", [Tags.CATEGORICAL], is_list=is_list, is_ragged=is_list,
                properties={"num_buckets": n, "domain": {"min": 0, "max": n - 1, "name": name},
                            "embedding_sizes": {"cardinality": n, "dimension": infer_embedding_dim(n)}},
            ))
        return Schema(cols)

    def transform(self, table: pa.Table) -> pa.Table:
        out = {}
        for group in self._groups(table.column_names):
            name = "_X_".join(group)
            columns = [table.column(c).combine_chunks() for c in group]
            lists = [c for c in columns if pa.types.is_list(c.type) or pa.types.is_large_list(c.type)]
            if not lists:
                h = murmur3_32(columns[0])
                for c in columns[1:]:
                    h = hash_combine(h, murmur3_32(c))
                out[name] = pa.array((h % np.uint32(self._buckets(name))).astype(np.int64))
                continue
            template = lists[0]
            lengths = pc.list_value_length(template).fill_null(0).to_numpy(zero_copy_only=False)
            for other, col in zip(lists[1:], [c for c in group if table.column(c).type == template.type][1:]):
                other_len = pc.list_value_length(other).fill_null(0).to_numpy(zero_copy_only=False)
                if not np.array_equal(lengths, other_len):
                    raise ValueError(f"HashedCross {name!r}: list column {col!r} has rows whose length "
                                     "differs from the first list column of the cross")
            h = None
            for c in columns:
                if pa.types.is_list(c.type) or pa.types.is_large_list(c.type):
                    part = murmur3_32(pc.list_flatten(c))
                else:
                    part = np.repeat(murmur3_32(c), lengths)
                h = part if h is None else hash_combine(h, part)
            ids = pa.array((h % np.uint32(self._buckets(name))).astype(np.int64))
            offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
            out[name] = pa.ListArray.from_arrays(offsets, ids, mask=template.is_null() if template.null_count else None)
        return pa.table(out)

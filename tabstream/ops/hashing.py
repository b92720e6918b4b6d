"""Hash-based categorical ops.

``HashBucket(num_buckets)`` maps each value to ``murmur3_32(value) % num_buckets``
(see :mod:`tabstream.pipeline.hashing` for the exact byte encoding), so a value
gets the same id in every row, partition, process and run, and on any backend
that implements MurmurHash3 x86_32. Nulls map to id 0.

>>> HashBucket(10).transform(pa.table({"c": ["a", "b", "a", None]}))["c"]
[h("a") % 10, h("b") % 10, h("a") % 10, 0]
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.ops.base import ColumnOperator
from tabstream.pipeline.hashing import murmur3_32
from tabstream.pipeline.schema import ColumnSchema, Tags
from tabstream.train.tables import infer_embedding_dim

__all__ = ["HashBucket"]


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

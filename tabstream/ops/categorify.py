"""Categorify: map categorical values to contiguous integer ids.

Encoding of every output column::

    0                     padding (never produced; reserved for padded lists)
    1                     null / missing
    [2, 2 + num_buckets)  out of vocabulary: values seen fewer than ``freq_threshold``
                          times, cut by ``max_size``, or unseen at fit time; with
                          ``num_buckets`` they are spread by the project hash
                          (``murmur3_32(value) % num_buckets``), else all map to 2
    2 + num_buckets ...   the vocabulary, most frequent first, ties by value

>>> op = Categorify(freq_threshold=2).fit_table(pa.table({"c": ["a", "b", "a", None, "c", "b", "b"]}))
>>> op.transform(pa.table({"c": ["b", "a", "z", None]}))["c"]
[3, 4, 2, 1]

Statistics are per-partition value counts merged by a tree reduction; the
vocabulary (values with their counts, in id order) is saved as parquet.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.ops.base import StatOperator
from tabstream.pipeline.schema import ColumnSchema, Tags
from tabstream.train.tables import infer_embedding_dim

__all__ = ["Categorify"]

PAD_ID = 0
NULL_ID = 1
OOV_ID = 2


def value_counts(column: pa.ChunkedArray | pa.Array) -> pa.Table:
    """Non-null distinct values and their counts as a table ``(values, counts)``."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
        column = pc.list_flatten(column)
    vc = pc.value_counts(column)
    table = pa.table({"values": vc.field("values"), "counts": vc.field("counts").cast(pa.int64())})
    return table.filter(pc.is_valid(table["values"]))


def merge_counts(tables: Sequence[pa.Table]) -> pa.Table:
    """Sum the counts of equal values over several ``(values, counts)`` tables."""
    tables = [t for t in tables if t.num_rows] or list(tables[:1])
    if len(tables) == 1:
        return tables[0]
    merged = pa.concat_tables(tables, promote_options="permissive")
    out = merged.group_by("values").aggregate([("counts", "sum")])
    return pa.table({"values": out["values"], "counts": out["counts_sum"]})


class Categorify(StatOperator):
    """Encode each selected column with its own vocabulary (see module docs).

    Parameters
    ----------
    freq_threshold:
        Values seen fewer times than this are out of vocabulary. An int for every
        column or a dict per column.
    max_size:
        Keep at most this many vocabulary entries (the most frequent); 0 = no limit.
    num_buckets:
        Spread out-of-vocabulary values over this many hashed ids instead of one.
    dtype:
        Integer dtype of the ids (``"int64"``).
    """

    def __init__(self, freq_threshold: int | dict[str, int] = 0, max_size: int | dict[str, int] = 0,
                 num_buckets: int | None = None, dtype: str = "int64") -> None:
        super().__init__()
        for name, value in (("freq_threshold", freq_threshold), ("max_size", max_size)):
            values = value.values() if isinstance(value, dict) else [value]
            if any(not isinstance(v, (int, np.integer)) or v < 0 for v in values):
                raise ValueError(f"Categorify: {name} must be a non-negative integer, got {value!r}")
        if num_buckets is not None and (not isinstance(num_buckets, (int, np.integer)) or num_buckets < 1):
            raise ValueError(f"Categorify: num_buckets must be a positive integer or None, got {num_buckets!r}")
        if dtype not in ("int32", "int64"):
            raise ValueError(f"Categorify: dtype must be 'int32' or 'int64', got {dtype!r}")
        self.freq_threshold = freq_threshold
        self.max_size = max_size
        self.num_buckets = num_buckets
        self.dtype = dtype
        self.vocabs: dict[str, pa.Table] = {}

    @property
    def start_index(self) -> int:
        """Id of the first vocabulary entry."""
        return OOV_ID + (self.num_buckets or 1)

    def _setting(self, value: int | dict[str, int], name: str) -> int:
        return int(value.get(name, 0)) if isinstance(value, dict) else int(value)

    # -- schema -------------------------------------------------------------
    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        if col.dtype not in ("string", "bool") and not col.dtype.startswith(("int", "uint", "float")):
            raise TypeError(f"Categorify cannot encode column {col.name!r} of dtype {col.dtype}")
        props: dict[str, Any] = {
            "freq_threshold": self._setting(self.freq_threshold, col.name),
            "num_buckets": self.num_buckets,
            "start_index": self.start_index,
        }
        if col.name in self.vocabs:
            cardinality = self.start_index + self.vocabs[col.name].num_rows
            props["domain"] = {"min": 0, "max": cardinality - 1, "name": col.name}
            props["embedding_sizes"] = {"cardinality": cardinality,
                                        "dimension": infer_embedding_dim(cardinality)}
        out = col.with_dtype(self.dtype).with_tags(Tags.CATEGORICAL).without_tags(Tags.CONTINUOUS)
        return ColumnSchema(out.name, out.dtype, out.tags, {**col.properties, **props},
                            is_list=col.is_list, is_ragged=col.is_ragged)

    # -- fit ----------------------------------------------------------------
    def fit_partition(self, table: pa.Table) -> dict[str, pa.Table]:
        return {name: value_counts(table.column(name)) for name in table.column_names}

    def combine(self, partials: Sequence[dict[str, pa.Table]]) -> dict[str, pa.Table]:
        names = list(partials[0])
        return {name: merge_counts([p[name] for p in partials]) for name in names}

    def finalize(self, partial: dict[str, pa.Table]) -> None:
        vocabs = {}
        for name, counts in partial.items():
            threshold = self._setting(self.freq_threshold, name)
            if threshold > 1:
                counts = counts.filter(pc.greater_equal(counts["counts"], threshold))
            counts = counts.sort_by([("counts", "descending"), ("values", "ascending")])
            limit = self._setting(self.max_size, name)
            if limit:
                counts = counts.slice(0, limit)
            vocabs[name] = counts.combine_chunks()
        self.vocabs = vocabs
        self.fitted = True

    # -- transform ----------------------------------------------------------
    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        return pa.table({name: self._encode(name, table.column(name)) for name in table.column_names})

    def _encode(self, name: str, column: pa.ChunkedArray) -> pa.Array:
        out_type = pa.int64() if self.dtype == "int64" else pa.int32()
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        vocab = self.vocabs[name]["values"]
        if vocab.type != column.type:
            try:
                vocab = vocab.cast(column.type)
            except pa.ArrowInvalid as exc:
                raise TypeError(f"Categorify: column {name!r} is {column.type}, "
                                f"but it was fitted on {vocab.type}") from exc
        index = pc.index_in(column, value_set=vocab)
        ids = pc.add(index.cast(pa.int64()), self.start_index)
        if self.num_buckets:
            from tabstream.pipeline.hashing import murmur3_32

            hashed = murmur3_32(column).astype(np.int64) % self.num_buckets + OOV_ID
            oov: Any = pa.array(hashed)
        else:
            oov = pa.scalar(OOV_ID, pa.int64())
        ids = pc.if_else(pc.is_null(column), pa.scalar(NULL_ID, pa.int64()), pc.coalesce(ids, oov))
        return ids.cast(out_type)

    # -- state --------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"columns": list(self.vocabs)}, {f"vocab.{k}": v for k, v in self.vocabs.items()}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.vocabs = {k: tables[f"vocab.{k}"] for k in values["columns"]}
        self.fitted = True

    def reverse_mapping(self, name: str) -> pa.Table:
        """``(id, value, count)`` of every vocabulary entry of column ``name``."""
        self.check_fitted()
        vocab = self.vocabs[name]
        ids = pa.array(np.arange(self.start_index, self.start_index + vocab.num_rows, dtype=np.int64))
        return pa.table({"id": ids, "value": vocab["values"], "counts": vocab["counts"]})

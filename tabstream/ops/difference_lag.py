"""DifferenceLag: the difference to the previous (or ``shift``-th) row of the same
partition key, NVTabular's op. The partition key must be part of the selection.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.errors import SchemaError
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.keys import (
    dependencies_of,
    names_and_nodes,
    require_selected,
)
from tabstream.ops.numeric import check_numeric, plain

__all__ = ["DifferenceLag"]


# -- DifferenceLag --------------------------------------------------------------------------------
class DifferenceLag(Operator):
    """``x[i] - x[i - shift]`` when rows ``i`` and ``i - shift`` have the same key.

    Select the value columns and ``partition_cols``:
    ``["ts", "user"] >> DifferenceLag("user", shift=[1, -1])`` outputs
    ``ts_difference_lag_1`` and ``ts_difference_lag_-1`` (NVTabular's names; a
    negative shift looks forward). The data must be sorted by key, then time;
    the lag is computed within one dataset partition only, so a key whose rows
    are split over two partitions gets null at the boundary (as in NVTabular):
    partition the data by key first. Rows without a row ``shift`` earlier of the
    same key, with a null key, or with a null value get null. Integer columns give
    int64 (overflow raises), float columns keep their dtype.
    """

    def __init__(self, partition_cols: str | list[str], shift: int | list[int] = 1) -> None:
        # names, or nodes whose output names follow from their selection (NVTabular's
        # dependencies); the nodes join the op's input, the names are the parameter
        keys, self._key_nodes = names_and_nodes(partition_cols, "partition_cols", "DifferenceLag")
        shifts = [shift] if not isinstance(shift, (list, tuple)) else list(shift)
        if not shifts or any(isinstance(s, bool) or not isinstance(s, int) or s == 0 for s in shifts):
            raise ValueError(f"DifferenceLag: shift must be a non-zero integer or a list of them, got {shift!r}")
        self.partition_cols = keys
        self.shift = shift if isinstance(shift, int) else shifts

    def dependencies(self) -> list[Any]:
        return dependencies_of(self.partition_cols, self._key_nodes)

    @property
    def shifts(self) -> list[int]:
        return [self.shift] if isinstance(self.shift, int) else list(self.shift)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        require_selected(self.partition_cols, input_schema.column_names, "DifferenceLag", "partition_cols")
        values = [c for c in input_schema if c.name not in self.partition_cols]
        if not values:
            raise SchemaError("DifferenceLag: select the value columns besides partition_cols, "
                              f"e.g. ['timestamp', *{self.partition_cols}] >> DifferenceLag(...)")
        cols = []
        for col in values:
            if col.dtype == "bool":
                raise TypeError(f"DifferenceLag cannot subtract bool column {col.name!r}")
            check_numeric(self, col)
            dtype = col.dtype if col.dtype.startswith("float") else "int64"
            cols += [ColumnSchema(f"{col.name}_difference_lag_{s}", dtype, frozenset({Tags.CONTINUOUS}))
                     for s in self.shifts]
        return Schema(cols)

    def transform(self, table: pa.Table) -> pa.Table:
        n = table.num_rows
        keys = [plain(table.column(k)) for k in self.partition_cols]
        data = {}
        for name in table.column_names:
            if name in self.partition_cols:
                continue
            x = plain(table.column(name))
            out_type = x.type if pa.types.is_floating(x.type) else pa.int64()
            # float16 subtracted as float32 (Arrow has no half-float arithmetic), the
            # differences rounded back to float16 below
            x = x.cast(pa.float32() if x.type == pa.float16() else out_type)
            for s in self.shifts:
                out = pa.nulls(n, x.type)
                if abs(s) < n:
                    cur, prev = (slice(s, n), slice(0, n - s)) if s > 0 else (slice(0, n + s), slice(-s, n))
                    same = pa.array(np.ones(n - abs(s), dtype=bool))
                    for k in keys:
                        same = pc.and_(same, pc.fill_null(pc.equal(k[cur], k[prev]), False))
                    diff = pc.if_else(same, pc.subtract_checked(x[cur], x[prev]), pa.scalar(None, x.type))
                    pad = pa.nulls(abs(s), x.type)
                    out = pa.concat_arrays([pad, diff] if s > 0 else [diff, pad])
                data[f"{name}_difference_lag_{s}"] = out.cast(out_type) if out.type != out_type else out
        return pa.table(data)

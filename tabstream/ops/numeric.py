"""Helpers of the ops on numeric columns: type checks, plain (unchunked,
undictionaried) arrays, float64 views with nulls as NaN, finite values, missing masks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import is_list_type
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema

__all__ = ["check_numeric", "plain", "to_float64"]


# -- helpers shared with tabstream.ops.joins ----------------------------------
def check_numeric(op: Operator, col: ColumnSchema, allow_list: bool = False) -> None:
    if col.dtype == "unknown" and (allow_list or not col.is_list):
        return  # a schema without dtypes (NVTabular's Schema(["a", "b"])): the data decides at fit
    if (col.is_list and not allow_list) or not (
            col.dtype.startswith(("int", "uint", "float")) or col.dtype == "bool"):
        raise TypeError(
            f"{type(op).__name__} needs numeric columns, but column {col.name!r} is "
            f"{'a list of ' if col.is_list else ''}{col.dtype}"
        )


def plain(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """One contiguous array, dictionary-decoded."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    return column


def to_float64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Values as a float64 numpy array, nulls as NaN; integers past 2**53 rounded to
    the nearest float64, as numpy and pandas convert them (Arrow's safe cast refuses
    them)."""
    return np.asarray(pc.cast(plain(column), pa.float64(), safe=False).to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def finite_values(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    x = to_float64(column)
    return x[np.isfinite(x)]


def min_or_none(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def max_or_none(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def valid_values(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Non-missing values (list columns flattened); -0.0 folded into 0.0."""
    values = plain(column)
    if is_list_type(values.type):
        values = pc.list_flatten(values)
    if pa.types.is_floating(values.type):
        values = pc.add(values.filter(pc.invert(backend().is_missing(values))), pa.scalar(0.0, values.type))
    return values.drop_null()

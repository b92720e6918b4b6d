"""Assertions for tests of pipelines and ops (NaN-aware, list-aware).

>>> assert_tables_equal(pa.table({"x": [1.0, float("nan")]}), pa.table({"x": [1.0, float("nan")]}))
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pyarrow as pa

__all__ = ["assert_tables_equal"]


def _same(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b or math.isclose(a, b, rel_tol=rtol, abs_tol=rtol)
    return a == b


def assert_tables_equal(left: pa.Table | pd.DataFrame, right: pa.Table | pd.DataFrame,
                        check_dtype: bool = True, rtol: float = 0.0) -> None:
    """Equal column names, (optionally) types, and values; NaN equals NaN, nulls
    equal nulls, lists compare element-wise; floats within ``rtol`` when given."""
    if isinstance(left, pd.DataFrame):
        left = pa.Table.from_pandas(left, preserve_index=False)
    if isinstance(right, pd.DataFrame):
        right = pa.Table.from_pandas(right, preserve_index=False)
    assert left.column_names == right.column_names, f"columns differ: {left.column_names} != {right.column_names}"
    assert left.num_rows == right.num_rows, f"row counts differ: {left.num_rows} != {right.num_rows}"
    for name in left.column_names:
        lt, rt = left.schema.field(name).type, right.schema.field(name).type
        if check_dtype:
            assert lt == rt, f"column {name!r}: type {lt} != {rt}"
        lv, rv = left.column(name).to_pylist(), right.column(name).to_pylist()
        for i, (a, b) in enumerate(zip(lv, rv)):
            if not _same(a, b, rtol):
                raise AssertionError(f"column {name!r}, row {i}: {a!r} != {b!r}")

"""Table assertions for tests of pipelines and ops (NaN-aware, list-aware).

>>> import pyarrow as pa
>>> assert_tables_equal(pa.table({"x": [1.0, float("nan")]}), pa.table({"x": [1.0, float("nan")]}))
>>> assert_tables_equal(pa.table({"x": [1.0]}), pa.table({"x": [2.0]}))
Traceback (most recent call last):
...
AssertionError: ...
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["assert_tables_equal", "huge_pages_enabled", "map_float_values", "nan_to_null", "nasty_floats",
           "negative_zero_to_zero"]


def _same(a: Any, b: Any, rtol: float) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y, rtol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], rtol) for k in a)
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


def map_float_values(table: pa.Table, fn: Any) -> pa.Table:
    """``table`` with ``fn(array) -> array`` applied to every float column and to
    the elements of every list-of-float column (other columns unchanged)."""
    cols = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        t = column.type
        if pa.types.is_floating(t):
            column = fn(column)
        elif (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_floating(t.value_type):
            cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
            # .offsets index into .values (the whole child array) even for a slice
            column = cls.from_arrays(column.offsets, fn(column.values),
                                     mask=column.is_null() if column.null_count else None)
        cols[name] = column
    return pa.table(cols)


def nan_to_null(table: pa.Table) -> pa.Table:
    """Every NaN (in float and list-of-float columns) replaced by null.

    >>> nan_to_null(pa.table({"x": [1.0, float("nan")]}))["x"].to_pylist()
    [1.0, None]
    """
    return map_float_values(table, lambda a: pc.if_else(pc.is_nan(a), pa.scalar(None, a.type), a))


def negative_zero_to_zero(table: pa.Table) -> pa.Table:
    """Every ``-0.0`` (in float and list-of-float columns) replaced by ``0.0``."""
    # IEEE 754: -0.0 + 0.0 is +0.0, every other value is unchanged
    return map_float_values(table, lambda a: pc.add(a, pa.scalar(0.0, a.type)))


def nasty_floats(min_size: int = 0, max_size: int = 50, bound: float = 1e6, step: float | None = None) -> Any:
    """A Hypothesis strategy: lists of floats in ``[-bound, bound]`` mixed with the
    values that break ops (NaN, None for null, -0.0, 0.0, +inf, -inf), each special
    value drawn often. With ``step`` the ordinary values are multiples of it (sums
    and means stay exact enough to compare statistics with a reference at a tight
    tolerance). Needs Hypothesis (a test dependency), imported on call.

    >>> from hypothesis import given, settings
    >>> @settings(max_examples=5, deadline=None)  # no timing: a busy machine is slow
    ... @given(nasty_floats())
    ... def test_x(values):
    ...     assert len(pa.array(values, pa.float64())) == len(values)
    >>> test_x()
    """
    from hypothesis import strategies as st

    special = st.sampled_from([math.nan, None, -0.0, 0.0, math.inf, -math.inf])
    if step is None:
        ordinary = st.floats(-bound, bound, allow_nan=False, allow_infinity=False)
    else:
        n = int(bound // step)
        ordinary = st.integers(-n, n).map(lambda k: k * step)
    return st.lists(st.one_of(special, ordinary), min_size=min_size, max_size=max_size)


def huge_pages_enabled() -> int:
    """The kernel's own account of this process (``THP_enabled`` in /proc/self/status,
    Linux): 1 when it may back the process's memory with transparent huge pages, 0
    when the process has them off. For tests of :mod:`tabstream.core.pages`, which
    should not take that module's word for it."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("THP_enabled:"):
                return int(line.split()[1])
    raise AssertionError("/proc/self/status has no THP_enabled line")

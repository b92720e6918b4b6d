"""Ops on continuous (numeric) columns: FillMissing, Clip, LogOp, Normalize.

>>> import pyarrow as pa
>>> from tabstream.ops import Clip, FillMissing, LogOp
>>> t = pa.table({"I1": [3, None, -2]})
>>> FillMissing(0).transform(t)["I1"].to_pylist()
[3, 0, -2]
>>> Clip(min_value=0).transform(t)["I1"].to_pylist()
[3, None, 0]
>>> log = LogOp().transform(t)["I1"]          # log1p, float32; below -1 is NaN
>>> log.type, [round(v, 4) for v in log.to_pylist()[:1]], log.to_pylist()[1:]
(DataType(float), [1.3863], [None, nan])
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.backends import current as backend
from tabstream.core.dtypes import is_list_type
from tabstream.core.operators import ColumnOperator, Operator, StatOperator
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.numeric import plain

__all__ = ["Clip", "FillMissing", "LogOp", "Normalize"]


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def _check_numeric(op: Operator, col: ColumnSchema, allow_list: bool = False) -> None:
    if col.dtype == "unknown" and (allow_list or not col.is_list):
        return  # a schema without dtypes (NVTabular's Schema(["a", "b"])): the data decides at fit
    if (col.is_list and not allow_list) or not (col.dtype.startswith(("int", "uint", "float")) or col.dtype == "bool"):
        raise TypeError(
            f"{type(op).__name__} needs numeric columns, but column {col.name!r} is "
            f"{'a list of ' if col.is_list else ''}{col.dtype}"
        )


def _values(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A column's values: a list column's elements, flattened (NVTabular's LogOp and
    Normalize work element-wise on lists)."""
    column = plain(column)
    return backend().list_flatten(column) if is_list_type(column.type) else column


def _on_values(column: pa.ChunkedArray | pa.Array, fn: Any) -> pa.Array:
    """``fn`` applied to the values; a list column keeps its rows' lengths and its
    missing rows."""
    column = plain(column)
    if not is_list_type(column.type):
        return fn(column)
    out = fn(backend().list_flatten(column))
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    mask = column.is_null() if column.null_count else None
    if pa.types.is_fixed_size_list(column.type):
        return pa.FixedSizeListArray.from_arrays(out, column.type.list_size, mask=mask)
    return type(column).from_arrays(backend().list_offsets(column), out, mask=mask)


def _check_number(op: str, name: str, value: Any) -> None:
    """A real number (not bool, not NaN); ±inf is a number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{op}: {name} must be a number, got {value!r}")
    if math.isnan(value):
        raise ValueError(f"{op}: {name} must be a number, got NaN (NaN is a missing value, not a bound or fill)")


def _whole(value: float) -> bool:
    """True for a finite whole number (one an integer column can hold as is)."""
    return math.isfinite(value) and float(value).is_integer()


def _int_range(dtype: str) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


class FillMissing(ColumnOperator):
    """Replace nulls (and NaN in float columns) with ``fill_val``.

    Null and NaN are both missing and both filled; ±inf is a value and is kept (as
    ``pandas.Series.fillna``). An integer column keeps its dtype when ``fill_val``
    is a whole number in its range (out of range is a ``ValueError``) and becomes
    float64 for a fractional or infinite ``fill_val``. A bool column takes 1 (True) or
    0 (False); another number is a ``ValueError``. ``fill_val=NaN`` is
    refused: it would leave every missing value missing.

    With ``add_binary_cols=True`` a bool column ``<name>_filled`` marks filled rows.
    """

    def __init__(self, fill_val: float = 0, add_binary_cols: bool = False) -> None:
        _check_number("FillMissing", "fill_val", fill_val)
        self.fill_val = fill_val.item() if isinstance(fill_val, np.generic) else fill_val
        self.add_binary_cols = bool(add_binary_cols)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        cols = []
        for col in input_schema:
            _check_numeric(self, col)
            dtype = col.dtype
            if dtype.startswith(("int", "uint")):
                if not _whole(self.fill_val):
                    dtype = "float64"  # a fractional (or infinite) fill value cannot live in an int column
                elif not _int_range(dtype)[0] <= self.fill_val <= _int_range(dtype)[1]:
                    lo, hi = _int_range(dtype)
                    raise ValueError(
                        f"FillMissing: fill_val {self.fill_val} does not fit column {col.name!r} of "
                        f"dtype {dtype} (range {lo}..{hi}); pick a value in range or cast the column "
                        "to a wider dtype first")
            elif dtype == "bool" and self.fill_val not in (0, 1):
                # a cast to bool would make any other number True, silently
                raise ValueError(
                    f"FillMissing: fill_val {self.fill_val!r} does not fit the bool column {col.name!r}; "
                    "give 1 (True) or 0 (False), or cast the column to a number first")
            cols.append(col.with_dtype(dtype))
            if self.add_binary_cols:
                cols.append(ColumnSchema(f"{col.name}_filled", "bool"))
        return Schema(cols)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
        out_type = column.type
        if pa.types.is_integer(out_type) and not _whole(self.fill_val):
            out_type = pa.float64()
        return backend().fill_missing(column.cast(out_type), self.fill_val)

    def transform(self, table: pa.Table) -> pa.Table:
        data: dict[str, Any] = {}
        for name in table.column_names:
            column = table.column(name)
            data[name] = self.transform_column(name, column)
            if self.add_binary_cols:
                data[f"{name}_filled"] = backend().is_missing(column)
        return pa.table(data)


class Clip(ColumnOperator):
    """Limit values to ``[min_value, max_value]``; nulls and NaN stay as they are.

    As ``pandas.Series.clip``: ±inf is a value and is bounded like any other, -0.0
    is 0.0. Integer columns keep their dtype when the bounds are whole numbers; a
    bound no value of the dtype can cross (``max_value=inf``, ``min_value=-1`` on
    uint8) changes nothing, a fractional bound makes the column float64, and a bound
    every value would be set to but the dtype cannot hold is a ``ValueError``. NaN
    bounds are refused (NaN is a missing value, not a limit); bool columns too.
    """

    def __init__(self, min_value: float | None = None, max_value: float | None = None) -> None:
        if min_value is None and max_value is None:
            raise ValueError("Clip needs min_value, max_value or both")
        for name, value in (("min_value", min_value), ("max_value", max_value)):
            if value is not None:
                _check_number("Clip", name, value)
        if min_value is not None and max_value is not None and min_value > max_value:
            raise ValueError(f"Clip: min_value {min_value} is greater than max_value {max_value}")
        self.min_value = min_value.item() if isinstance(min_value, np.generic) else min_value
        self.max_value = max_value.item() if isinstance(max_value, np.generic) else max_value

    def _int_bounds(self, name: str, dtype: str) -> tuple[int | None, int | None] | None:
        """The bounds to apply to an integer column as ints (a bound no value of the
        dtype can cross is dropped), or None when the result needs float64."""
        lo, hi = _int_range(dtype)
        bounds: list[int | None] = []
        for value, never_applies in ((self.min_value, lambda v: v <= lo), (self.max_value, lambda v: v >= hi)):
            if value is None or never_applies(value):
                bounds.append(None)  # also min_value=-inf, max_value=+inf
            elif not _whole(value):
                return None  # a fractional (or infinite) bound that applies: float64
            elif not lo <= value <= hi:
                raise ValueError(
                    f"Clip: every value of column {name!r} ({dtype}, range {lo}..{hi}) would become "
                    f"{value}, which {dtype} cannot hold; cast the column to a wider dtype first")
            else:
                bounds.append(int(value))
        return bounds[0], bounds[1]

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        cols = []
        for col in input_schema:
            _check_numeric(self, col)
            if col.dtype == "bool":
                raise TypeError(f"Clip needs integer or float columns, but column {col.name!r} is bool")
            if col.dtype.startswith(("int", "uint")) and self._int_bounds(col.name, col.dtype) is None:
                col = col.with_dtype("float64")
            cols.append(col)
        return Schema(cols)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
        lo, hi = self.min_value, self.max_value
        if pa.types.is_integer(column.type):
            bounds = self._int_bounds(name, np.dtype(column.type.to_pandas_dtype()).name)
            if bounds is None:
                column = column.cast(pa.float64(), safe=False)  # past 2**53: rounded, as numpy
            else:
                lo, hi = bounds
        return backend().clip(column, lo, hi)


class LogOp(ColumnOperator):
    """``log(1 + x)`` as float32 (NVTabular's LogOp).

    Values below -1 give NaN and -1 gives -inf, as ``numpy.log1p`` does; clip counts
    first (``Clip(min_value=0) >> LogOp()``) when they can be negative. Nulls stay null.
    A list column is transformed element by element (``[[0, 1], []]`` gives
    ``[[0.0, 0.693], []]``).
    """

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        _check_numeric(self, col, allow_list=True)
        return col.with_dtype("float32").with_tags(Tags.CONTINUOUS)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
        return _on_values(column, backend().log1p)


class Normalize(StatOperator):
    """Standardize to zero mean and unit standard deviation (sample std, ddof=1).

    Statistics use finite values only (nulls, NaN and ±inf are left out); the
    output is float32. A column with std 0 (or fewer than 2 values) is only
    centred. Nulls stay null. A list column's statistics are over all its elements,
    and each element is standardized (as NVTabular's).
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"means": dict[str, float], "stds": dict[str, float]}
    state_values = {"means": ("finite",), "stds": ("finite", "non-negative")}

    def __init__(self) -> None:
        super().__init__()
        self.means: dict[str, float] = {}
        self.stds: dict[str, float] = {}

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        _check_numeric(self, col, allow_list=True)
        return col.with_dtype("float32").with_tags(Tags.CONTINUOUS)

    def fit_partition(self, table: pa.Table) -> dict[str, tuple[int, float, float]]:
        kernels = backend()
        return {name: kernels.moments(_values(table.column(name))) for name in table.column_names}

    def combine(self, partials: Sequence[dict[str, tuple[int, float, float]]]) -> dict[str, tuple[int, float, float]]:
        # Chan et al.'s pairwise update: exact and stable for any partitioning.
        out: dict[str, tuple[int, float, float]] = {}
        for part in partials:
            for name, (n_b, mean_b, m2_b) in part.items():
                if name not in out:
                    out[name] = (n_b, mean_b, m2_b)
                    continue
                n_a, mean_a, m2_a = out[name]
                n = n_a + n_b
                if n == 0:
                    continue
                delta = mean_b - mean_a
                mean = mean_a + delta * n_b / n
                m2 = m2_a + m2_b + delta * delta * n_a * n_b / n
                out[name] = (n, mean, m2)
        return out

    def finalize(self, partial: dict[str, tuple[int, float, float]]) -> None:
        self.means = {k: float(v[1]) for k, v in partial.items()}
        self.stds = {k: float(np.sqrt(v[2] / (v[0] - 1))) if v[0] > 1 else 0.0 for k, v in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        kernels = backend()
        return pa.table({name: _on_values(table.column(name), lambda values, name=name: kernels.standardize(
            values, self.means[name], self.stds[name])) for name in table.column_names})

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"means": self.means, "stds": self.stds}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.means = {k: float(v) for k, v in values["means"].items()}
        self.stds = {k: float(v) for k, v in values["stds"].items()}
        self.fitted = True

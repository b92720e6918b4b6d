"""Statistics ops on whole columns: NormalizeMinMax and FillMedian here; Bucketize,
DropLowCardinality, ReduceDtypeSize and DataStats have a module each
(:mod:`~tabstream.ops.bucketize`, :mod:`~tabstream.ops.cardinality`,
:mod:`~tabstream.ops.reduce_dtype`, :mod:`~tabstream.ops.datastats`) and still import
from here.

>>> import pyarrow as pa
>>> from tabstream.ops import Bucketize, FillMedian, NormalizeMinMax
>>> t = pa.table({"x": [1.0, None, 3.0, float("nan"), 5.0]})
>>> NormalizeMinMax().fit_table(t).transform(t)["x"].to_pylist()   # float32
[0.0, None, 0.5, nan, 1.0]
>>> FillMedian().fit_table(t).transform(t)["x"].to_pylist()
[1.0, 3.0, 3.0, 3.0, 5.0]
>>> Bucketize([2, 4]).transform(t)["x"].to_pylist()                # int64
[0, None, 1, None, 2]

Missing values are nulls and, in float columns, NaN. Statistics of continuous
columns use finite values only (±inf is left out of min/max/median/mean).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.backends import current as backend
from tabstream.core.operators import StatOperator
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.bucketize import Bucketize
from tabstream.ops.cardinality import DropLowCardinality
from tabstream.ops.datastats import DataStats
from tabstream.ops.numeric import check_numeric, finite_values, plain, to_float64
from tabstream.ops.reduce_dtype import ReduceDtypeSize

__all__ = ["Bucketize", "DataStats", "DropLowCardinality", "FillMedian", "NormalizeMinMax",
           "ReduceDtypeSize", "check_numeric", "plain", "to_float64"]


class NormalizeMinMax(StatOperator):
    """``(x - min) / (max - min)`` as float32, with min/max over finite values.

    A constant column (``max == min``) becomes ``x - min``, i.e. 0 for the fitted
    value; a column without any finite value at fit passes through (min 0, range 1).
    Nulls stay null, NaN stays NaN, ±inf becomes ±inf.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"mins": dict[str, float], "maxs": dict[str, float]}

    def __init__(self) -> None:
        super().__init__()
        self.mins: dict[str, float] = {}
        self.maxs: dict[str, float] = {}

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        check_numeric(self, col)
        return col.with_dtype("float32").with_tags(Tags.CONTINUOUS)

    def fit_partition(self, table: pa.Table) -> dict[str, tuple[float, float] | None]:
        out: dict[str, tuple[float, float] | None] = {}
        for name in table.column_names:
            x = finite_values(table.column(name))
            out[name] = (float(x.min()), float(x.max())) if len(x) else None
        return out

    def combine(self, partials: Sequence[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for part in partials:
            for name, mm in part.items():
                prev = out.get(name)
                if prev is not None and mm is not None:
                    mm = (min(prev[0], mm[0]), max(prev[1], mm[1]))
                out[name] = mm if mm is not None else prev
        return out

    def finalize(self, partial: dict[str, Any]) -> None:
        self.mins = {k: v[0] if v else 0.0 for k, v in partial.items()}
        self.maxs = {k: v[1] if v else 0.0 for k, v in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        kernels = backend()
        data = {}
        for name in table.column_names:
            span = self.maxs[name] - self.mins[name]  # 0: only shifted (every value is the min)
            data[name] = kernels.standardize(plain(table.column(name)), self.mins[name], max(span, 0.0))
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"mins": self.mins, "maxs": self.maxs}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.mins = {k: float(v) for k, v in values["mins"].items()}
        self.maxs = {k: float(v) for k, v in values["maxs"].items()}
        self.fitted = True


def _merge_value_counts(parts: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    values = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    uniq, inverse = np.unique(values, return_inverse=True)
    return uniq, np.bincount(inverse, weights=counts, minlength=len(uniq)).astype(np.int64)


def _median(values: np.ndarray, counts: np.ndarray) -> float | None:
    """Median of the multiset ``values`` (sorted) repeated ``counts`` times."""
    n = int(counts.sum())
    if n == 0:
        return None
    cum = np.cumsum(counts)
    lo = values[np.searchsorted(cum, (n - 1) // 2, side="right")]
    hi = values[np.searchsorted(cum, n // 2, side="right")]
    return float((lo + hi) / 2)  # as numpy.median: the mean of the two middle values


class FillMedian(StatOperator):
    """Replace nulls (and NaN) with the column's median.

    The median is **exact**: each partition contributes its sorted distinct finite
    values with their counts, partials are merged by value, and the median (the
    mean of the two middle values for an even count, as ``numpy.median``) is read
    off the merged counts. Memory is therefore bounded by the number of distinct
    finite values of a column, not by its length; ±inf is left out. Integer and
    bool columns become float64 (a median can fall between two integers); float
    columns keep their dtype. A column without any finite value at fit has no
    median: its missing values stay missing.

    With ``add_binary_cols=True`` a bool column ``<name>_filled`` marks filled rows.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"medians": dict[str, float | None]}

    def __init__(self, add_binary_cols: bool = False) -> None:
        super().__init__()
        if not isinstance(add_binary_cols, bool):
            raise TypeError(f"FillMedian: add_binary_cols must be True or False, got {add_binary_cols!r}")
        self.add_binary_cols = add_binary_cols
        self.medians: dict[str, float | None] = {}

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        cols = []
        for col in input_schema:
            check_numeric(self, col)
            cols.append(col if col.dtype.startswith("float") else col.with_dtype("float64"))
            if self.add_binary_cols:
                cols.append(ColumnSchema(f"{col.name}_filled", "bool"))
        return Schema(cols)

    def fit_partition(self, table: pa.Table) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        out = {}
        for name in table.column_names:
            # + 0.0 folds -0.0 into 0.0: one value, counted once, never a -0.0 median
            values, counts = np.unique(finite_values(table.column(name)) + 0.0, return_counts=True)
            out[name] = (values, counts.astype(np.int64))
        return out

    def combine(self, partials: Sequence[dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict[str, Any]:
        return {name: _merge_value_counts([p[name] for p in partials]) for name in partials[0]}

    def finalize(self, partial: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.medians = {name: _median(*vc) for name, vc in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        kernels = backend()
        data: dict[str, Any] = {}
        for name in table.column_names:
            column = plain(table.column(name))
            out_type = column.type if pa.types.is_floating(column.type) else pa.float64()
            missing = kernels.is_missing(column)
            median = self.medians[name]
            # integers past 2**53 are rounded to the nearest float64, as numpy does
            column = column.cast(out_type, safe=False)
            data[name] = column if median is None else kernels.fill_missing(column, median)
            if self.add_binary_cols:
                data[f"{name}_filled"] = missing if median is not None else pa.array(
                    np.zeros(len(column), dtype=bool))
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"medians": self.medians}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.medians = {k: None if v is None else float(v) for k, v in values["medians"].items()}
        self.fitted = True



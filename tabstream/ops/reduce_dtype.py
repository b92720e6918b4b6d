"""ReduceDtypeSize: the narrowest integer or float dtype that holds every value seen
in fit (never narrowing a value it would change).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type, is_list_type
from tabstream.core.errors import DataError
from tabstream.core.operators import StatOperator
from tabstream.core.schema import ColumnSchema
from tabstream.ops.numeric import max_or_none, min_or_none, plain

__all__ = ["ReduceDtypeSize"]


_INT_DTYPES = ("int8", "int16", "int32", "int64")


class ReduceDtypeSize(StatOperator):
    """Cast integer columns to the smallest signed dtype holding their fitted
    [min, max] (int8 ... int64; int8 when all null) when that is narrower than
    their dtype (a column is never widened: uint8 stays uint8, uint64 above the
    int64 range stays uint64), and float columns to ``float_dtype``; list columns likewise by element type;
    other columns pass unchanged. Before fit, integer columns keep their dtype in
    the declared schema. A transformed value outside the fitted range raises
    :class:`~tabstream.core.errors.DataError` instead of wrapping around, and so does a
    finite float64 beyond float32's range (it would become inf). NaN, null, ±inf
    and -0.0 are kept as they are.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"ranges": dict[str, list[int | None]]}

    def __init__(self, float_dtype: str = "float32") -> None:
        super().__init__()
        if float_dtype not in ("float32", "float64"):
            raise ValueError(f"ReduceDtypeSize: float_dtype must be 'float32' or 'float64', got {float_dtype!r}")
        self.float_dtype = float_dtype
        self.ranges: dict[str, list[int | None]] = {}

    def _dtype(self, col: ColumnSchema) -> str:
        if col.dtype.startswith("float"):
            return self.float_dtype
        if col.dtype.startswith(("int", "uint")) and col.name in self.ranges:
            lo, hi = self.ranges[col.name]
            if lo is None or hi is None:
                return "int8"
            for name in _INT_DTYPES:
                info = np.iinfo(name)
                if info.min <= lo and hi <= info.max:
                    # never widen: uint8 holding 0..200 stays uint8 rather than int16
                    return name if np.dtype(name).itemsize < np.dtype(col.dtype).itemsize else col.dtype
            return col.dtype
        return col.dtype

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        return col.with_dtype(self._dtype(col))

    def fit_partition(self, table: pa.Table) -> dict[str, list[int | None]]:
        out = {}
        for name in table.column_names:
            values = plain(table.column(name))
            element = values.type.value_type if is_list_type(values.type) else values.type
            if pa.types.is_integer(element):
                out[name] = list(backend().min_max(values))
        return out

    def combine(self, partials: Sequence[dict[str, list[int | None]]]) -> dict[str, list[int | None]]:
        out: dict[str, list[int | None]] = {}
        for part in partials:
            for name, (lo, hi) in part.items():
                plo, phi = out.get(name, [None, None])
                out[name] = [min_or_none(plo, lo), max_or_none(phi, hi)]
        return out

    def finalize(self, partial: dict[str, list[int | None]]) -> None:
        self.ranges = partial
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        data = {}
        for name in table.column_names:
            column = plain(table.column(name))
            dtype, is_list = arrow_type_to_dtype(column.type)
            target = dtype_to_arrow_type(self._dtype(ColumnSchema(name, dtype, is_list=is_list)))
            if is_list:
                target = pa.list_(target)
            try:
                data[name] = backend().cast(column, target)
            except pa.ArrowInvalid as exc:
                raise DataError(
                    f"ReduceDtypeSize: column {name!r} holds values outside the range fitted "
                    f"{self.ranges.get(name)} and cannot be cast to {target}; refit on data "
                    "that covers them"
                ) from exc
            if dtype == "float64" and self.float_dtype == "float32":
                _check_no_overflow(name, column, data[name])
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"ranges": self.ranges}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.ranges = {k: list(v) for k, v in values["ranges"].items()}
        self.fitted = True


def _check_no_overflow(name: str, before: pa.Array, after: pa.Array) -> None:
    """Refuse a float64 -> float32 cast that turned finite values into ±inf."""
    if is_list_type(before.type):
        before, after = pc.list_flatten(before), pc.list_flatten(after)
    overflow = pc.and_(pc.is_inf(after), pc.invert(pc.is_inf(before)))
    if pc.any(overflow).as_py():
        value = before.filter(overflow)[0].as_py()
        limit = float(np.finfo(np.float32).max)
        raise DataError(
            f"ReduceDtypeSize: column {name!r} holds {value!r}, beyond float32's range "
            f"(±{limit:.4g}), which would become inf; pass float_dtype='float64' or clip "
            "the column first")

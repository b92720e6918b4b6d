"""Statistics ops on whole columns: NormalizeMinMax, FillMedian, Bucketize,
DropLowCardinality, ReduceDtypeSize, DataStats.

>>> t = pa.table({"x": [1.0, None, 3.0, float("nan"), 5.0]})
>>> NormalizeMinMax().fit_table(t).transform(t)["x"]     # [0, null, 0.5, nan, 1]  (float32)
>>> FillMedian().fit_table(t).transform(t)["x"]          # [1, 3, 3, 3, 5]
>>> Bucketize([2, 4]).transform(t)["x"]                  # [0, null, 1, null, 2]  (int64)

Missing values are nulls and, in float columns, NaN. Statistics of continuous
columns use finite values only (±inf is left out of min/max/median/mean).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type, is_list_type
from tabstream.core.errors import DataError
from tabstream.core.hashing import murmur3_32
from tabstream.core.operators import Operator, StatOperator
from tabstream.core.schema import ColumnSchema, Schema, Tags, infer_embedding_dim

__all__ = ["Bucketize", "DataStats", "DropLowCardinality", "FillMedian", "NormalizeMinMax",
           "ReduceDtypeSize"]


# -- helpers shared with tabstream.ops.joins ----------------------------------
def check_numeric(op: Operator, col: ColumnSchema, allow_list: bool = False) -> None:
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
    """Values as a float64 numpy array, nulls as NaN."""
    return np.asarray(pc.cast(plain(column), pa.float64()).to_numpy(zero_copy_only=False),
                      dtype=np.float64)


def _finite(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    x = to_float64(column)
    return x[np.isfinite(x)]


def _lo(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else min(a, b)


def _hi(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)


def _missing(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """True where a value is null or NaN (never null itself)."""
    column = plain(column)
    missing = pc.is_null(column)
    if pa.types.is_floating(column.type):
        missing = pc.or_(missing, pc.fill_null(pc.is_nan(column), False))
    return missing


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
            x = _finite(table.column(name))
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
        data = {}
        for name in table.column_names:
            span = self.maxs[name] - self.mins[name]
            x = pc.subtract(plain(table.column(name)).cast(pa.float64()), self.mins[name])
            data[name] = pc.divide(x, span if span > 0 else 1.0).cast(pa.float32())
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
            values, counts = np.unique(_finite(table.column(name)) + 0.0, return_counts=True)
            out[name] = (values, counts.astype(np.int64))
        return out

    def combine(self, partials: Sequence[dict[str, tuple[np.ndarray, np.ndarray]]]) -> dict[str, Any]:
        return {name: _merge_value_counts([p[name] for p in partials]) for name in partials[0]}

    def finalize(self, partial: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        self.medians = {name: _median(*vc) for name, vc in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        data: dict[str, Any] = {}
        for name in table.column_names:
            column = plain(table.column(name))
            out_type = column.type if pa.types.is_floating(column.type) else pa.float64()
            missing = _missing(column)
            median = self.medians[name]
            if median is None:
                data[name] = column.cast(out_type)
            else:
                data[name] = pc.if_else(missing, pa.scalar(median, out_type), column.cast(out_type))
            if self.add_binary_cols:
                data[f"{name}_filled"] = missing if median is not None else pa.array(
                    np.zeros(len(column), dtype=bool))
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"medians": self.medians}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.medians = {k: None if v is None else float(v) for k, v in values["medians"].items()}
        self.fitted = True


def _check_boundaries(b: Any, where: str) -> list[float]:
    if not isinstance(b, (list, tuple)) or not b:
        raise TypeError(f"Bucketize: boundaries{where} must be a non-empty list of numbers, got {b!r}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
           or not math.isfinite(v) for v in b):
        raise ValueError(f"Bucketize: boundaries{where} must be finite numbers, got {list(b)!r}")
    if any(lo >= hi for lo, hi in zip(b, b[1:])):
        raise ValueError(f"Bucketize: boundaries{where} must be strictly increasing, got {list(b)!r}")
    return [v.item() if hasattr(v, "item") else v for v in b]


class Bucketize(Operator):
    """Bucket index of each value: the number of boundaries ``<= x``.

    With boundaries ``[b0, b1, ..., bk-1]`` bucket ``0`` is ``x < b0``, bucket ``i``
    is ``b(i-1) <= x < bi`` and bucket ``k`` is ``x >= b(k-1)`` — NVTabular's
    convention, the same as ``numpy.digitize(x, boundaries, right=False)``. The
    output is int64 and tagged categorical with ``k + 1`` ids; -inf goes to bucket
    0, +inf to bucket ``k``; nulls and NaN become null (chain ``FillMissing`` first
    to bucket them). ``boundaries`` is one list for every column or a dict per column.

    >>> Bucketize([0, 10]).transform(pa.table({"x": [-5, 0, 9, 10, None]}))["x"]
    [0, 1, 1, 2, null]
    """

    def __init__(self, boundaries: list[float] | dict[str, list[float]]) -> None:
        if isinstance(boundaries, dict):
            boundaries = {str(k): _check_boundaries(v, f" of column {k!r}") for k, v in boundaries.items()}
        else:
            boundaries = _check_boundaries(boundaries, "")
        self.boundaries = boundaries

    def _for(self, name: str) -> list[float]:
        if isinstance(self.boundaries, dict):
            if name not in self.boundaries:
                raise KeyError(f"Bucketize: no boundaries given for column {name!r}; "
                               f"boundaries has {sorted(self.boundaries)}")
            return self.boundaries[name]
        return self.boundaries

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        check_numeric(self, col)
        n = len(self._for(col.name)) + 1
        props = {**col.properties, "boundaries": self._for(col.name),
                 "domain": {"min": 0, "max": n - 1, "name": col.name},
                 "embedding_sizes": {"cardinality": n, "dimension": infer_embedding_dim(n)}}
        out = col.with_dtype("int64").with_tags(Tags.CATEGORICAL).without_tags(Tags.CONTINUOUS)
        return ColumnSchema(out.name, "int64", out.tags, props)

    def transform(self, table: pa.Table) -> pa.Table:
        data = {}
        for name in table.column_names:
            x = to_float64(table.column(name))
            ids = np.searchsorted(np.asarray(self._for(name), dtype=np.float64), x, side="right")
            data[name] = pa.array(ids.astype(np.int64), mask=np.isnan(x))
        return pa.table(data)


def _valid_values(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Non-missing values (list columns flattened); -0.0 folded into 0.0."""
    values = plain(column)
    if is_list_type(values.type):
        values = pc.list_flatten(values)
    if pa.types.is_floating(values.type):
        values = pc.add(values.filter(pc.invert(_missing(values))), pa.scalar(0.0, values.type))
    return values.drop_null()


# Categorify's reserved ids (padding, missing, out-of-vocabulary): a column with k
# distinct values gets ids up to k + _RESERVED_IDS - 1.
_RESERVED_IDS = 3


def _largest_id(col: ColumnSchema) -> int | None:
    """Largest id of a categorical column by its schema (``domain.max``, else
    ``embedding_sizes.cardinality - 1``); None when the schema has neither."""
    domain = col.properties.get("domain")
    if isinstance(domain, dict) and domain.get("max") is not None:
        return int(domain["max"])
    sizes = col.properties.get("embedding_sizes")
    if isinstance(sizes, dict) and sizes.get("cardinality") is not None:
        return int(sizes["cardinality"]) - 1
    return None


class DropLowCardinality(StatOperator):
    """Drop categorical columns with too few ids: NVTabular's rule.

    A column tagged categorical (and not target) is dropped when its largest id in
    the schema (``domain.max``, as Categorify and Bucketize set it, else
    ``embedding_sizes.cardinality - 1``) is at most ``min_cardinality``; every
    other column (continuous, untagged, target) is kept. With Categorify's three
    reserved ids (0 padding, 1 missing, 2 out-of-vocabulary) the default
    ``min_cardinality=4`` drops columns of at most two distinct values::

        schema: cat domain.max=4 (2 values), cat2 domain.max=9, label (target), price
        ["cat", "cat2", "label", "price"] >> DropLowCardinality()   # cat2, label, price

    A categorical column without a domain (not encoded yet) is judged as Categorify
    would encode it: fit counts its distinct non-missing values ``k`` (null and NaN
    are missing, ``-0.0`` is ``0.0``, list columns count their elements) and the
    column is dropped when ``k + 2 <= min_cardinality``. Each partial keeps at most
    ``min_cardinality`` values per such column, so memory stays tiny. Before fit
    those columns are listed in the output schema; ``dropped`` names the columns
    the op removes.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"distinct": dict[str, int]}

    def __init__(self, min_cardinality: int = 4) -> None:
        super().__init__()
        if isinstance(min_cardinality, bool) or not isinstance(min_cardinality, (int, np.integer)):
            raise TypeError(f"DropLowCardinality: min_cardinality must be an integer, "
                            f"got {min_cardinality!r}")
        if min_cardinality < 1:
            raise ValueError(f"DropLowCardinality: min_cardinality must be an integer >= 1, "
                             f"got {min_cardinality!r}")
        self.min_cardinality = int(min_cardinality)
        #: distinct non-missing values (at most min_cardinality) of each categorical
        #: column without a domain in the schema, counted at fit
        self.distinct: dict[str, int] = {}
        self._schema: Schema | None = None

    def _verdict(self, col: ColumnSchema) -> str:
        """'keep', 'drop', 'count' (categorical without a domain: fit counts its
        values) or 'later' (output of a Categorify not fitted yet: its domain comes)."""
        if Tags.CATEGORICAL not in col.tags or Tags.TARGET in col.tags:
            return "keep"
        largest = _largest_id(col)
        if largest is None:
            return "later" if "start_index" in col.properties else "count"
        return "drop" if largest <= self.min_cardinality else "keep"

    def _dropped(self, schema: Schema) -> list[str]:
        from tabstream.core.errors import SchemaError

        out = []
        for col in schema:
            verdict = self._verdict(col)
            if verdict in ("count", "later") and self.fitted:
                if col.name not in self.distinct:
                    raise SchemaError(
                        f"DropLowCardinality: categorical column {col.name!r} has no domain in "
                        "the schema and its values were not counted at fit; fit the workflow "
                        "again (Workflow.fit) with this input")
                largest = self.distinct[col.name] + _RESERVED_IDS - 1
                verdict = "drop" if largest <= self.min_cardinality else "keep"
            if verdict == "drop":
                out.append(col.name)
        return out

    @property
    def dropped(self) -> list[str]:
        """Columns removed, for the input schema last seen (none before one is known)."""
        return [] if self._schema is None else self._dropped(self._schema)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        # transform sees only a table: remember the schema its decisions rest on
        self._schema = input_schema
        return input_schema.without(self._dropped(input_schema))

    def _to_count(self, names: Sequence[str]) -> list[str]:
        schema = self._schema
        if schema is None:
            return []
        return [n for n in names if n in schema and self._verdict(schema[n]) == "count"]

    def _smallest(self, values: pa.Array) -> pa.Array:
        uniq = pc.unique(values)
        return uniq.take(pc.sort_indices(uniq)[: self.min_cardinality])

    def fit_partition(self, table: pa.Table) -> dict[str, pa.Array]:
        return {name: self._smallest(_valid_values(table.column(name)))
                for name in self._to_count(table.column_names)}

    def combine(self, partials: Sequence[dict[str, pa.Array]]) -> dict[str, pa.Array]:
        return {name: self._smallest(pa.concat_arrays([p[name] for p in partials]))
                for name in partials[0]}

    def finalize(self, partial: dict[str, pa.Array]) -> None:
        self.distinct = {name: len(values) for name, values in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        return table.drop_columns([c for c in self.dropped if c in table.column_names])

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"distinct": dict(self.distinct)}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.distinct = {str(k): int(v) for k, v in values["distinct"].items()}
        self.fitted = True


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
            values = pc.list_flatten(values) if is_list_type(values.type) else values
            if pa.types.is_integer(values.type):
                mm = pc.min_max(values)
                out[name] = [mm["min"].as_py(), mm["max"].as_py()]
        return out

    def combine(self, partials: Sequence[dict[str, list[int | None]]]) -> dict[str, list[int | None]]:
        out: dict[str, list[int | None]] = {}
        for part in partials:
            for name, (lo, hi) in part.items():
                plo, phi = out.get(name, [None, None])
                out[name] = [_lo(plo, lo), _hi(phi, hi)]
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
                data[name] = column.cast(target)
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


# -- DataStats ------------------------------------------------------------------
_HLL_P = 14                 # 2**14 registers: standard error 1.04 / sqrt(2**14) = 0.81%
_HLL_M = 1 << _HLL_P


def _hll_registers(values: pa.Array) -> np.ndarray:
    """HyperLogLog registers of ``values`` (murmur3_32 hashes, p = 14)."""
    regs = np.zeros(_HLL_M, dtype=np.uint8)
    if len(values):
        h = murmur3_32(values).astype(np.uint64)
        rest = h & ((1 << (32 - _HLL_P)) - 1)
        rho = (32 - _HLL_P) - np.frexp(rest.astype(np.float64))[1] + 1  # leading zeros + 1
        np.maximum.at(regs, (h >> (32 - _HLL_P)).astype(np.int64), rho.astype(np.uint8))
    return regs


def _hll_estimate(regs: np.ndarray) -> int:
    alpha = 0.7213 / (1 + 1.079 / _HLL_M)
    est = alpha * _HLL_M * _HLL_M / float(np.sum(np.ldexp(1.0, -regs.astype(np.int64))))
    zeros = int(np.count_nonzero(regs == 0))
    if est <= 2.5 * _HLL_M and zeros:
        est = _HLL_M * math.log(_HLL_M / zeros)          # linear counting for small sets
    elif est > 2**32 / 30:
        est = -(2**32) * math.log(1 - est / 2**32)       # 32-bit hash range correction
    return int(round(est))


def _py(value: pa.Scalar) -> Any:
    v = value.as_py()
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


class DataStats(StatOperator):
    """Describe every column; the data passes through unchanged.

    After fit, ``stats[column]`` holds (all JSON values, saved with the workflow):

    * ``dtype``, ``is_list``; ``count`` (rows neither null nor NaN) and ``null_count``;
    * ``list_length_min`` / ``list_length_max`` for list columns (non-null rows);
    * ``min`` / ``max`` of numeric, bool and string values (list elements for
      lists; NaN left out, ±inf included); ``mean`` / ``std`` (sample, ddof=1) and
      ``inf_count`` of numeric values, mean/std over finite values only;
    * ``distinct``: the number of distinct non-missing values. It is exact
      (``distinct_exact: true``) up to ``max_exact_distinct`` values; above that
      it is a HyperLogLog estimate (2**14 registers, MurmurHash3: relative standard
      error 0.81%, so within ±2.5% with 99.7% probability) with bounded memory.
      Either way it is the same on 1 or N partitions.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"stats": dict[str, dict[str, Any]]}

    def __init__(self, max_exact_distinct: int = 10_000) -> None:
        super().__init__()
        if isinstance(max_exact_distinct, bool) or not isinstance(max_exact_distinct, (int, np.integer)) \
                or max_exact_distinct < 0:
            raise ValueError(f"DataStats: max_exact_distinct must be an integer >= 0, got {max_exact_distinct!r}")
        self.max_exact_distinct = int(max_exact_distinct)
        self.stats: dict[str, dict[str, Any]] = {}

    def _sketch(self, distinct: pa.Array) -> tuple[str, Any]:
        if len(distinct) <= self.max_exact_distinct:
            return "exact", distinct
        return "hll", _hll_registers(distinct)

    def fit_partition(self, table: pa.Table) -> dict[str, dict[str, Any]]:
        return {name: self._describe(plain(table.column(name))) for name in table.column_names}

    def _describe(self, column: pa.Array) -> dict[str, Any]:
        dtype = column.type.value_type if is_list_type(column.type) else column.type
        p: dict[str, Any] = {"rows": len(column), "dtype": arrow_type_to_dtype(column.type)[0],
                             "is_list": is_list_type(column.type),
                             "missing": int(pc.sum(_missing(column)).as_py() or 0) if len(column) else 0}
        if p["is_list"]:
            mm = pc.min_max(pc.list_value_length(column))
            p["len"] = (_py(mm["min"]), _py(mm["max"]))
        values = _valid_values(column)
        if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype) \
                or pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
            mm = pc.min_max(values)
            p["minmax"] = (_py(mm["min"]), _py(mm["max"]))
        if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_boolean(dtype):
            x = to_float64(values)
            finite = x[np.isfinite(x)]
            mean = float(finite.mean()) if len(finite) else 0.0
            p["moments"] = (len(finite), mean, float(((finite - mean) ** 2).sum()))
            p["inf"] = int(len(x) - len(finite))
        p["distinct"] = self._sketch(pc.unique(values))
        return p

    def combine(self, partials: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        return {name: self._merge([p[name] for p in partials]) for name in partials[0]}

    def _merge(self, parts: list[dict[str, Any]]) -> dict[str, Any]:
        out = {"rows": sum(p["rows"] for p in parts), "dtype": parts[0]["dtype"],
               "is_list": parts[0]["is_list"], "missing": sum(p["missing"] for p in parts)}
        for key in ("len", "minmax"):
            if key in parts[0]:
                lo, hi = None, None
                for p in parts:
                    lo, hi = _lo(lo, p[key][0]), _hi(hi, p[key][1])
                out[key] = (lo, hi)
        if "moments" in parts[0]:
            n, mean, m2 = 0, 0.0, 0.0
            for nb, mb, m2b in (p["moments"] for p in parts):  # Chan et al.'s pairwise update
                if nb:
                    total = n + nb
                    delta = mb - mean
                    mean, m2, n = mean + delta * nb / total, m2 + m2b + delta * delta * n * nb / total, total
            out["moments"] = (n, mean, m2)
            out["inf"] = sum(p["inf"] for p in parts)
        sketches = [p["distinct"] for p in parts]
        if all(kind == "exact" for kind, _ in sketches):
            out["distinct"] = self._sketch(pc.unique(pa.concat_arrays([v for _, v in sketches])))
        else:
            regs = [v if kind == "hll" else _hll_registers(v) for kind, v in sketches]
            out["distinct"] = ("hll", np.maximum.reduce(regs))
        return out

    def finalize(self, partial: dict[str, dict[str, Any]]) -> None:
        stats = {}
        for name, p in partial.items():
            s: dict[str, Any] = {"dtype": p["dtype"], "is_list": p["is_list"], "count": p["rows"] - p["missing"],
                                 "null_count": p["missing"]}
            if "len" in p:
                s["list_length_min"], s["list_length_max"] = p["len"]
            if "minmax" in p:
                s["min"], s["max"] = p["minmax"]
            if "moments" in p:
                n, mean, m2 = p["moments"]
                s["mean"] = mean if n else None
                s["std"] = math.sqrt(m2 / (n - 1)) if n > 1 else None
                s["inf_count"] = p["inf"]
            kind, value = p["distinct"]
            s["distinct"] = len(value) if kind == "exact" else _hll_estimate(value)
            s["distinct_exact"] = kind == "exact"
            stats[name] = s
        self.stats = stats
        self.fitted = True

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        return input_schema

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        return table

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"stats": self.stats}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.stats = {k: dict(v) for k, v in values["stats"].items()}
        self.fitted = True

"""The GPU backend: the same kernels on cudf and cupy.

Partitions stay Arrow at the op boundary (so partials, fitted state and saved
workflows are the same on both backends); each kernel moves its columns to the GPU
with ``cudf.Series.from_arrow``, computes there and hands Arrow back.

cudf and cupy are imported on first use, never at import time: ``import
tabstream.backends.cudf`` works on a machine without them, and using the backend
there raises :class:`BackendUnavailableError` saying what to install.

Beside the kernels, this module holds what the pipeline needs from cudf, dask-cudf
and dask-cuda, each imported on first use: reading parquet row groups with cudf's
GPU reader (:func:`read_parquet_row_groups`), dask-cudf collections
(:func:`dask_gpu_frame`, :func:`frame_to_arrow`) and the process's
``LocalCUDACluster`` for several GPUs (:func:`gpu_count`, :func:`local_cuda_client`).

Run on a GPU (an H100, cudf 26.10; docs/backends.md, "State of the cudf backend"):
``tools/gpu_suite.sh`` / ``make test-gpu`` run the backend contract suite
(``tests/backends``) on this backend and compare every kernel and every op with the
arrow backend. CI has no GPU.
"""

from __future__ import annotations

import atexit
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends.base import AGGREGATIONS, Backend, Column, hll_rho, slice_plan
from tabstream.core.dtypes import widen_half
from tabstream.core.errors import BackendUnavailableError
from tabstream.core.hashing import DEFAULT_SEED, HashResult, murmur3_32_with_nulls

__all__ = ["BackendUnavailableError", "CudfBackend", "dask_gpu_frame", "frame_to_arrow", "gpu_count",
           "gpu_status", "is_gpu_frame", "local_cuda_client", "read_parquet_row_groups"]

INSTALL_HINT = ("install the GPU extra (pip install 'tabstream[gpu]' for CUDA 12, 'tabstream[gpu-cu13]' "
                "for CUDA 13: cudf, dask-cudf and dask-cuda) on a machine with an NVIDIA GPU and its "
                "driver, or use cpu=True")


@functools.lru_cache(maxsize=1)
def gpu_status() -> str | None:
    """None when cudf, cupy and a CUDA GPU are all usable; otherwise what is missing."""
    try:
        import cudf  # noqa: F401
        import cupy
    except ImportError as exc:
        return f"cudf/cupy do not import ({exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001 - any CUDA runtime failure means "no GPU"
        return f"no CUDA GPU is visible ({type(exc).__name__}: {exc})"
    if count < 1:
        return "no CUDA GPU is visible (0 devices)"
    return None


@functools.lru_cache(maxsize=1)
def gpu_count() -> int:
    """How many CUDA GPUs this process sees (``CUDA_VISIBLE_DEVICES`` applies); 0
    when the cudf backend cannot run here (see :func:`gpu_status`)."""
    if gpu_status() is not None:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def _libs() -> tuple[Any, Any]:
    missing = gpu_status()
    if missing is not None:
        raise BackendUnavailableError(f"the cudf backend cannot run here: {missing}",
                                      hint=INSTALL_HINT)
    import cudf
    import cupy

    return cudf, cupy


def _combined(column: Column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _to_cudf_type(column: Column) -> Column:
    """``column`` in a type cudf takes: cudf has no float16 (half floats travel as
    float32, exact) and no large_list (seen on cudf 26.10: "Unsupported type:
    large_list<item: string>"; lists travel with 32-bit offsets). Kernels cast their
    results back to the input's type."""
    column = widen_half(column)
    if pa.types.is_large_list(column.type):
        column = column.cast(pa.list_(column.type.value_field))
    return column


def _series(column: Column) -> Any:
    cudf, _ = _libs()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return cudf.Series.from_arrow(_to_cudf_type(column))


def _frame(table: pa.Table) -> Any:
    cudf, _ = _libs()
    if any(t == pa.float16() or pa.types.is_large_list(t) for t in table.schema.types):
        table = pa.table({n: _to_cudf_type(c) for n, c in zip(table.column_names, table.columns)})
    return cudf.DataFrame.from_arrow(table)


def _arrow(series: Any, like: pa.DataType | None = None) -> pa.Array:
    out = series.to_arrow()
    if isinstance(out, pa.ChunkedArray):
        out = out.combine_chunks()
    return out.cast(like) if like is not None and out.type != like else out


def _table(frame: Any, like: pa.Schema) -> pa.Table:
    """A cudf DataFrame back as Arrow, each column that ``like`` names in ``like``'s
    type. cudf gives its own types (seen on cudf 26.10: ``large_string`` for string,
    ``list<null>`` for a list column whose rows are all empty); the backend contract
    is the arrow backend's output, types included."""
    out = frame.to_arrow(preserve_index=False)
    columns = []
    for name, column in zip(out.column_names, out.columns):
        i = like.get_field_index(name)
        want = like.field(i).type if i >= 0 else column.type
        columns.append(column.cast(want) if column.type != want else column)
    return pa.table(columns, names=out.column_names)


class CudfBackend(Backend):
    """cudf + cupy on one GPU (several GPUs: one per dask-cuda worker)."""

    name = "cudf"
    gpu = True
    reads_parquet = True

    # -- beside the kernels (see Backend) ---------------------------------------
    def read_parquet_row_groups(self, source: Any, row_groups: Sequence[int],
                                columns: Sequence[str]) -> pa.Table:
        return read_parquet_row_groups(source, row_groups, columns)

    @staticmethod
    def owns_frame(frame: Any) -> bool:
        return is_gpu_frame(frame)

    def frame_to_arrow(self, frame: Any) -> pa.Table:
        return frame_to_arrow(frame)

    def dask_frame(self, read: Any, pieces: Sequence[Any], schema: pa.Schema) -> Any:
        return dask_gpu_frame(read, pieces, schema)

    # -- missing values --------------------------------------------------------
    def normalize_missing(self, column: Column) -> Column:
        t = column.type
        if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_dictionary(t) \
                or not pa.types.is_floating(t) or t == pa.float16():
            # nested and dictionary columns: the reference (host) normalization keeps
            # their exact layout; the flat float case below is the hot one
            from tabstream.core.hashing import normalize_missing

            return normalize_missing(column)
        s = _series(column) + 0.0  # -0.0 + 0.0 is +0.0 (IEEE 754); nulls stay null
        return _arrow(s.nans_to_nulls(), t)

    def is_missing(self, column: Column) -> Column:
        s = _series(column)
        if pa.types.is_floating(column.type):
            s = s.nans_to_nulls()
        return _arrow(s.isnull(), pa.bool_())

    def fill_missing(self, column: Column, value: Any) -> Column:
        s = _series(column)
        if pa.types.is_floating(column.type):
            s = s.nans_to_nulls()
        return _arrow(s.fillna(value), column.type)

    # -- element-wise arithmetic ---------------------------------------------
    def clip(self, column: Column, lower: Any | None, upper: Any | None) -> Column:
        s = _series(column)
        out = s.clip(lower=lower, upper=upper)
        if pa.types.is_floating(column.type):
            _, cupy = _libs()
            nan = cupy.isnan(s.fillna(0).values)
            out = out.where(~nan, s)  # NaN stays NaN (pandas' clip)
        return _arrow(out, column.type)

    def log1p(self, column: Column) -> Column:
        s = _series(column)
        if pa.types.is_boolean(column.type):
            s = s.astype("int8")
        return _arrow(np.log1p(s.astype("float64")).astype("float32"), pa.float32())

    def moments(self, column: Column) -> tuple[int, float, float]:
        _, cupy = _libs()
        x = _series(column).astype("float64").nans_to_nulls().dropna().values
        x = x[cupy.isfinite(x)]
        n = int(x.size)
        if n == 0:
            return 0, 0.0, 0.0
        y = x - x[0]  # shifted, as the arrow backend's: a constant column's m2 is exactly 0
        offset = float(y.mean())
        return n, float(x[0]) + offset, float(((y - offset) ** 2).sum())

    def standardize(self, column: Column, mean: float, std: float) -> Column:
        x = _series(column).astype("float64") - mean
        if std > 0:
            x = x / std
        return _arrow(x.astype("float32"), pa.float32())

    # -- categorical -----------------------------------------------------------
    def value_counts(self, column: Column) -> pa.Table:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        column = self.normalize_missing(column)
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            column = self.list_flatten(column)
        s = _series(column)
        # a Series named "count" indexed by the values (pandas 2 layout); reset_index
        # makes them the first column whatever its name, so columns are set by position.
        # sort=False: the contract allows any order, and sorting by count costs a sort
        vc = s.value_counts(sort=False, dropna=True)
        frame = vc.reset_index()
        frame.columns = ["values", "counts"]
        table = frame.to_arrow(preserve_index=False)
        return pa.table({"values": table.column("values").cast(column.type),
                         "counts": table.column("counts").cast(pa.int64())})

    def encode(self, column: Column, vocabulary: pa.Array) -> pa.Array:
        if pa.types.is_dictionary(column.type):  # dictionary reads of parquet: decoded here
            column = column.cast(column.type.value_type)
        cudf, cupy = _libs()
        positions = cudf.Series(cupy.arange(len(vocabulary), dtype="int64"),
                                index=cudf.Index(cudf.Series.from_arrow(vocabulary)))
        return _arrow(_series(column).map(positions), pa.int64())

    def murmur3(self, column: Column, seed: int = DEFAULT_SEED) -> HashResult:
        # The ids must equal the arrow backend's bit for bit (a workflow fitted on one
        # backend transforms on the other). cudf's own murmur3 hashes its internal
        # representation, whose byte layout for floats, strings and nulls is not the
        # one the reference pins, so the reference runs here on the host copy.
        return murmur3_32_with_nulls(column, seed)

    # -- relational ------------------------------------------------------------
    def groupby_aggregate(self, table: pa.Table, keys: Sequence[str],
                          aggregations: Sequence[tuple[str, str, str]]) -> pa.Table:
        df = _frame(table)
        # cudf's groupby cannot count a list column (26.10: "All requested
        # aggregations are unsupported"): such a count sums a 0/1 column of "present"
        present = {}
        for column, agg, _ in aggregations:
            if agg == "count" and pa.types.is_nested(table.schema.field(column).type) and column not in present:
                name = f"__tabstream_present_{len(present)}__"
                while name in df.columns:
                    name += "_"
                df[name] = df[column].notnull().astype("int64")
                present[column] = name
        grouped = df.groupby(list(keys), dropna=False, sort=False)
        out = grouped.size().reset_index(name="__size__") if not aggregations else None
        parts = {}
        for column, agg, out_name in aggregations:
            if agg not in AGGREGATIONS:
                raise ValueError(f"unknown aggregation {agg!r}; expected one of {list(AGGREGATIONS)}")
            if agg == "size":
                part = grouped.size()
            elif column in present and agg == "count":
                part = grouped[present[column]].sum()
            elif agg == "list":
                # collect_list runs on libcudf's sort-based groupby, whose stable
                # sort keeps each group's rows in input order
                part = grouped[column].agg("collect")
            elif agg in ("std", "var"):
                # ddof=1 as pandas; a group with fewer than two values gives null
                part = getattr(grouped[column], agg)(ddof=1).nans_to_nulls()
            else:
                # cudf's groupby has every other name as a method (its documented
                # aggregation table; first/last give the first/last non-null value, as
                # Arrow's)
                part = getattr(grouped[column], agg)()
            parts[out_name] = part
        if aggregations:
            cudf, _ = _libs()
            out = cudf.DataFrame(parts).reset_index()
        # keys, and the aggregates that keep their column's values, in the input types
        fields = [table.schema.field(k) for k in keys]
        for column, agg, out_name in aggregations:
            if agg in ("min", "max", "first", "last"):
                fields.append(pa.field(out_name, table.schema.field(column).type))
            elif agg == "list":
                fields.append(pa.field(out_name, pa.list_(table.schema.field(column).type)))
        result = _table(out, pa.schema(fields))
        for _, agg, out_name in aggregations:
            if agg == "sum":
                # cudf gives null for a group without values, the contract (pandas,
                # Arrow's min_count=0) 0. Filled in Arrow, which keeps null and NaN
                # apart: cudf's fillna also replaces NaN (26.10), and a NaN sum
                # (inf + -inf, a NaN value) must stay NaN
                i = result.schema.get_field_index(out_name)
                result = result.set_column(i, out_name, pc.fill_null(result.column(i), 0))
        return result.select(list(keys) + [name for _, _, name in aggregations])

    def join(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
             how: str = "left") -> pa.Table:
        if how not in ("left", "inner"):
            raise ValueError(f"join: how must be 'left' or 'inner', got {how!r}")
        cudf, cupy = _libs()
        order = "__tabstream_row__"
        while order in left.column_names or order in right.column_names:
            order += "_"
        lf = _frame(left)
        lf[order] = cupy.arange(left.num_rows, dtype="int64")
        # a null key matches nothing (cudf's merge, like pandas', would match null to
        # null): only rows with every key present are merged, the others rejoin after
        has_keys = lf[list(keys)].notnull().all(axis=1)
        right_frame = _frame(right).dropna(subset=list(keys))
        joined = lf[has_keys].merge(right_frame, on=list(keys), how=how, sort=False)
        if how == "left":
            joined = cudf.concat([joined, lf[~has_keys]], ignore_index=True)
        joined = joined.sort_values(order)
        names = left.column_names + [c for c in right.column_names if c not in keys]
        like = pa.schema(list(left.schema) + [f for f in right.schema if f.name not in keys])
        return _table(joined[names], like)

    # -- lists -----------------------------------------------------------------
    # offsets and values are the Arrow layout itself: read on the host, no GPU trip
    def list_flatten(self, column: Column) -> pa.Array:
        from tabstream.core.hashing import list_offsets_and_values

        return list_offsets_and_values(_combined(column))[1]

    def list_offsets(self, column: Column) -> pa.Array:
        from tabstream.core.hashing import list_offsets_and_values

        return list_offsets_and_values(_combined(column))[0]

    # -- rows ------------------------------------------------------------------
    def take(self, table: pa.Table, indices: np.ndarray | pa.Array) -> pa.Table:
        _, cupy = _libs()
        if isinstance(indices, pa.ChunkedArray):
            indices = indices.combine_chunks()
        if isinstance(indices, pa.Array) and indices.null_count:
            # a null index gives a row of nulls (as Arrow's take): point it at one
            # all-null row appended to the table
            nulls = pa.table({f.name: pa.nulls(1, f.type) for f in table.schema})
            table = pa.concat_tables([table, nulls])
            indices = indices.fill_null(table.num_rows - 1)
        idx = indices.to_numpy(zero_copy_only=False) if isinstance(indices, pa.Array) else indices
        return _table(_frame(table).take(cupy.asarray(idx)), table.schema)

    def filter(self, table: pa.Table, mask: Column | np.ndarray) -> pa.Table:
        cudf, _ = _libs()
        m = mask if isinstance(mask, np.ndarray) else _series(mask).fillna(False).values
        return _table(_frame(table)[cudf.Series(m)], table.schema)

    def concat(self, tables: Sequence[pa.Table]) -> pa.Table:
        cudf, _ = _libs()
        like = tables[0].schema if tables else pa.schema([])
        return _table(cudf.concat([_frame(t) for t in tables], ignore_index=True), like)

    # -- user functions ----------------------------------------------------------
    def to_frame(self, table: pa.Table) -> Any:
        return _frame(table)

    def from_frame(self, frame: Any) -> pa.Table:
        cudf, _ = _libs()
        if isinstance(frame, cudf.DataFrame):
            return frame.to_arrow(preserve_index=False)
        return pa.Table.from_pandas(frame, preserve_index=False)

    def from_user_column(self, values: Any) -> pa.Array:
        if hasattr(values, "to_arrow"):  # a cudf Series (or anything else Arrow-aware)
            if hasattr(values, "nans_to_nulls") and getattr(values.dtype, "kind", "") == "f":
                # NaN is missing, as the arrow backend reads a pandas result
                # (from_pandas): both backends give the same column for one function
                values = values.nans_to_nulls()
            return _arrow(values)
        if hasattr(values, "get"):  # a cupy array
            values = values.get()
        return pa.array(values, from_pandas=True)

    # -- kernels added for issue 9 (ops behind the backend) ---------------------------
    def digitize(self, column: Column, boundaries: Sequence[float]) -> pa.Array:
        cudf, cupy = _libs()
        # nulls become NaN in the cupy copy (to_cupy's na_value)
        x = _series(column).astype("float64").to_cupy(na_value=np.nan)
        ids = cupy.searchsorted(cupy.asarray(boundaries, dtype="float64"), x, side="right")
        # Series.mask sets the rows where the condition holds to null
        return _arrow(cudf.Series(ids.astype("int64")).mask(cupy.isnan(x)), pa.int64())

    def join_indices(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
                     how: str = "left") -> tuple[pa.Array, pa.Array]:
        if how not in ("left", "inner"):
            raise ValueError(f"join_indices: how must be 'left' or 'inner', got {how!r}")
        _, cupy = _libs()
        lrow, rrow = "__tabstream_left_row__", "__tabstream_right_row__"
        lf = _frame(left.select(list(keys)))
        lf[lrow] = cupy.arange(left.num_rows, dtype="int64")
        rf = _frame(right.select(list(keys)))
        rf[rrow] = cupy.arange(right.num_rows, dtype="int64")
        # cudf's merge, like pandas', matches a null key with a null key: right rows
        # with a null key are dropped first, so that a null key matches nothing (a
        # left row with one stays unmatched under how="left")
        rf = rf.dropna(subset=list(keys))
        joined = lf.merge(rf, on=list(keys), how=how, sort=False)
        joined = joined.sort_values([lrow, rrow], na_position="last")
        return _arrow(joined[lrow], pa.int64()), _arrow(joined[rrow], pa.int64())

    def list_lengths(self, column: Column) -> pa.Array:
        # ListMethods.len: null for a null row
        return _arrow(_series(column).list.len().fillna(0), pa.int64())

    def list_slice(self, column: Column, start: int, end: int | None,
                   pad_length: int | None = None, pad_value: Any = None) -> pa.Array:
        cudf, cupy = _libs()
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        list_type = arr.type if pa.types.is_large_list(arr.type) else pa.list_(arr.type.value_type)
        # offsets and values as list_offsets/list_flatten give them (null rows may
        # cover values; the plan uses offsets, never lengths, so that is fine)
        offsets = cupy.asarray(self.list_offsets(arr).to_numpy(zero_copy_only=False), dtype="int64")
        valid = cupy.asarray(arr.is_valid().to_numpy(zero_copy_only=False))
        new_offsets, idx = slice_plan(offsets, valid, start, end, pad_length, cupy)
        values = _series(self.list_flatten(arr))
        if pad_length is not None:
            values = cudf.concat([values, cudf.Series.from_arrow(pa.array([pad_value]).cast(list_type.value_type))],
                                 ignore_index=True)
            idx = cupy.where(idx < 0, len(values) - 1, idx)
        taken = _arrow(values.take(idx), list_type.value_type)
        cls = pa.LargeListArray if pa.types.is_large_list(list_type) else pa.ListArray
        offset_type = pa.int64() if pa.types.is_large_list(list_type) else pa.int32()
        mask = None if pad_length is not None else pa.array(~valid.get())
        return cls.from_arrays(pa.array(new_offsets.get(), type=offset_type), taken, mask=mask)

    def hll_registers(self, column: Column, precision: int) -> np.ndarray:
        cudf, cupy = _libs()
        hashes, is_null = self.murmur3(column)  # the reference hash (see murmur3)
        register, rank = hll_rho(cupy.asarray(np.asarray(hashes)[~np.asarray(is_null, dtype=bool)]),
                                 precision, cupy)
        regs = cupy.zeros(1 << precision, dtype="uint8")
        if register.size:
            # the largest rank per register: a group-by max, scattered into the registers
            best = cudf.DataFrame({"r": register, "k": rank}).groupby("r", sort=False)["k"].max()
            regs[best.index.values] = best.values.astype("uint8")
        return regs.get()

    def distinct(self, column: Column) -> pa.Array:
        return _arrow(_series(column).dropna().unique(), column.type)

    def min_max(self, column: Column) -> tuple[Any, Any]:
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            column = self.list_flatten(column)  # (the host reference, see list_flatten)
        s = _series(column).dropna()
        if len(s) == 0:
            return None, None
        lo, hi = s.min(), s.max()
        return (lo.item() if hasattr(lo, "item") else lo), (hi.item() if hasattr(hi, "item") else hi)

    def cast(self, column: Column, type_: pa.DataType) -> pa.Array:
        arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        int_to_int = pa.types.is_integer(arr.type) and pa.types.is_integer(type_)
        to_float = (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)) and pa.types.is_floating(type_)
        if not (int_to_int or to_float):
            # lists, strings, float -> int (Arrow refuses a truncation astype would do):
            # the host reference
            return arr.cast(type_)
        if pa.types.is_integer(type_):
            # astype wraps around on overflow: check the range first, as Arrow's safe cast
            info = np.iinfo(type_.to_pandas_dtype())
            lo, hi = self.min_max(arr)
            if lo is not None and (lo < info.min or hi > info.max):
                raise pa.ArrowInvalid(f"integer value {lo if lo < info.min else hi} not in range "
                                      f"{info.min}..{info.max} of {type_}")
        return _arrow(_series(arr).astype(type_.to_pandas_dtype()), type_)

    def split_strings(self, column: Column, separator: str) -> pa.Array:

        column = (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).cast(pa.string())
        split = _arrow(_series(column).str.split(separator, expand=False, regex=False))
        split = split.cast(pa.list_(pa.string()))
        # the empty string is the empty list (str.split would give [""]): set on the
        # host copy, whatever cudf gives for it
        return pc.if_else(pc.equal(column, ""), pa.scalar([], type=split.type), split)

    def sort_indices(self, table: pa.Table, sort_keys: Sequence[tuple[str, str]]) -> pa.Array:
        for _, order in sort_keys:
            if order not in ("ascending", "descending"):
                raise ValueError(f"sort_indices: order must be 'ascending' or 'descending', got {order!r}")
        _, cupy = _libs()
        names = list(dict.fromkeys(name for name, _ in sort_keys))
        row = "__tabstream_row__"
        while row in names:
            row += "_"
        frame = _frame(table.select(names))
        frame[row] = cupy.arange(table.num_rows, dtype="int64")
        # cudf's argsort is not stable (its docs: only quicksort): the row number as
        # the last key makes ties keep row order
        order = frame.argsort(by=[name for name, _ in sort_keys] + [row],
                              ascending=[o == "ascending" for _, o in sort_keys] + [True], na_position="last")
        return pa.array(cupy.asnumpy(order).astype(np.int64))


# -- what the pipeline needs from cudf, dask-cudf and dask-cuda -----------------------
def read_parquet_row_groups(source: Any, row_groups: Sequence[int], columns: Sequence[str]) -> pa.Table:
    """Row groups ``row_groups`` of one parquet file, only ``columns``, decoded on the
    GPU by cudf's reader and handed back as Arrow (the ops' interface).

    ``source`` is a local path or an open binary file (cudf's reader takes either,
    per its documentation). Types are cudf's (strings may come back as
    ``large_string``): the Dataset casts the result to its own schema. A failure of
    the reader is an ``OSError`` naming it, which the Dataset reports with the file
    and row groups."""
    cudf, _ = _libs()
    try:
        # One source and one list of row groups for it (cudf's documented form for
        # several sources is a list of lists, one per source). use_pandas_metadata
        # off: exactly ``columns``, no index columns a pandas writer recorded.
        frame = cudf.read_parquet([source], columns=list(columns), row_groups=[list(row_groups)],
                                  use_pandas_metadata=False)
    except (MemoryError, BackendUnavailableError):
        raise
    except Exception as exc:  # noqa: BLE001 - cudf raises RuntimeError/ValueError/OSError alike
        raise OSError(f"cudf's parquet reader failed: {type(exc).__name__}: {exc}") from exc
    return frame.to_arrow(preserve_index=False)


def is_gpu_frame(obj: Any) -> bool:
    """Whether ``obj`` is a cudf DataFrame (checked without importing cudf)."""
    return type(obj).__module__.split(".")[0] == "cudf" and hasattr(obj, "to_arrow")


def frame_to_arrow(frame: Any) -> pa.Table:
    """A cudf DataFrame (one partition of a dask-cudf DataFrame) as an Arrow table
    on the host, without its index."""
    if not is_gpu_frame(frame):
        raise TypeError(f"expected a cudf DataFrame, got {type(frame).__module__}.{type(frame).__name__}")
    return frame.to_arrow(preserve_index=False)


class _OnGpu:
    """Picklable partition function of :func:`dask_gpu_frame`: the Arrow table a
    reader gives, as a cudf DataFrame."""

    def __init__(self, read: Callable[[Any], pa.Table]) -> None:
        self.read = read

    def __call__(self, piece: Any) -> Any:
        return _frame(self.read(piece))


def dask_gpu_frame(read: Callable[[Any], pa.Table], pieces: Sequence[Any], schema: pa.Schema) -> Any:
    """A dask-cudf DataFrame with one partition per piece: ``read(piece)`` gives the
    piece as an Arrow table with ``schema``, moved to the GPU as a cudf DataFrame.

    Built with ``dask.dataframe.from_map`` and a cudf ``meta``, the route dask-cudf's
    documentation gives for data its readers do not cover; importing dask_cudf
    registers cudf as a dask DataFrame backend, so the collection is a dask-cudf one."""
    _libs()
    try:
        import dask_cudf  # noqa: F401 - registers the "cudf" dataframe backend with dask
    except ImportError as exc:
        raise BackendUnavailableError(f"a dask-cudf DataFrame needs dask_cudf, which does not import ({exc})",
                                      hint=INSTALL_HINT) from exc
    import dask.dataframe as dd

    return dd.from_map(_OnGpu(read), list(pieces), meta=_frame(schema.empty_table()), enforce_metadata=False)


# The process's LocalCUDACluster and its client, started on first use (see
# local_cuda_client) and closed when the interpreter exits.
_CLUSTER_LOCK = threading.Lock()
_CLUSTER: dict[str, Any] = {}

CLUSTER_HINT = ("install dask-cuda (pip install 'tabstream[gpu]'), or pass a client "
                "(Workflow(..., client=Client(...))), or use one GPU (CUDA_VISIBLE_DEVICES=0)")


def local_cuda_client() -> Any:
    """A ``distributed.Client`` of the process's dask-cuda ``LocalCUDACluster``, started
    on first use and kept until the interpreter exits (starting one takes seconds, so
    every fit, transform and export of the process shares it).

    dask-cuda's documentation: the cluster detects the visible GPUs and starts one
    worker process per GPU, each with its own ``CUDA_VISIBLE_DEVICES`` (one thread per
    worker by default). The client is not made dask's default (``set_as_default=False``):
    the user's own dask code keeps its scheduler. A script that starts one must guard
    its entry point with ``if __name__ == "__main__":`` (the workers are new processes)."""
    with _CLUSTER_LOCK:
        client = _CLUSTER.get("client")
        if client is not None and client.status == "running":
            return client
        try:
            from dask_cuda import LocalCUDACluster
            from distributed import Client
        except ImportError as exc:
            raise BackendUnavailableError(
                f"several GPUs are visible and no dask client was given, so tabstream runs on "
                f"dask-cuda's LocalCUDACluster (one worker per GPU), but dask_cuda does not import ({exc})",
                hint=CLUSTER_HINT) from exc
        cluster = LocalCUDACluster()
        client = Client(cluster, set_as_default=False)
        if not _CLUSTER:
            atexit.register(_close_cluster)
        _CLUSTER.update(client=client, cluster=cluster)
        return client


def _close_cluster() -> None:
    with _CLUSTER_LOCK:
        client, cluster = _CLUSTER.pop("client", None), _CLUSTER.pop("cluster", None)
    for thing in (client, cluster):
        if thing is not None:
            thing.close()

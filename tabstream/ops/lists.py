"""Multi-hot (list) column ops: SplitList, ListSlice, ValueCount.

List columns come from parquet (``list<int64>``, ``list<string>``...) or from raw
strings split by :class:`SplitList`. Downstream ops that encode values
(``Categorify``, ``HashBucket``) work element by element and keep the lists::

    genres   "a|b|c"  ""   None        SplitList("|")   ["a","b","c"]  []  null
    ids      [5, 6, 7, 8]              ListSlice(-2)    [7, 8]
    ids      [5]                       ListSlice(0, 3, pad=True, pad_value=0)
                                                        [5, 0, 0]

:class:`ValueCount` records the smallest and largest list length of each column in
the schema (``properties["value_count"] = {"min": 0, "max": 3}``) from per-partition
minima and maxima.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.backends import current as backend
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError
from tabstream.core.operators import ColumnOperator, Operator, StatOperator
from tabstream.core.schema import ColumnSchema, Tags

__all__ = ["ListSlice", "SplitList", "ValueCount"]


def _require_list(op: Operator, col: ColumnSchema) -> None:
    # a schema without dtypes (Schema(["a"])) builds a graph; the data is checked at fit
    if not col.is_list and col.dtype != "unknown":
        raise TypeError(
            f"{type(op).__name__} needs list columns, but column {col.name!r} is a scalar "
            f"{col.dtype}; split raw strings into lists first with SplitList(separator=...)"
        )


def _chunks(column: pa.ChunkedArray | pa.Array) -> list[pa.Array]:
    return list(column.chunks) if isinstance(column, pa.ChunkedArray) else [column]


def _row_lengths(arr: pa.Array) -> np.ndarray:
    """Length of every row of one list chunk, null rows as 0."""
    return np.asarray(backend().list_lengths(arr).to_numpy(zero_copy_only=False), dtype=np.int64)


class SplitList(ColumnOperator):
    """Split raw strings into list columns (multi-hot features).

    ``"a|b|c"`` becomes ``["a", "b", "c"]``; the empty string becomes the empty
    list ``[]``; a null stays null (a missing value, not an empty list). Empty
    pieces between separators are kept, as ``str.split`` keeps them:
    ``"a||b"`` -> ``["a", "", "b"]``.

    Parameters
    ----------
    separator:
        The literal (not a regex) string between elements.
    dtype:
        Element dtype of the output lists (``"string"``; ``"int64"`` for
        ``"3|17|4"``). Elements that do not parse raise :class:`DataError`.

    >>> import pyarrow as pa
    >>> SplitList("|").transform(pa.table({"g": ["a|b", "", None]}))["g"].to_pylist()
    [['a', 'b'], [], None]
    """

    def __init__(self, separator: str = "|", dtype: str = "string") -> None:
        if not isinstance(separator, str) or not separator:
            raise ValueError(f"SplitList: separator must be a non-empty string, got {separator!r}")
        if not isinstance(dtype, str):
            raise TypeError(f"SplitList: dtype must be a dtype name such as 'string' or 'int64', got {dtype!r}")
        arrow_type = dtype_to_arrow_type(dtype)
        if pa.types.is_nested(arrow_type):
            raise TypeError(f"SplitList: dtype is the element dtype and cannot be nested, got {dtype!r}")
        self.separator = separator
        self.dtype = dtype

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        if col.is_list or col.dtype != "string":
            raise TypeError(
                f"SplitList splits string columns, but column {col.name!r} is "
                f"{'a list of ' if col.is_list else ''}{col.dtype}"
            )
        dtype = arrow_type_to_dtype(dtype_to_arrow_type(self.dtype))[0]
        props = {k: v for k, v in col.properties.items() if k != "value_count"}
        return ColumnSchema(col.name, dtype, col.tags | {Tags.LIST}, props, is_list=True, is_ragged=True)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        lists = backend().split_strings(column, self.separator)
        target = pa.list_(dtype_to_arrow_type(self.dtype))
        try:
            return backend().cast(lists, target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataError(
                f"SplitList: column {name!r}: cannot convert the pieces split on "
                f"{self.separator!r} to {self.dtype}: {exc}"
            ) from exc


class ListSlice(ColumnOperator):
    """Keep a slice of every list, with Python slicing semantics (NVTabular's ListSlice).

    ``ListSlice(n)`` keeps the first ``n`` elements (``[0:n]``), ``ListSlice(-n)`` the
    last ``n`` (``[-n:]``), ``ListSlice(start, end)`` is ``[start:end]``; negative
    indices count from the end of each row.

    With ``pad=True`` every row gets exactly ``end - start`` elements (``-start``
    for ``ListSlice(-n)``), filled up with ``pad_value``; the schema then records
    ``value_count = {"min": n, "max": n}`` and ``is_ragged=False``. The output is
    tagged ``Tags.LIST``, as NVTabular's ListSlice tags it. Padding needs a
    fixed slice length, so a slice mixing signs (``[2:-1]``, ``[-5:3]``) or open at
    the end (``[2:]``) cannot be padded. A null row stays null without padding and
    becomes a row of ``pad_value`` with padding (a missing list counts as empty).

    >>> import pyarrow as pa
    >>> t = pa.table({"l": [[1, 2, 3, 4], [5], [], None]})
    >>> ListSlice(-2).transform(t)["l"].to_pylist()
    [[3, 4], [5], [], None]
    >>> ListSlice(0, 3, pad=True).transform(t)["l"].to_pylist()
    [[1, 2, 3], [5, 0, 0], [0, 0, 0], [0, 0, 0]]
    """

    def __init__(self, start: int, end: int | None = None, pad: bool = False,
                 pad_value: float | str = 0) -> None:
        for name, value in (("start", start), ("end", end)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
                raise TypeError(f"ListSlice: {name} must be an integer, got {value!r}")
        if start is None:
            raise TypeError("ListSlice: start must be an integer, got None")
        if not isinstance(pad, bool):
            raise TypeError(f"ListSlice: pad must be True or False, got {pad!r}")
        if isinstance(pad_value, bool) or not isinstance(pad_value, (int, float, str)):
            raise TypeError(f"ListSlice: pad_value must be a number or a string, got {pad_value!r}")
        self.start = int(start)
        self.end = None if end is None else int(end)
        self.pad = pad
        self.pad_value = pad_value
        if pad and self.length is None:
            raise ValueError(
                f"ListSlice({self.start}, {self.end}, pad=True): padding needs a fixed slice "
                "length; use ListSlice(n), ListSlice(-n) or ListSlice(start, end) with "
                "start and end of the same sign"
            )

    @property
    def _bounds(self) -> tuple[int, int | None]:
        """(start, end) as Python slicing reads them; ``ListSlice(n)`` is ``[0:n]``."""
        if self.end is None and self.start > 0:
            return 0, self.start
        return self.start, self.end

    @property
    def length(self) -> int | None:
        """The fixed number of elements every padded row has (None if it varies)."""
        start, end = self._bounds
        if end is None:
            return -start if start < 0 else None
        if (start >= 0) == (end >= 0):
            return max(end - start, 0)
        return None

    def _sliced_length(self, n: int) -> int:
        """Output length of a row of length ``n``."""
        start, end = self._bounds
        s = min(max(start if start >= 0 else n + start, 0), n)
        e = n if end is None else min(max(end if end >= 0 else n + end, 0), n)
        return max(e - s, 0)

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        _require_list(self, col)
        if self.pad:
            _check_pad_value(self, col, self.pad_value)
        props = {k: v for k, v in col.properties.items() if k != "value_count"}
        if self.pad:
            n = self.length
            props["value_count"] = {"min": n, "max": n}
            return ColumnSchema(col.name, col.dtype, col.tags | {Tags.LIST}, props, is_list=True, is_ragged=False)
        start, end = self._bounds
        if not (start < 0 and end is not None and end >= 0):
            # the sliced length grows with the row length here, so bounds map to bounds
            known = col.properties.get("value_count") or {}
            props["value_count"] = {"min": self._sliced_length(int(known.get("min", 0)))}
            hi = self._sliced_length(int(known["max"])) if "max" in known else self.length
            if hi is not None:
                props["value_count"]["max"] = hi
        return ColumnSchema(col.name, col.dtype, col.tags | {Tags.LIST}, props, is_list=True, is_ragged=col.is_ragged)

    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray:
        return pa.chunked_array([self._slice(arr) for arr in _chunks(column)], type=_plain_list_type(column.type))

    def _slice(self, arr: pa.Array) -> pa.Array:
        start, end = self._bounds
        if self.pad:
            return backend().list_slice(arr, start, end, pad_length=self.length, pad_value=self.pad_value)
        return backend().list_slice(arr, start, end)


def _plain_list_type(t: pa.DataType) -> pa.DataType:
    """list or large_list with the same element type (fixed-size lists become lists)."""
    if pa.types.is_large_list(t):
        return t
    return pa.list_(t.value_type)


def _check_pad_value(op: Operator, col: ColumnSchema, value: Any) -> None:
    numeric = col.dtype.startswith(("int", "uint", "float")) or col.dtype == "bool"
    ok = (isinstance(value, str) and col.dtype == "string") or (numeric and not isinstance(value, str))
    integer = col.dtype.startswith(("int", "uint"))
    if ok and integer and not (math.isfinite(value) and float(value).is_integer()):
        ok = False  # 1.5, NaN and ±inf have no integer value
    if not ok:
        raise TypeError(
            f"{type(op).__name__}: pad_value {value!r} does not fit column {col.name!r}, a list of "
            f"{col.dtype}; pass a pad_value of that type (e.g. pad_value='' for strings)"
        )
    if integer and not np.iinfo(col.dtype).min <= value <= np.iinfo(col.dtype).max:
        info = np.iinfo(col.dtype)
        raise ValueError(
            f"{type(op).__name__}: pad_value {value!r} is outside the range of column {col.name!r}, "
            f"a list of {col.dtype} ({info.min}..{info.max}); pass a pad_value in that range")
    domain = col.properties.get("domain") or {}
    if integer and Tags.CATEGORICAL in col.tags and isinstance(domain.get("min"), int) \
            and isinstance(domain.get("max"), int) and not domain["min"] <= value <= domain["max"]:
        # the schema's domain and cardinality size the embedding tables: an id past
        # them indexes no row (0 is Categorify's and the loaders' padding id)
        raise ValueError(
            f"{type(op).__name__}: pad_value {value!r} is outside the ids of the categorical column "
            f"{col.name!r} ({domain['min']}..{domain['max']}, its schema's domain); pad with an id "
            f"in that range, usually 0, the padding id")


class ValueCount(StatOperator):
    """Record the min and max list length of each selected list column.

    Data passes through unchanged; the output schema gains
    ``properties["value_count"] = {"min": a, "max": b}``. Each partition reports
    its own min/max; the partials are merged with min/max, so the whole column is
    never held at once. A null row counts as length 0 (it reaches models as an
    empty list); a column with no rows at all gets ``{"min": 0, "max": 0}``.
    A column whose rows all have one length (``min == max``) is then not ragged
    (``is_ragged=False``), as NVTabular's ValueCount records it.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"value_counts": dict[str, dict[str, int]]}

    def __init__(self) -> None:
        super().__init__()
        self.value_counts: dict[str, dict[str, int]] = {}

    @property
    def stats(self) -> dict[str, dict[str, dict[str, int]]]:
        """NVTabular's layout of the fitted counts: ``{column: {"value_count": {"min": a, "max": b}}}``."""
        return {name: {"value_count": dict(vc)} for name, vc in self.value_counts.items()}

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        _require_list(self, col)
        if col.name in self.value_counts:
            counts = dict(self.value_counts[col.name])
            # every row of one length: a fixed-length list, as NVTabular's shape says
            return replace(col.with_properties(value_count=counts), is_ragged=counts["min"] != counts["max"])
        return col

    def fit_partition(self, table: pa.Table) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for name in table.column_names:
            lengths = [_row_lengths(arr) for arr in _chunks(table.column(name)) if len(arr)]
            if not lengths:
                out[name] = None
                continue
            out[name] = (int(min(x.min() for x in lengths)), int(max(x.max() for x in lengths)))
        return out

    def combine(self, partials: Sequence[dict[str, tuple[int, int] | None]]) -> dict[str, tuple[int, int] | None]:
        out: dict[str, tuple[int, int] | None] = {}
        for part in partials:
            for name, mm in part.items():
                prev = out.get(name)
                if mm is None or prev is None:
                    out[name] = mm if prev is None else prev
                else:
                    out[name] = (min(prev[0], mm[0]), max(prev[1], mm[1]))
        return out

    def finalize(self, partial: dict[str, tuple[int, int] | None]) -> None:
        self.value_counts = {
            name: {"min": mm[0], "max": mm[1]} if mm is not None else {"min": 0, "max": 0}
            for name, mm in partial.items()
        }
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        return table

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"value_counts": self.value_counts}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.value_counts = {
            name: {"min": int(vc["min"]), "max": int(vc["max"])}
            for name, vc in values["value_counts"].items()
        }
        self.fitted = True

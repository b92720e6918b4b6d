"""Mapping between Arrow types and the dtype names used in schemas.

Schemas name element types the numpy way (``"int64"``, ``"float32"``,
``"string"``, ``"bool"``); list columns keep the element type and set
``is_list``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["arrow_to_pandas", "arrow_type_to_dtype", "dtype_to_arrow_type", "is_list_type", "list_value_type", "sort_indices"]

_NAMED = {
    "string": pa.string(),
    "str": pa.string(),
    "object": pa.string(),
    "large_string": pa.large_string(),
    "bool": pa.bool_(),
    "boolean": pa.bool_(),
}


def is_list_type(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)


def list_value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if is_list_type(t) else t


def arrow_type_to_dtype(t: pa.DataType) -> tuple[str, bool]:
    """``(element dtype name, is_list)`` for an Arrow type.

    >>> arrow_type_to_dtype(pa.list_(pa.int32()))
    ('int32', True)
    """
    is_list = is_list_type(t)
    t = list_value_type(t)
    if pa.types.is_dictionary(t):
        t = t.value_type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string", is_list
    if pa.types.is_boolean(t):
        return "bool", is_list
    if pa.types.is_timestamp(t):
        return f"datetime64[{t.unit}]", is_list
    try:
        return np.dtype(t.to_pandas_dtype()).name, is_list
    except (NotImplementedError, TypeError):
        return str(t), is_list


def dtype_to_arrow_type(dtype: Any) -> pa.DataType:
    """Arrow type for a user-given dtype: a name (``"int64"``, ``"string"``), a numpy
    dtype, a Python type (``int``, ``float``, ``str``) or an Arrow type."""
    if isinstance(dtype, pa.DataType):
        return dtype
    if dtype is str:
        return pa.string()
    if isinstance(dtype, str) and dtype.lower() in _NAMED:
        return _NAMED[dtype.lower()]
    try:
        return pa.from_numpy_dtype(np.dtype(dtype))
    except (TypeError, NotImplementedError) as exc:
        raise TypeError(
            f"unsupported dtype {dtype!r}; use a numpy dtype name such as 'int64', "
            "'float32', 'string' or 'bool', or a pyarrow DataType"
        ) from exc


def widen_half(values: Any) -> Any:
    """float16 values as float32 (exact); Arrow has no sort, hash or arithmetic
    kernels for half floats. Any other type is returned unchanged."""
    return values.cast(pa.float32()) if values.type == pa.float16() else values


def sort_indices(table: pa.Table, sort_keys: list[tuple[str, ...]]) -> pa.Array:
    """``pyarrow.compute.sort_indices`` that also sorts float16 columns."""
    names = list(dict.fromkeys(k[0] for k in sort_keys))
    keys = pa.table({n: widen_half(table.column(n)) for n in names})
    return pc.sort_indices(keys, sort_keys=sort_keys)


def arrow_to_pandas(table: pa.Table) -> Any:
    """Arrow -> pandas with numpy dtypes for numbers and booleans, as NVTabular's
    pandas frames hold them, so numpy idioms and dtype comparisons work.

    - numbers and booleans without nulls: numpy dtypes (``int64``, ``float32``, ``bool``);
    - floats with nulls: the same numpy float dtype with NaN;
    - integers and booleans with nulls: pandas' masked dtypes (``Int64``, ``boolean``),
      exact for every value (a float64 would round ids above 2**53), never ``float64``;
    - strings: pandas' string dtype; lists: ``pd.ArrowDtype`` lists.

    >>> arrow_to_pandas(pa.table({"a": [1, 2], "b": [1, None], "c": [0.5, None]})).dtypes.tolist()
    [dtype('int64'), Int64Dtype(), dtype('float64')]
    """
    import pandas as pd  # here, so that schemas and dtypes import without pandas

    def mapper(t: pa.DataType) -> Any:
        if pa.types.is_list(t) or pa.types.is_large_list(t):
            return pd.ArrowDtype(t)
        return None

    frame = table.to_pandas(types_mapper=mapper, self_destruct=False)
    for i, column in enumerate(table.columns):
        if column.null_count and (pa.types.is_integer(column.type) or pa.types.is_boolean(column.type)):
            masked = _masked_dtype(column.type)
            frame.isetitem(i, column.to_pandas(types_mapper={column.type: masked}.get))
    return frame


def _masked_dtype(t: pa.DataType) -> Any:
    """pandas' masked (nullable) dtype of an Arrow integer or boolean type."""
    import pandas as pd

    return {pa.int8(): pd.Int8Dtype(), pa.int16(): pd.Int16Dtype(), pa.int32(): pd.Int32Dtype(),
            pa.int64(): pd.Int64Dtype(), pa.uint8(): pd.UInt8Dtype(), pa.uint16(): pd.UInt16Dtype(),
            pa.uint32(): pd.UInt32Dtype(), pa.uint64(): pd.UInt64Dtype(), pa.bool_(): pd.BooleanDtype()}[t]

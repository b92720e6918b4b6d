"""Structural ops and user functions: Rename, Filter, Dropna, LambdaOp, and the
user/item tagging helpers TagAsUserID, TagAsItemID, TagAsUserFeatures,
TagAsItemFeatures.

>>> import pandas as pd
>>> import tabstream as ts
>>> from tabstream import ops
>>> df = pd.DataFrame({"user": [1, None, 3], "item": [7, 8, None], "price": [2.5, 1.0, 4.0]})
>>> ts.Workflow(["price"] >> ops.Rename(postfix="_raw")).fit_transform(df)
   price_raw
0        2.5
1        1.0
2        4.0
>>> ts.Workflow(["user", "item"] >> ops.Dropna()).fit_transform(df)   # rows with a null removed
   user  item
0   1.0   7.0
>>> wf = ts.Workflow(["user"] >> ops.TagAsUserID())
>>> sorted(t.value for t in wf.fit(df).output_schema["user"].tags)
['id', 'user', 'user_id']

Functions are saved by name, never pickled: see :mod:`tabstream.ops.functions`
(its names still import from here).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError, SchemaError
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Schema, Tags, normalize_tags
from tabstream.ops.functions import (
    DENIED_MODULES,
    FunctionOperator,
    FunctionResolutionError,
    describe_function,
    function_name,
    provided_functions,
    register_function,
    resolve_function,
)
from tabstream.ops.keys import dependencies_of, names_and_nodes, require_selected

__all__ = [
    "DENIED_MODULES",
    "Dropna",
    "Filter",
    "FunctionResolutionError",
    "LambdaOp",
    "Rename",
    "TagAsItemFeatures",
    "TagAsItemID",
    "TagAsUserFeatures",
    "TagAsUserID",
    "function_name",
    "provided_functions",
    "register_function",
    "resolve_function",
]


# -- ops ------------------------------------------------------------------

class Rename(FunctionOperator):
    """Rename the selected columns (NVTabular's Rename); data is unchanged.

    Exactly one of: ``f`` (a function of the old name returning the new one),
    ``postfix`` (appended) or ``name`` (the new name of the single selected column).

    >>> import pandas as pd
    >>> import tabstream as ts
    >>> df = pd.DataFrame({"price": [2.5], "a": [1], "b": [2]})
    >>> ts.Workflow(["price"] >> Rename(postfix="_usd")).fit_transform(df)
       price_usd
    0        2.5
    >>> ts.Workflow(["a", "b"] >> Rename(f=str.upper)).fit_transform(df)
       A  B
    0  1  2
    """

    def __init__(self, f: Callable[[str], str] | str | None = None, postfix: str | None = None,
                 name: str | None = None) -> None:
        given = [k for k, v in (("f", f), ("postfix", postfix), ("name", name)) if v is not None]
        if len(given) != 1:
            raise ValueError(f"Rename needs exactly one of f, postfix or name; got {given or 'none'}")
        for key, value in (("postfix", postfix), ("name", name)):
            if value is not None and (not isinstance(value, str) or not value):
                raise TypeError(f"Rename: {key} must be a non-empty string, got {value!r}")
        self._set_function(f, required=False)
        self.postfix = postfix
        self.name = name

    def _new_names(self, names: list[str]) -> list[str]:
        if self.name is not None:
            if len(names) != 1:
                raise SchemaError(
                    f"Rename(name={self.name!r}) renames one column, but {len(names)} are selected: "
                    f"{names}; use f= or postfix= for several columns")
            return [self.name]
        if self.postfix is not None:
            return [n + self.postfix for n in names]
        out = [self.f(n) for n in names]
        bad = {n: o for n, o in zip(names, out) if not isinstance(o, str) or not o}
        if bad:
            raise TypeError(f"Rename: f={describe_function(self.f)} must return non-empty strings; it returned {bad}")
        return out

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        new = self._new_names(input_schema.column_names)
        dupes = sorted({n for n in new if new.count(n) > 1})
        if dupes:
            raise SchemaError(f"Rename maps several columns to the same name {dupes}: "
                              f"{dict(zip(input_schema.column_names, new))}")
        return Schema(col.with_name(n) for col, n in zip(input_schema, new))

    def transform(self, table: pa.Table) -> pa.Table:
        return table.rename_columns(self._new_names(table.column_names))


class Filter(FunctionOperator):
    """Keep the rows where ``f(df)`` is true (NVTabular's Filter).

    ``f`` gets the selected columns as a pandas DataFrame (nullable dtypes: ints stay
    ints with ``<NA>``) and returns a boolean Series/array of the same length; a
    missing value in the mask drops the row. **Changes the row count**: the output
    holds only the selected columns, so select every column you keep
    (``ALL >> Filter(f)``), and apply other ops after it, not beside it.

    >>> import pandas as pd
    >>> import tabstream as ts
    >>> def positive_price(df):
    ...     return df.price > 0
    >>> df = pd.DataFrame({"price": [2.5, -1.0, None], "user": [1, 2, 3]})
    >>> ts.Workflow(["price", "user"] >> Filter(positive_price)).fit_transform(df)
       price  user
    0    2.5     1
    """

    changes_row_count = True

    def __init__(self, f: Callable[[pd.DataFrame], Any] | str) -> None:
        self._set_function(f)

    def transform(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return table
        frame = backend().to_frame(table)
        mask = self.f(frame)
        if _ndim(mask) == 2 and hasattr(mask, "index") and hasattr(mask, "columns"):
            return backend().take(table, self._kept_rows(frame, mask))
        if _ndim(mask) != 1 or len(mask) != table.num_rows:
            raise TypeError(
                f"Filter: f={describe_function(self.f)} must return one boolean per row ({table.num_rows}), "
                f"got {type(mask).__name__} of shape {_shape(mask)}")
        arr = backend().from_user_column(mask)
        if not pa.types.is_boolean(arr.type):
            raise TypeError(f"Filter: f={describe_function(self.f)} must return booleans, got {arr.type}")
        return backend().filter(table, arr)


    def _kept_rows(self, frame: Any, result: Any) -> np.ndarray:
        """The rows a function that returns the filtered frame (``df[df.x > 0]``,
        NVTabular allows it) kept: its index labels, positions in ``frame``."""
        fname = describe_function(self.f)
        if list(result.columns) != list(frame.columns):
            raise TypeError(f"Filter: f={fname} returned a frame with columns {list(result.columns)}; "
                            f"a filtered frame keeps the columns it was given {list(frame.columns)} "
                            "(or return a boolean mask)")
        index = np.asarray(result.index.to_numpy() if hasattr(result.index, "to_numpy") else result.index)
        n = len(frame)
        if index.dtype.kind not in "iu" or (len(index) and (index.min() < 0 or index.max() >= n)) \
                or len(np.unique(index)) != len(index):
            raise TypeError(f"Filter: f={fname} returned a frame whose index is not a selection of "
                            f"the given rows 0..{n - 1} (do not reset or change the index; or return "
                            "a boolean mask)")
        index = index.astype(np.int64)
        if not result.equals(frame.take(index)):
            raise TypeError(f"Filter: f={fname} returned a frame whose rows are not the given rows "
                            "at its index labels (was the index reset, or were values changed?); "
                            "return the rows unchanged with their labels, or a boolean mask")
        return index


def _shape(values: Any) -> tuple[int, ...]:
    """The shape of what a user function returned: the object's own ``shape`` first,
    since a GPU backend's Series or DataFrame refuses numpy's ``np.shape`` /
    ``np.ndim`` (see the backend notes in docs/backends.md)."""
    shape = getattr(values, "shape", None)
    return tuple(shape) if isinstance(shape, tuple) else np.shape(values)


def _ndim(values: Any) -> int:
    return len(_shape(values))


class Dropna(Operator):
    """Drop the rows with a missing value in any selected column (NVTabular's Dropna).

    Missing is a null, or NaN in a float column (as ``pandas.DataFrame.dropna``);
    an empty list is a value. **Changes the row count**; the output holds the
    selected columns only (see :class:`Filter`).
    """

    changes_row_count = True

    def transform(self, table: pa.Table) -> pa.Table:
        kernels = backend()
        drop = None
        for column in table.columns:
            missing = kernels.is_missing(column)
            drop = missing if drop is None else pc.or_(drop, missing)
        return table if drop is None else kernels.filter(table, pc.invert(drop))


class LambdaOp(FunctionOperator):
    """Apply ``f`` to each selected column as a pandas Series (NVTabular's LambdaOp).

    ``f(series) -> series`` (or ``f(series, df)``, with ``df`` the selected columns)
    must keep the length. The Series has nullable dtypes (ints and bools stay
    exact with ``<NA>``, strings use pandas' string dtype, floats NaN). The result
    is converted back with ``dtype`` when given; with ``dtype=None`` it must keep
    the input dtype. ``tags`` and ``properties`` are added to the output columns.

    ``dependency`` (a column name, a list of them or a workflow node, as in
    NVTabular) names columns ``f`` reads from ``df`` besides the selection: they
    join the input, are not transformed and are not outputs. ``label`` names the op
    in reprs (NVTabular's graph label); it changes no output.

    >>> import pandas as pd
    >>> import tabstream as ts
    >>> def first_two(s):
    ...     return s.str.slice(0, 2)
    >>> def halve(s):
    ...     return s / 2
    >>> df = pd.DataFrame({"title": ["hello", None], "count": [3, 4]})
    >>> ts.Workflow(["title"] >> LambdaOp(first_two)).fit_transform(df)
      title
    0    he
    1   NaN
    >>> ts.Workflow(["count"] >> LambdaOp(halve, dtype="float64")).fit_transform(df)
       count
    0    1.5
    1    2.0
    >>> def share(s, df):
    ...     return s / df["total"]
    >>> events = pd.DataFrame({"clicks": [1, 3], "total": [4, 6]})
    >>> ts.Workflow(["clicks"] >> LambdaOp(share, dtype="float64",
    ...                                    dependency=["total"])).fit_transform(events)
       clicks
    0    0.25
    1    0.50

    Saving stores ``f`` by name; see the module docs (a lambda cannot be saved).
    """

    def __init__(self, f: Callable[..., Any] | str, dtype: Any = None,
                 tags: Iterable[Tags | str] | None = None,
                 properties: dict[str, Any] | None = None,
                 dependency: str | Sequence[str] | Any = None, label: str | None = None) -> None:
        self._set_function(f)
        if dependency is None or (isinstance(dependency, (list, tuple)) and not dependency):
            self.dependency, self._dependency_nodes = None, []
        else:
            names, self._dependency_nodes = names_and_nodes(dependency, "dependency", "LambdaOp")
            self.dependency = names
        if label is not None and not isinstance(label, str):
            raise TypeError(f"LambdaOp: label must be a string, got {label!r}")
        self.label = label
        self.dtype = None if dtype is None else arrow_type_to_dtype(dtype_to_arrow_type(dtype))[0]
        self.tags = sorted(t.value for t in normalize_tags(tags))
        if properties is not None and not isinstance(properties, dict):
            raise TypeError(f"LambdaOp: properties must be a dict, got {type(properties).__name__}")
        self.properties = dict(properties or {})

    def dependencies(self) -> list[Any]:
        return dependencies_of(self.dependency, self._dependency_nodes) if self.dependency else []

    def _transformed(self, names: Sequence[str]) -> list[str]:
        """The columns ``f`` maps: the input less the ``dependency`` columns."""
        skip = set(self.dependency or ())
        out = [n for n in names if n not in skip]
        if not out:
            raise SchemaError(f"LambdaOp: every selected column {list(names)} is a dependency "
                              f"{self.dependency}; select the columns f maps besides them")
        return out

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        dtype = self.dtype or self._inferred.get(col.name)
        out = col if dtype is None else col.with_dtype(dtype)
        return out.with_tags(self.tags).with_properties(**self.properties)

    @property
    def _inferred(self) -> dict[str, str]:
        return self.__dict__.setdefault("_inferred_dtypes", {})

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        if self.dependency:
            require_selected(self.dependency, input_schema.column_names, "LambdaOp", "dependency")
        if self.dtype is None:
            self._infer_dtypes(input_schema)
        mapped = set(self._transformed(input_schema.column_names))
        return Schema(self.output_column(col) for col in input_schema if col.name in mapped)

    def _infer_dtypes(self, input_schema: Schema) -> None:
        """With ``dtype=None``, the dtype ``f`` returns, found by running it on no rows
        of each column (NVTabular finds it on the data at fit). A function that fails
        on no rows, or returns no type there, keeps the input dtype."""
        fields = []
        for col in input_schema:
            try:
                t = dtype_to_arrow_type(col.dtype)
            except TypeError:
                return  # a dtype not known before the data: checked at transform
            fields.append(pa.field(col.name, pa.list_(t) if col.is_list else t))
        empty = pa.schema(fields).empty_table()
        df = backend().to_frame(empty)
        takes_frame = self._takes_frame()
        mapped = set(self._transformed(input_schema.column_names))
        for col in input_schema:
            if col.name not in mapped:
                continue
            try:
                result = self.f(df[col.name], df) if takes_frame else self.f(df[col.name])
                arr = backend().from_user_column(result)
            except Exception:  # noqa: BLE001 - the user's function on no rows; the data decides
                self._inferred.pop(col.name, None)
                continue
            if pa.types.is_null(arr.type):
                continue
            dtype, is_list = arrow_type_to_dtype(arr.type)
            if is_list == col.is_list and dtype != col.dtype:
                self._inferred[col.name] = dtype
            else:
                self._inferred.pop(col.name, None)

    def _takes_frame(self) -> bool:
        try:
            params = inspect.signature(self.f).parameters.values()
        except (TypeError, ValueError):
            return False
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                      and p.default is p.empty]
        return len(positional) == 2

    def transform(self, table: pa.Table) -> pa.Table:
        df = backend().to_frame(table)
        takes_frame = self._takes_frame()
        out = {}
        for name in self._transformed(table.column_names):
            result = self.f(df[name], df) if takes_frame else self.f(df[name])
            out[name] = self._to_arrow(name, result, table.column(name).type)
        return pa.table(out)

    def _to_arrow(self, name: str, result: Any, in_type: pa.DataType) -> pa.Array:
        fname = describe_function(self.f)
        if _ndim(result) != 1:
            raise TypeError(f"LambdaOp: f={fname} must return a Series for column {name!r}, "
                            f"got {type(result).__name__}")
        try:
            arr = backend().from_user_column(result)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise DataError(f"LambdaOp: f={fname} returned values for column {name!r} that "
                            f"do not convert to Arrow: {exc}") from exc
        if pa.types.is_null(arr.type):  # all missing (or no rows): nothing to check
            target = in_type if self.dtype is None else dtype_to_arrow_type(self.dtype)
            return arr.cast(target)
        if self.dtype is None and name in self._inferred:
            target = dtype_to_arrow_type(self._inferred[name])
        elif self.dtype is None:
            declared = arrow_type_to_dtype(in_type)
            if arrow_type_to_dtype(arr.type) != declared:
                raise SchemaError(
                    f"LambdaOp: f={fname} returned {arrow_type_to_dtype(arr.type)[0]} for column "
                    f"{name!r}, which was declared {declared[0]} (the input dtype, as dtype=None); "
                    f"pass dtype='{arrow_type_to_dtype(arr.type)[0]}' to LambdaOp")
            target = in_type
        else:
            target = dtype_to_arrow_type(self.dtype)
        try:
            return arr.cast(target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataError(f"LambdaOp: f={fname} returned {arr.type} values for column {name!r} "
                            f"that do not convert to {self.dtype or target}: {exc}") from exc


# -- user/item tagging helpers ---------------------------------------------------

class _TagAs(Operator):
    _base_tags: ClassVar[tuple[Tags, ...]] = ()

    def __init__(self, tags: Iterable[Tags | str] | None = None) -> None:
        self.tags = sorted(t.value for t in normalize_tags(tags))

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        return col.with_tags([*self._base_tags, *self.tags])

    def transform(self, table: pa.Table) -> pa.Table:
        return table


class TagAsUserID(_TagAs):
    """Tag user id columns ``user_id`` (with ``user`` and ``id``); extra ``tags`` optional."""

    _base_tags = (Tags.USER_ID,)


class TagAsItemID(_TagAs):
    """Tag item id columns ``item_id`` (with ``item`` and ``id``); extra ``tags`` optional."""

    _base_tags = (Tags.ITEM_ID,)


class TagAsUserFeatures(_TagAs):
    """Tag user feature columns ``user``; extra ``tags`` optional."""

    _base_tags = (Tags.USER,)


class TagAsItemFeatures(_TagAs):
    """Tag item feature columns ``item``; extra ``tags`` optional."""

    _base_tags = (Tags.ITEM,)

"""NVTabular's call forms of an op's own methods, beside tabstream's.

tabstream's executor calls ``op.transform(table)`` (one Arrow table) and
``op.compute_output_schema(schema)``. Code written for NVTabular calls, and custom
ops written for it override, the selector forms::

    op.transform(col_selector, df)                              # a pandas DataFrame in and out
    op.compute_output_schema(schema, col_selector, prev_output_schema=None)
    op.output_column_names(col_selector)                        # a ColumnSelector

:class:`~tabstream.core.operators.Operator` wraps each subclass's ``transform`` and
``compute_output_schema`` with :func:`wrap_transform` / :func:`wrap_schema` when the
class defines them, so both forms reach every op, built-in or custom:

=====================================  ======================================  ======================================
the class defines                      tabstream calls ``(table)``/``(schema)``  NVTabular calls ``(selector, df)``/``(schema, selector)``
=====================================  ======================================  ======================================
``transform(self, table)``             as written                              the selected columns, Arrow round trip (a frame, a table or a dict of arrays)
``transform(self, selector, df)``      pandas round trip, all columns          as written
``compute_output_schema(self, s)``     as written                              on the selected columns (+ dependencies)
``compute_output_schema(self, s, sel)``  with a selector of all columns        as written
=====================================  ======================================  ======================================
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import pyarrow as pa

from tabstream.core.schema import Schema

__all__ = ["as_selector", "dependency_names", "selected_schema", "wrap_schema", "wrap_transform"]


def _positional(fn: Any) -> int:
    """How many positional parameters ``fn`` takes besides ``self`` (-1: ``*args``)."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return -1
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def as_selector(obj: Any) -> Any:
    from tabstream.core.graph import ColumnSelector

    return obj if isinstance(obj, ColumnSelector) else ColumnSelector(obj)


def dependency_names(op: Any) -> list[str]:
    """The column names among ``op``'s dependencies (nodes left out: their output
    joins the input schema a workflow gives the op)."""
    deps = op.dependencies
    deps = deps() if callable(deps) else deps
    if isinstance(deps, str):
        deps = [deps]
    out: list[str] = []
    for d in deps or ():
        for n in [d] if isinstance(d, str) else d if isinstance(d, (list, tuple)) else ():
            if isinstance(n, str) and n not in out:
                out.append(n)
    return out


def selected_schema(op: Any, schema: Schema, col_selector: Any) -> Schema:
    """``schema`` narrowed to what ``col_selector`` selects plus ``op``'s dependency
    columns: the input a workflow would give ``op`` for that selection."""
    if col_selector is None:
        return schema
    selector = as_selector(col_selector)
    if not selector.names and not selector.tags:
        return schema
    if selector.has_groups and hasattr(op, "set_column_groups"):
        op.set_column_groups(selector.groups)
    names = selector.resolve(schema)
    names += [n for n in dependency_names(op) if n in schema and n not in names]
    return schema.select_by_name(names)


def wrap_schema(fn: Any) -> Any:
    """``compute_output_schema`` accepting both call forms (see the module doc)."""
    if getattr(fn, "_call_forms", False):
        return fn
    if _positional(fn) == 1:
        @functools.wraps(fn)
        def schema_of(self: Any, input_schema: Schema, col_selector: Any = None,
                      prev_output_schema: Schema | None = None) -> Schema:
            return fn(self, selected_schema(self, input_schema, col_selector))
    else:
        @functools.wraps(fn)
        def schema_of(self: Any, input_schema: Schema, col_selector: Any = None,
                      prev_output_schema: Schema | None = None) -> Schema:
            from tabstream.core.graph import ColumnSelector

            if col_selector is None:  # the selection: the input less the op's dependencies
                deps = dependency_names(self)
                col_selector = ColumnSelector([n for n in input_schema.column_names if n not in deps])
            return fn(self, input_schema, as_selector(col_selector), prev_output_schema)
    schema_of._call_forms = True  # type: ignore[attr-defined]
    return schema_of


def _is_frame(obj: Any) -> bool:
    return hasattr(obj, "columns") and hasattr(obj, "iloc")


def wrap_transform(fn: Any) -> Any:
    """``transform`` accepting both call forms (see the module doc)."""
    if getattr(fn, "_call_forms", False):
        return fn
    if _positional(fn) == 1:
        @functools.wraps(fn)
        def transform(self: Any, *args: Any) -> Any:
            if len(args) == 1:
                return fn(self, args[0])
            if len(args) != 2:
                raise TypeError(f"{type(self).__name__}.transform takes (table) or NVTabular's "
                                f"(col_selector, df), got {len(args)} arguments")
            col_selector, df = args
            if isinstance(df, dict):  # NVTabular's dict of arrays: a dict of numpy arrays back
                names = as_selector(col_selector).names or list(df)
                names += [n for n in dependency_names(self) if n in df and n not in names]
                out = fn(self, pa.table({n: df[n] for n in names}))
                return {n: out.column(n).to_numpy() for n in out.column_names}
            columns = list(df.columns) if _is_frame(df) else df.column_names
            names = as_selector(col_selector).names or columns
            names += [n for n in dependency_names(self) if n in columns and n not in names]
            if not _is_frame(df):
                return fn(self, df.select(names))
            from tabstream.core.dtypes import arrow_to_pandas

            out = fn(self, pa.Table.from_pandas(df[names], preserve_index=False))
            frame = arrow_to_pandas(out)
            if len(frame) == len(df):
                frame.index = df.index
            return frame
    else:
        @functools.wraps(fn)
        def transform(self: Any, *args: Any) -> Any:
            if len(args) == 2:
                return fn(self, as_selector(args[0]), args[1])
            if len(args) != 1:
                raise TypeError(f"{type(self).__name__}.transform takes (table) or (col_selector, df), "
                                f"got {len(args)} arguments")
            (table,) = args
            if _is_frame(table):  # a custom op called by hand with a frame alone
                return fn(self, as_selector(list(table.columns)), table)
            from tabstream.core.dtypes import arrow_to_pandas

            deps = dependency_names(self)
            selector = as_selector([n for n in table.column_names if n not in deps])
            out = fn(self, selector, arrow_to_pandas(table))
            if isinstance(out, pa.Table):
                return out
            if not _is_frame(out):
                raise TypeError(f"{type(self).__name__}.transform(col_selector, df) must return a pandas "
                                f"DataFrame of its output columns, got {type(out).__name__}")
            try:
                return pa.Table.from_pandas(out, preserve_index=False)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError) as exc:
                raise TypeError(f"{type(self).__name__}.transform(col_selector, df) must return a "
                                f"pandas DataFrame Arrow can read: {exc}") from exc
    transform._call_forms = True  # type: ignore[attr-defined]
    return transform

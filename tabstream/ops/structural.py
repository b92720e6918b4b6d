"""Structural ops and user functions: Rename, Filter, Dropna, LambdaOp, and the
user/item tagging helpers TagAsUserID, TagAsItemID, TagAsUserFeatures,
TagAsItemFeatures.

>>> ["price"] >> Rename(postfix="_raw")                     # column price_raw
>>> ["title"] >> LambdaOp(first_word, dtype="string")       # f(pd.Series) -> pd.Series
>>> ["user", "item"] >> Dropna()                            # rows with a null removed
>>> ["user"] >> TagAsUserID()                               # tags user_id, user, id

User functions are saved by name, never pickled
-----------------------------------------------
``LambdaOp``, ``Filter`` and ``Rename(f=...)`` take a function. A saved workflow
stores it as the importable name ``"module:qualname"`` of a function defined at
the top level of a module (``def`` in a ``.py`` file, ``__main__`` included). A
lambda or a nested function has no such name and ``Workflow.save`` refuses it,
unless it was given a name with :func:`register_function`.

Loading turns the name back into a function, in this order:

1. functions passed again by the user: ``Workflow.load(path, functions={...})``
   (or the :func:`provided_functions` context manager it uses), keyed by the
   saved name or by the bare function name;
2. functions registered in this process with :func:`register_function`;
3. importing the module and reading the attribute, never ``eval`` or unpickling,
   and only for the user's own code: the module must be ``__main__`` or live
   outside the standard library and site-packages (so a tampered file cannot
   reach ``os.system``, ``pandas.read_pickle`` or any other installed function,
   and no installed module is even imported for it); the result must be a plain
   Python function whose ``__module__``/``__qualname__`` is the saved name (no
   aliases); no module in it may be private (``_x``) nor any attribute special
   (``__x__``); and the
   modules in :data:`DENIED_MODULES` are refused outright.

A function from an installed package (``pandas.to_numeric``) or a lambda
therefore cannot be saved by name: wrap it in a ``def`` in your own module, or
:func:`register_function` it in both the saving and the loading process.

Anything else raises :class:`FunctionResolutionError` naming the op, the saved
name and the fix (pass the function again).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError, SchemaError, TabstreamError
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Schema, Tags, normalize_tags

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


# -- user functions by name ---------------------------------------------------

class FunctionResolutionError(TabstreamError, ValueError):
    """A user function cannot be saved by name, or a saved name cannot be loaded."""


#: Modules (and their submodules) a saved name may never import from.
DENIED_MODULES = frozenset({
    "__builtin__", "asyncio", "bdb", "builtins", "cffi", "cloudpickle", "code", "codeop",
    "concurrent", "copyreg", "ctypes", "dill", "distutils", "ensurepip", "fileinput",
    "ftplib", "gc", "glob", "http", "imaplib", "importlib", "inspect", "io", "joblib",
    "jsonpickle", "marshal", "multiprocessing", "nt", "numexpr", "os", "pathlib", "pdb",
    "pickle", "pickletools", "pip", "pkgutil", "poplib", "posix", "pty", "pydoc",
    "requests", "runpy", "setuptools", "shelve", "shutil", "signal", "site", "smtplib",
    "socket", "socketserver", "ssl", "subprocess", "sys", "sysconfig", "tarfile",
    "telnetlib", "tempfile", "threading", "types", "urllib", "urllib3", "venv",
    "webbrowser", "xmlrpc", "yaml", "zipfile", "zipimport",
})
# a module path with one of these parts anywhere is refused too
# (pandas.io.pickle:read_pickle, pandas.core.computation.eval:eval, torch.serialization:load)
_DENIED_PARTS = frozenset({"pickle", "marshal", "subprocess", "serialization", "computation",
                           "os", "sys"})
_NAME_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

_REGISTRY: dict[str, Callable[..., Any]] = {}
_PROVIDED: ContextVar[Mapping[str, Callable[..., Any]] | None] = ContextVar(
    "tabstream_provided_functions", default=None)


def register_function(f: Callable[..., Any], name: str | None = None) -> Callable[..., Any]:
    """Make ``f`` savable and loadable under ``name`` in this process.

    ``name`` defaults to ``"module:qualname"``; give one to save a lambda or a
    nested function (``register_function(lambda s: s * 2, name="double")``). The
    process that loads the workflow must register the same name (or pass the
    function to ``Workflow.load(..., functions=...)``). Returns ``f``, so it works
    as a decorator.
    """
    if not callable(f):
        raise TypeError(f"register_function: expected a function, got {type(f).__name__}")
    if name is None:
        name = _importable_name(f)
        if name is None:
            raise FunctionResolutionError(
                f"register_function: {f!r} has no importable name (a lambda or a nested "
                "function); pass name='...'"
            )
    if not isinstance(name, str) or not name:
        raise TypeError(f"register_function: name must be a non-empty string, got {name!r}")
    if name in _REGISTRY and _REGISTRY[name] is not f:
        raise FunctionResolutionError(
            f"register_function: the name {name!r} is already registered for {_REGISTRY[name]!r}"
        )
    _REGISTRY[name] = f
    return f


@contextlib.contextmanager
def provided_functions(functions: Mapping[str, Callable[..., Any]] | None) -> Iterator[None]:
    """Functions the user passes again while loading a workflow, keyed by saved name
    (``"module:qualname"`` or a registered name) or by the bare function name.
    Nested uses add to the outer ones (``None`` adds nothing)."""
    if functions is not None:
        if not isinstance(functions, Mapping):
            raise TypeError(f"functions must be a dict of name -> function, got {type(functions).__name__}")
        bad = [k for k, v in functions.items() if not isinstance(k, str) or not callable(v)]
        if bad:
            raise TypeError(f"functions: every entry must map a name to a function; bad entries: {bad}")
    token = _PROVIDED.set({**(_PROVIDED.get() or {}), **(functions or {})})
    try:
        yield
    finally:
        _PROVIDED.reset(token)


def function_name(f: Callable[..., Any], op: str = "op") -> str:
    """The name ``f`` is saved under; raises if it cannot be loaded again by name."""
    for registered, g in _REGISTRY.items():
        if g is f:
            return registered
    name = _importable_name(f)
    if name is None:
        raise FunctionResolutionError(
            f"{op}: cannot save the function {_describe(f)} by name: it is a lambda, a nested "
            "function or not a plain Python function. Define it with `def` at the top level of "
            "a module, or register it with tabstream.ops.structural.register_function(f, "
            "name='...') before saving and before loading"
        )
    _check_allowed(name, op, *_defining_modules(f))
    for module in dict.fromkeys([name.partition(":")[0], *_defining_modules(f)]):
        _check_own_code(name, module, op)
    return name


def resolve_function(name: str, op: str = "op") -> Callable[..., Any]:
    """The function saved as ``name`` (see the module docs for the rules)."""
    if not isinstance(name, str):
        raise TypeError(f"{op}: a saved function name must be a string, got {name!r}")
    provided = _PROVIDED.get() or {}
    for key in (name, name.rpartition(":")[2]):
        if key in provided:
            return provided[key]
    if name in _REGISTRY:
        return _REGISTRY[name]
    hint = (f"pass the function again: Workflow.load(path, functions={{{name!r}: f}}), or "
            "register it with tabstream.ops.structural.register_function(f)")
    if not _NAME_RE.match(name):
        raise FunctionResolutionError(
            f"{op}: the saved function {name!r} is not an importable 'module:function' name "
            f"and no function was passed for it; {hint}")
    _check_allowed(name, op)
    module_name, qualname = name.split(":")
    try:
        _check_own_code(name, module_name, op)
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except FunctionResolutionError:
        raise
    except (ImportError, AttributeError, ValueError) as exc:
        raise FunctionResolutionError(f"{op}: cannot import the saved function {name!r} ({exc}); {hint}") from exc
    if not inspect.isfunction(obj) or _importable_name(obj) != name:
        raise FunctionResolutionError(
            f"{op}: the saved name {name!r} does not name a plain Python function defined "
            f"there (found {type(obj).__name__}); refusing to load it; {hint}")
    _check_allowed(name, op, *_defining_modules(obj))
    for real in _defining_modules(obj):
        _check_own_code(name, real, op)
    return obj


def _importable_name(f: Any) -> str | None:
    """``"module:qualname"`` when importing that gives back ``f`` itself."""
    if not inspect.isfunction(f):
        return None
    module, qualname = getattr(f, "__module__", None), getattr(f, "__qualname__", "")
    if not module or "<" in qualname:
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qualname}" if obj is f else None


def _defining_modules(f: Any) -> list[str]:
    """``__module__`` and the module whose globals ``f`` runs in (they differ for
    functions re-exported under another module, as pandas does)."""
    names = [getattr(f, "__module__", None), getattr(f, "__globals__", {}).get("__name__")]
    return [n for n in dict.fromkeys(names) if n]


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    import site
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    roots |= {sysconfig.get_paths(vars=base)[k] for k in ("stdlib", "platstdlib")}
    roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    return tuple(os.path.realpath(r) for r in roots if r)


def _check_own_code(name: str, module_name: str, op: str) -> None:
    """Refuse modules of the standard library and of installed packages, located
    without running them (``find_spec`` of the top-level package)."""
    top = module_name.split(".")[0]
    if top == "__main__":
        return
    mod = sys.modules.get(top)
    if mod is not None:
        loaded = [m for m in (mod, sys.modules.get(module_name)) if m is not None]
        locations = [p for m in loaded for p in (*getattr(m, "__path__", []), getattr(m, "__file__", None))]
    else:
        spec = importlib.util.find_spec(top)
        if spec is None:
            raise ImportError(f"no module named {top!r}")
        locations = [*(spec.submodule_search_locations or []), spec.origin]
    files = [os.path.realpath(p) for p in locations if p and p not in ("built-in", "frozen")]
    roots = _installed_roots()
    if not files or any(f == r or f.startswith(r + os.sep) for f in files for r in roots):
        raise FunctionResolutionError(
            f"{op}: refusing the function {name!r}: module {module_name!r} is part of the "
            "standard library or an installed package, and saved names may only point to "
            "your own code (a tampered file could name any installed function). Wrap what "
            "you need in a module-level function of your own, or register it with "
            "register_function(f, name=...)")


def _check_allowed(name: str, op: str, *real_modules: str) -> None:
    module_name, _, qualname = name.partition(":")
    for mod in dict.fromkeys([module_name, *real_modules]):
        parts = mod.split(".")
        denied = (
            any(".".join(parts[:i + 1]) in DENIED_MODULES for i in range(len(parts)))
            or any(p in _DENIED_PARTS for p in parts)
            or (mod != "__main__" and any(p.startswith("_") for p in parts))
        )
        if denied:
            raise FunctionResolutionError(
                f"{op}: refusing the function {name!r}: module {mod!r} may not be used for "
                "saved functions (it can reach the shell, files, network, interpreter or a "
                "deserializer, or it is private). Wrap what you need in your own module-level "
                "function, or pass the function again when loading")
    if any(p.startswith("__") for p in qualname.split(".")):
        raise FunctionResolutionError(f"{op}: refusing the function {name!r}: private or special names are not allowed")


def _describe(f: Any) -> str:
    return getattr(f, "__qualname__", None) or repr(f)


class _FunctionOp(Operator):
    """An op with a user function ``f``: saved by name, loaded by :func:`resolve_function`."""

    f: Any

    def _set_function(self, f: Any, required: bool = True) -> None:
        if f is None and not required:
            self.f = None
        elif isinstance(f, str):
            self.f = resolve_function(f, type(self).__name__)
        elif callable(f):
            self.f = f
        else:
            raise TypeError(f"{type(self).__name__}: f must be a function or a saved "
                            f"'module:function' name, got {type(f).__name__}")

    def get_params(self) -> dict[str, Any]:
        params = super().get_params()
        if params.get("f") is not None:
            params["f"] = function_name(params["f"], type(self).__name__)
        return params

    def __repr__(self) -> str:
        params = {**super().get_params()}
        if params.get("f") is not None:
            params["f"] = _describe(params["f"])
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in params.items())})"


# -- ops ------------------------------------------------------------------

class Rename(_FunctionOp):
    """Rename the selected columns (NVTabular's Rename); data is unchanged.

    Exactly one of: ``f`` (a function of the old name returning the new one),
    ``postfix`` (appended) or ``name`` (the new name of the single selected column).

    >>> ["price"] >> Rename(postfix="_usd")        # price -> price_usd
    >>> ["a", "b"] >> Rename(f=upper)              # a -> A, b -> B (upper is module-level)
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
            raise TypeError(f"Rename: f={_describe(self.f)} must return non-empty strings; it returned {bad}")
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


class Filter(_FunctionOp):
    """Keep the rows where ``f(df)`` is true (NVTabular's Filter).

    ``f`` gets the selected columns as a pandas DataFrame (nullable dtypes: ints stay
    ints with ``<NA>``) and returns a boolean Series/array of the same length; a
    missing value in the mask drops the row. **Changes the row count**: the output
    holds only the selected columns, so select every column you keep
    (``ALL >> Filter(f)``), and apply other ops after it, not beside it.

    >>> ["price", "user"] >> Filter(positive_price)   # def positive_price(df): return df.price > 0
    """

    def __init__(self, f: Callable[[pd.DataFrame], Any] | str) -> None:
        self._set_function(f)

    def transform(self, table: pa.Table) -> pa.Table:
        if table.num_rows == 0:
            return table
        mask = self.f(backend().to_frame(table))
        if isinstance(mask, pd.DataFrame) or np.ndim(mask) != 1 or len(mask) != table.num_rows:
            raise TypeError(
                f"Filter: f={_describe(self.f)} must return one boolean per row ({table.num_rows}), "
                f"got {type(mask).__name__} of shape {np.shape(mask)}")
        arr = backend().from_user_column(mask)
        if not pa.types.is_boolean(arr.type):
            raise TypeError(f"Filter: f={_describe(self.f)} must return booleans, got {arr.type}")
        return backend().filter(table, arr)


class Dropna(Operator):
    """Drop the rows with a missing value in any selected column (NVTabular's Dropna).

    Missing is a null, or NaN in a float column (as ``pandas.DataFrame.dropna``);
    an empty list is a value. **Changes the row count**; the output holds the
    selected columns only (see :class:`Filter`).
    """

    def transform(self, table: pa.Table) -> pa.Table:
        keep = None
        for column in table.columns:
            ok = pc.is_valid(column)
            if pa.types.is_floating(column.type):
                ok = pc.and_(ok, pc.invert(pc.fill_null(pc.is_nan(column), True)))
            keep = ok if keep is None else pc.and_(keep, ok)
        return table if keep is None else table.filter(keep)


class LambdaOp(_FunctionOp):
    """Apply ``f`` to each selected column as a pandas Series (NVTabular's LambdaOp).

    ``f(series) -> series`` (or ``f(series, df)``, with ``df`` the selected columns)
    must keep the length. The Series has nullable dtypes (ints and bools stay
    exact with ``<NA>``, strings use pandas' string dtype, floats NaN). The result
    is converted back with ``dtype`` when given; with ``dtype=None`` it must keep
    the input dtype. ``tags`` and ``properties`` are added to the output columns.

    >>> def first_two(s): return s.str.slice(0, 2)
    >>> ["title"] >> LambdaOp(first_two)                    # "hello" -> "he", <NA> -> <NA>
    >>> ["count"] >> LambdaOp(halve, dtype="float64")       # def halve(s): return s / 2

    Saving stores ``f`` by name; see the module docs (a lambda cannot be saved).
    """

    def __init__(self, f: Callable[..., Any] | str, dtype: Any = None,
                 tags: Iterable[Tags | str] | None = None,
                 properties: dict[str, Any] | None = None) -> None:
        self._set_function(f)
        self.dtype = None if dtype is None else arrow_type_to_dtype(dtype_to_arrow_type(dtype))[0]
        self.tags = sorted(t.value for t in normalize_tags(tags))
        if properties is not None and not isinstance(properties, dict):
            raise TypeError(f"LambdaOp: properties must be a dict, got {type(properties).__name__}")
        self.properties = dict(properties or {})

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        out = col if self.dtype is None else col.with_dtype(self.dtype)
        return out.with_tags(self.tags).with_properties(**self.properties)

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
        for name in table.column_names:
            result = self.f(df[name], df) if takes_frame else self.f(df[name])
            out[name] = self._to_arrow(name, result, table.column(name).type)
        return pa.table(out)

    def _to_arrow(self, name: str, result: Any, in_type: pa.DataType) -> pa.Array:
        fname = _describe(self.f)
        if np.ndim(result) != 1:
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
        if self.dtype is None:
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

"""User functions (of LambdaOp, Filter, Rename(f=...)) by name.

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
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from tabstream.core.errors import TabstreamError
from tabstream.core.operators import Operator

__all__ = ['DENIED_MODULES', 'FunctionResolutionError', 'function_name', 'provided_functions', 'register_function', 'resolve_function']


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

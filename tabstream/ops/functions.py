"""User functions (of LambdaOp, Filter, Rename(f=...)) by name.

User functions are saved by name, never pickled
-----------------------------------------------
``LambdaOp``, ``Filter`` and ``Rename(f=...)`` take a function. A saved workflow
stores it as the importable name ``"module:qualname"`` of a function defined at
the top level of a module (``def`` in a ``.py`` file, ``__main__`` included, or an
installed package's function such as ``numpy:round``). A lambda or a nested
function has no such name and ``Workflow.save`` refuses it, unless it was given a
name with :func:`register_function`.

Loading never runs code from where the data is
----------------------------------------------
A saved workflow may come from someone else, and a folder may hold ``.py`` files
beside its ``workflow.json``. Loading turns a saved name back into a function in
this order, and never imports a module from the workflow folder or from the
current directory (``''`` or the current directory on ``sys.path``, as under
``python -c``, ``python -m``, a REPL or a notebook started there):

1. functions passed again by the user: ``Workflow.load(path, functions={...})``
   (or the :func:`provided_functions` context manager it uses), keyed by the
   saved name or by the bare function name;
2. functions registered in this process with :func:`register_function`;
3. a module this process has already imported (``__main__`` included): nothing
   new runs, the attribute is read;
4. a module the user names in ``Workflow.load(path, allowed_modules=[...])`` (or
   :func:`allowed_modules`): imported as Python would, from wherever it is;
5. otherwise the module is imported only when it belongs to one of the installed
   packages of :data:`TRUSTED_PACKAGES` (numpy, pandas, ``pyarrow.compute``):
   found (without running it) with ``sys.path`` stripped of ``''``, the current
   directory and the workflow folder, its files lie under site-packages
   (``sysconfig``'s purelib/platlib, ``site``'s folders) and not in the workflow
   folder; it is imported with that stripped ``sys.path``, so neither it nor
   what it imports can be shadowed by a file of the folder. The standard library
   is not an installed package (pass ``allowed_modules`` for it).

Any other installed package is refused unless the user names it in
``allowed_modules`` (or passes the function), even when this process has already
imported it: an installed package's public functions include loaders of native
code and files (TensorFlow's ``load_library`` opens a shared library from the path
it is given, and a tampered ``Rename(f=...)`` hands it a column name, which a
folder can hold as a file), and a training process has TensorFlow or torch
imported. Step 3 serves the user's own modules, not site-packages.

In every case the modules in :data:`DENIED_MODULES` and modules reading or
writing files, the shell or a deserializer are refused, as are the modules of
tabstream itself (but for the op contract's two pure example functions,
``_OWN_PURE_FUNCTIONS``) and private (``_x``) or special (``__x__``) names; the
result must be a function (a plain one, or a wrapper of one such as numpy's
``numpy:round``) whose ``module:qualname`` is the saved name (no aliases).

Anything else raises :class:`FunctionResolutionError` naming the op, the saved
name, the module and its file, and the fix (``allowed_modules=`` or
``functions=``).
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
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

from tabstream.core.errors import TabstreamError
from tabstream.core.operators import Operator

__all__ = ['DENIED_MODULES', 'FunctionResolutionError', 'TRUSTED_PACKAGES', 'allowed_modules',
           'function_name', 'provided_functions', 'register_function', 'resolve_function']


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
#: Installed packages whose public functions a saved name reaches without the user
#: naming them in ``allowed_modules``: numerical kernels (``"pyarrow.compute"``: that
#: module of pyarrow and its submodules only). Their file readers, compilers and
#: library loaders are refused by :data:`DENIED_MODULES` and the denied parts below.
TRUSTED_PACKAGES = ("numpy", "pandas", "pyarrow.compute")
# a module path with one of these parts anywhere is refused too
# (pandas.io.pickle:read_pickle, pandas.core.computation.eval:eval, torch.serialization:load,
# pandas.io.pytables:read_hdf, numpy.lib._npyio_impl:load)
# (numpy.f2py builds and imports extension modules, numpy.ctypeslib loads shared libraries)
_DENIED_PARTS = frozenset({"pickle", "marshal", "subprocess", "serialization", "computation",
                           "os", "sys", "io", "npyio", "_npyio_impl", "f2py", "ctypeslib",
                           "load_library"})
#: tabstream's own functions are never loaded by a saved name (they read and write
#: folders); its ops are rebuilt by class, not by function
_OWN_PACKAGE = "tabstream"
#: the only functions of tabstream itself a saved workflow may name: the op contract's
#: example functions (pure arithmetic on their argument, no I/O), so workflows saved by
#: ``tabstream.testing.check_op`` and the contract examples load again
_OWN_PURE_FUNCTIONS = frozenset({"tabstream.testing.op_contract:contract_double",
                                 "tabstream.testing.op_contract:contract_keep_positive"})
_NAME_RE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")

_REGISTRY: dict[str, Callable[..., Any]] = {}
_PROVIDED: ContextVar[Mapping[str, Callable[..., Any]] | None] = ContextVar(
    "tabstream_provided_functions", default=None)
# (modules the user allows to import from anywhere, the folder being loaded or None)
_TRUST: ContextVar[tuple[tuple[str, ...], str | None]] = ContextVar(
    "tabstream_allowed_modules", default=((), None))
# sys.path is swapped while a module is imported with the untrusted entries removed
_IMPORT_LOCK = threading.RLock()


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


@contextlib.contextmanager
def allowed_modules(modules: Iterable[str] | None, folder: str | None = None) -> Iterator[None]:
    """While loading: ``modules`` (names of modules or packages; ``"mypkg"`` allows
    ``mypkg.sub`` too) may be imported from wherever Python finds them, the current
    directory included; ``folder`` is the workflow folder being loaded (a local
    path; None for an object store), from which nothing is imported. Nested uses
    add modules; the innermost folder counts."""
    if modules is None:
        names: tuple[str, ...] = ()
    elif isinstance(modules, str) or not isinstance(modules, Iterable):
        raise TypeError(f"allowed_modules must be a list of module names, got {modules!r}")
    else:
        names = tuple(modules)
        bad = [m for m in names if not isinstance(m, str) or not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", m)]
        if bad:
            raise TypeError(f"allowed_modules: every entry must be a module name like 'mypkg' or "
                            f"'mypkg.sub'; bad entries: {bad}")
    outer, outer_folder = _TRUST.get()
    real = os.path.realpath(folder) if folder is not None else outer_folder
    token = _TRUST.set(((*outer, *names), real))
    try:
        yield
    finally:
        _TRUST.reset(token)


def function_name(f: Callable[..., Any], op: str = "op") -> str:
    """The name ``f`` is saved under; raises if it cannot be loaded again by name."""
    for registered, g in _REGISTRY.items():
        if g is f:
            return registered
    name = _importable_name(f)
    if name is None:
        raise FunctionResolutionError(
            f"{op}: cannot save the function {describe_function(f)} by name: it is a lambda, a nested "
            "function or not a plain Python function. Define it with `def` at the top level of "
            "a module, or register it with tabstream.ops.structural.register_function(f, "
            "name='...') before saving and before loading"
        )
    _check_allowed(name, op, *_defining_modules(f))
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
        obj: Any = _import_safely(name, module_name, op)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except FunctionResolutionError:
        raise
    except (ImportError, AttributeError, ValueError) as exc:
        raise FunctionResolutionError(f"{op}: cannot import the saved function {name!r} ({exc}); {hint}") from exc
    if _plain_function(obj) is None or _importable_name(obj) != name:
        raise FunctionResolutionError(
            f"{op}: the saved name {name!r} does not name a plain Python function defined "
            f"there (found {type(obj).__name__}); refusing to load it; {hint}")
    defining = _defining_modules(obj)
    _check_allowed(name, op, *defining)
    for mod in defining:  # a function re-exported from another package
        _refuse_untrusted_installed(name, mod, op)
    return obj


def _plain_function(f: Any) -> Any:
    """The plain Python function ``f`` is or wraps (numpy's functions are dispatchers
    around one), else None; classes never count."""
    if inspect.isfunction(f):
        return f
    inner = getattr(f, "__wrapped__", None)
    if not inspect.isclass(f) and callable(f) and inspect.isfunction(inner):
        return inner
    return None


def _importable_name(f: Any) -> str | None:
    """``"module:qualname"`` when importing that gives back ``f`` itself."""
    if _plain_function(f) is None:
        return None
    module, qualname = getattr(f, "__module__", None), getattr(f, "__qualname__", None) or ""
    if not isinstance(module, str) or not module or not isinstance(qualname, str) or "<" in qualname:
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return f"{module}:{qualname}" if obj is f else None


def _defining_modules(f: Any) -> list[str]:
    """``__module__`` and the module whose globals ``f`` (or the function it wraps)
    runs in (they differ for functions re-exported under another module, as pandas
    and numpy do)."""
    inner = _plain_function(f)
    names = [getattr(f, "__module__", None), getattr(inner, "__module__", None),
             getattr(inner, "__globals__", {}).get("__name__")]
    return [n for n in dict.fromkeys(names) if isinstance(n, str) and n]


@functools.lru_cache(maxsize=1)
def _site_roots() -> tuple[str, ...]:
    """Folders of installed packages: site-packages of this interpreter (and its
    venv's base), the user's site-packages."""
    import site
    import sysconfig

    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    return tuple(os.path.realpath(r) for r in roots if r)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _untrusted_dirs() -> list[str]:
    """The current directory and the folder being loaded (real paths)."""
    folder = _TRUST.get()[1]
    return [os.path.realpath(os.getcwd()), *([folder] if folder else [])]


def _safe_sys_path() -> list[str]:
    """``sys.path`` without ``''``, the current directory and anything in the
    workflow folder: what an import for a saved name searches."""
    cwd, *folder = _untrusted_dirs()
    out = []
    for entry in sys.path:
        if not isinstance(entry, str) or entry in ("", "."):
            continue
        real = os.path.realpath(entry)
        if real == cwd or any(_under(real, f) for f in folder):
            continue
        out.append(entry)
    return out


@contextlib.contextmanager
def _stripped_sys_path() -> Iterator[None]:
    """``sys.path`` as :func:`_safe_sys_path` gives it, for this thread alone (the
    import lock held), restored on the way out."""
    with _IMPORT_LOCK:
        saved = sys.path
        sys.path = _safe_sys_path()
        try:
            yield
        finally:
            sys.path = saved


def _locations(module_or_spec: Any) -> list[str]:
    """The real paths of a module's (or a found spec's) files and package folders."""
    if hasattr(module_or_spec, "origin") and hasattr(module_or_spec, "submodule_search_locations"):
        found = [*(module_or_spec.submodule_search_locations or []), module_or_spec.origin]
    else:
        found = [*getattr(module_or_spec, "__path__", []), getattr(module_or_spec, "__file__", None)]
    return [os.path.realpath(p) for p in found if isinstance(p, str) and p not in ("built-in", "frozen")]


def _is_installed(locations: list[str]) -> bool:
    """Every location lies in site-packages and none in the workflow folder, nor in
    the current directory unless site-packages itself lies inside it (a project's
    ``.venv``)."""
    cwd, *folder = _untrusted_dirs()
    roots = _site_roots()
    for loc in locations:
        inside = [r for r in roots if _under(loc, r)]
        if not inside or any(_under(loc, f) for f in folder):
            return False
        if _under(loc, cwd) and not any(_under(r, cwd) for r in inside):
            return False
    return bool(locations)


def _is_allowed(module_name: str) -> bool:
    allowed = _TRUST.get()[0]
    return any(module_name == a or module_name.startswith(a + ".") for a in allowed)


def _import_safely(name: str, module_name: str, op: str) -> Any:
    """The module ``module_name``, imported under the rules of the module docs."""
    if _is_allowed(module_name):
        return _import_allowed(module_name)
    top = module_name.split(".")[0]
    if top != "__main__" and _in_stdlib(sys.modules.get(top) or importlib.util.find_spec(top)):
        # not a way in for the folder, but a wide one for a tampered name (logging.config
        # opens sockets): the standard library only when the user allows it
        raise FunctionResolutionError(
            f"{op}: refusing the function {name!r}: module {top!r} is part of the standard "
            "library, not an installed package. Wrap what you need in a module-level function "
            f"of your own, pass Workflow.load(path, allowed_modules=[{top!r}]), or pass the "
            f"function: Workflow.load(path, functions={{{name!r}: f}})")
    _refuse_untrusted_installed(name, module_name, op)
    if module_name in sys.modules:  # already imported (``__main__`` too): nothing new runs
        return sys.modules[module_name]
    with _IMPORT_LOCK:
        with _stripped_sys_path():
            loaded = sys.modules.get(top)
            spec = None if loaded is not None else importlib.util.find_spec(top)
            locations = _locations(loaded if loaded is not None else spec) if (loaded or spec) else []
            if (loaded is not None or spec is not None) and _is_installed(locations):
                return importlib.import_module(module_name)
        would = importlib.util.find_spec(top)  # where a plain import would take it from (runs nothing)
    if would is None:
        raise ImportError(f"no module named {top!r}")
    origin = would.origin if would.origin not in (None, "built-in", "frozen") else None
    where = origin or ", ".join(_locations(would)) or "a built-in module"
    cwd, *folder = _untrusted_dirs()
    if any(_under(p, f) for p in _locations(would) for f in folder):
        reason = "in the workflow folder"
    elif any(_under(p, cwd) for p in _locations(would)):
        reason = "in the current directory"
    else:
        reason = "not in an installed package (site-packages)"
    raise FunctionResolutionError(
        f"{op}: refusing to import module {top!r} for the saved function {name!r}: it would "
        f"run {where}, which is {reason}; loading a workflow never runs code from the "
        "workflow folder or the current directory. If you trust that module, pass "
        f"Workflow.load(path, allowed_modules=[{top!r}]) (or import it yourself first), or "
        f"pass the function: Workflow.load(path, functions={{{name!r}: f}})")


def _is_trusted(module_name: str) -> bool:
    return any(module_name == t or module_name.startswith(t + ".") for t in TRUSTED_PACKAGES)


def _refuse_untrusted_installed(name: str, module_name: str, op: str) -> None:
    """Refuse ``module_name`` when its package is installed (in site-packages) but
    neither among :data:`TRUSTED_PACKAGES` nor allowed by the user, imported or not
    (see the module docs)."""
    top = module_name.split(".")[0]
    if top in ("__main__", _OWN_PACKAGE) or _is_trusted(module_name) or _is_allowed(module_name):
        return  # tabstream's own functions: only _OWN_PURE_FUNCTIONS pass _check_allowed
    found: Any = sys.modules.get(top)
    if found is None:
        with _stripped_sys_path():
            found = importlib.util.find_spec(top)  # runs nothing
    where = _locations(found) if found is not None else []
    roots = _site_roots()
    if not any(_under(p, r) for p in where for r in roots):
        return  # the user's own code, or not found: the other rules decide
    trusted = ", ".join(TRUSTED_PACKAGES)
    raise FunctionResolutionError(
        f"{op}: refusing the function {name!r}: module {top!r} is an installed package "
        f"({where[0]}) that saved workflows may not reach on their own; only {trusted} "
        "load without your say-so (other packages' public functions include loaders of "
        "native code and files). If you trust the function, pass "
        f"Workflow.load(path, allowed_modules=[{top!r}]), or pass the function: "
        f"Workflow.load(path, functions={{{name!r}: f}})")


def _import_allowed(module_name: str) -> Any:
    """A module the user allowed, imported from wherever Python finds it, the current
    directory included: ``python`` searches it, a console script such as ``tabstream``
    does not (``transform ... --allow-module my_wf`` run in the folder of ``my_wf.py``).
    Only the allowed module is looked for there; ``sys.path`` is restored after."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name != module_name.split(".")[0]:
            raise  # a submodule or a dependency missing: not a matter of where
        with _IMPORT_LOCK:
            saved = sys.path
            sys.path = [os.getcwd(), *saved]
            try:
                return importlib.import_module(module_name)
            finally:
                sys.path = saved


def _in_stdlib(module_or_spec: Any) -> bool:
    """A module (or found spec) of the standard library: built in, frozen, or with
    files under the interpreter's library folders but not in site-packages."""
    if module_or_spec is None:
        return False
    spec = getattr(module_or_spec, "__spec__", None) or module_or_spec
    if getattr(spec, "origin", None) in ("built-in", "frozen"):
        return True
    where = _locations(module_or_spec)
    return bool(where) and all(any(_under(p, r) for r in _stdlib_roots())
                               and not any(_under(p, r) for r in _site_roots()) for p in where)


@functools.lru_cache(maxsize=1)
def _stdlib_roots() -> tuple[str, ...]:
    import sysconfig

    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix}
    roots = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
    roots |= {sysconfig.get_paths(vars=base)[k] for k in ("stdlib", "platstdlib")}
    return tuple(os.path.realpath(r) for r in roots if r)


def _check_allowed(name: str, op: str, *real_modules: str) -> None:
    module_name, _, qualname = name.partition(":")
    for mod in dict.fromkeys([module_name, *real_modules]):
        parts = mod.split(".")
        if parts[0] == _OWN_PACKAGE and name not in _OWN_PURE_FUNCTIONS:
            raise FunctionResolutionError(
                f"{op}: refusing the function {name!r}: module {mod!r} is part of tabstream "
                "itself, whose functions read and write folders; saved names may point to "
                "installed packages or your own code. Wrap what you need in your own "
                "module-level function, or pass the function again when loading")
        denied = (
            any(".".join(parts[:i + 1]) in DENIED_MODULES for i in range(len(parts)))
            or any(p in _DENIED_PARTS for p in parts)
            # the saved name must be public; the module really defining it may be
            # private (numpy:round runs in numpy._core.fromnumeric)
            or (mod == module_name and mod != "__main__" and any(p.startswith("_") for p in parts))
        )
        if denied:
            raise FunctionResolutionError(
                f"{op}: refusing the function {name!r}: module {mod!r} may not be used for "
                "saved functions (it can reach the shell, files, network, interpreter or a "
                "deserializer, or it is private). Wrap what you need in your own module-level "
                "function, or pass the function again when loading")
    if any(p.startswith("__") for p in qualname.split(".")):
        raise FunctionResolutionError(f"{op}: refusing the function {name!r}: private or special names are not allowed")


def describe_function(f: Any) -> str:
    return getattr(f, "__qualname__", None) or repr(f)


class FunctionOperator(Operator):
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
            params["f"] = describe_function(params["f"])
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in params.items())})"

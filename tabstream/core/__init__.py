"""What every layer shares: schemas and tags, dtypes, errors, column selectors and
graph nodes, the operator bases and the MurmurHash3 reference.

Imports point down only: ``core`` <- ``backends`` <- ``ops`` <- ``pipeline`` <-
``loaders`` <- ``train`` <- ``cli`` (checked by ``lint-imports``). Nothing here
imports pandas, dask or a framework at import time.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["alias_modules", "moved_module"]

#: old module path -> the module that now holds its code
_MOVED: dict[str, ModuleType] = {}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import <old path>`` gives the module that now holds the code (one module
    object under both names), with a DeprecationWarning naming the new path."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> ModuleType:
        module = _MOVED[spec.name]
        warnings.warn(f"{spec.name} moved to {module.__name__}; import {module.__name__} instead "
                      "(the old path will be removed)", DeprecationWarning, stacklevel=2)
        self._spec = module.__spec__  # the import machinery sets the old name's spec on it
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # the module keeps its own name and spec


_FINDER = _MovedModules()


def alias_modules(package: ModuleType, moved: dict[str, ModuleType]) -> None:
    """Keep ``package.<old>`` importable after a module moved into ``core``, with a
    DeprecationWarning naming the new path on first use.

    ``moved`` maps the old submodule name to the module object that now holds its
    code; ``import package.old`` and ``from package.old import X`` then give that
    same module (one module object, so a patch through either name is seen by both).
    Attribute access (``package.old``) goes through :func:`moved_module`, which the
    package's ``__getattr__`` calls."""
    for old, module in moved.items():
        _MOVED[f"{package.__name__}.{old}"] = module
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)


def moved_module(package: str, name: str) -> ModuleType | None:
    """``package.name`` when it is a moved module's old path (imported, so the
    warning is given); else None."""
    full = f"{package}.{name}"
    return importlib.import_module(full) if full in _MOVED else None

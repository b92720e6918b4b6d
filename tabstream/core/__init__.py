"""What every layer shares: schemas and tags, dtypes, errors, column selectors and
graph nodes, the operator bases and the MurmurHash3 reference.

Imports point down only: ``core`` <- ``backends`` <- ``ops`` <- ``pipeline`` <-
``loaders`` <- ``train`` <- ``cli`` (checked by ``lint-imports``). Nothing here
imports pandas, dask or a framework at import time.
"""

from __future__ import annotations

import sys
from types import ModuleType

__all__ = ["alias_modules"]


def alias_modules(package: ModuleType, moved: dict[str, ModuleType]) -> None:
    """Keep ``package.<old>`` importable after a module moved into ``core``.

    ``moved`` maps the old submodule name to the module object that now holds its
    code; ``import package.old`` and ``from package.old import X`` then give that
    same module (one module object, so a patch through either name is seen by both).
    """
    for old, module in moved.items():
        sys.modules.setdefault(f"{package.__name__}.{old}", module)
        setattr(package, old, module)

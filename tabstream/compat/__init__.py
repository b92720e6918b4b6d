"""Drop-in names for code written against other libraries, tabstream underneath.

``import tabstream.compat.nvtabular as nvt`` gives NVTabular's top-level names and
``nvt.ops``; see :mod:`tabstream.compat.nvtabular` and ``docs/migration.md``.
"""

__all__: list[str] = []

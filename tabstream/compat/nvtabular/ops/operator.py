"""``nvtabular.ops.operator``: the base of custom ops, as NVTabular code imports it."""

from tabstream.compat.nvtabular.ops import ColumnSelector, Operator

__all__ = ["ColumnSelector", "Operator"]

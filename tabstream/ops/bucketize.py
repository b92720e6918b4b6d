"""Bucketize: the index of the bucket each value falls in, given sorted boundaries.

>>> import pyarrow as pa
>>> from tabstream.ops import Bucketize
>>> Bucketize([2, 4]).transform(pa.table({"x": [1.0, None, 3.0, 5.0]}))["x"].to_pylist()
[0, None, 1, 2]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.backends import current as backend
from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Tags, embedding_dim
from tabstream.ops.numeric import check_numeric, plain

__all__ = ["Bucketize"]


def _check_boundaries(b: Any, where: str) -> list[float]:
    if not isinstance(b, (list, tuple)) or not b:
        raise TypeError(f"Bucketize: boundaries{where} must be a non-empty list of numbers, got {b!r}")
    if any(isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating))
           or not math.isfinite(v) for v in b):
        raise ValueError(f"Bucketize: boundaries{where} must be finite numbers, got {list(b)!r}")
    if any(lo >= hi for lo, hi in zip(b, b[1:])):
        raise ValueError(f"Bucketize: boundaries{where} must be strictly increasing, got {list(b)!r}")
    return [v.item() if hasattr(v, "item") else v for v in b]


class Bucketize(Operator):
    """Bucket index of each value: the number of boundaries ``<= x``.

    With boundaries ``[b0, b1, ..., bk-1]`` bucket ``0`` is ``x < b0``, bucket ``i``
    is ``b(i-1) <= x < bi`` and bucket ``k`` is ``x >= b(k-1)`` — NVTabular's
    convention, the same as ``numpy.digitize(x, boundaries, right=False)``. The
    output is int64 and tagged categorical with ``k + 1`` ids; -inf goes to bucket
    0, +inf to bucket ``k``; nulls and NaN become null (chain ``FillMissing`` first
    to bucket them). ``boundaries`` is one list for every column or a dict per column.

    >>> import pyarrow as pa
    >>> Bucketize([0, 10]).transform(pa.table({"x": [-5, 0, 9, 10, None]}))["x"].to_pylist()
    [0, 1, 1, 2, None]
    """

    def __init__(self, boundaries: list[float] | dict[str, list[float]]) -> None:
        if isinstance(boundaries, dict):
            boundaries = {str(k): _check_boundaries(v, f" of column {k!r}") for k, v in boundaries.items()}
        else:
            boundaries = _check_boundaries(boundaries, "")
        self.boundaries = boundaries

    def _for(self, name: str) -> list[float]:
        if isinstance(self.boundaries, dict):
            if name not in self.boundaries:
                raise KeyError(f"Bucketize: no boundaries given for column {name!r}; "
                               f"boundaries has {sorted(self.boundaries)}")
            return self.boundaries[name]
        return self.boundaries

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        check_numeric(self, col)
        n = len(self._for(col.name)) + 1
        props = {**col.properties, "boundaries": self._for(col.name),
                 "domain": {"min": 0, "max": n - 1, "name": col.name},
                 "embedding_sizes": {"cardinality": n, "dimension": embedding_dim(n)}}
        out = col.with_dtype("int64").with_tags(Tags.CATEGORICAL).without_tags(Tags.CONTINUOUS)
        return ColumnSchema(out.name, "int64", out.tags, props)

    def transform(self, table: pa.Table) -> pa.Table:
        data = {}
        for name in table.column_names:
            data[name] = backend().digitize(plain(table.column(name)), self._for(name))
        return pa.table(data)

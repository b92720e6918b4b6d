"""Sources, in-memory frames: a pandas DataFrame, a pyarrow Table or a dask DataFrame
given to ``Dataset``, and the dask frames a Dataset is turned into.

An in-memory table is cut into :class:`TablePiece` row ranges of about ``part_size``
(:func:`table_pieces`); a dask DataFrame's partitions are its pieces, turned
into Arrow by the backend whose frames they are (:func:`frame_to_arrow`).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TablePiece", "frame_to_arrow", "is_dask_dataframe", "is_pandas_dataframe", "pandas_to_arrow",
           "table_pieces"]


@dataclass(frozen=True)
class TablePiece:
    """Rows ``[start, stop)`` of an in-memory table."""

    start: int
    stop: int


def is_pandas_dataframe(obj: Any) -> bool:
    pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
    return pd is not None and isinstance(obj, pd.DataFrame)


def pandas_to_arrow(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


def is_dask_dataframe(obj: Any) -> bool:
    mod = type(obj).__module__
    return mod.startswith("dask") and hasattr(obj, "npartitions")


def frame_to_arrow(frame: Any) -> pa.Table:
    """One partition of a dask DataFrame given as input, whatever backend's frame it
    is (pandas; cudf for dask-cudf), as Arrow (see :func:`tabstream.backends.frame_to_arrow`)."""
    from tabstream import backends

    return backends.frame_to_arrow(frame)


def table_pieces(table: pa.Table, part_size: int) -> list[TablePiece]:
    """``table`` cut into row ranges of about ``part_size`` bytes (one empty piece
    for a table without rows)."""
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    step = max(1, part_size // row_bytes)
    n = table.num_rows
    return [TablePiece(i, min(i + step, n)) for i in range(0, n, step)] or [TablePiece(0, 0)]

"""Sources, in-memory frames: a pandas DataFrame, a pyarrow Table or a dask DataFrame
given to ``Dataset``, and the dask frames a Dataset is turned into.

An in-memory table is cut into :class:`TablePiece` row ranges of about ``part_size``
(:func:`table_pieces`); a dask DataFrame's partitions are its pieces. The cudf
backend's frame hooks (:func:`gpu_ddf`, :func:`is_gpu_collection`, and
:func:`frame_to_arrow` for cudf partitions) call :mod:`tabstream.backends.cudf`,
which holds the cudf code.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TablePiece", "frame_to_arrow", "gpu_ddf", "is_dask_dataframe", "is_gpu_collection",
           "is_pandas_dataframe", "pandas_to_arrow", "table_pieces"]


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


def gpu_ddf(read: Any, pieces: list[Any], schema: pa.Schema) -> Any:
    from tabstream.backends.cudf import dask_gpu_frame

    return dask_gpu_frame(read, pieces, schema)


def is_gpu_collection(ddf: Any) -> bool:
    """Whether a dask DataFrame's partitions are cudf DataFrames (dask-cudf)."""
    from tabstream.backends.cudf import is_gpu_frame

    return is_gpu_frame(ddf._meta)


def frame_to_arrow(frame: Any) -> pa.Table:
    """One partition of a dask DataFrame given as input (pandas, or cudf for dask-cudf)."""
    from tabstream.backends.cudf import frame_to_arrow as gpu_frame_to_arrow
    from tabstream.backends.cudf import is_gpu_frame

    return gpu_frame_to_arrow(frame) if is_gpu_frame(frame) else pandas_to_arrow(frame)


def table_pieces(table: pa.Table, part_size: int) -> list[TablePiece]:
    """``table`` cut into row ranges of about ``part_size`` bytes (one empty piece
    for a table without rows)."""
    row_bytes = max(1, table.nbytes // max(1, table.num_rows))
    step = max(1, part_size // row_bytes)
    n = table.num_rows
    return [TablePiece(i, min(i + step, n)) for i in range(0, n, step)] or [TablePiece(0, 0)]

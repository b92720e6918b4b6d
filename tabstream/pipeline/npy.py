"""``Dataset.to_npy``: a dataset (or a transformed one) as one numpy ``.npy`` file.

The layout is the one NVTabular/Merlin's ``Dataset.to_npy`` writes: a single 2-D
array, one row per dataset row, one column per scalar column in the dataset's
order, then each list column spread over columns ``name_0 .. name_{n-1}`` (its
fixed length ``n``), all in one common numpy dtype (``np.result_type`` of the
columns: ints with floats give ``float64``). ::

    id (int64): [1, 2]   emb (list<int64>): [[5, 6], [7, 8]]
    ->  np.load("out.npy") == [[1, 5, 6],
                               [2, 7, 8]]        (int64, shape (2, 3))

Refused, naming the column (nothing written): string columns (a ``.npy`` of
strings is a pickle of Python objects, which tabstream never writes: encode them
with ``Categorify`` first), nulls (as Merlin refuses them), and list columns whose
rows differ in length (Merlin would pad them with nulls, then refuse).

The file is streamed a partition at a time (memory: one partition) into a hidden
temporary file beside it and renamed into place when complete, so a failed write
never leaves a file that looks finished. Writers of one file take turns for that last
step (a lock ``.<name>.lock`` beside it, see :mod:`tabstream.pipeline.file_lock`):
of two ``append=True`` writers at once, the second appends to the file the first
left, so both add their rows.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import is_list_type, list_value_type
from tabstream.core.errors import DataError, SchemaError
from tabstream.pipeline.file_lock import exclusive

__all__ = ["write_npy"]


class _Layout:
    """The output columns of a table: ``(name, width or None for a scalar)`` and the
    common dtype, fixed by the first partition; a list column's width (values per
    row) by the first partition with rows, or by its type when it is fixed-size (an
    empty partition has no rows to measure: a filtered-out one must not fix 0)."""

    def __init__(self, table: pa.Table, where: str) -> None:
        strings = [f.name for f in table.schema if _is_text(list_value_type(f.type))]
        if strings:
            raise SchemaError(
                f"to_npy({where!r}): column(s) {strings} hold strings; a .npy file of strings "
                "is a pickle of Python objects, which tabstream does not write",
                hint="encode them first (ops.Categorify), or leave them out of the workflow's output")
        self.scalars = [f.name for f in table.schema if not is_list_type(f.type)]
        # None: not known yet (no rows seen); see measure()
        self.lists: dict[str, int | None] = {f.name: None for f in table.schema if is_list_type(f.type)}
        types = [_numpy_dtype(list_value_type(f.type), f.name, where) for f in table.schema]
        try:
            self.dtype = np.result_type(*types) if types else np.dtype("float64")
        except TypeError as exc:
            raise SchemaError(f"to_npy({where!r}): the columns' dtypes {[str(t) for t in types]} "
                              "have no common numpy dtype") from exc

    @property
    def width(self) -> int:
        """Columns of the array (a list column not yet measured counts 0: it has had no
        rows, so no row was written)."""
        return len(self.scalars) + sum(n or 0 for n in self.lists.values())

    def names(self) -> list[str]:
        return self.scalars + [f"{c}_{i}" for c, n in self.lists.items() for i in range(n or 0)]

    def measure(self, table: pa.Table, where: str) -> None:
        """Fix the width of each list column not fixed yet, from ``table`` when it has
        rows (or from a fixed-size list type)."""
        for name, n in self.lists.items():
            column = table.column(name)
            if n is None and (table.num_rows or pa.types.is_fixed_size_list(column.type)):
                self.lists[name] = _list_width(column, name, where)

    def rows(self, table: pa.Table, where: str) -> np.ndarray:
        if sorted(table.column_names) != sorted(self.scalars + list(self.lists)):
            raise DataError(f"to_npy({where!r}): a partition has columns {table.column_names}, "
                            f"the first had {self.scalars + list(self.lists)}")
        self.measure(table, where)
        out = np.empty((table.num_rows, self.width), dtype=self.dtype)
        for j, name in enumerate(self.scalars):
            column = table.column(name)
            _refuse_nulls(column, name, where)
            out[:, j] = column.to_numpy()
        j = len(self.scalars)
        for name, n in self.lists.items():
            if not table.num_rows:
                continue  # nothing to write; its width may not be known yet
            assert n is not None  # measured above: the table has rows
            column = table.column(name)
            width = _list_width(column, name, where)
            if width != n:
                raise DataError(f"to_npy({where!r}): list column {name!r} has {width} values per row "
                                f"in one partition and {n} in an earlier one; every row must have "
                                "one length")
            values = pa.chunked_array([pc.list_flatten(c) for c in column.chunks], list_value_type(column.type))
            _refuse_nulls(values, name, where)
            out[:, j:j + n] = values.to_numpy().reshape(table.num_rows, n)
            j += n
        return out


def _is_text(t: pa.DataType) -> bool:
    if pa.types.is_dictionary(t):
        t = t.value_type
    return (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)
            or pa.types.is_binary(t) or pa.types.is_large_binary(t))


def _numpy_dtype(t: pa.DataType, name: str, where: str) -> np.dtype:
    try:
        return np.dtype(t.to_pandas_dtype())
    except (NotImplementedError, TypeError) as exc:
        raise SchemaError(f"to_npy({where!r}): column {name!r} of type {t} has no numpy dtype") from exc


def _list_width(column: pa.ChunkedArray, name: str, where: str) -> int:
    if pa.types.is_fixed_size_list(column.type):
        return int(column.type.list_size)
    lengths = pc.list_value_length(column)
    if lengths.null_count:
        raise DataError(f"to_npy({where!r}): list column {name!r} has null rows; a .npy array "
                        "holds no nulls", hint="fill them in the workflow (ops.FillMissing)")
    bounds = pc.min_max(lengths).as_py()
    if bounds["min"] != bounds["max"]:
        raise DataError(
            f"to_npy({where!r}): list column {name!r} is ragged (rows of {bounds['min']} to "
            f"{bounds['max']} values); to_npy writes a list column as one array column per "
            "position, so every row must have one length",
            hint="pad or cut the lists to one length (ops.ListSlice(n, pad=True)), or leave the column out")
    return int(bounds["min"] or 0)


def _refuse_nulls(values: pa.ChunkedArray, name: str, where: str) -> None:
    nulls = values.null_count
    if nulls:
        raise DataError(f"to_npy({where!r}): column {name!r} has {nulls} null value(s); a .npy "
                        "array holds no nulls (Merlin refuses them too)",
                        hint="fill them in the workflow (ops.FillMissing), or drop the rows (ops.Dropna)")


def write_npy(read_piece: Callable[[Any], pa.Table], pieces: Sequence[Any], output_path: Any,
              append: bool = False) -> str:
    """Write the tables ``read_piece(p)`` of ``pieces`` as one 2-D ``.npy`` file (layout:
    the module's docstring) and return its path (``.npy`` added when missing, as
    ``np.save`` does). ``append=True`` adds the rows to an existing file of the same
    columns' count and dtype (a new file when there is none), as Merlin's
    ``to_npy(append=True)`` does."""
    path = os.fspath(output_path)
    if "://" in path:
        raise ValueError(f"to_npy writes a local file, got {path!r}; export with to_parquet for "
                         "an object store")
    if not path.endswith(".npy"):
        path += ".npy"
    folder, name = os.path.split(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"to_npy({path!r}): folder {folder!r} does not exist")
    raw = os.path.join(folder, f".{name}.tmp-{uuid.uuid4().hex[:12]}.raw")
    tmp = raw[:-4]
    layout: _Layout | None = None
    total = 0
    try:
        with open(raw, "wb") as f:
            for piece in pieces:
                table = read_piece(piece)
                if layout is None:
                    layout = _Layout(table, path)
                f.write(np.ascontiguousarray(layout.rows(table, path)).tobytes())
                total += table.num_rows
        if layout is None:
            raise DataError(f"to_npy({path!r}): the dataset has no partitions")
        # writers of one file take turns from reading the old rows to the rename: two
        # appenders at once would each copy the same old file, and the later rename
        # would drop the other's rows
        with exclusive(os.path.join(folder, f".{name}.lock")):
            old_rows = _existing_rows(path, layout) if append and os.path.exists(path) else 0
            with open(tmp, "wb") as out:
                header = {"descr": np.lib.format.dtype_to_descr(layout.dtype), "fortran_order": False,
                          "shape": (old_rows + total, layout.width)}
                np.lib.format.write_array_header_2_0(out, header)
                if old_rows:
                    with open(path, "rb") as old:
                        _read_header(old)
                        shutil.copyfileobj(old, out)
                with open(raw, "rb") as f:
                    shutil.copyfileobj(f, out)
            os.replace(tmp, path)
    finally:
        for leftover in (raw, tmp):
            if os.path.exists(leftover):
                os.remove(leftover)
    return path


def _read_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    if version == (2, 0):
        return np.lib.format.read_array_header_2_0(f)
    raise ValueError(f".npy format version {version} (1.0 or 2.0 expected)")


def _existing_rows(path: str, layout: _Layout) -> int:
    """Rows of the ``.npy`` file ``to_npy(append=True)`` adds to, checked against ``layout``."""
    with open(path, "rb") as f:
        try:
            shape, fortran, dtype = _read_header(f)
        except ValueError as exc:
            raise DataError(f"to_npy({path!r}, append=True): the file is not a .npy array: {exc}") from exc
    if len(shape) != 2 or shape[1] != layout.width or dtype != layout.dtype or fortran:
        raise DataError(
            f"to_npy({path!r}, append=True): the file holds a {dtype} array of shape {shape}; the rows "
            f"to append are {layout.dtype} with {layout.width} columns ({layout.names()})",
            hint="append to a file written from the same columns, or pass append=False to replace it")
    return int(shape[0])

"""Reading row groups into arrays: one piece of a row group in, its selected
columns out, numbers as numpy and lists as plain arrow lists.

:class:`RowGroupReader` knows, per file, which of the columns to read it holds and
whether its types need converting to the Dataset's unified ones; it reads a row
group whole, or in slices into buffers allocated up front when it is large
(:meth:`RowGroupReader._read_batched`), keeps only the Dataset's own rows (splits,
filters), applies the loader's online ``transforms``, checks nulls and
fixed-length shapes (every error names the file, the row group and the column),
and cuts the piece of the row group the epoch plan gives this rank.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabstream.core.dtypes import is_list_type
from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import Schema
from tabstream.loaders import plan
from tabstream.loaders.layout import Layout, ListGatherer, column_layout, numbers, take_lists
from tabstream.loaders.memory import Recycler, decoded_sizes, empty, permutation, sorted_copy
from tabstream.loaders.source import ParquetSource

__all__ = ["RowGroupReader"]

# Row groups larger than this (decoded) are read in slices of about _READ_BATCH_BYTES
# into buffers allocated up front (see RowGroupReader._read_batched). Slices of 16 MiB
# decoded into blocks that arrow's allocator hands back to the system once freed,
# so each slice touched fresh pages again (15-26k page faults per 250k-row
# multi-hot epoch against 8-10k with 1-2 MiB slices).
_WHOLE_READ_BYTES = 32 * 2**20
_READ_BATCH_BYTES = 2 * 2**20


def _fixed_dense(arr: pa.Array, shape: tuple[int, ...], name: str, where: str,
                 first_row: int = 0) -> np.ndarray:
    """A fixed-length list column as a dense ``(rows, *shape)`` array: the values
    buffer reshaped, after checking (vectorized) that every row has that shape.
    ``arr`` holds the rows from ``first_row`` on of ``where`` (for the messages)."""
    if arr.null_count:
        row = first_row + int(np.flatnonzero(numbers(arr.is_null()))[0])
        raise DataError(f"column {name!r} is a fixed-length list of shape {shape} but row {row} "
                        f"of {where} is null; fill it before export or declare it ragged")
    rows = len(arr)
    level = arr
    for depth, size in enumerate(shape):
        if pa.types.is_fixed_size_list(level.type):
            level = level.flatten()  # honours the array's offset
            continue
        offsets = numbers(level.offsets)
        # arrow's kernels, not np.diff: their temporaries come from arrow's pool
        # (see empty), and this runs on every row group read
        lengths = pc.list_value_length(level)
        bad = pc.not_equal(lengths, pa.scalar(size, lengths.type))
        if pc.any(bad).as_py():
            at = pc.index(bad, True).as_py()
            kind = "list" if depth == 0 else "inner list"
            first = first_row * int(np.prod(shape[:depth], dtype=np.int64))
            raise DataError(
                f"column {name!r}: the schema says every {kind} holds {size} values "
                f"(value_count min == max, or shape), but {kind} {first + at} of {where} "
                f"holds {lengths[at].as_py()} ({pc.sum(bad).as_py()} such); fix the schema or "
                "the data"
            )
        level = level.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        if level.null_count and depth + 1 < len(shape):
            raise DataError(f"column {name!r} has null inner lists in {where}; a fixed-length "
                            "list of lists cannot hold them")
    if level.null_count and not pa.types.is_floating(level.type):
        raise DataError(
            f"column {name!r} has {level.null_count} null values in {where}; only float "
            "columns may hold nulls (as NaN): fill them before export (e.g. ops.FillMissing)"
        )
    return numbers(level).reshape((rows, *shape))

def _plain_lists(arr: pa.Array) -> pa.Array:
    """A (possibly nested, fixed-size or large) list array as ``list`` arrays at
    every level, null lists made empty: a null list holds no values."""
    if arr.null_count:
        arr = pc.fill_null(arr, pa.scalar([], arr.type))
    child = arr.values if not pa.types.is_fixed_size_list(arr.type) else arr.flatten()
    if is_list_type(child.type):
        if pa.types.is_fixed_size_list(arr.type):
            offsets = pa.array(np.arange(len(arr) + 1, dtype=np.int32) * arr.type.list_size)
        else:
            offsets = arr.offsets
            start = offsets[0].as_py()
            if start:
                child = child.slice(start, offsets[-1].as_py() - start)
                offsets = pc.subtract(offsets, start)
            else:
                child = child.slice(0, offsets[-1].as_py())
        child = _plain_lists(child)
        kind = pa.LargeListArray if offsets.type == pa.int64() else pa.ListArray
        return kind.from_arrays(offsets, child)
    if pa.types.is_fixed_size_list(arr.type) or pa.types.is_large_list(arr.type):
        return arr.cast(pa.list_(arr.type.value_type))
    return arr


class RowGroupReader:
    """Reads pieces of the row groups of ``source`` as the columns ``columns`` (their
    ``schema``): from the files when ``transforms`` is None, else the workflow's
    input columns, transformed as each row group is read. ``layouts`` says how each
    column is delivered (from its type after ``transforms``, and its schema); a
    piece smaller than its row group takes the rows the epoch plan gives it, in
    the epoch's order when ``shuffle`` (from ``seed``)."""

    def __init__(self, source: ParquetSource, columns: Sequence[str], schema: Schema,
                 transforms: Any, *, shuffle: bool, seed: int) -> None:
        self.source = source
        self.columns = list(columns)
        self.transforms = transforms
        self.shuffle = shuffle
        self.seed = seed
        # The columns read from the files: the selected ones, or the workflow's inputs.
        read = self.columns if transforms is None else list(transforms.input_columns)
        source.check_columns(read)
        self._target = pa.schema([pa.field(n, source.arrow_types[n]) for n in read])
        # Per file, the columns to read it holds (the same list object when all).
        self._present: list[list[str]] = []
        self._conforms: list[bool] = []  # whether a file's row groups need _conform
        for i in range(len(source.files)):
            held = source.file_types(i)
            cols = [n for n in read if n in held]
            self._present.append(read if len(cols) == len(read) else cols)
            self._conforms.append(len(cols) < len(read) or any(
                held[n] != source.arrow_types[n] for n in cols))
        types = source.arrow_types if transforms is None else self._transformed_types()
        self.layouts: dict[str, Layout] = {
            n: column_layout(n, types[n], schema[n].properties) for n in self.columns}
        self._sizes: list[tuple[float, float]] | None = None

    def unit_sizes(self) -> list[tuple[float, float]]:
        """Per unit (row group): the decoded bytes of the columns read, and those of
        the largest of them (see :func:`tabstream.loaders.memory.decoded_sizes`)."""
        if self._sizes is None:
            self._sizes = decoded_sizes(self.source, self._present)
        return self._sizes

    def unit_bytes(self) -> list[float]:
        """Decoded bytes of the columns read, per unit (row group)."""
        return [total for total, _ in self.unit_sizes()]

    def _transformed_types(self) -> dict[str, pa.DataType]:
        """The arrow types the workflow outputs, from transforming an empty table of
        the dataset's input types (no data read)."""
        assert self.transforms is not None
        empty = self._target.empty_table()
        try:
            out = self.transforms.transform_table(empty)
        except Exception as exc:
            raise DataError(f"the loader's transforms failed on an empty table of the "
                            f"dataset's columns {self._target.names}: {exc}") from exc
        types = {f.name: f.type for f in out.schema}
        missing = [n for n in self.columns if n not in types]
        if missing:
            raise SchemaError(f"the workflow's output schema lists {missing} but its transform "
                              f"does not produce them; it produces {list(types)}")
        return types

    @functools.cached_property
    def _max_rows(self) -> int:
        """The most rows a row group holds."""
        return max(u.stored_rows for u in self.source.units)

    def batch_rows(self, unit_index: int) -> int:
        """Rows per read for a large row group, 0 to read it whole (see :meth:`_read_batched`).
        Row groups that need converting, filtering or transforming are read whole."""
        unit = self.source.units[unit_index]
        total = self.unit_sizes()[unit_index][0]
        if (total <= _WHOLE_READ_BYTES or self._conforms[unit.file] or unit.mask is not None
                or self.transforms is not None or not self._present[unit.file]):
            return 0
        return max(1, int(unit.stored_rows * _READ_BATCH_BYTES / total))

    def _open(self, unit: Any, path: str) -> pq.ParquetFile:
        try:
            return self.source.open(unit.file)
        except FileNotFoundError:
            raise FileNotFoundError(f"parquet file not found: {path!r}") from None
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc

    def _read_whole(self, unit: Any, path: str, use_threads: bool = True) -> dict[str, Any]:
        present = self._present[unit.file]
        parquet = self._open(unit, path)
        try:
            table = parquet.read_row_group(unit.row_group, columns=present,
                                           use_threads=use_threads)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc
        if table.num_rows != unit.stored_rows and present:
            raise DataError(f"row group {unit.row_group} of {path!r} has {table.num_rows} rows, "
                             f"its footer says {unit.stored_rows}: the file is corrupt")
        if self._conforms[unit.file]:
            table = self._conform(table, unit, path)
        keep = unit.keep()
        if keep is not None:  # a split or filtered Dataset: only its own rows
            table = table.filter(pa.array(keep))
        if self.transforms is not None:
            table = self._transform(table, unit.row_group, path)
        return {name: self._column(name, table.column(name), unit, path) for name in self.columns}

    def _read_batched(self, unit: Any, path: str, batch_rows: int,
                      recycler: Recycler | None = None,
                      use_threads: bool = True) -> dict[str, Any]:
        """A large row group read ``batch_rows`` at a time, its numbers copied into
        one buffer per column allocated up front (list columns gathered into pooled
        buffers as the slices come, see ListGatherer).

        Read whole, parquet decodes a column into buffers that grow by doubling,
        so a 130 MB multi-hot column touches several times its size in fresh pages,
        and fresh pages are what the first epoch mostly pays for (the kernel zeroes
        each one). Read in slices, the slices' memory is reused from one to the
        next and only the final buffers are new."""
        rows = unit.stored_rows
        dense: dict[str, np.ndarray] = {}
        lists: dict[str, ListGatherer] = {}
        at = 0
        parquet = self._open(unit, path)
        try:
            batches = parquet.iter_batches(
                batch_size=batch_rows, row_groups=[unit.row_group],
                columns=self._present[unit.file], use_threads=use_threads)
            for batch in batches:
                n = batch.num_rows
                if at + n > rows:
                    break
                for name in self.columns:
                    col = self._column(name, batch.column(name), unit, path, at)
                    if isinstance(col, np.ndarray):
                        out = dense.get(name)
                        if out is None:
                            shape = (rows, *col.shape[1:])
                            row_bytes = col.itemsize * int(np.prod(shape[1:], dtype=np.int64))
                            out = dense[name] = (
                                recycler.empty(shape, col.dtype, self._max_rows * row_bytes)
                                if recycler is not None
                                else empty(rows * int(np.prod(shape[1:], dtype=np.int64)),
                                            col.dtype).reshape(shape))
                        out[at:at + n] = col
                    else:
                        gatherer = lists.get(name)
                        if gatherer is None:
                            gatherer = lists[name] = ListGatherer(
                                recycler.lists if recycler is not None else None, rows)
                        gatherer.add(col)  # copied now: the slice goes (see ListGatherer)
                at += n
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"cannot read row group {unit.row_group} of {path!r}: {exc}") from exc
        if at != rows:
            raise DataError(f"row group {unit.row_group} of {path!r} has a different number of "
                            f"rows than its footer says ({rows}): the file is corrupt")
        out_cols: dict[str, Any] = dict(dense)
        for name, gatherer in lists.items():
            out_cols[name] = gatherer.finish()
        return {name: out_cols[name] for name in self.columns}

    def _column(self, name: str, col: pa.Array | pa.ChunkedArray, unit: Any, path: str,
                first_row: int = 0) -> Any:
        """One column of a row group (or of rows from ``first_row`` on) in the form
        batches are cut from: numpy for numbers and fixed-length lists, plain arrow
        lists for ragged ones; nulls checked."""
        layout = self.layouts[name]
        if isinstance(col, pa.ChunkedArray) and (layout.depth or layout.fixed is not None):
            col = col.combine_chunks()
        if layout.fixed is not None:
            return _fixed_dense(col, layout.fixed, name,
                                f"row group {unit.row_group} of {path!r}", first_row)
        if layout.depth:
            arr = _plain_lists(col)
            leaf = arr.values if layout.depth == 1 else arr.values.values
            self._check_nulls(name, leaf, path, unit.row_group)
            return arr
        self._check_nulls(name, col, path, unit.row_group)
        return numbers(col)

    def read_piece(self, piece: plan.Piece, epoch: int,
                    recycler: Recycler | None = None,
                    use_threads: bool = True) -> dict[str, Any]:
        """One piece's rows, column by column. ``use_threads=False`` decodes in the
        calling thread instead of arrow's CPU pool: for concurrent reads (see
        :func:`tabstream.loaders.threads.read_threads`). That pool is shared by the whole process and sized
        from ``OMP_NUM_THREADS`` when set, so under ``OMP_NUM_THREADS=1`` (usual in
        training jobs, to keep torch's own threads down) two reads through it
        decode one after the other: a multi-hot row group took 150-190 ms instead
        of 80-100 ms, and a second core stayed idle."""
        unit = self.source.units[piece.unit]
        path = self.source.display_name(unit.file)  # for messages
        batch_rows = self.batch_rows(piece.unit)
        out = (self._read_batched(unit, path, batch_rows, recycler, use_threads) if batch_rows
               else self._read_whole(unit, path, use_threads))
        if piece.num_rows == unit.num_rows:
            return out
        if recycler is not None:  # the rows kept are cut or copied out below
            for arr in out.values():
                recycler.forget(arr)
        rows: np.ndarray | slice
        if self.shuffle:
            perm = permutation(plan.unit_rows_rng(self.seed, epoch, piece.unit), unit.num_rows)
            rows = sorted_copy(perm[piece.start:piece.stop])
        else:
            rows = slice(piece.start, piece.stop)
        for name, arr in out.items():
            if isinstance(arr, np.ndarray) and not isinstance(rows, slice):
                out[name] = arr.take(rows, axis=0, mode="clip",
                                     out=empty(len(rows) * (arr.size // max(1, len(arr))),
                                                arr.dtype).reshape((len(rows), *arr.shape[1:])))
            elif isinstance(arr, np.ndarray):
                out[name] = arr[rows]
            elif isinstance(rows, slice):
                out[name] = arr.slice(rows.start, rows.stop - rows.start)
            else:
                out[name] = take_lists(arr, rows)
        return out

    def _transform(self, table: pa.Table, row_group: int, path: str) -> pa.Table:
        rows = table.num_rows
        try:
            table = self.transforms.transform_table(table)
        except Exception as exc:
            raise DataError(f"the loader's transforms failed on row group {row_group} of "
                            f"{path!r}: {exc}") from exc
        if table.num_rows != rows:
            raise DataError(
                f"the loader's transforms turned the {rows} rows of row group {row_group} of "
                f"{path!r} into {table.num_rows}; online transforms must keep every row (the "
                "plan gives every rank equal batches from the row counts): export with "
                "workflow.transform(ds).to_parquet(...) and load that instead"
            )
        return table

    def _conform(self, table: pa.Table, unit: Any, path: str) -> pa.Table:
        """One file's row group in the Dataset's unified types; a column the file
        lacks is null (NaN for floats; an error below for other types)."""
        arrays = [table.column(f.name) if f.name in table.column_names
                  else pa.nulls(unit.stored_rows, f.type) for f in self._target]
        try:
            return pa.Table.from_arrays(arrays, schema=None, names=self._target.names).cast(self._target)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise DataError(f"row group {unit.row_group} of {path!r}: cannot convert to the "
                            f"dataset's types {self._target}: {exc}") from exc

    @staticmethod
    def _check_nulls(name: str, arr: Any, path: str, row_group: int) -> None:
        if arr.null_count and not pa.types.is_floating(arr.type):
            raise DataError(
                f"column {name!r} has {arr.null_count} nulls in row group {row_group} of "
                f"{path!r}; only float columns may hold nulls (as NaN): fill them before "
                "export (e.g. ops.FillMissing)"
            )

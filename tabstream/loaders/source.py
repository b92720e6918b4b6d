"""The rows a loader reads: a ``tabstream.Dataset``'s own fragments.

:func:`open_source` takes a ``tabstream.Dataset`` or anything a Dataset accepts (an
export folder, a glob, one file, a list of files, on any fsspec filesystem; turned
into ``Dataset(..., engine="parquet")``) and lists the Dataset's row groups with the
rows of each that belong to it. A split or filtered Dataset thus gives only its own
rows: ``Loader(train)`` after ``train, valid = ds.split([0.8, 0.2])`` never sees a
validation row. File discovery, the ``_manifest.json`` check and the unification of
the files' schemas are the Dataset's; nothing is resolved twice.

Counting the rows a split keeps costs no I/O for a random split (the draws come
from the split's generator alone); a value split or ``filters=`` reads just the
columns it tests, for all partitions concurrently, once, when the loader is built.

An in-memory Dataset (``Dataset(pandas_df)`` or a pyarrow Table), as
merlin-dataloader users pass it, is written once, its own rows only (split or
filtered), to parquet in memory (fsspec's ``memory://`` filesystem; one row group
per partition of the Dataset's ``part_size``), with the Dataset's schema, and read
from there like an export: the same shuffle, sharding and batches. That copy is
compressed parquet, deleted when the loader goes away. CSV and dask Datasets are
still written with ``to_parquet`` first: their rows need not fit in memory.
"""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from tabstream.core.dtypes import is_list_type
from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema

__all__ = ["ParquetSource", "Unit", "as_dataset", "open_source"]


@dataclass(frozen=True, eq=False)
class Unit:
    """One row group: the unit of reading and of the epoch permutation.

    ``num_rows`` are the rows delivered from it, ``stored_rows`` the rows the file
    holds; ``mask`` (bits packed with ``numpy.packbits``) says which, when the
    Dataset keeps only some."""

    file: int
    row_group: int
    num_rows: int
    stored_rows: int = -1
    mask: np.ndarray | None = None

    def keep(self) -> np.ndarray | None:
        """The boolean mask over the stored rows, ``None`` when all are kept."""
        if self.mask is None:
            return None
        return np.unpackbits(self.mask, count=self.stored_rows).view(bool)


def _arrow_filesystem(fs: Any) -> pafs.FileSystem | None:
    if isinstance(fs, LocalFileSystem):
        return None  # plain paths: pyarrow's own local reader is the fastest
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _numpy_dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype())
    return None


def list_value_type(t: pa.DataType) -> pa.DataType | None:
    """The element type of a list column, ``None`` for a scalar column."""
    return t.value_type if is_list_type(t) else None


def as_dataset(data: Any, storage_options: dict | None = None) -> Any:
    """``data`` as a ``tabstream.Dataset``: itself if it is one, an in-memory Dataset
    over a pandas DataFrame or pyarrow Table, else a parquet Dataset over the path,
    glob, folder or list of files."""
    from tabstream.pipeline.dataset import Dataset
    from tabstream.pipeline.frames import is_pandas_dataframe

    if isinstance(data, Dataset):
        return data
    if isinstance(data, pa.Table) or is_pandas_dataframe(data):
        return Dataset(data)  # in memory (see open_source)
    if isinstance(data, (str, os.PathLike)):
        return Dataset(os.fspath(data), engine="parquet", storage_options=storage_options)
    if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray)):
        if len(data) == 0:
            raise DataError("the dataset is empty: an empty list of files was given")
        return Dataset([os.fspath(p) for p in data], engine="parquet",
                       storage_options=storage_options)
    raise TypeError(
        "a loader reads a tabstream.Dataset, a pandas DataFrame, a pyarrow Table, a "
        f"directory, a glob, a parquet file or a list of files; got {type(data).__name__}"
    )


@dataclass
class ParquetSource:
    """A parquet Dataset's row groups, each with the rows of it the Dataset keeps."""

    files: list[str]
    fs: Any
    schema: Schema
    metadata: list[pq.FileMetaData]
    arrow_types: dict[str, pa.DataType]
    units: list[Unit]
    dataset: Any = None
    #: what messages call the files, when not their paths (an in-memory Dataset's copy)
    shown_as: str | None = None

    @property
    def num_rows(self) -> int:
        return sum(u.num_rows for u in self.units)

    def display_name(self, file: int) -> str:
        """How messages name ``file``: its path, or what an in-memory copy stands for."""
        return self.files[file] if self.shown_as is None else self.shown_as

    def open(self, file: int) -> pq.ParquetFile:
        """Open one file, reusing the footer read when planning."""
        return pq.ParquetFile(self.files[file], metadata=self.metadata[file],
                              filesystem=_arrow_filesystem(self.fs))

    def file_types(self, file: int) -> dict[str, pa.DataType]:
        """The arrow types of the columns one file holds (from its footer, once)."""
        cache = self.__dict__.setdefault("_file_types", {})
        types = cache.get(file)
        if types is None:
            types = cache[file] = {f.name: f.type for f in self.metadata[file].schema.to_arrow_schema()}
        return types

    def check_columns(self, columns: Sequence[str]) -> None:
        """Record the (unified) arrow type of each column in ``columns`` and check it
        against the stored schema (``_schema.json``) when there is one."""
        arrow = self.dataset.arrow_schema if self.dataset is not None else None
        types = ({f.name: f.type for f in arrow} if arrow is not None
                 else self.file_types(0))
        for name in columns:
            if name not in types:
                raise SchemaError(f"column {name!r} is not in the files; columns: {list(types)}")
        stored = self.dataset.stored_schema if self.dataset is not None else None
        for name in columns:
            if stored is not None and name in stored:
                self._check_against_schema(name, stored[name])
        self.arrow_types = {name: types[name] for name in columns}

    def _check_against_schema(self, name: str, col: ColumnSchema) -> None:
        try:
            schema_dtype = np.dtype(col.dtype)
        except TypeError:
            schema_dtype = None  # "unknown", "string", ...: nothing numeric to compare
        for i, path in enumerate(self.files):
            t = self.file_types(i).get(name)
            if t is None:
                continue  # null in this file (schemas unified)
            value_type = list_value_type(t)
            if col.is_list != (value_type is not None):
                kind = "a list" if value_type is not None else "not a list"
                raise SchemaError(
                    f"schema mismatch: column {name!r} is {kind} ({t}) in {path!r} but the "
                    f"schema says is_list={col.is_list}"
                )
            file_dtype = _numpy_dtype(value_type if value_type is not None else t)
            if schema_dtype is not None and file_dtype is not None and file_dtype != schema_dtype:
                raise SchemaError(
                    f"schema mismatch: column {name!r} is {file_dtype} in {path!r} but the "
                    f"schema says {col.dtype}"
                )


# in-memory Datasets written for a loader: one folder each under this prefix
_MEMORY_ROOT = "memory://tabstream-loader-frames"
_MEMORY_FOLDERS = itertools.count()


def _in_memory_parquet(ds: Any) -> tuple[Any, Any]:
    """An in-memory Dataset's rows as a parquet Dataset in fsspec's memory filesystem
    (see the module docstring), and the function that deletes that copy."""
    import fsspec

    from tabstream.pipeline.dataset import Dataset

    fs = fsspec.filesystem("memory")
    folder = f"{_MEMORY_ROOT}/{os.getpid()}-{next(_MEMORY_FOLDERS)}"
    path = f"{folder}/part.0.parquet"
    schema = ds.arrow_schema
    rows = 0
    try:
        with fs.open(path, "wb") as out, pq.ParquetWriter(out, schema) as writer:
            for piece in ds.pieces:
                table = ds.read_piece(piece)
                if table.num_rows:
                    writer.write_table(table.cast(schema), row_group_size=table.num_rows)
                    rows += table.num_rows
    except (pa.ArrowException, ValueError, TypeError) as exc:
        fs.rm(folder, recursive=True)
        raise DataError(f"the in-memory Dataset could not be laid out as parquet for the "
                        f"loader ({exc}); columns: {schema}") from exc
    if not rows:
        fs.rm(folder, recursive=True)
        what = " that this split or filter keeps" if ds.filtered else ""
        raise DataError(f"the dataset is empty: the in-memory Dataset holds no rows{what}")
    return (Dataset(path, engine="parquet", schema=ds.schema),
            functools.partial(fs.rm, folder, recursive=True))


def open_source(data: Any, storage_options: dict | None = None) -> ParquetSource:
    """The row groups of ``data`` (a Dataset or what :func:`as_dataset` takes) and,
    for a split or filtered Dataset, the rows of each it keeps (see module doc)."""
    ds = as_dataset(data, storage_options)
    cleanup = None
    if ds.engine == "dataframe":
        ds, cleanup = _in_memory_parquet(ds)
    if ds.engine != "parquet":
        raise DataError(
            f"loaders read parquet files or in-memory data, and this Dataset's engine is "
            f"{ds.engine!r}: write it with to_parquet(...) first and load that folder"
        )
    fragments = ds.fragments()  # with a split or filter: the rows of each row group it keeps
    hive = sorted({k for fragment in fragments for k in fragment.partition_values})
    if hive:
        raise DataError(
            f"{ds.files[0]}: the dataset is hive-partitioned (col=value folders for {hive}); "
            "loaders read the files' row groups as stored, where those columns are not: "
            "export for training without partition_on, or load one partition's folder")
    fs = ds.fs
    files = [fs._strip_protocol(str(f.path)) for f in fragments]  # Datasets keep URLs
    metadata = [f.metadata for f in fragments]
    units = [Unit(i, rg.index, rg.num_rows, rg.stored_rows,
                  None if rg.mask is None else np.packbits(rg.mask))
             for i, fragment in enumerate(fragments) for rg in fragment.row_groups if rg.num_rows]
    if not units:
        what = " that this split or filter keeps" if ds.filtered else ""
        raise DataError(f"the dataset is empty: its {len(files)} file(s) hold no rows{what} "
                        f"(first: {files[0]!r})")
    source = ParquetSource(files, fs, ds.schema, metadata, {}, units, ds,
                           None if cleanup is None else "the in-memory Dataset")
    if cleanup is not None:
        weakref.finalize(source, cleanup)
    return source

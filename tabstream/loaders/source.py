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
"""

from __future__ import annotations

import os
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
    """``data`` as a ``tabstream.Dataset``: itself if it is one, else a parquet
    Dataset over the path, glob, folder or list of files."""
    from tabstream.pipeline.dataset import Dataset

    if isinstance(data, Dataset):
        return data
    if isinstance(data, (str, os.PathLike)):
        return Dataset(os.fspath(data), engine="parquet", storage_options=storage_options)
    if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray)):
        if len(data) == 0:
            raise DataError("the dataset is empty: an empty list of files was given")
        return Dataset([os.fspath(p) for p in data], engine="parquet",
                       storage_options=storage_options)
    raise TypeError(
        "a loader reads a tabstream.Dataset, a directory, a glob, a parquet file or a list "
        f"of files; got {type(data).__name__}"
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

    @property
    def num_rows(self) -> int:
        return sum(u.num_rows for u in self.units)

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


def open_source(data: Any, storage_options: dict | None = None) -> ParquetSource:
    """The row groups of ``data`` (a Dataset or what :func:`as_dataset` takes) and,
    for a split or filtered Dataset, the rows of each it keeps (see module doc)."""
    ds = as_dataset(data, storage_options)
    if ds.engine != "parquet":
        raise DataError(
            f"loaders read exported parquet, and this Dataset's engine is {ds.engine!r}: "
            "write it with to_parquet(...) first and load that folder"
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
    return ParquetSource(files, fs, ds.schema, metadata, {}, units, ds)

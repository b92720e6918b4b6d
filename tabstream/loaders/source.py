"""Finding and checking the parquet files a loader reads.

:func:`open_source` accepts a ``tabstream.Dataset`` (anything with ``.files``,
``.fs`` and ``.schema``), a directory written by ``to_parquet``, a glob, one file,
or a list of files, on any fsspec filesystem. It reads every file's footer once,
up front, so that a missing or corrupt file, a column missing from one file, or
files that disagree on a column's type fail before the first batch, with the
file and column named.
"""

from __future__ import annotations

import json
import os
import posixpath
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from tabstream.errors import DataError, SchemaError
from tabstream.pipeline.dtypes import arrow_type_to_dtype, is_list_type
from tabstream.pipeline.schema import ColumnSchema, Schema

__all__ = ["ParquetSource", "Unit", "open_source"]

SCHEMA_FILE = "schema.json"
MANIFEST_FILE = "_manifest.json"


@dataclass(frozen=True)
class Unit:
    """One row group: the unit of reading and of the epoch permutation."""

    file: int
    row_group: int
    num_rows: int


def _is_glob(path: str) -> bool:
    return any(ch in path for ch in "*?[")


def _data_file(path: str) -> bool:
    name = posixpath.basename(path)
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def _resolve_paths(data: Any, storage_options: dict | None) -> tuple[list[str], Any, str | None]:
    """Files, filesystem and the folder that may hold schema.json."""
    opts = storage_options or {}
    if isinstance(data, (str, os.PathLike)):
        url = os.fspath(data)
        fs, path = fsspec.core.url_to_fs(url, **opts)
        if _is_glob(path):
            files = sorted(p for p in fs.glob(path) if fs.isfile(p))
            if not files:
                raise FileNotFoundError(f"no files match {url!r}")
            return files, fs, posixpath.dirname(files[0])
        if fs.isdir(path):
            return _files_in_dir(fs, path, url), fs, path
        if not fs.exists(path):
            raise FileNotFoundError(f"no such file or directory: {url!r}")
        return [path], fs, posixpath.dirname(path)
    if isinstance(data, Sequence) and not isinstance(data, (bytes, bytearray)):
        if len(data) == 0:
            raise DataError("the dataset is empty: an empty list of files was given")
        urls = [os.fspath(p) for p in data]
        fs, _ = fsspec.core.url_to_fs(urls[0], **opts)
        files = [fsspec.core.url_to_fs(u, **opts)[1] for u in urls]
        folders = {posixpath.dirname(f) for f in files}
        return files, fs, folders.pop() if len(folders) == 1 else None
    raise TypeError(
        "a loader reads a tabstream.Dataset, a directory, a glob, a parquet file or a list "
        f"of files; got {type(data).__name__}"
    )


def _files_in_dir(fs: Any, path: str, url: str) -> list[str]:
    manifest = posixpath.join(path, MANIFEST_FILE)
    if fs.exists(manifest):
        with fs.open(manifest, "r") as f:
            entries = json.load(f)["files"]
        return [posixpath.join(path, e["path"]) for e in entries]
    files = sorted(p for p in fs.find(path) if _data_file(p))
    if not files:
        raise DataError(f"the dataset is empty: no .parquet files in {url!r}")
    return files


def _arrow_filesystem(fs: Any) -> pafs.FileSystem | None:
    if isinstance(fs, LocalFileSystem):
        return None  # plain paths: pyarrow's own local reader is the fastest
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


def _read_footer(path: str, arrow_fs: pafs.FileSystem | None) -> pq.FileMetaData:
    try:
        return pq.ParquetFile(path, filesystem=arrow_fs).metadata
    except FileNotFoundError:
        raise FileNotFoundError(f"parquet file not found: {path!r}") from None
    except (pa.ArrowException, OSError) as exc:
        if isinstance(exc, FileNotFoundError) or "No such file" in str(exc):
            raise FileNotFoundError(f"parquet file not found: {path!r}") from exc
        raise DataError(f"{path!r} is not a readable parquet file: {exc}") from exc


def _numpy_dtype(t: pa.DataType) -> np.dtype | None:
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return np.dtype(t.to_pandas_dtype())
    return None


def list_value_type(t: pa.DataType) -> pa.DataType | None:
    """The element type of a list column, ``None`` for a scalar column."""
    return t.value_type if is_list_type(t) else None


def column_from_arrow(field: pa.Field) -> ColumnSchema:
    """A schema entry inferred from a parquet field (no tags: nothing to go on)."""
    dtype, is_list = arrow_type_to_dtype(field.type)
    return ColumnSchema(field.name, dtype, is_list=is_list, is_ragged=is_list)


@dataclass
class ParquetSource:
    """Checked parquet files: their row groups, arrow types and tabstream schema."""

    files: list[str]
    fs: Any
    schema: Schema
    metadata: list[pq.FileMetaData]
    arrow_types: dict[str, pa.DataType]
    units: list[Unit]

    @property
    def num_rows(self) -> int:
        return sum(u.num_rows for u in self.units)

    def open(self, file: int) -> pq.ParquetFile:
        """Open one file, reusing the footer read during the checks."""
        return pq.ParquetFile(self.files[file], metadata=self.metadata[file],
                              filesystem=_arrow_filesystem(self.fs))

    def check_columns(self, columns: Sequence[str]) -> None:
        """Every file has every column in ``columns``, with the same type."""
        first = self.files[0]
        reference = {f.name: f.type for f in self.metadata[0].schema.to_arrow_schema()}
        for name in columns:
            if name not in reference:
                raise SchemaError(
                    f"column {name!r} is missing from {first!r}; its columns: {list(reference)}"
                )
        for path, md in zip(self.files[1:], self.metadata[1:], strict=True):
            types = {f.name: f.type for f in md.schema.to_arrow_schema()}
            for name in columns:
                if name not in types:
                    raise SchemaError(
                        f"column {name!r} is missing from {path!r} (present in {first!r}); "
                        f"its columns: {list(types)}"
                    )
                if types[name] != reference[name]:
                    raise SchemaError(
                        f"schema mismatch: column {name!r} is {types[name]} in {path!r} but "
                        f"{reference[name]} in {first!r}; re-export the files with one schema"
                    )
        for name in columns:
            self._check_against_schema(name, reference[name], first)
        self.arrow_types = {name: reference[name] for name in columns}

    def _check_against_schema(self, name: str, t: pa.DataType, path: str) -> None:
        if name not in self.schema:
            return
        col = self.schema[name]
        value_type = list_value_type(t)
        if col.is_list != (value_type is not None):
            kind = "a list" if value_type is not None else "not a list"
            raise SchemaError(
                f"schema mismatch: column {name!r} is {kind} ({t}) in {path!r} but the "
                f"schema says is_list={col.is_list}"
            )
        file_dtype = _numpy_dtype(value_type if value_type is not None else t)
        try:
            schema_dtype = np.dtype(col.dtype)
        except TypeError:
            return  # "unknown", "string", ...: nothing numeric to compare
        if file_dtype is not None and file_dtype != schema_dtype:
            raise SchemaError(
                f"schema mismatch: column {name!r} is {file_dtype} in {path!r} but the schema "
                f"says {col.dtype}"
            )


def open_source(data: Any, storage_options: dict | None = None) -> ParquetSource:
    """Resolve ``data`` to parquet files and read every footer (see module doc)."""
    if hasattr(data, "files") and hasattr(data, "fs") and hasattr(data, "schema"):
        engine = getattr(data, "engine", "parquet")
        if engine != "parquet":
            raise DataError(
                f"loaders read exported parquet, and this Dataset's engine is {engine!r}: "
                "write it with to_parquet(...) first and load that folder"
            )
        fs, schema, folder = data.fs, data.schema, None
        files = [fs._strip_protocol(str(f)) for f in data.files]  # Datasets keep URLs
        if not files:
            raise DataError("the dataset is empty: it has no files")
    else:
        files, fs, folder = _resolve_paths(data, storage_options)
        schema = None
    arrow_fs = _arrow_filesystem(fs)
    if isinstance(fs, LocalFileSystem) or len(files) == 1:
        metadata = [_read_footer(f, arrow_fs) for f in files]
    else:  # remote footers: fetch them concurrently
        with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
            metadata = list(pool.map(lambda f: _read_footer(f, arrow_fs), files))

    if schema is None:
        schema_path = posixpath.join(folder, SCHEMA_FILE) if folder is not None else None
        if schema_path is not None and fs.exists(schema_path):
            with fs.open(schema_path, "r") as f:
                schema = Schema.from_json(f.read())
        else:
            schema = Schema(column_from_arrow(field)
                            for field in metadata[0].schema.to_arrow_schema())

    units = [
        Unit(i, g, md.row_group(g).num_rows)
        for i, md in enumerate(metadata)
        for g in range(md.num_row_groups)
        if md.row_group(g).num_rows > 0
    ]
    if not units:
        raise DataError(f"the dataset is empty: its {len(files)} file(s) hold no rows "
                         f"(first: {files[0]!r})")
    return ParquetSource(files, fs, schema, metadata, {}, units)

"""Lazy, partitioned tabular datasets: parquet, CSV/TSV raw logs, in-memory frames.

A :class:`Dataset` is a list of *pieces* (a few parquet row groups, a byte range of a
CSV file, a slice of a DataFrame) and a function that reads one piece into an Arrow
table. Fitting and exporting run one dask task per piece, so memory is bounded by
``part_size``, never by the dataset.

A Dataset is one set of rows everywhere (fit, export, ``num_rows``, loaders): its
``filters=`` and splits are row masks over each piece's stored rows. Parquet files
whose schemas differ are unified (a column a file lacks is null there). Files of a
tabstream export are checked against its ``_manifest.json``: a deleted, truncated,
replaced or extra file is an error naming it, never a silently different dataset.

Two days of a headerless TSV log, one piece per file here:

>>> import os, tempfile
>>> tmp = tempfile.TemporaryDirectory()
>>> for day in range(2):
...     with open(os.path.join(tmp.name, f"day_{day}.tsv"), "w") as f:
...         _ = f.write(f"1\\t{day}\\tab\\n0\\t\\tcd\\n")
>>> ds = Dataset(os.path.join(tmp.name, "day_*.tsv"), sep="\\t", names=["label", "I1", "C1"],
...              dtypes={"label": "int64", "I1": "int64", "C1": "string"})
>>> ds.npartitions, ds.num_rows, ds.schema.column_names
(2, 4, ['label', 'I1', 'C1'])
>>> ds.to_ddf().compute()
   label    I1  C1
0      1     0  ab
1      0  <NA>  cd
0      1     1  ab
1      0  <NA>  cd
>>> tmp.cleanup()
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import hashlib
import lzma
import mmap
import os
import posixpath
import re
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
from fsspec.core import get_fs_token_paths
from fsspec.utils import glob_translate, read_block

from tabstream import backends
from tabstream.core.dtypes import (
    arrow_to_pandas,
    arrow_type_to_dtype,
    dtype_to_arrow_type,
    is_list_type,
)
from tabstream.core.errors import CacheWarning, DataError, SchemaError
from tabstream.core.jsonfile import loads_json
from tabstream.core.merlin import read_merlin_schema
from tabstream.core.schema import ColumnSchema, Schema
from tabstream.pipeline import stores
from tabstream.pipeline.export_folder import (
    MANIFEST_FILE,
    SCHEMA_KEY,
    check_manifests,
    check_schema_file,
    read_schema_json,
    refuse_unpublished,
)

if TYPE_CHECKING:  # pandas is imported where a frame is made or given, so that a
    import pandas as pd  # Dataset for a loader (parquet in, arrow out) never loads it

__all__ = ["Dataset", "DatasetWarning", "parse_bytes"]

DEFAULT_PART_SIZE = 64 * 2**20
_PARQUET_EXT = (".parquet", ".pq", ".parq")
_CSV_EXT = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz")
_BOM = b"\xef\xbb\xbf"
# Arrow's CSV reader parses a block in chunks of this many bytes. Small chunks keep
# its working buffers in the CPU cache and its allocations reused: a 38 MB block of
# Criteo-like TSV parses in about a third of the CPU time with 2 MB chunks than as one
# 64 MB chunk (measured 105 vs 340 ms); columns come out in ~20 chunks per block.
_CSV_PARSE_BLOCK = 1 << 21
#: most columns a CSV/TSV header line may name (``Dataset(path)`` without ``names=``):
#: a "header" of millions of fields is a data line or a corrupt file, and would cost
#: minutes and gigabytes to plan and parse. Raise it for a file that really is that wide.
MAX_CSV_COLUMNS = 100_000

# Held while a Dataset makes its cache folder (module level: a Dataset is pickled).
_CACHE_DIR_LOCK = threading.Lock()
# What a truncated or corrupt compressed file raises while it is decompressed.
_DECOMPRESS_ERRORS = (EOFError, OSError, zlib.error, lzma.LZMAError)


class DatasetWarning(UserWarning):
    """A Dataset reads its input, but not all of what a user may expect it to: a
    folder's subfolders that are not data were left out, or parquet files whose
    schemas differ were unified (the columns a file lacks are null in its rows)."""


def parse_bytes(size: int | str | None) -> int:
    """``"128MB"`` -> 134217728. Integers pass through."""
    if size is None:
        return DEFAULT_PART_SIZE
    if isinstance(size, (int, np.integer)):
        if size <= 0:
            raise ValueError(f"part_size must be positive, got {size}")
        return int(size)
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?i?b?)\s*", str(size).lower())
    if not m:
        raise ValueError(f"cannot parse part_size {size!r}; expected e.g. 128MB, 1GB or a byte count")
    unit = m.group(2).rstrip("b").rstrip("i")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"part_size must be positive, got {size!r}")
    return value


@dataclass(frozen=True)
class _ParquetPiece:
    path: str
    row_groups: tuple[int, ...]
    num_rows: int
    group_rows: tuple[int, ...] = ()  # rows of each row group, in order


@dataclass(frozen=True)
class _CsvPiece:
    path: str
    offset: int
    length: int | None  # None: the whole file (compressed files cannot be split)


@dataclass(frozen=True)
class _Block:
    """The text of a CSV piece: ``buf[start:end]``, where ``buf`` is a memory map of
    the file (local, uncompressed: read without a copy) or the bytes read. Offsets
    taken and returned by the methods are relative to ``start``."""

    buf: Any  # mmap.mmap or bytes
    start: int
    end: int

    def __len__(self) -> int:
        return self.end - self.start

    def find(self, sub: bytes, pos: int = 0) -> int:
        i = self.buf.find(sub, self.start + pos, self.end)
        return i - self.start if i >= 0 else -1

    def data(self) -> bytes:
        """The text as bytes (a copy of a mapped block: for error messages only)."""
        return self.buf[self.start:self.end]

    def arrow(self) -> pa.Buffer:
        return pa.py_buffer(self.buf).slice(self.start, len(self))

    def first_line(self, limit: int | None = None) -> bytes:
        """The first line, without its newline; at most ``limit`` bytes of it."""
        nl = self.find(b"\n")
        end = self.start + nl if nl >= 0 else self.end
        return self.buf[self.start:end if limit is None else min(end, self.start + limit)]

    def isascii(self) -> bool:
        """Only ASCII bytes (so valid UTF-8): about 1 ms per 38 MB."""
        if not len(self):
            return True
        return int(np.frombuffer(self.buf, dtype=np.uint8, count=len(self), offset=self.start).max()) < 0x80

    def no_lines(self) -> bool:
        """Nothing but line endings (or nothing at all): no rows. A line of empty
        fields (``"\t\t\n"``) is a row of nulls, not nothing."""
        head = self.buf[self.start:min(self.end, self.start + 4096)]
        return not head.strip(b"\r\n") and (len(self) <= 4096 or not self.data().strip(b"\r\n"))


@dataclass(frozen=True)
class _TablePiece:
    start: int
    stop: int


class Dataset:
    """A lazily read, partitioned dataset.

    Parameters
    ----------
    path_or_df:
        A parquet or CSV/TSV file, folder, glob or list of them (local or any fsspec
        URL), a pandas DataFrame, a pyarrow Table or a dask DataFrame (dask-cudf too).
    engine:
        ``"parquet"`` or ``"csv"``; inferred from the file extension when omitted.
    part_size:
        Target in-memory size of one partition (``"64MB"`` by default).
    cpu:
        Which backend's kernels the ops run with (see :mod:`tabstream.backends`):
        ``True`` the arrow (CPU) backend; ``None`` the cudf backend when cudf imports
        and a GPU is present, else arrow; ``False`` cudf, or a
        :class:`~tabstream.core.errors.BackendUnavailableError` naming what is missing.
        The choice is ``backend_name``.
    cache:
        ``"disk"`` keeps each partition, as read, in an Arrow IPC file under
        ``cache_dir`` (a temporary folder removed with the Dataset), so the second
        pass (fit, then export) maps it instead of parsing the raw files again.
        Costs disk space about the size of the data in memory. ``"auto"`` (the
        default) is ``"disk"`` for raw CSV/TSV logs, where parsing is the cost (fit
        + export measured about 0.8x the time of parsing twice); for parquet only
        the partitions a Workflow's fit reads are kept (``read_piece(keep=True)``),
        so the export after the fit maps them instead of decoding parquet again
        (string columns stay dictionary-encoded where the files store them so; the
        Criteo-like benchmark needs about 260 MB per million rows), up to
        ``PARQUET_CACHE_MAX_BYTES`` (a quarter of the memory the process may use: the
        machine's, or a container's limit; at least 1 GiB) per Dataset: when the
        first partition kept, times the number of partitions, would pass it, none is
        kept (a cache larger than the page cache is read back from disk, which costs
        more than decoding parquet; keeping only part of it measured slower than
        keeping none). No cache for in-memory data. In ``"auto"`` a partition that
        cannot be written to the cache (a full disk), or that would leave its disk
        less than a tenth free (at least 2 GiB, at most 10 GiB), is simply read again
        when next needed; a :class:`~tabstream.core.errors.CacheWarning` says so, once
        per Dataset. ``None`` turns caching off.
    filters:
        Keep only the rows that pass, everywhere the Dataset is used (fit, export,
        ``num_rows``, loaders): pyarrow/pandas-style DNF tuples such as
        ``[("day", "<", 7)]`` (a list of lists is an OR of ANDs), or a
        ``pyarrow.compute.Expression``. A row where the filter is null is dropped.
    strict_schema:
        Parquet files whose columns differ are read as one dataset, a column a file
        lacks null in its rows, and a :class:`DatasetWarning` names the columns and
        the files (once per Dataset); ``True`` refuses them instead, with a
        :class:`~tabstream.core.errors.SchemaError` naming a file, the columns it
        lacks and a file that has them.
    **read_kwargs:
        For CSV: ``names`` (column names, required for headerless raw logs),
        ``dtypes`` (name -> dtype), ``sep`` (default ``","``, ``"\\t"`` for .tsv),
        ``header`` (``False`` by default when ``names`` is given), ``block_size``
        (default ``"2MB"``: the bytes the parser takes at a time; a line longer
        than it can hold is an error naming its line and the size that reads it).

    A folder's data are its own files, its hive partition folders (``col=value``)
    and the exports in it (subfolders with a ``_manifest.json``); other subfolders
    are left out with a :class:`DatasetWarning`. On an object store the Dataset
    lists the store as it is now, and an unreachable store or a refused request is
    a :class:`~tabstream.core.errors.DataError` naming the URL (see
    :mod:`tabstream.pipeline.stores`).
    """

    def __init__(
        self,
        path_or_df: Any,
        engine: str | None = None,
        part_size: int | str | None = None,
        storage_options: dict | None = None,
        cpu: bool | None = None,
        schema: Schema | None = None,
        cache: str | None = "auto",
        cache_dir: str | None = None,
        filters: Any = None,
        strict_schema: bool = False,
        **read_kwargs: Any,
    ) -> None:
        if cache not in (None, "disk", "auto"):
            raise ValueError(f"cache must be 'auto', 'disk' or None, got {cache!r}")
        self.cache = cache  # "auto" is resolved once the engine is known, below
        self._cache_dir = cache_dir
        self.part_size = parse_bytes(part_size)
        self.storage_options = dict(storage_options or {})
        #: the backend whose kernels the ops run with on this data (chosen once, here)
        self.backend_name = backends.choose(cpu)
        self.cpu = self.backend_name == "arrow"
        if not isinstance(strict_schema, bool):
            raise TypeError(f"strict_schema must be True or False, got {strict_schema!r}")
        self.strict_schema = strict_schema
        self.read_kwargs = read_kwargs
        self.fs: fsspec.AbstractFileSystem | None = None
        self.files: list[str] = []
        self._table: pa.Table | None = None
        self._ddf = None
        self._stored_schema: Schema | None = None
        self._folders: list[tuple[str, Any]] = []
        self._row_filter: Any = None  # a split's rows (see split / split_by_value)
        self._filter: _ExprFilter | None = None
        self._file_tags: dict[str, str | None] = {}  # remote file -> its ETag when opened

        if _is_pandas_dataframe(path_or_df):
            self.engine = "dataframe"
            self._table = _pandas_to_arrow(path_or_df)
        elif isinstance(path_or_df, pa.Table):
            self.engine = "dataframe"
            self._table = path_or_df
        elif _is_dask_dataframe(path_or_df):
            self.engine = "dask"
            self._ddf = path_or_df
        else:
            with stores.translate_store_errors(_first_path(path_or_df)):
                self._open_files(path_or_df, engine)

        self._cache_auto = cache == "auto"
        self._owner_pid = os.getpid()
        self._kept_bytes = 0  # parquet partitions kept by "auto" (see PARQUET_CACHE_MAX_BYTES)
        self._warned_cache = False  # "auto" said once that it keeps no more partitions
        self._cache_budget: int | None = None  # their budget in bytes, set when the first is read
        if self._cache_auto:
            self.cache = "disk" if self.engine == "csv" else None
        self._planned: list[Any] | None = None  # the pieces, see _pieces
        self._planned_index: dict[Any, int] | None = None
        with stores.translate_store_errors(_first_path(path_or_df)):
            self._arrow_schema = self._plan()
        if schema is None and self.files:
            check_schema_file(self.fs, self.files, self._stored_schema, self._arrow_schema)
        self.schema = self._merge_schema(schema)
        if filters is not None:
            self._filter = _ExprFilter(filters, self._arrow_schema)

    def _open_files(self, path: Any, engine: str | None) -> None:
        """The files of ``path`` as the store holds them now, their format and the
        schema stored beside them. On an object store each file's ETag is kept: a read
        of a file replaced since is refused (see :mod:`tabstream.pipeline.stores`)."""
        self.fs, self.files, self._folders = _expand_paths(path, self.storage_options, engine)
        if not _is_local(self.fs):
            self._file_tags = {f: stores.file_tag(self.fs, f) for f in self.files}
        if not self.files:  # an export folder whose files are all gone
            check_manifests(self.fs, [], self._folders, {})
            raise FileNotFoundError(f"{path!r} holds no data files (no files match)")
        self.engine = engine or _infer_engine(self.files)
        if self.engine not in ("parquet", "csv"):
            raise ValueError(f"engine must be 'parquet' or 'csv', got {self.engine!r}")
        self._stored_schema = (read_schema_json(self.fs, self.files)
                               or (_read_schema_kv(self.fs, self.files) if self.engine == "parquet"
                                   else None)
                               or read_merlin_schema(self.fs, self.files))  # NVTabular exports

    # -- planning -----------------------------------------------------------
    @property
    def _pieces(self) -> list[Any]:
        # Parquet row groups are grouped into pieces on first use: the grouping
        # decodes a sample of the first file (see _parquet_row_bytes), which a loader
        # reading the whole dataset by row groups never needs.
        if self._planned is None:
            self._planned = self._group_parquet()
        return self._planned

    @_pieces.setter
    def _pieces(self, pieces: list[Any]) -> None:
        self._planned = pieces
        self._planned_index = None

    @property
    def _piece_index(self) -> dict[Any, int]:
        if self._planned_index is None:
            self._planned_index = {p: i for i, p in enumerate(self._pieces)}
        return self._planned_index

    @_piece_index.setter
    def _piece_index(self, index: dict[Any, int]) -> None:
        self._planned_index = index

    def _plan(self) -> pa.Schema:
        if self.engine == "dataframe":
            assert self._table is not None
            row_bytes = max(1, self._table.nbytes // max(1, self._table.num_rows))
            step = max(1, self.part_size // row_bytes)
            n = self._table.num_rows
            self._pieces = [
                _TablePiece(i, min(i + step, n)) for i in range(0, n, step)
            ] or [_TablePiece(0, 0)]
            return self._table.schema
        if self.engine == "dask":
            self._pieces = list(range(self._ddf.npartitions))
            meta = self._ddf._meta
            return _frame_to_arrow(meta).schema
        if self.engine == "parquet":
            return self._plan_parquet()
        return self._plan_csv()

    def _plan_parquet(self) -> pa.Schema:
        unified: pa.Schema | None = None
        owners: dict[str, str] = {}  # column -> the first file that has it
        self._file_schemas: dict[str, pa.Schema] = {}
        self._file_metadata: dict[str, pq.FileMetaData] = {}
        footers = _parquet_footers(self.fs, self.files)
        check_manifests(self.fs, self.files, self._folders,
                         {path: md.num_rows for path, (md, _) in zip(self.files, footers, strict=True)})
        if not _is_local(self.fs):
            refuse_unpublished(self.fs, self.files, [schema for _, schema in footers])
        for path, (md, arrow_schema) in zip(self.files, footers, strict=True):
            twice = [name for name, n in collections.Counter(arrow_schema.names).items() if n > 1]
            if twice:
                raise DataError(f"{path}: the file has {len(twice)} column name{'s' if len(twice) > 1 else ''} "
                                f"more than once: {twice}; a Dataset needs distinct column names: "
                                "rewrite the file with each column named once")
            self._file_schemas[path] = arrow_schema
            self._file_metadata[path] = md
            unified = _unify_schemas(unified, arrow_schema, owners, path)
        assert unified is not None
        _check_schema_gaps(self._file_schemas, owners, self.strict_schema)
        self._hive_values, hive_fields = _hive_partitions(self.fs, self.files, self._folders)
        for field in hive_fields:
            if field.name not in unified.names:  # a column inside the files wins
                unified = unified.append(field)
        return unified

    def _group_parquet(self) -> list[_ParquetPiece]:
        """The files' row groups in pieces of about ``part_size`` decoded bytes."""
        pieces: list[_ParquetPiece] = []
        row_bytes: float | None = None  # decoded bytes per row, sampled from the first file
        for path in self.files:
            md = self._file_metadata[path]
            if row_bytes is None:
                row_bytes = _parquet_row_bytes(self.fs, path, md)
            group: list[int] = []
            group_bytes = 0
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                size = rg.num_rows * row_bytes if row_bytes else rg.total_byte_size
                if group and group_bytes + size > self.part_size:
                    pieces.append(self._parquet_piece(path, md, group))
                    group, group_bytes = [], 0
                group.append(i)
                group_bytes += size
            if group:
                pieces.append(self._parquet_piece(path, md, group))
        return pieces

    @staticmethod
    def _parquet_piece(path: str, md: pq.FileMetaData, groups: list[int]) -> _ParquetPiece:
        rows = tuple(md.row_group(i).num_rows for i in groups)
        return _ParquetPiece(path, tuple(groups), sum(rows), rows)

    def _plan_csv(self) -> pa.Schema:
        names = self.read_kwargs.get("names")
        dtypes = self.read_kwargs.get("dtypes") or self.read_kwargs.get("dtype") or {}
        header = self.read_kwargs.get("header", names is None)
        if names is None and not header:
            raise ValueError("CSV without a header needs names=[...] (the column names in order)")
        sep = self.read_kwargs.get("sep")
        if sep is None:
            sep = "\t" if self.files[0].endswith((".tsv", ".tsv.gz")) else ","
        self._csv_sep = sep
        self._csv_header = bool(header)
        self._csv_block_size = _block_size(self.read_kwargs.get("block_size"))
        if names is not None:
            _check_names(names, self.files)
        if names is None:
            raw = self._header_line(self.files[0], sep)
            try:
                first = raw.decode()
            except UnicodeDecodeError as exc:
                raise _data_error(
                    f"{self.files[0]}, line 1: the header line is not valid UTF-8 text "
                    f"(byte {exc.start}: {raw[exc.start:exc.end]!r})",
                    "raw logs must be UTF-8 text; pass names=[...] and header=True to skip a bad header",
                ) from exc
            names = first.split(sep)
            _check_header_names(self.files[0], names)
        unknown = sorted(set(dtypes) - set(names))
        if unknown:
            raise SchemaError(f"dtypes given for columns {unknown} that are not in names={list(names)}")
        self._csv_names = list(names)
        self._csv_types = {n: dtype_to_arrow_type(dtypes[n]) for n in names if n in dtypes}
        # Columns without a declared dtype are read as strings: guessing per block
        # would let two partitions disagree on a column's type.
        fields = [pa.field(n, self._csv_types.get(n, pa.string())) for n in names]
        pieces: list[_CsvPiece] = []
        for path in self.files:
            if fsspec.utils.infer_compression(path):
                pieces.append(_CsvPiece(path, 0, None))
                continue
            size = self.fs.size(path)
            # Parsed, a block of raw log text takes ~1.6x its size in memory (measured
            # on Criteo-like TSV), so blocks of at most 3/5 part_size give partitions
            # of at most part_size. A file is cut into equal blocks: cut at every 3/5
            # part_size, a 61 MB file of the 2M-row benchmark gave a 40 MB and a 21 MB
            # partition, and the fit's last large one ran while the other core idled.
            count = -(-max(size, 1) // max(1, self.part_size * 3 // 5))
            block = -(-max(size, 1) // count)
            for offset in range(0, max(size, 1), block):
                pieces.append(_CsvPiece(path, offset, block))
        self._pieces = pieces
        return pa.schema(fields)

    def _header_line(self, path: str, sep: str) -> bytes:
        """The first line of ``path``, read no further than the parse block: a header
        longer than that, or naming more than :data:`MAX_CSV_COLUMNS` columns, is
        refused quickly, with its field count, instead of read whole (a line of
        millions of fields took minutes and gigabytes)."""
        limit = self._csv_block_size
        with self.fs.open(path, "rb", compression="infer") as f:
            raw = f.readline(limit + 1)
        if not raw.endswith(b"\n") and len(raw) > limit:
            fields = raw.count(sep.encode()) + 1
            raise _data_error(
                f"{path}, line 1: read as the header line, it is longer than {limit:,} bytes, the CSV "
                f"parse block (block_size), and holds at least {fields:,} fields in those bytes",
                "for a headerless file pass names=[...] (the column names in order); if the header "
                "really is this long, pass block_size= larger than the line (e.g. block_size=\"64MB\")")
        raw = raw.removeprefix(_BOM).rstrip(b"\r\n")
        fields = raw.count(sep.encode()) + 1
        if fields > MAX_CSV_COLUMNS:
            raise _data_error(
                f"{path}, line 1: read as the header line, it holds {fields:,} fields, more than "
                f"MAX_CSV_COLUMNS={MAX_CSV_COLUMNS:,} columns",
                "for a headerless file pass names=[...]; if the file really has this many columns, "
                "raise tabstream.pipeline.dataset.MAX_CSV_COLUMNS")
        return raw

    def _merge_schema(self, given: Schema | None) -> Schema:
        cols = []
        stored = given or self._stored_schema
        for field in self._arrow_schema:
            dtype, is_list = arrow_type_to_dtype(field.type)
            col = ColumnSchema(field.name, dtype, is_list=is_list, is_ragged=is_list)
            if stored is not None and field.name in stored:
                known = stored[field.name]
                col = ColumnSchema(field.name, dtype, known.tags, known.properties,
                                   is_list=is_list, is_ragged=known.is_ragged if is_list else False)
            cols.append(col)
        return Schema(cols)

    # -- reading ------------------------------------------------------------
    @property
    def npartitions(self) -> int:
        return len(self._pieces)

    @property
    def pieces(self) -> list[Any]:
        return list(self._pieces)

    @property
    def arrow_schema(self) -> pa.Schema:
        return self._arrow_schema

    def read_piece(self, piece: Any, columns: Sequence[str] | None = None,
                   dictionary: Sequence[str] = (), keep: bool = False) -> pa.Table:
        """Read one partition as an Arrow table (only ``columns`` when given), keeping
        only the rows of this Dataset (its ``filters`` and split).

        ``keep``: a later pass will read the same columns again (a Workflow's fit
        says so): with the default ``cache="auto"``, a parquet partition is then kept
        on local disk for it (see ``cache``).

        ``dictionary`` names string columns the caller takes as dictionary arrays:
        where a parquet file stores such a column in dictionary-encoded pages (in
        every row group of the partition) it is read as ``dictionary<int32, string>``
        chunks, one dictionary per row group, without decoding the strings. Other
        sources, and columns the Dataset's filters use, are read as usual."""
        read = self._reader(keep)
        active = self._active_filters()
        if dictionary:
            used = {c for f in active for c in f.columns}
            dictionary = tuple(c for c in dictionary if c not in used)
        if not active:
            return read(piece, columns, dictionary) if dictionary else read(piece, columns)
        needed = None if columns is None else list(dict.fromkeys(
            [*columns, *(c for f in active for c in f.columns)]))
        table = read(piece, needed, dictionary) if dictionary else read(piece, needed)
        table = table.filter(pa.array(self._mask(table, table.num_rows, piece)))
        return table if columns is None else table.select(list(columns))

    def _active_filters(self) -> list[Any]:
        return [f for f in (self._filter, self._row_filter) if f is not None]

    def _mask(self, table: pa.Table | None, num_rows: int, piece: Any) -> np.ndarray:
        """Which of the partition's ``num_rows`` rows (as stored) belong to this Dataset."""
        mask = np.ones(num_rows, dtype=bool)
        for f in self._active_filters():
            mask &= f.mask(table, num_rows, self._piece_index[piece])
        return mask

    def piece_mask(self, piece: Any) -> np.ndarray | None:
        """The rows of ``piece`` (as stored) this Dataset keeps, as a boolean array;
        ``None`` when it keeps them all. Reads only the filter's columns, and nothing
        at all for a random split of parquet or in-memory data."""
        active = self._active_filters()
        if not active:
            return None
        cols = list(dict.fromkeys(c for f in active for c in f.columns))
        if not cols and isinstance(piece, (_ParquetPiece, _TablePiece)):
            n = piece.num_rows if isinstance(piece, _ParquetPiece) else piece.stop - piece.start
            return self._mask(None, n, piece)
        read = self._reader()
        table = read(piece, cols or None)
        return self._mask(table, table.num_rows, piece)

    def piece_rows(self) -> list[int | None]:
        """The rows of each partition this Dataset keeps, where they are known without
        reading the data: a parquet partition's from its footers (after the split's or
        filter's mask, see :meth:`piece_mask`); ``None`` for a partition only a read
        can count (CSV/TSV, in-memory and dask frames)."""
        counts: list[int | None] = []
        for piece in self._pieces:
            rows = piece.num_rows if isinstance(piece, _ParquetPiece) else None
            if rows is not None:
                mask = self.piece_mask(piece)
                rows = rows if mask is None else int(np.count_nonzero(mask))
            counts.append(rows)
        return counts

    def piece_masks(self) -> list[np.ndarray | None]:
        """:meth:`piece_mask` of every partition, computed concurrently."""
        if not self._active_filters():
            return [None] * len(self._pieces)
        import dask

        from tabstream.pipeline.execution import local_compute

        tasks = [dask.delayed(self.piece_mask, pure=False)(p) for p in self._pieces]
        return local_compute(tasks)

    def _reader(self, keep: bool = False) -> Any:
        # "auto" caches in the process that made the Dataset (threads, the default
        # scheduler): a worker process of a cluster reads a copy of the Dataset whose
        # cache no later pass would find, so it parses as without a cache.
        if self._cache_auto and os.getpid() != self._owner_pid:
            return self._read_piece_raw
        if self.cache:
            return self._read_cached
        if self._cache_auto and self.engine == "parquet" and (keep or self._cache_dir is not None):
            # parquet: only a read that a later pass repeats (the fit's) writes the
            # cache; any read may use what is there
            return self._read_cached if keep else self._read_if_cached
        return self._read_piece_raw

    def _read_if_cached(self, piece: Any, columns: Sequence[str] | None,
                        dictionary: Sequence[str] = ()) -> pa.Table:
        return self._read_cached(piece, columns, dictionary, write=False)

    def _read_cached(self, piece: Any, columns: Sequence[str] | None,
                     dictionary: Sequence[str] = (), write: bool = True) -> pa.Table:
        """Partitions as read, kept in uncompressed Arrow IPC files: the second pass
        over the data (fit, then export) memory-maps them instead of parsing again.
        ``write=False`` uses a kept partition but keeps none.

        A CSV block is parsed whole whatever the columns asked for, so it is kept
        whole and every later read, of any columns, selects from it."""
        whole = isinstance(piece, _CsvPiece)
        if whole:
            dictionary = ()  # a parsed CSV block has no dictionary pages
        if whole and columns is not None:
            self._check_columns(columns)
        wanted = None if whole else columns
        try:
            if self._cache_dir is None:
                if not write:
                    return self._read_piece_raw(piece, columns, dictionary)
                with _CACHE_DIR_LOCK:  # the first partitions are read side by side
                    if self._cache_dir is None:
                        self._cache_dir = _new_cache_dir()
                        weakref.finalize(self, shutil.rmtree, self._cache_dir, True)
        except OSError as exc:
            if not self._cache_auto:
                raise
            self._warn_cache_off(f"the cache's temporary folder cannot be made ({exc})")
            return self._read_piece_raw(piece, columns, dictionary)
        names = list(wanted) if wanted is not None else self._arrow_schema.names
        if dictionary:
            names = [*names, "\x00dictionary", *dictionary]
        key = hashlib.sha1("\x1f".join(names).encode()).hexdigest()[:12]
        path = os.path.join(self._cache_dir, f"piece{self._piece_index[piece]:06d}-{key}.arrow")
        if os.path.exists(path):
            with pa.memory_map(path) as source:
                table = pa.ipc.open_stream(source).read_all()
        elif not write:
            return self._read_piece_raw(piece, columns, dictionary)
        else:
            table = self._read_piece_raw(piece, wanted, dictionary)
            if self._cache_auto and not self._may_keep(table.nbytes):
                # "auto" never fills the disk: the partition is read again when needed
                return table.select(list(columns)) if whole and columns is not None else table
            tmp = f"{path}.{threading.get_ident()}.tmp"
            try:
                # the stream format, not the file format: a partition of several parquet
                # row groups read as dictionaries has one dictionary per row group, and
                # only a stream may replace a dictionary between its batches; buffered:
                # a table of many small chunks (a parsed CSV block) is otherwise written
                # in thousands of small writes (measured 35 -> 18 ms CPU per 38 MB block)
                with pa.OSFile(tmp, "wb") as raw, pa.BufferedOutputStream(raw, 1 << 20) as sink, \
                        pa.ipc.new_stream(sink, table.schema) as writer:
                    writer.write_table(table)
                os.replace(tmp, path)
            except OSError as exc:
                # "auto": a partition the cache cannot hold (a full disk) is parsed
                # again when next read; never a half-written file taken as the data.
                with contextlib.suppress(OSError):
                    os.remove(tmp)
                if not self._cache_auto:
                    raise
                self._warn_cache_off(f"the cache in {self._cache_dir} could not keep a "
                                     f"partition ({exc})")
        return table.select(list(columns)) if whole and columns is not None else table

    def _warn_cache_off(self, why: str | Callable[[], str]) -> None:
        """A :class:`CacheWarning`, once per Dataset: "auto" keeps no more partitions,
        because of ``why`` (a callable is called only for the first)."""
        with _CACHE_DIR_LOCK:  # partitions are read side by side
            if self._warned_cache:
                return
            self._warned_cache = True
        reason = why() if callable(why) else why
        warnings.warn(f"{reason}: the Dataset reads partitions again when next needed instead "
                      "of keeping them (raw CSV/TSV is parsed again)", CacheWarning, stacklevel=3)

    def _may_keep(self, nbytes: int) -> bool:
        """Whether "auto" keeps a partition of ``nbytes``: for parquet, the partitions
        kept stay within ``PARQUET_CACHE_MAX_BYTES``; the disk keeps a reserve (the
        budget is decided first: a partition it refuses says nothing about the disk)."""
        parquet = self.engine == "parquet"
        if parquet:
            with _CACHE_DIR_LOCK:
                if self._cache_budget is None:  # once per Dataset: every partition the same
                    self._cache_budget = _parquet_cache_budget(self._cache_dir)
                budget = self._cache_budget
                if not self._kept_bytes and nbytes * self.npartitions > budget:
                    # all or nothing: when the first partition says the fit's reads
                    # would not all fit, keep none (at 16M rows, keeping the first
                    # 1 GiB cost the fit 4.4 s and saved the export nothing)
                    self._kept_bytes = budget + 1
                if self._kept_bytes + nbytes > budget:
                    return False
                self._kept_bytes += nbytes
        usage = _disk_usage(self._cache_dir)
        if usage is None or usage.free - nbytes < _disk_reserve(usage.total):
            if parquet:
                with _CACHE_DIR_LOCK:
                    self._kept_bytes -= nbytes
            self._warn_cache_off(lambda: _no_room(self._cache_dir, usage))
            return False
        return True

    def _check_columns(self, columns: Sequence[str]) -> None:
        missing = [c for c in columns if c not in self._arrow_schema.names]
        if missing:
            raise SchemaError(
                f"columns {missing} are not in the dataset; available: {self._arrow_schema.names}"
            )

    def _read_piece_raw(self, piece: Any, columns: Sequence[str] | None = None,
                        dictionary: Sequence[str] = ()) -> pa.Table:
        if columns is not None:
            self._check_columns(columns)
        if isinstance(piece, _TablePiece):
            assert self._table is not None
            t = self._table.slice(piece.start, piece.stop - piece.start)
            return t.select(list(columns)) if columns is not None else t
        if isinstance(piece, _ParquetPiece):
            return self._read_parquet_piece(piece, columns, dictionary)
        if isinstance(piece, _CsvPiece):
            with stores.translate_store_errors(piece.path):
                t = self._read_csv_piece(piece)
            return t.select(list(columns)) if columns is not None else t
        from tabstream.pipeline.execution import local_compute

        part = local_compute([self._ddf.get_partition(piece)], sync=True)[0]
        t = _frame_to_arrow(part)
        return t.select(list(columns)) if columns is not None else t

    def _dictionary_encoded(self, piece: _ParquetPiece, names: Sequence[str]) -> list[str]:
        """Those of ``names`` (string columns in the file and in the dataset's
        schema) whose pages are dictionary-encoded in every row group of
        ``piece``: read as dictionaries, they cost no string decoding. A column
        stored plain (high cardinality) is left out: reading it as a dictionary
        would hash every value while reading."""
        md = self._file_metadata[piece.path]
        file_schema = self._file_schemas[piece.path]
        positions = {md.row_group(0).column(i).path_in_schema: i for i in range(md.num_columns)} \
            if md.num_row_groups else {}
        out = []
        for name in names:
            field = self._arrow_schema.field(name)
            if name not in positions or name not in file_schema.names or \
                    not _is_text(field.type) or not _is_text(file_schema.field(name).type):
                continue
            i = positions[name]
            if all({"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & set(md.row_group(g).column(i).encodings)
                   for g in piece.row_groups):
                out.append(name)
        return out

    def _read_parquet_piece(self, piece: _ParquetPiece, columns: Sequence[str] | None,
                            dictionary: Sequence[str] = ()) -> pa.Table:
        target = self._arrow_schema if columns is None else pa.schema(
            [self._arrow_schema.field(c) for c in columns])
        present = self._file_schemas[piece.path].names
        cols = [c for c in target.names if c in present]
        as_dictionary = self._dictionary_encoded(piece, [c for c in dictionary if c in cols]) if dictionary else []
        try:
            if not _is_local(self.fs):  # a file replaced since the Dataset was opened
                stores.check_unchanged(self.fs, piece.path, self._file_tags.get(piece.path))
            if self.backend_name == "cudf" and cols:
                table = _read_row_groups_on_gpu(self.fs, piece, cols)
            elif _is_local(self.fs):
                # Arrow's own file reader: no Python file object in the hot path.
                # Threads off: dask already runs one partition per core.
                pf = pq.ParquetFile(piece.path, read_dictionary=as_dictionary or None)
                table = pf.read_row_groups(list(piece.row_groups), columns=cols, use_threads=False)
            else:
                with self.fs.open(piece.path, "rb") as f:
                    pf = pq.ParquetFile(f, read_dictionary=as_dictionary or None)
                    table = pf.read_row_groups(list(piece.row_groups), columns=cols, use_threads=False)
        except (OSError, pa.ArrowException) as exc:
            if not _is_local(self.fs) and (err := stores.store_error(piece.path, exc)) is not None:
                raise err from exc
            raise DataError(f"{piece.path}: cannot read row groups {list(piece.row_groups)}: {exc}") from exc
        if table.num_rows != piece.num_rows and cols:
            raise DataError(f"{piece.path}: row groups {list(piece.row_groups)} hold {table.num_rows} "
                            f"rows, the footer read when planning said {piece.num_rows}; was the "
                            "file replaced while in use?")
        if len(cols) < len(target.names):
            # Columns other files have and this one lacks: null here (schemas unified);
            # hive partition columns (``col=value`` folders): the folder's value.
            hive = getattr(self, "_hive_values", {}).get(piece.path, {})
            arrays = {name: table.column(name) if name in cols
                      else pa.repeat(pa.scalar(hive[name], target.field(name).type), piece.num_rows)
                      if name in hive else pa.nulls(piece.num_rows, target.field(name).type)
                      for name in target.names}
            table = pa.table(arrays)
        if as_dictionary:
            # the columns read as dictionaries keep that type, with values of the
            # target's type (a file's string may be the dataset's large_string:
            # only the dictionary is cast)
            target = pa.schema([
                pa.field(f.name, pa.dictionary(table.schema.field(f.name).type.index_type, f.type),
                         f.nullable, f.metadata)
                if f.name in as_dictionary and pa.types.is_dictionary(table.schema.field(f.name).type)
                else f for f in target])
        if not table.schema.equals(target):
            try:
                table = table.select(target.names).cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
                raise DataError(f"{piece.path}: cannot convert to the dataset's schema {target}: {exc}") from exc
        return table

    def _read_csv_piece(self, piece: _CsvPiece) -> pa.Table:
        block = self._csv_block(piece)
        skip_header = self._csv_header and piece.offset == 0
        if piece.offset == 0 and not skip_header:
            self._check_header_line(piece, block.first_line(self._csv_block_size))
        several = len(self._csv_names) > 1
        if several:
            block = self._trim_blank_lines(piece, block, skip_header)
        # A NUL byte is valid UTF-8, so Arrow would keep it inside a string value:
        # text logs never hold one, a binary (or UTF-16) line does. memchr-fast.
        nul = block.find(b"\0")
        if nul >= 0:
            data = block.data()
            line = self._line_at(piece, data, nul)
            raise _data_error(
                f"{piece.path}, line {line}: a NUL byte at column {self._column_at(data, nul)!r}: "
                f"the line is binary, expected text: {_excerpt(data, nul)!r}",
                "the file is not UTF-8 text (binary, or UTF-16?): convert it or remove the line",
            )
        try:
            # Arrow skips a UTF-8 BOM at the start of the block and reads CRLF endings.
            # Arrow's UTF-8 check of every string costs ~10% of the parse: it is
            # skipped for a block of ASCII text, which is valid UTF-8 throughout.
            table = self._parse_csv(b"" if block.no_lines() else block.arrow(), skip_header,
                                    check_utf8=not block.isascii())
        except pa.ArrowInvalid as exc:
            data = block.data()
            pos = self._blank_line_at(block) if several else -1
            raise (self._blank_line_error(piece, data, skip_header, pos) if pos >= 0
                   else self._csv_error(piece, data, skip_header, exc)) from exc
        # Arrow reads a blank line inside the block as a row of nulls. The block is
        # searched for one only when every column has a null: a search of every block
        # would cost about a tenth of its parse, a column's null count nothing.
        if several and all(column.null_count for column in table.columns):
            pos = self._blank_line_at(block)
            if pos >= 0:
                raise self._blank_line_error(piece, block.data(), skip_header, pos)
        return table

    def _check_header_line(self, piece: _CsvPiece, line: bytes) -> None:
        """``header=False`` but the file starts with the column names: refuse rather
        than read the names as a row of data."""
        first = line.removeprefix(_BOM).rstrip(b"\r")
        if first.count(self._csv_sep.encode()) + 1 != len(self._csv_names):
            return  # not the names (a line of millions of fields is not split here)
        fields = first.split(self._csv_sep.encode())
        if self._csv_sep != "\t":  # CSV headers are often quoted
            fields = [f.strip(b'"') for f in fields]
        names = [n.encode() for n in self._csv_names]
        if len(fields) == len(names) and sorted(fields) == sorted(names):
            raise _data_error(
                f"{piece.path}, line 1: the line holds the column names "
                f"({first.decode(errors='replace')[:200]!r}), but header=False: "
                f"pass header=True to skip it",
                "the file has a header line: pass header=True (keeping names=[...])",
            )

    def _line_at(self, piece: _CsvPiece, data: bytes, pos: int) -> int:
        """The 1-based line in the file of byte ``pos`` of the block of ``piece``."""
        return 1 + self._lines_before(piece) + data.count(b"\n", 0, pos)

    def _column_at(self, data: bytes, pos: int) -> str:
        start = data.rfind(b"\n", 0, pos) + 1
        index = data.count(self._csv_sep.encode(), start, pos)
        return self._csv_names[index] if index < len(self._csv_names) else f"field {index + 1}"

    def _trim_blank_lines(self, piece: _CsvPiece, block: _Block, skip_header: bool) -> _Block:
        """Blank lines at the end of the block carry nothing and are dropped. A blank
        line inside the data is a line without its fields: an error (see
        :meth:`_blank_line_at`); one at the very start is refused here, since with
        ``header=True`` Arrow would take it for the header and read on."""
        end = block.end
        while end > block.start and block.buf[end - 1] in (10, 13):  # b"\n", b"\r"
            end -= 1
        tail = block.buf[end:block.end]
        if tail.count(b"\n") > 1:  # keep the last line's own ending only
            block = _Block(block.buf, block.start, end + tail.index(b"\n") + 1)
        if end > block.start and block.buf[block.start] in (10, 13):
            raise self._blank_line_error(piece, block.data(), skip_header, 0)
        return block

    @staticmethod
    def _blank_line_at(block: _Block) -> int:
        """Where the first blank line of the block (trailing ones cut) starts, or -1."""
        found = [p for p in (block.find(b"\n\n"), block.find(b"\n\r\n")) if p >= 0]
        return min(found) if found else -1

    def _blank_line_error(self, piece: _CsvPiece, data: bytes, skip_header: bool, pos: int) -> DataError:
        """The blank line at ``pos`` of the block (0: the block starts with one), by
        its line in the file."""
        first_line = 1 + self._lines_before(piece) + (1 if skip_header else 0)
        line = first_line + data.count(b"\n", 0, pos + 1) if pos or data[:1] != b"\n" else first_line
        return DataError(
            f"{piece.path}, line {line}: expected {len(self._csv_names)} fields separated by "
            f"{self._csv_sep!r}, got a blank line"
        )

    def _csv_block(self, piece: _CsvPiece) -> _Block:
        """The piece's text: from the first line starting at or after ``offset`` (the
        file's start for offset 0) through the line holding byte ``offset + length``,
        as ``fsspec.utils.read_block`` cuts it. A local uncompressed file is memory-
        mapped (no copy of the text; about 0.5 ms less CPU per MB than reading it)."""
        if piece.length is not None:
            if _is_local(self.fs):
                with open(piece.path, "rb") as f:
                    if os.fstat(f.fileno()).st_size == 0:
                        return _Block(b"", 0, 0)
                    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                start = 0 if piece.offset == 0 else _after_newline(mm, piece.offset)
                return _Block(mm, start, max(start, _after_newline(mm, piece.offset + piece.length)))
            stores.check_unchanged(self.fs, piece.path, self._file_tags.get(piece.path))
            with self.fs.open(piece.path, "rb") as f:
                data = read_block(f, piece.offset, piece.length, delimiter=b"\n")
            return _Block(data, 0, len(data))
        if not _is_local(self.fs):
            stores.check_unchanged(self.fs, piece.path, self._file_tags.get(piece.path))
        try:
            with self.fs.open(piece.path, "rb", compression="infer") as f:
                data = f.read()
            return _Block(data, 0, len(data))
        except _DECOMPRESS_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # an I/O error of the system (missing file, permissions, network)
            raise self._truncated_error(piece, exc) from exc

    def _truncated_error(self, piece: _CsvPiece, exc: BaseException) -> DataError:
        """A compressed file that ends early or is corrupt: say how far it reads.
        Runs only after a failure; decompresses again, chunk by chunk, to count."""
        lines = 0
        try:
            with self.fs.open(piece.path, "rb", compression="infer") as f:
                read = getattr(f, "read1", f.read)  # small reads: keep what precedes the fault
                while chunk := read(1 << 16):
                    lines += chunk.count(b"\n")
        except _DECOMPRESS_ERRORS:
            pass
        where = (f"it reads up to line {lines}, then fails" if lines
                 else "not even line 1 could be read")
        return _data_error(
            f"{piece.path}: the compressed file is truncated or corrupt ({exc}); {where}",
            "the file was cut short (an interrupted copy or download?): fetch or compress it again",
        )

    def _parse_csv(self, data: bytes | pa.Buffer, skip_header: bool,
                   invalid_row_handler: Any = None, as_strings: bool = False,
                   check_utf8: bool = True) -> pa.Table:
        types = {n: pa.string() for n in self._csv_names} if as_strings else self._csv_types
        names = self._csv_names
        if len(data) == 0 or (isinstance(data, bytes) and not data.strip(b"\r\n")):
            return pa.table({n: pa.array([], type=self._arrow_schema.field(n).type) for n in names})
        return pacsv.read_csv(
            pa.BufferReader(data),
            read_options=pacsv.ReadOptions(column_names=names, skip_rows=1 if skip_header else 0,
                                           use_threads=False, block_size=self._csv_block_size),
            # Raw logs are not quoted: with tabs, a quote is plain data (quoting would
            # let a stray quote swallow the following lines). A blank line is a line
            # with the wrong number of fields, never silently dropped.
            parse_options=pacsv.ParseOptions(delimiter=self._csv_sep,
                                             quote_char=False if self._csv_sep == "\t" else '"',
                                             ignore_empty_lines=False,
                                             invalid_row_handler=invalid_row_handler),
            convert_options=pacsv.ConvertOptions(
                column_types={n: types.get(n, pa.string()) for n in names},
                null_values=[""], strings_can_be_null=True, quoted_strings_can_be_null=True,
                check_utf8=check_utf8,
            ),
        )

    def _csv_error(self, piece: _CsvPiece, data: bytes, skip_header: bool,
                   exc: Exception) -> DataError:
        """Turn an Arrow CSV error into one that names the file, line and column.
        Runs only after Arrow has failed, so the block is examined again here."""
        first_line = 1 + self._lines_before(piece) + (1 if skip_header else 0)
        msg = str(exc)
        if "straddl" in msg:  # a line the parser's block cannot hold
            return self._long_line_error(piece, data)
        bad: list[Any] = []

        def handler(row: Any) -> str:
            bad.append(row)
            return "skip"

        if "utf8" in msg.lower():
            return self._utf8_error(piece, data) or DataError(f"{piece.path} (from line {first_line}): {msg}")
        if "parse error" in msg.lower():
            # Arrow's row handler cannot show a line of invalid UTF-8: look for
            # field-count errors only in the lines before the first such byte.
            utf8 = self._utf8_error(piece, data)
            clean = data if utf8 is None else data[:data.rfind(b"\n", 0, utf8.offset) + 1]  # type: ignore[attr-defined]
            try:
                self._parse_csv(clean, skip_header, invalid_row_handler=handler, as_strings=True)
            except pa.ArrowInvalid:
                pass
            if bad:
                row = bad[0]
                # Arrow numbers the rows it skipped (the header) too
                line = (first_line if row.number is None
                        else 1 + self._lines_before(piece) + row.number - 1)
                return DataError(
                    f"{piece.path}, line {line}: expected {row.expected_columns} fields "
                    f"separated by {self._csv_sep!r}, got {row.actual_columns}: {row.text[:200]!r}"
                )
            if utf8 is not None:
                return utf8
            return DataError(f"{piece.path} (from line {first_line}): {msg}")
        m = re.search(r"column #(\d+)", msg)
        if m:
            name = self._csv_names[int(m.group(1))]
            try:
                raw = self._parse_csv(data, skip_header, as_strings=True).column(name)
            except pa.ArrowInvalid:  # the text itself is broken (bad UTF-8 elsewhere)
                return self._utf8_error(piece, data) or DataError(f"{piece.path}, column {name!r}: {msg}")
            target = self._csv_types[name]
            for i, value in enumerate(raw.to_pylist()):
                if value is None:
                    continue
                try:
                    pa.array([value]).cast(target)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                    return DataError(
                        f"{piece.path}, line {first_line + i}, column {name!r}: value {value!r} "
                        f"is not a valid {arrow_type_to_dtype(target)[0]}"
                    )
            return DataError(f"{piece.path}, column {name!r}: {msg}")
        return DataError(f"{piece.path} (from line {first_line}): {msg}")

    def _long_line_error(self, piece: _CsvPiece, data: bytes) -> DataError:
        """The longest line of the block, by its line in the file and its length: Arrow
        parses CSV in blocks of ``block_size`` bytes and fails on a line it cannot hold
        in them ("straddling object ...")."""
        ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
        starts = np.concatenate([[0], ends + 1])
        stops = np.concatenate([ends, [len(data)]])
        longest = int(np.argmax(stops - starts))
        length = int(stops[longest] - starts[longest])
        line = 1 + self._lines_before(piece) + longest
        suggest = max(self._csv_block_size * 2, 1 << (length - 1).bit_length())
        return _data_error(
            f"{piece.path}, line {line}: the line is {length:,} bytes long, more than the CSV parser's "
            f"block of block_size={self._csv_block_size:,} bytes can hold: pass block_size= at least "
            f"its length to Dataset (e.g. block_size=\"{suggest // 2**20}MB\")",
            f"Dataset(..., block_size=\"{suggest // 2**20}MB\") parses lines up to that long; is the "
            "line meant to be one row (a missing newline)?")

    def _utf8_error(self, piece: _CsvPiece, data: bytes) -> DataError | None:
        """The first invalid UTF-8 byte of the block, by file line and column
        (its offset in the block is the error's ``offset``)."""
        try:
            data.decode()
        except UnicodeDecodeError as bad:
            pos = bad.start
            err = _data_error(
                f"{piece.path}, line {self._line_at(piece, data, pos)}, column "
                f"{self._column_at(data, pos)!r}: invalid UTF-8 bytes "
                f"{data[pos:bad.end]!r} in {_excerpt(data, pos)!r}",
                "raw logs must be UTF-8 text: re-encode the file (e.g. iconv -f latin1 -t utf-8)",
            )
            err.offset = pos  # type: ignore[attr-defined]
            return err
        return None

    def _lines_before(self, piece: _CsvPiece) -> int:
        """Lines in the file before the block of ``piece`` (``read_block`` starts a
        block just after the first newline at or past ``offset``)."""
        if piece.offset == 0:
            return 0
        with self.fs.open(piece.path, "rb") as f:
            return f.read(piece.offset).count(b"\n") + 1

    # -- user-facing views --------------------------------------------------
    # -- splits ---------------------------------------------------------------
    def split(self, fractions: Sequence[float], seed: int = 0) -> list[Dataset]:
        """Random row split into ``len(fractions)`` datasets (fractions sum to 1).

        Row ``i`` of partition ``p`` goes to the split chosen by a uniform draw from
        ``numpy.random.default_rng([seed, p])``: every row lands in exactly one split,
        and the same files, ``part_size`` and ``seed`` give the same split. The draws
        are over the rows as stored, so a split of a Dataset with ``filters`` keeps
        the rows that both pass the filter and draw this split; counting a split's
        rows reads nothing. Each split is its own Dataset everywhere: a loader given
        ``train`` yields only ``train``'s rows.
        """
        fractions = [float(f) for f in fractions]
        if not fractions or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
            raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
        bounds = np.cumsum(fractions)
        bounds[-1] = np.inf
        return [self._view(_RandomSplit(seed, bounds, k)) for k in range(len(fractions))]

    def split_by_value(self, column: str, groups: Sequence[Sequence[Any]]) -> list[Dataset]:
        """One dataset per group of values of ``column``, e.g. a day column:
        ``train, valid = ds.split_by_value("day", [range(1, 7), [7]])``."""
        if column not in self._arrow_schema.names:
            raise SchemaError(f"cannot split on {column!r}: not in the dataset; available: {self._arrow_schema.names}")
        col_type = _plain(self._arrow_schema.field(column).type)
        cast_groups: list[list[Any]] = []
        owner: dict[Any, int] = {}  # value -> the group that has it
        for g, values in enumerate(groups):
            cast = _split_values(column, col_type, list(values), g)
            for value in cast:
                if value in owner and owner[value] != g:
                    raise ValueError(
                        f"split_by_value({column!r}): the value {value!r} is in group {owner[value]} and in "
                        f"group {g}; its rows would be in both splits: give each value to one group"
                    )
                owner[value] = g
            cast_groups.append(cast)
        return [self._view(_ValueSplit(column, values)) for values in cast_groups]

    def _view(self, row_filter: Any) -> Dataset:
        if self._row_filter is not None:
            raise ValueError("splitting an already split dataset is not supported; split once into all parts")
        view = copy.copy(self)
        view._row_filter = row_filter
        view._piece_index = {p: i for i, p in enumerate(self._pieces)}
        return view

    @property
    def num_rows(self) -> int:
        if self._active_filters():
            return int(sum(int(np.count_nonzero(m)) for m in self.piece_masks()))
        if self.engine == "parquet":
            return sum(self._file_metadata[f].num_rows for f in self.files)
        if self.engine == "dataframe":
            assert self._table is not None
            return self._table.num_rows
        import dask

        from tabstream.pipeline.execution import local_compute

        tasks = [dask.delayed(_count_rows)(self, p) for p in self._pieces]
        return int(sum(local_compute(tasks)))

    def to_iter(self, columns: Sequence[str] | None = None) -> Iterator[pd.DataFrame]:
        """Yield the partitions one by one as pandas DataFrames."""
        for piece in self._pieces:
            yield arrow_to_pandas(self.read_piece(piece, columns))

    def to_ddf(self, columns: Sequence[str] | None = None):
        """A dask DataFrame over the partitions: pandas partitions on the arrow
        backend, a dask-cudf DataFrame (cudf partitions) on the cudf backend."""
        import dask.dataframe as dd

        if self.engine == "dask" and columns is None and not self._active_filters() and (
                self.backend_name == "arrow" or _is_gpu_collection(self._ddf)):
            return self._ddf  # the frame given, unchanged (not when filters or a split drop rows)
        cols = list(columns) if columns is not None else None
        target = self._arrow_schema if cols is None else pa.schema([self._arrow_schema.field(c) for c in cols])
        if self.backend_name == "cudf":
            return _gpu_ddf(_ReadArrow(self, cols), self._pieces, target)
        meta = arrow_to_pandas(target.empty_table())
        return dd.from_map(_ReadPandas(self, cols), self._pieces, meta=meta, enforce_metadata=False)

    def to_parquet(self, output_path: str, **kwargs: Any):
        """Export the dataset unchanged (see :func:`tabstream.pipeline.export.to_parquet`)."""
        from tabstream.pipeline.export import export

        kwargs.setdefault("client", backends.execution_client(self.backend_name))
        return export(self, None, output_path, **kwargs)

    def __repr__(self) -> str:
        src = self.files[0] if self.files else self.engine
        more = f" (+{len(self.files) - 1} files)" if len(self.files) > 1 else ""
        return f"Dataset({src!r}{more}, engine={self.engine!r}, npartitions={self.npartitions})"


class _RandomSplit:
    columns: tuple[str, ...] = ()

    def __init__(self, seed: int, bounds: np.ndarray, k: int) -> None:
        self.seed, self.bounds, self.k = seed, bounds, k

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        # One draw per stored row of the partition: the same with or without filters,
        # and countable without reading anything.
        u = np.random.default_rng([self.seed, piece_index]).random(num_rows)
        return np.searchsorted(self.bounds, u, side="right") == self.k


class _ValueSplit:
    def __init__(self, column: str, values: list[Any]) -> None:
        self.column, self.values = column, values
        self.columns = (column,)

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        assert table is not None
        col = table.column(self.column)
        keep = pc.fill_null(pc.is_in(col, value_set=pa.array(self.values, type=col.type)), False)
        return keep.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _split_values(column: str, col_type: pa.DataType, values: list[Any], group: int) -> list[Any]:
    """``values`` as values of the column's type (a str for an int column fails
    here, when the split is made, not when its rows are first read)."""
    def wrong(value: Any) -> TypeError:
        return TypeError(f"split_by_value({column!r}): the value {value!r} ({type(value).__name__}) of group "
                         f"{group} is not a {col_type} value, the type of column {column!r}")

    try:
        cast = pa.array(values, type=col_type).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        for value in values:
            try:
                pa.array([value], type=col_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise wrong(value) from exc
        raise
    # Arrow truncates 2.5 to 2 for an int column: a value must survive the cast.
    for value, got in zip(values, cast, strict=True):
        if not (got == value or (got != got and value != value)):
            raise wrong(value)
    return cast


class _ExprFilter:
    """``Dataset(..., filters=...)``: DNF tuples or a ``pyarrow.compute.Expression``."""

    def __init__(self, filters: Any, schema: pa.Schema) -> None:
        if isinstance(filters, pc.Expression):
            expr = filters
        elif isinstance(filters, (list, tuple)):
            try:
                expr = pq.filters_to_expression(list(filters))
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"cannot read filters={filters!r}: {exc}; expected e.g. [('day', '<', 7)] or "
                    "a pyarrow.compute.Expression"
                ) from exc
        else:
            raise TypeError(
                f"filters must be a list of (column, op, value) tuples or a "
                f"pyarrow.compute.Expression, got {type(filters).__name__} {filters!r}"
            )
        self.expr = expr
        empty = schema.empty_table()
        try:
            result = self._evaluate(empty)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            reason = " ".join(str(exc).split())
            raise SchemaError(
                f"filters {expr} do not apply to this dataset: {reason}; columns: {schema.names}"
            ) from exc
        if not pa.types.is_boolean(result.type):
            raise TypeError(f"filters {expr} give {result.type} values; a filter must give "
                            "true/false per row, e.g. pc.field('day') < 7")
        # The columns the expression reads: those it cannot do without.
        needed = []
        for name in schema.names:
            try:
                self._evaluate(empty.drop_columns([name]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                needed.append(name)
        if not needed:
            raise ValueError(f"filters {expr} read no column, so they keep all rows or none; "
                             f"name a column, e.g. [('day', '<', 7)]; columns: {schema.names}")
        self.columns = tuple(needed)

    def _evaluate(self, table: pa.Table) -> pa.ChunkedArray:
        import pyarrow.dataset as pds

        return pds.dataset(table).to_table(columns={"keep": self.expr}).column("keep")

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        assert table is not None
        keep = pc.fill_null(self._evaluate(table.select(list(self.columns))), False)
        return keep.to_numpy().astype(bool, copy=False) if num_rows else np.zeros(0, dtype=bool)


class _ReadPandas:
    """Picklable partition reader for ``dd.from_map``."""

    def __init__(self, ds: Dataset, columns: list[str] | None) -> None:
        self.ds, self.columns = ds, columns

    def __call__(self, piece: Any) -> pd.DataFrame:
        return arrow_to_pandas(self.ds.read_piece(piece, self.columns))


class _ReadArrow:
    """Picklable partition reader for the cudf backend's ``to_ddf``."""

    def __init__(self, ds: Dataset, columns: list[str] | None) -> None:
        self.ds, self.columns = ds, columns

    def __call__(self, piece: Any) -> pa.Table:
        return self.ds.read_piece(piece, self.columns)


# -- the cudf backend's hooks (tabstream.backends.cudf holds the cudf code) ----------
def _read_row_groups_on_gpu(fs: Any, piece: _ParquetPiece, columns: list[str]) -> pa.Table:
    """A parquet piece's row groups decoded by cudf's GPU reader, as Arrow."""
    from tabstream.backends.cudf import read_parquet_row_groups

    if _is_local(fs):
        return read_parquet_row_groups(piece.path, piece.row_groups, columns)
    with fs.open(piece.path, "rb") as f:
        return read_parquet_row_groups(f, piece.row_groups, columns)


def _gpu_ddf(read: Any, pieces: list[Any], schema: pa.Schema) -> Any:
    from tabstream.backends.cudf import dask_gpu_frame

    return dask_gpu_frame(read, pieces, schema)


def _is_gpu_collection(ddf: Any) -> bool:
    """Whether a dask DataFrame's partitions are cudf DataFrames (dask-cudf)."""
    from tabstream.backends.cudf import is_gpu_frame

    return is_gpu_frame(ddf._meta)


def _frame_to_arrow(frame: Any) -> pa.Table:
    """One partition of a dask DataFrame given as input (pandas, or cudf for dask-cudf)."""
    from tabstream.backends.cudf import frame_to_arrow, is_gpu_frame

    return frame_to_arrow(frame) if is_gpu_frame(frame) else _pandas_to_arrow(frame)


#: parquet partitions the default cache ("auto") keeps for the export after a fit, in
#: bytes as read (per Dataset); None: a quarter of the memory this process may use, at
#: least 1 GiB, so that the kept files stay in the page cache. The memory is the
#: machine's or, in a container, its limit (cgroups v1/v2, RLIMIT_RSS: what dask's
#: ``distributed.system.memory_limit`` reads): page cache, and a /tmp on tmpfs, count against
#: a container's limit. A cache on a disk also stays under what the kernel holds
#: before it starts writing dirty pages back (``vm.dirty_background_bytes``, else
#: ``vm.dirty_background_ratio`` percent of the available memory): past it the fit
#: writes at the disk's pace. On the project's machine (24 GiB, threshold ~2.2 GB) at
#: 16M Criteo-like rows (4.4 GB kept) keeping every partition cost the fit 5.0-8.2 s
#: and saved the export 3.4-4.1 s (2 runs each: 27.3 and 32.8 s against 26.4 and
#: 27.7 s kept none); at 4M rows (1.1 GB) keeping them all saves 8% (benchmarks/RESULTS.md).
PARQUET_CACHE_MAX_BYTES: int | None = None


def _parquet_cache_budget(folder: str | None = None) -> int:
    """:data:`PARQUET_CACHE_MAX_BYTES`, or its default where it is None, for a cache
    in ``folder`` (None: the memory share alone)."""
    if PARQUET_CACHE_MAX_BYTES is not None:
        return PARQUET_CACHE_MAX_BYTES
    budget = _default_parquet_cache_budget()
    if folder is not None and not _in_memory_filesystem(folder):
        threshold = _writeback_threshold()
        if threshold is not None:
            budget = min(budget, threshold)
    return budget


def _writeback_threshold() -> int | None:
    """Bytes of written file data the kernel keeps in memory before writing them
    back to disk in the background; None where it does not say (not Linux)."""
    try:
        with open("/proc/sys/vm/dirty_background_bytes") as f:
            fixed = int(f.read())
        if fixed > 0:
            return fixed
        with open("/proc/sys/vm/dirty_background_ratio") as f:
            ratio = int(f.read())
    except (OSError, ValueError):
        return None
    import psutil

    return psutil.virtual_memory().available * ratio // 100


def _in_memory_filesystem(folder: str) -> bool:
    """Whether ``folder`` is on tmpfs or ramfs (no writing back to a disk)."""
    import psutil

    path = os.path.realpath(folder)
    best, fstype = "", ""
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") + "/"
        if (path + "/").startswith(mount) and len(mount) > len(best):
            best, fstype = mount, part.fstype
    return fstype in ("tmpfs", "ramfs")


@functools.cache
def _default_parquet_cache_budget() -> int:
    return max(2**30, _memory_limit() // 4)


# cgroup memory limits (v1 hard and soft, v2 max and high) a container may set
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                  "/sys/fs/cgroup/memory/memory.soft_limit_in_bytes",
                  "/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.high")


def _memory_limit() -> int:
    """The memory this process may use: the machine's, or less where a cgroup limit
    or ``RLIMIT_RSS`` says so (what dask workers size themselves by). Not
    ``distributed.system.memory_limit``: importing ``distributed`` took 0.14 s and
    13 MB of RSS in every process that fits a workflow on the threaded scheduler."""
    import psutil

    limit = psutil.virtual_memory().total
    for path in _CGROUP_LIMITS if sys.platform == "linux" else ():
        try:
            with open(path) as f:
                value = int(f.read())  # "max" (no limit) is no int
        except (OSError, ValueError):
            continue
        if value > 0:
            limit = min(limit, value)
    try:
        import resource
    except ImportError:  # Windows
        return limit
    rss = resource.getrlimit(resource.RLIMIT_RSS)[1]
    return min(limit, rss) if rss > 0 else limit


#: free disk space the default cache ("auto") leaves on the cache's disk: a tenth of
#: the disk, at least ``CACHE_MIN_FREE_BYTES`` and at most ``CACHE_MAX_FREE_BYTES``
#: (a tenth of a large shared disk, 25 GB of 252, turned the cache off on a machine
#: with 24 GB free, where the fit's partitions needed a few hundred MB)
CACHE_MIN_FREE_BYTES = 2 * 2**30
CACHE_MAX_FREE_BYTES = 10 * 2**30


def _disk_reserve(total: int) -> int:
    """Bytes "auto" leaves free on a disk of ``total`` bytes."""
    return max(CACHE_MIN_FREE_BYTES, min(total // 10, CACHE_MAX_FREE_BYTES))


def _disk_usage(folder: str) -> Any:
    """``shutil.disk_usage(folder)``, or None where it cannot be read."""
    try:
        return shutil.disk_usage(folder)
    except OSError:
        return None


def _no_room(folder: str, usage: Any) -> str:
    """Why "auto" keeps nothing more in ``folder``, for the CacheWarning."""
    if usage is None:
        return f"the cache folder {folder} cannot be used (it does not exist or cannot be read)"
    return (f"the cache in {folder} is on a nearly full disk ({usage.free / 2**30:.1f} GiB free "
            f"of {usage.total / 2**30:.0f} GiB, {_disk_reserve(usage.total) / 2**30:.1f} GiB kept "
            "free; free disk space or pass cache_dir= a folder on a disk with room)")


def _count_rows(ds: Dataset, piece: Any) -> int:
    return ds.read_piece(piece).num_rows


def _is_pandas_dataframe(obj: Any) -> bool:
    pd = sys.modules.get("pandas")  # a DataFrame exists only once pandas is imported
    return pd is not None and isinstance(obj, pd.DataFrame)


def _pandas_to_arrow(df: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(df, preserve_index=False)


_is_local = stores.is_local


def _first_path(path: Any) -> str:
    """The path (the first of a list) errors of a store name."""
    if isinstance(path, (list, tuple)):
        return str(path[0]) if path else ""
    return str(path) if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__") else ""


def _is_dask_dataframe(obj: Any) -> bool:
    mod = type(obj).__module__
    return mod.startswith("dask") and hasattr(obj, "npartitions")


def _expand_paths(path: Any, storage_options: dict,
                  engine: str | None) -> tuple[Any, list[str], list[tuple[str, Any]]]:
    """The filesystem, the files, and the folders whose ``_manifest.json`` (if any)
    fixes which files must be there: ``(folder, None)`` for a folder searched (and
    each export nested in it), ``(folder, regex)`` for one a glob reaches, where only
    the entries the pattern matches must be there."""
    paths = [path] if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__") else list(path)
    if not paths:
        raise FileNotFoundError("Dataset got an empty list of paths")
    paths = [str(p) for p in paths]
    fs, _, _ = get_fs_token_paths(paths[0], storage_options=stores.store_options(paths[0], storage_options))
    # the store as it is now, not as this process listed it before (fsspec keeps one
    # filesystem, and its listings, per set of options)
    stores.forget_listings(fs, paths)
    files: list[str] = []
    folders: list[str] = []
    for p in paths:
        stripped = fs._strip_protocol(p)
        if any(ch in p for ch in "*?["):
            matched = sorted(fs.glob(stripped))
            # Every manifest in a folder the pattern reaches: an entry the pattern
            # matches must be among the files (``out/*.parquet`` reads a whole export).
            pattern = re.compile(glob_translate(stripped))
            reached = sorted(fs.glob(posixpath.join(posixpath.dirname(stripped), MANIFEST_FILE)))
            if not matched and not reached:
                raise FileNotFoundError(f"no files match {p!r}")
            files.extend(m for m in matched if fs.isfile(m))
            folders.extend((posixpath.dirname(m), pattern) for m in reached)
        elif fs.isdir(stripped):
            root = stripped.rstrip("/") or "/"
            every = fs.find(stripped)
            # Exports nested in the folder (root/train, root/valid) are checked too.
            found, nested, skipped = _folder_data(root, every, engine)
            if skipped and (found or nested):
                warnings.warn(_skipped_message(p, skipped, engine), DatasetWarning, stacklevel=4)
            if not found and not nested and not fs.exists(posixpath.join(stripped, MANIFEST_FILE)):
                wanted = {"parquet": " (looked for .parquet files)", "csv": " (looked for .csv/.tsv files)"}
                if skipped:
                    raise FileNotFoundError(_skipped_message(p, skipped, engine, none_left=True))
                raise FileNotFoundError(f"folder {p!r} holds no data files{wanted.get(engine or '', '')}")
            files.extend(found)
            folders.append((root, None))
            folders.extend((folder, None) for folder in nested)
        elif fs.exists(stripped):
            files.append(stripped)
        else:
            raise FileNotFoundError(f"no such file or folder: {p!r}{_missing_bucket(fs, stripped)}")
    twice = sorted(f for f, n in collections.Counter(files).items() if n > 1)
    if twice:
        raise ValueError(f"{twice[0]}: picked more than once by the paths {paths}; each file would be "
                         "read (and counted) once per time it is picked: give each file once")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        files = [f if "://" in f else f"{protocol}://{f}" for f in files]
    return fs, files, folders


def _folder_data(root: str, every: list[str], engine: str | None
                 ) -> tuple[list[str], list[str], dict[str, int]]:
    """What ``Dataset(root)`` reads of the files ``every`` below ``root``: its data
    files, the exports nested in it, and the subfolders it leaves out (with the data
    files each holds).

    A folder's data are its own files, those of its hive partition folders
    (``col=value``, at any depth) and those of the exports in it (subfolders holding a
    ``_manifest.json``, read by the same rule). Any other subfolder is not data: a
    side output such as ``write_data(..., return_probability=True)``'s
    ``probabilities/`` holds other columns, and read as data it would add rows. Names
    starting with ``_`` or ``.`` are never data."""
    exports = {posixpath.dirname(f) for f in every if posixpath.basename(f) == MANIFEST_FILE}
    found: list[str] = []
    nested: set[str] = set()
    skipped: dict[str, int] = collections.Counter()
    for path in every:
        manifest = posixpath.basename(path) == MANIFEST_FILE
        if _hidden(posixpath.dirname(path) if manifest else path, root):
            continue
        folder, outside = root, None
        for part in posixpath.relpath(path, root).split("/")[:-1]:
            folder = posixpath.join(folder, part)
            if "=" not in part and folder not in exports:
                outside = folder
                break
        if outside is not None:
            if _wanted(path, engine):
                skipped[outside] += 1
        elif manifest:
            if folder != root:
                nested.add(folder)
        elif _wanted(path, engine):
            found.append(path)
    return sorted(found), sorted(nested), dict(sorted(skipped.items()))


def _skipped_message(path: str, skipped: dict[str, int], engine: str | None,
                     none_left: bool = False) -> str:
    """What :func:`_folder_data` left out of ``Dataset(path)``, and how to read it."""
    names = ", ".join(f"{folder}/ ({n} file{'s' if n > 1 else ''})" for folder, n in list(skipped.items())[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    ext = "csv" if engine == "csv" else "parquet"
    first = next(iter(skipped))
    head = (f"folder {path!r} holds no data files of its own, only in subfolders that are not data"
            if none_left else f"Dataset({path!r}) does not read its subfolders")
    return (f"{head}: {names}{more}. A folder's data are its own files, its hive partition folders "
            f"(col=value) and the exports in it (folders with {MANIFEST_FILE}); to read a subfolder, "
            f"pass its path (e.g. {first!r}), a list of paths, or a glob such as "
            f"{posixpath.join(str(path), '*', '*.' + ext)!r}")


def _missing_bucket(fs: Any, path: str) -> str:
    """On an object store, whether the bucket of ``path`` itself is missing."""
    if _is_local(fs) or "/" not in path.strip("/"):
        return ""
    bucket = path.strip("/").split("/")[0]
    return "" if fs.exists(bucket) else f" (the bucket {bucket!r} does not exist, or these credentials cannot see it)"


def _hidden(path: str, root: str) -> bool:
    """Whether a part of ``path`` below ``root`` starts with ``_`` or ``.``."""
    rel = posixpath.relpath(path, root)
    return rel != "." and any(part.startswith(("_", ".")) for part in rel.split("/"))


def _wanted(path: str, engine: str | None) -> bool:
    if engine == "parquet" or engine is None:
        if path.endswith(_PARQUET_EXT):
            return True
    if engine == "csv" or engine is None:
        if path.endswith(_CSV_EXT):
            return True
    return False


def _infer_engine(files: list[str]) -> str:
    first = files[0]
    if first.endswith(_PARQUET_EXT):
        return "parquet"
    if first.endswith(_CSV_EXT):
        return "csv"
    raise ValueError(f"cannot tell the format of {first!r} from its extension; pass engine='parquet' or 'csv'")


def _parquet_footer(fs: Any, path: str) -> tuple[pq.FileMetaData, pa.Schema]:
    try:
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            return pf.metadata, pf.schema_arrow
    except (OSError, pa.ArrowException) as exc:
        if not _is_local(fs) and (err := stores.store_error(path, exc)) is not None:
            raise err from exc
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc


def _parquet_footers(fs: Any, files: list[str]) -> list[tuple[pq.FileMetaData, pa.Schema]]:
    """Every file's footer; fetched concurrently from remote filesystems."""
    if _is_local(fs) or len(files) == 1:
        return [_parquet_footer(fs, f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return list(pool.map(lambda f: _parquet_footer(fs, f), files))


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def _hive_partitions(fs: Any, files: list[str], folders: list[tuple[str, Any]]
                     ) -> tuple[dict[str, dict[str, Any]], list[pa.Field]]:
    """Partition columns of hive-style folders (``root/col=value/part.parquet``) below
    each folder searched: ``{file: {column: value}}`` and the columns' fields (int64
    when every value is an integer, bool for true/false, else string; the folder
    ``__HIVE_DEFAULT_PARTITION__`` is a missing value)."""
    roots = sorted((f for f, pattern in folders if pattern is None), key=len, reverse=True)
    raw: dict[str, dict[str, str]] = {}
    order: list[str] | None = None
    first = None
    for url in files:
        path = fs._strip_protocol(url)
        root = next((r for r in roots if path.startswith(r.rstrip("/") + "/")), None)
        if root is None:
            continue
        parts = posixpath.relpath(path, root).split("/")[:-1]
        pairs = [p.split("=", 1) for p in parts if "=" in p]
        keys = [k for k, _ in pairs]
        if order is None:
            order, first = keys, url
        elif keys != order:
            raise DataError(f"{url}: its folders name the partition columns {keys}, but {first} has "
                            f"{order}; every file of a hive-partitioned dataset needs the same "
                            "col=value folders")
        if keys:
            raw[url] = {k: unquote(v) for k, v in pairs}
    if not order:
        return {}, []
    fields, values = [], {url: {} for url in raw}
    for key in order:
        seen = [v[key] for v in raw.values() if v[key] != _HIVE_NULL]
        if seen and all(re.fullmatch(r"-?\d+", v) for v in seen):
            typ, convert = pa.int64(), int
        elif seen and all(v in ("true", "false") for v in seen):
            typ, convert = pa.bool_(), (lambda v: v == "true")
        else:
            typ, convert = pa.string(), str
        fields.append(pa.field(key, typ))
        for url, v in raw.items():
            values[url][key] = None if v[key] == _HIVE_NULL else convert(v[key])
    return values, fields


def _parquet_row_bytes(fs: Any, path: str, md: pq.FileMetaData, sample: int = 8192) -> float:
    """Decoded (in-memory) bytes per row, from the first rows of ``path``.

    The footer's sizes are of encoded pages: dictionary-encoded strings take a few
    bytes per value there and tens in memory, so ``part_size`` is planned on a sample
    decoded once instead. 0 when the file has no rows.
    """
    if md.num_rows == 0:
        return 0.0
    try:
        with fs.open(path, "rb") as f:
            batch = next(pq.ParquetFile(f).iter_batches(batch_size=sample, use_threads=False), None)
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc
    if batch is None or batch.num_rows == 0:
        return 0.0
    return batch.nbytes / batch.num_rows


def _unify_schemas(unified: pa.Schema | None, other: pa.Schema, owners: dict[str, str],
                   path: str) -> pa.Schema:
    """Add ``other``'s columns to ``unified``: a column missing from some files is
    null there; ints of different widths (floats, strings) widen to the wider type;
    any other disagreement names both files and the column. ``owners`` maps each
    column to the first file that has it."""
    if unified is None:
        owners.update({name: path for name in other.names})
        return other
    fields = list(unified)
    index = {f.name: i for i, f in enumerate(fields)}
    for field in other:
        if field.name not in index:
            owners[field.name] = path
            index[field.name] = len(fields)
            fields.append(field.with_nullable(True))
            continue
        ours = fields[index[field.name]].type
        theirs = field.type
        if theirs == ours:
            continue
        wider = None
        if _safely_castable(theirs, _plain(ours)) or _safely_castable(ours, _plain(theirs)):
            try:
                wider = pa.unify_schemas([pa.schema([pa.field("x", _plain(ours))]),
                                          pa.schema([pa.field("x", _plain(theirs))])],
                                         promote_options="permissive").field(0).type
            except (pa.ArrowInvalid, pa.ArrowTypeError):
                wider = None
        if wider is None:
            raise SchemaError(
                f"{path}: column {field.name!r} is {theirs}, but {owners[field.name]} has {ours}; "
                "the files cannot be read as one dataset: convert one of them"
            )
        fields[index[field.name]] = fields[index[field.name]].with_type(wider)
    # A column this file lacks (null here) or may hold nulls in cannot stay non-nullable.
    for i, f in enumerate(fields):
        if not f.nullable and (f.name not in other.names or other.field(f.name).nullable):
            fields[i] = f.with_nullable(True)
    return pa.schema(fields, metadata=unified.metadata)


def _check_schema_gaps(file_schemas: dict[str, pa.Schema], owners: dict[str, str], strict: bool) -> None:
    """Parquet files of one Dataset whose columns differ: with ``strict`` a
    :class:`~tabstream.core.errors.SchemaError` naming a file, the columns it lacks
    and a file that has them; else one :class:`DatasetWarning` naming every such
    column, the files that lack it (null in their rows) and a file that has it."""
    lacking: dict[str, list[str]] = {}  # column -> the files without it
    for path, schema in file_schemas.items():
        names = set(schema.names)
        for column in owners:
            if column not in names:
                lacking.setdefault(column, []).append(path)
    if not lacking:
        return
    if strict:
        first = min((files[0] for files in lacking.values()), key=list(file_schemas).index)
        missing = [c for c, files in lacking.items() if first in files]
        raise SchemaError(
            f"{first}: lacks the columns {missing} that {owners[missing[0]]} has; strict_schema=True "
            f"refuses parquet files whose columns differ ({len(lacking)} column"
            f"{'s' if len(lacking) > 1 else ''} missing from some of the {len(file_schemas)} files): "
            "make the files agree, read them as separate Datasets, or pass strict_schema=False "
            "to read the columns a file lacks as nulls")

    def files(paths: list[str]) -> str:
        shown = ", ".join(paths[:3])
        return shown + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")

    groups: dict[tuple[tuple[str, ...], str], list[str]] = {}  # (files without, a file with) -> columns
    for column, paths in lacking.items():
        groups.setdefault((tuple(paths), owners[column]), []).append(column)
    described = "; ".join(f"{columns} null in the rows of {files(list(paths))} (held by {owner})"
                          for (paths, owner), columns in list(groups.items())[:5])
    more = f"; and {len(groups) - 5} more groups of columns" if len(groups) > 5 else ""
    warnings.warn(
        f"the parquet files' columns differ; the columns a file lacks are read as nulls in its rows: "
        f"{described}{more}. Pass strict_schema=True to refuse files whose columns differ",
        DatasetWarning, stacklevel=5)


def _is_text(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _plain(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_dictionary(t) else t


def _safely_castable(src: pa.DataType, dst: pa.DataType) -> bool:
    if pa.types.is_dictionary(src):
        src = src.value_type
    if src == dst:
        return True
    if is_list_type(src) and is_list_type(dst):  # list<int32> and list<int64> widen as scalars do
        return _safely_castable(src.value_type, dst.value_type)
    both_int = pa.types.is_integer(src) and pa.types.is_integer(dst)
    both_float = pa.types.is_floating(src) and pa.types.is_floating(dst)
    strings = {pa.string(), pa.large_string()}
    return both_int or both_float or (src in strings and dst in strings)


def _check_header_names(path: str, names: list[str]) -> None:
    """The header line read as column names: an empty or repeated name means the
    first line is data (a headerless raw log), not a header."""
    seen: set[str] = set()
    for i, name in enumerate(names):
        if not name.strip() or name in seen:
            what = "an empty column name" if not name.strip() else f"the column name {name!r} twice"
            raise _data_error(
                f"{path}, line 1: read as the header line, it has {what} (field {i + 1} of "
                f"{len(names)}: {names[:8]}{' ...' if len(names) > 8 else ''}); expected distinct "
                "column names: is the file headerless?",
                "for a headerless file pass names=[...] (the column names in order), or --criteo-tsv "
                "on the command line for Criteo TSV logs",
            )
        seen.add(name)


def _block_size(value: Any) -> int:
    """The ``block_size=`` read kwarg: bytes the CSV parser takes at a time (its
    longest line); 2 MB by default."""
    if value is None:
        return _CSV_PARSE_BLOCK
    if isinstance(value, bool):
        raise TypeError(f"block_size must be a byte count or a size such as '8MB', got {value!r}")
    try:
        return parse_bytes(value)
    except ValueError as exc:
        raise ValueError(f"block_size={value!r}: expected a byte count or a size such as '8MB' "
                         "(the CSV parser's block; a line must fit in it)") from exc


def _check_names(names: Any, files: list[str]) -> None:
    """``names=``: distinct strings (a repeated name would make two columns of one name)."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a list of column names (strings), got {names!r}")
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            more = f" (+{len(files) - 1} files)" if len(files) > 1 else ""
            raise ValueError(
                f"names= lists the column {name!r} twice (positions {seen[name] + 1} and {i + 1} of "
                f"{len(names)}), reading {files[0]}{more}: give each column its own name")
        seen[name] = i


def _after_newline(buf: Any, pos: int) -> int:
    """The offset just past the first newline at or after ``pos`` (the end if none)."""
    i = buf.find(b"\n", pos) if pos < len(buf) else -1
    return len(buf) if i < 0 else i + 1


def _data_error(message: str, hint: str) -> DataError:
    """A DataError that also carries a ``hint`` (the CLI prints it under the message)."""
    return DataError(message, hint=hint)


def _excerpt(data: bytes, pos: int, width: int = 120) -> bytes:
    """The line of ``data`` around byte ``pos``, cut to about ``width`` bytes."""
    start = data.rfind(b"\n", 0, pos) + 1
    end = data.find(b"\n", pos)
    end = len(data) if end < 0 else end
    start = max(start, pos - width // 2)
    return data[start:min(end, start + width)].rstrip(b"\r")


def _read_schema_kv(fs: Any, files: list[str]) -> Schema | None:
    """The Schema a tabstream export keeps in each data file's key-value metadata
    (``tabstream.schema``): read from the first file, for files copied without
    ``_schema.json``."""
    metadata = _parquet_footer(fs, files[0])[1].metadata or {}
    text = metadata.get(SCHEMA_KEY)
    if text is None:
        return None
    try:
        return Schema.from_dict(loads_json(text, f"{files[0]} (tabstream.schema metadata)", "schema"))
    except DataError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{files[0]}: the schema in its parquet key-value metadata "
                        f"(tabstream.schema) is not a valid tabstream schema: {exc}") from exc


_CACHE_PREFIX = "tabstream-cache-"
_cache_leftovers_checked = False


def _new_cache_dir() -> str:
    """A temporary folder for a Dataset's partition cache, named with its owner
    (``tabstream-cache-<host>-<pid>-s<start>-<random>``). The folder is removed with
    its Dataset, but a process killed (``kill -9``, out of memory) leaves it: the
    first cache folder a process makes removes the leftovers of dead owners (and
    unnamed ones older than a day, from older versions)."""
    global _cache_leftovers_checked
    from tabstream.core.scratch import owner_pattern, owner_tag, remove_leftovers

    parent = tempfile.gettempdir()
    if not _cache_leftovers_checked:
        _cache_leftovers_checked = True
        remove_leftovers(fsspec.filesystem("file"), parent,
                         owner_pattern(re.escape(_CACHE_PREFIX), r"[A-Za-z0-9_]+"))
    return tempfile.mkdtemp(prefix=f"{_CACHE_PREFIX}{owner_tag()}-", dir=parent)

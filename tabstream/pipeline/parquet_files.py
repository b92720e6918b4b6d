"""Sources, parquet: a Dataset's parquet files, read by row groups.

The footers are read once when the Dataset is made (:meth:`ParquetFiles.plan`: the
export's manifest is checked, the files' schemas unified, hive ``col=value`` folders
turned into columns); row groups are grouped into pieces of about ``part_size``
decoded bytes on first use (:meth:`ParquetFiles.group`, sized on a decoded sample
of the first file); a piece is read as the Dataset's schema (a column a file lacks
is null, string columns may come as dictionaries: :meth:`ParquetFiles.read`).
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabstream import backends
from tabstream.core.errors import DataError
from tabstream.core.jsonfile import loads_json
from tabstream.core.schema import Schema
from tabstream.pipeline import stores
from tabstream.pipeline.export_folder import SCHEMA_KEY, check_manifests, refuse_unpublished
from tabstream.pipeline.paths import hive_partitions
from tabstream.pipeline.stores import is_local
from tabstream.pipeline.unify import check_schema_gaps, is_text, unify_schemas

__all__ = ["Fragment", "ParquetFiles", "ParquetPiece", "READ_GROUP_BYTES", "RowGroup", "column_groups",
           "read_schema_kv"]


@dataclass(frozen=True)
class ParquetPiece:
    """Row groups of one parquet file read as one partition, with their rows."""

    path: str
    row_groups: tuple[int, ...]
    num_rows: int
    group_rows: tuple[int, ...] = ()  # rows of each row group, in order


@dataclass(frozen=True, eq=False)
class RowGroup:
    """One row group of a :class:`Fragment`: ``index`` in its file, ``stored_rows``
    (the rows the file holds in it), ``num_rows`` (those the Dataset keeps) and
    ``mask``, a boolean array over the stored rows saying which, or ``None`` when the
    Dataset keeps them all."""

    index: int
    stored_rows: int
    num_rows: int
    mask: np.ndarray | None = None


@dataclass(frozen=True, eq=False)
class Fragment:
    """One parquet file of a Dataset, as a reader reads it (see
    :meth:`tabstream.pipeline.dataset.Dataset.fragments`): ``path`` (a URL on an
    object store, as ``Dataset.files`` lists it), its footer ``metadata`` (read once,
    when the Dataset was made), its ``row_groups`` in file order, and the values of
    its hive ``col=value`` folders (``partition_values``; those columns are not in the
    file)."""

    path: str
    metadata: pq.FileMetaData
    row_groups: tuple[RowGroup, ...]
    partition_values: Mapping[str, Any]

    @property
    def num_rows(self) -> int:
        """The rows of the file the Dataset keeps."""
        return sum(rg.num_rows for rg in self.row_groups)


class ParquetFiles:
    """The parquet files of a Dataset: planned (:meth:`plan`), grouped into pieces
    (:meth:`group`) and read piece by piece (:meth:`read`) as the Dataset's schema.

    After :meth:`plan`: ``file_metadata`` and ``file_schemas`` (path -> the footer and
    Arrow schema read once), ``hive_values`` (path -> its ``col=value`` folders'
    values) and ``arrow_schema`` (the files' unified schema)."""

    def __init__(self, fs: Any, files: list[str], folders: list[tuple[str, Any]],
                 file_tags: dict[str, str | None], strict_schema: bool,
                 hive_types: dict[str, pa.DataType] | None = None) -> None:
        self.fs = fs
        self.files = files
        self.folders = folders
        self.hive_types = hive_types  # partition columns' types, from the stored schema
        self.file_tags = file_tags
        self.strict_schema = strict_schema
        self.file_schemas: dict[str, pa.Schema] = {}
        self.file_metadata: dict[str, pq.FileMetaData] = {}
        self.hive_values: dict[str, dict[str, Any]] = {}
        self.arrow_schema: pa.Schema | None = None

    @property
    def num_rows(self) -> int:
        """The rows the files hold, from their footers."""
        return sum(self.file_metadata[f].num_rows for f in self.files)

    def plan(self) -> pa.Schema:
        """Read every file's footer (concurrently from an object store), check them against
        the export's manifest, unify their schemas; the Dataset's Arrow schema."""
        unified: pa.Schema | None = None
        owners: dict[str, str] = {}  # column -> the first file that has it
        footers = _parquet_footers(self.fs, self.files)
        check_manifests(self.fs, self.files, self.folders,
                         {path: md.num_rows for path, (md, _) in zip(self.files, footers, strict=True)})
        if not is_local(self.fs):
            refuse_unpublished(self.fs, self.files, [schema for _, schema in footers])
        for path, (md, arrow_schema) in zip(self.files, footers, strict=True):
            twice = [name for name, n in collections.Counter(arrow_schema.names).items() if n > 1]
            if twice:
                raise DataError(f"{path}: the file has {len(twice)} column name{'s' if len(twice) > 1 else ''} "
                                f"more than once: {twice}; a Dataset needs distinct column names: "
                                "rewrite the file with each column named once")
            self.file_schemas[path] = arrow_schema
            self.file_metadata[path] = md
            unified = unify_schemas(unified, arrow_schema, owners, path)
        assert unified is not None
        check_schema_gaps(self.file_schemas, owners, self.strict_schema)
        self.hive_values, hive_fields = hive_partitions(self.fs, self.files, self.folders,
                                                        self.hive_types)
        for field in hive_fields:
            if field.name not in unified.names:  # a column inside the files wins
                unified = unified.append(field)
        self.arrow_schema = unified
        return unified

    def group(self, part_size: int) -> list[ParquetPiece]:
        """The files' row groups in pieces of about ``part_size`` decoded bytes."""
        pieces: list[ParquetPiece] = []
        row_bytes: float | None = None  # decoded bytes per row, sampled from the first file
        for path in self.files:
            md = self.file_metadata[path]
            if row_bytes is None:
                row_bytes = _parquet_row_bytes(self.fs, path, md)
            group: list[int] = []
            group_bytes = 0
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                size = rg.num_rows * row_bytes if row_bytes else rg.total_byte_size
                if group and group_bytes + size > part_size:
                    pieces.append(self._parquet_piece(path, md, group))
                    group, group_bytes = [], 0
                group.append(i)
                group_bytes += size
            if group:
                pieces.append(self._parquet_piece(path, md, group))
        return pieces

    @staticmethod
    def _parquet_piece(path: str, md: pq.FileMetaData, groups: list[int]) -> ParquetPiece:
        rows = tuple(md.row_group(i).num_rows for i in groups)
        return ParquetPiece(path, tuple(groups), sum(rows), rows)

    def _dictionary_encoded(self, piece: ParquetPiece, names: Sequence[str]) -> list[str]:
        """Those of ``names`` (string columns in the file and in the dataset's
        schema) whose pages are dictionary-encoded in every row group of
        ``piece``: read as dictionaries, they cost no string decoding. A column
        stored plain (high cardinality) is left out: reading it as a dictionary
        would hash every value while reading."""
        md = self.file_metadata[piece.path]
        file_schema = self.file_schemas[piece.path]
        positions = {md.row_group(0).column(i).path_in_schema: i for i in range(md.num_columns)} \
            if md.num_row_groups else {}
        out = []
        for name in names:
            field = self.arrow_schema.field(name)
            if name not in positions or name not in file_schema.names or \
                    not is_text(field.type) or not is_text(file_schema.field(name).type):
                continue
            i = positions[name]
            if all({"RLE_DICTIONARY", "PLAIN_DICTIONARY"} & set(md.row_group(g).column(i).encodings)
                   for g in piece.row_groups):
                out.append(name)
        return out

    def _read_in_groups(self, pf: pq.ParquetFile, piece: ParquetPiece, cols: list[str]) -> pa.Table:
        """``cols`` of the piece's row groups, decoded a few columns at a time (see
        :func:`column_groups`) and put side by side: Arrow's reader keeps each
        column's decoding buffers until the call returns, so one call for every
        column held about 2.5x the decoded table at its peak (65 MB for a 26 MB
        row group of 100k Criteo rows; 37 MB in groups of about 4 MiB), in every
        partition a fit or an export reads, at no measurable cost in CPU."""
        groups = column_groups(self.file_metadata[piece.path], self.file_schemas[piece.path],
                               piece.row_groups, cols, READ_GROUP_BYTES)
        row_groups = list(piece.row_groups)
        if len(groups) <= 1:
            return pf.read_row_groups(row_groups, columns=cols, use_threads=False)
        parts = [pf.read_row_groups(row_groups, columns=group, use_threads=False) for group in groups]
        fields = [field for part in parts for field in part.schema]
        return pa.Table.from_arrays([column for part in parts for column in part.columns],
                                    schema=pa.schema(fields, metadata=parts[0].schema.metadata))

    def _read_with(self, backend: Any, piece: ParquetPiece, columns: list[str]) -> pa.Table:
        """A piece's row groups decoded by ``backend``'s own parquet reader, as Arrow."""
        if is_local(self.fs):
            return backend.read_parquet_row_groups(piece.path, piece.row_groups, columns)
        with self.fs.open(piece.path, "rb") as f:
            return backend.read_parquet_row_groups(f, piece.row_groups, columns)

    def read(self, piece: ParquetPiece, columns: Sequence[str] | None,
             dictionary: Sequence[str] = (), backend_name: str = backends.DEFAULT_BACKEND) -> pa.Table:
        """One piece as the Dataset's schema (only ``columns`` when given; ``dictionary``:
        string columns read as dictionaries where every row group stores them so);
        on the cudf backend (``backend_name``) decoded by cudf's reader."""
        target = self.arrow_schema if columns is None else pa.schema(
            [self.arrow_schema.field(c) for c in columns])
        present = self.file_schemas[piece.path].names
        cols = [c for c in target.names if c in present]
        as_dictionary = self._dictionary_encoded(piece, [c for c in dictionary if c in cols]) if dictionary else []
        try:
            if not is_local(self.fs):  # a file replaced since the Dataset was opened
                stores.check_unchanged(self.fs, piece.path, self.file_tags.get(piece.path))
            backend = backends.get(backend_name)
            if backend.reads_parquet and cols:  # the backend's own reader (cudf's, on the GPU)
                table = self._read_with(backend, piece, cols)
            elif is_local(self.fs):
                # Arrow's own file reader: no Python file object in the hot path.
                # Threads off: dask already runs one partition per core.
                pf = pq.ParquetFile(piece.path, read_dictionary=as_dictionary or None)
                table = self._read_in_groups(pf, piece, cols)
            else:
                with self.fs.open(piece.path, "rb") as f:
                    pf = pq.ParquetFile(f, read_dictionary=as_dictionary or None)
                    table = self._read_in_groups(pf, piece, cols)
        except (OSError, pa.ArrowException) as exc:
            if not is_local(self.fs) and (err := stores.store_error(piece.path, exc)) is not None:
                raise err from exc
            raise DataError(f"{piece.path}: cannot read row groups {list(piece.row_groups)}: {exc}") from exc
        if table.num_rows != piece.num_rows and cols:
            raise DataError(f"{piece.path}: row groups {list(piece.row_groups)} hold {table.num_rows} "
                            f"rows, the footer read when planning said {piece.num_rows}; was the "
                            "file replaced while in use?")
        if len(cols) < len(target.names):
            # Columns other files have and this one lacks: null here (schemas unified);
            # hive partition columns (``col=value`` folders): the folder's value.
            hive = self.hive_values.get(piece.path, {})
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


#: a piece's columns are decoded in groups of about this many bytes (the footer's
#: uncompressed sizes of their pages): small enough that the reader's buffers stay
#: a fraction of the decoded table, large enough that the calls cost nothing (about
#: 0.2 ms a call, a group of 4 MiB decodes in 10 ms or more)
READ_GROUP_BYTES = 4 << 20


def _leaf_count(type_: pa.DataType) -> int:
    """How many parquet leaf columns a field of ``type_`` is stored as."""
    if pa.types.is_struct(type_):
        return sum(_leaf_count(type_.field(i).type) for i in range(type_.num_fields))
    if pa.types.is_map(type_):
        return _leaf_count(type_.key_type) + _leaf_count(type_.item_type)
    if pa.types.is_list(type_) or pa.types.is_large_list(type_) or pa.types.is_fixed_size_list(type_):
        return _leaf_count(type_.value_type)
    return 1


def column_groups(md: pq.FileMetaData, file_schema: pa.Schema, row_groups: Sequence[int],
                  columns: Sequence[str], group_bytes: int) -> list[list[str]]:
    """``columns`` (top-level columns of the file), in order, cut into groups of at
    least ``group_bytes`` uncompressed bytes in ``row_groups`` (the last may hold
    less); one group when the file's schema does not map onto its leaf columns."""
    leaves = [_leaf_count(field.type) for field in file_schema]
    if sum(leaves) != md.num_columns:  # (a file of repeated names is refused when planned)
        return [list(columns)]
    first = np.cumsum([0, *leaves])
    position = {name: i for i, name in enumerate(file_schema.names)}
    groups: list[list[str]] = [[]]
    size = 0
    for name in columns:
        i = position.get(name)
        if i is not None:
            size += sum(md.row_group(g).column(leaf).total_uncompressed_size
                        for g in row_groups for leaf in range(first[i], first[i + 1]))
        groups[-1].append(name)
        if size >= group_bytes:
            groups.append([])
            size = 0
    return [group for group in groups if group]


def _parquet_footer(fs: Any, path: str) -> tuple[pq.FileMetaData, pa.Schema]:
    try:
        with fs.open(path, "rb") as f:
            pf = pq.ParquetFile(f)
            return pf.metadata, pf.schema_arrow
    except (OSError, pa.ArrowException) as exc:
        if not is_local(fs) and (err := stores.store_error(path, exc)) is not None:
            raise err from exc
        raise DataError(f"{path}: not a readable parquet file ({exc})") from exc


def _parquet_footers(fs: Any, files: list[str]) -> list[tuple[pq.FileMetaData, pa.Schema]]:
    """Every file's footer; fetched concurrently from remote filesystems."""
    if is_local(fs) or len(files) == 1:
        return [_parquet_footer(fs, f) for f in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return list(pool.map(lambda f: _parquet_footer(fs, f), files))


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


def read_schema_kv(fs: Any, files: list[str]) -> Schema | None:
    """The Schema a tabstream export keeps in each data file's key-value metadata
    (``tabstream.schema``): read from the first file, for files copied without
    ``_schema.json``."""
    metadata = _parquet_footer(fs, files[0])[1].metadata or {}
    text = metadata.get(SCHEMA_KEY)
    if text is None:
        return None
    try:
        return Schema.from_dict(loads_json(text, f"{files[0]} (tabstream.schema metadata)", "schema"))
    except (ValueError, KeyError, TypeError) as exc:  # DataError included: from_dict names no file
        raise DataError(f"{files[0]}: the schema in its parquet key-value metadata "
                        f"(tabstream.schema) is not a valid tabstream schema: {exc}") from exc

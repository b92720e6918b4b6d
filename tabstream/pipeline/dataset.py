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

This module is the Dataset's public face; each role it delegates has its own module:
:mod:`~tabstream.pipeline.paths` (paths, globs, folders, hive partitions),
:mod:`~tabstream.pipeline.parquet_files`, :mod:`~tabstream.pipeline.csv_files` and
:mod:`~tabstream.pipeline.frames` (the sources), :mod:`~tabstream.pipeline.selection`
(splits and filters), :mod:`~tabstream.pipeline.partition_cache`,
:mod:`~tabstream.pipeline.unify` (schema unification) and
:mod:`~tabstream.pipeline.export_folder` (the export folder's format and checks).
Readers such as the loaders take a Dataset's files through :meth:`Dataset.fragments`.

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

import copy
import os
import uuid
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabstream import backends
from tabstream.core.dtypes import (
    arrow_to_pandas,
    arrow_type_to_dtype,
    dtype_to_arrow_type,
)
from tabstream.core.errors import DatasetWarning, SchemaError
from tabstream.core.merlin import read_merlin_schema
from tabstream.core.schema import ColumnSchema, Schema
from tabstream.pipeline import stores
from tabstream.pipeline.csv_files import CsvFiles, CsvPiece
from tabstream.pipeline.export_folder import (
    check_manifests,
    check_schema_file,
    read_schema_json,
)
from tabstream.pipeline.frames import (
    TablePiece,
    frame_to_arrow,
    is_dask_dataframe,
    is_pandas_dataframe,
    pandas_to_arrow,
    table_pieces,
)
from tabstream.pipeline.parquet_files import (
    Fragment,
    ParquetFiles,
    ParquetPiece,
    RowGroup,
    read_schema_kv,
)
from tabstream.pipeline.partition_cache import PartitionCache
from tabstream.pipeline.paths import expand_paths, first_path, infer_engine
from tabstream.pipeline.selection import ExprFilter, random_splits, value_splits
from tabstream.pipeline.sizes import DEFAULT_PART_SIZE, parse_bytes  # noqa: F401 (re-exported)

if TYPE_CHECKING:  # pandas is imported where a frame is made or given, so that a
    import pandas as pd  # Dataset for a loader (parquet in, arrow out) never loads it

__all__ = ["Dataset", "DatasetWarning", "parse_bytes"]

#: most columns a CSV/TSV header line may name (``Dataset(path)`` without ``names=``):
#: a "header" of millions of fields is a data line or a corrupt file, and would cost
#: minutes and gigabytes to plan and parse. Raise it for a file that really is that wide.
MAX_CSV_COLUMNS = 100_000



#: NVTabular's Dataset arguments of partition sizing, accepted and ignored with a warning
_NVT_SIZING = ("part_mem_fraction", "row_groups_per_part")

#: the keyword arguments CSV/TSV reading takes (see :class:`Dataset`'s ``read_kwargs``)
CSV_OPTIONS = ("names", "dtypes", "dtype", "sep", "header", "block_size")


def _check_read_options(engine: str, options: dict[str, Any], npartitions: Any) -> None:
    """Refuse keyword arguments the Dataset would not use (they were taken and
    ignored: ``Dataset(df, no_such_option=1)``); ``npartitions`` is for in-memory
    data only, a positive integer."""
    if npartitions is not None:
        if engine != "dataframe":
            raise TypeError(f"Dataset: npartitions applies to a DataFrame or Arrow table; the {engine} "
                            "engine cuts its files by part_size (e.g. part_size='64MB')")
        if isinstance(npartitions, bool) or not isinstance(npartitions, (int, np.integer)) or npartitions < 1:
            raise ValueError(f"Dataset: npartitions must be a positive integer, got {npartitions!r}")
    unknown = sorted(set(options) - set(CSV_OPTIONS if engine == "csv" else ()))
    if unknown:
        taken = (f"CSV/TSV reading takes {', '.join(CSV_OPTIONS)}" if engine == "csv"
                 else f"they are CSV/TSV reading options or unknown, and this Dataset's engine is {engine!r}")
        raise TypeError(f"Dataset got unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}: {taken}")


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
        ``"disk"`` keeps each partition, as read, in an Arrow IPC file in a folder of
        the Dataset's own (made in ``cache_dir``, else in the temporary folder, and
        removed with the Dataset; never ``cache_dir`` itself), so the second
        pass (fit, then export) maps it instead of parsing the raw files again.
        Costs disk space about the size of the data in memory. ``"auto"`` (the
        default) is ``"disk"`` for raw CSV/TSV logs, where parsing is the cost (fit
        + export measured about 0.8x the time of parsing twice); for parquet only
        the partitions a Workflow's fit reads are kept (``read_piece(keep=True)``),
        so the export after the fit maps them instead of decoding parquet again
        (string columns stay dictionary-encoded where the files store them so; the
        Criteo-like benchmark needs about 260 MB per million rows), up to
        ``PARQUET_CACHE_MAX_BYTES`` of :mod:`tabstream.pipeline.partition_cache` (a
        quarter of the memory the process may use: the machine's, or a container's
        limit; at least 1 GiB) per Dataset: when the
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
    npartitions:
        For a DataFrame or Arrow table (NVTabular's argument): its rows in this many
        ranges, their sizes within one row of each other, instead of ranges of about
        ``part_size`` bytes.
    **read_kwargs:
        For CSV: ``names`` (column names, required for headerless raw logs),
        ``dtypes`` (name -> dtype; other columns are inferred from the first block,
        see :mod:`tabstream.pipeline.csv_files`), ``sep`` (default ``","``, ``"\\t"`` for .tsv),
        ``header`` (``False`` by default when ``names`` is given), ``block_size``
        (default ``"2MB"``: the bytes the parser takes at a time; a line longer
        than it can hold is an error naming its line and the size that reads it).
        Any other keyword, or one of these for data that is not CSV, is a
        ``TypeError``.

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
        self.part_size = parse_bytes(part_size)
        self.storage_options = dict(storage_options or {})
        #: the backend whose kernels the ops run with on this data (chosen once, here)
        self.backend_name = backends.choose(cpu)
        self.cpu = not backends.get(self.backend_name).gpu
        if not isinstance(strict_schema, bool):
            raise TypeError(f"strict_schema must be True or False, got {strict_schema!r}")
        self.strict_schema = strict_schema
        self.read_kwargs = read_kwargs
        # what dask knows this Dataset by (see __dask_tokenize__)
        self._token = uuid.uuid4().hex
        self.fs: fsspec.AbstractFileSystem | None = None
        self.files: list[str] = []
        self._table: pa.Table | None = None
        self._ddf = None
        self._stored_schema: Schema | None = None
        self._folders: list[tuple[str, Any]] = []
        self._row_filter: Any = None  # a split's rows (see split / split_by_value)
        self._filter: ExprFilter | None = None
        self._file_tags: dict[str, str | None] = {}  # remote file -> its ETag when opened
        self._parquet: ParquetFiles | None = None  # the parquet files (engine "parquet")
        self._csv: CsvFiles | None = None  # the CSV/TSV files (engine "csv")

        # NVTabular's Dataset(df, npartitions=n): in-memory data in n row ranges
        npartitions = read_kwargs.pop("npartitions", None)
        # NVTabular's partition sizing by memory share or row groups: taken, said to
        # be ignored (part_size sizes partitions here), so migrating code runs
        ignored = sorted(k for k in _NVT_SIZING if read_kwargs.pop(k, None) is not None)
        if ignored:
            warnings.warn(f"Dataset: {', '.join(ignored)} (NVTabular's partition sizing) "
                          "is ignored; tabstream cuts partitions by part_size (default "
                          f"{DEFAULT_PART_SIZE // 2**20} MB), e.g. Dataset(..., part_size='64MB')",
                          DatasetWarning, stacklevel=2)
        if is_pandas_dataframe(path_or_df):
            self.engine = "dataframe"
            self._table = pandas_to_arrow(path_or_df)
        elif isinstance(path_or_df, pa.Table):
            self.engine = "dataframe"
            self._table = path_or_df
        elif is_dask_dataframe(path_or_df):
            self.engine = "dask"
            self._ddf = path_or_df
        else:
            with stores.translate_store_errors(first_path(path_or_df)):
                self._open_files(path_or_df, engine)

        _check_read_options(self.engine, read_kwargs, npartitions)
        self._npartitions = npartitions
        self._cache = PartitionCache(cache_dir, auto=cache == "auto")
        if self._cache.auto:
            self.cache = "disk" if self.engine == "csv" else None
        self._planned: list[Any] | None = None  # the pieces, see _pieces
        self._planned_index: dict[Any, int] | None = None
        with stores.translate_store_errors(first_path(path_or_df)):
            self._arrow_schema = self._plan()
        if schema is None and self.files:
            check_schema_file(self.fs, self.files, self._stored_schema, self._arrow_schema)
        self.schema = self._merge_schema(schema)
        if filters is not None:
            self._filter = ExprFilter(filters, self._arrow_schema)

    def _open_files(self, path: Any, engine: str | None) -> None:
        """The files of ``path`` as the store holds them now, their format and the
        schema stored beside them. On an object store each file's ETag is kept: a read
        of a file replaced since is refused (see :mod:`tabstream.pipeline.stores`)."""
        self.fs, self.files, self._folders = expand_paths(path, self.storage_options, engine)
        if not _is_local(self.fs):
            self._file_tags = {f: stores.file_tag(self.fs, f) for f in self.files}
        if not self.files:  # an export folder whose files are all gone
            check_manifests(self.fs, [], self._folders, {})
            raise FileNotFoundError(f"{path!r} holds no data files (no files match)")
        self.engine = engine or infer_engine(self.files)
        if self.engine not in ("parquet", "csv"):
            raise ValueError(f"engine must be 'parquet' or 'csv', got {self.engine!r}")
        self._stored_schema = (read_schema_json(self.fs, self.files)
                               or (read_schema_kv(self.fs, self.files) if self.engine == "parquet"
                                   else None)
                               or read_merlin_schema(self.fs, self.files))  # NVTabular exports

    # -- planning -----------------------------------------------------------
    @property
    def _pieces(self) -> list[Any]:
        # Parquet row groups are grouped into pieces on first use: the grouping
        # decodes a sample of the first file (see ParquetFiles.group), which a loader
        # reading the whole dataset by row groups never needs.
        if self._planned is None:
            self._planned = self._parquet.group(self.part_size)
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
            if self._npartitions is not None:
                n = self._table.num_rows
                bounds = [n * i // self._npartitions for i in range(self._npartitions + 1)]
                self._pieces = [TablePiece(a, b) for a, b in zip(bounds, bounds[1:]) if b > a] or [TablePiece(0, 0)]
            else:
                self._pieces = table_pieces(self._table, self.part_size)
            return self._table.schema
        if self.engine == "dask":
            self._pieces = list(range(self._ddf.npartitions))
            schema = frame_to_arrow(self._ddf._meta).schema
            untyped = [f.name for f in schema if pa.types.is_null(f.type)]
            if untyped:
                # object columns (lists, with dask's convert-string off) show their type
                # only in data: the first partition's rows give it
                sample = frame_to_arrow(self._ddf[untyped].get_partition(0).compute()).schema
                schema = pa.schema([sample.field(f.name) if f.name in untyped else f for f in schema])
            return schema
        if self.engine == "parquet":
            self._parquet = ParquetFiles(self.fs, self.files, self._folders, self._file_tags,
                                         self.strict_schema, self._stored_types())
            return self._parquet.plan()
        self._csv = CsvFiles(self.fs, self.files, self._file_tags, self.read_kwargs, self.part_size)
        schema = self._csv.plan(MAX_CSV_COLUMNS)
        self._pieces = self._csv.pieces
        return schema

    def _stored_types(self) -> dict[str, pa.DataType]:
        """The Arrow types of the stored schema's scalar columns (hive partition
        columns take theirs from it, see :func:`~tabstream.pipeline.paths.hive_partitions`)."""
        out = {}
        for col in self._stored_schema or []:
            if col.is_list or col.dtype == "unknown":
                continue
            try:
                out[col.name] = dtype_to_arrow_type(col.dtype)
            except (TypeError, ValueError):
                continue
        return out

    def _merge_schema(self, given: Schema | None) -> Schema:
        cols = []
        stored = given or self._stored_schema
        for field in self._arrow_schema:
            dtype, is_list = arrow_type_to_dtype(field.type)
            ragged = is_list and not pa.types.is_fixed_size_list(field.type)  # fixed: one length
            col = ColumnSchema(field.name, dtype, is_list=is_list, is_ragged=ragged)
            if stored is not None and field.name in stored:
                known = stored[field.name]
                col = ColumnSchema(field.name, dtype, known.tags, known.properties,
                                   is_list=is_list, is_ragged=known.is_ragged and ragged)
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
        if not cols and isinstance(piece, (ParquetPiece, TablePiece)):
            n = piece.num_rows if isinstance(piece, ParquetPiece) else piece.stop - piece.start
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
            rows = piece.num_rows if isinstance(piece, ParquetPiece) else None
            if rows is not None:
                mask = self.piece_mask(piece)
                rows = rows if mask is None else int(np.count_nonzero(mask))
            counts.append(rows)
        return counts

    @property
    def filtered(self) -> bool:
        """Whether this Dataset keeps only some of the rows its files hold: it has
        ``filters=`` or is a split (see :meth:`piece_mask`)."""
        return bool(self._active_filters())

    @property
    def stored_schema(self) -> Schema | None:
        """The Schema stored with the files: an export's ``_schema.json`` (or the
        ``tabstream.schema`` metadata of its parquet files), or an NVTabular export's
        Merlin schema; ``None`` without one. :attr:`schema` is the columns the files
        hold, with the tags and properties of this one (or of ``schema=``)."""
        return self._stored_schema

    @property
    def footers(self) -> dict[str, pq.FileMetaData]:
        """The parquet footers read when the Dataset was made, by file (as
        :attr:`files` lists them); empty for other engines."""
        return dict(self._parquet.file_metadata) if self._parquet is not None else {}

    def fragments(self) -> list[Fragment]:
        """The Dataset's parquet files as a reader reads them: one
        :class:`~tabstream.pipeline.parquet_files.Fragment` per file, in the order of
        :attr:`files`, with its footer, its hive partition values and every row group
        (:class:`~tabstream.pipeline.parquet_files.RowGroup`) with the rows the file
        holds in it and those this Dataset keeps. Without a split or ``filters=`` this
        reads nothing (the footers were read when the Dataset was made); with one, the
        rows kept are counted as :meth:`piece_masks` does (a random split reads
        nothing, a filter or a value split the columns it tests)::

            >>> ds = Dataset("out/train")                                # doctest: +SKIP
            >>> [(f.path, [(rg.index, rg.num_rows) for rg in f.row_groups])
            ...  for f in ds.fragments()]                                # doctest: +SKIP
            [('out/train/part_00000.parquet', [(0, 131072), (1, 68928)]), ...]

        Only parquet Datasets have fragments: a ValueError names the engine otherwise.
        """
        if self._parquet is None:
            raise ValueError(f"{self!r}: fragments() lists parquet files, and this Dataset's engine is "
                             f"{self.engine!r}: write it with to_parquet(...) and read that folder")
        footers = self._parquet.file_metadata
        hive = self._parquet.hive_values
        groups: dict[str, list[RowGroup]] = {path: [] for path in self.files}
        if not self._active_filters():
            # Every row group as stored: the pieces (and the sample decoded to size
            # them) are not needed.
            for path in self.files:
                md = footers[path]
                for g in range(md.num_row_groups):
                    stored = md.row_group(g).num_rows
                    groups[path].append(RowGroup(g, stored, stored))
        else:
            for piece, mask in zip(self._pieces, self.piece_masks(), strict=True):
                offset = 0
                for g, stored in zip(piece.row_groups, piece.group_rows, strict=True):
                    keep = None if mask is None else mask[offset:offset + stored]
                    offset += stored
                    kept = stored if keep is None else int(np.count_nonzero(keep))
                    groups[piece.path].append(
                        RowGroup(g, stored, kept, None if keep is None or kept == stored else keep))
        return [Fragment(path, footers[path], tuple(groups[path]), dict(hive.get(path, {})))
                for path in self.files]

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
        if self._cache.auto and os.getpid() != self._cache.owner_pid:
            return self._read_piece_raw
        if self.cache:
            return self._read_cached
        if self._cache.auto and self.engine == "parquet" and (keep or self._cache.folder is not None):
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
        whole = isinstance(piece, CsvPiece)
        if whole:
            dictionary = ()  # a parsed CSV block has no dictionary pages
        if whole and columns is not None:
            self._check_columns(columns)
        return self._cache.read(self._read_piece_raw, self._piece_index[piece], piece, columns, dictionary,
                                whole=whole, names=self._arrow_schema.names, parquet=self.engine == "parquet",
                                npartitions=self.npartitions, write=write)

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
        if isinstance(piece, TablePiece):
            assert self._table is not None
            t = self._table.slice(piece.start, piece.stop - piece.start)
            return t.select(list(columns)) if columns is not None else t
        if isinstance(piece, ParquetPiece):
            return self._parquet.read(piece, columns, dictionary, self.backend_name)
        if isinstance(piece, CsvPiece):
            with stores.translate_store_errors(piece.path):
                t = self._csv.read(piece)
            return t.select(list(columns)) if columns is not None else t
        from tabstream.pipeline.execution import compute_partition

        part = compute_partition(self._ddf, piece)
        t = frame_to_arrow(part)
        return t.select(list(columns)) if columns is not None else t

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
        return [self._view(f) for f in random_splits(fractions, seed)]

    def split_by_value(self, column: str, groups: Sequence[Sequence[Any]]) -> list[Dataset]:
        """One dataset per group of values of ``column``, e.g. a day column:
        ``train, valid = ds.split_by_value("day", [range(1, 7), [7]])``."""
        return [self._view(f) for f in value_splits(column, groups, self._arrow_schema)]

    def _view(self, row_filter: Any) -> Dataset:
        if self._row_filter is not None:
            raise ValueError("splitting an already split dataset is not supported; split once into all parts")
        view = copy.copy(self)
        view._token = uuid.uuid4().hex  # other rows: another Dataset to dask
        view._row_filter = row_filter
        view._cache = copy.copy(self._cache)  # kept partitions are counted per Dataset
        view._piece_index = {p: i for i, p in enumerate(self._pieces)}
        return view

    @property
    def num_rows(self) -> int:
        if self._active_filters():
            return int(sum(int(np.count_nonzero(m)) for m in self.piece_masks()))
        if self.engine == "parquet":
            return self._parquet.num_rows
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

        backend = backends.get(self.backend_name)
        if self.engine == "dask" and columns is None and not self._active_filters() and \
                backend.owns_frame(self._ddf._meta):
            return self._ddf  # the frame given, unchanged (not when filters or a split drop rows)
        cols = list(columns) if columns is not None else None
        target = self._arrow_schema if cols is None else pa.schema([self._arrow_schema.field(c) for c in cols])
        return backend.dask_frame(_ReadArrow(self, cols), self._pieces, target)

    def to_cpu(self) -> None:
        """NVTabular's ``to_cpu()``: run this Dataset's ops with the CPU (arrow) backend."""
        self.backend_name = backends.choose(True)
        self.cpu = True

    def to_gpu(self) -> None:
        """NVTabular's ``to_gpu()``: the GPU backend (an error naming what is missing
        when cudf or a GPU is not there)."""
        self.backend_name = backends.choose(False)
        self.cpu = False

    def compute(self, columns: Sequence[str] | None = None) -> Any:
        """The whole dataset in memory as one DataFrame (small data only), as
        NVTabular's ``Dataset.compute()``: ``to_ddf().compute()`` with a fresh
        0..n-1 index (pandas on the arrow backend, cudf on the cudf backend)."""
        return self.to_ddf(columns).compute().reset_index(drop=True)

    def to_parquet(self, output_path: str, dtypes: dict[str, Any] | None = None, **kwargs: Any):
        """Export the dataset unchanged but for the casts of ``dtypes={column: dtype}``
        (see :func:`tabstream.pipeline.export.export`)."""
        from tabstream.pipeline.export import export

        kwargs.setdefault("client", backends.execution_client(self.backend_name))
        return export(self, None, output_path, dtypes=dtypes, **kwargs)

    def to_npy(self, output_path: Any, append: bool = False) -> str:
        """Write the dataset as one 2-D ``.npy`` array, as NVTabular/Merlin's ``to_npy``:
        scalar columns in order, then each fixed-length list column as ``name_0 ..
        name_{n-1}``, in one common dtype. Strings, nulls and ragged lists are refused
        (see :mod:`tabstream.pipeline.npy`). Returns the path written."""
        from tabstream.pipeline.npy import write_npy

        return write_npy(self.read_piece, self.pieces, output_path, append=append)

    def __dask_tokenize__(self) -> tuple[str, str]:
        """One token per Dataset object (and its copies in other processes), never
        shared with another Dataset. Tokenized by its attributes, two Datasets of one
        path read at different times were the same to dask, which reuses a live
        graph's expression of the same token: a file rewritten and read through a new
        Dataset while the old one lived (a failed read's traceback kept it) gave
        rows of the old file from the old Dataset's partition cache."""
        return ("tabstream.Dataset", self._token)

    def __repr__(self) -> str:
        src = self.files[0] if self.files else self.engine
        more = f" (+{len(self.files) - 1} files)" if len(self.files) > 1 else ""
        return f"Dataset({src!r}{more}, engine={self.engine!r}, npartitions={self.npartitions})"


class _ReadArrow:
    """Picklable partition reader of ``to_ddf`` (the backend makes its frames of it)."""

    def __init__(self, ds: Dataset, columns: list[str] | None) -> None:
        self.ds, self.columns = ds, columns

    def __call__(self, piece: Any) -> pa.Table:
        return self.ds.read_piece(piece, self.columns)


def _count_rows(ds: Dataset, piece: Any) -> int:
    return ds.read_piece(piece).num_rows


_is_local = stores.is_local



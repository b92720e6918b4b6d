"""Atomic, split, optionally shuffled parquet export.

Layout of an export folder::

    out/train/part_00000.parquet ...   data files (snappy; row groups of <= row_group_size)
    out/train/_schema.json             the output Schema (tags, cardinalities, ...)
    out/train/_manifest.json           {"num_rows": N, "files": [{"path", "num_rows"}], ...}
    out/train/_metadata                parquet footers of every file
    out/train/_keysets/part_00000.parquet   with write_keysets: (column, id) pairs per file

Every data file also carries the output Schema as JSON in its parquet key-value
metadata (key ``tabstream.schema``), so files copied without ``_schema.json`` keep
their tags and properties.

Everything beside the data files starts with ``_``, so pandas, pyarrow.dataset,
polars and dask read the folder as it is (``schema.json``, the name older versions
wrote, is still read by :class:`~tabstream.pipeline.dataset.Dataset`). The folder's
format, its publishing and its checks are :mod:`tabstream.pipeline.export_folder`'s.

Everything is written into a hidden sibling folder
``.train.tmp-<host>-<pid>-<id>`` and renamed to ``train`` only when complete, so
a failed or killed export never leaves a folder that looks finished. Into an existing
folder of other files it is written in a hidden folder inside, then moved in file by
file under a lock and a journal, ``_manifest.json`` last
(:class:`~tabstream.pipeline.export_folder.PublishInto`). A failed
export closes every file it opened and removes its folder; the folder of a killed
one is removed by the next export to the same place (when its process is gone, or,
for one started on another host, when it is older than a day). An export of zero
rows is refused: readers refuse an empty folder, so it must not look finished.

Files and work are split into *writer groups*, at most one per dask worker (threads
of the local scheduler, or the workers of a distributed client). The files get
equal rows (``N // F``, the first ``N % F`` one more; see :func:`export`): group
``g`` writes a run of files and reads the partitions their rows come from, one at a
time (a partition whose rows fall into two groups' files is read by both, each
taking its part):

* ``shuffle=None``: rows keep their order (file k holds the k-th run of rows).
* ``"per_partition"``: rows of each partition are permuted before writing.
* ``"per_worker"``: each permuted partition is spread over the files of its group,
  in proportion to the rows each still takes, so every file mixes rows of all the
  group's partitions.
* ``"full"``: a two-pass global shuffle: rows are scattered to random files (how
  many of a partition's rows each file gets is a draw without replacement from the
  files' rows), then each file's rows are permuted (memory: one output file at a
  time).
"""

from __future__ import annotations

import functools
import posixpath
import uuid
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import quote

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from dask import delayed

from tabstream.core.dtypes import (
    arrow_type_to_dtype,
    dtype_to_arrow_type,
    is_list_type,
    list_value_type,
)
from tabstream.core.errors import (
    DataError,
    ExportError,
    SchemaError,
    TabstreamError,
    out_of_memory,
    ran_out_of_memory,
)
from tabstream.core.pages import small_pages
from tabstream.core.schema import Schema, Tags
from tabstream.core.scratch import owner_tag, write_failure
from tabstream.core.threads import release_freed_memory
from tabstream.pipeline import export_folder
from tabstream.pipeline.execution import TaskGroup, compute, local_compute, num_workers, shared_pool
from tabstream.pipeline.export_folder import (
    SCHEMA_KEY,
    ObjectStorePublish,
    PublishInto,
    check_target,
)
from tabstream.pipeline.stores import is_local

__all__ = ["ExportResult", "export"]

SHUFFLES = (None, "per_partition", "per_worker", "full")
DEFAULT_ROW_GROUP_SIZE = 128 * 1024


class ExportResult:
    """What an export wrote: ``path``, ``files`` (relative names), ``num_rows`` and
    ``rows_per_file``."""

    def __init__(self, path: str, files: list[str], rows_per_file: list[int]) -> None:
        self.path = path
        self.files = files
        self.rows_per_file = rows_per_file

    @property
    def num_rows(self) -> int:
        return int(sum(self.rows_per_file))

    def __repr__(self) -> str:
        return f"ExportResult({self.path!r}, files={len(self.files)}, num_rows={self.num_rows})"


def export(
    dataset: Any,
    workflow: Any,
    output_path: str,
    out_files_per_proc: int | None = None,
    num_files: int | None = None,
    shuffle: str | None = None,
    partition_on: list[str] | None = None,
    write_keysets: bool = False,
    seed: int | None = None,
    overwrite: bool = False,
    client: Any = None,
    row_group_size: int = DEFAULT_ROW_GROUP_SIZE,
    compression: str = "snappy",
    storage_options: dict | None = None,
    progress: bool | None = None,
    dtypes: dict[str, Any] | None = None,
) -> ExportResult:
    """Write ``workflow.transform(dataset)`` (or the dataset itself when ``workflow`` is
    None) as parquet files plus ``_schema.json``, ``_manifest.json`` and ``_metadata``.

    How many files:

    * ``num_files=F``: exactly ``F`` files.
    * ``out_files_per_proc=k``: ``k`` files per worker (thread of the local scheduler,
      or worker of ``client``) that has a partition to read: ``k * min(workers,
      partitions)`` files. Neither given: one per such worker.

    The rows are split equally whatever the partitions: of ``N`` rows, file ``f``
    holds ``N // F`` rows, one more for the first ``N % F`` files (so files differ by
    at most one row; a one-partition input asked for 2 files writes 2 halves). Asked
    for more files than there are rows, one file per row is written, with a warning.
    The export knows each partition's rows from the parquet footers, or counts them
    with one read of a column (a Dataset that kept its partitions after a fit reads
    its cache); when the workflow changes the row count (``Filter``, ``Dropna``) it
    counts the rows after the workflow first, one more pass over the data. ::

        40,960 rows in 5 partitions of 8,192, num_files=2:
            part_00000.parquet  20,480 rows   (partitions 0, 1 and half of 2)
            part_00001.parquet  20,480 rows   (the other half of 2, then 3 and 4)

    ``shuffle``: ``None`` keeps the rows in order (file 0 holds the first rows);
    ``"per_partition"`` permutes each partition's rows; ``"per_worker"`` also spreads
    each partition over all files of its worker; ``"full"`` sends every row to a
    random file (each file an equal-sized, uniform draw of all rows), then permutes
    each file. ``seed`` makes the shuffle repeatable.

    ``partition_on=[columns]`` writes hive folders ``col=value/`` (values
    percent-encoded; a column name holding ``/``, ``..``, ``=`` or starting with ``.`` or
    ``_`` is refused). ``overwrite=False`` refuses an ``output_path`` that holds an
    export with :class:`FileExistsError`, also when another export puts its folder
    there first; with ``overwrite=True`` the last export to finish is the one in
    place, whole. On an object store (no rename) two exports to one prefix never
    run together: each takes a lock in the prefix with an exclusive write (S3's
    ``If-None-Match``), and the second to start fails with :class:`FileExistsError`
    naming the prefix, also with ``overwrite=True``, so the prefix holds one export,
    whole (see :class:`~tabstream.pipeline.export_folder.ObjectStorePublish`, and
    docs/scaling-out.md for stores that ignore the condition). A local folder of
    other files is exported into, without ``overwrite``: they stay, and readers read
    the export's files alone (see
    :class:`~tabstream.pipeline.export_folder.PublishInto`); a file of theirs with a
    name the export writes is refused, naming it.
    A full or read-only folder is an :class:`~tabstream.core.errors.ExportError`
    naming it; nothing is left behind.

    ``dtypes={column: dtype}`` casts those output columns as they are written (as
    NVTabular's ``to_parquet(dtypes=...)``), and ``_schema.json`` records the new
    dtypes; a dtype is a name (``"int32"``), a numpy dtype or a pyarrow type (a list
    column's values are cast). The cast is safe: a value the new type cannot hold
    (an id beyond ``int32``, a float with a fraction into an integer type) is a
    :class:`~tabstream.core.errors.DataError` naming the column, the value and the
    dtype, and nothing is written. ::

        {"id": int64 [7, 3000000000]}, dtypes={"id": "int32"}
            DataError: ... column 'id': value 3000000000 does not fit int32 ...
    """
    if shuffle not in SHUFFLES:
        raise ValueError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
    if partition_on is not None:
        if isinstance(partition_on, str) or not all(isinstance(c, str) for c in partition_on):
            raise TypeError(f"partition_on must be a list of column names, got {partition_on!r}")
        partition_on = list(partition_on)
        if shuffle == "full":
            raise ValueError("partition_on cannot be combined with shuffle='full'; use "
                             "shuffle='per_worker' or 'per_partition'")
    for name, value in (("out_files_per_proc", out_files_per_proc), ("num_files", num_files)):
        if value is not None and (not isinstance(value, (int, np.integer)) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if out_files_per_proc is not None and num_files is not None:
        raise ValueError("give out_files_per_proc or num_files, not both")
    if row_group_size < 1:
        raise ValueError(f"row_group_size must be positive, got {row_group_size}")

    out_schema = workflow.output_schema if workflow is not None else dataset.schema
    casts = _output_casts(out_schema, dtypes)  # refused before anything is written
    if partition_on:
        _check_partition_columns(out_schema, partition_on)
    fs, _, paths = fsspec.core.get_fs_token_paths(output_path, storage_options=storage_options or {})
    root = paths[0].rstrip("/")
    export_folder.refuse_input_overlap(fs, root, output_path, getattr(dataset, "fs", None),
                                       getattr(dataset, "files", []))
    mode = check_target(fs, root, output_path, overwrite)
    parent, name = posixpath.split(root)
    store = None if is_local(fs) else ObjectStorePublish(fs, root, output_path, overwrite)
    into = None
    if store is None:
        export_folder.remove_export_leftovers(fs, parent, name)
        if mode == "into":  # a folder of other files: published into it, beside them
            into = PublishInto(fs, root, output_path, overwrite)
            try:
                tmp = into.begin()
            except OSError as exc:
                if isinstance(exc, FileExistsError) or write_failure(exc, root, "output_path") is None:
                    raise
                raise _write_error(output_path, root, exc) from exc
        else:
            tmp = posixpath.join(parent, f".{name}.tmp-{owner_tag()}-{uuid.uuid4().hex[:12]}")
            try:
                fs.makedirs(tmp, exist_ok=True)
            except OSError as exc:
                raise _write_error(output_path, parent, exc) from exc
    else:
        tmp = root  # no rename on an object store: written in place, manifest last

    if seed is None:
        seed = int(np.random.SeedSequence().entropy % 2**63)  # owned entropy, no global RNG
    pieces = dataset.pieces
    workers = num_workers(client)
    total_files = num_files or (out_files_per_proc or 1) * min(workers, max(1, len(pieces)))
    groups = min(workers, total_files)
    if workflow is not None:
        schema = workflow.output_schema
        columns = workflow.input_columns
    else:
        schema = dataset.schema
        columns = None
    for col, arrow_type in casts.items():
        dtype, is_list = arrow_type_to_dtype(arrow_type)
        schema = schema.replace(schema[col].with_dtype(dtype, is_list=is_list))
    keyset_columns = [c.name for c in schema.select_by_tag(Tags.CATEGORICAL)] if write_keysets else []
    if partition_on:
        keyset_columns = [c for c in keyset_columns if c not in partition_on]
    if store is not None:
        store.begin()  # the prefix's lock, taken or refused (FileExistsError) before anything is written

    try:
        plan = _Plan(dataset, workflow, columns, tmp, fs, row_group_size, compression, keyset_columns, seed,
                     schema.to_json().encode(), store.file_tag if store is not None else "",
                     partition_on or [], casts, delta_encoded_columns(schema))
        if into is not None:  # names known now: refused before anything is written
            into.check_names({export_folder.SCHEMA_FILE, "_metadata", *(
                [] if partition_on else [f"part_{i:05d}.parquet" for i in range(total_files)])})
        with _task_pool(client) as pool, small_pages():
            counts = _input_rows(plan, client, pool, progress)
            for attempt in (0, 1):
                try:
                    results = _write_all(plan, counts, total_files, groups, shuffle, client, pool, progress)
                    break
                except _RowsChanged as changed:
                    if attempt:
                        raise ExportError(
                            f"export to {output_path!r} failed, nothing was written: partition "
                            f"{changed.piece} gave {changed.rows} rows after the workflow, "
                            f"{changed.planned} the pass before; a Filter or LambdaOp that is not "
                            "a pure function of the rows?") from None
                    # the workflow changes the row count (a Filter): count its output,
                    # then write again, split by those counts; the first pass's running
                    # tasks end before its files go (a writer still at work would put a
                    # file into the cleared folder, under a name the second pass writes)
                    if pool is not None:
                        pool.settle()
                    _clear_written(fs, tmp, store)
                    tasks = [delayed(_output_rows, pure=False)(plan, p) for p in range(len(pieces))]
                    counts = [int(n) for n in _run(tasks, client, pool, "export: count rows", progress)]
        # the pages Arrow's allocator kept for the export's freed partitions go back to
        # the system, as after a fit: a training loop started next in this process does
        # not sit on them (16M-row Criteo export from parquet: 443 -> about 200 MB
        # anonymous RSS once it has ended, benchmarks/RESULTS.md, session 21)
        release_freed_memory()
        results.sort()
        if 0 < sum(counts) < total_files:
            warnings.warn(f"export to {output_path!r}: {total_files} files were asked for, but "
                          f"the data has {sum(counts)} rows: {sum(counts)} files of one row written",
                          stacklevel=2)
        files = [f for f, rows in results if rows > 0]
        rows = [rows for f, rows in results if rows > 0]
        if not files:
            raise ExportError(
                f"export to {output_path!r} refused: {dataset!r} has no rows"
                f"{' after the workflow' if workflow is not None else ''}, and an empty export "
                "would look finished while every reader refuses it; nothing was written",
                hint="check the input path (an empty file?) and the filters of the workflow",
            )
        extra = None
        if into is not None:
            extra = into.manifest_fields({f.split("/")[0] for f in files} | {
                export_folder.SCHEMA_FILE, "_metadata", *(["_keysets"] if write_keysets else [])})
        if store is not None:  # still this export's prefix? then the sidecars, manifest last
            store.check_held()
            extra = store.manifest_fields()
        export_folder.write_sidecars(fs, tmp, schema, files, rows, extra, store)
        if into is not None:
            into.finish()
        elif store is None:
            export_folder.publish(fs, tmp, root, overwrite, output_path)
        else:
            store.finish(files)
    except BaseException as exc:
        if into is not None:
            into.abort()
        elif store is None:
            try:
                fs.rm(tmp, recursive=True)
            except FileNotFoundError:
                pass
        else:
            store.abort()
        # Errors of the input (DataError, SchemaError, ...) and our own refusals keep
        # their type and message: they name the file, line or column at fault.
        if isinstance(exc, (KeyboardInterrupt, SystemExit, FileExistsError)):
            raise
        if ran_out_of_memory(exc):  # numpy's, Arrow's (ArrowMemoryError), Python's; a thread
            raise out_of_memory(f"export to {output_path!r} (nothing was written)", exc,
                                "the Dataset's part_size (each task holds a partition), the number "
                                "of workers (tasks at once), or row_group_size") from exc
        where = root if into is not None else parent
        if store is None and write_failure(exc, where, "output_path") is not None:
            raise _write_error(output_path, where, exc) from exc
        if isinstance(exc, TabstreamError):
            raise
        raise ExportError(f"export to {output_path!r} failed, nothing was written: {exc}") from exc
    if into is not None:
        into.release()
    return ExportResult(output_path, files, rows)


def _output_casts(schema: Schema, dtypes: dict[str, Any] | None) -> dict[str, pa.DataType]:
    """The Arrow type each column of ``dtypes`` is written as (a list column: a list of
    it, unless a list type is given); unknown columns are refused, naming them."""
    if not dtypes:
        return {}
    if not isinstance(dtypes, dict):
        raise TypeError(f"dtypes must be a dict {{column: dtype}}, got {type(dtypes).__name__}")
    unknown = [c for c in dtypes if c not in schema.column_names]
    if unknown:
        raise SchemaError(f"to_parquet(dtypes=...): column(s) {unknown} are not in the output; "
                          f"the output columns are {schema.column_names}")
    casts = {}
    for col, dtype in dtypes.items():
        try:
            arrow_type = dtype_to_arrow_type(dtype)
        except TypeError as exc:
            raise TypeError(f"to_parquet(dtypes=...): column {col!r}: {exc}") from exc
        if schema[col].is_list and not is_list_type(arrow_type):
            arrow_type = pa.list_(arrow_type)
        casts[col] = arrow_type
    return casts


def cast_columns(table: pa.Table, casts: dict[str, pa.DataType]) -> pa.Table:
    """``table`` with the columns of ``casts`` cast to their types, safely: a value the
    type cannot hold is a :class:`DataError` naming the column, the value and the type.

    >>> cast_columns(pa.table({"a": [1, 2]}), {"a": pa.int8()}).schema.types
    [DataType(int8)]
    """
    for col, arrow_type in casts.items():
        i = table.schema.get_field_index(col)
        values = table.column(i)
        if values.type == arrow_type:
            continue
        try:
            cast = values.cast(arrow_type, safe=True)
            if _overflowed(values, cast):  # Arrow casts 1e300 to float32's inf unchecked
                raise pa.ArrowInvalid(f"a finite value is out of {arrow_type}'s range")
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            dtype = arrow_type_to_dtype(arrow_type)[0]
            raise DataError(
                f"to_parquet(dtypes=...): column {col!r}: value {_unfit_value(values, arrow_type)} "
                f"does not fit {dtype} ({values.type} -> {arrow_type}: {exc}); nothing was written",
                hint=f"give column {col!r} a wider dtype in dtypes=, or change its values in the workflow",
            ) from exc
        table = table.set_column(i, col, cast)
    return table


def _overflowed(values: pa.ChunkedArray, cast: pa.ChunkedArray) -> bool:
    """Whether a float narrowing made a finite value infinite."""
    if is_list_type(values.type):
        values = pa.chunked_array([pc.list_flatten(c) for c in values.chunks], list_value_type(values.type))
        cast = pa.chunked_array([pc.list_flatten(c) for c in cast.chunks], list_value_type(cast.type))
    if not (pa.types.is_floating(values.type) and pa.types.is_floating(cast.type)):
        return False
    return bool(pc.any(pc.and_(pc.is_finite(values), pc.invert(pc.is_finite(cast)))).as_py())


def _unfit_value(values: pa.ChunkedArray, arrow_type: pa.DataType) -> str:
    """The first value of ``values`` that a safe cast to ``arrow_type`` refuses (found
    by halving: a few casts, whatever the length), as written in the column."""
    if is_list_type(values.type):
        values = pa.chunked_array([pc.list_flatten(c) for c in values.chunks], list_value_type(values.type))
        arrow_type = list_value_type(arrow_type)

    def fails(part: pa.Array) -> bool:
        try:
            return _overflowed(pa.chunked_array([part]), pa.chunked_array([part.cast(arrow_type, safe=True)]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            return True  # the checked cast refused a value of this part: it is in here

    for chunk in values.chunks:
        if not fails(chunk):
            continue
        lo, hi = 0, len(chunk)  # the first failing value is in [lo, hi)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fails(chunk.slice(lo, mid - lo)):
                hi = mid
            else:
                lo = mid
        return repr(chunk[lo].as_py())
    return "(one of them)"


def _write_error(output_path: str, folder: str, exc: BaseException) -> BaseException:
    """The error of an export that could not write in ``folder`` (a full or read-only
    filesystem: named with the setting that moves it)."""
    why = write_failure(exc, folder, "output_path")
    if why is None:
        return ExportError(f"export to {output_path!r} failed, nothing was written: {exc}")
    return ExportError(f"export to {output_path!r} failed, nothing was written: {why}",
                       hint="pass another output_path (the export writes there and beside it)")


@contextmanager
def _task_pool(client: Any) -> Iterator[TaskGroup | None]:
    """This export's local (threaded) tasks as a group, so that when one task fails
    the export waits for its running siblings (and drops the queued ones) before it
    removes the temporary folder: no task is left writing, or holding a file open,
    in a folder that is being deleted. On the process's shared threads where it can
    (see :func:`~tabstream.pipeline.execution.shared_pool`), else on its own."""
    if client is not None:
        yield None
        return
    group = TaskGroup(shared_pool())
    try:
        yield group
    finally:
        group.close()


def _run(tasks: list[Any], client: Any, pool: TaskGroup | None, desc: str,
         progress: bool | None) -> list[Any]:
    """:func:`~tabstream.pipeline.execution.compute`, on ``pool`` when given (passed
    to this computation alone, not set in dask's global config)."""
    if pool is None or not tasks:
        return compute(tasks, client, desc=desc, progress=progress)
    from tqdm.dask import TqdmCallback

    with TqdmCallback(desc=desc, disable=None if progress is None else not progress, unit="task"):
        return local_compute(tasks, pool=pool)


#: ids below this bound are written DELTA_BINARY_PACKED (see delta_encoded_columns)
_DELTA_MAX_ID = 2**32


def delta_encoded_columns(schema: Schema) -> list[str]:
    """The output columns an export writes with Parquet's ``DELTA_BINARY_PACKED``
    encoding instead of a dictionary: scalar integer columns tagged categorical whose
    ids are known to lie in ``[0, 2**32)`` (Categorify's, HashBucket's, HashedCross's).

    Such ids need about ``log2(cardinality) + 1`` bits each either way, but a dictionary
    hashes every value to find its index and a reader gathers every value back from
    the dictionary, where delta packing is arithmetic: 2M Criteo rows (26 id columns)
    wrote in 20% less CPU and read back in 33% less, the files 1.7% larger
    (benchmarks/RESULTS.md, session 23). Ids of unknown range (a raw 64-bit hash tagged
    categorical) keep the dictionary, which stays small when they repeat."""
    out = []
    for col in schema:
        if col.is_list or not col.dtype.startswith(("int", "uint")) or Tags.CATEGORICAL not in col.tags:
            continue
        domain = col.properties.get("domain") or {}
        low, high = domain.get("min"), domain.get("max")
        if low is not None and high is not None and 0 <= int(low) and int(high) < _DELTA_MAX_ID:
            out.append(col.name)
    return out


def parquet_encodings(schema: pa.Schema, delta: list[str]) -> dict[str, Any]:
    """``ParquetWriter`` options writing the columns ``delta`` of ``schema`` (those
    present) with ``DELTA_BINARY_PACKED`` and the others as pyarrow does by default."""
    delta = [name for name in delta if name in schema.names]
    if not delta:
        return {}
    return {"use_dictionary": [path for path in _leaf_paths(schema.remove_metadata()) if path not in delta],
            "column_encoding": dict.fromkeys(delta, "DELTA_BINARY_PACKED")}


@functools.lru_cache(maxsize=64)
def _leaf_paths(schema: pa.Schema) -> tuple[str, ...]:
    """The parquet leaf paths of ``schema``'s columns (a list column's is
    ``"<name>.list.element"``), by which the writer takes its dictionary columns: an
    empty file of the schema says them exactly. About 4 ms, so kept per schema (an
    export partitioned on a column opens a writer per folder)."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    leaves = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    return tuple(leaves.column(i).path for i in range(len(leaves)))


class _Plan:
    """Everything a writer task needs (shipped to workers by dask)."""

    def __init__(self, dataset: Any, workflow: Any, columns: list[str] | None, tmp: str,
                 fs: Any, row_group_size: int, compression: str, keyset_columns: list[str],
                 seed: int, schema_json: bytes = b"", file_tag: str = "",
                 partition_on: list[str] | None = None,
                 casts: dict[str, pa.DataType] | None = None, delta: list[str] | None = None) -> None:
        self.partition_on = list(partition_on or [])
        self.delta = list(delta or [])  # written DELTA_BINARY_PACKED (delta_encoded_columns)
        self.casts = dict(casts or {})
        self.dataset = dataset
        self.schema_json = schema_json
        self.file_tag = file_tag
        self.workflow = workflow
        self.columns = columns
        self.tmp = tmp
        self.fs = fs
        self.row_group_size = row_group_size
        self.compression = compression
        self.keyset_columns = keyset_columns
        self.seed = seed
        # input columns only Categorify-like ops read: taken as parquet dictionaries
        # (a Workflow; the regrouping plan's stand-in reads plain columns)
        columns_of = getattr(workflow, "dictionary_columns", None)
        self.dictionary = columns_of(dataset) if columns_of is not None else []

    def read(self, piece_index: int) -> pa.Table:
        piece = self.dataset.pieces[piece_index]
        table = (self.dataset.read_piece(piece, self.columns, self.dictionary) if self.dictionary
                 else self.dataset.read_piece(piece, self.columns))
        if self.workflow is not None:
            table = self.workflow.transform_table(table, self.dataset.backend_name)
        return cast_columns(table, self.casts) if self.casts else table

    def rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])


# a file's per-partition unique ids are merged once more than this many wait
_KEYSET_MERGE = 8


class _FileWriter:
    """A parquet file opened on first write, with the keyset of its categorical ids."""

    def __init__(self, plan: _Plan, index: int, folder: str = "") -> None:
        self.plan = plan
        self.name = posixpath.join(folder, f"part_{index:05d}{plan.file_tag}.parquet")
        self.writer: pq.ParquetWriter | None = None
        self.f: Any = None
        self.rows = 0
        self.keys: dict[str, list[pa.Array]] = {c: [] for c in plan.keyset_columns}

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        if self.writer is None:
            path = posixpath.join(self.plan.tmp, self.name)
            if posixpath.dirname(self.name):
                self.plan.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            self.f = self.plan.fs.open(path, "wb")
            file_schema = table.schema
            if self.plan.schema_json:
                file_schema = file_schema.with_metadata(
                    {**(file_schema.metadata or {}), SCHEMA_KEY: self.plan.schema_json})
            self.writer = pq.ParquetWriter(self.f, file_schema, compression=self.plan.compression,
                                           **parquet_encodings(file_schema, self.plan.delta))
        elif not table.schema.equals(self.writer.schema):
            table = table.cast(self.writer.schema)
        self.writer.write_table(table, row_group_size=self.plan.row_group_size)
        self.rows += table.num_rows
        for col, found in self.keys.items():
            values = table.column(col)
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                values = pc.list_flatten(values)
            found.append(pc.unique(values))
            if len(found) > _KEYSET_MERGE:
                # merged as they come: a file's keyset holds at most its distinct ids
                # and a few partitions' worth more, however many partitions it takes
                found[:] = [pc.unique(pa.chunked_array(found))]

    def close(self) -> tuple[str, int]:
        """Finish the file; a writer that got no rows leaves no file."""
        if self.writer is None:
            return self.name, self.rows
        writer, f = self.writer, self.f
        self.writer = self.f = None
        try:
            writer.close()
        finally:
            f.close()
        if self.keys:
            self._write_keyset()
        return self.name, self.rows

    def abort(self) -> None:
        """Close the file after a failure (it is deleted with the temporary folder).
        Errors here are dropped: the failure being raised is the one to report."""
        writer, f = self.writer, self.f
        self.writer = self.f = None
        for handle in (writer, f):
            if handle is not None:
                try:
                    handle.close()
                except Exception:  # the failure being raised is the one to report
                    pass

    def _write_keyset(self) -> None:
        names, ids = [], []
        for col, found in self.keys.items():
            unique = pc.unique(pa.chunked_array(found)).cast(pa.int64())
            names.append(pa.array(np.full(len(unique), col, dtype=object), pa.string()))
            ids.append(unique)
        table = pa.table({"column": pa.concat_arrays(names), "id": pa.concat_arrays(ids)})
        path = posixpath.join(self.plan.tmp, "_keysets", self.name)
        self.plan.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        with self.plan.fs.open(path, "wb") as f:
            pq.write_table(table, f)


HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # the folder of a missing value (hive's name)


def _check_partition_columns(schema: Schema, partition_on: list[str]) -> None:
    missing = [c for c in partition_on if c not in schema.column_names]
    if missing:
        raise ValueError(f"partition_on: columns {missing} are not in the output; "
                         f"available: {schema.column_names}")
    if len(set(partition_on)) != len(partition_on):
        raise ValueError(f"partition_on names a column twice: {partition_on}")
    if len(partition_on) >= len(schema.column_names):
        raise ValueError("partition_on takes every column into the folder names, leaving no data "
                         "columns to write")
    for name in partition_on:
        bad = [part for part in ("/", "\\", "=", "..", "\x00") if part in name]
        if bad or not name or name.startswith((".", "_")):
            what = f"holds {bad[0]!r}" if bad else "is empty" if not name else f"starts with {name[0]!r}"
            raise ValueError(
                f"partition_on: column name {name!r} {what}, and becomes the folder name "
                f"'{name}=<value>': {'a path of other folders' if bad else 'a hidden folder readers skip'}; "
                f"rename the column first (Rename) or leave it out of partition_on")
        col = schema[name]
        if col.is_list or not (str(col.dtype).startswith(("int", "uint")) or str(col.dtype) in ("str", "string", "bool")):
            raise TypeError(f"partition_on: column {name!r} is {col.dtype}{' list' if col.is_list else ''}; "
                            "folders can be made from integer, boolean or string columns only")


def _hive_value(value: Any, column: str = "") -> str:
    """The folder name of ``value``: percent-encoded (``/``, ``=``, ``%`` and the like
    cannot make a path of other folders; ``..`` is only part of ``col=..``)."""
    if value is None:
        return HIVE_NULL
    if value == HIVE_NULL:
        raise DataError(f"partition_on: column {column!r} holds the value {HIVE_NULL!r}, the folder "
                        "name of a missing value: read back, these rows would be null; map it to "
                        "another value first or leave the column out of partition_on")
    if isinstance(value, bool):
        return str(value).lower()
    return quote(str(value), safe="")


class _PartitionedWriter:
    """One file writer per hive folder (``col=value/...``) for one output file index;
    the partition columns go into the folder names, not the files."""

    def __init__(self, plan: _Plan, index: int) -> None:
        self.plan = plan
        self.index = index
        self.writers: dict[str, _FileWriter] = {}

    def write(self, table: pa.Table) -> None:
        if table.num_rows == 0:
            return
        keys = table.select(self.plan.partition_on)
        combos = keys.group_by(self.plan.partition_on).aggregate([])
        data_columns = [c for c in table.column_names if c not in self.plan.partition_on]
        for row in combos.to_pylist():
            mask = None
            for name, value in row.items():
                test = pc.is_null(table[name]) if value is None else pc.equal(table[name], value)
                test = pc.fill_null(test, False)
                mask = test if mask is None else pc.and_(mask, test)
            folder = "/".join(f"{n}={_hive_value(v, n)}" for n, v in row.items())
            writer = self.writers.get(folder)
            if writer is None:
                writer = self.writers[folder] = _FileWriter(self.plan, self.index, folder)
            part = table.filter(mask).select(data_columns)
            # pandas' own metadata describes columns that are now in the folder names
            # (readers would try to rebuild them from it): drop it
            meta = {k: v for k, v in (part.schema.metadata or {}).items() if k != b"pandas"}
            writer.write(part.replace_schema_metadata(meta))

    def close(self) -> list[tuple[str, int]]:
        return [w.close() for w in self.writers.values()]

    def abort(self) -> None:
        for w in self.writers.values():
            w.abort()


class _RowsChanged(Exception):
    """A partition gave another number of rows than the plan was made for (the
    workflow changes the row count): the export is split again by counted rows."""

    def __init__(self, piece: int, rows: int, planned: int) -> None:
        super().__init__(piece, rows, planned)
        self.piece, self.rows, self.planned = piece, rows, planned


def _input_rows(plan: _Plan, client: Any, pool: TaskGroup | None, progress: bool | None) -> list[int]:
    """Rows of each input partition: from the parquet footers (and the rows a split or
    filter keeps) where the Dataset knows them, else counted by reading one column
    (a partition the Dataset keeps after a fit is read from its cache)."""
    dataset = plan.dataset
    known = dataset.piece_rows()
    if known is None:  # the buckets of a Groupby: counted after it
        tasks = [delayed(_output_rows, pure=False)(plan, p) for p in range(len(dataset.pieces))]
        return [int(n) for n in _run(tasks, client, pool, "export: count rows", progress)]
    counts: list[int | None] = list(known)
    unknown = [p for p, n in enumerate(counts) if n is None]
    if unknown:
        tasks = [delayed(_count_input, pure=False)(plan, p) for p in unknown]
        for p, n in zip(unknown, _run(tasks, client, pool, "export: count rows", progress), strict=True):
            counts[p] = int(n)
    return [int(n) for n in counts if n is not None]


def _count_input(plan: _Plan, p: int) -> int:
    columns = plan.columns[:1] if plan.columns else plan.dataset.schema.column_names[:1]
    return plan.dataset.read_piece(plan.dataset.pieces[p], columns).num_rows


@small_pages()  # also in a dask worker process
def _output_rows(plan: _Plan, p: int) -> int:
    return plan.read(p).num_rows


def _clear_written(fs: Any, tmp: str, store: ObjectStorePublish | None) -> None:
    if store is not None:
        store.remove_written()
    else:
        fs.rm(tmp, recursive=True)
        fs.makedirs(tmp, exist_ok=True)


def file_bounds(total_rows: int, files: int) -> np.ndarray:
    """Row ``bounds[f]`` is the first of file ``f`` (``files + 1`` bounds): files of
    equal rows, the first ``total_rows % files`` one row longer.

    >>> file_bounds(40_960, 2).tolist(), file_bounds(7, 3).tolist()
    ([0, 20480, 40960], [0, 3, 5, 7])
    """
    f = np.arange(files + 1, dtype=np.int64)
    return f * (total_rows // files) + np.minimum(f, total_rows % files)


def _group_slices(counts: list[int], lo: int, hi: int, last: bool) -> list[tuple[int, int, int]]:
    """``(piece, start, stop)``: the rows ``[lo, hi)`` of the export (pieces in order),
    as slices of the pieces. A piece planned empty is read by the group whose rows
    start where it sits (the last group for those at the end): were it not empty
    after all, that group finds out."""
    out, offset = [], 0
    for p, n in enumerate(counts):
        start, stop = max(lo, offset), min(hi, offset + n)
        if start < stop or (n == 0 and (lo <= offset < hi or (last and offset >= hi))):
            out.append((p, start - offset, max(start, stop) - offset))
        offset += n
    return out


def _write_all(plan: _Plan, counts: list[int], total_files: int, groups: int, shuffle: str | None,
               client: Any, pool: TaskGroup | None, progress: bool | None) -> list[tuple[str, int]]:
    """Write ``total_files`` files of ``file_bounds`` rows: group ``g`` writes a run of
    files and reads the pieces (or the part of a piece) their rows come from."""
    bounds = file_bounds(sum(counts), total_files)
    if shuffle == "full":
        return _full_shuffle(plan, counts, bounds, client, progress, pool)
    tasks = []
    for g in range(groups):
        files = list(range(g * total_files // groups, (g + 1) * total_files // groups))
        slices = _group_slices(counts, int(bounds[files[0]]), int(bounds[files[-1] + 1]), g == groups - 1)
        quotas = np.diff(bounds[files[0]:files[-1] + 2]).tolist()
        tasks.append(delayed(_write_group, pure=False)(plan, slices, counts, files, quotas, shuffle))
    return [r for group in _run(tasks, client, pool, "export", progress) for r in group]


@small_pages()  # also in a dask worker process
def _write_group(plan: _Plan, slices: list[tuple[int, int, int]], counts: list[int],
                 file_indices: list[int], quotas: list[int], shuffle: str | None) -> list[tuple[str, int]]:
    if plan.partition_on:
        parted = [_PartitionedWriter(plan, i) for i in file_indices]
        try:
            _deal(plan, slices, counts, parted, quotas, shuffle)
            return [r for w in parted for r in w.close()]
        except BaseException:
            for w in parted:
                w.abort()
            raise
    writers = [_FileWriter(plan, i) for i in file_indices]
    try:
        _deal(plan, slices, counts, writers, quotas, shuffle)
        return [w.close() for w in writers]
    except BaseException:
        for w in writers:
            w.abort()
        raise


def _read_planned(plan: _Plan, p: int, counts: list[int]) -> pa.Table:
    table = plan.read(p)
    if table.num_rows != counts[p]:
        raise _RowsChanged(p, table.num_rows, counts[p])
    return table


def _deal(plan: _Plan, slices: list[tuple[int, int, int]], counts: list[int], writers: list[Any],
          quotas: list[int], shuffle: str | None) -> None:
    """Read the group's pieces one at a time and hand their rows to ``writers``, writer
    ``j`` getting exactly ``quotas[j]`` rows: in order (``None``, ``per_partition``:
    writer ``j`` the ``j``-th run of rows), or each piece spread over all writers in
    proportion to what each still takes (``per_worker``)."""
    left = list(quotas)
    j = 0
    for p, start, stop in slices:
        table = _read_planned(plan, p, counts)
        if shuffle in ("per_partition", "per_worker"):
            # the whole piece permuted, then sliced: groups sharing a piece take
            # disjoint rows of one permutation
            table = table.take(plan.rng(p).permutation(table.num_rows))
        table = table.slice(start, stop - start)
        if shuffle == "per_worker" and len(writers) > 1:
            share = _shares(table.num_rows, left)
            at = 0
            for k, n in enumerate(share):
                writers[k].write(table.slice(at, n))
                left[k] -= n
                at += n
        else:
            at = 0
            while at < table.num_rows:
                while left[j] == 0:
                    j += 1
                n = min(left[j], table.num_rows - at)
                writers[j].write(table.slice(at, n))
                left[j] -= n
                at += n
        # written: not held while the next partition is read (the transformed table
        # refers to the input's buffers, a mapped cache file's pages among them)
        del table


def _shares(n: int, left: list[int]) -> list[int]:
    """``n`` rows split over writers that still take ``left`` rows, in proportion
    (largest remainders): when ``n == sum(left)`` every writer gets what it takes.

    >>> _shares(5, [4, 4, 2])
    [2, 2, 1]
    """
    room = np.asarray(left, dtype=np.int64)
    total = int(room.sum())
    if total == 0:
        return [0] * len(left)
    share = n * room // total
    rest = n - int(share.sum())
    if rest:
        frac = n * room - share * total
        order = np.argsort(-frac, kind="stable")[:rest]
        share[order] += 1
    return share.tolist()


def _full_shuffle(plan: _Plan, counts: list[int], bounds: np.ndarray, client: Any,
                  progress: bool | None, pool: TaskGroup | None) -> list[tuple[str, int]]:
    scatter = posixpath.join(plan.tmp, f"_scatter{plan.file_tag}")  # tagged: see ObjectStorePublish
    # how many rows of each piece go to each file: a draw without replacement from the
    # files' rows (piece after piece, from what is left), so every file gets exactly
    # its rows and each is a uniform draw from the whole export
    left = np.diff(bounds)
    draws = plan.rng(3 * 10**9)
    tasks = []
    for p, n in enumerate(counts):
        take = draws.multivariate_hypergeometric(left, n) if n else np.zeros_like(left)
        left = left - take
        tasks.append(delayed(_scatter_piece, pure=False)(plan, p, counts, take, scatter))
    _run(tasks, client, pool, "export: scatter", progress)
    total_files = len(bounds) - 1
    tasks = [delayed(_gather_file, pure=False)(plan, f, len(counts), scatter) for f in range(total_files)]
    results = _run(tasks, client, pool, "export: gather", progress)
    plan.fs.rm(scatter, recursive=True)
    return results


@small_pages()  # also in a dask worker process
def _scatter_piece(plan: _Plan, p: int, counts: list[int], take: np.ndarray, scatter: str) -> None:
    table = _read_planned(plan, p, counts)
    target = plan.rng(p).permutation(np.repeat(np.arange(len(take)), take))
    scatter_write(plan.fs, table, target, len(take),
                  lambda f: posixpath.join(scatter, f"f{f:05d}", f"p{p:06d}.parquet"), keep_empty=True)


def scatter_write(fs: Any, table: pa.Table, target: np.ndarray, buckets: int,
                  path_of: Any, keep_empty: bool) -> list[int]:
    """Write the rows of ``table`` with ``target == b`` to ``path_of(b)`` for every
    bucket ``b`` (rows keep their order inside a bucket); a bucket without rows is
    written only with ``keep_empty``. Returns the buckets written."""
    order = np.argsort(target, kind="stable")
    counts = np.bincount(target, minlength=buckets)
    table = table.take(order)
    start, written = 0, []
    for b, n in enumerate(counts):
        if n or keep_empty:
            path = path_of(b)
            fs.makedirs(posixpath.dirname(path), exist_ok=True)
            with fs.open(path, "wb") as fh:
                pq.write_table(table.slice(start, int(n)), fh)
            written.append(b)
        start += int(n)
    return written


@small_pages()  # also in a dask worker process
def _gather_file(plan: _Plan, f: int, npieces: int, scatter: str) -> tuple[str, int]:
    folder = posixpath.join(scatter, f"f{f:05d}")
    parts = []
    for p in range(npieces):
        with plan.fs.open(posixpath.join(folder, f"p{p:06d}.parquet"), "rb") as fh:
            parts.append(pq.read_table(fh))
    table = pa.concat_tables(parts)
    table = table.take(plan.rng(10**9 + f).permutation(table.num_rows))
    writer = _FileWriter(plan, f)
    try:
        writer.write(table)
        return writer.close()
    except BaseException:
        writer.abort()
        raise



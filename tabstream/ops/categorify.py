"""Categorify: map categorical values to contiguous integer ids.

Encoding of every output column::

    0                     padding (never produced; reserved for padded lists)
    1                     missing: null, and NaN in float columns
    [2, 2 + num_buckets)  out of vocabulary: values seen fewer than ``freq_threshold``
                          times, cut by ``max_size``, or unseen at fit time; with
                          ``num_buckets`` they are spread by the project hash
                          (``murmur3_32(value) % num_buckets``), else all map to 2
    2 + num_buckets ...   the vocabulary, most frequent first, ties by value

Missing is missing: null and NaN are the same missing value (id 1) whatever the
input (a pandas frame turns NaN into null, parquet keeps NaN: both give 1), and
``-0.0`` is the value ``0.0`` (one vocabulary entry, one hash). An empty string
and ``inf``/``-inf`` are ordinary values. See
:func:`tabstream.core.hashing.normalize_missing`.

``max_size=N`` bounds the embedding table at ``N`` rows, NVTabular's meaning: the
``2 + num_buckets`` reserved rows (``2 + 1`` without ``num_buckets``) plus the
``N - 2 - num_buckets`` most frequent values; the schema's cardinality is then at
most ``N``. ``Categorify(max_size=5)`` on ``["a", "a", "a", "b", "b", "c"]`` keeps
``a`` (id 3) and ``b`` (id 4); ``c`` is out of vocabulary (id 2).

>>> import pyarrow as pa
>>> from tabstream.ops import Categorify
>>> op = Categorify(freq_threshold=2).fit_table(pa.table({"c": ["a", "b", "a", None, "c", "b", "b"]}))
>>> op.transform(pa.table({"c": ["b", "a", "z", None]}))["c"].to_pylist()   # z: unseen, None: null
[3, 4, 2, 1]

Column groups (nested lists in the selection, or ``column_groups=``):

* ``encode_type="joint"``: the columns of a group share one vocabulary (counts are
  summed over the group); each column keeps its name.
* ``encode_type="combo"``: the combination of the group's values is the category;
  the output is one column named ``a_b`` for group ``["a", "b"]``. A row whose
  values are all missing (null or NaN) is missing (id 1); otherwise a missing part
  is part of the combination (NaN and null alike). Every group and every single
  name of the selection is encoded: ``[["a", "b"], "a", "b"]`` outputs ``a_b``,
  ``a`` and ``b``.

``single_table=True`` keeps each column's own vocabulary (fitted on that column
alone) but numbers them all in one table, as NVTabular does: ids ``0``, ``1`` and the
out-of-vocabulary ids are shared, then the first column's vocabulary, then the
second's right after it, in selection order. For columns ``a`` (values ``x``, ``y``)
and ``b`` (value ``z``): ``a`` gets ids 3-4, ``b`` id 5, and every column's cardinality
is the whole table's, 6, with one shared ``domain.name`` (``a_b``), so one embedding
table serves them all.

List (multi-hot) columns are encoded element by element and stay lists.

Statistics are per-partition value counts merged by a tree reduction. A partial
count table that grows beyond ``spill_rows`` distinct values is hash-partitioned
into ``spill_buckets`` buckets, written as one file of Arrow IPC streams (one per
bucket, read back by byte range) in a temporary folder, and merged bucket by bucket
at the end, so memory is bounded by one bucket, not by the cardinality. A fit of
more than 16 partitions combines them in two levels or more; there each result of a
combination short of the last waits for it beside up to 16 others, so it keeps at
most ``spill_rows / 16`` distinct values in memory (``spill_rows`` on a dask worker
without ``spill_dir``). In the final merge, each bucket's values below
``freq_threshold`` (the candidates kept for ``Workflow.update``) go to a
memory-mapped temporary file as the bucket is done.
Partials with many distinct values are kept in memory in the same bucket order and
merged bucket by bucket too (each bucket's hash aggregation fits the CPU cache), and
the final merge of spilled buckets runs one bucket per core.
``spill_dir`` may be any fsspec URL (``s3://bucket/tmp``) or a shared mount. On a
dask cluster partials are spilled by one worker and merged by another process, so a
spill there needs a ``spill_dir`` every worker and the client share: the local
temporary folder of a worker is never used (a clear error asks for ``spill_dir``).
Spill files are named with their owner (``tabstream-categorify-<host>-<pid>-s<start>-<id>
.arrow``, see :mod:`tabstream.core.scratch`): the first spill of a process into a
folder removes those a killed fit left (owner dead); a spill that finds the folder
full or read-only is an ``OSError`` naming the folder and ``spill_dir``, and the op's
other spills of that fit are removed with it.
The vocabulary (values with their counts, in id order) is saved as parquet.

A living vocabulary: :meth:`Workflow.update <tabstream.pipeline.workflow.Workflow.update>`
folds a new file list's counts into the fitted vocabularies without renumbering kept
values; new values are admitted when their running count reaches ``freq_threshold``,
and under ``max_size`` values are evicted (``eviction``) and their ids recycled (see
:mod:`tabstream.ops.vocabulary_policy`). The fitted state then also holds the counts of
the values not (yet) admitted (``cand.<vocabulary>`` tables; ``keep_candidates=False``
drops them), and each vocabulary table the running counts, scores and last update seen.

Dictionary columns (parquet's dictionary-encoded string pages, which the workflow
reads as dictionaries for columns only Categorify uses) are counted and encoded
without decoding: each chunk's dictionary is counted by a bincount of its indices
and encoded once, then gathered by index. The ids are those of the decoded column.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import posixpath
import sys
import tempfile
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type, sort_indices, widen_half
from tabstream.core.errors import ExportError
from tabstream.core.operators import (
    StatOperator,
    check_flag,
    drop_lookup_indexes,
    held_index,
    lookup_indexes,
)
from tabstream.core.schema import ColumnSchema, Schema, Tags, embedding_dim
from tabstream.core.scratch import owner_pattern, owner_tag, remove_leftovers, write_failure
from tabstream.core.threads import local_workers, map_shared
from tabstream.ops.nvt_params import check_nvt_knobs, write_stats_files
from tabstream.ops.vocabulary_policy import (
    Vocabulary,
    VocabularyChange,
    VocabularyPolicy,
    check_policy,
    fold,
)

__all__ = ["Categorify", "merge_counts", "value_counts"]

PAD_ID = 0
NULL_ID = 1
OOV_ID = 2
_COMBO_SEP = "\x1f"  # unit separator: joins the parts of a combo key
_COMBO_NULL = "\x00"  # a null part
# A string part holding the separator, or being the null part's "\x00", would make two
# combinations one key: a part's own "\x1b", "\x1f" and "\x00" are written "\x1be",
# "\x1bs" and "\x1bn" (in that order, so the escapes themselves stay one-to-one). A
# string without them, nearly every one, is its own key part, as before the escaping.
_COMBO_ESCAPES = (("\x1b", "\x1be"), (_COMBO_SEP, "\x1bs"), (_COMBO_NULL, "\x1bn"))
_COMBO_SPECIAL = "[\\x00\\x1b\\x1f]"  # RE2 syntax


@dataclass(frozen=True)
class _Spill:
    """One spilled count table: a file holding an Arrow IPC stream per spill bucket,
    bucket ``b`` at bytes ``offsets[b]:offsets[b + 1]``. One file rather than a file
    per bucket: creating a file costs about 0.2-0.5 ms of a local disk (the 16M-row
    Criteo fit spilled 70 tables, 2240 files with 32 buckets) and a request of an
    object store."""

    path: str  # an fsspec URL, or a plain path on a local disk
    offsets: tuple[int, ...]

    def read(self, bucket: int) -> pa.Table:
        start, end = self.offsets[bucket], self.offsets[bucket + 1]
        if "://" in self.path:
            fs, path = fsspec.core.url_to_fs(self.path)
            data = fs.cat_file(path, start=start, end=end)
        else:
            # a local file read directly: fsspec's URL parsing and file object cost
            # about 50 us a read, and a final merge reads every spill once per bucket
            # (17,888 reads in the 16M-row Criteo fit)
            with open(self.path, "rb", buffering=0) as f:
                data = os.pread(f.fileno(), end - start, start)
            if len(data) != end - start:
                raise OSError(f"Categorify: the spill {self.path} is shorter than written "
                              f"({start + len(data):,} of {end:,} bytes)")
        return pa.ipc.open_stream(pa.py_buffer(data)).read_all()

    def remove(self) -> None:
        fs, path = fsspec.core.url_to_fs(self.path)
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path)
        with _WRITTEN_LOCK:
            for paths in _WRITTEN.values():
                paths.discard(self.path)


#: Spill files are named ``tabstream-categorify-<owner>-<id>.arrow`` (see
#: :mod:`tabstream.core.scratch`): the first spill of a process into a folder removes
#: those whose owner is dead (a killed fit's); a fit that fails removes its own
#: (``Workflow.fit`` calls :meth:`Categorify.discard_partials`), and any of this
#: process still there at its exit are removed then.
_SPILL_NAME = owner_pattern(r"tabstream-categorify-", r"[0-9a-f]{32}\.arrow")
_WRITTEN: dict[int, set[str]] = {}  # id(op) -> its spills not removed yet, in this process
_WRITTEN_LOCK = threading.Lock()
_CLEANED: set[str] = set()  # spill folders whose dead owners' spills were removed


def _remove_written(key: int | None = None) -> None:
    """Remove the spills op ``key`` (every op: None) wrote in this process and did not
    remove: its fit failed, so nothing will read them."""
    with _WRITTEN_LOCK:
        paths = [p for k, v in _WRITTEN.items() if key is None or k == key for p in v]
    for path in paths:
        with contextlib.suppress(Exception):
            _Spill(path, ()).remove()


atexit.register(_remove_written)


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_list(t) or pa.types.is_large_list(t)


def _without_views(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A ``string_view``/``binary_view`` column (or a list of them) as ``large_string``/
    ``large_binary``: pyarrow has no ``take``, ``filter`` or ``index_in`` kernels for
    the view types, which Categorify's counts and lookups use. Others unchanged."""
    t = column.type
    inner = t.value_type if _is_list(t) else t
    if pa.types.is_string_view(inner):
        plain: pa.DataType = pa.large_string()
    elif pa.types.is_binary_view(inner):
        plain = pa.large_binary()
    else:
        return column
    if _is_list(t):
        plain = pa.large_list(plain) if pa.types.is_large_list(t) else pa.list_(plain)
    return column.cast(plain)


def value_counts(column: pa.ChunkedArray | pa.Array) -> pa.Table:
    """Distinct non-missing values and their counts as a table ``(values, counts)``.

    NaN is missing like null and ``-0.0`` counts as ``0.0``.
    """
    return backend().value_counts(column)


def merge_counts(tables: Sequence[pa.Table]) -> pa.Table:
    """Sum the counts of equal values over several ``(values, counts)`` tables."""
    nonempty = [t for t in tables if t.num_rows]
    if len(nonempty) == 1 and "counts" in nonempty[0].column_names:
        return nonempty[0]
    return _sum_counts(tables)


def _sum_counts(tables: Sequence[pa.Table]) -> pa.Table:
    """Like :func:`merge_counts`, but a single table is aggregated too (its values may
    repeat). A table of ``values`` alone (a partition's values as they are, see
    :meth:`Categorify._raw_counts`) counts each row once, beside the others too."""
    nonempty = [t for t in tables if t.num_rows]
    if not nonempty:
        empty = tables[0]
        return empty if "counts" in empty.column_names else empty.append_column("counts", pa.array([], pa.int64()))
    kernels = backend()
    table = nonempty[0] if len(nonempty) == 1 else kernels.concat(nonempty)  # absent counts: null
    if "counts" not in table.column_names:
        return kernels.groupby_aggregate(table, ["values"], [("values", "size", "counts")])
    counts = table.column("counts")
    if counts.null_count:  # rows of values alone among counted ones: one each
        table = table.set_column(table.column_names.index("counts"), "counts", pc.fill_null(counts, 1))
    return kernels.groupby_aggregate(table, ["values"], [("counts", "sum", "counts")])


def _on_dask_worker() -> bool:
    """True inside a task run by a ``distributed`` worker."""
    if "distributed" not in sys.modules:  # a worker has imported it; do not pay the import
        return False
    try:
        from distributed import get_worker
    except ImportError:  # shadowed, by a script named distributed.py beside the caller's
        return False
    try:
        get_worker()
    except ValueError:
        return False
    return True


@dataclass
class _Counts:
    """Partial value counts of one vocabulary: in memory, plus spilled buckets.

    ``offsets`` (``spill_buckets + 1`` row offsets), when set, says that ``table`` is
    ordered by spill bucket: merges then add up each bucket apart (see
    :data:`_BUCKETED_ROWS`) and a spill writes the buckets without ordering again.
    A ``table`` of ``values`` alone lists a partition's values as they are, a value
    on as many rows as it occurs (see :meth:`Categorify._raw_counts`); every merge
    aggregates it, even alone (:func:`merge_counts`). A table with ``counts`` holds
    each value once. Spilled files are always aggregated when merged: a spill may
    hold counted partials unmerged."""

    table: pa.Table | None
    spilled: list[_Spill] = field(default_factory=list)
    offsets: np.ndarray | None = None

    @property
    def distinct(self) -> bool:
        """Whether each value of ``table`` is on one row (it has its ``counts``)."""
        return self.table is None or "counts" in self.table.column_names


#: results of combinations short of the last that wait for it at once, at most: the
#: fit's largest fan-in (``FIT_FAN_IN_MAX`` in :mod:`tabstream.pipeline.workflow`). Each
#: keeps ``spill_rows / _WAITING_RESULTS`` distinct values of a vocabulary in memory,
#: so that they hold about ``spill_rows`` together, as one partial does. Before, each
#: kept up to ``spill_rows``: the 16M-row Criteo fit from TSV (104 partitions) held 13
#: results of 8.4 MB each for its last combination (benchmarks/RESULTS.md, session 20).
_WAITING_RESULTS = 16

#: partial counts with more distinct values than this are kept ordered by spill
#: bucket, and merged bucket by bucket: a hash aggregation over one bucket's values
#: works in the CPU cache, one over all of them does not. Measured on a 2M-row
#: Criteo-like column with 1.1M distinct values (16 partials, 1.6M rows to merge):
#: 0.23 s as one aggregation, 0.07 s as 32 (plus 0.01 s to order each partial).
_BUCKETED_ROWS = 1 << 15

#: a partition's column whose first :data:`_SAMPLE_ROWS` values hold more than
#: :data:`_RAW_SHARE` distinct values per row is not counted in the partition: its
#: values go to the merge as they are (see :meth:`Categorify._raw_counts`)
_SAMPLE_ROWS = 2048
_RAW_SHARE = 0.85


#: candidate tables (see ``keep_candidates``) of more bytes than this are kept in a
#: memory-mapped file rather than on the heap (see :func:`_off_heap`)
_OFF_HEAP_BYTES = 8 << 20


def _off_heap(table: pa.Table) -> pa.Table:
    """``table`` read back from a memory map of an unlinked temporary file: the same
    values, in pages the kernel may drop and read again, not in the process's heap.
    Candidates (every value below ``freq_threshold``: most distinct values of a large
    column) are read only by ``Workflow.update`` and ``save``; held on the heap they
    were the largest part of the 16M-row Criteo export's peak RSS (benchmarks/RESULTS.md,
    session 18). A table under :data:`_OFF_HEAP_BYTES`, or a temporary folder that
    cannot take it (full, read-only), keeps it on the heap as before."""
    if table.nbytes < _OFF_HEAP_BYTES:
        return table
    writer = _OffHeapWriter()
    writer.add(0, table)
    return writer.table()


class _OffHeapWriter:
    """A table put together piece by piece (from any thread) off the heap: the pieces
    are held until they pass :data:`_OFF_HEAP_BYTES`, then appended as an Arrow IPC
    stream to an unlinked temporary file, which :meth:`table` maps (see
    :func:`_off_heap`). The final merge of a spilled vocabulary puts each bucket's
    values below ``freq_threshold`` here as it goes: held until ``finalize``, the
    candidates of the 16M-row Criteo fit's five nearly unique columns (most of their
    values) were its peak RSS. Where the temporary folder cannot take them (no folder,
    full, read-only) they stay on the heap: what was written before the failure is
    read back from the file, the rest is held."""

    def __init__(self) -> None:
        self.schema: pa.Schema | None = None  # the first piece's
        self._lock = threading.Lock()
        self._early: dict[int, pa.Table] = {}  # pieces that came before their turn
        self._next = 0
        self._held: list[pa.Table] = []
        self._held_bytes = 0
        self._path: str | None = None
        self._sink: Any = None
        self._writer: Any = None
        self._written = 0  # rows in the file, in whole batches
        self._failed = False

    def add(self, index: int, table: pa.Table) -> None:
        """Piece ``index`` (0, 1, 2, ... each once, in any order from any thread): the
        table keeps the pieces in index order, whichever thread finished first."""
        with self._lock:
            if self.schema is None:
                self.schema = table.schema
            self._early[index] = table
            while self._next in self._early:
                piece = self._early.pop(self._next)
                self._next += 1
                if piece.num_rows:
                    self._held.append(piece)
                    self._held_bytes += piece.nbytes
            if not self._failed and self._held_bytes >= _OFF_HEAP_BYTES:
                self._write_held()

    def _write_held(self) -> None:
        try:
            if self._writer is None:
                fd, self._path = tempfile.mkstemp(prefix="tabstream-candidates-", suffix=".arrows")
                os.close(fd)
                self._sink = pa.OSFile(self._path, "wb")
                self._writer = pa.ipc.new_stream(self._sink, self.schema)
            while self._held:
                self._writer.write_table(self._held[0])
                self._written += self._held.pop(0).num_rows
            self._held_bytes = 0
        except OSError:  # no temporary folder, or a full one: the rest stays on the heap
            self._failed = True

    def table(self) -> pa.Table:
        """Every piece added, in index order (chunked); the file, if any, is removed
        (its mapping keeps the pages for as long as the table lives)."""
        with self._lock:
            assert not self._early, f"pieces {sorted(self._early)} came without piece {self._next}"
            assert self.schema is not None, "no piece was added"
            if not self._failed and self._held and self._writer is not None:
                self._write_held()  # the last pieces join the file
            mapped: list[pa.RecordBatch] = []
            if self._path is not None:
                for part in (self._writer, self._sink):
                    if part is not None:
                        with contextlib.suppress(OSError):  # the failure already seen
                            part.close()
                if self._written:
                    reader = pa.ipc.open_stream(pa.memory_map(self._path))
                    rows = 0
                    while rows < self._written:  # whole batches only: not a write cut short
                        mapped.append(reader.read_next_batch())
                        rows += mapped[-1].num_rows
                with contextlib.suppress(OSError):
                    os.remove(self._path)
                self._path = self._writer = self._sink = None
            pieces = ([pa.Table.from_batches(mapped, self.schema)] if mapped else []) + self._held
            self._held, self._held_bytes, self._written = [], 0, 0
            if not pieces:
                return self.schema.empty_table()
            if len(pieces) == 1:
                return pieces[0]
            # on the heap in part (small, or no file): one chunk, as _off_heap left them
            return pa.concat_tables(pieces) if mapped else pa.concat_tables(pieces).combine_chunks()


def _bucket_slice(table: pa.Table, offsets: np.ndarray, bucket: int) -> pa.Table:
    """The rows of spill bucket ``bucket`` of ``table`` (ordered by bucket, ``offsets``)."""
    return table.slice(int(offsets[bucket]), int(offsets[bucket + 1] - offsets[bucket]))


def _combo_key(table: pa.Table, group: Sequence[str]) -> pa.Array:
    parts, all_null = [], None
    for name in group:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        col = backend().normalize_missing(col)  # NaN is a missing part, -0.0 is "0"
        part = col.cast(pa.string())
        if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type)):
            part = _escaped_combo_part(part)
        parts.append(pc.fill_null(part, _COMBO_NULL))
        all_null = col.is_null() if all_null is None else pc.and_(all_null, col.is_null())
    key = pc.binary_join_element_wise(*parts, _COMBO_SEP)
    return pc.if_else(all_null, pa.scalar(None, pa.string()), key)


def _escaped_combo_part(part: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """``part`` with the characters a combo key gives a meaning escaped (see
    :data:`_COMBO_ESCAPES`); unchanged, without a copy, when it holds none of them."""
    if not pc.any(pc.match_substring_regex(part, _COMBO_SPECIAL)).as_py():
        return part
    for char, escape in _COMBO_ESCAPES:
        part = pc.replace_substring(part, char, escape)
    return part


class Categorify(StatOperator):
    """Encode categorical columns with vocabularies fitted on the data (see module docs).

    Parameters
    ----------
    freq_threshold:
        Values seen fewer times are out of vocabulary (an int, or a dict per column).
    max_size:
        Bound the embedding table at this many rows (an int, or a dict per
        vocabulary; 0 = no limit): the ``max_size - 2 - num_buckets`` most frequent
        values are kept (``max_size - 3`` without ``num_buckets``). It must leave
        room for at least one value beyond the reserved rows.
    num_buckets:
        Spread out-of-vocabulary values over this many hashed ids instead of one.
    vocabs:
        Given vocabularies ``{column: [values in id order]}``; fitting skips them.
    encode_type:
        ``"joint"`` or ``"combo"`` for column groups.
    column_groups:
        Groups of columns, e.g. ``[["user", "seller"], "item"]``; usually set by
        selecting with nested lists: ``[["user", "seller"], "item"] >> Categorify(...)``.
    single_table:
        Number every column's vocabulary in one table, one range of ids after the
        other (see module docs).
    eviction, window, decay:
        How :meth:`Workflow.update <tabstream.pipeline.workflow.Workflow.update>`
        makes room under ``max_size``: ``"lru"`` evicts the least recently seen values
        not seen in the last ``window`` updates; ``"decay"`` multiplies every running
        count by ``decay`` at each update and evicts the lowest (see
        :mod:`tabstream.ops.vocabulary_policy`). Without ``max_size`` nothing is evicted.
    keep_candidates:
        Keep the counts of values counted but not in the vocabulary (below
        ``freq_threshold`` or past ``max_size``) in the fitted state, so that an update
        admits them once their running count, the fit's included, reaches
        ``freq_threshold``. ``False`` saves their memory and disk for a vocabulary that
        is never updated (an update then counts from that update only).
    """

    #: fit and transform take dictionary columns (counted and encoded without
    #: decoding): the workflow then reads parquet's dictionary-encoded string
    #: columns that only Categorify uses as dictionaries
    accepts_dictionary = True
    #: statistics past spill_rows go to files under spill_dir (see the module docstring)
    spills = True

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types);
    # "candidates" and "updates" are absent from workflows saved before they existed
    state_types = {"vocabularies": list[str], "candidates": list[str], "updates": int}
    state_tables = {"vocab.{vocabularies}": {"values": None, "counts": "integer"},
                    "cand.{candidates}": {"values": None, "counts": "integer"}}

    @classmethod
    def check_state(cls, values: Any) -> list[str]:
        if isinstance(values, dict):  # a Categorify saved before living vocabularies
            values = {"candidates": [], "updates": 0, **values}
        return super().check_state(values)

    @classmethod
    def check_state_table_values(cls, name: str, table: pa.Table) -> None:
        # a value listed twice would get two ids: the vocabulary must be a set
        values = table.column("values")
        distinct = pc.count_distinct(widen_half(values.combine_chunks()), mode="all").as_py()
        if distinct != table.num_rows:
            counts = pc.value_counts(widen_half(values.combine_chunks()))
            twice = next(c["values"] for c in counts.to_pylist() if c["counts"] > 1)
            raise ValueError(f"stats table {name!r} column 'values' lists {twice!r} more than once "
                             f"({table.num_rows} rows, {distinct} distinct values); a vocabulary "
                             "lists each value once")

    def __init__(self, freq_threshold: int | dict[str, int] = 0, max_size: int | dict[str, int] = 0,
                 num_buckets: int | dict[str, int] | None = None, vocabs: dict[str, list] | None = None,
                 encode_type: str = "joint", column_groups: list | None = None,
                 single_table: bool = False, dtype: Any = "int64",
                 spill_rows: int = 250_000, spill_buckets: int = 32, spill_dir: str | None = None,
                 out_path: str | None = None, split_out: int | dict[str, int] | None = None,
                 tree_width: int | dict[str, int] | None = None, on_host: bool = True,
                 cat_cache: Any = "host", search_sorted: bool = False, name_sep: str = "_",
                 cardinality_memory_limit: Any = None, eviction: str = "lru", window: int = 1,
                 decay: float = 0.5, keep_candidates: bool = True) -> None:
        super().__init__()
        check_policy(eviction, window, decay, "Categorify")
        for name, value in (("freq_threshold", freq_threshold), ("max_size", max_size)):
            values = value.values() if isinstance(value, dict) else [value]
            if any(not isinstance(v, (int, np.integer)) or v < 0 for v in values):
                raise ValueError(f"Categorify: {name} must be a non-negative integer, got {value!r}")
        buckets = num_buckets.values() if isinstance(num_buckets, dict) else [num_buckets]
        if any(b is not None and (isinstance(b, bool) or not isinstance(b, (int, np.integer)) or b < 1)
               for b in buckets):
            raise ValueError(f"Categorify: num_buckets must be a positive integer, a dict column -> "
                             f"positive integer, or None, got {num_buckets!r}")
        if isinstance(num_buckets, dict) and single_table:
            raise ValueError("Categorify: single_table=True shares one range of out-of-vocabulary "
                             "ids; give num_buckets as one integer, not a dict")
        if name_sep != "_":
            raise ValueError(f"Categorify: name_sep={name_sep!r} is not supported; joint and combo "
                             "vocabularies are named with '_'")
        if encode_type not in ("joint", "combo"):
            raise ValueError(f"Categorify: encode_type must be 'joint' or 'combo', got {encode_type!r}")
        dtype = _id_dtype(dtype)
        if spill_rows < 1 or spill_buckets < 1:
            raise ValueError("Categorify: spill_rows and spill_buckets must be positive")
        sizes = max_size.items() if isinstance(max_size, dict) else [(None, max_size)]
        for where, size in sizes:
            nb = num_buckets.get(where) if isinstance(num_buckets, dict) else num_buckets
            reserved = OOV_ID + (nb or 1)
            if size and size <= reserved:
                col = f" for {where!r}" if where is not None else ""
                raise ValueError(
                    f"Categorify: max_size={size}{col} leaves no room for a vocabulary: the "
                    f"table reserves {reserved} rows (0 padding, 1 null, "
                    f"{OOV_ID}..{reserved - 1} out-of-vocabulary with num_buckets={nb}); "
                    f"use max_size > {reserved}, or 0 for no limit")
        self.freq_threshold = freq_threshold
        self.max_size = max_size
        self.num_buckets = num_buckets
        self.vocabs = {k: list(v) for k, v in (vocabs or {}).items()} or None
        self.encode_type = encode_type
        self.column_groups = _normalize_groups(column_groups) if column_groups else None
        self.single_table = check_flag(single_table, "Categorify", "single_table")
        self.dtype = dtype
        self.spill_rows = int(spill_rows)
        self.spill_buckets = int(spill_buckets)
        self.spill_dir = spill_dir
        # NVTabular's knobs of where and how statistics are computed: accepted so that
        # migrating code runs; tabstream's statistics need none of them (see
        # docs/nvtabular-differences.md). out_path names the folder the vocabulary
        # parquet files are written to at fit (NVTabular's "where statistics go").
        check_nvt_knobs("Categorify", out_path=out_path, split_out=split_out, tree_width=tree_width)
        self.out_path = out_path
        self.split_out = split_out
        self.tree_width = tree_width
        self.on_host = bool(on_host)
        self.cat_cache = cat_cache
        self.search_sorted = bool(search_sorted)
        self.name_sep = name_sep
        self.cardinality_memory_limit = cardinality_memory_limit
        self.eviction, self.window, self.decay = eviction, int(window), float(decay)
        self.keep_candidates = bool(keep_candidates)
        # set by a fit or an update for its pass (see Workflow._reduce_level): the
        # partials one combination short of the last merges; None: the partitions'
        # partials go straight to the last combination
        self.partials_per_combination: int | None = None
        # living vocabulary (Workflow.update): per vocabulary, the values counted but
        # not in it, and how many updates were folded in
        self.candidates: dict[str, pa.Table] = {}
        self.updates = 0
        # fitted state: vocabulary name -> table (values, counts) in id order; with
        # single_table the dict's order is the order of the id ranges
        self.tables: dict[str, pa.Table] = {}
        # the user's copy of the vocabularies under out_path (see stats_files);
        # _files_current: whether those files describe self.tables
        self._stats_files: dict[str, str] = {}
        self._files_current = True
        # vocabulary names in selection order, as the output schema last saw them
        self._order: list[str] = []

    @property
    def categories(self) -> dict[str, str]:
        """NVTabular's ``op.categories``: vocabulary name (a column, or a joint/combo
        group's ``A_B``) -> its file under ``out_path`` (see :attr:`stats_files`). Only
        an op given ``out_path`` writes files."""
        if self.out_path is None:
            raise ValueError("Categorify.categories lists the vocabulary files written under "
                             "out_path, and this op has none: pass Categorify(out_path=folder) "
                             "(the vocabularies themselves are in op.tables)")
        return {name.removeprefix("unique."): path for name, path in self.stats_files.items()}

    @property
    def stats_files(self) -> dict[str, str]:
        """The files under ``out_path`` by name (``unique.<vocabulary>``), each in step
        with the vocabulary (row ``i`` is id ``first + i``, see :func:`write_stats_files
        <tabstream.ops.nvt_params.write_stats_files>`). A fit writes them, and so does
        every ``Workflow.update`` (the files of the vocabularies it folded, recycled ids
        included). A loaded op writes them at the first use of this property or of
        :attr:`categories`: ``Workflow.load`` itself writes nothing, so a workflow loads
        where ``out_path`` is not writable. ``{}`` without ``out_path``."""
        if not self._files_current:
            self._write_stats_files()
        return dict(self._stats_files)

    def _write_stats_files(self, names: Sequence[str] | None = None) -> None:
        """Write the files of the vocabularies ``names`` (None: all) under ``out_path``
        from :attr:`tables`; afterwards every file this op lists describes its state."""
        names = list(self.tables) if names is None else [n for n in names if n in self.tables]
        written = write_stats_files("Categorify", self.out_path, {
            f"unique.{name}": pa.table({name: self.tables[name]["values"],
                                        f"{name}_size": self.tables[name]["counts"]})
            for name in names})
        files = {**self._stats_files, **written}
        self._stats_files = {key: files[key] for key in (f"unique.{n}" for n in self.tables) if key in files}
        self._files_current = True

    # -- groups -------------------------------------------------------------
    @property
    def start_index(self) -> int:
        """Id of the first vocabulary entry (of every vocabulary when ``num_buckets``
        is one integer; see :meth:`start_of` for a dict)."""
        return OOV_ID + ((None if isinstance(self.num_buckets, dict) else self.num_buckets) or 1)

    def buckets_of(self, name: str) -> int | None:
        """``num_buckets`` of vocabulary ``name`` (a dict gives a column's own; a
        column it does not name has none)."""
        if isinstance(self.num_buckets, dict):
            value = self.num_buckets.get(name)
            return None if value is None else int(value)
        return self.num_buckets

    def start_of(self, name: str) -> int:
        """Id of vocabulary ``name``'s first value without ``single_table``."""
        return OOV_ID + (self.buckets_of(name) or 1)

    def set_column_groups(self, groups: list) -> None:
        """Called by the graph when the selection has nested lists."""
        if self.column_groups is None and any(isinstance(g, list) for g in groups):
            self.column_groups = _normalize_groups(groups)

    def _groups(self, names: Sequence[str]) -> list[list[str]]:
        """Vocabulary groups over the columns ``names``, in column order (combo: in
        the order of ``column_groups``, each group and single name once)."""
        if self.encode_type == "combo" and self.column_groups:
            present = [g for g in self.column_groups if all(n in names for n in g)]
            listed = {n for g in self.column_groups for n in g}
            out = list({tuple(g): g for g in present}.values())
            return out + [[n] for n in names if n not in listed]
        groups = [g for g in (self.column_groups or []) if len(g) > 1 and all(n in names for n in g)]
        grouped = {n for g in groups for n in g}
        out, placed = [], set()
        for n in names:
            if n in grouped:
                g = next(g for g in groups if n in g)
                if id(g) not in placed:
                    placed.add(id(g))
                    out.append(g)
            else:
                out.append([n])
        return out

    def _checked_groups(self, names: Sequence[str]) -> list[list[str]]:
        """:meth:`_groups` of the columns ``names`` of a table or schema, refused when
        two of them would share a vocabulary (see :meth:`_distinctly_named`)."""
        return self._distinctly_named(self._groups(names))

    def _distinctly_named(self, groups: list[list[str]]) -> list[list[str]]:
        """``groups``, refused when two of them would share a vocabulary (its name is
        the group's columns joined by ``"_"``: the joint group ``["a", "b"]`` beside a
        column ``"a_b"``); one vocabulary would otherwise encode both, silently."""
        seen: dict[str, list[str]] = {}
        for group in groups:
            name = self._vocab_name(group)
            if name in seen:
                raise ValueError(
                    f"Categorify: the column groups {seen[name]} and {group} would share the "
                    f"vocabulary {name!r} (a group's vocabulary is named by its columns joined "
                    f"with '_'); rename one of the columns")
            seen[name] = group
        return groups

    def _fitted_columns(self) -> list[str]:
        names = list(self.tables)
        if self.column_groups:
            names += _flatten(self.column_groups)
        return list(dict.fromkeys(names))

    def _vocab_name(self, group: Sequence[str]) -> str:
        return "_".join(group)

    def _setting(self, value: int | dict[str, int], name: str) -> int:
        return int(value.get(name, 0)) if isinstance(value, dict) else int(value)

    def _first_id(self, name: str) -> int:
        """Id of vocabulary ``name``'s first value: after the previous vocabularies'
        ranges with ``single_table``, else :attr:`start_index`."""
        if not self.single_table:
            return self.start_of(name)
        first = self.start_index
        for other, table in self.tables.items():
            if other == name:
                break
            first += table.num_rows
        return first

    def _table_name(self) -> str:
        """``domain.name`` of every output column with ``single_table``."""
        return "_".join(self.tables) if self.tables else "_".join(self._order)

    def _vocab_limit(self, name: str) -> int | None:
        """How many vocabulary values ``max_size`` keeps for ``name`` (None: all)."""
        size = self._setting(self.max_size, name)
        return size - self.start_of(name) if size else None

    # -- schema -------------------------------------------------------------
    def compute_output_schema(self, input_schema: Schema) -> Schema:
        cols = []
        groups = self._checked_groups(input_schema.column_names)
        self._order = [self._vocab_name(g) for g in groups]
        for group in groups:
            vocab = self._vocab_name(group)
            for col in (input_schema[n] for n in group):
                if col.dtype not in ("string", "bool", "unknown") and not col.dtype.startswith(("int", "uint", "float")):
                    raise TypeError(f"Categorify cannot encode column {col.name!r} of dtype {col.dtype}")
            if self.encode_type == "combo" and len(group) > 1:
                first = input_schema[group[0]]
                cols.append(self._output(ColumnSchema(vocab, tags=first.tags), vocab))
            else:
                cols.extend(self._output(input_schema[n], vocab) for n in group)
        return Schema(cols)

    def _output(self, col: ColumnSchema, vocab: str) -> ColumnSchema:
        props: dict[str, Any] = {
            **col.properties,
            "freq_threshold": self._setting(self.freq_threshold, vocab),
            "num_buckets": self.buckets_of(vocab),
            "start_index": self.start_of(vocab),
        }
        if vocab in self.tables:
            if self.single_table:   # one table: every column's ids run up to its end
                cardinality = self.start_index + sum(t.num_rows for t in self.tables.values())
                vocab = self._table_name()
            else:
                cardinality = self.start_of(vocab) + self.tables[vocab].num_rows
            props["domain"] = {"min": 0, "max": cardinality - 1, "name": vocab}
            props["embedding_sizes"] = {"cardinality": cardinality,
                                        "dimension": embedding_dim(cardinality)}
        tags = (col.tags | {Tags.CATEGORICAL}) - {Tags.CONTINUOUS}
        return ColumnSchema(col.name, self.dtype, tags, props, is_list=col.is_list, is_ragged=col.is_ragged)

    # -- fit ----------------------------------------------------------------
    def _keys(self, table: pa.Table, group: Sequence[str]) -> list[pa.ChunkedArray | pa.Array]:
        if self.encode_type == "combo" and len(group) > 1:
            return [_combo_key(table, group)]
        return [_without_views(table.column(n)) for n in group]  # value_counts normalizes missing values

    def fit_partition(self, table: pa.Table) -> dict[str, _Counts]:
        out = {}
        for group in self._checked_groups(table.column_names):
            name = self._vocab_name(group)
            if self.vocabs and name in self.vocabs:
                continue
            keys = self._keys(table, group)
            raw = self._raw_counts(keys[0]) if len(keys) == 1 else None
            counts = _Counts(raw if raw is not None else merge_counts([value_counts(k) for k in keys]))
            counts = self._bucketed(counts)
            if self._spills_early(counts):
                counts = _Counts(None, [self._spill(counts.table, counts.offsets)])
            out[name] = self._maybe_spill(counts)
        return out

    def _spills_early(self, counts: _Counts) -> bool:
        """Whether a partition's partial is spilled at once, as it is: when the
        combination that takes it (short of the last, see ``partials_per_combination``)
        would spill its partials unmerged anyway, since together they pass twice
        ``spill_rows`` (see :meth:`_combine`). Written by the task that made it, a
        partial no longer waits in memory for its combination: the 16M-row Criteo fit
        from TSV held about 16 such partials of 17.7 MB (its five nearly unique
        columns) for its combinations of 8 (benchmarks/RESULTS.md, session 21).
        Not where a spill has nowhere to go that the others read (a dask worker
        without ``spill_dir``)."""
        fan_in = self.partials_per_combination
        if fan_in is None or counts.table is None or counts.table.num_rows * fan_in <= 2 * self.spill_rows:
            return False
        return self._spills_reach_the_merge()

    def _spills_reach_the_merge(self) -> bool:
        """Whether a spill made here can be read by the process that merges: always
        with ``spill_dir``; without it, not from a dask worker (its temporary folder is
        its own), where holding in memory is the only choice (see :meth:`_spill_root`)."""
        return self.spill_dir is not None or not _on_dask_worker()

    @staticmethod
    def _raw_counts(column: pa.ChunkedArray | pa.Array) -> pa.Table | None:
        """A partition's values as they are (a table of ``values`` alone: a count of
        one per row), not aggregated, when nearly every value is distinct (its first
        :data:`_SAMPLE_ROWS` values are over :data:`_RAW_SHARE` distinct): else None,
        and the partition counts its values.

        The merges hash every partial value again to add the counts up, so counting
        such a column in the partition buys little (Criteo's five largest columns:
        0.72-0.83 distinct values per row, 16 partitions of 86k-164k rows) for a
        whole hash pass: per 86k rows of those five columns, counting and ordering
        the counts by bucket take 28-35 ms, ordering the values 11-15 ms, while the
        merges, on 1.25x the rows, take about 25% more (benchmarks/RESULTS.md). The
        sample of a column sorted by value, or whose distinct values cluster, may say
        otherwise: the result is the same either way, only the work differs."""
        if len(column) <= _BUCKETED_ROWS or _is_list(column.type) or pa.types.is_dictionary(column.type):
            return None
        kernels = backend()
        head = kernels.normalize_missing(column.slice(0, _SAMPLE_ROWS)).drop_null()
        if len(head) < _SAMPLE_ROWS // 2 or len(pc.unique(head)) <= _RAW_SHARE * len(head):
            return None
        # values alone: a count of one per row is implied (see _sum_counts); a column
        # of ones was a third of the partial's bytes, held and spilled
        return pa.table({"values": kernels.normalize_missing(column).drop_null()})

    def _bucketed(self, counts: _Counts, min_rows: int = _BUCKETED_ROWS) -> _Counts:
        """``counts`` ordered by spill bucket (with its offsets) when its table has
        more than ``min_rows`` rows (see :data:`_BUCKETED_ROWS`) and is not yet."""
        table = counts.table
        if table is None or counts.offsets is not None or table.num_rows <= min_rows:
            return counts
        table, offsets = self._bucket_order(table)
        return _Counts(table, counts.spilled, offsets)

    def _merge_tables(self, parts: Sequence[_Counts]) -> _Counts:
        """The in-memory counts of ``parts`` summed: bucket by bucket when there are
        many of them (the result stays ordered by bucket), else in one aggregation."""
        held = [p for p in parts if p.table is not None and p.table.num_rows]
        if not held:
            tables = [p.table for p in parts if p.table is not None]
            return _Counts(_sum_counts(tables) if tables else None)  # empty, with its counts column
        if len(held) == 1 or sum(p.table.num_rows for p in held) <= _BUCKETED_ROWS:
            if len(held) == 1 and held[0].distinct:
                return _Counts(held[0].table, [], held[0].offsets)
            return _Counts(merge_counts([p.table for p in held]))
        held = [self._bucketed(p, 0) for p in held]
        merged, sizes = [], np.zeros(self.spill_buckets + 1, dtype=np.int64)
        for b in range(self.spill_buckets):
            merged.append(merge_counts([_bucket_slice(p.table, p.offsets, b) for p in held]))
            sizes[b + 1] = merged[-1].num_rows
        return _Counts(pa.concat_tables(merged), [], np.cumsum(sizes))

    def combine(self, partials: Sequence[dict[str, _Counts]]) -> dict[str, _Counts]:
        """A combination short of the last: its result waits, beside up to
        :data:`_WAITING_RESULTS` others, for the last combination, so it keeps at most
        ``spill_rows / _WAITING_RESULTS`` distinct values of a vocabulary in memory
        and spills the rest. Not on a dask worker without ``spill_dir`` (it has nowhere
        to spill that the others read: there ``spill_rows`` stays the bound), nor for a
        single partial (``fit_table``: finalized at once, nothing waits)."""
        held = self.spill_rows
        if len(partials) > 1 and self._spills_reach_the_merge():
            held = max(1, self.spill_rows // _WAITING_RESULTS)
        return self._combine(partials, held)

    def _combine(self, partials: Sequence[dict[str, _Counts]], held_rows: int) -> dict[str, _Counts]:
        """The partials merged per vocabulary; a merged table of more than ``held_rows``
        distinct values is spilled (see :meth:`_maybe_spill`)."""
        out = {}
        for name in partials[0]:
            parts = [p[name] for p in partials]
            tables = [p.table for p in parts if p.table is not None]
            spilled = [f for p in parts for f in p.spilled]
            if len(tables) > 1 and sum(t.num_rows for t in tables) > 2 * self.spill_rows:
                # merged, these would most likely outgrow spill_rows and be spilled: they
                # are spilled as they are instead, and the final merge sums them per
                # bucket (one aggregation of these rows instead of two)
                out[name] = _Counts(None, spilled + [self._spill_parts(parts)])
                continue
            merged = self._merge_tables(parts)
            out[name] = self._maybe_spill(_Counts(merged.table, spilled, merged.offsets), held_rows)
        return out

    #: the last combination of a fit may run as several tasks side by side, each
    #: merging some of the vocabularies (see ``combine_root``'s ``shard``)
    shards_root = True

    def combine_root(self, partials: Sequence[dict[str, _Counts]], shard: int = 0,
                     shards: int = 1) -> dict[str, _Counts]:
        """The last combination of a fit (its result goes straight to :meth:`finalize`).

        When nothing was spilled, the merged counts stay in memory: spilling them
        here would only write them out for ``finalize`` to read back bucket by
        bucket, while this task already holds them whole. ``freq_threshold`` is
        applied here, on the worker, so only the values that can enter the
        vocabulary travel to the process that finalizes.

        ``shards > 1``: only the vocabularies of part ``shard`` (see
        :meth:`_root_share`) are merged; :meth:`join_root` puts the parts together."""
        out = {}
        for name in self._root_share(partials, shard, shards):
            parts = [p[name] for p in partials]
            if any(p.spilled for p in parts):
                # straight to finalize, which merges the spills bucket by bucket
                out.update(self._combine([{name: p} for p in parts], self.spill_rows))
                continue
            merged = self._merge_tables(parts)
            out[name] = _Counts(self._threshold(merged.table, name) if merged.table is not None else None)
        return out

    def _root_share(self, partials: Sequence[dict[str, _Counts]], shard: int, shards: int) -> list[str]:
        """The vocabularies part ``shard`` of ``shards`` merges: the largest first, each
        to the part with the fewest rows so far (every part computes the same split
        from the same partials), so the parts take about equal time."""
        names = list(partials[0])
        if shards <= 1:
            return names
        sizes = {name: sum((p[name].table.num_rows if p[name].table is not None else 0)
                           + len(p[name].spilled) * self.spill_rows for p in partials) for name in names}
        load = [0] * shards
        share = []
        for name in sorted(names, key=lambda n: -sizes[n]):  # stable: ties keep column order
            part = load.index(min(load))
            load[part] += sizes[name]
            if part == shard:
                share.append(name)
        return [n for n in names if n in share]

    @staticmethod
    def join_root(parts: Sequence[dict[str, _Counts]]) -> dict[str, _Counts]:
        """The vocabularies merged by the parts of a sharded :meth:`combine_root`."""
        out: dict[str, _Counts] = {}
        for part in parts:
            out.update(part)
        return out

    def discard_partials(self) -> None:
        """Remove the spill files this op wrote in this process during a fit that failed."""
        _remove_written(id(self))

    def _maybe_spill(self, counts: _Counts, held_rows: int | None = None) -> _Counts:
        """``counts`` with its table spilled when it holds more than ``held_rows``
        (default ``spill_rows``) distinct values."""
        if counts.table is None or counts.table.num_rows <= (self.spill_rows if held_rows is None else held_rows):
            return counts
        return _Counts(None, counts.spilled + [self._spill(counts.table, counts.offsets)])

    def _spill_parts(self, parts: Sequence[_Counts]) -> _Spill:
        """The in-memory tables of ``parts``, unmerged, spilled as one file (each
        bucket's stream holds the bucket's slice of every part)."""
        held = [self._bucketed(p, 0) for p in parts if p.table is not None and p.table.num_rows]
        tables, sizes = [], np.zeros(self.spill_buckets + 1, dtype=np.int64)
        for b in range(self.spill_buckets):
            for p in held:
                tables.append(_bucket_slice(p.table, p.offsets, b))
                sizes[b + 1] += tables[-1].num_rows
        return self._spill(backend().concat(tables), np.cumsum(sizes))

    def _spill_root(self) -> str:
        if self.spill_dir is not None:
            return str(self.spill_dir)
        if _on_dask_worker():
            raise ValueError(
                f"Categorify: a partial vocabulary grew past spill_rows={self.spill_rows} distinct "
                "values on a dask worker, and spill_dir is None: a worker's local temporary "
                "folder is not readable by the process that merges the spills; give "
                "Categorify(spill_dir=...) a folder every worker and the client share "
                "(an fsspec URL such as 's3://bucket/tmp', or a shared mount)")
        return tempfile.gettempdir()

    def _bucket_order(self, table: pa.Table) -> tuple[pa.Table, np.ndarray]:
        """``table`` reordered by spill bucket (see the backend's ``spill_buckets``) and the
        start offset of each bucket (``spill_buckets + 1``)."""
        bucket = backend().spill_buckets(table["values"], self.spill_buckets)
        offsets = np.zeros(self.spill_buckets + 1, dtype=np.int64)
        np.cumsum(np.bincount(bucket, minlength=self.spill_buckets), out=offsets[1:])
        # Arrow's sort of small integers is a counting sort: 0.5 ms for 125k bucket
        # ids against 1.7 ms for numpy's stable (radix) argsort
        return table.take(pc.array_sort_indices(pa.array(bucket))), offsets

    def _spill(self, table: pa.Table, offsets: np.ndarray | None = None) -> _Spill:
        """Write ``table`` hash-partitioned into one file of Arrow IPC streams, one per
        bucket (uncompressed: a spill is read back once, by the same library, soon), in
        the spill folder (an fsspec URL or a local path). ``offsets``: the table is
        ordered by bucket already, with these bucket offsets."""
        root = self._spill_root()
        fs, base = fsspec.core.url_to_fs(root)
        path = posixpath.join(base.rstrip("/"), f"tabstream-categorify-{owner_tag()}-{uuid.uuid4().hex}.arrow")
        url = fs.unstrip_protocol(path) if "://" in root else path
        if offsets is None:
            table, offsets = self._bucket_order(table)
        ends = [0]
        try:
            fs.makedirs(base, exist_ok=True)
            # On a dask worker, a dead process's spill may still be merged by a running
            # fit (a worker retired mid-fit): there only a day-old one is removed, and
            # nothing at exit.
            on_worker = _on_dask_worker()
            if root not in _CLEANED:  # once per folder and process: a killed fit's spills
                _CLEANED.add(root)
                remove_leftovers(fs, base, _SPILL_NAME, by_owner=not on_worker)
            if not on_worker:
                with _WRITTEN_LOCK:
                    _WRITTEN.setdefault(id(self), set()).add(url)
            with fs.open(path, "wb") as f:
                for b in range(self.spill_buckets):
                    # serialized in memory, then written at once: Arrow writes a stream
                    # in many small pieces, each a Python call on an fsspec file (246k
                    # calls, 3.6 s CPU, in the 16M-row Criteo fit's 70 spills)
                    sink = pa.BufferOutputStream()
                    with pa.ipc.new_stream(sink, table.schema) as writer:
                        writer.write_table(_bucket_slice(table, offsets, b))
                    data = sink.getvalue()
                    f.write(data)
                    ends.append(ends[-1] + data.size)
        except BaseException as exc:
            with contextlib.suppress(Exception):  # the write's error is the one to see
                _Spill(url, ()).remove()  # no half-written spill left behind
            why = write_failure(exc, base, "spill_dir")
            if why is None:
                raise
            # the fit fails: nothing will read this op's other spills either
            _remove_written(id(self))
            setting = (f"spill_dir={self.spill_dir!r}" if self.spill_dir is not None
                       else "spill_dir=None: the temporary folder")
            raise OSError(getattr(exc, "errno", None),
                          f"Categorify: a spill of partial counts (more than spill_rows={self.spill_rows} "
                          f"distinct values) failed, {why} (now {setting}); or raise spill_rows "
                          "to spill less") from exc
        return _Spill(url, tuple(ends))

    def _merge_spilled(self, name: str, counts: _Counts) -> tuple[pa.Table, pa.Table | None]:
        """Merge spilled tables bucket by bucket; equal values always share a bucket,
        so each bucket's merge is final. Within a bucket the spills' streams are folded
        into a running merge once the unmerged ones hold more than twice its rows (and
        more than ``4 * spill_rows``): memory stays about three times the bucket's
        distinct values however many partitions spilled, for at most 1.5 times the
        merging work; with few partitions it is a single merge, as before.

        Returns the merged counts and, when the op keeps candidates (a fit, not an
        update), the values below ``freq_threshold`` apart, off the heap (see
        :class:`_OffHeapWriter`); else None and every value in the first table."""
        spills = list(counts.spilled)
        # the counts still in memory are split by bucket here rather than written out
        # and read back: this task holds them already
        held = self._bucketed(counts, 0) if counts.table is not None and counts.table.num_rows else None

        def merge_bucket(b: int) -> pa.Table:
            merged: list[pa.Table] = []
            pending: list[pa.Table] = []
            pending_rows = 0
            if held is not None:
                pending.append(_bucket_slice(held.table, held.offsets, b))
                pending_rows = pending[-1].num_rows
            for spill in spills:
                pending.append(spill.read(b))
                pending_rows += pending[-1].num_rows
                if pending_rows > max(4 * self.spill_rows, 2 * merged[0].num_rows if merged else 0):
                    merged, pending, pending_rows = [_sum_counts(merged + pending)], [], 0
            # always aggregated, even a single table: a spilled file may hold
            # unmerged partials, so one value can appear on several of its rows
            total = _sum_counts(merged + pending)
            if below is None:
                return self._threshold(total, name)
            admit = pc.greater_equal(total["counts"], threshold)
            below.add(b, total.filter(pc.invert(admit)))
            return total.filter(admit)

        # the values below freq_threshold (candidates) leave the heap bucket by bucket
        threshold = self._setting(self.freq_threshold, name)
        below = None
        if self.keep_candidates and not self.fitted and threshold > 1:
            below = _OffHeapWriter()

        # buckets are merged side by side, one per core (Arrow's reads and
        # aggregations release the GIL): memory is that of as many buckets at once.
        # On the process's shared threads where it can: a pool of its own per column
        # left its freed memory behind for the export (16M Criteo rows peaked at
        # 714-718 MB against 634-646 on the shared threads)
        try:
            # returns once no bucket reads a spill any more, also on a failure
            kept = map_shared(merge_bucket, range(self.spill_buckets), local_workers())
        finally:
            for spill in spills:
                spill.remove()
        return pa.concat_tables(kept), below.table() if below is not None else None

    def _threshold(self, counts: pa.Table, name: str) -> pa.Table:
        """``counts`` without the values below ``freq_threshold``, on the worker, where
        nothing needs them later: not when the op keeps candidates' counts, nor in an
        update (a fitted op: every kept value's count counts). :meth:`finalize`
        applies the threshold again in any case."""
        if self.keep_candidates or self.fitted:
            return counts
        threshold = self._setting(self.freq_threshold, name)
        if threshold > 1:
            counts = counts.filter(pc.greater_equal(counts["counts"], threshold))
        return counts

    def _merged(self, name: str, counts: _Counts) -> tuple[pa.Table, pa.Table | None]:
        """The counts of one vocabulary's partial as one table ``(values, counts)``, and
        the values below ``freq_threshold`` apart where they were split off already
        (see :meth:`_merge_spilled`; else None)."""
        if counts.spilled:
            return self._merge_spilled(name, counts)
        assert counts.table is not None
        # one partition's partial comes here unmerged
        return self._threshold(merge_counts([counts.table]), name), None

    def _finalize_one(self, name: str, counts: _Counts) -> tuple[pa.Table, pa.Table | None]:
        """Vocabulary ``name`` from its combined partial: its table (admitted values,
        by count descending, then value) and its candidates (None: none kept)."""
        table, split = self._merged(name, counts)
        below = split
        threshold = self._setting(self.freq_threshold, name)
        if threshold > 1 and split is None:
            admit = pc.greater_equal(table["counts"], threshold)
            below = table.filter(pc.invert(admit)) if self.keep_candidates else None
            table = table.filter(admit)
        # only the values above the threshold are sorted: most distinct values of a
        # large column are below it (sorting them all doubled a Criteo-like fit)
        table = table.take(sort_indices(table, [("counts", "descending"), ("values", "ascending")]))
        limit = self._vocab_limit(name)
        kept = table.num_rows if limit is None else min(table.num_rows, limit)
        vocabulary = table.slice(0, kept).combine_chunks()
        if not self.keep_candidates:
            return vocabulary, None
        # below freq_threshold or past max_size, in no order: counted on by
        # Workflow.update
        rest = [t for t in (below, table.slice(kept)) if t is not None and t.num_rows]
        if len(rest) == 1 and rest[0] is split:
            return vocabulary, split  # off the heap already where it is large
        if not rest:
            return vocabulary, None
        # split candidates are mapped: written on as they are, never gathered into one
        # chunk on the heap
        together = pa.concat_tables(rest)
        return vocabulary, _off_heap(together if split is not None else together.combine_chunks())

    def finalize(self, partial: dict[str, _Counts]) -> None:
        tables, candidates = {}, {}
        # a spilled vocabulary's merge uses the shared threads bucket by bucket, so
        # those come one at a time; the vocabularies merged in memory are finalized
        # side by side (sorting, filtering and writing candidates off the heap are
        # Arrow kernels that release the GIL): on the 2M-row Criteo fit this step ran
        # on one core while the other idled before the export
        spilled = [name for name, counts in partial.items() if counts.spilled]
        held = [name for name in partial if name not in spilled]
        done = {name: self._finalize_one(name, partial[name]) for name in spilled}
        done.update(zip(held, map_shared(lambda name: self._finalize_one(name, partial[name]), held,
                                         local_workers())))
        for name in partial:
            tables[name], candidate = done[name]
            if candidate is not None:
                candidates[name] = candidate
        for name, values in (self.vocabs or {}).items():
            arr = backend().normalize_missing(pa.array(values))
            if arr.null_count:
                raise ValueError(f"Categorify: the vocabulary given for {name!r} contains a missing "
                                 "value (None or NaN); missing values always get id 1")
            if len(pc.unique(arr)) != len(arr):
                raise ValueError(f"Categorify: the vocabulary given for {name!r} has duplicate values "
                                 "(-0.0 and 0.0 are one value)")
            limit = self._vocab_limit(name)
            if limit is not None and len(arr) > limit:
                raise ValueError(
                    f"Categorify: the vocabulary given for {name!r} has {len(arr)} values, but "
                    f"max_size={self._setting(self.max_size, name)} leaves room for {limit}")
            tables[name] = pa.table({"values": arr, "counts": pa.nulls(len(arr), pa.int64())})
        # selection order (single_table numbers the vocabularies one after the other
        # in this order); partials may come in another (the last merge's shards)
        order = {name: i for i, name in enumerate(self._order)}
        self.tables = dict(sorted(tables.items(), key=lambda kv: order.get(kv[0], len(order))))
        self.candidates = {k: candidates[k] for k in self.tables if k in candidates}
        self.updates = 0
        drop_lookup_indexes(self)  # those of the vocabularies replaced
        self.fitted = True
        self._stats_files = {}
        self._write_stats_files()

    # -- update (a living vocabulary, see tabstream.ops.vocabulary_policy) -----
    #: Workflow.update folds new data's counts into the fitted vocabularies
    updatable = True

    def check_updatable(self) -> None:
        if self.single_table:
            raise ValueError(
                "Categorify(single_table=True) cannot update: its vocabularies are numbered one "
                "after the other in one table, so a vocabulary that grows would move the ids of "
                "every later one; use single_table=False (one table per vocabulary) or fit again")

    def policy(self, name: str) -> VocabularyPolicy:
        """The update policy of vocabulary ``name``: its ``freq_threshold``, the capacity
        ``max_size`` leaves (None: no limit), ``eviction``, ``window`` and ``decay``."""
        return VocabularyPolicy(self._setting(self.freq_threshold, name), self._vocab_limit(name),
                                self.eviction, self.window, self.decay)

    def update(self, partial: dict[str, _Counts]) -> dict[str, tuple[list[str], int, VocabularyChange]]:
        """Fold an update's counts (partials of :meth:`fit_partition`, combined as in a
        fit) into the fitted vocabularies: kept values keep their ids, values reaching
        ``freq_threshold`` are admitted, under ``max_size`` values are evicted by
        ``eviction`` and their ids recycled (see :mod:`tabstream.ops.vocabulary_policy`).
        Vocabularies given with ``vocabs=`` stay as given. Returns, per vocabulary
        updated, its columns, the id of its first slot and what changed."""
        self.check_fitted()
        self.check_updatable()
        out = {}
        tables, candidates = dict(self.tables), dict(self.candidates)
        for name, counts in partial.items():
            vocab = Vocabulary.fitted(self.tables[name], self.candidates.get(name), self.updates)
            vocab, change = fold(vocab, self._merged(name, counts)[0], self.policy(name))
            tables[name] = vocab.slots
            cand = vocab.candidates
            if self.keep_candidates and cand.num_rows:
                candidates[name] = cand
            else:
                candidates.pop(name, None)
            out[name] = (self._vocab_columns(name), self._first_id(name), change)
        self.tables, self.candidates = tables, candidates
        self.updates += 1
        drop_lookup_indexes(self)  # the vocabularies changed
        # the id -> value files follow (a recycled id names its new value there): those
        # of the vocabularies folded, or all where they were not current already
        names = list(partial) if self._files_current else None
        self._files_current = False
        self._write_stats_files(names)
        return out

    def _vocab_columns(self, name: str) -> list[str]:
        """The output columns vocabulary ``name`` encodes."""
        if self.encode_type != "combo":
            for group in self.column_groups or []:
                if len(group) > 1 and self._vocab_name(group) == name:
                    return list(group)
        return [name]

    # -- transform ----------------------------------------------------------
    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        out: dict[str, Any] = {}
        for group in self._checked_groups(table.column_names):
            name = self._vocab_name(group)
            if name not in self.tables:
                raise KeyError(f"Categorify has no vocabulary for {name!r}; it was fitted on {sorted(self.tables)}")
            if self.encode_type == "combo" and len(group) > 1:
                out[name] = self._encode(name, _combo_key(table, group))
            else:
                for col in group:
                    out[col] = self._encode(name, table.column(col))
        return pa.table(out)

    def _encode(self, name: str, column: pa.ChunkedArray | pa.Array) -> pa.Array:
        column = _without_views(column)
        if pa.types.is_dictionary(column.type) and not _is_list(column.type.value_type):
            return self._encode_dictionary(name, column)
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks()
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        kernels = backend()
        column = kernels.normalize_missing(column)
        if _is_list(column.type):
            offsets, child = kernels.list_offsets(column), kernels.list_flatten(column)
            ids = self._encode_flat(name, child)
            return type(column).from_arrays(offsets, ids, mask=column.is_null() if column.null_count else None)
        return self._encode_flat(name, column)

    def _encode_dictionary(self, name: str, column: pa.ChunkedArray | pa.Array) -> pa.Array:
        """Ids of a dictionary column, chunk by chunk without decoding: each chunk's
        dictionary is encoded like a plain column (its null and NaN entries get id 1),
        and the rows take their entry's id; a null index is missing (id 1)."""
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        out_type = dtype_to_arrow_type(self.dtype)
        kernels = backend()
        out = []
        for chunk in chunks:
            ids = self._encode_flat(name, kernels.normalize_missing(chunk.dictionary))
            indices = chunk.indices
            if indices.null_count:
                # a null index points at one extra entry holding the null id: filling
                # the narrow indices, then a take without nulls, costs about a third of
                # a take with nulls followed by filling the wide ids
                ids = pa.concat_arrays([ids, pa.array([NULL_ID], out_type)])
                if indices.type.bit_width < 32:
                    indices = indices.cast(pa.int32())  # room for the extra entry's index
                indices = pc.fill_null(indices, pa.scalar(len(ids) - 1, indices.type))
            out.append(ids.take(indices))
        return pa.concat_arrays(out) if out else pa.array([], out_type)

    def _encode_flat(self, name: str, column: pa.Array) -> pa.Array:
        out_type = dtype_to_arrow_type(self.dtype)
        vocab = self.tables[name]["values"]
        if vocab.type != column.type:
            try:
                vocab = vocab.cast(column.type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise TypeError(f"Categorify: column {name!r} is {column.type}, "
                                f"but it was fitted on {vocab.type}") from exc
        kernels = backend()
        index = self._vocabulary_index(name, vocab, kernels)
        first = self._first_id(name)
        buckets = self.buckets_of(name)
        if not buckets:
            return _cast_ids(kernels.encode_ids(column, vocab, first, NULL_ID, OOV_ID, index), out_type, name)
        # values out of the vocabulary get -1 (no id is negative), then their hash bucket
        ids = kernels.encode_ids(column, vocab, first, NULL_ID, -1, index)
        oov = pa.array(kernels.murmur3(column).hashes.astype(np.int64) % buckets + OOV_ID)
        return _cast_ids(pc.if_else(pc.equal(ids, -1), oov, ids), out_type, name)

    def _vocabulary_index(self, name: str, vocab: pa.ChunkedArray, kernels: Any) -> Any:
        """The backend's lookup index over ``vocab`` (vocabulary ``name`` as the column
        being encoded takes it: cast to its type), built on first use in this process
        and kept for every later partition (see
        :meth:`~tabstream.backends.base.Backend.vocabulary_index`); dropped with the
        vocabularies when the op is fitted or loaded again, rebuilt when a vocabulary
        table is replaced. One thread builds it; others asking meanwhile wait for it."""
        return held_index(lookup_indexes(self, name), (type(kernels), vocab.type), self.tables[name],
                          lambda: kernels.vocabulary_index(vocab))

    # -- state --------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        values = {"vocabularies": list(self.tables), "candidates": list(self.candidates),
                  "updates": self.updates}
        return values, {**{f"vocab.{k}": v for k, v in self.tables.items()},
                        **{f"cand.{k}": v for k, v in self.candidates.items()}}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.tables = {k: tables[f"vocab.{k}"] for k in values["vocabularies"]}
        self.candidates = {k: tables[f"cand.{k}"] for k in values.get("candidates", [])}
        self.updates = int(values.get("updates", 0))
        drop_lookup_indexes(self)
        self.fitted = True
        # files under out_path no longer known to match: written again on first use
        # (stats_files). Where this op wrote them already (Workflow.update putting back
        # the state it started from) they are rewritten now, as far as the folder allows
        self._files_current = False
        if self._stats_files:
            with contextlib.suppress(ExportError):
                self._write_stats_files()

    def reverse_mapping(self, name: str) -> pa.Table:
        """``(id, value, counts)`` of every vocabulary entry of ``name`` (a column, a
        joint group's first column, or a combo column); combo values are the
        group's values joined by ``"\\x1f"`` (``"\\x00"`` for a null part; a string
        value's own ``"\\x1b"``, ``"\\x1f"`` and ``"\\x00"`` are written ``"\\x1be"``,
        ``"\\x1bs"`` and ``"\\x1bn"``)."""
        self.check_fitted()
        key = name if name in self.tables else next(
            (self._vocab_name(g) for g in self._groups(self._fitted_columns()) if name in g), None)
        if key is None or key not in self.tables:
            raise KeyError(f"Categorify has no vocabulary for {name!r}; it has {sorted(self.tables)}")
        vocab = self.tables[key]
        first = self._first_id(key)
        ids = pa.array(np.arange(first, first + vocab.num_rows, dtype=np.int64))
        return pa.table({"id": ids, "value": vocab["values"], "counts": vocab["counts"]})


def _flatten(groups: list[list[str]]) -> list[str]:
    return [n for g in groups for n in g]


def _normalize_groups(groups: list) -> list[list[str]]:
    out = []
    for g in groups:
        if isinstance(g, str):
            out.append([g])
        elif isinstance(g, (list, tuple)) and g and all(isinstance(n, str) for n in g):
            out.append(list(g))
        else:
            raise TypeError(f"Categorify: column groups must be names or lists of names, got {g!r}")
    return out


def _id_dtype(dtype: Any) -> str:
    """The integer dtype name of Categorify's ids: a name, numpy dtype or Arrow type
    of an integer type; None is ``int64`` (NVTabular's default)."""
    if dtype is None:
        return "int64"
    try:
        name, is_list = arrow_type_to_dtype(dtype_to_arrow_type(dtype))
    except TypeError as exc:
        raise TypeError(f"Categorify: dtype must be an integer dtype such as 'int32', np.int64 or "
                        f"None, got {dtype!r}") from exc
    if is_list or not name.startswith(("int", "uint")):
        raise TypeError(f"Categorify: dtype must be an integer dtype such as 'int32', np.int64 or "
                        f"None, got {dtype!r}")
    return name


def _cast_ids(ids: Any, out_type: pa.DataType, name: str) -> Any:
    """Ids as ``dtype``; an id the dtype cannot hold is an error naming the fix."""
    try:
        return ids.cast(out_type)
    except pa.ArrowInvalid as exc:
        raise ValueError(f"Categorify: the ids of {name!r} do not fit dtype {out_type} ({exc}); "
                         "pass a wider dtype, e.g. dtype='int64'") from exc

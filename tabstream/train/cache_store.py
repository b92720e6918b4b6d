"""A parameter server for embedding tables larger than memory (no framework needed).

Every table's rows and their optimizer state live here, in memory-mapped files
(``storage="disk"``) or in host memory (``storage="memory"``); a model reads rows
with :meth:`ParameterServer.lookup` and hands back one gradient per row with
:meth:`ParameterServer.apply`, which runs the sparse optimizer on those rows only
(the "fused" update). ``tabstream.train.torch.CachedEmbeddings`` puts a bounded
cache of hot rows in front of it:

    >>> import os, tempfile
    >>> import pyarrow.parquet as pq
    >>> from tabstream.train.tables import TableConfig
    >>> tmp = tempfile.TemporaryDirectory()
    >>> configs = [TableConfig("C1", 1000, 4, ("C1",))]
    >>> ps = ParameterServer(os.path.join(tmp.name, "ps"), configs, storage="disk", seed=0,
    ...                      optimizer="adagrad", lr=0.05)
    >>> before = ps.lookup("C1", [0, 7])         # never trained: the initial rows
    >>> before.shape, before.dtype
    ((2, 4), dtype('float32'))
    >>> new = ps.apply("C1", [7], np.ones((1, 4), np.float32))   # one gradient row per id
    >>> np.round(new - before[1:], 4)            # adagrad's first step: lr * g / |g|
    array([[-0.05, -0.05, -0.05, -0.05]], dtype=float32)
    >>> ps.flush()                               # commit (the version)
    1
    >>> ps.export_delta(os.path.join(tmp.name, "delta", "0"))   # rows updated per table
    {'C1': 1}
    >>> pq.read_table(os.path.join(tmp.name, "delta", "0", "C1", "part_00000.parquet"))["key"].to_pylist()
    [7]
    >>> tmp.cleanup()

Layout of ``path`` (disk storage)::

    _server.json        settings, tables, and the last committed mark (written atomically;
                        the mark holds each table's slot count); while a rollback_to the
                        previous mark is under way, that rollback (see below)
    C1.slots.f32        the records of the rows ever written, packed in slots given out
                        in first-write order: the weight (dim float32), the optimizer
                        state (adagrad: sum of squares; adam: m then v), then the update
                        counter when it last changed (int64); a sparse file
    C1.slots.i64        the id of each slot, in slot order
    C1.changes.i64      per commit, the ids it changed (for export_delta and touched)
    _undo/from_<n>.log  the previous values of committed rows changed after mark n

A row, its state and its version are adjacent: a lookup or an update is one
read of one place per row. Packed records keep a commit's write-out near the
bytes changed: with a record at ``id * width`` (format 2, which ``open`` upgrades
in place, as format 1's three files per table) every scattered row updated
between two commits dirtied a page of its own.

Why a row costs nothing until it is touched: its initial value is a hash of
(seed, table, row, column), computed when the row is read, and nothing is stored
for it until it is updated (it has no slot; the slot index says so without a
read).

Crash safety: before a committed row is overwritten its old value is appended to
the undo log; :meth:`flush` commits a mark (the records and slot ids are synced,
the ids changed since the last mark are appended to the change log, the log
restarts). :meth:`open` rolls back everything after the last mark (rows first
written after it go with their slots: the mark's slot count is kept), so a
server killed at any point (``kill -9`` included) reopens exactly as it was at
its last ``flush``. The log of the interval before the last mark is kept too, so
that a training checkpoint written just before that mark can still be matched
(:meth:`rollback_to`). Such a rollback is decided by one write of ``_server.json``
(field ``rollback``: the version gone back to and the vocabulary resets to make
again) before any row changes; the rows are then restored from that log (synced),
the change log cut, ``_server.json`` written at the previous mark, and only then the
log deleted. Each step may be repeated (the logged values are absolute), so
:meth:`open` finishes a rollback cut short: a folder killed in one reopens at the
newer mark (killed before the decision) or at the previous one (after it), never
in between. What no crash can leave is refused by :meth:`open`, before
anything in the folder changes: a ``_server.json`` field of another type or range,
a storage the files contradict, a rows file missing or empty under a mark with
rows, a mark's slot count below the rows the change log's commits wrote or above
the ids written (a crash leaves more slot ids than the mark, never fewer, and cuts
the change log before the mark that drops its rows).

Why memory maps rather than an embedded key-value store: rows are fixed-size and
addressed by a dense integer slot, so a file offset is the index; reads and writes
are vectorized numpy gathers/scatters. Pages the process touched count in its
resident size until released, so the maps are released (``madvise(DONTNEED)``,
their data stays in the page cache and the files) whenever ``release_bytes`` of
rows have been touched since the last release.
"""

from __future__ import annotations

import dataclasses
import fcntl
import inspect
import json
import math
import mmap
import os
import shutil
import socket
import time
import weakref
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.jsonfile import read_json_file, sync_folder, write_json_file
from tabstream.train.ps_layout import SlotIndex
from tabstream.train.tables import TableConfig

__all__ = ["OPTIMIZERS", "ParameterServer", "STORAGES", "initial_rows", "vocabulary_resets"]

OPTIMIZERS = ("adagrad", "adam")
STORAGES = ("disk", "memory")
_FORMAT = "tabstream.ParameterServer/3"
_FORMAT_V2 = "tabstream.ParameterServer/2"  # a record at id * width; upgraded by open()
_FORMAT_V1 = "tabstream.ParameterServer/1"  # three files per table; upgraded by open()
_META = "_server.json"
_UNDO = "_undo"
_SNAPSHOT = "_snapshot"
_LOCK = "_lock"
_MAGIC = b"TSUNDO01"
_DEFAULT_EPS = {"adagrad": 1e-10, "adam": 1e-8}


# --------------------------------------------------------------------------
# deterministic initial values


def _splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def initial_rows(seed: int, table: str, ids: np.ndarray, dim: int, scale: float) -> np.ndarray:
    """The initial value of rows ``ids`` of ``table``: uniform in ``[-scale, scale)``,
    a function of ``(seed, table, row, column)`` only (a SplitMix64 hash), so any
    row can be recomputed at any time without storing it.

    >>> rows = initial_rows(0, "C1", np.array([5, 6]), 4, 0.05)
    >>> rows.shape, bool((abs(rows) < 0.05).all())
    ((2, 4), True)
    >>> np.array_equal(initial_rows(0, "C1", np.array([6]), 4, 0.05), rows[1:])   # per row
    True
    """
    ids = np.asarray(ids, dtype=np.uint64)
    key = np.uint64((int(seed) * 0x100000001B3 + zlib.crc32(table.encode())) % (1 << 64))
    counter = ids[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64)[None, :]
    bits = _splitmix64(_splitmix64(counter ^ key))
    unit = (bits >> np.uint64(40)).astype(np.float64) / float(1 << 24)  # 24 bits: exact in f32
    return ((unit * 2.0 - 1.0) * scale).astype(np.float32)


def vocabulary_resets(delta: Any, tables: Mapping[str, Sequence[str]]) -> dict[str, np.ndarray]:
    """The embedding rows a vocabulary delta recycles, per table: ``{table: sorted ids}``.

    ``delta``: a ``VocabularyDelta`` (``Workflow.update``'s), the folder of one
    (``<workflow>/vocabulary/update_<n>``, or what ``VocabularyDelta.write`` wrote), or
    a mapping ``{table or column: ids}``. ``tables``: ``{table: its feature names}``; a
    vocabulary maps to the table of its name, else to the tables of its columns.
    Vocabularies with no table here are left out (another module holds them)."""
    from tabstream.pipeline.vocabulary_delta import VocabularyDelta

    if isinstance(delta, (str, os.PathLike)):
        delta = VocabularyDelta.read(os.fspath(delta))
    if isinstance(delta, Mapping):
        items = [(str(k), (str(k),), np.asarray(v)) for k, v in delta.items()]
    elif isinstance(delta, VocabularyDelta):
        items = [(name, tuple(cols), ids) for name, (cols, ids) in delta.resets().items()]
    else:
        raise TypeError(f"a vocabulary delta is a VocabularyDelta, the folder of one or a mapping "
                        f"{{table: ids}}, got {type(delta).__name__}")
    by_feature: dict[str, list[str]] = {}
    for table, features in tables.items():
        for f in features:
            by_feature.setdefault(f, []).append(table)
    out: dict[str, list[np.ndarray]] = {}
    for name, columns, ids in items:
        if ids.size and ids.dtype.kind not in "iu":
            raise TypeError(f"vocabulary delta: the ids of {name!r} must be integers, got dtype {ids.dtype}")
        targets = [name] if name in tables else list(dict.fromkeys(t for c in columns for t in by_feature.get(c, [])))
        for table in targets:
            out.setdefault(table, []).append(ids.reshape(-1).astype(np.int64))
    return {t: np.unique(np.concatenate(parts)) for t, parts in out.items()}


# --------------------------------------------------------------------------
# storage


class _Table:
    """One table's rows: a record per row, ``weight | optimizer state | version``.

    A record is ``width`` float32: the weight (``dim``), the state
    (``n_state * dim``), padding to an even count, then the row's version (int64
    in the last two slots). One read brings a row, its state and its version.

    Memory storage keeps the record of row ``i`` at ``i`` in anonymous memory (a
    page is backed once written) and the versions a second time in a dense array
    (scanned by its snapshots).

    Disk storage packs the records of the rows ever written in ``<name>.slots.f32``,
    in the order they were first written: a row gets the next free *slot* when it
    is first written, and ``<name>.slots.i64`` gets its id (the k-th entry is the
    id of slot k); :class:`SlotIndex` maps ids to slots in memory. Rows never
    written have no slot and are not read at all. Hot rows, written first, share
    pages at the front; the rows new in an interval are appended in one run. So a
    commit interval dirties about ``rows * record size`` bytes instead of a page
    per row (ids are scattered: with a record at ``id * width`` each updated row
    had its own 4 KB page, about 30 times the data for a 136-byte record, all
    written out by the commit's sync). The slot file has the apparent size of a
    full table (sparse) and is mapped once; its blocks are taken with
    ``posix_fallocate`` in growing chunks before slots are given out, so a full
    disk is an ``OSError`` there, never a SIGBUS in a write through the map.
    ``<name>.changes.i64`` holds the ids changed in each committed interval (for
    :meth:`ParameterServer.export_delta` and ``touched``).
    """

    def __init__(self, cfg: TableConfig, n_state: int, folder: Path | None,
                 committed: int = 0) -> None:
        """``committed``: the slot count of the folder's last mark (disk): its rows
        file must hold them (a file missing or emptied is refused, not re-created)."""
        self.cfg = cfg
        self.n_state = n_state
        d = cfg.dim
        self.span = d + n_state * d
        self.width = self.span + (self.span % 2) + 2
        self.record_bytes = self.width * 4
        self._maps: list[mmap.mmap] = []
        self.in_memory = folder is None
        self.fd: int | None = None
        self.ids_fd: int | None = None
        self.dirty: list[np.ndarray] = []  # ids written since the last commit (disk)
        # the commit of the change log's last segment (disk): what a mark records, so
        # that a log cut short is seen at open (None: read from the file when asked)
        self.last_change: int | None = None
        self.index = SlotIndex()
        self.count = 0  # slots given out (disk)
        self.kept = 0  # slots at the last mark: rewrites of these are logged for undo
        self.allocated = 0  # slots with disk blocks in both files
        n = cfg.cardinality
        if folder is None:  # host memory: zeroed pages are only backed once written
            self.rec = self._anonymous(np.float32, (n, self.width))
            self.version_array = self._anonymous(np.int64, (n,))
            self.path = self.ids_path = self.changes_path = None
        else:
            self.path = folder / f"{cfg.name}.slots.f32"
            self.ids_path = folder / f"{cfg.name}.slots.i64"
            self.changes_path = folder / f"{cfg.name}.changes.i64"
            self.rec = self._map(self.path, (n, self.width), committed)
            self.ids_fd = os.open(self.ids_path, os.O_RDWR | os.O_CREAT, 0o644)

    # -- memory ----------------------------------------------------------------

    def _anonymous(self, dtype: Any, shape: tuple[int, ...]) -> np.ndarray:
        size = max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
        mm = mmap.mmap(-1, size)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            # with transparent huge pages a row written anywhere would back 2 MB, and
            # scattered ids would soon back the whole table (measured: 7.2 GB resident
            # for a 50M x 16 table after 100 steps)
            mm.madvise(mmap.MADV_NOHUGEPAGE)
        self._maps.append(mm)
        return np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape))).reshape(shape)

    def _map(self, path: Path, shape: tuple[int, ...], committed: int = 0) -> np.ndarray:
        size = int(np.prod(shape)) * 4
        # a new file, or an empty one, is made full size here (sparse): right for a new
        # server or a mark of no slots, but a mark's committed rows would read as
        # "never written" (initial values). A crash cannot leave it so (the file has
        # its size from the server's creation on, and a flush syncs it before a mark)
        have = path.stat().st_size if path.exists() else None
        if committed and not have:
            raise DataError(
                f"parameter server file {path} is "
                + ("missing" if have is None else "empty (0 bytes)")
                + f", but the last commit in {_META} (field 'mark.slots.{self.cfg.name}') has "
                f"{committed} rows in it; the folder is damaged",
                hint="restore the folder from a copy, or start a new server")
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            have = os.fstat(fd).st_size
            if have != size:
                if have not in (0, size):
                    raise DataError(
                        f"parameter server file {path} has {have} bytes, expected {size} "
                        f"({shape[0]} records of {shape[1]} float32); the folder is damaged "
                        "or was written for other table sizes"
                    )
                os.ftruncate(fd, size)  # a sparse file: holes read as zeros and use no blocks
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        if hasattr(mmap, "MADV_RANDOM"):
            # rows are read by scattered slots: without this every fault also maps (and
            # reads ahead) its neighbours, which multiplied the resident size by ~4
            mm.madvise(mmap.MADV_RANDOM)
        self._maps.append(mm)
        return np.frombuffer(mm, dtype=np.float32).reshape(shape)

    # -- slots (disk) ------------------------------------------------------------

    def open_slots(self, count: int) -> None:
        """Take the first ``count`` slots of the files (the committed ones) as the
        table's; later entries of the id file are left over from after the mark."""
        assert self.ids_fd is not None
        have = os.fstat(self.ids_fd).st_size // 8
        if have < count:
            raise DataError(
                f"parameter server file {self.ids_path} holds {have} slot ids, its last "
                f"commit has {count}; the folder is damaged",
                hint="restore the folder from a copy, or start a new server")
        data = os.pread(self.ids_fd, 8 * count, 0) if count else b""
        ids = np.frombuffer(data, np.int64).copy()
        if len(ids) and (ids.min() < 0 or ids.max() >= self.cfg.cardinality):
            raise DataError(f"parameter server file {self.ids_path} holds ids outside the "
                            f"table's {self.cfg.cardinality} rows; the folder is damaged",
                            hint="restore the folder from a copy, or start a new server")
        self.index = SlotIndex(ids)
        repeated = self.index.repeated()
        if repeated is not None:  # slots are given to ids without one: never twice
            raise DataError(
                f"parameter server file {self.ids_path} gives id {repeated} more than one of the "
                f"{count} committed slots (field 'mark.slots.{self.cfg.name}' of {_META}); the "
                "folder is damaged", hint="restore the folder from a copy, or start a new server")
        self.count = self.kept = self.allocated = count
        self.dirty = []

    def check_changes(self, mark: int, recorded: int | None = None,
                      rolling_back_to: int | None = None) -> None:
        """Every id the change log lists for commits up to ``mark`` has a committed
        slot (see :meth:`open_slots`): a row a commit changed was given a slot before
        it. A mark's slot count lower than the files hold drops committed rows; a
        crash cannot leave that (segments after the mark are ignored, a rollback cuts
        the log before its mark is written, so a crash leaves fewer ids, never more).
        ``recorded``: the commit of the log's last segment as the mark records it
        (absent in folders written before it was): a log whose last whole segment up
        to ``mark`` is another was cut short or edited, and its rows would be missing
        from every later :meth:`ParameterServer.export_delta`. ``rolling_back_to``:
        that commit of the previous mark while a rollback to it is under way (the log
        may be cut there already)."""
        segments = _read_segments(self.changes_path)
        last = max((tag for tag, _ in segments if tag <= mark), default=0)
        if recorded is not None and last not in (recorded, rolling_back_to):
            found = (f"its last whole segment up to that commit is commit {last}'s" if last
                     else "it holds no whole segment up to that commit")
            raise DataError(
                f"parameter server file {self.changes_path}: the last commit (field "
                f"'mark.changes.{self.cfg.name}' of {_META}) changed rows in commit {recorded}, "
                f"but {found}; the change log was cut short or edited, and export_delta "
                "would leave out the rows it lost",
                hint="restore the folder from a copy, or start a new server")
        self.last_change = last
        for tag, ids in segments:
            if tag > mark:
                continue
            lost = ids[self.index.find(ids) < 0]
            if len(lost):
                raise DataError(
                    f"parameter server file {self.changes_path} says commit {tag} changed rows "
                    f"{lost[:5].tolist()}{' ...' if len(lost) > 5 else ''} of table "
                    f"{self.cfg.name!r}, which hold no slot among the last commit's: field "
                    f"'mark.slots.{self.cfg.name}' of {_META} is {self.count}, fewer than the "
                    "rows the files hold; the folder is damaged or was edited",
                    hint="restore the folder from a copy, or start a new server")

    def slots(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each of rows ``ids``, -1 for rows never written."""
        return self.index.find(ids)

    def prepare(self, new: int) -> None:
        """Give disk blocks to ``new`` more slots (in both files) before they are
        given out; a full disk raises ``OSError`` (ENOSPC) here and changes nothing."""
        need = self.count + new
        if self.in_memory or need <= self.allocated:
            return
        assert self.fd is not None and self.ids_fd is not None
        rb = self.record_bytes
        # growing chunks: 256 KB at first, doubling, at most 64 MB past what is needed
        grown = max(min(2 * self.allocated, self.allocated + (64 << 20) // rb), (256 << 10) // rb)
        target = min(self.cfg.cardinality, max(need, grown))
        _allocate(self.fd, self.allocated * rb, (target - self.allocated) * rb)
        _allocate(self.ids_fd, self.allocated * 8, (target - self.allocated) * 8)
        self.allocated = target

    def cut(self, count: int | None) -> None:
        """Forget the slots ``>= count`` (given out after the mark rolled back to);
        ``None``: a mark of a folder upgraded from format 2, whose count is unknown
        (rows rolled back to "never written" read as such from their records)."""
        if self.in_memory or count is None or count >= self.count:
            return
        self.index.keep_below(count)
        self.count = count
        self.kept = min(self.kept, count)

    # -- rows --------------------------------------------------------------------

    def read(self, ids: np.ndarray) -> np.ndarray:
        """The records of rows ``ids``, ``(len(ids), width)`` (a copy; one gather);
        records never written are zeros, not read."""
        if self.in_memory:
            return np.take(self.rec, ids, axis=0)
        slots = self.slots(ids)
        have = slots >= 0
        if have.all():
            return np.take(self.rec, slots, axis=0)
        out = np.zeros((len(ids), self.width), np.float32)
        if have.any():
            out[have] = np.take(self.rec, slots[have], axis=0)
        return out

    def split(self, records: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(weight, state, version)`` views of records."""
        d = self.cfg.dim
        version = np.ascontiguousarray(records[:, -2:]).view(np.int64).reshape(-1)
        return records[:, :d], records[:, d:self.span], version

    def record(self, w: np.ndarray, s: Any, v: Any) -> np.ndarray:
        out = np.zeros((len(w), self.width), np.float32)
        out[:, :self.cfg.dim] = w
        out[:, self.cfg.dim:self.span] = s
        out[:, -2:] = np.broadcast_to(np.asarray(v, np.int64), (len(w),)).reshape(-1, 1).view(np.float32)
        return out

    def write(self, ids: np.ndarray, records: np.ndarray, slots: np.ndarray | None = None) -> None:
        """Store ``records`` of rows ``ids`` (sorted, distinct). Disk: rows without
        a slot get the next ones (their records and ids written with ``pwrite``, in
        one run each, before the index knows them), so an ``OSError`` leaves the
        table as it was; rows with a slot are written through the map."""
        if not len(ids):
            return
        if self.in_memory:
            self.rec[ids] = records
            self.version_array[ids] = self.split(records)[2]
            return
        if slots is None:
            slots = self.slots(ids)
        new = slots < 0
        if new.any():
            k = int(new.sum())
            self.prepare(k)
            assigned = np.arange(self.count, self.count + k, dtype=np.int64)
            _pwrite_all(self.fd, np.ascontiguousarray(records[new]), self.count * self.record_bytes)
            _pwrite_all(self.ids_fd, np.ascontiguousarray(ids[new], np.int64), self.count * 8)
            self.index.add(ids[new], assigned)
            self.count += k
            old = ~new
            if old.any():
                self.rec[slots[old]] = records[old]
        else:
            self.rec[slots] = records
        self.dirty.append(ids)

    def restore(self, ids: np.ndarray, records: np.ndarray) -> None:
        """Put logged ``records`` back (a rollback): rows without a slot were first
        written after the mark and go with their slots (:meth:`cut`)."""
        if self.in_memory:
            self.write(ids, records)
            return
        slots = self.slots(ids)
        have = slots >= 0
        self.rec[slots[have]] = records[have]

    # -- commit ------------------------------------------------------------------

    def release(self) -> None:
        """Drop this process's mapping of the pages (the data stays in the files)."""
        # No msync needed: in a shared file mapping, dropped pages stay in the page
        # cache, dirty ones included, and reach the file as usual (flush() syncs).
        if self.in_memory:
            return  # DONTNEED on anonymous memory would zero it
        for mm in self._maps:
            if hasattr(mmap, "MADV_DONTNEED"):
                mm.madvise(mmap.MADV_DONTNEED)

    def sync(self) -> None:
        for fd in (self.fd, self.ids_fd):
            if fd is not None:
                os.fsync(fd)  # the map's dirty pages included (one page cache)

    def commit_changes(self, tag: int) -> None:
        """Append the ids written since the last commit, as the segment of mark
        ``tag``, to the change log (synced)."""
        if self.in_memory:
            return
        ids = np.unique(np.concatenate(self.dirty)) if self.dirty else np.zeros(0, np.int64)
        if len(ids):
            _append_segment(self.changes_path, tag, ids)
            self.last_change = tag
        self.dirty = []

    def change_mark(self, upto: int) -> int:
        """The commit of the change log's last segment up to ``upto`` (0: none)."""
        if self.last_change is None:
            self.last_change = max((tag for tag, _ in _read_segments(self.changes_path)
                                    if tag <= upto), default=0)
        return self.last_change

    def changed(self, after: int, upto: int | None = None) -> np.ndarray:
        """Sorted ids in the change-log segments of marks in ``(after, upto]``."""
        parts = [ids for tag, ids in _read_segments(self.changes_path)
                 if tag > after and (upto is None or tag <= upto)]
        return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)

    def close(self) -> None:
        self.rec = self.version_array = None  # type: ignore[assignment]
        for mm in self._maps:
            try:
                mm.close()
            except BufferError:  # a caller still holds a view; the map closes with it
                pass
        self._maps = []
        for name in ("fd", "ids_fd"):
            fd = getattr(self, name)
            if fd is not None:
                os.close(fd)
                setattr(self, name, None)


def _allocate(fd: int, offset: int, length: int) -> None:
    """Disk blocks for ``length`` bytes at ``offset`` (ENOSPC: an ``OSError``)."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, offset, length)
        return
    # no posix_fallocate (macOS): zeros written where the file has none yet take
    # the blocks the same way (the region is past every slot given out)
    block = 1 << 20
    for at in range(offset, offset + length, block):
        _pwrite_all(fd, np.zeros(min(block, offset + length - at), np.uint8), at)


def _pwrite_all(fd: int | None, array: np.ndarray, at: int) -> None:
    """Write ``array``'s bytes at offset ``at`` (pwrite may write part of them)."""
    assert fd is not None
    data = memoryview(array).cast("B")
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n


_SEGMENT = b"TSCHG001"


def _append_segment(path: Path, tag: int, ids: np.ndarray) -> None:
    """One segment: magic, mark, count, ids, count again (a segment cut short by a
    crash has no trailer and is ignored, then cut off, by the reader)."""
    body = _SEGMENT + np.array([tag, len(ids)], np.int64).tobytes() + ids.astype(np.int64).tobytes()
    record = memoryview(body + np.int64(len(ids)).tobytes())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            while record:
                record = record[os.write(fd, record):]
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def _read_segments(path: Path | None) -> list[tuple[int, np.ndarray]]:
    """The whole segments of a change log, in order: ``[(mark, ids)]``."""
    if path is None or not path.exists():
        return []
    data = path.read_bytes()
    out, pos = [], 0
    while pos + 32 <= len(data) and data[pos:pos + 8] == _SEGMENT:
        tag, n = (int(x) for x in np.frombuffer(data, np.int64, 2, pos + 8))
        end = pos + 24 + 8 * n
        if end + 8 > len(data) or int(np.frombuffer(data, np.int64, 1, end)[0]) != n:
            break
        out.append((tag, np.frombuffer(data, np.int64, n, pos + 24)))
        pos = end + 8
    return out


def _keep_segments(path: Path | None, upto: int) -> None:
    """Cut the change log after its last whole segment of a mark <= ``upto``
    (segments of marks rolled back, or written by a flush that never committed)."""
    if path is None or not path.exists():
        return
    data = path.read_bytes()
    pos = keep = 0
    while pos + 32 <= len(data) and data[pos:pos + 8] == _SEGMENT:
        tag, n = (int(x) for x in np.frombuffer(data, np.int64, 2, pos + 8))
        end = pos + 24 + 8 * n
        if end + 8 > len(data) or int(np.frombuffer(data, np.int64, 1, end)[0]) != n or tag > upto:
            break
        pos = keep = end + 8
    if keep != len(data):
        with open(path, "r+b") as f:
            f.truncate(keep)
            os.fsync(f.fileno())


def _compact_segments(path: Path | None, upto: int) -> None:
    """Merge the segments of marks <= ``upto`` into one (written aside, renamed):
    the log stays as large as the rows ever touched, not the sum of all intervals."""
    segments = _read_segments(path)
    old = [ids for tag, ids in segments if tag <= upto]
    if path is None or len(old) < 2:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    _append_segment(tmp, max(tag for tag, _ in segments if tag <= upto), np.unique(np.concatenate(old)))
    for tag, ids in segments:
        if tag > upto:
            _append_segment(tmp, tag, ids)
    os.replace(tmp, path)
    # the rename too: later commits append to the merged file, and a power loss that
    # brought the old name back would lose their segments
    sync_folder(path.parent)


def _save_synced(path: Path, array: np.ndarray) -> None:
    """``np.save`` to ``path``, then its bytes forced to the disk: a snapshot folder is
    renamed into place only once every file in it would survive a power loss (a
    rename is ordered against a kill -9 by the page cache, not against a crash of the
    machine)."""
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())


def _config_dict(cfg: TableConfig) -> dict[str, Any]:
    return {"name": cfg.name, "cardinality": cfg.cardinality, "dim": cfg.dim,
            "feature_names": list(cfg.feature_names), "is_list": cfg.is_list,
            "combiner": cfg.combiner,
            "list_features": None if cfg.list_features is None else list(cfg.list_features)}


def _list_features(value: Any) -> tuple[str, ...] | None:
    return None if value is None else tuple(value)


# --------------------------------------------------------------------------
# checks of a folder's _server.json (open)

_DAMAGED = "restore the folder from a copy, or start a new server"
# the files of a disk server's table, of this format and the two open() upgrades
_DISK_SUFFIXES = ("slots.f32", "slots.i64", "changes.i64", "rows.f32", "weight.f32",
                  "state.f32", "version.i64")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _bad_field(path: Path, field: str, value: Any, expected: str) -> DataError:
    text = repr(value)
    text = text[:57] + "..." if len(text) > 60 else text
    return DataError(f"{path}: field {field!r} is {text}, expected {expected}; the file is "
                     "damaged or was edited", hint=_DAMAGED)


def _check_meta(meta: dict[str, Any], path: Path, configs: Sequence[TableConfig]) -> None:
    """What :meth:`ParameterServer.open` reads from ``_server.json`` (at ``path``),
    checked before anything in the folder is touched: the settings as the
    constructor takes them, the marks as a commit writes them, and the storage
    against the files present. A field of another type or range is a DataError
    naming it, its value and what was expected (not a raw error later)."""
    names = [c.name for c in configs]
    for name in names:
        if "/" in name or name.startswith(("_", ".")) or not name:
            raise _bad_field(path, "tables.name", name, "a table name that can name a file (no "
                             "'/', not starting with '_' or '.')")
    if len(set(names)) != len(names):
        raise _bad_field(path, "tables.name", sorted(n for n in set(names) if names.count(n) > 1),
                         "each table once")
    for field, allowed in (("storage", STORAGES), ("optimizer", OPTIMIZERS)):
        if not isinstance(meta.get(field), str) or meta[field] not in allowed:
            raise _bad_field(path, field, meta.get(field), f"one of {allowed}")
    if not _is_int(meta.get("seed")):
        raise _bad_field(path, "seed", meta.get("seed"), "an integer")
    if not (_is_number(meta.get("lr")) and meta["lr"] > 0):
        raise _bad_field(path, "lr", meta.get("lr"), "a positive number")
    betas = meta.get("betas")
    if not (isinstance(betas, list) and len(betas) == 2 and all(map(_is_number, betas))):
        raise _bad_field(path, "betas", betas, "a list of two numbers")
    for field in ("eps", "init_scale"):
        if not _is_number(meta.get(field)):
            raise _bad_field(path, field, meta.get(field), "a finite number")
    _check_mark(meta.get("mark"), path, "mark.", configs)
    if meta.get("previous") is not None:
        _check_mark(meta["previous"], path, "previous.", configs)
    _check_rollback(meta, path, configs)
    disk = meta["storage"] == "disk"
    pending = meta.get("pending_export")
    if pending is not None and not (isinstance(pending, dict) and isinstance(pending.get("dir"), str)
                                    and _is_int(pending.get("version")) and pending["version"] >= 0):
        raise _bad_field(path, "pending_export", pending,
                         "null or {'dir': a folder, 'version': an integer >= 0}")
    # the storage against the files: a disk server's folder read as a memory one (or
    # the other way) would answer every row with its initial value
    folder = path.parent
    if disk:
        found = [n for n in (_SNAPSHOT, f".{_SNAPSHOT}.old") if (folder / n).exists()]
        expected = "'memory' (a memory server's snapshot is there)"
    else:
        found = [f"{n}.{suffix}" for n in names for suffix in _DISK_SUFFIXES
                 if (folder / f"{n}.{suffix}").exists()]
        found += [_UNDO] if (folder / _UNDO).exists() else []
        found += ["mark.slots"] if "slots" in meta["mark"] else []
        expected = "'disk' (a disk server's files and slot counts are there)"
    if found:
        raise DataError(f"{path}: field 'storage' is {meta['storage']!r}, but the folder holds "
                        f"{found[:4]}: expected {expected}; the file is damaged or was edited",
                        hint=_DAMAGED)
    if disk and meta["format"] == _FORMAT and set(meta["mark"].get("slots") or ()) != set(names):
        raise DataError(f"{path}: its mark lacks the slot counts of tables {sorted(names)}; "
                        "the file is damaged", hint=_DAMAGED)


def _check_mark(state: Any, path: Path, prefix: str, configs: Sequence[TableConfig]) -> None:
    """A commit's counters (``_server.json``'s ``mark`` or ``previous``, a snapshot's
    ``mark.json``) as :meth:`ParameterServer._mark_state` writes them (``slots``, when
    there, at most each table's rows)."""
    if not isinstance(state, dict):
        raise _bad_field(path, prefix.rstrip(".") or "mark", state, "an object (a commit's counters)")
    for field, required in (("version", True), ("last_export", True), ("vocabulary_delta", False)):
        value: Any = state.get(field, None if required else 0)
        if not (_is_int(value) and value >= 0):
            raise _bad_field(path, prefix + field, value, "an integer >= 0")
    names = {c.name: c for c in configs}
    steps = state.get("table_steps")
    if not isinstance(steps, dict) or set(steps) != set(names):
        raise _bad_field(path, prefix + "table_steps", steps,
                         f"an object of the steps of tables {sorted(names)}")
    for key in ("table_steps", "slots") if "slots" in state else ("table_steps",):
        value = state[key]
        if key == "slots" and (not isinstance(value, dict) or not set(value) <= set(names)):
            raise _bad_field(path, prefix + key, value, f"an object of the slot counts of tables "
                             f"{sorted(names)}")
        for name, n in value.items():
            if not (_is_int(n) and n >= 0 and (key != "slots" or n <= names[name].cardinality)):
                raise _bad_field(path, f"{prefix}{key}.{name}", n, "an integer >= 0"
                                 + (f" and <= {names[name].cardinality} (the table's rows)"
                                    if key == "slots" else ""))
    changes = state.get("changes")
    if changes is not None:  # absent in folders written before it was recorded
        if not isinstance(changes, dict) or not set(changes) <= set(names):
            raise _bad_field(path, prefix + "changes", changes,
                             f"an object of the commits of tables {sorted(names)}")
        for name, tag in changes.items():
            if not (_is_int(tag) and 0 <= tag <= state["version"]):
                raise _bad_field(path, f"{prefix}changes.{name}", tag,
                                 f"an integer from 0 to {state['version']} (the commit's version)")
    _check_resets(state.get("resets") or {}, path, prefix + "resets", configs)


def _check_resets(resets: Any, path: Path, field: str, configs: Sequence[TableConfig]) -> None:
    """Vocabulary resets as a mark or a rollback keeps them: ``{table: [ids]}``."""
    names = {c.name: c for c in configs}
    if not isinstance(resets, dict) or not set(resets) <= set(names):
        raise _bad_field(path, field, resets, f"an object of ids per table of {sorted(names)}")
    for name, ids in resets.items():
        rows = names[name].cardinality
        if not isinstance(ids, list) or not all(_is_int(i) and 0 <= i < rows for i in ids):
            raise _bad_field(path, f"{field}.{name}", ids, f"a list of ids from 0 to {rows - 1}")


def _check_rollback(meta: dict[str, Any], path: Path, configs: Sequence[TableConfig]) -> None:
    """``_server.json``'s ``rollback`` (absent or null unless a
    :meth:`ParameterServer.rollback_to` of the previous mark is under way), as
    :meth:`ParameterServer.rollback_to` writes it: a disk server's, going back to the
    version of ``previous`` (the rows not yet restored), or of ``mark`` once the
    folder is there (``previous`` null then; the resets to make again are left)."""
    intent = meta.get("rollback")
    if intent is None:
        return
    if meta["storage"] != "disk" or meta["format"] != _FORMAT:
        raise _bad_field(path, "rollback", intent, f"null (only a disk server of format "
                         f"{_FORMAT!r} records a rollback under way)")
    if not isinstance(intent, dict):
        raise _bad_field(path, "rollback", intent, "null or an object (a rollback under way)")
    previous = meta.get("previous")
    target, of = ((meta["mark"]["version"], "'mark' (the folder at the version rolled back to)")
                  if previous is None else (previous["version"], "'previous'"))
    if not _is_int(intent.get("to")) or intent["to"] != target:
        raise _bad_field(path, "rollback.to", intent.get("to"), f"{target}, the version of {of}")
    sequence: Any = intent.get("vocabulary_delta")
    if not (_is_int(sequence) and sequence >= 0):
        raise _bad_field(path, "rollback.vocabulary_delta", sequence, "an integer >= 0")
    _check_resets(intent.get("resets"), path, "rollback.resets", configs)


class _FolderLock:
    """An exclusive lock on a server folder while a process has it open.

    ``fcntl.flock`` on ``<folder>/_lock``: the kernel drops the lock when its
    holder exits (``kill -9`` included), so a stale lock of a dead process is
    simply taken; the file names the holder (host, pid, since when) for the error
    a second opener gets. Two objects of one process conflict too (each opens its
    own file description).
    """

    def __init__(self, folder: Path) -> None:
        path = folder / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace")
            os.close(fd)
            try:
                who = json.loads(holder)
                pid, host, since = int(who["pid"]), who["host"], float(who["since"])
            except (ValueError, KeyError, TypeError):
                raise DataError(f"parameter server {folder} is open in another process "
                                "(its lock file names none)") from None
            same = pid == os.getpid() and host == socket.gethostname()
            opened = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since))
            raise DataError(
                f"parameter server {folder} is open in "
                + ("this process (another ParameterServer object)" if same else
                   f"process {pid} on host {host}")
                + f" since {opened}; one process at a time may hold a server",
                hint="close it there first (ps.close()), or open a copy of the folder",
            ) from None
        except OSError:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.time()}).encode(), 0)
        self.fd: int | None = fd
        # an object dropped without close() (a failed test, a notebook cell) unlocks too
        self._finalizer = weakref.finalize(self, os.close, fd)

    def release(self) -> None:
        if self._finalizer.alive:
            self._finalizer()  # closing the descriptor releases the flock


class ParameterServer:
    """Embedding rows and their optimizer state, on disk or in host memory.

    Args:
        path: the server's folder (created; must not already hold a server, reopen
            one with :meth:`open`). ``storage="memory"`` keeps its snapshots there.
        table_configs: the tables (``TableConfig``, e.g. from
            ``table_configs_from_schema``); their ``feature_names`` map batch
            columns (and keyset columns) to tables.
        storage: ``"disk"`` (memory-mapped sparse files) or ``"memory"``.
        seed: with the table name, row and column, fixes every initial value.
        optimizer: ``"adagrad"`` (``torch.optim.Adagrad``'s sparse rule) or
            ``"adam"`` (``LazyAdam``'s rule, one step counter per table).
        lr, betas, eps: the optimizer's settings (``eps`` defaults to 1e-10 for
            adagrad, 1e-8 for adam, as in torch).
        init_scale: initial rows are uniform in ``[-init_scale, init_scale)``.
        release_bytes: release the memory maps after this many bytes of rows
            were touched (bounds the resident size of the process).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        table_configs: Iterable[TableConfig],
        storage: str = "disk",
        seed: int = 0,
        optimizer: str = "adagrad",
        lr: float = 0.01,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float | None = None,
        init_scale: float = 0.05,
        release_bytes: int = 256 << 20,
        _meta: dict[str, Any] | None = None,
    ) -> None:
        if storage not in STORAGES:
            raise ValueError(f"ParameterServer: storage must be one of {STORAGES}, got {storage!r}")
        if optimizer not in OPTIMIZERS:
            raise ValueError(
                f"ParameterServer: optimizer must be one of {OPTIMIZERS}, got {optimizer!r}"
            )
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"ParameterServer: lr must be a positive number, got {lr!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"ParameterServer: seed must be an int, got {seed!r}")
        configs = tuple(table_configs)
        for cfg in configs:
            if not isinstance(cfg, TableConfig):
                raise TypeError(
                    f"ParameterServer: table_configs must be TableConfig objects, got "
                    f"{type(cfg).__name__}"
                )
            if "/" in cfg.name or cfg.name.startswith(("_", ".")) or not cfg.name:
                raise ValueError(
                    f"ParameterServer: table name {cfg.name!r} cannot name a file (no '/', "
                    "not starting with '_' or '.')"
                )
        if not configs:
            raise ValueError("ParameterServer: no tables given")
        self.path = Path(path)
        self.configs = configs
        self.storage, self.seed, self.optimizer = storage, int(seed), optimizer
        self.lr, self.betas = float(lr), (float(betas[0]), float(betas[1]))
        self.eps = float(_DEFAULT_EPS[optimizer] if eps is None else eps)
        self.init_scale = float(init_scale)
        self.release_bytes = int(release_bytes)
        self._by_name = {cfg.name: cfg for cfg in configs}
        # a feature may be looked up in several tables (Wide&Deep: its deep table and
        # its 1-wide wide table); feature_to_table names the first of them
        self.feature_tables: dict[str, tuple[str, ...]] = {}
        for cfg in configs:
            for f in cfg.feature_names:
                self.feature_tables[f] = (*self.feature_tables.get(f, ()), cfg.name)
        self.feature_to_table = {f: tables[0] for f, tables in self.feature_tables.items()}
        self._n_state = 1 if optimizer == "adagrad" else 2
        self._touched = 0
        self._listeners: list[Any] = []
        self._reader: ThreadPoolExecutor | None = None  # reads ahead (read_ahead)
        self._ahead: dict[str, Any] = {}  # table -> (sorted ids, future of their records)
        # vocabulary resets are facts about the ids, not training: a rollback keeps
        # them (replays them). Those made since the last mark, and those the last
        # commit holds (kept in its mark state, so a reopened server has them too)
        self._pending_resets: dict[str, list[np.ndarray]] = {}
        self._commit_resets: dict[str, list[int]] = {}
        self._trained_since_mark = False  # an apply() since the last mark
        # a rollback_to the previous mark under way (written to _server.json before
        # the rows change; open() finishes it): {"to", "resets", "vocabulary_delta"}
        self._rollback: dict[str, Any] | None = None
        if _meta is None:
            if (self.path / _META).exists():
                raise DataError(
                    f"{self.path} already holds a parameter server; reopen it with "
                    f"ParameterServer.open({str(self.path)!r}) or use another folder"
                )
            self.path.mkdir(parents=True, exist_ok=True)
        self._lock = _FolderLock(self.path)
        if _meta is None:
            self.version = 0  # update counter: +1 per apply()
            self.table_steps = {cfg.name: 0 for cfg in configs}
            self.last_export = 0
            self.vocabulary_delta = 0  # the last vocabulary delta applied (its sequence)
            self.mark, self.previous_mark = 0, None
            self._previous_state: dict[str, Any] | None = None
            self._committed = self._mark_state()
        folder = self.path if storage == "disk" else None
        # the rows each table's file holds at the last mark (format 3; checked by open)
        slots = (_meta["mark"].get("slots") or {}) if _meta is not None and folder is not None \
            and _meta.get("format") == _FORMAT else {}
        self._tables = {}
        try:
            for cfg in configs:
                self._tables[cfg.name] = _Table(cfg, self._n_state, folder, int(slots.get(cfg.name, 0)))
            if _meta is None:
                self._write_meta()
            else:
                self._restore(_meta)
        except BaseException:
            for table in self._tables.values():
                table.close()
            self._lock.release()
            raise

    # -- persistence --------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        return {"format": _FORMAT, "storage": self.storage, "seed": self.seed,
                "optimizer": self.optimizer, "lr": self.lr, "betas": list(self.betas),
                "eps": self.eps, "init_scale": self.init_scale,
                "tables": [_config_dict(c) for c in self.configs]}

    def _mark_state(self) -> dict[str, Any]:
        state = {"version": self.version, "table_steps": dict(self.table_steps),
                 "last_export": self.last_export, "vocabulary_delta": self.vocabulary_delta,
                 "resets": {t: list(ids) for t, ids in self._commit_resets.items()}}
        if self.storage == "disk":  # slots given out per table (what a rollback keeps)
            tables = getattr(self, "_tables", None)
            state["slots"] = {c.name: tables[c.name].count if tables else 0 for c in self.configs}
            # the commit of each change log's last segment (see _Table.check_changes)
            state["changes"] = {c.name: tables[c.name].change_mark(self.version) if tables else 0
                                for c in self.configs}
        return state

    def _set_mark_state(self, state: dict[str, Any]) -> None:
        self.version = int(state["version"])
        self.table_steps = {k: int(v) for k, v in state["table_steps"].items()}
        self.last_export = int(state["last_export"])
        self.vocabulary_delta = int(state.get("vocabulary_delta", 0))  # absent before deltas
        resets = state.get("resets") or {}  # absent before resets were kept
        self._commit_resets = {str(t): [int(i) for i in ids] for t, ids in resets.items()}

    def _meta_dict(self) -> dict[str, Any]:
        meta = self._settings()
        meta["mark"] = self._committed
        meta["previous"] = self._previous_state
        if self._rollback is not None:  # the field is there only while one is under way
            meta["rollback"] = self._rollback
        return meta

    def _write_meta(self) -> None:
        write_json_file(self.path / _META, self._meta_dict())

    @classmethod
    def open(cls, path: str | os.PathLike[str], release_bytes: int = 256 << 20) -> ParameterServer:
        """Reopen the server in ``path`` as it was at its last :meth:`flush` (changes
        made after it, e.g. by a process that was killed, are rolled back). A folder
        no crash can leave (a damaged or edited file) is a :class:`DataError` naming
        the file, the field and the value."""
        meta_path = Path(path) / _META
        if not meta_path.exists():
            raise DataError(
                f"{path} holds no parameter server ({_META} is missing); create one with "
                "ParameterServer(path, table_configs, ...)"
            )
        try:
            meta = read_json_file(meta_path, "parameter server file")
            configs = [TableConfig(t["name"], int(t["cardinality"]), int(t["dim"]),
                                   tuple(t["feature_names"]), bool(t["is_list"]), t["combiner"],
                                   _list_features(t.get("list_features")))
                       for t in meta["tables"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise DataError(f"{meta_path} is not a readable parameter server file: {exc}") from exc
        if meta.get("format") not in (_FORMAT, _FORMAT_V2, _FORMAT_V1):
            raise DataError(
                f"{meta_path}: format {meta.get('format')!r}, expected {_FORMAT!r} (or "
                f"{_FORMAT_V2!r} or {_FORMAT_V1!r}, which open() upgrades in place)",
                hint="open it with the tabstream version that wrote it and export its rows "
                "(export_delta), or start a new server")
        _check_meta(meta, meta_path, configs)
        return cls(path, configs, storage=meta["storage"], seed=meta["seed"],
                   optimizer=meta["optimizer"], lr=meta["lr"], betas=tuple(meta["betas"]),
                   eps=meta["eps"], init_scale=meta["init_scale"], release_bytes=release_bytes,
                   _meta=meta)

    @classmethod
    def open_or_create(
        cls,
        path: str | os.PathLike[str],
        table_configs: Iterable[TableConfig],
        **settings: Any,
    ) -> ParameterServer:
        """The server in ``path``: reopened (as :meth:`open`) when the folder holds one,
        else created with ``table_configs`` and ``settings`` (those of the constructor).

        The one call a continuous-training script makes on every start, a restart
        after a crash included. A folder holding a server of other tables (names,
        sizes, features) or other settings is refused with the differences, never
        reused: its rows would answer for the wrong ids.

        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> tables = [TableConfig("C1", 100, 4, ("C1",))]
        >>> ps = ParameterServer.open_or_create(tmp.name + "/ps", tables, optimizer="adam")
        >>> _ = ps.apply("C1", [3], np.ones((1, 4), np.float32)); _ = ps.flush(); ps.close()
        >>> ps = ParameterServer.open_or_create(tmp.name + "/ps", tables, optimizer="adam")
        >>> ps.version, ps.touched("C1").tolist()
        (1, [3])
        >>> ps.close(); tmp.cleanup()
        """
        configs = tuple(table_configs)
        if not (Path(path) / _META).exists():
            return cls(path, configs, **settings)
        ps = cls.open(path, **({"release_bytes": settings["release_bytes"]}
                               if "release_bytes" in settings else {}))
        diffs = []
        # which features are lists describes the batches, not the rows: not compared,
        # and the given configs' say is kept (a folder of an older version has none)
        have = {c.name: _config_dict(c) | {"list_features": None} for c in ps.configs}
        asked = {c.name: _config_dict(c) | {"list_features": None} for c in configs}
        for name in sorted(set(have) | set(asked)):
            if have.get(name) != asked.get(name):
                diffs.append(f"table {name!r}: folder {have.get(name)}, given {asked.get(name)}")
        current = ps._settings()
        defaults = {"storage": "disk", "seed": 0, "optimizer": "adagrad", "lr": 0.01,
                    "betas": (0.9, 0.999), "init_scale": 0.05}
        for key, default in defaults.items():
            value = settings.get(key, default)
            value = [float(v) for v in value] if key == "betas" else value
            if value != current[key] and not (key == "lr" and float(value) == current[key]):
                diffs.append(f"{key}: folder {current[key]!r}, given {value!r}")
        if "eps" in settings and settings["eps"] is not None and float(settings["eps"]) != ps.eps:
            diffs.append(f"eps: folder {ps.eps!r}, given {settings['eps']!r}")
        if diffs:
            ps.close()
            raise DataError(
                f"{path} holds a parameter server of other tables or settings: "
                + "; ".join(diffs[:5]) + (f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""),
                hint="pass the tables and settings it was created with, or use another folder",
            )
        given = {c.name: c for c in configs}
        ps.configs = tuple(dataclasses.replace(c, list_features=given[c.name].list_features)
                           for c in ps.configs)
        ps._by_name = {c.name: c for c in ps.configs}
        return ps

    def _restore(self, meta: dict[str, Any]) -> None:
        mark = meta["mark"]
        self._set_mark_state(mark)
        self.mark = self.version
        self._committed = self._mark_state()
        self._previous_state = meta.get("previous")
        self.previous_mark = (int(self._previous_state["version"])
                              if self._previous_state else None)
        self._rollback = meta.get("rollback")  # checked by open (_check_rollback)
        fmt = meta.get("format")
        if self.storage == "disk":
            # the tables first: the meta file is rewritten below (format 3) only once
            # the folder is in that format
            if fmt == _FORMAT_V1:
                self._upgrade_v1()
            elif fmt == _FORMAT_V2:
                self._upgrade_v2()
            else:
                slots = mark["slots"]  # checked by open (_check_meta)
                changes = mark.get("changes") or {}  # absent before it was recorded
                # a rollback under way may have cut the logs at the previous mark, of
                # which a folder written before the field existed records nothing
                before = ((self._previous_state or {}).get("changes")
                          if self._rollback is not None else {})
                for name, table in self._tables.items():
                    table.open_slots(int(slots[name]))
                    table.check_changes(self.mark, None if before is None else changes.get(name),
                                        (before or {}).get(name))
                self._committed = self._mark_state()
                for cfg in self.configs:  # left by an upgrade killed after its meta file
                    for suffix in ("rows.f32", "weight.f32", "state.f32", "version.i64"):
                        (self.path / f"{cfg.name}.{suffix}").unlink(missing_ok=True)
        pending = meta.get("pending_export")
        if pending is not None:  # an export_delta that may have been cut short
            if Path(pending["dir"]).exists():
                self.last_export = int(pending["version"])
                self._committed = self._mark_state()
            self._write_meta()
        if self.storage == "disk":
            undo = self.path / _UNDO
            for log in sorted(undo.glob("from_*.log")) if undo.exists() else []:
                if int(log.stem.split("_")[1]) >= self.mark:  # written after the last mark
                    self._roll_back(log)
            for table in self._tables.values():
                _keep_segments(table.changes_path, self.mark)  # a flush that never committed
                table.sync()
            if self._rollback is not None:  # a rollback_to cut short: finished here
                self._finish_rollback()
        else:
            self._load_snapshot()
            if fmt != _FORMAT:
                self._write_meta()

    def _upgrade_v2(self) -> None:
        """Rewrite a server of format 2 (the record of row ``i`` at ``i * width`` in
        ``<table>.rows.f32``, a sparse file) in this format, in place.

        The rows of the change log up to the last mark (every row ever written) are
        copied, in id order, into slots; then the undo logs written after the mark
        put those rows back to their committed values (rows first written after the
        mark get no slot). The previous mark has no slot count: a rollback to it
        writes back the logged records, "never written" ones included. Nothing old
        is removed before the new meta file is written, so a process killed part-way
        upgrades again from the start on the next open."""
        for cfg in self.configs:
            t = self._tables[cfg.name]
            old_path = self.path / f"{cfg.name}.rows.f32"
            size = cfg.cardinality * t.record_bytes
            if not old_path.exists() or old_path.stat().st_size != size:
                raise DataError(
                    f"parameter server {self.path} (format {_FORMAT_V2!r}) lacks {old_path.name} "
                    f"or has it at another size (expected {size} bytes); it cannot be upgraded",
                    hint="restore the folder from a copy, or start a new server")
            _keep_segments(t.changes_path, self.mark)
            ids = t.changed(0)
            t.open_slots(0)  # an upgrade killed part-way starts over
            old = np.memmap(old_path, np.float32, "r", shape=(cfg.cardinality, t.width))
            block = 1 << 18
            for i in range(0, len(ids), block):
                part = ids[i:i + block]
                t.write(part, np.asarray(old[part]))
            del old
        undo = self.path / _UNDO
        names = [c.name for c in self.configs]
        for log in sorted(undo.glob("from_*.log")) if undo.exists() else []:
            if int(log.stem.split("_")[1]) >= self.mark:
                for index, ids, w, s, v in reversed(self._read_log(log)):
                    table = self._tables[names[index]]
                    table.restore(ids, table.record(w, s, v))
        self._commit_upgrade("rows.f32")

    def _commit_upgrade(self, *old_suffixes: str) -> None:
        """The tables rewritten by an upgrade: synced, the meta file written (the
        folder is in this format from then on), the old files removed."""
        for t in self._tables.values():
            t.dirty = []
            t.sync()
            t.kept = t.count
            t.last_change = None  # the upgrade wrote the change log: read it again
        self._committed = self._mark_state()
        self._write_meta()
        for cfg in self.configs:
            for suffix in old_suffixes:
                (self.path / f"{cfg.name}.{suffix}").unlink(missing_ok=True)

    def _upgrade_v1(self) -> None:
        """Rewrite a server of format 1 (``<table>.weight.f32``, ``.state.f32`` and
        ``.version.i64``: three reads per row) in this format, in place.

        The old files are brought to the last mark first (the undo logs after it),
        then every row ever written is copied to the records and the change log gets
        one segment per interval that export and rollback still tell apart. Nothing
        old is removed before the new meta file is written, so a process killed
        part-way upgrades again from the start on the next open."""
        names = [c.name for c in self.configs]
        legacy = {}
        for cfg in self.configs:
            t = self._tables[cfg.name]
            arrays = []
            for suffix, dtype, width in (("weight.f32", np.float32, cfg.dim),
                                         ("state.f32", np.float32, self._n_state * cfg.dim),
                                         ("version.i64", np.int64, 1)):
                path = self.path / f"{cfg.name}.{suffix}"
                if not path.exists() or path.stat().st_size != cfg.cardinality * width * np.dtype(dtype).itemsize:
                    raise DataError(
                        f"parameter server {self.path} (format {_FORMAT_V1!r}) lacks {path.name} "
                        "or has it at another size; it cannot be upgraded",
                        hint="restore the folder from a copy, or start a new server")
                arrays.append(np.memmap(path, dtype, "r+", shape=(cfg.cardinality, width)))
            legacy[cfg.name] = arrays
        undo = self.path / _UNDO
        logs = sorted(undo.glob("from_*.log")) if undo.exists() else []
        for log in logs:
            if int(log.stem.split("_")[1]) >= self.mark:
                for index, ids, w, s, v in reversed(self._read_log(log)):
                    weight, state, version = legacy[names[index]]
                    weight[ids], state[ids], version[ids, 0] = w, s, v
        bounds = sorted({b for b in (self.last_export, self.previous_mark, self.mark) if b})
        for cfg in self.configs:
            t = self._tables[cfg.name]
            weight, state, version = legacy[cfg.name]
            t.changes_path.unlink(missing_ok=True)
            versions = np.asarray(version[:, 0])
            ids = np.flatnonzero(versions).astype(np.int64)
            t.open_slots(0)  # an upgrade killed part-way starts over
            block = 1 << 20
            for i in range(0, len(ids), block):
                part = ids[i:i + block]
                t.write(part, t.record(weight[part], state[part], versions[part]))
            low = 0
            for b in bounds:
                seg = ids[(versions[ids] > low) & (versions[ids] <= b)]
                if len(seg):
                    _append_segment(t.changes_path, b, seg)
                low = b
            del weight, state, version, versions
        legacy.clear()
        self._commit_upgrade("weight.f32", "state.f32", "version.i64")

    # -- undo log (disk) ----------------------------------------------------

    def _log(self, index: int, ids: np.ndarray, w: np.ndarray, s: np.ndarray, v: np.ndarray) -> None:
        """Append the stored values ``w, s, v`` of rows ``ids`` (before an update)."""
        folder = self.path / _UNDO
        folder.mkdir(exist_ok=True)
        body = b"".join([
            np.int64(index).tobytes(), np.int64(len(ids)).tobytes(), ids.tobytes(),
            w.tobytes(), s.tobytes(), v.tobytes(),
        ])
        # a record counts only when its trailer (length) is there: a write cut short
        # by a crash is recognised and skipped (its rows were not overwritten yet)
        record = memoryview(_MAGIC + body + np.int64(len(body)).tobytes())
        fd = os.open(folder / f"from_{self.mark:012d}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o644)
        try:
            size = os.fstat(fd).st_size
            try:
                while record:
                    record = record[os.write(fd, record):]
            except OSError:
                # a record cut short (a full disk) would hide every later record
                # from the reader: the log goes back to its last whole record
                os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)

    def _read_log(self, log: Path) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        data = log.read_bytes()
        names = [c.name for c in self.configs]
        records, pos = [], 0
        while pos + 24 <= len(data):
            if data[pos:pos + 8] != _MAGIC:
                break
            index, n = np.frombuffer(data, np.int64, 2, pos + 8)
            table = self._tables[names[int(index)]]
            d, k = table.cfg.dim, table.n_state
            size = 16 + 8 * n + 4 * n * d + 4 * n * d * k + 8 * n
            end = pos + 8 + size
            if end + 8 > len(data) or int(np.frombuffer(data, np.int64, 1, end)[0]) != size:
                break  # the last record was cut short: its rows were not touched yet
            at = pos + 24
            ids = np.frombuffer(data, np.int64, n, at)
            at += 8 * n
            w = np.frombuffer(data, np.float32, n * d, at).reshape(n, d)
            at += 4 * n * d
            s = np.frombuffer(data, np.float32, n * d * k, at).reshape(n, d * k)
            at += 4 * n * d * k
            v = np.frombuffer(data, np.int64, n, at)
            records.append((int(index), ids, w, s, v))
            pos = end + 8
        return records

    def _roll_back(self, log: Path, keep: bool = False) -> None:
        """Put the rows ``log`` holds back to their logged values (synced), then
        delete it (``keep``: the caller does, once the mark it restores is written).

        Idempotent, whatever part of it ran before: each record holds the absolute
        values of its rows at the log's mark, and the records are applied newest
        first, so every row ends at its oldest (the mark's) value, as the only
        logged rows are those with a slot at that mark (which keep it)."""
        self._settle()
        names = [c.name for c in self.configs]
        for index, ids, w, s, v in reversed(self._read_log(log)):
            table = self._tables[names[index]]
            table.restore(ids, table.record(w, s, v))
        for table in self._tables.values():
            table.dirty = []  # the rows are back to values some commit holds
            table.sync()
        if not keep:
            log.unlink()

    def rollback_to(self, version: int) -> None:
        """Return to the last mark (``version == mark``) or the one before it
        (``version == previous_mark``, disk storage): used when a training
        checkpoint was written just before the server's last :meth:`flush` and the
        process died in between. Updates made after the last mark are undone first
        in either case (what :meth:`open` does after a crash). Going back to the
        previous mark is atomic: a process killed in it reopens (:meth:`open`) at
        the last mark or, once ``_server.json`` records the rollback, at the
        previous one with the rollback finished, never with rows of both."""
        if version != self.mark and (version != self.previous_mark or self._previous_state is None):
            raise DataError(
                f"parameter server {self.path} is at version {self.mark} (previous mark "
                f"{self.previous_mark}); it cannot go back to version {version}. Is this the "
                "server this checkpoint was trained with?"
            )
        if version != self.mark and self.storage == "memory":
            raise DataError(
                f"parameter server {self.path} keeps memory snapshots only of its last "
                f"flush (version {self.mark}); it cannot go back to version {version}"
            )
        # the vocabulary resets undone here are made again after it (with the last
        # delta's sequence): the ids were recycled whatever the training did
        replay = {t: list(parts) for t, parts in self._pending_resets.items()}
        if version != self.mark:
            for t, ids in self._commit_resets.items():
                replay.setdefault(t, []).append(np.asarray(ids, np.int64))
        sequence = self.vocabulary_delta
        if self.version != self.mark:
            self._discard_uncommitted()
        if version == self.mark:
            self._replay_resets(replay, sequence)
            return
        # decided here, before any row changes: from this write on, open() finishes
        # the rollback (a process killed before it reopens at the last mark)
        self._rollback = {"to": version, "vocabulary_delta": sequence,
                          "resets": {t: np.unique(np.concatenate(parts)).tolist()
                                     for t, parts in replay.items() if parts}}
        try:
            self._write_meta()
        except BaseException:
            self._rollback = None  # not decided: the folder is at the last mark
            raise
        self._finish_rollback()

    def _finish_rollback(self) -> None:
        """Carry out the rollback to the previous mark that ``_server.json`` records
        (``self._rollback``, written by :meth:`rollback_to` or found by :meth:`open`).

        In this order, each step safe to repeat after a kill: the undo log of the
        previous mark applied (the rows synced; see :meth:`_roll_back`), the slots
        given out after that mark forgotten and the change log cut at it (synced),
        ``_server.json`` written at that mark (still naming the resets to make
        again, if any), the log deleted, the resets made again and committed (the
        field dropped). Once ``_server.json`` is at the previous mark, a later log
        of that mark is undone by :meth:`open` as any uncommitted change."""
        intent = self._rollback
        assert intent is not None and self.storage == "disk"
        to = int(intent["to"])
        log = self.path / _UNDO / f"from_{to:012d}.log"
        resets = {str(t): [np.asarray(ids, np.int64)] for t, ids in intent["resets"].items()}
        sequence = int(intent["vocabulary_delta"])
        if self.mark != to:  # the rows may be at the last mark still, or partly restored
            assert self._previous_state is not None and self.previous_mark == to
            if log.exists():
                self._roll_back(log, keep=True)
            for table in self._tables.values():
                table.cut(self._previous_state.get("slots", {}).get(table.cfg.name))
                _keep_segments(table.changes_path, to)
                table.last_change = None  # read again from the log as cut
            self._set_mark_state(self._previous_state)
            self.mark, self.previous_mark, self._previous_state = self.version, None, None
            self._committed = self._mark_state()
            if not any(len(ids) for parts in resets.values() for ids in parts) \
                    and sequence == self.vocabulary_delta:
                self._rollback = None  # nothing left to do once the mark is written
            self._write_meta()
        if log.exists():  # the log of the mark now current: its rows hold those values
            log.unlink()
            sync_folder(log.parent)
        self._notify("reset")
        if self._rollback is not None:
            self._replay_resets(resets, sequence)  # its flush drops the field
        if self._rollback is not None:  # nothing to make again (an edited file)
            self._rollback = None
            self._write_meta()

    @property
    def trained_since_commit(self) -> bool:
        """True when :meth:`apply` ran since the last :meth:`flush` (vocabulary resets
        alone do not count: a rollback keeps them)."""
        return self._trained_since_mark

    def _replay_resets(self, resets: dict[str, list[np.ndarray]], sequence: int) -> None:
        """After a rollback: the vocabulary resets it undid made again, the last
        delta's sequence restored, and both committed."""
        if not resets and sequence == self.vocabulary_delta:
            return
        for table, parts in resets.items():
            ids = np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.int64)
            if len(ids):
                self._reset_rows(table, ids)
        self.vocabulary_delta = max(self.vocabulary_delta, sequence)
        self.flush()
        self._notify("reset")

    def _discard_uncommitted(self) -> None:
        """Undo the updates made after the last mark; the caches are told."""
        self._settle()
        self._pending_resets, self._trained_since_mark = {}, False
        if self.storage == "disk":
            log = self.path / _UNDO / f"from_{self.mark:012d}.log"
            if log.exists():
                self._roll_back(log)
            for table in self._tables.values():  # rows first written after the mark
                table.cut(self._committed["slots"][table.cfg.name])
                table.dirty = []
                # a segment of a flush that failed after writing it (not committed)
                _keep_segments(table.changes_path, self.mark)
                table.last_change = None
        else:
            for table in self._tables.values():
                newer = np.flatnonzero(table.version_array > self.mark)
                table.write(newer, np.zeros((len(newer), table.width), np.float32))
            self._load_snapshot()  # rows changed before the mark and after it again
        self._set_mark_state(self._committed)
        self._notify("reset")

    # -- memory snapshots ---------------------------------------------------

    def _write_snapshot(self) -> None:
        tmp = self.path / f".{_SNAPSHOT}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name, table in self._tables.items():
            ids = np.flatnonzero(table.version_array)
            w, s, v = table.split(table.read(ids))
            _save_synced(tmp / f"{name}.ids.npy", ids)
            _save_synced(tmp / f"{name}.weight.npy", w)
            _save_synced(tmp / f"{name}.state.npy", s)
            _save_synced(tmp / f"{name}.version.npy", v)
        write_json_file(tmp / "mark.json", self._mark_state())
        sync_folder(tmp)  # the files' names, before the folder is renamed into place
        final, old = self.path / _SNAPSHOT, self.path / f".{_SNAPSHOT}.old"
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        sync_folder(self.path)  # the renames
        shutil.rmtree(old, ignore_errors=True)

    def _load_snapshot(self) -> None:
        folder = self.path / _SNAPSHOT
        if not folder.exists() and (self.path / f".{_SNAPSHOT}.old").exists():
            folder = self.path / f".{_SNAPSHOT}.old"  # killed between the two renames
        if not folder.exists():
            return
        mark = read_json_file(folder / "mark.json", "parameter server snapshot mark")
        _check_mark(mark, folder / "mark.json", "", self.configs)
        last_export = self.last_export
        self._set_mark_state(mark)
        self.mark = self.version
        self.last_export = max(last_export, self.last_export)
        self._committed = self._mark_state()
        for name, table in self._tables.items():
            ids = np.load(folder / f"{name}.ids.npy", allow_pickle=False)
            records = table.record(np.load(folder / f"{name}.weight.npy", allow_pickle=False),
                                   np.load(folder / f"{name}.state.npy", allow_pickle=False),
                                   np.load(folder / f"{name}.version.npy", allow_pickle=False))
            table.write(ids, records)

    # -- reading and updating ------------------------------------------------

    def table(self, name: str) -> TableConfig:
        if name not in self._by_name:
            raise SchemaError(
                f"parameter server {self.path} has no table {name!r}; it has "
                f"{sorted(self._by_name)}"
            )
        return self._by_name[name]

    def _ids(self, name: str, ids: Any) -> np.ndarray:
        cfg = self.table(name)
        arr = np.asarray(ids)
        if arr.size == 0:  # [] reads as float64: no id, nothing to check
            return np.zeros(0, np.int64)
        if arr.dtype.kind not in "iu":
            raise TypeError(f"table {name!r}: ids must be integers, got dtype {arr.dtype}")
        arr = arr.reshape(-1).astype(np.int64, copy=False)
        if arr.size and (arr.min() < 0 or arr.max() >= cfg.cardinality):
            bad = int(arr[(arr < 0) | (arr >= cfg.cardinality)][0])
            raise ValueError(
                f"table {name!r}: id {bad} is out of range; the table has "
                f"{cfg.cardinality} rows (ids 0..{cfg.cardinality - 1})"
            )
        return arr

    def lookup(self, table: str, ids: Any) -> np.ndarray:
        """Rows ``ids`` of ``table``, ``(len(ids), dim)`` float32 (a copy)."""
        arr = self._ids(table, ids)
        t = self._tables[table]
        w, _, v = t.split(self._read(table, arr))
        rows = np.ascontiguousarray(w)
        fresh = v == 0
        if fresh.any():  # never written: their values are computed, not stored
            rows[fresh] = initial_rows(self.seed, table, arr[fresh], t.cfg.dim, self.init_scale)
        self._count(t, len(arr))
        return rows

    def _read(self, table: str, ids: np.ndarray) -> np.ndarray:
        """The records of rows ``ids`` (one gather: row, state and version together),
        those read ahead (:meth:`read_ahead`) taken from there (:meth:`lookup` only)."""
        t = self._tables[table]
        ahead = self._ahead.pop(table, None)
        if ahead is None or not len(ids):
            return t.read(ids)
        known, future, written = ahead
        records = future.result()
        at = np.minimum(np.searchsorted(known, ids), len(known) - 1)
        found = known[at] == ids
        if written:  # rows written while they were read: read them again
            found &= ~np.isin(ids, np.concatenate(written))
        if found.all():
            return records[at]
        out = np.empty((len(ids), t.width), np.float32)
        out[found] = records[at[found]]
        out[~found] = t.read(ids[~found])
        return out

    def read_ahead(self, table: str, ids: Any) -> None:
        """Start reading rows ``ids`` of ``table`` in a background thread, for the
        next :meth:`lookup` of the table, which takes them from
        there: a cache hands the next batch's misses here while the current step
        runs, so their page faults overlap its work.

        The rows read ahead are one-shot (the next read of the table uses and drops
        them) and never stale: the rows the table writes meanwhile (:meth:`apply`, a
        reset) are read again then (a write never waits for the reading: they touch
        other rows, or rows whose reading is dropped); a rollback, a commit and
        :meth:`close` wait for the reading and drop it."""
        arr = np.unique(self._ids(table, ids))
        self._settle(table)
        if not len(arr):
            return
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="tabstream-ps-read")
        t = self._tables[table]
        self._ahead[table] = (arr, self._reader.submit(t.read, arr), [])
        self._count(t, len(arr))

    def _settle(self, table: str | None = None) -> None:
        """Wait for the reads ahead of ``table`` (all tables: None) and drop them,
        before the rows change or the maps go."""
        for name in [table] if table is not None else list(self._ahead):
            ahead = self._ahead.pop(name, None) if name is not None else None
            if ahead is not None:
                ahead[1].exception()  # waits; a failed read is read again in the open

    def touched(self, table: str) -> np.ndarray:
        """Sorted ids of the rows of ``table`` that were ever updated."""
        self.table(table)
        return self._scan(table, 0)

    def _scan(self, table: str, after: int) -> np.ndarray:
        """Sorted ids of the rows of ``table`` changed after version ``after``.

        A disk table answers from its change log (the ids of each committed
        interval) and the ids written since the last commit: never from the
        records, whose reading would make the whole table resident."""
        t = self._tables[table]
        if not t.in_memory:
            committed = t.changed(after)
            if not t.dirty:
                return committed
            return np.union1d(committed, np.concatenate(t.dirty)).astype(np.int64)
        step = 1 << 22  # rows per block: 32 MB of versions
        found = []
        for i in range(0, t.cfg.cardinality, step):
            found.append(np.flatnonzero(t.version_array[i:i + step] > after) + i)
        return np.concatenate(found).astype(np.int64) if found else np.zeros(0, np.int64)

    def _count(self, t: _Table, n: int) -> None:
        if self.storage != "disk":
            return
        # a row read or written maps whole pages of its file: with ids spread over
        # the table that is a page per row, whatever the row's size
        self._touched += n * max(mmap.PAGESIZE, t.width * 4)
        if self._touched >= self.release_bytes:
            for table in self._tables.values():
                table.release()
            self._touched = 0

    def apply(self, table: str, ids: Any, grads: Any) -> np.ndarray:
        """One optimizer step of ``table`` on rows ``ids`` with gradients ``grads``
        (``(len(ids), dim)``; duplicate ids are summed first). Returns the new rows
        of ``np.unique(ids)``, in that (sorted) order."""
        arr = self._ids(table, ids)
        t = self._tables[table]
        g = np.asarray(grads, dtype=np.float32)
        # no ids (a batch without ids of this table): still one step of the table
        g = g.reshape(len(arr), -1) if len(arr) else g.reshape(0, t.cfg.dim)
        if g.shape[1] != t.cfg.dim:
            raise ValueError(
                f"table {table!r}: gradients have {g.shape[1]} columns, the table's dim is "
                f"{t.cfg.dim}"
            )
        uniq, inverse = np.unique(arr, return_inverse=True)
        if len(uniq) != len(arr):
            summed = np.zeros((len(uniq), g.shape[1]), np.float32)
            np.add.at(summed, inverse, g)
            g = summed
        else:
            g = g[np.argsort(arr, kind="stable")]
        stored_w, stored_s, stored_v = t.split(t.read(uniq))
        fresh = stored_v == 0
        w = stored_w.copy()
        s = stored_s.copy()
        if fresh.any():
            w[fresh] = initial_rows(self.seed, table, uniq[fresh], t.cfg.dim, self.init_scale)
        self._count(t, len(uniq))
        step = self.table_steps[table] + 1
        d = t.cfg.dim
        if self.optimizer == "adagrad":
            s += g * g
            w -= self.lr * (g / (np.sqrt(s) + np.float32(self.eps)))
        else:
            b1, b2 = self.betas
            m, v = s[:, :d], s[:, d:]
            m += (g - m) * np.float32(1.0 - b1)  # m.lerp_(g, 1 - b1)
            v *= np.float32(b2)
            v += np.float32(1.0 - b2) * g * g
            denom = np.sqrt(v) / np.float32(math.sqrt(1.0 - b2**step)) + np.float32(self.eps)
            w -= np.float32(self.lr / (1.0 - b1**step)) * (m / denom)
        self._store(table, uniq, t.record(w, s, self.version + 1), stored_w, stored_s, stored_v,
                    "could not write table {table!r} ({error}); this update was not applied "
                    "and the server is as it was before it",
                    "free space on that disk, or move the server (its path) to a disk "
                    "with room; storage='memory' keeps the rows in memory instead")
        self.table_steps[table] = step
        self.version += 1
        self._trained_since_mark = True
        return w

    def apply_vocabulary_delta(self, delta: Any) -> dict[str, int]:
        """Reset the rows of the ids a vocabulary delta recycled (see
        :func:`vocabulary_resets` for what ``delta`` may be), and their optimizer
        state, to their initial values, before the new values train on them. Returns
        ``{table: rows reset}``.

        A reset is an update like :meth:`apply`'s: logged for crash safety, committed
        by the next :meth:`flush`, and its rows are in the next :meth:`export_delta`
        (serving sees the reset). The attached caches drop their rows. The server
        records the sequence of the last ``VocabularyDelta`` it applied (committed with
        the marks): applying one again does nothing, so a restarted job may apply
        the workflow's whole chain (``for d in wf.vocabulary_deltas``); one that
        skips a delta is refused.

        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ps = ParameterServer(tmp.name + "/ps", [TableConfig("C1", 10, 2, ("C1",))], seed=0)
        >>> _ = ps.apply("C1", [4], np.ones((1, 2), np.float32))
        >>> ps.apply_vocabulary_delta({"C1": [4]})     # id 4 now stands for a new value
        {'C1': 1}
        >>> bool((ps.lookup("C1", [4]) == initial_rows(0, "C1", np.array([4]), 2, 0.05)).all())
        True
        >>> ps.close(); tmp.cleanup()
        """
        from tabstream.pipeline.vocabulary_delta import VocabularyDelta

        if isinstance(delta, (str, os.PathLike)):
            delta = VocabularyDelta.read(os.fspath(delta))
        sequence = delta.sequence if isinstance(delta, VocabularyDelta) else None
        if sequence is not None:
            if sequence <= self.vocabulary_delta:
                return {}  # applied already (a restarted job applies the chain again)
            if sequence != self.vocabulary_delta + 1:
                raise DataError(
                    f"parameter server {self.path}: vocabulary delta update_{sequence:05d} follows "
                    f"update_{sequence - 1:05d}, but the last delta this server applied is "
                    f"update_{self.vocabulary_delta:05d}; apply the deltas in order",
                    hint="for delta in workflow.vocabulary_deltas: ps.apply_vocabulary_delta(delta)")
        resets = vocabulary_resets(delta, {c.name: c.feature_names for c in self.configs})
        out = {}
        for table, ids in resets.items():
            self._reset_rows(table, self._ids(table, ids))
            out[table] = len(ids)
        if sequence is not None:
            self.vocabulary_delta = int(sequence)
        if out:
            self._notify("reset")  # the caches hold the rows' old values
        return out

    def _store(self, table: str, ids: np.ndarray, records: np.ndarray, stored_w: np.ndarray,
               stored_s: np.ndarray, stored_v: np.ndarray, what: str, hint: str) -> None:
        """Log the stored values of rows ``ids`` (disk), then write ``records``. A
        failed write (a full disk) is a DataError and leaves the rows as they were."""
        t = self._tables[table]
        if table in self._ahead:
            self._ahead[table][2].append(ids)  # read again when the reading ahead is used
        try:
            if self.storage == "disk":
                slots = t.slots(ids)
                t.prepare(int((slots < 0).sum()))  # blocks first: a full disk fails here
                # rows first written after the mark are undone by cutting their slots;
                # the others' committed values are logged before they are overwritten
                logged = (slots >= 0) & (slots < t.kept)
                if logged.any():
                    self._log([c.name for c in self.configs].index(table), ids[logged],
                              stored_w[logged], stored_s[logged], stored_v[logged])
                t.write(ids, records, slots)
            else:
                t.write(ids, records)
        except OSError as exc:
            raise DataError(f"parameter server {self.path}: "
                            + what.format(table=table, error=exc.strerror or exc),
                            hint=hint) from exc

    def _reset_rows(self, table: str, ids: np.ndarray) -> None:
        """Rows ``ids`` (sorted, distinct) and their optimizer state back to their
        initial values, as an update (logged, then versioned)."""
        t = self._tables[table]
        stored_w, stored_s, stored_v = t.split(t.read(ids))
        self._count(t, len(ids))
        initial = initial_rows(self.seed, table, ids, t.cfg.dim, self.init_scale)
        self._store(table, ids, t.record(initial, 0, self.version + 1), stored_w, stored_s,
                    stored_v, "could not reset rows of table {table!r} ({error}); the server is "
                    "as it was before", "free space on that disk, or move the server to a disk "
                    "with room")
        self.version += 1
        self._pending_resets.setdefault(table, []).append(np.array(ids, np.int64))

    def optimizer_state(self, table: str, ids: Any) -> np.ndarray:
        """The optimizer state of rows ``ids``: ``(n, dim)`` sums of squares (adagrad)
        or ``(n, 2 * dim)`` first then second moments (adam); zeros when untouched."""
        arr = self._ids(table, ids)
        t = self._tables[table]
        return np.ascontiguousarray(t.split(t.read(arr))[1])

    # -- staging --------------------------------------------------------------

    def prefetch(self, keysets: Any) -> dict[str, int]:
        """Stage the rows of the keysets of a file list before training on it.

        ``keysets``: an export folder written with ``write_keysets=True`` (all its
        ``_keysets/*.parquet``), one or several keyset files or folders, or a
        mapping ``{column_or_table: ids}``. The rows are read in id order (so the
        operating system brings their pages in ahead of training) and offered to
        every attached ``CachedEmbeddings``, which keeps as many as fit in its cache.
        Returns ``{table: number of distinct ids}``.
        """
        per_table: dict[str, list[np.ndarray]] = {}
        for column, ids in _read_keysets(keysets):
            tables = self.feature_tables.get(column, (column,) if column in self._by_name else ())
            for table in tables:  # none: a categorical column this server has no table for
                per_table.setdefault(table, []).append(self._ids(table, ids))
        staged = {}
        for table, parts in per_table.items():
            uniq = np.unique(np.concatenate(parts))
            rows = self.lookup(table, uniq)
            self._notify("stage", table, uniq, rows)
            staged[table] = len(uniq)
        return staged

    def attach(self, listener: Any) -> None:
        """Register ``listener(event, *args)`` (a cache) for staged rows and resets.
        A bound method is held weakly: attaching does not keep its cache alive."""
        ref = weakref.WeakMethod(listener) if inspect.ismethod(listener) else (lambda: listener)
        self._listeners.append(ref)

    def _notify(self, event: str, *args: Any) -> None:
        alive = []
        for ref in self._listeners:
            listener = ref()
            if listener is not None:
                listener(event, *args)
                alive.append(ref)
        self._listeners = alive

    # -- commit and export ---------------------------------------------------

    def flush(self) -> int:
        """Commit: make the current rows what :meth:`open` returns after a crash.
        Returns the version committed."""
        self._settle()
        kept = (self.mark, self.previous_mark, self._previous_state, self._committed,
                self._commit_resets, self._pending_resets, self._trained_since_mark,
                self._rollback)
        try:
            if self.version != self.mark:  # this commit's resets, kept with its mark
                self._commit_resets = {t: np.unique(np.concatenate(parts)).tolist()
                                       for t, parts in self._pending_resets.items()}
                self._pending_resets, self._trained_since_mark = {}, False
            if self.storage == "disk":
                for table in self._tables.values():
                    table.sync()
                    table.commit_changes(self.version)
            else:
                self._write_snapshot()
            stale = None
            if self.version != self.mark:
                # the log of [old mark, now) is kept for rollback_to(old mark); the one
                # before it is no longer needed (nor its resets: only a rollback past
                # the last mark replays them)
                stale = self.previous_mark
                self._previous_state = {k: v for k, v in self._committed.items() if k != "resets"}
                self.previous_mark = self.mark
            self.mark = self.version
            self._committed = self._mark_state()
            self._rollback = None  # a rollback's resets made again: it is done
            self._write_meta()
            for table in self._tables.values():
                table.kept = table.count
        except OSError as exc:
            # not committed: the last mark stays what open() returns (a change-log
            # segment written here counts only once a mark covers it)
            (self.mark, self.previous_mark, self._previous_state, self._committed,
             self._commit_resets, self._pending_resets, self._trained_since_mark,
             self._rollback) = kept
            raise DataError(
                f"parameter server {self.path}: could not commit version {self.version} "
                f"({exc.strerror or exc}); the last commit is still version {self.mark}",
                hint="free space on that disk and call flush() again",
            ) from exc
        if self.storage == "disk" and stale is not None:
            log = self.path / _UNDO / f"from_{stale:012d}.log"
            if log.exists():
                log.unlink()
        return self.version

    def export_delta(self, directory: str | os.PathLike[str]) -> dict[str, int]:
        """Write the rows updated since the previous export, per table, to
        ``directory/<table>/part_00000.parquet`` (columns ``key`` int64, ``value``
        list<float32>), plus ``directory/_delta.json``. The folder is written under a
        temporary name, forced to the disk and renamed: it is complete or absent, after
        a kill -9 or a power loss alike. Commits first
        (:meth:`flush`). Returns ``{table: rows written}``."""
        out = Path(directory)
        if out.exists():
            raise DataError(
                f"export_delta: {out} already exists; each export goes to a new folder"
            )
        self.flush()
        tmp = out.with_name(f".{out.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        counts = {}
        try:
            tmp.mkdir(parents=True)
            for cfg in self.configs:
                counts[cfg.name] = self._export_table(cfg, tmp / cfg.name)
            write_json_file(tmp / "_delta.json", {"from_version": self.last_export,
                                             "to_version": self.version, "rows": counts})
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise DataError(
                f"export_delta: could not write {out} ({exc.strerror or exc}); nothing was "
                "exported and the rows stay pending for the next export",
                hint="free space there or pass another directory to export_delta",
            ) from exc
        # Recorded before the rename: if the process dies right after it, open()
        # sees the folder and counts the export as done (no row is exported twice).
        meta = self._meta_dict()
        meta["pending_export"] = {"dir": str(out.resolve()), "version": self.version}
        write_json_file(self.path / _META, meta)
        os.replace(tmp, out)
        # on the disk before the meta says the export is done: after a power loss the
        # rows are exported again rather than counted done in a folder that is not there
        sync_folder(out.parent)
        self.last_export = self.version
        self._committed = self._mark_state()
        self._write_meta()
        if self.storage == "disk":
            # the segments no later export can ask for again merge into one
            upto = (self._previous_state or self._committed)["last_export"]
            for table in self._tables.values():
                _compact_segments(table.changes_path, int(upto))
        if self.storage == "memory":
            self._write_snapshot()
        return counts

    def _export_table(self, cfg: TableConfig, folder: Path) -> int:
        """One table's changed rows into ``folder/part_00000.parquet``, in blocks of
        ids (a whole table's rows are never held at once). Returns the row count."""
        ids = self._scan(cfg.name, self.last_export)
        folder.mkdir()
        schema = pa.schema([("key", pa.int64()), ("value", pa.list_(pa.float32()))])
        block = max(1, (64 << 20) // (4 * cfg.dim))  # 64 MB of rows at a time
        with open(folder / "part_00000.parquet", "wb") as f:
            with pq.ParquetWriter(f, schema) as writer:
                for i in range(0, max(len(ids), 1), block):
                    part = ids[i:i + block]
                    rows = self.lookup(cfg.name, part)
                    values = pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), cfg.dim)
                    writer.write_table(pa.table({"key": pa.array(part, pa.int64()),
                                                 "value": values.cast(pa.list_(pa.float32()))},
                                                schema=schema))
            # forced to the disk, as the snapshot's files are (_save_synced): the folder
            # is renamed into place and counted done only once it would survive a
            # power loss whole
            f.flush()
            os.fsync(f.fileno())
        sync_folder(folder)
        return len(ids)

    def close(self) -> None:
        """Release the maps and the folder's lock (another process may open it then)."""
        self._settle()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
            self._reader = None
        for table in self._tables.values():
            table.close()
        self._lock.release()

    def __repr__(self) -> str:
        return (f"ParameterServer({str(self.path)!r}, {len(self.configs)} tables, "
                f"storage={self.storage!r}, optimizer={self.optimizer!r}, version={self.version})")


def _read_keysets(keysets: Any) -> Iterable[tuple[str, np.ndarray]]:
    if isinstance(keysets, Mapping):
        for column, ids in keysets.items():
            yield str(column), np.asarray(ids)
        return
    items: Sequence[Any] = [keysets] if isinstance(keysets, (str, os.PathLike)) else list(keysets)
    for item in items:
        p = Path(item)
        if p.is_dir():
            files = sorted((p / "_keysets").glob("*.parquet")) or sorted(p.glob("*.parquet"))
            if not files:
                raise DataError(
                    f"prefetch: {p} holds no keyset files (_keysets/*.parquet); export it "
                    "with to_parquet(..., write_keysets=True)"
                )
        elif p.exists():
            files = [p]
        else:
            raise FileNotFoundError(f"prefetch: keyset file or folder {p} does not exist")
        for f in files:
            try:
                table = pq.read_table(f, columns=["column", "id"])
            except Exception as exc:
                raise DataError(
                    f"prefetch: {f} is not a keyset file (parquet with columns 'column' and "
                    f"'id'): {exc}"
                ) from exc
            columns = table.column("column").to_numpy(zero_copy_only=False)
            ids = table.column("id").to_numpy()
            for name in np.unique(columns):
                yield str(name), ids[columns == name]

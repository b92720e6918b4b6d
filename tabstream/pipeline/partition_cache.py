"""The partition cache of a Dataset (``cache="disk"``, or ``"auto"``: raw CSV/TSV
always, parquet for the partitions a Workflow's fit reads) and its limits: a
budget in memory terms for parquet (:data:`PARQUET_CACHE_MAX_BYTES`) and a reserve
of free disk (:data:`CACHE_MIN_FREE_BYTES`, :data:`CACHE_MAX_FREE_BYTES`). A cache
folder left by a killed process is removed by the next process that makes one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import fsspec
import pyarrow as pa

from tabstream.core.errors import CacheWarning

__all__ = ["CACHE_MAX_FREE_BYTES", "CACHE_MIN_FREE_BYTES", "PARQUET_CACHE_MAX_BYTES", "PartitionCache"]

# Held while a Dataset makes its cache folder (module level: a Dataset is pickled).
_CACHE_DIR_LOCK = threading.Lock()


class PartitionCache:
    """A Dataset's partitions as read, kept in uncompressed Arrow IPC files in a folder
    of its own (made on first use in ``parent``, the user's ``cache_dir``, or the
    temporary folder; removed with this object), so that the second pass over the
    data (fit, then export) memory-maps them instead of parsing again. Never
    ``parent`` itself: its files are named by partition only, so two Datasets given
    one ``cache_dir`` (or one run after another) read each other's partitions. With
    ``auto`` (``cache="auto"``) a partition the budget or the disk cannot hold is
    simply read again when next needed, with one :class:`CacheWarning`."""

    def __init__(self, parent: str | None, auto: bool) -> None:
        self.parent = parent
        self.folder: str | None = None
        self.auto = auto
        self.owner_pid = os.getpid()  # "auto" caches in this process only
        self.kept_bytes = 0  # parquet partitions kept by "auto" (see PARQUET_CACHE_MAX_BYTES)
        self.warned = False  # "auto" said once that it keeps no more partitions
        self.budget: int | None = None  # their budget in bytes, set when the first is read

    def read(self, read_raw: Callable[..., pa.Table], index: int, piece: Any,
             columns: Sequence[str] | None, dictionary: Sequence[str], *, whole: bool,
             names: list[str], parquet: bool, npartitions: int, write: bool = True) -> pa.Table:
        """Partition ``index`` (``piece``, read by ``read_raw(piece, columns, dictionary)``
        when not kept) from the cache, kept there first when ``write``.

        ``whole``: the partition is read whole whatever ``columns`` asks for (a parsed
        CSV block), kept whole and selected from. ``names``: the Dataset's columns;
        ``parquet`` and ``npartitions`` size the budget of "auto" (see :meth:`may_keep`)."""
        wanted = None if whole else columns
        try:
            if self.folder is None:
                if not write:
                    return read_raw(piece, columns, dictionary)
                with _CACHE_DIR_LOCK:  # the first partitions are read side by side
                    if self.folder is None:
                        self.folder = _new_cache_dir(self.parent)
                        weakref.finalize(self, shutil.rmtree, self.folder, True)
        except OSError as exc:
            if not self.auto:
                raise
            self.warn_off(f"the cache folder {self.parent} cannot be used ({exc})" if self.parent
                          else f"the cache's temporary folder cannot be made ({exc})")
            return read_raw(piece, columns, dictionary)
        names = list(wanted) if wanted is not None else names
        if dictionary:
            names = [*names, "\x00dictionary", *dictionary]
        key = hashlib.sha1("\x1f".join(names).encode()).hexdigest()[:12]
        path = os.path.join(self.folder, f"piece{index:06d}-{key}.arrow")
        if os.path.exists(path):
            with pa.memory_map(path) as source:
                table = pa.ipc.open_stream(source).read_all()
        elif not write:
            return read_raw(piece, columns, dictionary)
        else:
            table = read_raw(piece, wanted, dictionary)
            if self.auto and not self.may_keep(table.nbytes, parquet, npartitions):
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
                if not self.auto:
                    raise
                self.warn_off(f"the cache in {self.folder} could not keep a "
                              f"partition ({exc})")
        return table.select(list(columns)) if whole and columns is not None else table

    def warn_off(self, why: str | Callable[[], str]) -> None:
        """A :class:`CacheWarning`, once per Dataset: "auto" keeps no more partitions,
        because of ``why`` (a callable is called only for the first)."""
        with _CACHE_DIR_LOCK:  # partitions are read side by side
            if self.warned:
                return
            self.warned = True
        reason = why() if callable(why) else why
        warnings.warn(f"{reason}: the Dataset reads partitions again when next needed instead "
                      "of keeping them (raw CSV/TSV is parsed again)", CacheWarning, stacklevel=4)

    def may_keep(self, nbytes: int, parquet: bool, npartitions: int) -> bool:
        """Whether "auto" keeps a partition of ``nbytes``: for parquet, the partitions
        kept stay within ``PARQUET_CACHE_MAX_BYTES``; the disk keeps a reserve (the
        budget is decided first: a partition it refuses says nothing about the disk)."""
        if parquet:
            with _CACHE_DIR_LOCK:
                if self.budget is None:  # once per Dataset: every partition the same
                    self.budget = _parquet_cache_budget(self.folder)
                budget = self.budget
                if not self.kept_bytes and nbytes * npartitions > budget:
                    # all or nothing: when the first partition says the fit's reads
                    # would not all fit, keep none (at 16M rows, keeping the first
                    # 1 GiB cost the fit 4.4 s and saved the export nothing)
                    self.kept_bytes = budget + 1
                if self.kept_bytes + nbytes > budget:
                    return False
                self.kept_bytes += nbytes
        usage = _disk_usage(self.folder)
        if usage is None or usage.free - nbytes < _disk_reserve(usage.total):
            if parquet:
                with _CACHE_DIR_LOCK:
                    self.kept_bytes -= nbytes
            self.warn_off(lambda: _no_room(self.folder, usage))
            return False
        return True


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


_CACHE_PREFIX = "tabstream-cache-"


# the parent folders whose leftovers this process has removed (see _new_cache_dir)
_cache_leftovers_checked: set[str] = set()


def _new_cache_dir(parent: str | None = None) -> str:
    """A folder for a Dataset's partition cache in ``parent`` (default: the temporary
    folder), named with its owner (``tabstream-cache-<host>-<pid>-s<start>-<random>``).
    The folder is removed with its Dataset, but a process killed (``kill -9``, out of
    memory) leaves it: the first cache folder a process makes in a parent removes the
    leftovers of dead owners there (and unnamed ones older than a day, from older
    versions). A ``parent`` that does not exist is an OSError (not made)."""
    from tabstream.core.scratch import owner_pattern, owner_tag, remove_leftovers

    parent = parent or tempfile.gettempdir()
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"no such folder: {parent}")
    if parent not in _cache_leftovers_checked:
        _cache_leftovers_checked.add(parent)
        remove_leftovers(fsspec.filesystem("file"), parent,
                         owner_pattern(re.escape(_CACHE_PREFIX), r"[A-Za-z0-9_]+"))
    return tempfile.mkdtemp(prefix=f"{_CACHE_PREFIX}{owner_tag()}-", dir=parent)

"""The threads that run a process's local tasks.

One set per process (per worker count) for the passes started from its main thread:
the fit's dask tasks, the export's, Categorify's merges of spilled buckets. Arrow's
allocator keeps freed memory per thread, so every fresh pool held memory of its own
beside what the earlier ones kept (benchmarks/RESULTS.md, session 13). Work started
many times over from another thread (the loader's column copies) runs on a pool kept
for that use (:func:`kept_pool`). Importing this module does not import dask (the
loaders use it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import functools
import math
import os
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

__all__ = ["TaskGroup", "kept_pool", "local_workers", "map_shared", "release_freed_memory", "shared_pool",
           "usable_cpus"]


def local_workers() -> int:
    """Threads that run local tasks side by side: dask's ``num_workers`` setting, or
    the CPUs the process may use (:func:`usable_cpus`: CPU affinity and a container's
    CPU quota, as dask's threaded scheduler counts them; ``os.cpu_count()`` is the
    machine's)."""
    import dask.config  # here: the loaders use this module without dask

    configured = dask.config.get("num_workers", None)
    return int(configured or usable_cpus())


def usable_cpus(cgroup_root: str = "/sys/fs/cgroup", proc_cgroup: str = "/proc/self/cgroup") -> int:
    """The CPUs this process may keep busy: the CPUs of its affinity mask, fewer where a
    cgroup CPU quota (a container's CPU limit) allows less, rounded up, as dask counts
    them for its scheduler (read here without importing dask: the loaders use it).
    A container limited to 2 CPUs on a 64-core host sees 64 CPUs in its affinity mask.

    The quota is cgroup v2's ``cpu.max`` of the process's group and of each group above
    it (the smallest counts), else cgroup v1's ``cpu.cfs_quota_us`` over
    ``cpu.cfs_period_us``. A file that is absent, unreadable or not understood sets no
    limit."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cpu_quota(cgroup_root, proc_cgroup)
    return max(1, min(cpus, cpus if quota is None else quota))


@functools.lru_cache(maxsize=8)
def _cpu_quota(root: str, proc_cgroup: str) -> int | None:
    """The CPUs a cgroup quota allows (rounded up), or None: read once per process
    (the files cost about 0.17 ms a call, and every pass asks for the thread count
    several times), as dask reads its count once."""
    quotas = [q for q in (_cgroup2_quota(root, proc_cgroup), _cgroup1_quota(root)) if q is not None]
    return math.ceil(min(quotas)) if quotas else None


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:  # absent or unreadable: no limit from this file
        return None


def _cgroup2_quota(root: str, proc_cgroup: str) -> float | None:
    """The smallest ``quota / period`` in ``cpu.max`` along the process's cgroup v2 path
    (``0::/path`` in ``proc_cgroup``), or None."""
    text = _read_text(proc_cgroup)
    if text is None:
        return None
    paths = [line[3:] for line in text.splitlines() if line.startswith("0::")]
    if not paths:
        return None
    parts = [p for p in paths[0].strip().split("/") if p]
    limits = []
    for depth in range(len(parts), -1, -1):  # the process's group, then each one above
        fields = (_read_text(os.path.join(root, *parts[:depth], "cpu.max")) or "").split()
        if len(fields) == 2 and fields[0] != "max" and fields[0].isdigit() and fields[1].isdigit() \
                and int(fields[1]) > 0:
            limits.append(int(fields[0]) / int(fields[1]))
    return min(limits) if limits else None


def _cgroup1_quota(root: str) -> float | None:
    """cgroup v1's ``cpu.cfs_quota_us / cpu.cfs_period_us`` (the controller's folder
    under ``root`` is named ``cpu``, ``cpu,cpuacct`` or ``cpuacct,cpu``), or None
    (a quota of -1: no limit)."""
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        quota = (_read_text(os.path.join(root, name, "cpu.cfs_quota_us")) or "").strip()
        period = (_read_text(os.path.join(root, name, "cpu.cfs_period_us")) or "").strip()
        if quota.isdigit() and period.isdigit() and int(quota) > 0 and int(period) > 0:
            return int(quota) / int(period)
    return None


_POOLS: dict[int, ThreadPoolExecutor] = {}
_KEPT: dict[str, ThreadPoolExecutor] = {}  # kept_pool's, by use
_POOLS_LOCK = threading.Lock()


def _forget_pools() -> None:
    """In a child made by ``fork``: the parent's pools have no threads here (an
    executor that believes its idle threads exist starts none, and its tasks never
    run), so the child makes its own."""
    global _POOLS_LOCK
    _POOLS.clear()
    _KEPT.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)


def shared_pool() -> Executor | None:
    """The threads that run this process's local tasks started from its main thread
    (fits, exports, Categorify's merges), one pool per :func:`local_workers` count;
    None elsewhere (a task that computes more inside a pool thread, or a pool set in
    dask's config): then dask picks, as before.

    One set of threads rather than a new pool per pass: Arrow's allocator keeps freed
    memory in the heap of the thread that used it, so an export on fresh threads
    (its own pool, as before) held the fit's freed pages and its own: 10M Criteo
    rows peaked at 800-804 MB against 707-722 MB on the fit's threads, and 16M rows,
    whose Categorify merges had a pool per column too, 714-718 against 634-646 MB."""
    import dask.config

    if threading.current_thread() is not threading.main_thread() or dask.config.get("pool", None):
        return None
    workers = local_workers()
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="tabstream")
    return pool


def kept_pool(use: str, workers: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads kept for ``use`` for the life of the process
    (remade in a forked child), for work started off the main thread many times over,
    where :func:`shared_pool` has none: a pool made and shut down per call cost
    about 0.5 ms more (40 small tasks on 2 threads, from a thread of its own: 1.64
    against 1.13 ms a call)."""
    with _POOLS_LOCK:
        pool = _KEPT.get(use)
        if pool is None or pool._max_workers != workers:
            if pool is not None:  # its threads end once idle, its running work done
                pool.shutdown(wait=False)
            pool = _KEPT[use] = ThreadPoolExecutor(workers, thread_name_prefix=f"tabstream-{use}")
        return pool


def release_freed_memory() -> None:
    """Hand the pages Arrow's allocator keeps for freed memory back to the system, in
    the calling thread and in every thread of the shared pools: each thread's heap
    keeps its own, and a call from the main thread alone left the pool threads'. After
    the 2M-row Criteo fit: 261 MB anonymous RSS once the main thread had released,
    211 MB once the two pool threads had too (benchmarks/RESULTS.md, session 20).
    A pool thread busy elsewhere (not at a pass's end) keeps its pages."""
    import pyarrow as pa

    pool = pa.default_memory_pool()
    pool.release_unused()
    with _POOLS_LOCK:
        pools = list(_POOLS.items())
    for workers, executor in pools:
        barrier = threading.Barrier(workers)  # one call on each of the pool's threads

        def release(barrier: threading.Barrier = barrier) -> None:
            # a thread busy elsewhere breaks the barrier: the others release anyway
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait(timeout=1.0)
            pool.release_unused()

        # not waited for long: threads busy with another pass release when they get to it
        concurrent.futures.wait([executor.submit(release) for _ in range(workers)], timeout=2.0)


def map_shared(fn: Callable[[Any], Any], items: Any, workers: int,
               pool: Executor | None = None) -> list[Any]:
    """``[fn(item) for item in items]``, up to ``workers`` calls at once on this
    process's shared threads (``pool`` when given, e.g. a :func:`kept_pool`; on threads
    of their own where :func:`shared_pool` has none here), each in a copy of the
    caller's context (the backend in use); one worker or one item: in the calling
    thread. Returns once no call runs any more, also when one failed (its error is
    raised; those not started are dropped)."""
    items = list(items)
    workers = min(workers, len(items))
    if workers <= 1:
        return [fn(item) for item in items]
    group = TaskGroup(pool if pool is not None else shared_pool(), workers)
    try:
        futures = [group.submit(contextvars.copy_context().run, fn, item) for item in items]
        return [future.result() for future in futures]
    finally:
        group.close()


class TaskGroup(Executor):
    """The tasks one caller submits to a shared pool, so that it can end them without
    shutting the pool down: :meth:`close` drops those not started and waits for
    those running (an export that failed waits for its running siblings before it
    removes its temporary folder). Passed to dask as ``pool=``.

    ``workers``: at most this many of the group's tasks run at once (on a pool of
    its own, its size); None: as many as the pool has threads."""

    def __init__(self, pool: Executor | None = None, workers: int | None = None) -> None:
        self._pool = pool if pool is not None else ThreadPoolExecutor(
            workers or local_workers(), thread_name_prefix="tabstream-tasks")
        self._own = pool is None
        size = getattr(self._pool, "_max_workers", None) or workers or local_workers()
        self._max_workers = min(size, workers) if workers else size
        self._slots = (threading.BoundedSemaphore(self._max_workers)
                       if self._max_workers < size else None)
        self._futures: list[Future] = []
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self._slots is not None:
            fn, args = _limited, (self._slots, fn, *args)
        future = self._pool.submit(fn, *args, **kwargs)
        with self._lock:
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(future)
        return future

    def settle(self) -> None:
        """Drop the group's tasks not started and wait for those running; the group
        stays open (an export that retries waits here before it clears its folder)."""
        with self._lock:
            futures, self._futures = self._futures, []
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)

    def close(self) -> None:
        self.settle()
        if self._own:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.close()


def _limited(slots: threading.BoundedSemaphore, fn: Callable[..., Any], *args: Any,
             **kwargs: Any) -> Any:
    with slots:
        return fn(*args, **kwargs)

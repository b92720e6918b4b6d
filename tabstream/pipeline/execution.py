"""Running task graphs on dask: the threaded scheduler by default, a
``distributed.Client`` when one is given."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

import dask
import dask.local
import dask.threaded
from dask import delayed

from tabstream.core.errors import out_of_memory, ran_out_of_memory
from tabstream.core.threads import TaskGroup, local_workers, shared_pool

__all__ = ["TaskGroup", "compute", "compute_partition", "local_compute", "num_workers", "shared_pool",
           "tree_reduce"]

#: Held while a thread of this process builds a dask graph (dask-expr's expression
#: work: optimizing, lowering, materializing), never while tasks run. On Python 3.11
#: ``functools.cached_property`` takes one lock per property, shared by every
#: instance, and dask-expr computes its cached properties (``divisions``,
#: ``npartitions``, ...) of one expression while holding another's: two threads
#: building graphs at once (two fit tasks each computing a partition of a dask
#: DataFrame given as input, for example one after ``.shuffle``) took those locks in
#: opposite orders and waited for each other forever.
_GRAPH_LOCK = threading.Lock()


def num_workers(client: Any = None) -> int:
    """Processes (client) or threads (local) that run tasks side by side."""
    if client is not None:
        return max(1, len(client.scheduler_info().get("workers", {})))
    return local_workers()


def compute(tasks: Sequence[Any], client: Any = None, desc: str | None = None,
            progress: bool | None = None) -> list[Any]:
    """Compute delayed ``tasks`` and return their results in order.

    ``progress=None`` shows a bar only when stderr is a terminal.
    """
    tasks = list(tasks)
    if not tasks:
        return []
    try:
        return _compute(tasks, client, desc, progress)
    except (MemoryError, RuntimeError) as exc:  # numpy's, Arrow's (ArrowMemoryError), Python's
        if not ran_out_of_memory(exc):
            raise
        raise out_of_memory(desc or "a computation", exc, LOWER_FOR_MEMORY) from exc


#: What a fit or export that ran out of memory can lower.
LOWER_FOR_MEMORY = ("the Dataset's part_size (each task holds a partition), the number of "
                    "workers (tasks at once), or Categorify's spill_rows")


def _compute(tasks: list[Any], client: Any, desc: str | None, progress: bool | None) -> list[Any]:
    disable = None if progress is None else not progress
    if client is not None:
        from distributed import as_completed
        from tqdm.auto import tqdm

        futures = client.compute(tasks)
        with tqdm(total=len(futures), desc=desc, disable=disable, unit="task") as bar:
            # the client's own loop: it need not be the default client
            for _ in as_completed(futures, loop=client.loop):
                bar.update()
        return client.gather(futures)
    from tqdm.dask import TqdmCallback

    with TqdmCallback(desc=desc, disable=disable, unit="task"):
        return local_compute(tasks)


def local_compute(tasks: Sequence[Any], sync: bool = False, **kwargs: Any) -> list[Any]:
    """``dask.compute(*tasks)`` on dask's threaded scheduler (``sync``: the
    synchronous one) in this process, whatever client is active; ``kwargs`` go to
    the scheduler (e.g. ``pool=``; by default :func:`shared_pool`'s threads).

    The scheduler is passed as its function, not by name: given a name, dask imports
    ``distributed`` (if installed) to look for an active client even for
    ``"threads"``, where the answer changes nothing. That import was 0.14-0.17 s and
    13 MB of RSS in the first fit of every process (a tenth of a 1M-row Criteo fit).
    """
    if sync:
        return _compute_locked(tasks, dask.local.get_sync, kwargs)
    if kwargs.get("pool") is None:
        kwargs["pool"] = shared_pool()
    return _compute_locked(tasks, dask.threaded.get, kwargs)


def compute_partition(collection: Any, index: int) -> Any:
    """Partition ``index`` of a dask collection (a DataFrame given as input),
    computed in this thread; safe in many threads at once (see ``_GRAPH_LOCK``)."""
    with _GRAPH_LOCK:
        part = collection.get_partition(index)
    return local_compute([part], sync=True)[0]


def _compute_locked(tasks: Sequence[Any], get: Callable[..., Any], kwargs: dict[str, Any]) -> list[Any]:
    """``dask.compute`` with the graph built under ``_GRAPH_LOCK``, the lock let go
    before the first task runs (a task may compute a graph of its own)."""
    held = True

    def run(dsk: Any, keys: Any, **options: Any) -> Any:
        nonlocal held
        try:
            if hasattr(dsk, "__dask_graph__"):  # an expression: materialize it here, locked
                dsk = dsk.__dask_graph__()
        finally:
            held = False
            _GRAPH_LOCK.release()
        return get(dsk, keys, **options)

    _GRAPH_LOCK.acquire()
    try:
        return list(dask.compute(*tasks, scheduler=run, **kwargs))
    finally:
        if held:
            _GRAPH_LOCK.release()


def tree_reduce(items: Sequence[Any], combine: Callable[[list[Any]], Any], fan_in: int = 8,
                root: Callable[..., Any] | None = None, shards: int = 1,
                join: Callable[[list[Any]], Any] | None = None) -> Any:
    """Combine delayed partial results ``fan_in`` at a time until one is left, so no
    task ever holds more than ``fan_in`` partials.

    ``root``, when given, replaces ``combine`` for the last combination (the one whose
    result is the final partial): an op may skip work there that only serves a later
    combination, such as spilling a large partial to disk for the next level.

    ``shards > 1`` (with ``root`` and ``join``) runs the last combination as ``shards``
    tasks side by side, ``root(partials, shard, shards)`` for ``shard`` in
    ``range(shards)``, each combining its share of the partials' parts (for example
    some of the columns); ``join`` of their results, in shard order, is the result.
    Without it the last combination runs on one core however many are idle."""
    level = list(items)
    if not level:
        raise ValueError("nothing to reduce")
    if shards > 1 and (root is None or join is None):
        raise ValueError("tree_reduce: shards > 1 needs both root and join")
    combine_d = delayed(combine, pure=False)
    root_d = delayed(root, pure=False) if root is not None else combine_d
    while len(level) > 1:
        if len(level) > fan_in:
            level = [combine_d(level[i:i + fan_in]) for i in range(0, len(level), fan_in)]
        elif shards > 1:
            assert join is not None
            parts = [root_d(level, shard, shards) for shard in range(shards)]
            level = [delayed(join, pure=False)(parts)]
        else:
            level = [root_d(level)]
    return level[0]


def workers_share_this_host(client: Any) -> bool:
    """Whether every worker of ``client`` runs on the client's own machine."""
    here = socket.gethostname()
    return all(host == here for host in client.run(socket.gethostname).values())

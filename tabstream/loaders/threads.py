"""The loader's threads: reading row groups ahead, and making batches ahead of the
consumer.

:class:`PieceReader` reads the epoch's pieces in one or two daemon threads
(:func:`read_threads` says how many) and hands them out in order, holding at most
its budget of row groups; :class:`BatchIterator` runs the batch maker in another
daemon thread, ``prefetch`` batches ahead, through a bounded queue. An error in
either thread is raised in the consumer at its next batch; closing or dropping an
iterator stops both, and the process waits for them at exit (a thread caught in
Arrow's native code when the interpreter exits aborts it).
"""

from __future__ import annotations

import atexit
import contextlib
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tabstream.core.pages import small_pages
from tabstream.loaders import plan

__all__ = ["BatchIterator", "PieceReader", "read_threads"]


# Threads decoding row groups at once: parquet decodes one column chunk on one
# thread, so a single wide column (multi-hot ids) needs concurrent row groups to
# use a second core. Memory stays bounded by the reader's budget.
_READ_THREADS = 2
# how long closing a loader waits for its threads to end (they stop at their next
# step: within a read of one row group)
_JOIN_TIMEOUT_S = 30.0
# the loaders' threads still running, and the events that stop them (weak: a thread
# leaves the set when it ends; its event lives as long as the thread holds it)
_RUNNING: weakref.WeakSet[threading.Thread] = weakref.WeakSet()
_STOPS: weakref.WeakSet[threading.Event] = weakref.WeakSet()


def _start(thread: threading.Thread, stop: threading.Event) -> None:
    _STOPS.add(stop)
    _RUNNING.add(thread)
    thread.start()


@atexit.register
def _stop_at_exit() -> None:
    """Stop every loader thread and wait for it while the interpreter still runs
    Python code. An epoch left unfinished (a script that stops after a few batches,
    a fixed number of steps per epoch) is only told to stop when its iterator is
    dropped; a reading thread caught inside Arrow's native code when the process
    exits aborts it (see :func:`_join`): seen as a distributed training example's
    rank exiting with SIGABRT after its last step."""
    for stop in list(_STOPS):
        stop.set()
    _join(list(_RUNNING))


class PieceReader:
    """Reads pieces in ``_READ_THREADS`` daemon threads and hands them out in order,
    holding at most ``budget`` pieces that the consumer has not released yet."""

    def __init__(self, read: Callable[[plan.Piece], Any], pieces: Sequence[plan.Piece],
                 budget: int, threads: int = _READ_THREADS) -> None:
        self._slots = threading.Semaphore(budget)
        self._cond = threading.Condition()
        self._results: dict[int, Any] = {}
        self._next = 0   # the next piece a thread claims
        self._want = 0   # the next piece the consumer gets
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(read, pieces),
                                          name=f"tabstream-read-{k}", daemon=True)
                         for k in range(max(1, min(threads, len(pieces))))]
        for thread in self._threads:
            _start(thread, self._stop)

    @small_pages()  # while the loader reads (see tabstream.core.pages)
    def _run(self, read: Callable[[plan.Piece], Any], pieces: Sequence[plan.Piece]) -> None:
        while True:
            while not self._slots.acquire(timeout=0.1):
                if self._stop.is_set():
                    return
            if self._stop.is_set():
                return
            with self._cond:
                index = self._next
                if index >= len(pieces):
                    self._slots.release()
                    return
                self._next += 1
            try:
                item = read(pieces[index])
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                item = _Failure(exc)
            with self._cond:
                self._results[index] = item
                self._cond.notify_all()
            if isinstance(item, _Failure):
                return

    def get(self) -> Any:
        with self._cond:
            while self._want not in self._results:
                self._cond.wait(timeout=0.1)
                if not any(t.is_alive() for t in self._threads) and self._want not in self._results:
                    raise RuntimeError("the loader's reading threads stopped unexpectedly")
            item = self._results.pop(self._want)
            self._want += 1
        if isinstance(item, _Failure):
            raise item.exc
        return item

    def release(self, n: int) -> None:
        for _ in range(n):
            self._slots.release()

    def close(self) -> None:
        self._stop.set()
        _join(self._threads)


def _join(threads: Sequence[threading.Thread], timeout: float = _JOIN_TIMEOUT_S) -> None:
    """Wait for stopped threads to end (never the calling one), so none is still inside
    Arrow's native reading code when the interpreter exits: a daemon thread caught there
    at exit aborts the process ("terminate called without an active exception")."""
    deadline = time.monotonic() + timeout
    for thread in threads:
        if thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()))


_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _put(q: queue.Queue, stop: threading.Event, item: Any) -> bool:
    while not stop.is_set():
        try:
            q.put(item, timeout=0.1)
            return True
        except queue.Full:
            continue
    return False


@small_pages()  # while the loader makes batches (see tabstream.core.pages)
def _produce(q: queue.Queue, stop: threading.Event, batches: Iterable[Any],
             transform: Callable[[Any], Any] | None) -> None:
    # Holds no reference to the BatchIterator, so an abandoned one is collected and
    # its __del__ stops this thread.
    it = iter(batches)
    try:
        for batch in it:
            if transform is not None:
                batch = transform(batch)
            if not _put(q, stop, batch):
                return
        _put(q, stop, _END)
    except BaseException as exc:  # noqa: BLE001 - handed to the consumer
        _put(q, stop, _Failure(exc))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


class BatchIterator:
    """One epoch's batches, produced in a daemon thread ``depth`` batches ahead.

    Errors are re-raised in the consumer; ``close()``, or dropping an unfinished
    iterator, stops the thread at its next step.
    """

    def __init__(self, batches: Iterable[Any], transform: Callable[[Any], Any] | None,
                 depth: int) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=_produce,
                                        args=(self._queue, self._stop, batches, transform),
                                        name="tabstream-loader", daemon=True)
        _start(self._thread, self._stop)

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if self._done:  # closed meanwhile, by another thread
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the loader's background thread stopped "
                                       "unexpectedly") from None
        if item is _END:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            raise item.exc
        return item

    def close(self) -> None:
        """Stop the background thread and wait for it (and its reading threads) to
        end; later ``next()`` calls raise StopIteration."""
        self._done = True
        self._stop.set()
        _join([self._thread])
        # a consumer waiting in another thread ends now instead of at its next poll
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(_END)

    def __del__(self) -> None:
        self._stop.set()


def read_threads(unit_sizes: Sequence[tuple[float, float]]) -> int:
    """Row groups to read at once, from each row group's decoded bytes and those of
    its largest column (:meth:`tabstream.loaders.reading.RowGroupReader.unit_sizes`).

    Parquet decodes the columns of one row group in parallel, one column per
    thread: when no column holds more than half of a row group's bytes, one read
    keeps two cores busy and a second concurrent one would only hold another row
    group in memory. A row group dominated by one wide column (multi-hot ids)
    decodes on one thread, so two are read at once, each decoded in its reading
    thread (see :meth:`tabstream.loaders.reading.RowGroupReader.read_piece`)."""
    serial = any(widest * 2 > total for total, widest in unit_sizes)
    return _READ_THREADS if serial else 1

"""Taking turns at one local file or folder: an exclusive lock held by one writer at a time.

:func:`exclusive` holds ``fcntl.flock`` on a lock file beside what is written. A second
writer (another process, or another thread: each opens its own file description)
waits until the first lets go; the kernel lets go for a holder that dies (kill -9
included), so no lock outlives its owner and none is ever broken by guesswork. The
holder removes the lock file when done; a waiter that then finds the name gone or
given to a newer file locks again, so two writers never hold two files of one name.

Used where a writer must see everything the writer before it did:
``to_npy(append=True)`` (each appender adds its rows to the file the previous one
left) and ``VocabularyDelta.write`` (the second writer of one delta finds the first's
and is refused).

Use: ``with exclusive(os.path.join(folder, ".out.npy.lock")): ...`` around the
steps from reading what is there to the rename into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator

__all__ = ["exclusive"]


@contextlib.contextmanager
def exclusive(path: str) -> Iterator[None]:
    """Hold the lock file ``path`` (created; its folder must exist) for the ``with``
    block, waiting for the writer that holds it now."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                current = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                current = False
        except BaseException:
            os.close(fd)
            raise
        if current:
            break
        # the holder before us removed this file (and another may have made a new
        # one): a lock on the old file excludes nobody
        os.close(fd)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)  # lets the next writer in

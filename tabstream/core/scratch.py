"""Scratch files and folders named with their owner, removed once the owner is gone;
and the message of a write that found its filesystem full or read-only.

Whatever tabstream writes only for the time of a run (an export's hidden folder, a
Categorify spill file) carries its owner in its name, ``<host>-<pid>-s<start>``:

* ``host``: the first 8 hex digits of the SHA-1 of the host name;
* ``pid``: the process id;
* ``start``: the process's start time (clock ticks since boot, from ``/proc``), so
  that a new process that reuses the pid of a killed one is not taken for it.

:func:`remove_leftovers` removes the entries of a folder named by a pattern whose
owner is dead: a process of this host that is gone (or whose pid now belongs to a
process started later), or, when the owner cannot be checked (another host, or a
name without the owner), an entry older than :data:`STALE_SECONDS`.

>>> import re
>>> name = f"spill-{owner_tag()}-0123456789ab"
>>> OWNER.pattern in owner_pattern(r"spill-", r"[0-9a-f]{12}").pattern
True
>>> owner_pattern(r"spill-", r"[0-9a-f]{12}").fullmatch(name)["pid"] == str(os.getpid())
True
"""

from __future__ import annotations

import errno
import hashlib
import os
import posixpath
import re
import socket
import time
from collections.abc import Callable
from typing import Any

__all__ = ["OWNER", "STALE_SECONDS", "owner_alive", "owner_pattern", "owner_tag",
           "remove_leftovers", "write_failure"]

#: A leftover whose owner cannot be checked (another host, an unnamed owner) is
#: removed once it is this old.
STALE_SECONDS = 24 * 3600

#: The owner part of a name (optional: older versions named no owner, or no start).
OWNER = re.compile(r"(?:(?P<host>[0-9a-f]{8})-(?P<pid>\d+)-(?:s(?P<start>\d+)-)?)?")


def _host() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def process_start(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot; None when it
    cannot be read (no such process, or no ``/proc``)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces: count after it
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[19])  # field 22 of stat(5)
    except (IndexError, ValueError):
        return None


def owner_tag() -> str:
    """``<host>-<pid>-s<start>`` of this process (``<host>-<pid>`` without ``/proc``)."""
    start = process_start(os.getpid())
    return f"{_host()}-{os.getpid()}" + (f"-s{start}" if start is not None else "")


def owner_pattern(prefix: str, suffix: str) -> re.Pattern[str]:
    """A pattern matching ``<prefix><owner tag>-<suffix>`` (both regular expressions),
    or ``<prefix><suffix>`` (the naming of versions without the owner)."""
    return re.compile(prefix + OWNER.pattern + suffix)


def owner_alive(host: str | None, pid: str | None, start: str | None) -> bool | None:
    """Whether the owner named by a name's groups still runs; None when it cannot be
    told from here (another host, or no owner in the name)."""
    if host is None or pid is None or host != _host():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        pass
    except (OverflowError, ValueError):
        return False
    if start is not None:
        now = process_start(int(pid))
        if now is not None and now != int(start):
            return False  # the pid belongs to another, later process now
    return True


def remove_leftovers(fs: Any, parent: str, pattern: re.Pattern[str],
                     keep: Callable[[re.Match[str]], bool] | None = None,
                     stale_seconds: float = STALE_SECONDS, by_owner: bool = True) -> list[str]:
    """Remove the entries of ``parent`` (files or folders, on any fsspec filesystem)
    whose name fullmatches ``pattern`` (made by :func:`owner_pattern`) and whose owner
    is dead; ``keep(match)`` true keeps one anyway; ``by_owner=False`` removes only
    those older than ``stale_seconds``, whoever the owner. Returns the removed paths.
    Nothing is raised: a folder that cannot be listed, or an entry that cannot be
    removed (another user's), is left as it is."""
    try:
        # names first: only the matching entries are looked at further (a shared
        # temporary folder of 2,500 entries took 0.14 s to list with every entry's
        # details, in each fit and export)
        names = fs.ls(parent, detail=False)
    except OSError:  # no folder yet, or not ours to list: nothing to clean
        return []
    removed = []
    for name in names:
        path = (name["name"] if isinstance(name, dict) else name).rstrip("/")
        m = pattern.fullmatch(posixpath.basename(path))
        if m is None or (keep is not None and keep(m)):
            continue
        try:
            entry = fs.info(path)
        except OSError:  # removed meanwhile, by its owner or another cleaner
            continue
        alive = owner_alive(m["host"], m["pid"], m["start"]) if by_owner else None
        if alive:
            continue
        if alive is None:
            mtime = entry.get("mtime") or entry.get("created") or entry.get("LastModified")
            if hasattr(mtime, "timestamp"):
                mtime = mtime.timestamp()
            if mtime is None or time.time() - float(mtime) < stale_seconds:
                continue
        try:
            fs.rm(path, recursive=entry.get("type") == "directory")
        except OSError:
            continue
        removed.append(path)
    return removed


#: errno values of a filesystem that has no room left, or refuses to be written
_FULL = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}
_READ_ONLY = {errno.EACCES, errno.EPERM, errno.EROFS}
_NOT_A_FOLDER = {errno.ENOTDIR, errno.EEXIST}  # a file where a folder is made


def write_failure(exc: BaseException, folder: str, setting: str) -> str | None:
    """A message for ``exc`` when it (or an exception it was raised from) is a write
    refused for want of space or of permission in ``folder`` (or a file stands where
    a folder is to be made), naming the folder and
    ``setting``, the option that moves the writes elsewhere; None for other failures.

    >>> write_failure(OSError(28, "No space left on device"), "/data/out", "output_path")
    "the filesystem of '/data/out' is full ([Errno 28] No space left on device): free space there, or give output_path a folder on another disk"
    """
    seen = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        code = getattr(cause, "errno", None)
        name = getattr(cause, "filename", None)
        if isinstance(name, str) and not name.startswith(folder.rstrip("/")):
            code = None  # a file elsewhere (an input, say): not this folder's failure
        if isinstance(cause, OSError) and code in _FULL:
            return (f"the filesystem of {folder!r} is full ({cause}): free space there, or give "
                    f"{setting} a folder on another disk")
        if isinstance(cause, OSError) and code in _READ_ONLY:
            return (f"{folder!r} cannot be written ({cause}): make it writable, or give {setting} "
                    "a folder you may write")
        if isinstance(cause, OSError) and code in _NOT_A_FOLDER:
            return (f"{folder!r} is not a folder one can write in ({cause}): give {setting} a "
                    "folder (a file is in the way)")
        cause = cause.__cause__ or cause.__context__
    return None

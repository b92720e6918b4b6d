"""Reading JSON that a user's folder holds (workflow.json, _manifest.json,
_schema.json, checkpoint and parameter-server files): one reader, so a file nested
thousands of levels deep is a :class:`DataError` naming the file, never a
``RecursionError`` from the parser or from code walking what it returned.

>>> loads_json('{"a": [1, 2]}', "x.json", "test file")
{'a': [1, 2]}
>>> loads_json("[" * 5000 + "]" * 5000, "x.json", "test file")
Traceback (most recent call last):
...
tabstream.core.errors.DataError: x.json: JSON nested 5000 levels deep; no test file is nested more than 100 levels (the file is damaged or was made to break readers)
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import uuid
from collections.abc import Callable
from typing import Any

from tabstream.core.errors import DataError

__all__ = ["MAX_DEPTH", "json_depth", "loads_json", "read_json_file", "sync_folder", "write_json_file"]

#: deepest nesting of arrays and objects accepted; tabstream's own files stay
#: below 20 (a schema column's properties, a checkpoint's optimizer state)
MAX_DEPTH = 100

# unrolled ("normal* (special normal*)*"): one step per run of plain characters
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_DELTA = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """How deep arrays and objects nest in ``text`` (brackets inside strings do not
    count); linear, without recursion, in C for all but the brackets themselves."""
    bare = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(itertools.accumulate(map(_DELTA.__getitem__, bare)), default=0)


def loads_json(text: str | bytes, where: str, what: str,
               object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """``json.loads(text)`` for the file ``where`` (a ``what``: "saved workflow",
    "export manifest", ...). Nesting deeper than :data:`MAX_DEPTH` and text that is
    not UTF-8 are a :class:`DataError` naming ``where``; invalid JSON raises
    ``json.JSONDecodeError`` (a ``ValueError``) as ``json.loads`` does, for the caller
    to word."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(f"{where}: not a {what} (not UTF-8 text: {exc})") from exc
    if text.count("[") + text.count("{") > MAX_DEPTH:
        depth = json_depth(text)
        if depth > MAX_DEPTH:
            raise _too_deep(where, what, depth)
    try:
        return json.loads(text, object_pairs_hook=object_pairs_hook)
    except RecursionError as exc:  # not reached past the check above; kept as a guard
        raise _too_deep(where, what, None) from exc


def read_json_file(path: str | os.PathLike[str], what: str, fs: Any = None,
                   object_pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None) -> Any:
    """The JSON document in the file ``path`` (on the fsspec filesystem ``fs``, else
    local), read with :func:`loads_json`."""
    if fs is None:
        with open(path, "rb") as f:
            data = f.read()
    else:
        with fs.open(path, "rb") as f:
            data = f.read()
    return loads_json(data, str(path), what, object_pairs_hook)


def _too_deep(where: str, what: str, depth: int | None) -> DataError:
    levels = f"{depth} levels deep" if depth is not None else "too deep for the parser"
    return DataError(f"{where}: JSON nested {levels}; no {what} is nested more than "
                     f"{MAX_DEPTH} levels (the file is damaged or was made to break readers)")


def write_json_file(path: str | os.PathLike[str], value: Any, indent: int = 1) -> None:
    """``value`` as JSON into the local file ``path``, whole or not at all, and durably:
    written beside it under a name of its own (writers of the same file do not meet),
    forced to the disk, renamed into place, then the rename forced to the disk too
    (:func:`sync_folder`). A reader sees the old file or the new one, after a kill -9
    or a power loss alike."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "w") as f:
            json.dump(value, f, indent=indent)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):  # the write's own error is the one to see
            os.remove(tmp)
        raise
    sync_folder(folder or ".")


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """Force ``folder``'s entries (files created, renamed into or out of it) to the
    disk. Where a folder cannot be opened for that (not POSIX), nothing is done."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # no descriptor for a folder here: the renames stay as durable as before
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise  # a failing disk, not a folder that cannot be synced here
    finally:
        os.close(fd)

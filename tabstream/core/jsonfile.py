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

import itertools
import json
import os
import re
from collections.abc import Callable
from typing import Any

from tabstream.core.errors import DataError

__all__ = ["MAX_DEPTH", "json_depth", "loads_json", "read_json_file"]

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

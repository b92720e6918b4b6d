"""Project exceptions. Each message says what went wrong, where (file, column,
line, value) and what was expected."""

from __future__ import annotations

__all__ = ["BackendUnavailableError", "CacheWarning", "DataError", "DatasetWarning", "ExportError",
           "NotFittedError", "OutOfMemoryError", "SchemaError", "TabstreamError", "WorkflowWarning",
           "listed", "out_of_memory", "ran_out_of_memory"]


class TabstreamError(Exception):
    """Base class of tabstream's own errors.

    ``hint`` (optional) says what to do about it; the command line prints it under
    the one-line message.

    >>> str(DataError("x.tsv, line 1: ...", hint="pass header=True").hint)
    'pass header=True'
    """

    def __init__(self, *args: object, hint: str | None = None) -> None:
        super().__init__(*args)
        self.hint = hint


class DataError(TabstreamError, ValueError):
    """Input data is unreadable or does not match what was declared."""


class SchemaError(TabstreamError, KeyError):
    """A column is missing or has the wrong type."""

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class NotFittedError(TabstreamError, RuntimeError):
    """A workflow or op was used before ``fit``."""


class ExportError(TabstreamError, RuntimeError):
    """Writing an export failed; nothing that looks complete was left behind."""


class BackendUnavailableError(TabstreamError, ValueError):
    """A backend was asked for that cannot run here (a library or the GPU is missing);
    the hint says what to install."""


class CacheWarning(UserWarning):
    """A Dataset's default cache ("auto") keeps no more partitions: its disk is
    nearly full, its folder cannot be used, or a write into it failed. Later passes
    read the input again (raw CSV/TSV is parsed a second time); the data are the
    same. Said once per Dataset."""


class DatasetWarning(UserWarning):
    """A Dataset reads its input, but not all of what a user may expect it to: a
    folder's subfolders that are not data were left out, or parquet files whose
    schemas differ were unified (the columns a file lacks are null in its rows)."""


def listed(items: list[str], limit: int = 5, sep: str = ", ") -> str:
    """The first ``limit`` of ``items`` for a message, and how many more.

    >>> listed(["a", "b", "c"], limit=2)
    'a, b and 1 more'
    """
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return sep.join(items[:limit]) + more


class WorkflowWarning(UserWarning):
    """A saved workflow loads, but its graph's output schema differs from the one
    saved in the file (another tabstream version's rules, or an edit): the columns
    and both values are named."""


class OutOfMemoryError(TabstreamError, MemoryError):
    """Memory ran out (an allocation of numpy, Arrow or Python failed, e.g. under a
    container's limit or ``ulimit -v``): which stage, and what to lower."""


def out_of_memory(stage: str, exc: BaseException, lower: str) -> OutOfMemoryError:
    """One line for a :class:`MemoryError` (``pyarrow.ArrowMemoryError`` is one) that
    ``stage`` ran into; ``lower`` names the settings that need less memory.

    >>> str(out_of_memory("fit level 1", MemoryError(), "part_size"))
    'fit level 1: memory ran out (MemoryError); lower part_size, or give the process more memory'
    """
    cause = exc.__cause__ if isinstance(exc, OutOfMemoryError) and exc.__cause__ else exc
    detail = " ".join(str(cause).split()) or type(cause).__name__
    return OutOfMemoryError(f"{stage}: memory ran out ({detail}); lower {lower}, or give the process "
                            "more memory", hint=f"lower {lower}")


def ran_out_of_memory(exc: BaseException) -> bool:
    """A :class:`MemoryError`, or a thread that could not start (its stack could not be
    mapped: what a memory limit such as ``ulimit -v`` does to a new thread)."""
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError) and "can't start new thread" in str(exc))

"""Object stores (``s3://``, ``gs://``, ...) under a Dataset: the store as it is now,
and failures that say what happened, quickly.

* fsspec keeps one filesystem object per set of options for the whole process, and
  with it a cache of listings (names, sizes, ETags). A Dataset opened on a prefix
  forgets what that cache holds for the prefix (:func:`forget_listings`), so it sees
  the files another process wrote since, not the ones it replaced; each file's ETag
  is recorded when the Dataset is opened, and a read that finds another
  (:func:`check_unchanged`) says the file was replaced, instead of S3's
  ``FileExpired`` or a parquet error about bytes of two versions.
* Unreachable stores and refused requests are a :class:`DataError` naming the URL
  and which of the two it is (:func:`store_error`). botocore's default ("legacy")
  retries took 10-26 s to give up on a closed port; :func:`store_options` asks S3
  for the "standard" retry mode with 3 attempts (AWS's own recommendation; it still
  retries throttling and transient errors) where the user set no retries, in the
  options or through ``AWS_MAX_ATTEMPTS`` / ``AWS_RETRY_MODE``.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
from collections.abc import Iterator
from typing import Any

from tabstream.core.errors import DataError

__all__ = ["check_unchanged", "file_tag", "forget_listings", "is_local", "is_remote_url", "store_error",
           "store_options", "translate_store_errors"]

#: botocore retries a Dataset asks for on S3 where the user gave none (see the module doc)
S3_RETRIES = {"mode": "standard", "total_max_attempts": 3}

_S3 = ("s3", "s3a")


def is_local(fs: Any) -> bool:
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    return protocol in ("file", "local")


def store_options(url: str, storage_options: dict) -> dict:
    """``storage_options`` with tabstream's defaults for the store of ``url`` added
    where the user set nothing (the user's dict is not changed)."""
    from fsspec.core import split_protocol

    protocol = split_protocol(url)[0]
    if protocol not in _S3:
        return storage_options
    config = dict(storage_options.get("config_kwargs") or {})
    if "retries" in config or os.environ.get("AWS_MAX_ATTEMPTS") or os.environ.get("AWS_RETRY_MODE"):
        return storage_options
    config["retries"] = dict(S3_RETRIES)
    return {**storage_options, "config_kwargs": config}


def forget_listings(fs: Any, paths: list[str]) -> None:
    """Drop what ``fs`` remembers of ``paths`` (a glob: of the folder above its first
    wildcard), of everything below them and of their parent folders."""
    if is_local(fs):
        return
    cache = getattr(fs, "dircache", None)
    for path in paths:
        stripped = fs._strip_protocol(path)
        cut = min((stripped.find(ch) for ch in "*?[" if ch in stripped), default=-1)
        if cut >= 0:
            stripped = posixpath.dirname(stripped[:cut])
        stripped = stripped.rstrip("/")
        fs.invalidate_cache(stripped)  # the path and its parents
        if cache is not None:
            for key in [k for k in list(cache) if k.startswith(stripped + "/")]:
                cache.pop(key, None)


def file_tag(fs: Any, path: str) -> str | None:
    """What identifies this version of a remote file (its ETag, or generation/md5
    where the store has no ETag), from the listing ``fs`` holds; None when unknown."""
    if is_local(fs):
        return None
    try:
        info = fs.info(path)
    except (OSError, ValueError):
        return None
    for key in ("ETag", "etag", "generation", "md5Hash"):
        if info.get(key):
            return str(info[key])
    return None


def check_unchanged(fs: Any, path: str, tag: str | None) -> None:
    """Before a remote file is read: the version the Dataset planned on (``tag``,
    see :func:`file_tag`). A listing cached from before (another Dataset of this
    process, or a worker process) is refreshed; a file replaced since the Dataset
    was opened is a DataError naming it."""
    if tag is None:
        return
    if file_tag(fs, path) == tag:
        return
    fs.invalidate_cache(fs._strip_protocol(path))
    now = file_tag(fs, path)
    if now != tag:
        raise DataError(
            f"{path}: the file was replaced (or deleted) after the Dataset was opened (its ETag was "
            f"{tag}, now {now}); the rows planned are no longer there",
            hint="open the Dataset again once the writer has finished")


def _endpoint(exc: BaseException) -> str:
    text = str(exc)
    for marker in ('endpoint URL: "', "host "):
        if marker in text:
            return text.split(marker, 1)[1].split('"')[0].split("?")[0]
    return ""


def _unreachable(exc: BaseException) -> bool:
    # by name: botocore and aiohttp are imported only where a store needs them
    names = {cls.__name__ for cls in type(exc).__mro__}
    if names & {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError",
                "ServerTimeoutError", "ProxyConnectionError"}:
        return True
    if isinstance(exc, (ConnectionRefusedError, ConnectionResetError, TimeoutError)):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH,
                                                      errno.ENETUNREACH, errno.ETIMEDOUT)


def _refused(exc: BaseException) -> bool:
    if isinstance(exc, PermissionError):
        return True
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"NoCredentialsError", "PartialCredentialsError"})


def store_error(url: str, exc: BaseException) -> DataError | None:
    """A DataError naming ``url`` for an unreachable store or a refused request;
    None for any other error."""
    if _unreachable(exc):
        at = _endpoint(exc)
        return DataError(
            f"{url}: the object store{f' at {at}' if at else ''} cannot be reached ({type(exc).__name__}: "
            f"{exc}); nothing was read",
            hint="check the endpoint (storage_options client_kwargs endpoint_url), the network and "
                 "that the store is running")
    if _refused(exc):
        return DataError(
            f"{url}: the object store refused access ({type(exc).__name__}: {exc}); the credentials "
            "were rejected or lack permission to list and read this path",
            hint="check the credentials (storage_options key/secret, AWS_PROFILE or the "
                 "environment) and the bucket's policy")
    return None


def is_remote_url(url: str) -> bool:
    from fsspec.core import split_protocol

    return split_protocol(url)[0] not in (None, "file", "local")


@contextlib.contextmanager
def translate_store_errors(url: str) -> Iterator[None]:
    """Unreachable store / refused request inside the block -> :func:`store_error`.
    Nothing is translated for a local path (a local PermissionError names its file)."""
    try:
        yield
    except DataError:
        raise
    except Exception as exc:
        err = store_error(url, exc) if is_remote_url(url) else None
        if err is None:
            raise
        raise err from exc

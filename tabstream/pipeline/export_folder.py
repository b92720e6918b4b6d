"""The export folder's format, written and read in one place.

An export folder holds parquet data files and, beside them, files whose names start
with ``_`` (so other readers take the folder as it is)::

    _schema.json      the output Schema (``schema.json`` in older exports, still read)
    _metadata         the parquet footers of every data file
    _manifest.json    {"num_rows": N, "files": [{"path", "num_rows"}], ...}: written
                      last, the mark that the export is complete; for an export
                      published into a folder of other files, also "others" (their
                      names: never read as the export's data) and "export_id"

Every data file also carries the Schema in its key-value metadata (:data:`SCHEMA_KEY`).
This module writes those files (:func:`write_sidecars`), puts a finished folder in
place (:func:`publish` on a local disk, :class:`PublishInto` into a local folder of
other files, :class:`ObjectStorePublish` where there is no rename) and checks a folder read back against them (:func:`check_manifests`,
:func:`refuse_unpublished`, :func:`read_schema_json`, :func:`check_schema_file`).
The writer is :mod:`tabstream.pipeline.export`, the reader
:class:`~tabstream.pipeline.dataset.Dataset`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import posixpath
import re
import shutil
import time
import uuid
import warnings
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import tabstream
from tabstream.core.errors import DataError, ExportError, listed
from tabstream.core.jsonfile import loads_json, read_json_file, write_json_file
from tabstream.core.schema import Schema
from tabstream.core.scratch import (
    STALE_SECONDS,
    owner_alive,
    owner_pattern,
    owner_tag,
    remove_leftovers,
)
from tabstream.pipeline.stores import is_local

__all__ = ["JOURNAL_FILE", "LOCK_FILE", "MANIFEST_FILE", "ObjectStorePublish", "PublishInto",
           "SCHEMA_FILE", "SCHEMA_KEY", "SIDECARS", "check_manifests", "check_schema_file",
           "check_target", "drop_other_files", "publish", "read_schema_json", "refuse_interrupted",
           "refuse_unpublished", "remove_export_leftovers", "write_sidecars"]

SCHEMA_FILE = "_schema.json"
# Key of the parquet key-value metadata that holds the output Schema as JSON in every
# data file, so a reader that has only the files still gets tags and properties.
SCHEMA_KEY = b"tabstream.schema"


MANIFEST_FILE = "_manifest.json"
# In a folder an export is published into (:class:`PublishInto`): the lock held for
# the export's duration, and the journal of the moves, there while files move.
LOCK_FILE = ".tabstream-export.lock"
JOURNAL_FILE = ".tabstream-publish.json"
_MANIFEST_HINT = ("the export folder was changed after it was written: write it again "
                  "(tabstream fit/transform, or to_parquet) rather than editing its files")


# what write_sidecars writes into "format"; "tabstream.export/<n>" with n > 1 (or a
# "version" above 1) is a future layout this tabstream would misread
_MANIFEST_FORMAT = "tabstream.export"
_MANIFEST_VERSION = 1


def _manifest_json(fs: Any, folder: str, check_format: bool = True) -> dict | None:
    """``folder/_manifest.json`` as read; ``None`` without one. With
    ``check_format``, one of another format or of a newer version is refused."""
    path = posixpath.join(folder, MANIFEST_FILE)
    if not fs.exists(path):
        return None
    manifest = read_json_file(path, "export manifest", fs)
    if not isinstance(manifest, dict):
        raise DataError(f"{path}: not a valid export manifest (a JSON {type(manifest).__name__}); expected "
                        '{"files": [{"path": ..., "num_rows": ...}, ...]}')
    if check_format:
        _check_manifest_format(manifest, path)
    return manifest


def _check_manifest_format(manifest: dict, path: str) -> None:
    """``format`` is ``"tabstream.export"`` (or ``.../1``) and ``version``, where
    present, 1. A manifest without ``format`` (made by hand, as tests and tools do)
    is read as version 1."""
    fmt = manifest.get("format", _MANIFEST_FORMAT)
    base, _, number = fmt.partition("/") if isinstance(fmt, str) else ("", "", "")
    if base != _MANIFEST_FORMAT or (number and not number.isdigit()):
        raise DataError(f"{path}: not a tabstream export manifest (field 'format' is {fmt!r}; "
                        f"expected {_MANIFEST_FORMAT!r})", hint=_MANIFEST_HINT)
    version = manifest.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DataError(f"{path}: not a valid export manifest (field 'version' is {version!r}; "
                        f"expected {_MANIFEST_VERSION})", hint=_MANIFEST_HINT)
    newest = max(version, int(number or 1))
    if newest > _MANIFEST_VERSION:
        raise DataError(f"{path}: export manifest of version {newest} (format {fmt!r}"
                        f"{f', version {version}' if 'version' in manifest else ''}), written by a newer "
                        f"tabstream; this tabstream ({tabstream.__version__}) reads version "
                        f"{_MANIFEST_VERSION} ({_MANIFEST_FORMAT!r}): upgrade tabstream to read this export",
                        hint="upgrade tabstream")


def _read_manifest(fs: Any, folder: str) -> tuple[dict[str, int], set[str]] | None:
    """``({file path: rows}, {paths of the folder's other files})`` from
    ``folder/_manifest.json``; ``None`` without one. The other files are those the
    folder held when an export was published into it (see :class:`PublishInto`):
    the user's, never read as the export's data."""
    path = posixpath.join(folder, MANIFEST_FILE)
    refuse_interrupted(fs, folder)
    manifest = _manifest_json(fs, folder)
    if manifest is None:
        return None
    try:
        entries = manifest["files"]
        files = {posixpath.join(folder, e["path"]): int(e["num_rows"]) for e in entries}
        others = {posixpath.join(folder, str(name)) for name in manifest.get("others", [])}
        return files, others
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a valid export manifest ({exc!r}); expected "
                        '{"files": [{"path": ..., "num_rows": ...}, ...]}') from exc


def _under(path: str, prefixes: set[str]) -> bool:
    return path in prefixes or any(path.startswith(p + "/") for p in prefixes)


def drop_other_files(fs: Any, paths: list[str], manifests: list[str]) -> list[str]:
    """``paths`` without the files that the ``manifests`` list as the folder's other
    files (a user's files beside an export published into their folder): a folder or
    a glob read as an export reads the export alone, never the user's files with it."""
    others: set[str] = set()
    for manifest in manifests:
        found = _read_manifest(fs, posixpath.dirname(manifest))
        if found is not None:
            others |= found[1]
    if not others:
        return paths
    return [p for p in paths if not _under(p, others)]


def refuse_interrupted(fs: Any, folder: str) -> None:
    """A folder holding the journal of an export published into it (see
    :class:`PublishInto`) is being changed, or was left half-changed by an export
    that was killed: refused, rather than read with files of two exports or none."""
    journal = posixpath.join(folder, JOURNAL_FILE)
    if fs.exists(journal):
        raise DataError(
            f"{folder}: an export into this folder was interrupted, or is being published now "
            f"({JOURNAL_FILE} is there): its files are not read as data; wait for the export to "
            "finish, or run the export into this folder again (it removes the interrupted one's "
            "files and puts back the export that one was replacing)",
            hint="export into the folder again, or read another folder")


def check_manifests(fs: Any, files: list[str], folders: list[tuple[str, Any]], rows: dict[str, int]) -> None:
    """An export's files must be the ones its ``_manifest.json`` lists, with the rows it
    lists: a deleted, truncated, replaced or extra file fails here instead of silently
    changing the data. A folder searched must hold exactly the files of each manifest
    in it (nested exports included); a glob must find every manifest entry it matches;
    each file is checked against the manifest of its nearest folder."""
    stripped = {fs._strip_protocol(f): f for f in files}
    manifests: dict[str, tuple[dict[str, int], set[str]] | None] = {}
    for folder, pattern in folders:
        if folder not in manifests:
            manifests[folder] = _read_manifest(fs, folder)
        found = manifests[folder]
        if found is None:
            continue
        manifest = found[0]
        for path, expected in manifest.items():
            if path not in stripped and (pattern is None or pattern.match(path)):
                raise DataError(
                    f"{path}: listed in {posixpath.join(folder, MANIFEST_FILE)} with {expected} rows, "
                    "but the file is missing (found 0 rows); the export is incomplete: "
                    "restore the file or export again", hint=_MANIFEST_HINT
                )
    searched = sorted({f for f, pattern in folders if pattern is None}, key=len, reverse=True)
    for path, url in stripped.items():
        folder = next((f for f in searched if path.startswith(f + "/")), posixpath.dirname(path))
        if folder not in manifests:
            manifests[folder] = _read_manifest(fs, folder)
        found = manifests[folder]
        if found is None:
            continue
        manifest, others = found
        where = posixpath.join(folder, MANIFEST_FILE)
        if path not in manifest and _under(path, others):
            continue  # a file of the user's, beside the export: read when picked by its path
        if path not in manifest:
            raise DataError(
                f"{url}: not listed in {where} (found {rows[url]} rows, expected no such file); "
                "remove the extra file or export again" + (
                    " (the export was published into a folder of other files: a file of yours added "
                    "after it is read as neither; move it out, or export again with overwrite=True, "
                    "which lists it among the folder's others)" if others else ""),
                hint=_MANIFEST_HINT)
        if manifest[path] != rows[url]:
            raise DataError(
                f"{url}: {where} lists {manifest[path]} rows, found {rows[url]} rows; the file "
                "was replaced or truncated after the export: export again", hint=_MANIFEST_HINT
            )


def refuse_unpublished(fs: Any, files: list[str], schemas: list[pa.Schema]) -> None:
    """On an object store an export publishes by writing ``_manifest.json`` last (there
    is no rename): files written by a tabstream export (their key-value metadata holds
    ``tabstream.schema``) in a prefix without a manifest belong to an export that is
    still running or failed, and are refused rather than read half-written. A file in
    hive folders (``partition_on``) belongs to the manifest above them."""
    checked: dict[str, bool] = {}

    def published(folder: str) -> bool:
        # an export with partition_on writes its files into hive folders
        # ("<column>=<value>", nested) under the folder that holds its manifest
        if folder not in checked:
            checked[folder] = fs.exists(posixpath.join(folder, MANIFEST_FILE)) or (
                "=" in posixpath.basename(folder) and published(posixpath.dirname(folder)))
        return checked[folder]

    for url, schema in zip(files, schemas, strict=True):
        if SCHEMA_KEY not in (schema.metadata or {}):
            continue
        if not published(posixpath.dirname(fs._strip_protocol(url))):
            raise DataError(
                f"{url}: written by a tabstream export, but its prefix has no {MANIFEST_FILE}; on "
                "an object store the manifest is written last and marks the export complete, so "
                "this export is still being written, or failed: wait for it, or export again",
                hint="read the prefix once its export has finished")


def _schema_file(fs: Any, files: list[str]) -> str | None:
    """The ``_schema.json`` (or older ``schema.json``) :func:`read_schema_json` reads."""
    folder = posixpath.dirname(fs._strip_protocol(files[0]))
    for filename in ("_schema.json", "schema.json"):
        candidate = posixpath.join(folder, filename)
        if fs.exists(candidate):
            return candidate
    return None


def check_schema_file(fs: Any, files: list[str], stored: Schema | None, arrow_schema: pa.Schema) -> None:
    """A ``_schema.json`` that lists columns none of the files holds describes other
    data (the files were replaced, or the schema copied from elsewhere): refused,
    naming the file and the columns, rather than its tags silently dropped."""
    if stored is None:
        return
    missing = [name for name in stored.column_names if name not in arrow_schema.names]
    if not missing:
        return
    where = _schema_file(fs, files)
    if where is None:  # the schema came from the files' own metadata or a Merlin schema
        return
    raise DataError(
        f"{where}: lists the columns {missing}, which none of the {len(files)} data file"
        f"{'s' if len(files) > 1 else ''} holds (they hold {arrow_schema.names}); the schema file "
        "does not describe these files",
        hint="export the data again, or remove or correct the schema file (or pass schema= to Dataset)")


_SCHEMA_HINT = ("export the data again, or correct the schema file (or pass schema= to Dataset); "
                "a file written by a newer tabstream needs that tabstream")


def read_schema_json(fs: Any, files: list[str]) -> Schema | None:
    """tabstream exports keep tags and properties in ``_schema.json`` beside the
    files (``schema.json`` in exports of older versions, still read). A newer
    ``version``, a field of the wrong type or an impossible ``domain`` is a
    :class:`DataError` naming the file, the column, the field and the value."""
    first = fs._strip_protocol(files[0])
    folder = posixpath.dirname(first)
    for filename in ("_schema.json", "schema.json"):
        candidate = posixpath.join(folder, filename)
        if fs.exists(candidate):
            break
    else:
        return None
    if filename == SCHEMA_FILE and fs.exists(posixpath.join(folder, MANIFEST_FILE)):
        found = _read_manifest(fs, folder)
        if found is not None and _under(first, found[1]):
            return None  # a user's file beside an export: the export's schema is not its

    with fs.open(candidate, "r") as f:
        try:
            doc = loads_json(f.read(), candidate, "schema file")  # its DataError names the file
        except ValueError as exc:
            raise DataError(f"{candidate}: not a valid tabstream schema: {exc}",
                            hint=_SCHEMA_HINT) from exc
    try:
        return Schema.from_dict(doc)  # checks version, field types and domains
    except (DataError, ValueError, KeyError, TypeError) as exc:
        detail = str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
        raise DataError(f"{candidate}: {detail}", hint=getattr(exc, "hint", None) or _SCHEMA_HINT) from exc


# -- writing and publishing ----------------------------------------------------
def write_sidecars(fs: Any, tmp: str, schema: Schema, files: list[str], rows: list[int],
                   extra: dict[str, Any] | None = None, store: ObjectStorePublish | None = None) -> None:
    """``_schema.json``, ``_metadata`` and, last, ``_manifest.json`` (with the fields of
    ``extra`` too: see :meth:`PublishInto.manifest_fields`) into ``tmp``. With a
    ``store``, the manifest is written only where none exists (another export's
    published first: :class:`FileExistsError`)."""
    with fs.open(posixpath.join(tmp, SCHEMA_FILE), "w") as f:
        f.write(schema.to_json())
    collected = []
    for name in files:
        with fs.open(posixpath.join(tmp, name), "rb") as fh:
            md = pq.read_metadata(fh)
        md.set_file_path(name)
        collected.append(md)
    if collected:
        with fs.open(posixpath.join(tmp, "_metadata"), "wb") as fh:
            combined = collected[0]
            for md in collected[1:]:
                combined.append_row_groups(md)
            combined.write_metadata_file(fh)
    manifest = {
        "format": _MANIFEST_FORMAT,
        "tabstream_version": tabstream.__version__,
        "num_rows": int(sum(rows)),
        "files": [{"path": f, "num_rows": int(n)} for f, n in zip(files, rows)],
        **(extra or {}),
    }
    # The manifest is written last: its presence inside the folder marks it complete.
    path = posixpath.join(tmp, MANIFEST_FILE)
    if store is None:
        with fs.open(path, "w") as f:
            json.dump(manifest, f, indent=2)
        return
    try:
        store.create(path, json.dumps(manifest, indent=2).encode())
    except FileExistsError:
        raise FileExistsError(
            f"{store.output_path!r}: another export to this prefix published its {MANIFEST_FILE} "
            "while this one ran; this export's files are removed and that one stays") from None


SIDECARS = (SCHEMA_FILE, "_metadata", MANIFEST_FILE)  # restored in this order
_UNTAGGED = re.compile(r"part_\d{5,}\.parquet")  # a data file's name without an export's tag


def _store_code(exc: BaseException) -> str | None:
    """The S3 error code (``PreconditionFailed``, ``NotImplemented``, ...) of ``exc`` or
    of an exception it was raised from; None when none carries one."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        response = getattr(cause, "response", None)
        if isinstance(response, dict) and (response.get("Error") or {}).get("Code"):
            return str(response["Error"]["Code"])
        cause = cause.__cause__ or cause.__context__
    return None


def _cannot_ask(exc: BaseException) -> bool:
    """``exc`` says the store or the installed client cannot make a request
    conditional (an s3fs without fsspec's ``mode="create"``, a botocore without the
    parameter, a store answering 501), as opposed to refusing this request."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return (isinstance(exc, TypeError) or "ParamValidationError" in names
            or _store_code(exc) == "NotImplemented")


def _modified(info: dict) -> float | None:
    stamp: Any = info.get("LastModified") or info.get("mtime") or info.get("updated")
    if isinstance(stamp, (int, float)):
        return float(stamp)
    return float(stamp.timestamp()) if hasattr(stamp, "timestamp") else None


class ObjectStorePublish:
    """Publishing on an object store (S3, GCS, ...), where no rename exists.

    Data files are written under the final prefix and ``_manifest.json`` last: its
    arrival marks the export complete, and readers refuse tabstream files in a
    prefix without one. Steps:

    * :meth:`begin` takes the lock ``<prefix>/.tabstream-export.lock`` with an
      exclusive write (fsspec's ``mode="create"``: S3's ``If-None-Match: *``, which
      the store refuses when the key exists; its text names the owner). Of two exports
      to one prefix, the second fails here with :class:`FileExistsError` naming the
      prefix and the holder, also with ``overwrite``, and writes nothing. A lock whose
      owner is gone (a process of this host that ended; from another host, a lock a
      day old) is deleted, only while it is the version read (``If-Match``), and
      taken again. Under the lock the prefix is listed: without ``overwrite`` any key
      there (an export that finished first) is refused. The store is asked once more
      to create the lock: one that accepts is ignoring the condition, and the export
      warns (see below).
    * With ``overwrite`` the new files get names of their own
      (``part_00000-<id>.parquet``), the old manifest is removed (from then until
      the new manifest the prefix is refused: the window of an overwrite), and the
      old keys are deleted only once the new manifest is in place.
    * Before the sidecars the lock is read again: one taken over by another export
      fails this one. The manifest is itself written exclusively (it was removed or
      never there), carries an ``export_id``, and is read back in :meth:`finish`
      together with a listing: a key no one expected (another writer in the prefix
      meanwhile) fails the export instead of leaving a folder that looks complete
      and that readers refuse.
    * A failure deletes every key this export wrote and, for an overwrite, puts the
      old ``_schema.json``, ``_metadata`` and ``_manifest.json`` back (manifest
      last): the old export is whole again. A killed process leaves a prefix without
      a manifest (refused) and its lock, broken by the next export once the owner is
      seen to be gone.

    A store that ignores the condition (some S3-compatible servers) gets a warning
    at every export and, so that two writers at least never replace each other's
    files, file names of their own even for a new prefix; the checks above then
    catch most overlaps, but not all (see docs/scaling-out.md)."""

    #: attempts at a conditional write the store answered with a conflict (409:
    #: another conditional write of the key in flight) or at a lock broken meanwhile
    ATTEMPTS = 8

    def __init__(self, fs: Any, root: str, output_path: str, overwrite: bool) -> None:
        self.fs = fs
        self.root = root
        self.output_path = output_path
        self.overwrite = overwrite
        self.lock = posixpath.join(root, LOCK_FILE)
        self.owner = f"{owner_tag()}-{uuid.uuid4().hex[:12]}"
        self.export_id = uuid.uuid4().hex
        self.held = False
        self.lock_etag: str | None = None
        self.exclusive = True  # the store refuses a second exclusive write (see _probe)
        self.old_keys: set[str] = set()
        self.saved: dict[str, bytes] = {}
        self.existed = False
        self.broke_lock = False  # took the prefix from a holder taken for dead
        self.foreign: set[str] = set()  # keys of another writer, seen by finish
        self.file_tag = ""

    # -- conditional requests ---------------------------------------------------
    def _not_exclusive(self, why: str) -> None:
        if not self.exclusive:
            return
        self.exclusive = False
        warnings.warn(
            f"export to {self.output_path!r}: the object store does not honour exclusive writes "
            f"({why}); two exports to this prefix at once cannot be kept apart: this one writes "
            "files of its own names and fails when it sees another's, but an overlap can go "
            "unseen; run one export per prefix at a time (see docs/scaling-out.md, "
            "'Two exports to one prefix')", stacklevel=5)

    def create(self, path: str, data: bytes) -> Any:
        """Write ``data`` to ``path`` only where no key of that name exists
        (:class:`FileExistsError` otherwise): one exclusive write, or, on a store
        that cannot make it conditional, a look then a write. Returns what the
        filesystem's ``pipe_file`` does (s3fs: the response, with the ETag)."""
        for attempt in range(self.ATTEMPTS):
            if not self.exclusive:
                self.fs.invalidate_cache(path)
                if self.fs.exists(path):
                    raise FileExistsError(f"{path} exists")
                return self.fs.pipe_file(path, data)
            try:
                return self.fs.pipe_file(path, data, mode="create")
            except FileExistsError:
                raise
            except Exception as exc:
                if _store_code(exc) == "ConditionalRequestConflict":
                    time.sleep(0.05 * (attempt + 1))  # another conditional write of the key
                    continue
                if not _cannot_ask(exc):
                    raise
                self._not_exclusive(f"an exclusive write was refused: {type(exc).__name__}: {exc}")
        raise ExportError(f"export to {self.output_path!r}: the store kept answering that another "
                          f"write of {path} was in progress; nothing was written")

    def _lock_text(self) -> str | None:
        try:
            return self.fs.cat_file(self.lock).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None

    def _read_lock(self) -> tuple[str, dict] | None:
        """``(text, info)`` of the lock as it is now; None without one."""
        self.fs.invalidate_cache(self.lock)
        try:
            info = self.fs.info(self.lock)
            text = self.fs.cat_file(self.lock).decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return None
        return text, info

    def _delete_if_unchanged(self, path: str, info: dict) -> None:
        """Delete ``path`` only while it is the version ``info`` describes (S3's
        conditional delete, ``If-Match``): a lock another export took meanwhile
        stays. Where the store or client cannot ask, a plain delete."""
        etag = info.get("ETag") or info.get("etag")
        try:
            if etag and hasattr(self.fs, "call_s3") and hasattr(self.fs, "split_path"):
                bucket, key, _ = self.fs.split_path(path)
                try:
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=etag)
                    return
                except FileNotFoundError:
                    return
                except Exception as exc:
                    if _store_code(exc) == "PreconditionFailed":
                        return  # replaced meanwhile: another export's now
                    if not _cannot_ask(exc):
                        raise
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm_file(path)
        finally:
            self.fs.invalidate_cache(path)

    # -- the lock ---------------------------------------------------------------
    def _take_lock(self) -> None:
        for _ in range(self.ATTEMPTS):
            try:
                written = self.create(self.lock, self.owner.encode())
            except FileExistsError:
                holder = self._break_stale_lock()
                if holder is not None:
                    raise self.under_way(holder) from None
                continue
            self.held = True
            self.lock_etag = written.get("ETag") if isinstance(written, dict) else None
            self._probe()
            return
        raise ExportError(f"export to {self.output_path!r}: could not take the lock {self.lock} "
                          "(other exports kept taking it); nothing was written")

    def _probe(self) -> None:
        """Ask the store to create the lock once more: one that accepts ignored the
        condition (the lock's text is the same either way)."""
        if not self.exclusive:
            return
        try:
            self.fs.pipe_file(self.lock, self.owner.encode(), mode="create")
        except FileExistsError:
            return
        except Exception as exc:
            if _store_code(exc) == "ConditionalRequestConflict":
                return  # another export's exclusive write of the lock, in flight: honoured
            if not _cannot_ask(exc):
                raise
        self._not_exclusive("a second exclusive write of the lock was accepted")

    def lock_holder(self) -> tuple[str | None, Any]:
        """``(who holds the lock, the lock's listing info)``; who is None when no lock
        is there (info None too) or its owner is gone (dead, or stale by age)."""
        found = self._read_lock()
        if found is None:
            return None, None  # released meanwhile
        text, info = found
        m = _OWNER_TEXT.fullmatch(text)
        alive = owner_alive(m["host"], m["pid"], m["start"]) if m else None
        modified = _modified(info)
        age = time.time() - modified if modified is not None else 0.0
        if alive or (alive is None and age < STALE_SECONDS):
            who = (f"process {m['pid']} of {'this' if alive else 'another'} host") if m and m["pid"] \
                else "an unknown owner"
            return f"{who}, taken {int(age)} s ago", info
        return None, info

    def under_way(self, holder: str) -> FileExistsError:
        """The refusal of an export to a prefix whose lock ``holder`` holds."""
        return FileExistsError(
            f"{self.output_path!r}: another export to this prefix is under way (its lock "
            f"{self.lock} is held by {holder}); two exports to one prefix are never "
            "published together: wait for it to finish, then export again (with "
            "overwrite=True to replace it), or export to another prefix")

    def _break_stale_lock(self) -> str | None:
        """Delete the lock when its owner is gone: ``None`` (try again); else who holds it."""
        holder, info = self.lock_holder()
        if holder is not None or info is None:
            return holder
        self._delete_if_unchanged(self.lock, info)
        self.broke_lock = True
        return None

    def holds_lock(self) -> bool:
        return self._lock_text() == self.owner

    def release(self) -> None:
        """Delete the lock if it is still this export's: by the ETag it was written
        with (one request) where the store makes deletes conditional, else read first."""
        if not self.held:
            return
        self.held = False
        if self.lock_etag and self.exclusive:
            self._delete_if_unchanged(self.lock, {"ETag": self.lock_etag})
            return
        found = self._read_lock()
        if found is not None and found[0] == self.owner:
            self._delete_if_unchanged(self.lock, found[1])

    # -- the steps ----------------------------------------------------------------
    def _keys(self) -> set[str]:
        self.fs.invalidate_cache(self.root)
        try:
            return set(self.fs.find(self.root)) - {self.lock}
        except FileNotFoundError:
            return set()

    def begin(self) -> None:
        self._take_lock()
        try:
            self.old_keys = self._keys()
            self.existed = bool(self.old_keys)
            if self.existed and not self.overwrite:
                why = ("an export to it was killed and left them" if self.broke_lock else
                       "another export to it finished first, or they were put there meanwhile")
                raise FileExistsError(f"{self.output_path!r} already exists; pass overwrite=True to "
                                      f"replace it (it holds keys: {why})")
            self.abort_uploads()
            # names of its own wherever another writer's files could have the same: over an
            # export, after a holder taken for dead (were it alive after all), on a store
            # that cannot exclude a second writer
            if self.existed or self.broke_lock or not self.exclusive:
                self.file_tag = f"-{self.export_id[:8]}"
            for name in SIDECARS:
                path = posixpath.join(self.root, name)
                if path in self.old_keys:
                    self.saved[name] = self.fs.cat_file(path)
            manifest = posixpath.join(self.root, MANIFEST_FILE)
            if manifest in self.old_keys:
                self.fs.rm(manifest)
        except BaseException:
            self.release()
            raise

    def abort_uploads(self) -> list[str]:
        """Abort the multipart uploads left under the prefix (S3): a killed export's
        unfinished files, invisible to listings but stored and billed until aborted.
        This export holds the prefix's lock (it is new, or ``overwrite`` was given),
        so every unfinished upload under it is a leftover. Where the store
        refuses to list or abort them, a warning names the lifecycle rule that does it
        (see docs/scaling-out.md). Returns the aborted keys."""
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        if protocol not in ("s3", "s3a") or not hasattr(self.fs, "call_s3"):
            return []
        bucket, _, key = self.root.partition("/")
        prefix = key.rstrip("/") + "/" if key else ""
        aborted = []
        try:
            listing = {"Bucket": bucket, "Prefix": prefix}
            while True:
                page = self.fs.call_s3("list_multipart_uploads", **listing)
                for upload in page.get("Uploads", []):
                    self.fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"],
                                    UploadId=upload["UploadId"])
                    aborted.append(upload["Key"])
                if not page.get("IsTruncated"):
                    break
                listing.update(KeyMarker=page.get("NextKeyMarker", ""),
                               UploadIdMarker=page.get("NextUploadIdMarker", ""))
        except Exception as exc:  # permissions, a store without the call: say what to do
            warnings.warn(
                f"export to 's3://{self.root}': unfinished multipart uploads of killed exports under "
                f"this prefix could not be listed or aborted ({exc}); they stay stored (and billed) "
                "until aborted: give the bucket a lifecycle rule with AbortIncompleteMultipartUpload "
                "(DaysAfterInitiation: 1), see docs/scaling-out.md", stacklevel=4)
        return aborted

    def _written(self, held: bool) -> list[str]:
        """The data keys this export wrote (not the sidecars): new since :meth:`begin`,
        another writer's seen by :meth:`finish` left out, and carrying its file tag
        when it has one. Untagged while it holds the lock, every new key; after losing
        the lock, only names without a tag (the export that took the lock over from
        one taken for dead tags its own)."""
        sidecars = {posixpath.join(self.root, name) for name in SIDECARS}
        keys = self._keys() - self.old_keys - sidecars - self.foreign
        if self.file_tag:
            return sorted(k for k in keys if self.file_tag in k[len(self.root):])
        if held:
            return sorted(keys)
        return sorted(k for k in keys if _UNTAGGED.fullmatch(posixpath.basename(k)))

    def remove_written(self) -> None:
        """Delete the keys this export wrote so far (to write them again)."""
        written = self._written(held=True)
        if written:
            self.fs.rm(written)

    def check_held(self) -> None:
        """Before the sidecars are written: the lock must still be this export's."""
        text = self._lock_text()
        if text != self.owner:
            raise ExportError(
                f"export to {self.output_path!r} failed, nothing was published: its lock {self.lock} "
                f"was {'removed' if text is None else 'taken by another export'} while it wrote (a "
                "lock broken as stale, or a store that ignores exclusive writes); its files are "
                "removed: export again, one export per prefix at a time",
                hint="run one export to a prefix at a time")

    def manifest_fields(self) -> dict[str, Any]:
        return {"export_id": self.export_id}

    def finish(self, files: list[str]) -> None:
        """After the manifest: the prefix must hold this export's keys, the old ones it
        replaces and nothing else, under this export's manifest; then the replaced keys
        are deleted and the lock released."""
        sidecars = {posixpath.join(self.root, name) for name in SIDECARS}
        expected = sidecars | self.old_keys
        for name in files:
            expected |= {posixpath.join(self.root, name), posixpath.join(self.root, "_keysets", name)}
        foreign = sorted(self._keys() - expected)
        self.foreign = set(foreign)
        manifest = _export_manifest(self.fs, self.root) or {}
        if foreign or manifest.get("export_id") != self.export_id:
            shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
            raise ExportError(
                f"export to {self.output_path!r} failed, nothing was published: another writer put "
                f"keys under the prefix while this export ran ({shown or 'its own _manifest.json'}); "
                "the files of two writers cannot be published as one: export again, one export per "
                "prefix at a time", hint="run one export to a prefix at a time")
        stale = sorted(self.old_keys - sidecars)
        if stale:
            self.fs.rm(stale)
        self.release()
        self.fs.invalidate_cache(self.root)

    def abort(self) -> None:
        """After a failure: this export's keys go (not those another export's manifest,
        in place, names); an overwrite's old sidecars come back (unless another export's
        manifest is in place); the lock is released."""
        held = self.holds_lock()
        self.fs.invalidate_cache(self.root)
        manifest = _export_manifest(self.fs, self.root)
        theirs = manifest is not None and manifest.get("export_id") != self.export_id
        if manifest is not None and theirs:
            self.foreign |= {posixpath.join(self.root, folder, name) for name in _export_entries_files(manifest)
                             for folder in ("", "_keysets")}
        written = self._written(held)
        if written:
            self.fs.rm(written)
        if held and not theirs:
            keys = self._keys()
            for name in SIDECARS:  # the manifest last
                path = posixpath.join(self.root, name)
                if name in self.saved:
                    self.fs.pipe_file(path, self.saved[name])
                elif path in keys:
                    self.fs.rm(path)
        self.release()
        self.fs.invalidate_cache(self.root)


def publish(fs: Any, tmp: str, root: str, overwrite: bool, output_path: str) -> None:
    """Move the finished folder ``tmp`` to ``root`` on a local disk, atomically.

    One ``rename(2)``, which fails when ``root`` exists (a folder with files:
    ENOTEMPTY; a file: ENOTDIR), so that of two exports racing for one path, one
    wins and the other gets :class:`FileExistsError`: never one inside the other
    (a move onto an existing folder puts the source inside it). With ``overwrite``
    the folder in place is renamed aside (``.<name>.old-...``) and ``tmp`` renamed in;
    when another export put its folder in place between the two renames, that one is
    renamed aside too and this one tried again: the last writer wins whole. The
    folders renamed aside are removed once the new export is in place; when the
    rename in fails otherwise, the previous export is put back."""
    parent, name = posixpath.split(root)
    aside: list[str] = []
    try:
        for _ in range(64):
            try:
                os.rename(tmp, root)
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR):
                    raise
            if not overwrite:
                raise FileExistsError(f"{output_path!r} appeared while exporting (another export "
                                      "to the same path finished first); pass overwrite=True to "
                                      "replace it")
            old = posixpath.join(parent, f".{name}.old-{owner_tag()}-{uuid.uuid4().hex[:12]}")
            try:
                os.rename(root, old)
            except FileNotFoundError:
                continue  # another export renamed it aside first
            aside.append(old)
        raise ExportError(f"export to {output_path!r}: other exports kept replacing the folder; "
                          "nothing was written")
    except BaseException:
        if aside and not os.path.lexists(root):
            try:
                os.rename(aside[-1], root)  # put the previous export back
                aside.pop()
            except OSError:
                pass  # it stays aside, named with its owner; the original error is raised
        raise
    finally:
        for old in aside:
            try:
                fs.rm(old, recursive=True)
            except OSError:
                pass  # the next export here removes it (its owner gone)


def _export_entries(manifest: dict) -> set[str]:
    """The names in its folder that an export (its ``_manifest.json`` read) owns."""
    owned = {SCHEMA_FILE, "_metadata", MANIFEST_FILE, "_keysets"}
    for entry in manifest.get("files", []):
        if isinstance(entry, dict) and isinstance(entry.get("path"), str):
            owned.add(entry["path"].split("/")[0])
    return owned


def _export_entries_files(manifest: dict) -> list[str]:
    """The data files an export's manifest lists (paths inside its folder)."""
    return [e["path"] for e in manifest.get("files", [])
            if isinstance(e, dict) and isinstance(e.get("path"), str)]


def _export_manifest(fs: Any, folder: str) -> dict | None:
    """``folder/_manifest.json`` when it is an export's (it lists ``files``); ``None``
    without one, or for another tool's file of that name (refused at publish as a
    file in the way)."""
    try:
        # a newer tabstream's export is an export too: replaced whole with overwrite
        manifest = _manifest_json(fs, folder, check_format=False)
    except DataError:
        return None
    return manifest if manifest is not None and isinstance(manifest.get("files"), list) else None


def refuse_input_overlap(fs: Any, root: str, output_path: str, input_fs: Any, inputs: list[str]) -> None:
    """Refuse an export to ``root`` that is one of its own input files or a folder
    holding one: replaced, the input is gone; exported into, the folder's readers
    read the export alone and the input drops out of sight. Checked before any
    work, whatever ``overwrite`` says (it is for replacing earlier exports)."""
    if input_fs is None or not inputs or getattr(input_fs, "protocol", None) != getattr(fs, "protocol", None):
        return
    if is_local(fs):
        def norm(p: str) -> str:
            return os.path.realpath(p)
        sep = os.sep
    else:
        def norm(p: str) -> str:
            # the dataset keeps its files as URLs; a store reads "a//b" as "a/b"
            return re.sub("/+", "/", p.split("://", 1)[-1]).rstrip("/")
        sep = "/"
    target = norm(root)
    inside = [f for f in inputs if norm(f) == target or norm(f).startswith(target.rstrip(sep) + sep)]
    if inside:
        what = ("is the input file" if norm(inside[0]) == target
                else f"is a folder holding the input {listed(inside)}")
        raise FileExistsError(
            f"cannot export to {output_path!r}: it {what} of this export; the export would "
            "replace or hide what it reads (overwrite=True replaces earlier exports, not the "
            "input); write to another path")


def check_target(fs: Any, root: str, output_path: str, overwrite: bool) -> str:
    """How an export goes to ``root``: ``"new"`` (absent, or an empty folder, which is
    removed; or replaced whole with ``overwrite``: a file, or a folder holding one
    export and nothing else) or ``"into"`` (a local folder that holds other files: the
    export is published into it, see :class:`PublishInto`). A folder holding an export
    needs ``overwrite``; so does any existing ``root`` on an object store, also one
    holding an export's lock beside other keys (a killed export's, or one under way);
    a lock alone, or one with ``overwrite``, :meth:`ObjectStorePublish.begin` decides
    (the export under way refuses this one; a dead one's lock is broken)."""
    if not is_local(fs):
        fs.invalidate_cache(root)  # another export of this process may have written since
    if not fs.exists(root):
        return "new"
    if not is_local(fs) and fs.isdir(root):
        lock = posixpath.join(root, LOCK_FILE)
        keys = {e.rstrip("/") for e in fs.ls(root, detail=False)}
        if lock in keys:
            if keys - {lock} and not overwrite:
                # what begin() refuses, refused before any work (the CLI asks before
                # fitting): keys beside a lock, of an export under way or a killed one
                publish = ObjectStorePublish(fs, root, output_path, overwrite)
                holder, _ = publish.lock_holder()
                if holder is not None:
                    raise publish.under_way(holder)
                raise FileExistsError(
                    f"{output_path!r} already exists; pass overwrite=True to replace it (it holds "
                    f"keys an export to it left when it was killed, beside its lock {LOCK_FILE})")
            return "new"
    if fs.isdir(root) and not fs.ls(root):
        if overwrite:
            return "new"
        if not is_local(fs):
            fs.rm(root, recursive=True)
            return "new"
        try:
            os.rmdir(root)  # not rm -r: another export may have renamed its folder in since
            return "new"
        except FileNotFoundError:
            return "new"
        except OSError:
            pass  # not empty now: another export got there first; refused below
        raise FileExistsError(f"{output_path!r} already exists; pass overwrite=True to replace it")
    if not is_local(fs) or not fs.isdir(root):
        if overwrite:
            return "new"
        note = ""
        if not is_local(fs) and not fs.exists(posixpath.join(root, MANIFEST_FILE)):
            note = (" (on an object store an export is not published into a prefix that holds "
                    "other keys, as there is no rename to do it safely: give it a prefix of its own)")
        raise FileExistsError(f"{output_path!r} already exists; pass overwrite=True to replace it{note}")
    names = set(os.listdir(root))
    manifest = _export_manifest(fs, root) if MANIFEST_FILE in names else None
    if manifest is not None and names <= _export_entries(manifest):
        if overwrite:
            return "new"  # one export and nothing else: replaced whole (publish)
        raise FileExistsError(
            f"{output_path!r} already exists; pass overwrite=True to replace it: it holds a "
            f"tabstream export ({MANIFEST_FILE}), and an export is never added to another (the "
            "files of both would be read as one data set)")
    return "into"


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):  # gone already: what was asked
            os.unlink(path)


_OWNER_TEXT = owner_pattern("", r"[0-9a-f]{12}")  # the text of a lock

# names of this module's own scratch entries inside a folder published into: removed
# once their owner is gone (a killed export's temporary folder, its lock's draft)
_SCRATCH = owner_pattern(r"\.tabstream-(?:tmp|old|lock)-", r"[0-9a-f]{12}")


class PublishInto:
    """Publishing an export into an existing local folder that holds other files.

    The user's files stay; the export's own files are written into a hidden folder
    inside (``.tabstream-tmp-<owner>-<id>``, on the folder's filesystem), then moved
    in one rename each, ``_manifest.json`` last. ``_manifest.json`` lists the other
    entries as ``others``: readers of the folder read the manifest's files only
    (:func:`drop_other_files`). Steps and their safety:

    * :meth:`begin`: the lock ``.tabstream-export.lock`` is made with a link (fails
      when it exists; its text names the owner). A lock whose owner is gone (see
      :mod:`tabstream.core.scratch`) is broken; a live one makes this export fail at
      once, leaving nothing of its own: one export into a folder at a time. Under the
      lock an interrupted publish is undone (:meth:`recover`); a previous export in the
      folder needs ``overwrite``.
    * :meth:`finish`: a name of the export that the folder holds, not of a previous
      export, is refused (nothing moved). The journal ``.tabstream-publish.json``
      (the names to move in, the previous export's names, the folder they go aside
      to) is written before anything moves; while it is there readers refuse the
      folder (:func:`refuse_interrupted`). Then the previous export's manifest and
      files go aside (``.tabstream-old-...``), the new files move in, the new
      manifest last, and the journal is removed.
    * a failure part-way puts everything back (:meth:`recover`); after a kill -9 the
      next export into the folder does it.
    """

    def __init__(self, fs: Any, root: str, output_path: str, overwrite: bool) -> None:
        self.fs = fs
        self.root = root
        self.output_path = output_path
        self.overwrite = overwrite
        self.lock = posixpath.join(root, LOCK_FILE)
        self.journal = posixpath.join(root, JOURNAL_FILE)
        self.owner = f"{owner_tag()}-{uuid.uuid4().hex[:12]}"
        self.export_id = uuid.uuid4().hex
        self.held = False
        self.previous: set[str] = set()
        self.previous_id: str | None = None
        self.tmp = posixpath.join(root, f".tabstream-tmp-{self.owner}")

    # -- the lock -------------------------------------------------------------
    def _take_lock(self) -> None:
        draft = posixpath.join(self.root, f".tabstream-lock-{self.owner}")
        with open(draft, "w") as f:
            f.write(self.owner)
        try:
            for _ in range(8):
                try:
                    os.link(draft, self.lock)  # whole, or not at all: fails when it exists
                    self.held = True
                    return
                except FileExistsError:
                    holder = self._break_stale_lock()
                    if holder is not None:
                        raise FileExistsError(
                            f"{self.output_path!r}: another export into this folder is under way "
                            f"(its lock {self.lock} is held by {holder}); exports into a folder "
                            "that holds other files run one at a time: wait for it, or export "
                            "into another folder") from None
            raise ExportError(f"export to {self.output_path!r}: could not take the lock {self.lock} "
                              "(other exports kept taking it); nothing was written")
        finally:
            os.unlink(draft)

    def _break_stale_lock(self) -> str | None:
        """Remove the lock when its owner is gone: ``None`` (try again); else who holds it."""
        try:
            with open(self.lock) as f:
                text = f.read().strip()
            age = time.time() - os.stat(self.lock).st_mtime
        except FileNotFoundError:
            return None
        m = _OWNER_TEXT.fullmatch(text)
        alive = owner_alive(m["host"], m["pid"], m["start"]) if m else None
        who = f"process {m['pid']}" + ("" if alive is not None else " of another host") if m and m["pid"] \
            else "an unknown owner"
        if alive or (alive is None and age < STALE_SECONDS):
            return who
        aside = posixpath.join(self.root, f".tabstream-lock-{owner_tag()}-{uuid.uuid4().hex[:12]}")
        try:
            os.rename(self.lock, aside)
        except FileNotFoundError:
            return None
        with open(aside) as f:
            taken = f.read().strip()
        if taken != text:  # a live export took the lock between the read and the rename
            try:
                os.link(aside, self.lock)  # put it back
            except FileExistsError:
                pass  # a third export took the lock meanwhile: it holds the folder now
            os.unlink(aside)
            return "another export"
        os.unlink(aside)
        return None

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:
            with open(self.lock) as f:
                mine = f.read().strip() == self.owner
            if mine:
                os.unlink(self.lock)
        except FileNotFoundError:
            pass  # removed already (broken as stale by another export): nothing held

    # -- the steps ------------------------------------------------------------
    def begin(self) -> str:
        """Take the lock, undo an interrupted publish, check for a previous export;
        the temporary folder to write in."""
        self._take_lock()
        try:
            self.recover()
            remove_leftovers(self.fs, self.root, _SCRATCH)
            manifest = _export_manifest(self.fs, self.root)
            if manifest is not None:
                if not self.overwrite:
                    raise FileExistsError(
                        f"{self.output_path!r} already exists; pass overwrite=True to replace it: it "
                        f"holds a tabstream export ({MANIFEST_FILE}) beside other files (they stay), and "
                        "an export is never added to another (the files of both would be read as one "
                        "data set)")
                self.previous = _export_entries(manifest) & set(os.listdir(self.root))
                self.previous_id = manifest.get("export_id")
            os.mkdir(self.tmp)
        except BaseException:
            self.release()
            raise
        return self.tmp

    def _in_the_way(self, names: set[str]) -> None:
        theirs = set(os.listdir(self.root)) - self.previous
        clash = sorted(n for n in names | {MANIFEST_FILE} if n in theirs)
        if clash:
            raise FileExistsError(
                f"export into {self.output_path!r}: {posixpath.join(self.root, clash[0])} is in the way: "
                f"the export writes a file of that name, and this one is not part of a tabstream "
                f"export (it would be replaced); move or rename it, or export into another folder")

    def check_names(self, names: set[str]) -> None:
        """Refuse, before anything is written, names already known to be in the way."""
        self._in_the_way(names)

    def manifest_fields(self, names: set[str]) -> dict[str, Any]:
        """``export_id`` and ``others`` (the folder's entries that are not this export's)."""
        self._in_the_way(names)
        skip = names | self.previous | {MANIFEST_FILE}
        others = sorted(n for n in os.listdir(self.root)
                        if n not in skip and not n.startswith(".tabstream-"))
        return {"export_id": self.export_id, "others": others}

    def finish(self) -> None:
        """Move the export's files from the temporary folder into place, manifest last."""
        # the data files first, then the other sidecars, the manifest last
        names = sorted((n for n in os.listdir(self.tmp) if n != MANIFEST_FILE),
                       key=lambda n: (n.startswith("_"), n))
        self._in_the_way(set(names))
        aside = posixpath.join(self.root, f".tabstream-old-{self.owner}")
        write_json_file(self.journal, {"format": "tabstream.publish", "owner": self.owner,
                                      "export_id": self.export_id, "replaces": self.previous_id,
                                      "moving": names, "previous": sorted(self.previous),
                                      "aside": posixpath.basename(aside), "tmp": posixpath.basename(self.tmp)})
        try:
            if self.previous:
                os.mkdir(aside)
                ordered = [MANIFEST_FILE] + sorted(self.previous - {MANIFEST_FILE})
                for name in ordered:  # the manifest first: from here readers refuse it
                    if os.path.lexists(posixpath.join(self.root, name)):
                        os.rename(posixpath.join(self.root, name), posixpath.join(aside, name))
            for name in names:
                os.rename(posixpath.join(self.tmp, name), posixpath.join(self.root, name))
            os.rename(posixpath.join(self.tmp, MANIFEST_FILE), posixpath.join(self.root, MANIFEST_FILE))
        except BaseException:
            self.recover()
            raise
        os.unlink(self.journal)
        for leftover in (aside, self.tmp):
            if os.path.lexists(leftover):
                _remove(leftover)

    def abort(self) -> None:
        """After a failure: the temporary folder goes, the lock is released."""
        try:
            if os.path.lexists(self.tmp):
                _remove(self.tmp)
        finally:
            self.release()

    def recover(self) -> list[str]:
        """Undo the publish a journal describes (this export's after a failure, or a
        killed one's, found under the lock): a publish whose manifest is in place is
        complete (only its leftovers go); otherwise the names it moved in are removed
        and the previous export's put back, manifest last. Returns the names removed."""
        try:
            with open(self.journal) as f:
                journal = loads_json(f.read(), self.journal, "export journal")
            moving = [str(n) for n in journal["moving"]]
            previous = [str(n) for n in journal["previous"]]
            aside = posixpath.join(self.root, str(journal["aside"]))
            tmp = posixpath.join(self.root, str(journal["tmp"]))
        except FileNotFoundError:
            return []
        except (ValueError, KeyError, TypeError) as exc:
            raise ExportError(f"{self.journal}: not a valid export journal ({exc!r}); an export into "
                              f"{self.root} was interrupted and its files cannot be told from others: "
                              "look at the folder, remove the export's files and the journal") from exc
        removed = []
        manifest = _manifest_json(self.fs, self.root, check_format=False) if os.path.exists(
            posixpath.join(self.root, MANIFEST_FILE)) else None
        done = manifest is not None and manifest.get("export_id") == journal.get("export_id")
        if not done:
            for name in moving + [MANIFEST_FILE]:
                if name in previous and not os.path.lexists(posixpath.join(aside, name)):
                    continue  # the previous export's, not moved aside yet: it stays
                path = posixpath.join(self.root, name)
                if os.path.lexists(path):
                    _remove(path)
                    removed.append(name)
            back = [n for n in previous if n != MANIFEST_FILE] + [MANIFEST_FILE]
            for name in back:  # the manifest last
                if os.path.lexists(posixpath.join(aside, name)):
                    os.rename(posixpath.join(aside, name), posixpath.join(self.root, name))
        os.unlink(self.journal)
        for leftover in (aside, tmp):
            if leftover != self.tmp and os.path.lexists(leftover):
                _remove(leftover)
        return removed


def remove_export_leftovers(fs: Any, parent: str, name: str) -> list[str]:
    """Remove the hidden folders that killed exports to ``parent/name`` left behind
    (see :func:`tabstream.core.scratch.remove_leftovers`: removed when their owner
    is dead). An ``.old-`` folder (a replaced export) is removed only when the new
    export is in place. Returns the removed paths."""
    pattern = owner_pattern(rf"\.{re.escape(name)}\.(?P<kind>tmp|old)-", r"[0-9a-f]{12}")
    root = posixpath.join(parent, name)

    def keep(m: re.Match[str]) -> bool:
        # killed between the two renames of an overwrite: the old export may be all there is
        return m["kind"] == "old" and not fs.exists(root)

    return remove_leftovers(fs, parent, pattern, keep)

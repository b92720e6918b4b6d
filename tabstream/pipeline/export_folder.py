"""The export folder's format, written and read in one place.

An export folder holds parquet data files and, beside them, files whose names start
with ``_`` (so other readers take the folder as it is)::

    _schema.json      the output Schema (``schema.json`` in older exports, still read)
    _metadata         the parquet footers of every data file
    _manifest.json    {"num_rows": N, "files": [{"path", "num_rows"}], ...}: written
                      last, the mark that the export is complete

Every data file also carries the Schema in its key-value metadata (:data:`SCHEMA_KEY`).
This module writes those files (:func:`write_sidecars`), puts a finished folder in
place (:func:`publish` on a local disk, :class:`ObjectStorePublish` where there is no
rename) and checks a folder read back against them (:func:`check_manifests`,
:func:`refuse_unpublished`, :func:`read_schema_json`, :func:`check_schema_file`).
The writer is :mod:`tabstream.pipeline.export`, the reader
:class:`~tabstream.pipeline.dataset.Dataset`.
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import re
import uuid
import warnings
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import tabstream
from tabstream.core.errors import DataError, ExportError
from tabstream.core.jsonfile import loads_json, read_json_file
from tabstream.core.schema import Schema
from tabstream.core.scratch import owner_pattern, owner_tag, remove_leftovers
from tabstream.pipeline.stores import is_local

__all__ = ["MANIFEST_FILE", "ObjectStorePublish", "SCHEMA_FILE", "SCHEMA_KEY", "SIDECARS",
           "check_manifests", "check_schema_file", "check_target", "publish", "read_schema_json",
           "refuse_unpublished", "remove_export_leftovers", "write_sidecars"]

SCHEMA_FILE = "_schema.json"
# Key of the parquet key-value metadata that holds the output Schema as JSON in every
# data file, so a reader that has only the files still gets tags and properties.
SCHEMA_KEY = b"tabstream.schema"


MANIFEST_FILE = "_manifest.json"
_MANIFEST_HINT = ("the export folder was changed after it was written: write it again "
                  "(tabstream fit/transform, or to_parquet) rather than editing its files")


def _read_manifest(fs: Any, folder: str) -> dict[str, int] | None:
    """``{file path: rows}`` from ``folder/_manifest.json``; ``None`` without one."""
    path = posixpath.join(folder, MANIFEST_FILE)
    if not fs.exists(path):
        return None
    try:
        entries = read_json_file(path, "export manifest", fs)["files"]
        return {posixpath.join(folder, e["path"]): int(e["num_rows"]) for e in entries}
    except DataError:
        raise
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a valid export manifest ({exc!r}); expected "
                        '{"files": [{"path": ..., "num_rows": ...}, ...]}') from exc


def check_manifests(fs: Any, files: list[str], folders: list[tuple[str, Any]], rows: dict[str, int]) -> None:
    """An export's files must be the ones its ``_manifest.json`` lists, with the rows it
    lists: a deleted, truncated, replaced or extra file fails here instead of silently
    changing the data. A folder searched must hold exactly the files of each manifest
    in it (nested exports included); a glob must find every manifest entry it matches;
    each file is checked against the manifest of its nearest folder."""
    stripped = {fs._strip_protocol(f): f for f in files}
    manifests: dict[str, dict[str, int] | None] = {}
    for folder, pattern in folders:
        if folder not in manifests:
            manifests[folder] = _read_manifest(fs, folder)
        manifest = manifests[folder]
        if manifest is None:
            continue
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
        manifest = manifests[folder]
        if manifest is None:
            continue
        where = posixpath.join(folder, MANIFEST_FILE)
        if path not in manifest:
            raise DataError(
                f"{url}: not listed in {where} (found {rows[url]} rows, expected no such file); "
                "remove the extra file or export again", hint=_MANIFEST_HINT
            )
        if manifest[path] != rows[url]:
            raise DataError(
                f"{url}: {where} lists {manifest[path]} rows, found {rows[url]} rows; the file "
                "was replaced or truncated after the export: export again", hint=_MANIFEST_HINT
            )


def refuse_unpublished(fs: Any, files: list[str], schemas: list[pa.Schema]) -> None:
    """On an object store an export publishes by writing ``_manifest.json`` last (there
    is no rename): files written by a tabstream export (their key-value metadata holds
    ``tabstream.schema``) in a prefix without a manifest belong to an export that is
    still running or failed, and are refused rather than read half-written."""
    checked: dict[str, bool] = {}
    for url, schema in zip(files, schemas, strict=True):
        if SCHEMA_KEY not in (schema.metadata or {}):
            continue
        folder = posixpath.dirname(fs._strip_protocol(url))
        if folder not in checked:
            checked[folder] = fs.exists(posixpath.join(folder, MANIFEST_FILE))
        if not checked[folder]:
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


def read_schema_json(fs: Any, files: list[str]) -> Schema | None:
    """tabstream exports keep tags and properties in ``_schema.json`` beside the
    files (``schema.json`` in exports of older versions, still read)."""
    folder = posixpath.dirname(fs._strip_protocol(files[0]))
    for filename in ("_schema.json", "schema.json"):
        candidate = posixpath.join(folder, filename)
        if fs.exists(candidate):
            break
    else:
        return None
    with fs.open(candidate, "r") as f:
        try:
            return Schema.from_dict(loads_json(f.read(), candidate, "schema file"))
        except DataError:
            raise
        except (ValueError, KeyError) as exc:
            raise DataError(f"{candidate}: not a valid tabstream schema: {exc}") from exc


# -- writing and publishing ----------------------------------------------------
def write_sidecars(fs: Any, tmp: str, schema: Schema, files: list[str], rows: list[int]) -> None:
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
        "format": "tabstream.export",
        "tabstream_version": tabstream.__version__,
        "num_rows": int(sum(rows)),
        "files": [{"path": f, "num_rows": int(n)} for f, n in zip(files, rows)],
    }
    # The manifest is written last: its presence inside the folder marks it complete.
    with fs.open(posixpath.join(tmp, MANIFEST_FILE), "w") as f:
        json.dump(manifest, f, indent=2)


SIDECARS = (SCHEMA_FILE, "_metadata", MANIFEST_FILE)  # restored in this order


class ObjectStorePublish:
    """Publishing on an object store (S3, GCS, ...), where no rename exists.

    Data files are written under the final prefix and ``_manifest.json`` last: its
    arrival marks the export complete, and readers refuse tabstream files in a
    prefix without one. With ``overwrite`` the new files get names of their own
    (``part_00000-<id>.parquet``), the old manifest is removed first (from then until
    the new manifest the prefix is refused: the window of an overwrite), and the old
    keys are deleted only once the new manifest is in place. A failure deletes every
    key this export wrote and, for an overwrite, puts the old ``_schema.json``,
    ``_metadata`` and ``_manifest.json`` back (manifest last): the old export is
    whole again. A killed process leaves a prefix without a manifest (refused)."""

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = root
        self.old_keys: set[str] = set()
        self.saved: dict[str, bytes] = {}
        self.existed = False
        self.file_tag = ""

    def _keys(self) -> set[str]:
        self.fs.invalidate_cache(self.root)
        try:
            return set(self.fs.find(self.root))
        except FileNotFoundError:
            return set()

    def begin(self) -> None:
        self.abort_uploads()
        self.old_keys = self._keys()
        self.existed = bool(self.old_keys)
        if not self.existed:
            return
        self.file_tag = f"-{uuid.uuid4().hex[:8]}"
        for name in SIDECARS:
            path = posixpath.join(self.root, name)
            if path in self.old_keys:
                self.saved[name] = self.fs.cat_file(path)
        manifest = posixpath.join(self.root, MANIFEST_FILE)
        if manifest in self.old_keys:
            self.fs.rm(manifest)

    def abort_uploads(self) -> list[str]:
        """Abort the multipart uploads left under the prefix (S3): a killed export's
        unfinished files, invisible to listings but stored and billed until aborted.
        This export owns the prefix from here (it is new, or ``overwrite`` was
        given), so every unfinished upload under it is a leftover. Where the store
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

    def remove_written(self) -> None:
        """Delete the keys this export wrote so far (to write them again)."""
        written = sorted(self._keys() - self.old_keys)
        if written:
            self.fs.rm(written)

    def finish(self) -> None:
        keep = {posixpath.join(self.root, name) for name in SIDECARS}
        stale = sorted(self.old_keys - keep)
        if stale:
            self.fs.rm(stale)
        self.fs.invalidate_cache(self.root)

    def abort(self) -> None:
        written = sorted(self._keys() - self.old_keys)
        if written:
            self.fs.rm(written)
        for name in SIDECARS:
            path = posixpath.join(self.root, name)
            if name in self.saved:
                self.fs.pipe_file(path, self.saved[name])
            elif path in self._keys():
                self.fs.rm(path)
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


def check_target(fs: Any, root: str, output_path: str, overwrite: bool) -> None:
    """Refuse an existing ``root`` unless ``overwrite`` (an empty folder is removed)."""
    if fs.exists(root) and not overwrite:
        if fs.isdir(root) and not fs.ls(root):
            if not is_local(fs):
                fs.rm(root, recursive=True)
                return
            try:
                os.rmdir(root)  # not rm -r: another export may have renamed its folder in since
                return
            except FileNotFoundError:
                return
            except OSError:
                pass  # not empty now: another export got there first; refused below
        raise FileExistsError(f"{output_path!r} already exists; pass overwrite=True to replace it")


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

"""Sources, paths and globs: which files a ``Dataset(path)`` reads.

A path is a file, a folder, a glob or a list of them, local or any fsspec URL
(:func:`expand_paths`). A folder's data are its own files, its hive partition folders
(``col=value``, whose values become columns: :func:`hive_partitions`) and the exports
nested in it (subfolders with a ``_manifest.json``); other subfolders are left out
with a :class:`~tabstream.core.errors.DatasetWarning`. The files an export's
manifest lists as ``others`` (a user's files beside an export published into their
folder) are never read as its data, by a folder or a glob. The format is given or told
from the extension (:func:`infer_engine`).
"""

from __future__ import annotations

import collections
import posixpath
import re
import warnings
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
from fsspec.core import get_fs_token_paths
from fsspec.utils import glob_translate

from tabstream.core.errors import DataError, DatasetWarning
from tabstream.pipeline import stores
from tabstream.pipeline.export_folder import (
    JOURNAL_FILE,
    MANIFEST_FILE,
    drop_other_files,
    refuse_interrupted,
)
from tabstream.pipeline.stores import is_local

__all__ = ["expand_paths", "first_path", "hive_partitions", "infer_engine"]

_PARQUET_EXT = (".parquet", ".pq", ".parq")


_CSV_EXT = (".csv", ".tsv", ".txt", ".csv.gz", ".tsv.gz")


def first_path(path: Any) -> str:
    """The path (the first of a list) errors of a store name."""
    if isinstance(path, (list, tuple)):
        return str(path[0]) if path else ""
    return str(path) if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__") else ""


def expand_paths(path: Any, storage_options: dict,
                  engine: str | None) -> tuple[Any, list[str], list[tuple[str, Any]]]:
    """The filesystem, the files, and the folders whose ``_manifest.json`` (if any)
    fixes which files must be there: ``(folder, None)`` for a folder searched (and
    each export nested in it), ``(folder, regex)`` for one a glob reaches, where only
    the entries the pattern matches must be there."""
    paths = [path] if isinstance(path, (str, bytes)) or hasattr(path, "__fspath__") else list(path)
    if not paths:
        raise FileNotFoundError("Dataset got an empty list of paths")
    paths = [str(p) for p in paths]
    fs, _, _ = get_fs_token_paths(paths[0], storage_options=stores.store_options(paths[0], storage_options))
    # the store as it is now, not as this process listed it before (fsspec keeps one
    # filesystem, and its listings, per set of options)
    stores.forget_listings(fs, paths)
    files: list[str] = []
    folders: list[str] = []
    for p in paths:
        stripped = fs._strip_protocol(p)
        if any(ch in p for ch in "*?["):
            matched = sorted(fs.glob(stripped))
            # Every manifest in a folder the pattern reaches: an entry the pattern
            # matches must be among the files (``out/*.parquet`` reads a whole export).
            pattern = re.compile(glob_translate(stripped))
            reached = sorted(fs.glob(posixpath.join(posixpath.dirname(stripped), MANIFEST_FILE)))
            if not matched and not reached:
                raise FileNotFoundError(f"no files match {p!r}")
            # a user's files beside an export published into their folder are not its data
            matched = drop_other_files(fs, matched, reached)
            files.extend(m for m in matched if fs.isfile(m))
            folders.extend((posixpath.dirname(m), pattern) for m in reached)
        elif fs.isdir(stripped):
            root = stripped.rstrip("/") or "/"
            every = fs.find(stripped)
            if posixpath.join(root, JOURNAL_FILE) in every:
                refuse_interrupted(fs, root)  # before anything is read or warned about
            every = drop_other_files(fs, every, [f for f in every if posixpath.basename(f) == MANIFEST_FILE])
            # Exports nested in the folder (root/train, root/valid) are checked too.
            found, nested, skipped = _folder_data(root, every, engine)
            if skipped and (found or nested):
                warnings.warn(_skipped_message(p, skipped, engine), DatasetWarning, stacklevel=4)
            if not found and not nested and not fs.exists(posixpath.join(stripped, MANIFEST_FILE)):
                wanted = {"parquet": " (looked for .parquet files)", "csv": " (looked for .csv/.tsv files)"}
                if skipped:
                    raise FileNotFoundError(_skipped_message(p, skipped, engine, none_left=True))
                raise FileNotFoundError(f"folder {p!r} holds no data files{wanted.get(engine or '', '')}")
            files.extend(found)
            folders.append((root, None))
            folders.extend((folder, None) for folder in nested)
        elif fs.exists(stripped):
            files.append(stripped)
        else:
            raise FileNotFoundError(f"no such file or folder: {p!r}{_missing_bucket(fs, stripped)}")
    twice = sorted(f for f, n in collections.Counter(files).items() if n > 1)
    if twice:
        raise ValueError(f"{twice[0]}: picked more than once by the paths {paths}; each file would be "
                         "read (and counted) once per time it is picked: give each file once")
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    if protocol not in ("file", "local"):
        files = [f if "://" in f else f"{protocol}://{f}" for f in files]
    return fs, files, folders


def _folder_data(root: str, every: list[str], engine: str | None
                 ) -> tuple[list[str], list[str], dict[str, int]]:
    """What ``Dataset(root)`` reads of the files ``every`` below ``root``: its data
    files, the exports nested in it, and the subfolders it leaves out (with the data
    files each holds).

    A folder's data are its own files, those of its hive partition folders
    (``col=value``, at any depth) and those of the exports in it (subfolders holding a
    ``_manifest.json``, read by the same rule). Any other subfolder is not data: a
    side output such as ``write_data(..., return_probability=True)``'s
    ``probabilities/`` holds other columns, and read as data it would add rows. Names
    starting with ``_`` or ``.`` are never data."""
    exports = {posixpath.dirname(f) for f in every if posixpath.basename(f) == MANIFEST_FILE}
    found: list[str] = []
    nested: set[str] = set()
    skipped: dict[str, int] = collections.Counter()
    for path in every:
        manifest = posixpath.basename(path) == MANIFEST_FILE
        if _hidden(posixpath.dirname(path) if manifest else path, root):
            continue
        folder, outside = root, None
        for part in posixpath.relpath(path, root).split("/")[:-1]:
            folder = posixpath.join(folder, part)
            if "=" not in part and folder not in exports:
                outside = folder
                break
        if outside is not None:
            if _wanted(path, engine):
                skipped[outside] += 1
        elif manifest:
            if folder != root:
                nested.add(folder)
        elif _wanted(path, engine):
            found.append(path)
    return sorted(found), sorted(nested), dict(sorted(skipped.items()))


def _skipped_message(path: str, skipped: dict[str, int], engine: str | None,
                     none_left: bool = False) -> str:
    """What :func:`_folder_data` left out of ``Dataset(path)``, and how to read it."""
    names = ", ".join(f"{folder}/ ({n} file{'s' if n > 1 else ''})" for folder, n in list(skipped.items())[:5])
    more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
    ext = "csv" if engine == "csv" else "parquet"
    first = next(iter(skipped))
    head = (f"folder {path!r} holds no data files of its own, only in subfolders that are not data"
            if none_left else f"Dataset({path!r}) does not read its subfolders")
    return (f"{head}: {names}{more}. A folder's data are its own files, its hive partition folders "
            f"(col=value) and the exports in it (folders with {MANIFEST_FILE}); to read a subfolder, "
            f"pass its path (e.g. {first!r}), a list of paths, or a glob such as "
            f"{posixpath.join(str(path), '*', '*.' + ext)!r}")


def _missing_bucket(fs: Any, path: str) -> str:
    """On an object store, whether the bucket of ``path`` itself is missing."""
    if is_local(fs) or "/" not in path.strip("/"):
        return ""
    bucket = path.strip("/").split("/")[0]
    return "" if fs.exists(bucket) else f" (the bucket {bucket!r} does not exist, or these credentials cannot see it)"


def _hidden(path: str, root: str) -> bool:
    """Whether a part of ``path`` below ``root`` starts with ``_`` or ``.``."""
    rel = posixpath.relpath(path, root)
    return rel != "." and any(part.startswith(("_", ".")) for part in rel.split("/"))


def _wanted(path: str, engine: str | None) -> bool:
    if engine == "parquet" or engine is None:
        if path.endswith(_PARQUET_EXT):
            return True
    if engine == "csv" or engine is None:
        if path.endswith(_CSV_EXT):
            return True
    return False


def infer_engine(files: list[str]) -> str:
    first = files[0]
    if first.endswith(_PARQUET_EXT):
        return "parquet"
    if first.endswith(_CSV_EXT):
        return "csv"
    raise ValueError(f"cannot tell the format of {first!r} from its extension; pass engine='parquet' or 'csv'")


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def hive_partitions(fs: Any, files: list[str], folders: list[tuple[str, Any]],
                    types: dict[str, pa.DataType] | None = None,
                    ) -> tuple[dict[str, dict[str, Any]], list[pa.Field]]:
    """Partition columns of hive-style folders (``root/col=value/part.parquet``) below
    each folder searched: ``{file: {column: value}}`` and the columns' fields. A
    column's type is the one ``types`` gives (the stored schema of the export that
    wrote the folders: a string column of ``"02134"`` stays a string), else guessed
    from the values (int64 when every value is an integer, bool for true/false, else
    string); the folder ``__HIVE_DEFAULT_PARTITION__`` is a missing value."""
    roots = sorted((f for f, pattern in folders if pattern is None), key=len, reverse=True)
    raw: dict[str, dict[str, str]] = {}
    order: list[str] | None = None
    first = None
    for url in files:
        path = fs._strip_protocol(url)
        root = next((r for r in roots if path.startswith(r.rstrip("/") + "/")), None)
        if root is None:
            continue
        parts = posixpath.relpath(path, root).split("/")[:-1]
        pairs = [p.split("=", 1) for p in parts if "=" in p]
        keys = [k for k, _ in pairs]
        if order is None:
            order, first = keys, url
        elif keys != order:
            raise DataError(f"{url}: its folders name the partition columns {keys}, but {first} has "
                            f"{order}; every file of a hive-partitioned dataset needs the same "
                            "col=value folders")
        if keys:
            raw[url] = {k: unquote(v) for k, v in pairs}
    if not order:
        return {}, []
    fields, values = [], {url: {} for url in raw}
    for key in order:
        seen = [v[key] for v in raw.values() if v[key] != _HIVE_NULL]
        if types and key in types:
            typ = types[key]

            def convert(v: str, typ: pa.DataType = typ, key: str = key) -> Any:
                try:
                    return pa.scalar(v, pa.string()).cast(typ).as_py()
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise DataError(
                        f"partition folder {key}={v}: the stored schema says column {key!r} is "
                        f"{typ}, and {v!r} is not one ({exc})") from None
        elif seen and all(re.fullmatch(r"-?\d+", v) for v in seen):
            typ, convert = pa.int64(), int
        elif seen and all(v in ("true", "false") for v in seen):
            typ, convert = pa.bool_(), (lambda v: v == "true")
        else:
            typ, convert = pa.string(), str
        fields.append(pa.field(key, typ))
        for url, v in raw.items():
            values[url][key] = None if v[key] == _HIVE_NULL else convert(v[key])
    return values, fields

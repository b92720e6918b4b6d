"""Vocabulary deltas: what one ``Workflow.update`` changed, as a chain of small files.

``Workflow.update`` returns a :class:`VocabularyDelta`; ``Workflow.save`` writes the
whole chain under the workflow folder and ``Workflow.load`` reads it back::

    <workflow>/vocabulary/update_00001/_delta.json   sequence 1, "previous": null
    <workflow>/vocabulary/update_00001/C1.parquet     id (int64), value, change
    <workflow>/vocabulary/update_00002/_delta.json   sequence 2, "previous": "update_00001"
    ...

Each vocabulary's parquet file lists the ids that changed: ``change`` is
``"evicted"`` (the value left the vocabulary) or ``"admitted"`` (the value entered
it with this id). An id both evicted and admitted is *recycled*: its embedding row
belongs to a new value and must be reset (``ParameterServer.apply_vocabulary_delta``,
``EmbeddingTables.reset_rows``). A delta folder is written under a temporary name and
renamed (:meth:`VocabularyDelta.write`), so it is complete or absent. A reader
refuses a delta of a newer format version, a ``change`` other than those two, and
a parquet file whose admitted, evicted and recycled ids disagree with the counts
``_delta.json`` wrote with it (a lost row would leave a recycled id's embedding row
trained for another value).

>>> import pyarrow as pa
>>> delta = VocabularyDelta(1, {"C1": VocabularyChanges(
...     ("C1",), pa.table({"id": [7, 9], "value": ["new", "other"]}),
...     pa.table({"id": [7], "value": ["old"]}))})
>>> delta.summary()
{'C1': {'admitted': 2, 'evicted': 1, 'recycled': 1}}
>>> delta["C1"].recycled.tolist()
[7]
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import tabstream
from tabstream.core.errors import DataError
from tabstream.pipeline.file_lock import exclusive

__all__ = ["DELTA_FOLDER", "VocabularyChanges", "VocabularyDelta", "read_chain"]

#: the subfolder of a saved workflow that holds its vocabulary deltas
DELTA_FOLDER = "vocabulary"
_FORMAT = "tabstream.vocabulary_delta"
_VERSION = 1  # of _delta.json and its parquet files; a reader refuses a newer one
_CHANGES = ("evicted", "admitted")
_NAME = re.compile(r"update_\d{5,}")


@dataclass(frozen=True)
class VocabularyChanges:
    """One vocabulary's changes in one update: tables ``(id, value)``."""

    columns: tuple[str, ...]
    admitted: pa.Table
    evicted: pa.Table

    @property
    def recycled(self) -> np.ndarray:
        """Sorted ids that were evicted and given to an admitted value."""
        return np.intersect1d(self.admitted["id"].to_numpy(), self.evicted["id"].to_numpy())

    def counts(self) -> dict[str, int]:
        return {"admitted": self.admitted.num_rows, "evicted": self.evicted.num_rows,
                "recycled": len(self.recycled)}


@dataclass(frozen=True)
class VocabularyDelta:
    """The changes of update number ``sequence`` (from 1), per vocabulary (named as
    the schema's ``domain.name``, the embedding table's name). ``previous`` names the
    delta before it in the chain (None for the first)."""

    sequence: int
    vocabularies: dict[str, VocabularyChanges]
    previous: str | None = None
    _by_column: dict[str, str] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name, changes in self.vocabularies.items():
            for column in changes.columns:
                self._by_column.setdefault(column, name)

    @property
    def name(self) -> str:
        return f"update_{self.sequence:05d}"

    def __repr__(self) -> str:
        return f"VocabularyDelta({self.name}, previous={self.previous!r}, {self.summary()})"

    def __getitem__(self, key: str) -> VocabularyChanges:
        """The changes of a vocabulary or of a column it encodes."""
        if key in self.vocabularies:
            return self.vocabularies[key]
        if key in self._by_column:
            return self.vocabularies[self._by_column[key]]
        raise KeyError(f"vocabulary delta {self.name} has no vocabulary or column {key!r}; it has "
                       f"{sorted(set(self.vocabularies) | set(self._by_column))}")

    def summary(self) -> dict[str, dict[str, int]]:
        """``{column: {"admitted": n, "evicted": n, "recycled": n}}``, every column of
        every vocabulary."""
        return {col: self.vocabularies[name].counts() for col, name in self._by_column.items()}

    def resets(self) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
        """``{vocabulary: (its columns, recycled ids)}`` for the vocabularies with
        recycled ids: the embedding rows to reset."""
        out = {}
        for name, changes in self.vocabularies.items():
            ids = changes.recycled
            if len(ids):
                out[name] = (changes.columns, ids)
        return out

    # -- files ----------------------------------------------------------------
    def files(self) -> tuple[str, dict[str, pa.Table]]:
        """The text of ``_delta.json`` and the parquet tables by file name."""
        entries, tables = {}, {}
        for i, (name, changes) in enumerate(self.vocabularies.items()):
            safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
            file = f"{i:03d}_{safe}.parquet"
            tables[file] = _changes_table(changes)
            entries[name] = {"columns": list(changes.columns), "file": file, **changes.counts()}
        doc = {"format": _FORMAT, "version": _VERSION, "sequence": self.sequence, "previous": self.previous,
               "vocabularies": entries}
        return json.dumps(doc, indent=1), tables

    def write(self, folder: str, storage_options: dict | None = None) -> str:
        """Write this delta to ``folder/<name>`` (a new folder): on a local disk under
        a temporary name, then renamed; on an object store ``_delta.json`` last.
        Returns the delta's folder.

        Each update is written once: a folder that holds the delta (its
        ``_delta.json``) is a :class:`DataError`. On a local disk writers of one delta
        take turns (a lock ``folder/.<name>.lock``, see
        :mod:`tabstream.pipeline.file_lock`), so of two writing it at once exactly one
        succeeds and the other gets that error; a folder left by a write cut short
        (no ``_delta.json``) is replaced, never a complete delta."""
        fs, root = fsspec.core.url_to_fs(folder, **(storage_options or {}))
        root = root.rstrip("/")
        final = posixpath.join(root, self.name)
        _refuse_existing(fs, final)
        text, tables = self.files()
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        if protocol not in ("file", "local"):
            # no rename, no lock: the files go in place, _delta.json last (the mark)
            _write_files(fs, final, text, tables)
            return final
        fs.makedirs(root, exist_ok=True)
        target = posixpath.join(root, f".{self.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            _write_files(fs, target, text, tables)
            with exclusive(posixpath.join(root, f".{self.name}.lock")):
                _refuse_existing(fs, final)  # written by another writer meanwhile
                if os.path.exists(final):  # a folder without _delta.json: a write cut short
                    shutil.rmtree(final)
                os.replace(target, final)
        finally:
            shutil.rmtree(target, ignore_errors=True)
        return final

    @classmethod
    def read(cls, folder: str, storage_options: dict | None = None) -> VocabularyDelta:
        """Read a delta folder (one ``update_<n>`` folder)."""
        fs, root = fsspec.core.url_to_fs(folder, **(storage_options or {}))
        return _read(fs, root.rstrip("/"))


def _refuse_existing(fs: Any, final: str) -> None:
    if fs.exists(posixpath.join(final, "_delta.json")):
        raise DataError(f"vocabulary delta {final} already exists; each update is written once",
                        hint="write the deltas of another workflow to another folder")


def _write_files(fs: Any, target: str, text: str, tables: dict[str, pa.Table]) -> None:
    """A delta's parquet tables, then its ``_delta.json``, into the folder ``target``."""
    fs.makedirs(target, exist_ok=True)
    for file, table in tables.items():
        with fs.open(posixpath.join(target, file), "wb") as f:
            pq.write_table(table, f)
    with fs.open(posixpath.join(target, "_delta.json"), "w") as f:
        f.write(text)


def _changes_table(changes: VocabularyChanges) -> pa.Table:
    adm, ev = changes.admitted, changes.evicted
    value_type = adm.schema.field("value").type if adm.num_rows or not ev.num_rows else ev.schema.field("value").type
    return pa.table({
        "id": pa.concat_arrays([ev["id"].combine_chunks().cast(pa.int64()),
                                adm["id"].combine_chunks().cast(pa.int64())]),
        "value": pa.concat_arrays([ev["value"].combine_chunks().cast(value_type),
                                   adm["value"].combine_chunks().cast(value_type)]),
        "change": pa.array(["evicted"] * ev.num_rows + ["admitted"] * adm.num_rows, pa.string()),
    })


def _read(fs: Any, folder: str) -> VocabularyDelta:
    doc_path = posixpath.join(folder, "_delta.json")
    try:
        with fs.open(doc_path, "r") as f:
            doc = json.loads(f.read())
    except FileNotFoundError as exc:
        raise DataError(f"{folder} holds no vocabulary delta ({doc_path} is missing)") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{doc_path}: not a vocabulary delta file ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
        raise DataError(f"{doc_path}: not a vocabulary delta file (field 'format' is "
                        f"{doc.get('format') if isinstance(doc, dict) else None!r}, expected {_FORMAT!r})")
    version = doc.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version != _VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > _VERSION
        raise DataError(
            f"{doc_path}: unknown vocabulary delta format version {version!r}; this tabstream "
            f"({tabstream.__version__}) reads version {_VERSION}"
            + ("; it was written by a newer tabstream, upgrade to read it" if newer else ""),
            hint="upgrade tabstream" if newer else "restore the folder from a copy")
    seq, previous, entries = doc.get("sequence"), doc.get("previous"), doc.get("vocabularies")
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1 or not isinstance(entries, Mapping) \
            or not (previous is None or isinstance(previous, str)):
        raise DataError(f"{doc_path}: fields 'sequence' (a positive integer), 'previous' (a name or "
                        f"null) and 'vocabularies' (an object) are expected")
    vocabularies = {}
    for name, entry in entries.items():
        file = entry.get("file") if isinstance(entry, dict) else None
        columns = entry.get("columns") if isinstance(entry, dict) else None
        if not isinstance(file, str) or "/" in file or file.startswith(".") \
                or not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
            raise DataError(f"{doc_path}: vocabulary {name!r} needs a 'file' inside the folder and "
                            f"a list of 'columns', found {entry!r}")
        path = posixpath.join(folder, file)
        try:
            with fs.open(path, "rb") as f:
                table = pq.read_table(f)
        except (FileNotFoundError, pa.ArrowException, OSError) as exc:
            raise DataError(f"{doc_path}: vocabulary {name!r}: {path} is not a readable parquet "
                            f"file ({exc})") from exc
        if not {"id", "value", "change"} <= set(table.column_names):
            raise DataError(f"{path}: a vocabulary delta file has columns id, value, change; "
                            f"found {table.column_names}")
        changes = VocabularyChanges(tuple(columns), *_split_changes(table, path))
        _check_counts(changes, entry, f"{doc_path} (field 'vocabularies.{name}", path)
        vocabularies[name] = changes
    return VocabularyDelta(seq, vocabularies, previous)


def _split_changes(table: pa.Table, path: str) -> tuple[pa.Table, pa.Table]:
    """``(admitted, evicted)`` tables ``(id, value)`` of a delta's parquet file,
    whose ``change`` column holds only those two words and ``id`` integers >= 0
    (a row of another change would be left out: its id's row not reset)."""
    change = table["change"]
    if not pa.types.is_string(change.type) and not pa.types.is_large_string(change.type):
        raise DataError(f"{path}: column 'change' has type {change.type}, expected strings "
                        f"{list(_CHANGES)}")
    known = pc.fill_null(pc.is_in(change, value_set=pa.array(_CHANGES)), False)
    if not pc.all(known).as_py() and table.num_rows:
        row = int(np.flatnonzero(~known.to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: column 'change' holds {change[row].as_py()!r} in row {row}, "
                        f"expected {' or '.join(map(repr, _CHANGES))}; the file is damaged or was edited")
    ids = table["id"]
    if not pa.types.is_integer(ids.type):
        raise DataError(f"{path}: column 'id' has type {ids.type}, expected integers")
    bad = pc.or_kleene(pc.is_null(ids), pc.less(ids, 0))
    if table.num_rows and pc.any(bad).as_py():
        row = int(np.flatnonzero(bad.to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: column 'id' holds {ids[row].as_py()!r} in row {row}, expected "
                        "an id >= 0; the file is damaged or was edited")
    words = change.to_numpy(zero_copy_only=False)
    admitted, evicted = (table.filter(pa.array(words == k)).select(["id", "value"])
                         for k in ("admitted", "evicted"))
    return admitted, evicted


def _check_counts(changes: VocabularyChanges, entry: dict[str, Any], field: str, path: str) -> None:
    """The rows of ``path`` against the counts ``_delta.json`` wrote with them
    (``field``: where they are, an open quote): a file that lost rows, or whose ids
    were changed, is refused (a recycled id it no longer lists keeps the embedding
    row trained for another value)."""
    for kind in _CHANGES:
        ids = changes.evicted["id"] if kind == "evicted" else changes.admitted["id"]
        unique = pc.unique(ids)
        if len(unique) != len(ids):
            counts = pc.value_counts(ids)
            twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
            raise DataError(f"{path}: id {twice} is {kind} in more than one row; an update "
                            f"changes an id once; the file is damaged or was edited")
    for kind, have in changes.counts().items():
        said = entry.get(kind)
        if isinstance(said, bool) or not isinstance(said, int) or said < 0:
            raise DataError(f"{field}.{kind}') is {said!r}, expected the number of {kind} ids "
                            f"(an integer >= 0); the file is damaged or was edited")
        if have != said:
            raise DataError(f"{path} holds {have} {kind} ids, but {field}.{kind}') says {said}: "
                            "the file lost rows or was edited", hint="restore the folder from a copy")


def read_chain(fs: Any, root: str, names: Any, doc_path: str) -> list[VocabularyDelta]:
    """The deltas ``names`` listed by a saved workflow (``workflow.json`` at
    ``doc_path``), read from ``root/vocabulary/``; each must name the one before it."""
    if not isinstance(names, list) or not all(isinstance(n, str) and _NAME.fullmatch(n) for n in names):
        raise DataError(f"{doc_path}: field 'vocabulary_deltas' must list delta names such as "
                        f"'update_00001', found {names!r}")
    chain: list[VocabularyDelta] = []
    for i, name in enumerate(names):
        delta = _read(fs, posixpath.join(root, DELTA_FOLDER, name))
        expected = chain[-1].name if chain else None
        if delta.sequence != i + 1 or delta.name != name or delta.previous != expected:
            raise DataError(f"{doc_path}: vocabulary delta {name} is update {delta.sequence} after "
                            f"{delta.previous!r}; the chain expects update {i + 1} after {expected!r}")
        chain.append(delta)
    return chain

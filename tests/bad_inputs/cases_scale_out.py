"""Scale-out inputs a user gets wrong: a remote prefix whose export never finished,
a broken schema in a file's key-value metadata, an object-store overwrite refused."""

from __future__ import annotations

import uuid

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError


def _prefix() -> str:
    return f"memory://bad-{uuid.uuid4().hex[:8]}"


def _exported(prefix: str) -> ts.ExportResult:
    frame = pd.DataFrame({"c": ["a", "b", "a", "c"] * 25, "x": range(100)})
    wf = ts.Workflow(["c"] >> ops.Categorify()).fit(ts.Dataset(frame))
    return wf.transform(ts.Dataset(frame)).to_parquet(f"{prefix}/out")


def _unfinished_remote_export(tmp):
    """An object store (memory://, no rename) prefix holding an export's data file but
    no manifest: what a running or killed export leaves."""
    import fsspec

    prefix = _prefix()
    result = _exported(prefix)
    fs = fsspec.filesystem("memory")
    fs.rm(fs._strip_protocol(f"{prefix}/out/_manifest.json"))
    try:
        ts.Dataset(f"{prefix}/out")
    finally:
        fs.rm(fs._strip_protocol(prefix), recursive=True)
    assert result.num_rows == 100


def _broken_key_value_schema(tmp):
    folder = tmp / "kv"
    folder.mkdir()
    table = pa.table({"a": [1]}).replace_schema_metadata({b"tabstream.schema": b'{"columns": 3}'})
    pq.write_table(table, folder / "part_00000.parquet")
    ts.Dataset(str(folder))


def _remote_overwrite_refused(tmp):
    import fsspec

    prefix = _prefix()
    _exported(prefix)
    try:
        _exported(prefix)
    finally:
        fsspec.filesystem("memory").rm(prefix.removeprefix("memory:/"), recursive=True)


CASES = [
    ("remote prefix without _manifest.json (API)", _unfinished_remote_export, DataError,
     r"memory:///?bad-\w+/out/part_00000\.parquet: written by a tabstream export, but its prefix "
     r"has no _manifest\.json; .*still being written, or failed"),
    ("broken schema in parquet key-value metadata (API)", _broken_key_value_schema, DataError,
     r"part_00000\.parquet: the schema in its parquet key-value metadata \(tabstream\.schema\) "
     r"is not a valid tabstream schema"),
    ("remote export exists, no overwrite (API)", _remote_overwrite_refused, FileExistsError,
     r"'memory://bad-\w+/out' already exists; pass overwrite=True to replace it"),
]

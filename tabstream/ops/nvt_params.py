"""NVTabular's parameters of *where and how* statistics are computed, accepted by
the statistics ops (Categorify, TargetEncoding, JoinGroupby) so that migrating code
runs unchanged.

``split_out``/``tree_width`` (how many dask partitions a reduction writes and reads
at once) and ``on_host``/``cat_cache`` (where a GPU keeps tables) have no effect:
tabstream's fit is a tree reduction whose statistics are exact for any setting. They
are validated and saved with the op, nothing more.

``out_path`` is honoured: at fit the op writes its fitted statistics there as
parquet, one file per vocabulary or group (what NVTabular users read back)::

    <out_path>/categories/unique.<name>.parquet    Categorify: ``<name>`` (value),
                                                   ``<name>_size`` (count), id order
    <out_path>/categories/<prefix>.<name>.parquet  TargetEncoding / JoinGroupby: the
                                                   group keys and their statistics

Each file is written to a temporary name and renamed: a reader never sees half a
file. The op's own state is saved with the workflow as always; these files are a
copy for the user.
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabstream.core.errors import ExportError

__all__ = ["check_nvt_knobs", "write_stats_files"]


def check_nvt_knobs(op: str, **knobs: Any) -> None:
    """``out_path`` a string or None; ``split_out``/``tree_width`` a positive integer,
    a dict column -> positive integer, or None."""
    out_path = knobs.pop("out_path", None)
    if out_path is not None and (not isinstance(out_path, str) or not out_path):
        raise TypeError(f"{op}: out_path must be a folder path (a non-empty string) or None, "
                        f"got {out_path!r}")
    for name, value in knobs.items():
        values = value.values() if isinstance(value, dict) else [value]
        if any(v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1)
               for v in values):
            raise ValueError(f"{op}: {name} must be a positive integer, a dict column -> positive "
                             f"integer, or None, got {value!r}")


def write_stats_files(op: str, out_path: str | None, files: dict[str, pa.Table]) -> dict[str, str]:
    """Write ``files`` (name relative to ``<out_path>/categories`` -> table) as parquet;
    return name -> full path. Nothing is written when ``out_path`` is None."""
    if out_path is None:
        return {}
    fs, root = fsspec.core.url_to_fs(out_path)
    folder = posixpath.join(root, "categories")
    written: dict[str, str] = {}
    try:
        fs.makedirs(folder, exist_ok=True)
        for name, table in files.items():
            path = posixpath.join(folder, f"{name}.parquet")
            tmp = posixpath.join(folder, f".{name}.{uuid.uuid4().hex[:8]}.tmp")
            with fs.open(tmp, "wb") as f:
                pq.write_table(table, f)
            fs.mv(tmp, path)
            written[name] = path if "://" not in out_path else f"{out_path.split('://')[0]}://{path}"
    except OSError as exc:
        raise ExportError(f"{op}: cannot write its statistics to out_path={out_path!r}: {exc}; "
                          "pass a writable folder, or out_path=None") from exc
    return written

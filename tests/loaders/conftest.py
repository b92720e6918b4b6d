"""Small exports written with plain pyarrow, and readers that compute what a loader
should deliver a second, simpler way. Test modules reach the helpers through the
``testdata`` fixture (tests are imported with --import-mode=importlib)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tabstream.core.schema import ColumnSchema, Schema, Tags

# Unequal files, unequal row groups, a one-row file.
FILE_ROWS = (700, 1, 1500, 333, 240)
ROW_GROUPS = (250, 1, 600, 50, 240)
MAX_TAGS = 4


def export_schema(with_lists: bool = True) -> Schema:
    cols = [
        ColumnSchema("row_id", "int64", tags=[Tags.ID]),
        ColumnSchema("C1", "int64", tags=[Tags.CATEGORICAL],
                     properties={"domain": {"min": 0, "max": 99}}),
        ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
    ]
    if with_lists:
        cols += [
            ColumnSchema("tags", "int64", tags=[Tags.CATEGORICAL], is_list=True, is_ragged=True,
                         properties={"value_count": {"min": 0, "max": MAX_TAGS}}),
            ColumnSchema("weights", "float32", tags=[Tags.CONTINUOUS], is_list=True,
                         is_ragged=True, properties={"value_count": {"min": 0, "max": MAX_TAGS}}),
        ]
    cols.append(ColumnSchema("label", "int64", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]))
    return Schema(cols)


def make_table(row_ids: np.ndarray, with_lists: bool = True) -> pa.Table:
    rng = np.random.default_rng(int(row_ids[0]) if len(row_ids) else 0)
    n = len(row_ids)
    cols = {
        "row_id": pa.array(row_ids, pa.int64()),
        "C1": pa.array(rng.integers(0, 100, n), pa.int64()),
        "I1": pa.array(rng.random(n, dtype=np.float32), pa.float32()),
    }
    if with_lists:
        lengths = row_ids % (MAX_TAGS + 1)  # 0..MAX_TAGS values, empty lists included
        cols["tags"] = pa.array([list(range(int(r), int(r) + int(k)))
                                 for r, k in zip(row_ids, lengths, strict=True)],
                                pa.list_(pa.int64()))
        cols["weights"] = pa.array([[float(r) / 2] * int(k)
                                    for r, k in zip(row_ids, lengths, strict=True)],
                                   pa.list_(pa.float32()))
    cols["label"] = pa.array(row_ids % 2, pa.int64())
    return pa.table(cols)


def write_export(path: Path, file_rows: Sequence[int] = FILE_ROWS,
                 row_groups: Sequence[int] = ROW_GROUPS, with_lists: bool = True,
                 schema: bool = True) -> Path:
    """The layout of ``to_parquet``: part files, schema.json, _manifest.json."""
    path.mkdir(parents=True, exist_ok=True)
    start = 0
    files = []
    for i, (n, rg) in enumerate(zip(file_rows, row_groups, strict=True)):
        name = f"part_{i:05d}.parquet"
        table = make_table(np.arange(start, start + n), with_lists)
        pq.write_table(table, path / name, row_group_size=rg)
        files.append({"path": name, "num_rows": n})
        start += n
    if schema:
        export_schema(with_lists).to_json(str(path / "schema.json"))
    (path / "_manifest.json").write_text(json.dumps({"num_rows": start, "files": files}))
    return path


def read_all(path: Path) -> pa.Table:
    """The whole export, by plain pyarrow, sorted by row id."""
    files = sorted(path.glob("part_*.parquet"))
    return pa.concat_tables(pq.read_table(f) for f in files).sort_by("row_id")


@pytest.fixture(scope="session")
def testdata() -> SimpleNamespace:
    return SimpleNamespace(
        FILE_ROWS=FILE_ROWS, ROW_GROUPS=ROW_GROUPS, MAX_TAGS=MAX_TAGS, N=sum(FILE_ROWS),
        export_schema=export_schema, make_table=make_table, write_export=write_export,
        read_all=read_all,
    )


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return write_export(tmp_path / "export")


@pytest.fixture(scope="session")
def shared_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Read-only export shared by the many parametrized cases."""
    return write_export(tmp_path_factory.mktemp("shared") / "export")

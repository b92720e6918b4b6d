"""Exports whose files disagree with ``_manifest.json``, files whose schemas differ,
and ``filters=`` a user gets wrong: through the API, the loader and the CLI."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.pipeline.dataset import DatasetWarning


def _export(tmp):
    """900 rows in 3 files of 300: three partitions of 300 rows (16 bytes a row),
    one partition per file."""
    df = pd.DataFrame({"row_id": np.arange(900), "x": np.linspace(0, 1, 900)})
    out = tmp / "export"
    ts.Dataset(df, part_size=300 * 16).to_parquet(str(out), num_files=3)
    assert [len(pq.read_table(p)) for p in sorted(out.glob("part_*.parquet"))] == [300, 300, 300]
    return out


def _deleted_file(tmp):
    out = _export(tmp)
    (out / "part_00001.parquet").unlink()
    ts.Dataset(str(out))


def _smaller_file(tmp):
    out = _export(tmp)
    pq.write_table(pq.read_table(out / "part_00002.parquet").slice(0, 9), out / "part_00002.parquet")
    ts.Dataset(str(out))


def _extra_file(tmp):
    out = _export(tmp)
    pq.write_table(pq.read_table(out / "part_00000.parquet").slice(0, 3), out / "part_00005.parquet")
    ts.Dataset(str(out))


def _loader_smaller_file(tmp):
    from tabstream.loaders import Loader

    out = _export(tmp)
    pq.write_table(pq.read_table(out / "part_00000.parquet").slice(0, 11), out / "part_00000.parquet")
    Loader(str(out), 64)


def _glob_smaller_file(tmp):
    out = _export(tmp)
    pq.write_table(pq.read_table(out / "part_00001.parquet").slice(0, 2), out / "part_00001.parquet")
    ts.Dataset(str(out / "part_*.parquet"))


def _cli_inspect_deleted(tmp):
    out = _export(tmp)
    (out / "part_00002.parquet").unlink()
    cli("inspect", out, "--quiet")


def _incompatible_types(tmp):
    (tmp / "d").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), tmp / "d" / "a.parquet")
    pq.write_table(pa.table({"a": ["x"]}), tmp / "d" / "b.parquet")
    ts.Dataset(str(tmp / "d"))


def _column_missing_in_first_file(tmp):
    # Read correctly: unified, the column is null where a file lacks it.
    (tmp / "d").mkdir()
    first = pd.DataFrame({"a": [1, 2]})
    second = pd.DataFrame({"a": [3], "b": [0.5]})
    first.to_parquet(tmp / "d" / "p0.parquet", index=False)
    second.to_parquet(tmp / "d" / "p1.parquet", index=False)
    with pytest.warns(DatasetWarning, match=r"\['b'\] null in the rows of .*p0\.parquet \(held by .*p1\.parquet"):
        ds = ts.Dataset(str(tmp / "d"))
    got = pa.concat_tables(ds.read_piece(p) for p in ds.pieces).to_pandas()
    expected = pd.concat([first, second], ignore_index=True)
    assert got["a"].tolist() == expected["a"].tolist()
    assert got["b"].isna().tolist() == expected["b"].isna().tolist()


def _filters_not_a_list(tmp):
    out = _export(tmp)
    ts.Dataset(str(out), filters={"x": 1})


def _filters_unknown_column(tmp):
    out = _export(tmp)
    ts.Dataset(str(out), filters=[("day", "<", 7)])


CASES = [
    ("export file deleted", _deleted_file, DataError,
     r"part_00001\.parquet: listed in .*_manifest\.json with 300 rows, but the file is missing \(found 0 rows\)"),
    ("export file replaced by a smaller one", _smaller_file, DataError,
     r"part_00002\.parquet: .*_manifest\.json lists 300 rows, found 9 rows"),
    ("extra file in an export", _extra_file, DataError,
     r"part_00005\.parquet: not listed in .*_manifest\.json \(found 3 rows, expected no such file\)"),
    ("loader over a truncated export", _loader_smaller_file, DataError,
     r"part_00000\.parquet: .*lists 300 rows, found 11 rows"),
    ("glob inside a truncated export", _glob_smaller_file, DataError,
     r"part_00001\.parquet: .*lists 300 rows, found 2 rows"),
    ("cli inspect over an export missing a file", _cli_inspect_deleted, CliFailed,
     r"tabstream inspect: DataError: .*part_00002\.parquet: listed in .*with 300 rows"),
    ("files disagree on a column type", _incompatible_types, SchemaError,
     r"b\.parquet: column 'a' is string, but .*a\.parquet has int64"),
    ("column missing from the first file", _column_missing_in_first_file, None, None),
    ("filters not a list", _filters_not_a_list, TypeError, r"filters must be a list .*got dict"),
    ("filters on an unknown column", _filters_unknown_column, SchemaError,
     r"filters .*day.* do not apply to this dataset.*columns: \['row_id', 'x'\]"),
]

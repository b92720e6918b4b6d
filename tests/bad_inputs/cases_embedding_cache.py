"""Embedding cache: parameter server folders, keysets and ids a user gets wrong."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig


def _server(tmp, **kw):
    return ParameterServer(tmp / "ps", [TableConfig("C1", 100, 4, ("C1",))], **kw)


def _damaged_meta(tmp):
    _server(tmp)
    (tmp / "ps" / "_server.json").write_text('{"format": "tabstream.ParameterServer/1", "tab')
    ParameterServer.open(tmp / "ps")


def _truncated_table_file(tmp):
    _server(tmp)
    (tmp / "ps" / "C1.slots.f32").write_bytes(b"\0" * 12)
    ParameterServer.open(tmp / "ps")


def _keyset_not_parquet(tmp):
    (tmp / "day" / "_keysets").mkdir(parents=True)
    (tmp / "day" / "_keysets" / "part_0.parquet").write_text("column,id\nC1,3\n")
    _server(tmp).prefetch(tmp / "day")


def _keyset_id_out_of_range(tmp):
    (tmp / "day" / "_keysets").mkdir(parents=True)
    pd.DataFrame({"column": ["C1", "C1"], "id": np.array([3, 250], np.int64)}).to_parquet(
        tmp / "day" / "_keysets" / "part_0.parquet")
    _server(tmp).prefetch(tmp / "day")


def _table_name_with_slash(tmp):
    ParameterServer(tmp / "ps", [TableConfig("a/b", 10, 4, ("a",))])


def _negative_lr(tmp):
    _server(tmp, lr=-0.1)


def _export_into_existing_folder(tmp):
    (tmp / "delta").mkdir()
    _server(tmp).export_delta(tmp / "delta")


def _prefetch_keysets_round_trip(tmp):
    """Not an error: the keysets of two files are merged per table, duplicates once."""
    (tmp / "day" / "_keysets").mkdir(parents=True)
    ids = [np.array([5, 1, 5], np.int64), np.array([1, 9], np.int64)]
    for i, part in enumerate(ids):
        pd.DataFrame({"column": ["C1"] * len(part), "id": part}).to_parquet(
            tmp / "day" / "_keysets" / f"part_{i}.parquet")
    ps = _server(tmp)
    seen = {}
    ps.attach(lambda event, table, got, rows: seen.update({table: got}))
    assert ps.prefetch(tmp / "day") == {"C1": len(np.unique(np.concatenate(ids)))}
    np.testing.assert_array_equal(seen["C1"], np.unique(np.concatenate(ids)))


CASES = [
    ("damaged _server.json", _damaged_meta, DataError,
     r"ps/_server\.json is not a readable parameter server file"),
    ("table file of the wrong size", _truncated_table_file, DataError,
     r"C1\.slots\.f32 has 12 bytes, expected 4000 \(100 records of 10 float32\)"),
    ("keyset file that is not parquet", _keyset_not_parquet, DataError,
     r"prefetch: .*_keysets/part_0\.parquet is not a keyset file \(parquet with columns 'column' and 'id'\)"),
    ("keyset id beyond the table", _keyset_id_out_of_range, ValueError,
     r"table 'C1': id 250 is out of range; the table has 100 rows \(ids 0\.\.99\)"),
    ("table name with a slash", _table_name_with_slash, ValueError,
     r"table name 'a/b' cannot name a file"),
    ("negative learning rate", _negative_lr, ValueError, r"lr must be a positive number, got -0\.1"),
    ("export_delta into an existing folder", _export_into_existing_folder, DataError,
     r"export_delta: .*delta already exists; each export goes to a new folder"),
    ("keysets of two files merged", _prefetch_keysets_round_trip, None, None),
]

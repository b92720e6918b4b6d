"""Parameter server folders of format 3 (packed slots) damaged or cut short."""

from __future__ import annotations

import json

import numpy as np

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig


def _committed(tmp):
    ps = ParameterServer(tmp / "ps", [TableConfig("C1", 100, 4, ("C1",))])
    ps.apply("C1", [3, 50, 7], np.ones((3, 4), np.float32))
    ps.flush()
    ps.close()


def _slot_ids_cut_short(tmp):
    _committed(tmp)
    with open(tmp / "ps" / "C1.slots.i64", "r+b") as f:
        f.truncate(16)  # two of the three committed slot ids
    ParameterServer.open(tmp / "ps")


def _slot_id_out_of_range(tmp):
    _committed(tmp)
    with open(tmp / "ps" / "C1.slots.i64", "r+b") as f:
        f.write(np.int64(1000).tobytes())
    ParameterServer.open(tmp / "ps")


def _mark_without_slot_counts(tmp):
    _committed(tmp)
    meta = json.loads((tmp / "ps" / "_server.json").read_text())
    del meta["mark"]["slots"]
    (tmp / "ps" / "_server.json").write_text(json.dumps(meta))
    ParameterServer.open(tmp / "ps")


def _format_2_without_its_rows(tmp):
    _committed(tmp)
    meta = json.loads((tmp / "ps" / "_server.json").read_text())
    meta["format"] = "tabstream.ParameterServer/2"
    (tmp / "ps" / "_server.json").write_text(json.dumps(meta))
    ParameterServer.open(tmp / "ps")


CASES = [
    ("slot id file shorter than the commit", _slot_ids_cut_short, DataError,
     r"C1\.slots\.i64 holds 2 slot ids, its last commit has 3; the folder is damaged"),
    ("slot id beyond the table", _slot_id_out_of_range, DataError,
     r"C1\.slots\.i64 holds ids outside the table's 100 rows; the folder is damaged"),
    ("mark without slot counts", _mark_without_slot_counts, DataError,
     r"_server\.json: its mark lacks the slot counts of tables \['C1'\]; the file is damaged"),
    ("format 2 folder without its rows file", _format_2_without_its_rows, DataError,
     r"format 'tabstream\.ParameterServer/2'\) lacks C1\.rows\.f32 or has it at another size "
     r"\(expected 4000 bytes\); it cannot be upgraded"),
]

"""Exports into an existing folder of other files: what is written beside a user's
files, what is refused (a name in the way, a previous export without overwrite, a
folder under another export's lock or journal, an object-store prefix of other
keys), and what readers make of such a folder."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pandas as pd

import tabstream as ts
from tabstream.core.errors import DataError, ExportError
from tabstream.core.scratch import owner_tag


def _frame(n: int = 120) -> pd.DataFrame:
    return pd.DataFrame({"row_id": np.arange(n), "y": np.linspace(0, 1, n)})


def _folder(tmp, *extra: str):
    """A user's folder: a parquet file of other rows, a CSV, notes, and ``extra`` names."""
    out = tmp / "data"
    out.mkdir()
    pd.DataFrame({"row_id": [10_000, 10_001], "y": [9.0, 9.5]}).to_parquet(out / "mine.parquet")
    (out / "notes.csv").write_text("a,b\n1,2\n")
    (out / "README.txt").write_text("my files\n")
    for name in extra:
        (out / name).write_text("mine")
    return out


def _read_sorted(path) -> pd.DataFrame:
    return ts.Dataset(str(path)).to_ddf().compute().sort_values("row_id").reset_index(drop=True)


def _beside_user_files(tmp):
    out = _folder(tmp)
    df = _frame()
    ts.Dataset(df).to_parquet(str(out), num_files=2)
    for path in (out, out / "*.parquet"):  # the user's rows (row_id 10000) are not mixed in
        pd.testing.assert_frame_equal(_read_sorted(path), df, check_dtype=False)
    pd.testing.assert_frame_equal(_read_sorted(out / "mine.parquet"),
                                  pd.DataFrame({"row_id": [10_000, 10_001], "y": [9.0, 9.5]}), check_dtype=False)
    assert (out / "README.txt").read_text() == "my files\n"


def _metadata_in_the_way(tmp):
    out = _folder(tmp, "_metadata")  # a dask/spark dataset's footer file
    try:
        ts.Dataset(_frame()).to_parquet(str(out))
    finally:
        assert (out / "_metadata").read_text() == "mine"
        assert not (out / "_manifest.json").exists()


def _part_file_in_the_way(tmp):
    out = _folder(tmp)
    _frame(5).to_parquet(out / "part_00002.parquet")
    ts.Dataset(_frame()).to_parquet(str(out), num_files=3)


def _hive_folder_in_the_way(tmp):
    out = _folder(tmp)
    (out / "c=0").mkdir()
    ts.Dataset(_frame().assign(c=lambda d: d["row_id"] % 2)).to_parquet(str(out), partition_on=["c"])


def _other_tools_manifest(tmp):
    out = _folder(tmp)
    (out / "_manifest.json").write_text('{"entries": ["mine.parquet"]}')
    ts.Dataset(_frame()).to_parquet(str(out))


def _previous_export_no_overwrite(tmp):
    out = _folder(tmp)
    ts.Dataset(_frame()).to_parquet(str(out))
    ts.Dataset(_frame(7)).to_parquet(str(out))


def _under_a_journal(tmp, how: str):
    out = _folder(tmp)
    ts.Dataset(_frame()).to_parquet(str(out))
    (out / ".tabstream-publish.json").write_text('{"format": "tabstream.publish"}')
    if how == "folder":
        ts.Dataset(str(out))
    elif how == "glob":
        ts.Dataset(str(out / "part_*.parquet"))
    else:
        from tabstream.loaders import Loader

        Loader(str(out), 16)


def _user_file_added_after(tmp):
    out = _folder(tmp)
    ts.Dataset(_frame()).to_parquet(str(out))
    pd.DataFrame({"row_id": [5], "y": [0.5]}).to_parquet(out / "later.parquet")
    ts.Dataset(str(out))


def _bad_journal(tmp):
    out = _folder(tmp)
    (out / ".tabstream-publish.json").write_text('{"moving": 3}')
    ts.Dataset(_frame()).to_parquet(str(out))


def _locked_by_a_live_export(tmp):
    out = _folder(tmp)
    (out / ".tabstream-export.lock").write_text(f"{owner_tag()}-{uuid.uuid4().hex[:12]}")  # this process
    ts.Dataset(_frame()).to_parquet(str(out), overwrite=True)


def _object_store_prefix_of_other_keys(tmp):
    import fsspec

    prefix = f"memory://mixed-{uuid.uuid4().hex[:8]}"
    fs = fsspec.filesystem("memory")
    fs.pipe_file(f"{prefix.removeprefix('memory://')}/mine.csv", b"a\n1\n")
    try:
        ts.Dataset(_frame()).to_parquet(f"{prefix}/")
    finally:
        assert [os.path.basename(k) for k in fs.find(prefix.removeprefix("memory://"))] == ["mine.csv"]
        fs.rm(prefix.removeprefix("memory://"), recursive=True)


_IN_THE_WAY = (r"export into '.*data': .*data/{} is in the way: the export writes a file of that name, and "
               r"this one is not part of a tabstream export \(it would be replaced\); move or rename it")
_INTERRUPTED = (r"data: an export into this folder was interrupted, or is being published now "
                r"\(\.tabstream-publish\.json is there\)")

CASES = [
    ("an export beside a user's parquet, csv and notes reads the export alone", _beside_user_files, None, None),
    ("a user's _metadata in the way", _metadata_in_the_way, FileExistsError, _IN_THE_WAY.format("_metadata")),
    ("a user's part_00002.parquet in the way", _part_file_in_the_way, FileExistsError,
     _IN_THE_WAY.format(r"part_00002\.parquet")),
    ("a user's hive folder c=0 in the way of partition_on", _hive_folder_in_the_way, FileExistsError,
     _IN_THE_WAY.format("c=0")),
    ("another tool's _manifest.json in the way", _other_tools_manifest, FileExistsError,
     _IN_THE_WAY.format(r"_manifest\.json")),
    ("a previous export beside the user's files, no overwrite", _previous_export_no_overwrite, FileExistsError,
     r"'.*data' already exists; pass overwrite=True to replace it: it holds a tabstream export "
     r"\(_manifest\.json\) beside other files \(they stay\)"),
    ("a folder under a publish journal, read as a folder", lambda tmp: _under_a_journal(tmp, "folder"),
     DataError, _INTERRUPTED),
    ("a folder under a publish journal, read by a glob", lambda tmp: _under_a_journal(tmp, "glob"),
     DataError, _INTERRUPTED),
    ("a folder under a publish journal, given to a Loader", lambda tmp: _under_a_journal(tmp, "loader"),
     DataError, _INTERRUPTED),
    ("a user's parquet added after the export", _user_file_added_after, DataError,
     r"data/later\.parquet: not listed in .*data/_manifest\.json \(found 1 rows, expected no such file\); "
     r"remove the extra file or export again \(the export was published into a folder of other files: "
     r"a file of yours added after it is read as neither; move it out, or export again with overwrite=True"),
    ("a publish journal that is not one", _bad_journal, ExportError,
     r"data/\.tabstream-publish\.json: not a valid export journal .*an export into .*data was interrupted "
     r"and its files cannot be told from others"),
    ("a folder locked by a live export (overwrite too)", _locked_by_a_live_export, FileExistsError,
     rf"'.*data': another export into this folder is under way \(its lock .*\.tabstream-export\.lock is held "
     rf"by process {os.getpid()}\); exports into a folder that holds other files run one at a time"),
    ("an object-store prefix holding other keys", _object_store_prefix_of_other_keys, FileExistsError,
     r"'memory://mixed-\w+/' already exists; pass overwrite=True to replace it \(on an object store an "
     r"export is not published into a prefix that holds other keys"),
]

"""Bad inputs found by the review of the "nothing silent" work (issue 8): each
row once read silently wrong (rows lost or doubled) or failed with a raw error."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

import tabstream as ts
from tabstream.errors import DataError


def _export(out, rows=600, files=3):
    df = pd.DataFrame({"row_id": np.arange(rows), "x": np.linspace(0, 1, rows)})
    ts.Dataset(df, part_size=rows * 16 // files).to_parquet(str(out), num_files=files)
    return {e["path"]: e["num_rows"] for e in json.loads((out / "_manifest.json").read_text())["files"]}


def _nested_export_file_deleted(tmp):
    # root/train and root/valid: Dataset(root) once skipped train's manifest
    _export(tmp / "root" / "valid")
    _export(tmp / "root" / "train")
    (tmp / "root" / "train" / "part_00001.parquet").unlink()
    ts.Dataset(str(tmp / "root"))


def _nested_export_file_deleted_loader(tmp):
    from tabstream.loaders.torch import Loader

    _export(tmp / "root" / "valid")
    _export(tmp / "root" / "train")
    (tmp / "root" / "train" / "part_00000.parquet").unlink()
    Loader(str(tmp / "root"), batch_size=100)


def _glob_over_export_file_deleted(tmp):
    _export(tmp / "out")
    (tmp / "out" / "part_00002.parquet").unlink()
    ts.Dataset(str(tmp / "out" / "*.parquet"))


def _glob_over_export_every_file_deleted(tmp):
    _export(tmp / "out")
    for p in (tmp / "out").glob("part_*.parquet"):
        p.unlink()
    ts.Dataset(str(tmp / "out" / "part_*.parquet"))


def _glob_not_matching_the_deleted_file_reads(tmp):
    # a glob that does not match the deleted file reads what it matches
    counts = _export(tmp / "out")
    (tmp / "out" / "part_00000.parquet").unlink()
    ds = ts.Dataset(str(tmp / "out" / "part_0000[12].parquet"))
    assert ds.num_rows == counts["part_00001.parquet"] + counts["part_00002.parquet"]


def _nested_exports_read_whole(tmp):
    valid = _export(tmp / "root" / "valid", rows=300)
    train = _export(tmp / "root" / "train")
    ds = ts.Dataset(str(tmp / "root"))
    assert ds.num_rows == sum(valid.values()) + sum(train.values())
    expected = pd.concat([pd.read_parquet(tmp / "root" / d / f) for d, c in [("train", train), ("valid", valid)]
                          for f in sorted(c)], ignore_index=True)
    got = pd.concat(list(ds.to_iter()), ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def _same_folder_twice(tmp):
    _export(tmp / "out")
    ts.Dataset([str(tmp / "out"), str(tmp / "out")])


def _folder_and_its_glob(tmp):
    _export(tmp / "out")
    ts.Dataset([str(tmp / "out"), str(tmp / "out" / "*.parquet")])


CASES = [
    ("nested export, a file deleted", _nested_export_file_deleted, DataError,
     r"root/train/part_00001\.parquet: listed in .*root/train/_manifest\.json with \d+ rows, "
     r"but the file is missing"),
    ("nested export, a file deleted, loader", _nested_export_file_deleted_loader, DataError,
     r"root/train/part_00000\.parquet: listed in .*train/_manifest\.json"),
    ("glob over an export, a file deleted", _glob_over_export_file_deleted, DataError,
     r"out/part_00002\.parquet: listed in .*out/_manifest\.json with \d+ rows, but the file is missing"),
    ("glob over an export, every file deleted", _glob_over_export_every_file_deleted, DataError,
     r"out/part_00000\.parquet: listed in .*out/_manifest\.json with \d+ rows, but the file is missing"),
    ("glob not matching the deleted file", _glob_not_matching_the_deleted_file_reads, None, None),
    ("nested exports untouched read whole", _nested_exports_read_whole, None, None),
    ("same folder twice", _same_folder_twice, ValueError,
     r"out/part_00000\.parquet: picked more than once by the paths .*give each file once"),
    ("a folder and its glob", _folder_and_its_glob, ValueError,
     r"out/part_00000\.parquet: picked more than once by the paths \[.*out', .*out/\*\.parquet'\]"),
]

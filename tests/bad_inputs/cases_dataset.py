"""Dataset construction: paths, formats and arguments a user gets wrong."""

from __future__ import annotations

import pandas as pd

import tabstream as ts
from tabstream.core.errors import DataError


def _missing_file(tmp):
    ts.Dataset(str(tmp / "nope.parquet"))


def _empty_glob(tmp):
    ts.Dataset(str(tmp / "day_*.tsv"), names=["a"])


def _unknown_extension(tmp):
    (tmp / "data.bin").write_bytes(b"\x00\x01")
    ts.Dataset(str(tmp / "data.bin"))


def _not_parquet(tmp):
    (tmp / "fake.parquet").write_text("a,b\n1,2\n")
    ts.Dataset(str(tmp / "fake.parquet"))


def _bad_part_size(tmp):
    pd.DataFrame({"a": [1]}).to_parquet(tmp / "a.parquet")
    ts.Dataset(str(tmp / "a.parquet"), part_size="lots")


def _csv_without_names(tmp):
    (tmp / "raw.tsv").write_text("1\t2\n")
    ts.Dataset(str(tmp / "raw.tsv"), header=False)


CASES = [
    ("missing file", _missing_file, FileNotFoundError, "nope.parquet"),
    ("glob matches nothing", _empty_glob, FileNotFoundError, r"day_\*\.tsv"),
    ("unknown extension", _unknown_extension, ValueError, r"data\.bin.*engine="),
    ("text file named .parquet", _not_parquet, DataError, r"fake\.parquet.*not a readable parquet"),
    ("part_size not a size", _bad_part_size, ValueError, "cannot parse part_size 'lots'"),
    ("headerless CSV without names", _csv_without_names, ValueError, r"names=\["),
]

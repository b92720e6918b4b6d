"""Hostile or odd CSV/TSV inputs fail quickly with the file, the line and the option
that fixes them (issue 27): a header of millions of fields, a line longer than the
parser's block (``block_size=``), repeated column names."""

from __future__ import annotations

import gzip
import time

import pandas as pd
import pytest

import tabstream as ts
import tabstream.pipeline.dataset as dataset_module
from tabstream.core.errors import DataError


def test_header_of_millions_of_fields_fails_in_seconds(tmp_path):
    # before: minutes and gigabytes (the line read whole, split, planned as columns)
    path = tmp_path / "wide.csv"
    fields = 3_000_000
    with open(path, "w") as f:
        f.write(",".join(f"c{i}" for i in range(fields)) + "\n1,2\n")
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"{path}, line 1: read as the header line, it is longer than 2,097,152 "
                                        r"bytes, the CSV parse block \(block_size\), and holds at least "
                                        r"[\d,]+ fields") as err:
        ts.Dataset(str(path))
    assert time.monotonic() - start < 5
    # the count it gives is of the bytes it read: the fields of the first 2 MB
    counted = int(str(err.value).split("at least ")[1].split(" fields")[0].replace(",", ""))
    with open(path, "rb") as f:
        assert counted == f.read(2_097_152 + 1).count(b",") + 1
    assert "names=[...]" in err.value.hint


def test_header_of_more_columns_than_the_limit(tmp_path, monkeypatch):
    monkeypatch.setattr(dataset_module, "MAX_CSV_COLUMNS", 50)
    path = tmp_path / "wide.tsv.gz"
    names = [f"c{i}" for i in range(60)]
    with gzip.open(path, "wt") as f:
        f.write("\t".join(names) + "\n" + "\t".join("1" * 60) + "\n")
    with pytest.raises(DataError, match=rf"{path}, line 1: read as the header line, it holds 60 fields, more "
                                        r"than MAX_CSV_COLUMNS=50 columns"):
        ts.Dataset(str(path))
    monkeypatch.setattr(dataset_module, "MAX_CSV_COLUMNS", 60)
    ds = ts.Dataset(str(path))
    assert ds.schema.column_names == names
    assert ds.num_rows == 1


def _long_line_file(path, before: int, length: int, after: int = 5) -> None:
    with open(path, "w") as f:
        for i in range(before):
            f.write(f"{i}\tx\n")
        f.write(f"{before}\t" + "y" * length + "\n")
        for i in range(after):
            f.write(f"{before + 1 + i}\tx\n")


@pytest.mark.parametrize("part_size", ["64MB", "1MB"])
def test_line_longer_than_the_block_names_its_line_and_block_size(tmp_path, part_size):
    # before: "(from line 1): straddling object straddles two block boundaries"
    path = tmp_path / "long.tsv"
    _long_line_file(path, before=200_000, length=12_000_000)
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    longest = max(range(len(lines)), key=lambda i: len(lines[i]))
    kwargs = {"names": ["a", "b"], "dtypes": {"a": "int64"}, "part_size": part_size}
    with pytest.raises(DataError, match=rf"{path}, line {longest + 1}: the line is {len(lines[longest]):,} bytes "
                                        r"long, more than the CSV parser's block of block_size=2,097,152 bytes "
                                        r"can hold: pass block_size= at least its length to Dataset "
                                        r"\(e\.g\. block_size=\"16MB\"\)"):
        ts.Dataset(str(path), **kwargs).num_rows  # noqa: B018
    # the option it names reads the file, every row whole
    ds = ts.Dataset(str(path), block_size="16MB", **kwargs)
    got = pd.concat(list(ds.to_iter()), ignore_index=True)
    expected = pd.read_csv(path, sep="\t", header=None, names=["a", "b"])
    assert got["a"].tolist() == expected["a"].tolist()
    assert got["b"].str.len().tolist() == expected["b"].str.len().tolist()


def test_block_size_values(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("1\tx\n")
    with pytest.raises(ValueError, match=r"block_size='huge': expected a byte count or a size such as '8MB'"):
        ts.Dataset(str(path), names=["a", "b"], block_size="huge")
    with pytest.raises(TypeError, match="block_size must be a byte count"):
        ts.Dataset(str(path), names=["a", "b"], block_size=True)
    assert ts.Dataset(str(path), names=["a", "b"], block_size=1 << 20).num_rows == 1


def test_repeated_column_names(tmp_path):
    path = tmp_path / "a.tsv"
    path.write_text("1\t2\t3\n")
    with pytest.raises(ValueError, match=rf"names= lists the column 'b' twice \(positions 2 and 3 of 3\), "
                                         rf"reading {path}: give each column its own name"):
        ts.Dataset(str(path), names=["a", "b", "b"])
    with pytest.raises(TypeError, match="names must be a list of column names"):
        ts.Dataset(str(path), names="abc")
    header = tmp_path / "h.csv"
    header.write_text("a,b,a\n1,2,3\n")
    with pytest.raises(DataError, match=rf"{header}, line 1: read as the header line, it has the column name "
                                        r"'a' twice \(field 3 of 3"):
        ts.Dataset(str(header))


def test_headerless_line_of_many_fields_is_not_split_as_a_header(tmp_path):
    # header=False compares the first line with the names: a line of a million fields
    # is told apart by its count, not split
    path = tmp_path / "a.tsv"
    with open(path, "w") as f:
        f.write("\t".join("1" * 1_000_000) + "\n")
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"{path}, line 1: expected 2 fields separated by '\\t', got 1000000"):
        ts.Dataset(str(path), names=["a", "b"]).num_rows  # noqa: B018
    assert time.monotonic() - start < 10

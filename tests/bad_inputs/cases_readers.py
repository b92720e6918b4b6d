"""Reading (issue 27): folders holding more than data, parquet files whose columns
differ, hostile CSV/TSV headers and lines, repeated column names, a schema file that
describes other data, struct and map columns in the loaders. (Object-store faults
need a server: tests/pipeline/test_object_store_reads.py.)"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data
from tabstream.pipeline.dataset import DatasetWarning


def _probabilities_not_rows(fmt):
    def run(tmp):
        files = write_data("criteo", tmp / "raw", 300, num_files=3, fmt=fmt, return_probability=True)
        kwargs = {} if fmt == "parquet" else {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}
        with pytest.warns(DatasetWarning, match=r"does not read its subfolders: .*probabilities/ \(3 files\)"):
            ds = ts.Dataset(str(tmp / "raw"), **kwargs)
        read = (pd.read_parquet if fmt == "parquet"
                else lambda f: pd.read_csv(f, sep="\t", header=None, names=CRITEO_COLUMNS))
        expected = pd.concat([read(f) for f in sorted(files)], ignore_index=True)
        got = pd.concat(list(ds.to_iter()), ignore_index=True)
        assert len(got) == len(expected) == 300
        np.testing.assert_array_equal(got["label"].to_numpy(), expected["label"].to_numpy())
    return run


def _only_side_folders(tmp):
    (tmp / "d" / "old").mkdir(parents=True)
    pd.DataFrame({"a": [1]}).to_parquet(tmp / "d" / "old" / "p.parquet")
    ts.Dataset(str(tmp / "d"))


def _strict_schema(tmp):
    pd.DataFrame({"a": [1], "b": [2.0]}).to_parquet(tmp / "p0.parquet", index=False)
    pd.DataFrame({"a": [3]}).to_parquet(tmp / "p1.parquet", index=False)
    ts.Dataset(str(tmp), strict_schema=True)


def _unified_schema_warns_once(tmp):
    pd.DataFrame({"a": [1], "b": [2.0]}).to_parquet(tmp / "p0.parquet", index=False)
    pd.DataFrame({"a": [3], "c": ["x"]}).to_parquet(tmp / "p1.parquet", index=False)
    with pytest.warns(DatasetWarning, match=r"\['c'\] null in the rows of .*p0\.parquet \(held by .*p1\.parquet\); "
                                            r"\['b'\] null in the rows of .*p1\.parquet \(held by .*p0\.parquet\)") as said:
        ds = ts.Dataset(str(tmp))
    assert len(said) == 1
    got = pd.concat(list(ds.to_iter()), ignore_index=True)
    expected = pd.concat([pd.read_parquet(tmp / "p0.parquet"), pd.read_parquet(tmp / "p1.parquet")],
                         ignore_index=True)
    assert got["a"].tolist() == expected["a"].tolist()
    assert got["b"].isna().tolist() == expected["b"].isna().tolist()
    assert got["c"].isna().tolist() == expected["c"].isna().tolist()


def _header_of_millions(tmp):
    with open(tmp / "wide.csv", "w") as f:
        f.write(",".join(f"c{i}" for i in range(2_000_000)) + "\n")
    ts.Dataset(str(tmp / "wide.csv"))


def _gz_header_over_the_limit(tmp):
    with gzip.open(tmp / "wide.tsv.gz", "wt") as f:
        f.write("\t".join(f"c{i}" for i in range(150_000)) + "\n")
    ts.Dataset(str(tmp / "wide.tsv.gz"))


def _long_line(tmp, name="long.tsv", opener=open, quote=""):
    sep = "\t" if ".tsv" in name else ","
    with opener(tmp / name, "wt") as f:
        for i in range(1_000):
            f.write(f"{i}{sep}x\n")
        f.write(f"1000{sep}{quote}{'y' * 9_000_000}{quote}\n")
        f.write(f"1001{sep}x\n")
    ts.Dataset(str(tmp / name), names=["a", "b"], dtypes={"a": "int64"}).num_rows  # noqa: B018


def _names_twice(tmp):
    (tmp / "a.tsv").write_text("1\t2\t3\n")
    ts.Dataset(str(tmp / "a.tsv"), names=["a", "b", "a"])


def _header_twice(tmp):
    (tmp / "h.csv").write_text("id,x,x\n1,2,3\n")
    ts.Dataset(str(tmp / "h.csv"))


def _parquet_twice(tmp):
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["id", "id"]), tmp / "p.parquet")
    ts.Dataset(str(tmp / "p.parquet"))


def _schema_file_ghost_columns(tmp):
    out = tmp / "out"
    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(out))
    schema = json.loads((out / "_schema.json").read_text())
    schema["columns"] += [{**schema["columns"][0], "name": "label"}, {**schema["columns"][0], "name": "C1"}]
    (out / "_schema.json").write_text(json.dumps(schema))
    ts.Dataset(str(out))


def _bad_block_size(tmp):
    (tmp / "a.tsv").write_text("1\n")
    ts.Dataset(str(tmp / "a.tsv"), names=["a"], block_size="big")


def _loader_record(column):
    def run(tmp):
        from tabstream.loaders import Loader

        pq.write_table(pa.table({
            "x": [1.0, 2.0], "label": [0, 1],
            "s": pa.array([{"f": 1}, {"f": 2}]),
            "m": pa.array([[("k", 1)], []], type=pa.map_(pa.string(), pa.int64())),
        }), tmp / "p.parquet")
        Loader(str(tmp / "p.parquet"), 2, features=["x", column], labels=["label"])
    return run


CASES = [
    ("write_data parquet folder reads no probabilities", _probabilities_not_rows("parquet"), None, None),
    ("write_data TSV folder reads no probabilities", _probabilities_not_rows("tsv"), None, None),
    ("folder with only side folders", _only_side_folders, FileNotFoundError,
     r"holds no data files of its own, only in subfolders that are not data: .*/d/old/ \(1 file\)"),
    ("strict_schema refuses differing files", _strict_schema, SchemaError,
     r"p1\.parquet: lacks the columns \['b'\] that .*p0\.parquet has; strict_schema=True refuses"),
    ("differing files unified, one warning", _unified_schema_warns_once, None, None),
    ("header of millions of fields", _header_of_millions, DataError,
     r"wide\.csv, line 1: read as the header line, it is longer than 2,097,152 bytes.*at least [\d,]+ fields"),
    ("gz header over MAX_CSV_COLUMNS", _gz_header_over_the_limit, DataError,
     r"wide\.tsv\.gz, line 1: read as the header line, it holds 150,000 fields, more than MAX_CSV_COLUMNS"),
    ("TSV line longer than the block", _long_line, DataError,
     r"long\.tsv, line 1001: the line is 9,000,005 bytes long.*block_size=\"16MB\""),
    ("quoted CSV line longer than the block", lambda tmp: _long_line(tmp, "long.csv", quote='"'), DataError,
     r"long\.csv, line 1001: the line is 9,000,007 bytes long.*pass block_size="),
    ("gz TSV line longer than the block", lambda tmp: _long_line(tmp, "long.tsv.gz", gzip.open), DataError,
     r"long\.tsv\.gz, line 1001: the line is 9,000,005 bytes long"),
    ("names= names a column twice", _names_twice, ValueError,
     r"names= lists the column 'a' twice \(positions 1 and 3 of 3\), reading .*a\.tsv"),
    ("header names a column twice", _header_twice, DataError, r"h\.csv, line 1: .*the column name 'x' twice"),
    ("parquet file names a column twice", _parquet_twice, DataError,
     r"p\.parquet: the file has 1 column name more than once: \['id'\]"),
    ("_schema.json lists columns no file holds", _schema_file_ghost_columns, DataError,
     r"out/_schema\.json: lists the columns \['label', 'C1'\], which none of the 1 data file holds"),
    ("block_size not a size", _bad_block_size, ValueError, r"block_size='big': expected a byte count"),
    ("loader given a struct column", _loader_record("s"), TypeError,
     r"column 's' is a struct column \(type struct<f: int64>\).*one column per field \('s\.f';"),
    ("loader given a map column", _loader_record("m"), TypeError,
     r"column 'm' is a map column \(type map<string, int64.*\).*two list columns"),
]

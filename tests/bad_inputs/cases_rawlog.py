"""Raw TSV logs that are not clean text, through the CLI (one line + a hint) and the
API: each fails naming the file and the line in the file, or reads correctly."""

from __future__ import annotations

import gzip
import io
import json
import zlib

import pandas as pd
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.datasets.synthetic import CRITEO_COLUMNS


def _criteo_lines(tmp, rows: int = 300) -> list[bytes]:
    cli("synth", "criteo", tmp / "synth", "--rows", rows, "--format", "tsv")
    return (tmp / "synth" / "part_00000.tsv").read_bytes().splitlines()


def _write(path, lines: list[bytes], end: bytes = b"\n") -> str:
    path.write_bytes(end.join(lines) + end)
    return str(path)


def _bad_utf8_cli(tmp):
    lines = _criteo_lines(tmp)
    lines[180] += b"\xff"  # the last column, C26, is a string column
    cli("inspect", _write(tmp / "day_0.tsv", lines), "--criteo-tsv", "--part-size", "4KB", "--quiet")


def _nul_byte_cli(tmp):
    lines = _criteo_lines(tmp)
    lines[41] = lines[41].replace(b"\t", b"\t\x00", 1)  # I1 starts with a NUL byte
    cli("inspect", _write(tmp / "day_1.tsv", lines), "--criteo-tsv", "--quiet")


def _truncated_gz_cli(tmp):
    lines = _criteo_lines(tmp, rows=3000)
    data = gzip.compress(b"\n".join(lines) + b"\n")
    cut = data[: len(data) * 2 // 3]
    (tmp / "day_2.tsv.gz").write_bytes(cut)
    readable = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(cut).count(b"\n")
    try:
        cli("inspect", tmp / "day_2.tsv.gz", "--criteo-tsv", "--quiet")
    except CliFailed as exc:
        assert f"reads up to line {readable}, then fails" in str(exc), str(exc)
        raise


def _header_by_mistake_cli(tmp):
    lines = [("\t".join(CRITEO_COLUMNS)).encode(), *_criteo_lines(tmp)]
    cli("inspect", _write(tmp / "day_3.tsv", lines), "--criteo-tsv", "--quiet")


def _bom_and_crlf_read_correctly(tmp):
    lines = _criteo_lines(tmp)
    path = tmp / "windows.tsv"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(lines) + b"\r\n")
    report = json.loads(cli("inspect", path, "--criteo-tsv", "--json", "--quiet"))
    expected = pd.read_csv(io.BytesIO(path.read_bytes()), sep="\t", names=CRITEO_COLUMNS,
                           encoding="utf-8-sig", dtype=str, keep_default_na=False, na_values=[""])
    assert report["num_rows"] == len(expected)
    columns = {c["name"]: c for c in report["columns"]}
    for name in ("label", "I1", "C26"):
        assert columns[name]["distinct"] == expected[name].nunique(), name
    assert not expected["C26"].str.contains("\r", na=False).any()


def _bad_utf8_api(tmp):
    path = tmp / "raw.csv"
    path.write_bytes(b"a,b\n1,x\n2,y\xc3\n3,z\n")
    ts.Dataset(str(path), dtypes={"a": "int64"}).to_parquet(str(tmp / "out"))


def _header_by_mistake_api(tmp):
    path = tmp / "raw.csv"
    path.write_bytes(b"a,b\n1,x\n")
    list(ts.Dataset(str(path), names=["a", "b"], header=False).to_iter())


CASES = [
    ("invalid UTF-8 (CLI)", _bad_utf8_cli, CliFailed,
     r"DataError: .*day_0\.tsv, line 181, column 'C26': invalid UTF-8 bytes .*\n  hint: .*re-encode"),
    ("NUL byte, a binary line (CLI)", _nul_byte_cli, CliFailed,
     r"day_1\.tsv, line 42: a NUL byte at column 'I1'.*\n  hint: .*not UTF-8 text"),
    ("truncated .gz (CLI)", _truncated_gz_cli, CliFailed,
     r"day_2\.tsv\.gz: the compressed file is truncated or corrupt.*\n  hint: .*fetch or compress it again"),
    ("header line given by mistake (CLI)", _header_by_mistake_cli, CliFailed,
     r"day_3\.tsv, line 1: the line holds the column names .*header=True.*\n  hint: .*header=True"),
    ("UTF-8 BOM and CRLF endings read correctly (CLI)", _bom_and_crlf_read_correctly, None, None),
    ("invalid UTF-8 (API export)", _bad_utf8_api, DataError, r"raw\.csv, line 3, column 'b': invalid UTF-8"),
    ("header line given by mistake (API)", _header_by_mistake_api, DataError,
     r"raw\.csv, line 1: the line holds the column names"),
]

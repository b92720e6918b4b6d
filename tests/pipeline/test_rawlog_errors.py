"""Raw logs that are not clean text: each reads correctly or fails naming the file
and the line in the file (1-based, a header line counted), whatever block the line
falls in."""

from __future__ import annotations

import gzip
import io
import re
import zlib

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError

NAMES = ["label", "I1", "C1"]
DTYPES = {"label": "int64", "I1": "int64", "C1": "string"}


def _rows(n: int, seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [b"%d\t%d\tc%x" % (rng.integers(0, 2), rng.integers(0, 10**6), rng.integers(0, 2**31))
            for _ in range(n)]


def _read_all(ds: ts.Dataset) -> pd.DataFrame:
    return pd.concat(list(ds.to_iter()), ignore_index=True)


def _expected(lines: list[bytes], names=NAMES) -> pd.DataFrame:
    """The same rows read a second, simpler way: split the text by hand."""
    fields = [line.decode().split("\t") for line in lines]
    df = pd.DataFrame(fields, columns=names)
    return df.assign(label=df["label"].astype("int64"), I1=df["I1"].astype("int64"))


def _assert_frame(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    assert list(got.columns) == list(expected.columns)
    for name in expected.columns:
        assert [str(v) for v in got[name].tolist()] == [str(v) for v in expected[name].tolist()], name


@pytest.mark.parametrize("bad_index", [0, 7, 333])
def test_invalid_utf8_names_the_file_line_and_column(tmp_path, bad_index):
    lines = _rows(400)
    lines[bad_index] = lines[bad_index] + b"\xff\xfe"
    path = tmp_path / "day_0.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    assert ds.npartitions > 4  # the bad line can fall in a later block
    with pytest.raises(DataError, match=rf"day_0\.tsv, line {bad_index + 1}, column 'C1': invalid UTF-8") as info:
        _read_all(ds)
    assert "re-encode" in info.value.hint


def test_invalid_utf8_in_an_int_column_names_the_line(tmp_path):
    lines = _rows(300)
    lines[211] = b"1\t12\xe93\tabc"
    path = tmp_path / "raw.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=r"raw\.tsv, line 212, column 'I1': invalid UTF-8 bytes b'\\xe9'"):
        _read_all(ds)


def test_invalid_utf8_line_counts_the_header(tmp_path):
    lines = [b"label\tI1\tC1", *_rows(50)]
    lines[31] += b"\x80"
    path = tmp_path / "with_header.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), dtypes=DTYPES, sep="\t", header=True)
    with pytest.raises(DataError, match=r"with_header\.tsv, line 32, column 'C1'"):
        _read_all(ds)


@pytest.mark.parametrize(("bad_index", "column"), [(0, "label"), (250, "C1"), (399, "I1")])
def test_nul_byte_is_a_binary_line(tmp_path, bad_index, column):
    lines = _rows(400)
    fields = lines[bad_index].split(b"\t")
    fields[NAMES.index(column)] += b"\x00\x01\x02"
    lines[bad_index] = b"\t".join(fields)
    path = tmp_path / "bin.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=rf"bin\.tsv, line {bad_index + 1}: a NUL byte at column '{column}'"):
        _read_all(ds)


def test_utf16_file_is_refused_at_line_1(tmp_path):
    path = tmp_path / "utf16.csv"
    path.write_bytes("a,b\n1,x\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"utf16\.csv, line 1: a NUL byte"):
        _read_all(ts.Dataset(str(path), names=["a", "b"], header=True))


def test_truncated_gzip_names_the_file_and_the_last_line_read(tmp_path):
    lines = _rows(20000, seed=3)
    full = gzip.compress(b"\n".join(lines) + b"\n")
    cut = full[: len(full) // 2]
    path = tmp_path / "day_1.tsv.gz"
    path.write_bytes(cut)
    # How far the cut file decompresses, found a second way: zlib on the raw bytes.
    readable = zlib.decompressobj(zlib.MAX_WBITS | 16).decompress(cut).count(b"\n")
    assert 0 < readable < len(lines)
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t")
    with pytest.raises(DataError, match=rf"day_1\.tsv\.gz: the compressed file is truncated or corrupt "
                                        rf".*reads up to line {readable}, then fails") as info:
        _read_all(ds)
    assert "fetch or compress it again" in info.value.hint


def test_corrupt_gzip_header_names_the_file(tmp_path):
    path = tmp_path / "broken.tsv.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t")
    with pytest.raises(DataError, match=r"broken\.tsv\.gz: the compressed file is truncated or corrupt"):
        _read_all(ds)


def test_complete_gzip_reads_every_row(tmp_path):
    lines = _rows(3000, seed=4)
    path = tmp_path / "ok.tsv.gz"
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    _assert_frame(_read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t")), _expected(lines))


@pytest.mark.parametrize("dtypes", [DTYPES, {}], ids=["typed", "all-strings"])
def test_header_line_given_by_mistake_is_refused(tmp_path, dtypes):
    lines = [b"label\tI1\tC1", *_rows(20)]
    path = tmp_path / "headed.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=dtypes, sep="\t")
    with pytest.raises(DataError, match=r"headed\.tsv, line 1: the line holds the column names .*"
                                        r"pass header=True") as info:
        _read_all(ds)
    assert "header=True" in info.value.hint


def test_header_line_is_skipped_when_asked(tmp_path):
    lines = [b"label\tI1\tC1", *_rows(20)]
    path = tmp_path / "headed.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", header=True)
    _assert_frame(_read_all(ds), _expected(lines[1:]))


def test_a_row_that_merely_resembles_names_is_data(tmp_path):
    lines = [b"label\tI1\tC2", b"label\tI1\tC1x"]  # not the names: plain string rows
    path = tmp_path / "strings.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, sep="\t")
    got = _read_all(ds)
    assert got.values.tolist() == [line.decode().split("\t") for line in lines]


@pytest.mark.parametrize("header", [True, False])
def test_utf8_bom_is_stripped(tmp_path, header):
    text = "C1,I1\nb,2\nc,3\n" if header else "b,2\nc,3\n"
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    kwargs = {} if header else {"names": ["C1", "I1"]}
    ds = ts.Dataset(str(path), dtypes={"I1": "int64"}, header=header, **kwargs)
    expected = pd.read_csv(io.BytesIO(path.read_bytes()), encoding="utf-8-sig",
                           header=0 if header else None, names=None if header else ["C1", "I1"])
    assert ds.schema.column_names == ["C1", "I1"]
    got = _read_all(ds)
    assert got["C1"].tolist() == expected["C1"].tolist()
    assert got["I1"].tolist() == expected["I1"].tolist()


def test_crlf_endings_keep_no_carriage_return(tmp_path):
    lines = [b"c%d\t%d" % (i, i * 7) for i in range(500)]
    path = tmp_path / "windows.tsv"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    ds = ts.Dataset(str(path), names=["C1", "I1"], dtypes={"I1": "int64"}, sep="\t", part_size=1000)
    assert ds.npartitions > 2
    got = _read_all(ds)
    expected = pd.read_csv(io.BytesIO(path.read_bytes()), sep="\t", names=["C1", "I1"])
    assert got["C1"].tolist() == expected["C1"].tolist()
    assert not any("\r" in v for v in got["C1"].tolist())
    assert got["I1"].tolist() == expected["I1"].tolist()


def test_crlf_string_last_column_has_no_carriage_return(tmp_path):
    lines = _rows(100)
    path = tmp_path / "crlf.tsv"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    got = _read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000))
    _assert_frame(got, _expected(lines))


def test_crlf_bad_value_names_the_file_line(tmp_path):
    lines = [b"c%d\t%d" % (i, i) for i in range(300)]
    lines[260] = b"c260\tx1"
    path = tmp_path / "windows.tsv"
    path.write_bytes(b"\r\n".join(lines) + b"\r\n")
    ds = ts.Dataset(str(path), names=["C1", "I1"], dtypes={"I1": "int64"}, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=re.escape("windows.tsv, line 261, column 'I1': value 'x1'")):
        _read_all(ds)


def test_export_of_a_bad_log_raises_the_data_error(tmp_path):
    lines = _rows(200)
    lines[150] += b"\xff"
    path = tmp_path / "raw.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=r"raw\.tsv, line 151, column 'C1': invalid UTF-8"):
        ds.to_parquet(str(tmp_path / "out"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw.tsv"], "no output, no leftovers"


def test_short_line_of_invalid_utf8_names_the_line(tmp_path):
    lines = _rows(300)
    lines[260] = b"1\t\xff"  # a field short and not UTF-8
    path = tmp_path / "short.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=r"short\.tsv, line 261, column 'I1': invalid UTF-8 bytes b'\\xff'"):
        _read_all(ds)


def test_short_line_before_invalid_utf8_is_reported_first(tmp_path):
    lines = _rows(300)
    lines[250] = b"1\t2"
    lines[255] = b"1\t2\t\xff"
    path = tmp_path / "both.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=100_000)
    assert ds.npartitions == 1
    with pytest.raises(DataError, match=r"both\.tsv, line 251: expected 3 fields separated by '\\t', got 2"):
        _read_all(ds)


def test_cli_prints_one_line_and_the_errors_own_hint(tmp_path, capsys):
    from tabstream.cli import main

    lines = [b"label\tI1\tC1", *_rows(5)]
    path = tmp_path / "headed.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    wf = tmp_path / "wf.py"
    wf.write_text(
        "import tabstream as ts\n"
        "workflow = ts.Workflow(['label', 'I1', 'C1'])\n"
        f"dataset_kwargs = {{'names': {NAMES!r}, 'dtypes': {DTYPES!r}, 'sep': '\\t'}}\n"
    )
    assert main(["fit", str(path), "--workflow-file", str(wf), "--output", str(tmp_path / "out"), "--quiet"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2, err
    assert re.fullmatch(r"tabstream fit: DataError: .*headed\.tsv, line 1: the line holds the column names.*", err[0])
    assert err[1] == "  hint: the file has a header line: pass header=True (keeping names=[...])"


def test_quoted_csv_header_given_by_mistake_is_refused(tmp_path):
    path = tmp_path / "quoted.csv"
    path.write_bytes(b'"a","b"\n1,x\n')
    with pytest.raises(DataError, match=r"quoted\.csv, line 1: the line holds the column names"):
        _read_all(ts.Dataset(str(path), names=["a", "b"]))


def test_missing_gz_file_is_not_called_truncated(tmp_path):
    path = tmp_path / "gone.tsv.gz"
    path.write_bytes(gzip.compress(b"1\t2\tx\n"))
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t")
    path.unlink()
    with pytest.raises(FileNotFoundError, match=r"gone\.tsv\.gz"):
        _read_all(ds)

"""Raw TSV blocks are parsed by Arrow in small chunks (``_CSV_PARSE_BLOCK``, for
speed): the rows, their order and every error's line number must not depend on
where those chunk boundaries fall. Tests shrink the chunk to a few hundred bytes so
that a small file spans many of them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.pipeline import csv_files

NAMES = ["label", "I1", "C1", "C2"]
DTYPES = {"label": "int64", "I1": "int64", "C1": "string", "C2": "string"}


@pytest.fixture
def small_chunks(monkeypatch):
    monkeypatch.setattr(csv_files, "_CSV_PARSE_BLOCK", 300)


def _lines(n: int, seed: int = 0, nulls: bool = True) -> list[bytes]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        i1 = b"" if nulls and rng.random() < 0.2 else b"%d" % rng.integers(-10**6, 10**6)
        c1 = b"" if nulls and rng.random() < 0.2 else b"c%x" % rng.integers(0, 2**31)
        c2 = b"" if nulls and rng.random() < 0.2 else b"d%x" % rng.integers(0, 50)
        out.append(b"\t".join([b"%d" % rng.integers(0, 2), i1, c1, c2]))
    return out


def _expected(lines: list[bytes]) -> dict[str, list]:
    """The rows split by hand: empty fields are nulls, integers parsed by Python."""
    fields = [line.decode().split("\t") for line in lines]
    cols = {n: [f[i] or None for f in fields] for i, n in enumerate(NAMES)}
    for n in ("label", "I1"):
        cols[n] = [None if v is None else int(v) for v in cols[n]]
    return cols


def _read_all(ds: ts.Dataset) -> pa.Table:
    return pa.concat_tables([ds.read_piece(p) for p in ds.pieces])


@pytest.mark.parametrize("part_size", [4000, 10**6])
@pytest.mark.parametrize("cache", [None, "auto"])
def test_rows_are_the_same_however_the_block_is_chunked(tmp_path, small_chunks, part_size, cache):
    lines = _lines(2000)
    path = tmp_path / "day_0.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size, cache=cache)
    first = ds.read_piece(ds.pieces[0])
    assert first.column("C1").num_chunks > 1  # the small chunks are in use
    for _ in range(2):  # with the cache: parsed, then read from the cache
        got = _read_all(ds)
        assert got.to_pydict() == _expected(lines)


def test_a_line_of_empty_fields_is_a_row_of_nulls_not_a_blank_line(tmp_path, small_chunks):
    # every column has nulls, so the block is searched for blank lines: there is none
    lines = _lines(500)
    lines[0] = b"\t\t\t"
    lines[321] = b"\t\t\t"
    path = tmp_path / "nulls.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = _read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t"))
    expected = _expected(lines)
    assert expected["label"][321] is None and expected["C2"][0] is None
    assert got.to_pydict() == expected


@pytest.mark.parametrize("nulls", [True, False])
@pytest.mark.parametrize("bad_index", [3, 777, 1499])
def test_blank_line_is_found_whatever_the_nulls(tmp_path, small_chunks, nulls, bad_index):
    # Arrow reads a blank line as a row of nulls: it is an error, in a file whose
    # columns all hold nulls as well as in one whose label never is
    lines = _lines(1500, nulls=nulls)
    lines.insert(bad_index, b"")
    path = tmp_path / "blank.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    for part_size in (5000, 10**6):
        ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size)
        with pytest.raises(DataError, match=rf"blank\.tsv, line {bad_index + 1}: expected 4 fields .* "
                                            "got a blank line"):
            _read_all(ds)


def _short_line(line: bytes) -> bytes:
    return line.rsplit(b"\t", 1)[0]


def _bad_int(line: bytes) -> bytes:
    f = line.split(b"\t")
    return b"\t".join([f[0], b"12x", *f[2:]])


def _bad_utf8(line: bytes) -> bytes:
    return line + b"\xff"


def _nul(line: bytes) -> bytes:
    return line.replace(b"\t", b"\t\x00", 1)


@pytest.mark.parametrize(("spoil", "message"), [
    (_short_line, r"line {line}: expected 4 fields separated by '\\t', got 3"),
    (_bad_int, r"line {line}, column 'I1': value '12x' is not a valid int64"),
    (_bad_utf8, r"line {line}, column 'C2': invalid UTF-8 bytes"),
    (_nul, r"line {line}: a NUL byte at column 'I1'"),
])
@pytest.mark.parametrize("bad_index", [0, 640, 1999])
@pytest.mark.parametrize("header", [False, True])
def test_errors_name_the_line_across_chunks(tmp_path, small_chunks, spoil, message, bad_index, header):
    lines = _lines(2000, nulls=False)
    lines[bad_index] = spoil(lines[bad_index])
    if header:
        lines.insert(0, "\t".join(NAMES).encode())
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    line = bad_index + 1 + (1 if header else 0)  # 1-based, the header line counted
    for part_size in (7000, 10**6):
        ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size,
                        header=header)
        with pytest.raises(DataError, match=message.format(line=line)):
            _read_all(ds)


def test_criteo_like_log_reads_as_pandas_does(tmp_path, monkeypatch):
    """A generated Criteo-like log (40 columns, many nulls) read with small chunks
    equals pandas' own read of the file."""
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data

    write_data("criteo", str(tmp_path / "logs"), 600, num_files=1, fmt="tsv", seed=3)
    path = str(tmp_path / "logs" / "part_00000.tsv")
    # Criteo-like lines are ~250 bytes: a few per chunk
    monkeypatch.setattr(csv_files, "_CSV_PARSE_BLOCK", 2000)
    got = _read_all(ts.Dataset(path, names=CRITEO_COLUMNS, dtypes=CRITEO_DTYPES, sep="\t",
                               part_size=40_000))
    expected = pd.read_csv(path, sep="\t", header=None, names=CRITEO_COLUMNS, quoting=3,
                           keep_default_na=False, na_values=[""],
                           dtype={n: "Int64" if t == "int64" else "string" for n, t in CRITEO_DTYPES.items()})
    for name in CRITEO_COLUMNS:
        want = [None if pd.isna(v) else (int(v) if CRITEO_DTYPES[name] == "int64" else v)
                for v in expected[name].tolist()]
        assert got.column(name).to_pylist() == want, name


@pytest.mark.parametrize("ending", [b"\n", b"", b"\r\n"])
def test_mapped_blocks_are_cut_as_read_block_cuts_them(tmp_path, ending):
    """Local files are memory-mapped instead of read: every piece's text is the
    same as fsspec's ``read_block`` gives, and the pieces tile the file."""
    from fsspec.utils import read_block

    rng = np.random.default_rng(5)
    lines = [b"x" * int(n) for n in rng.integers(0, 120, 400)]
    lines[100] = b"y" * 3000  # longer than a block: the next blocks are empty
    text = b"\n".join(lines).replace(b"\n", ending or b"\n") + ending
    path = tmp_path / "lines.tsv"
    path.write_bytes(text)
    for block_bytes in (17, 50, 333, 1000, 10**6):
        ds = ts.Dataset(str(path), names=["a"], sep="\t", part_size=max(1, block_bytes * 5 // 3))
        pieces = ds.pieces
        assert len(pieces) > 1 or block_bytes == 10**6
        got = [ds._csv._csv_block(p).data() for p in pieces]
        with open(path, "rb") as f:
            assert got == [read_block(f, p.offset, p.length, delimiter=b"\n") for p in pieces]
        assert b"".join(got) == text


def test_empty_file_reads_no_rows(tmp_path):
    path = tmp_path / "empty.tsv"
    path.write_bytes(b"")
    got = _read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t"))
    assert got.num_rows == 0 and got.schema.names == NAMES


@pytest.mark.parametrize("bad", [False, True])
def test_non_ascii_text_is_checked_as_utf8(tmp_path, small_chunks, bad):
    # Arrow's UTF-8 check is skipped only for blocks of pure ASCII: a block with
    # other valid UTF-8 reads as written, one with invalid bytes is refused
    lines = _lines(1000, nulls=False)
    lines[10] = lines[10] + "é日本".encode()
    if bad:
        lines[900] = lines[900] + b"\xe6\x97"  # a cut 3-byte character
    path = tmp_path / "text.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t")
    if bad:
        with pytest.raises(DataError, match=r"text\.tsv, line 901, column 'C2': invalid UTF-8 bytes"):
            _read_all(ds)
    else:
        assert _read_all(ds).to_pydict() == _expected(lines)


@pytest.mark.parametrize("part_size", [10, 10**6])
def test_a_block_of_only_empty_fields_keeps_its_rows(tmp_path, part_size):
    # rows whose every field is empty are rows of nulls: a block holding nothing
    # else was taken for blank text and its rows were dropped without a word
    lines = [b"\t\t\t"] * 7 + [b"1\t2\tab\tcd"] + [b"\t\t\t"] * 3
    path = tmp_path / "nulls.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size)
    assert part_size > 100 or len(ds.pieces) > 2
    got = _read_all(ds)
    assert got.to_pydict() == _expected(lines)
    assert ds.num_rows == len(lines)


def test_a_line_of_spaces_is_not_dropped_as_blank(tmp_path):
    # three columns: a line of spaces is one field, an error naming the line
    path = tmp_path / "spaces.tsv"
    path.write_bytes(b"   \n")
    with pytest.raises(DataError, match=r"spaces\.tsv, line 1: expected 4 fields"):
        _read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t"))

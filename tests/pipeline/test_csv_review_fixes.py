"""CSV/TSV reading, faults found by a review: every file's header line checked
against the first's, quoted header names, integers past int64 and hexadecimal
literals, blank lines where a block ends, a file of only a BOM, one-column files,
and quoted values holding a line break where the file is cut into parts. What reads
is compared with pandas (or Python's csv module) reading the same files."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import fsspec
import pandas as pd
import pyarrow as pa
import pytest

from tabstream.core.errors import DataError
from tabstream.pipeline.dataset import Dataset


def write(path: Path, text: str | bytes) -> str:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return str(path)


def read_all(paths, **kw) -> tuple[Dataset, pa.Table]:
    """Every piece read, in order, as one table."""
    ds = Dataset(paths, cache=None, **kw)
    return ds, pa.concat_tables([ds.read_piece(p) for p in ds.pieces])


def cutting_at(size: int, positions: set[int], start: int = 40) -> int:
    """A part_size whose pieces of a ``size``-byte file start at one of ``positions``
    (Dataset cuts a file into equal blocks of at most 3/5 part_size)."""
    for part_size in range(start, 20 * size):
        count = -(-size // max(1, part_size * 3 // 5))
        block = -(-size // count)
        if positions & set(range(0, size, block)):
            return part_size
    raise AssertionError("no part_size cuts there")


# -- 1. the header line of every file -------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"names": ["x", "y"], "header": True}], ids=["inferred", "names"])
def test_a_headerless_second_file_is_refused_not_its_first_row_dropped(tmp_path: Path, kw) -> None:
    a = write(tmp_path / "a.csv", "x,y\n1,2\n3,4\n")
    b = write(tmp_path / "b.csv", "5,6\n7,8\n")
    with pytest.raises(DataError, match=r"b\.csv, line 1: .*'5,6'.*a\.csv: 'x,y'"):
        read_all([a, b], **kw)


def test_a_reordered_header_is_refused_not_its_columns_swapped(tmp_path: Path) -> None:
    a = write(tmp_path / "a.csv", "x,y\n1,2\n3,4\n")
    c = write(tmp_path / "c.csv", "y,x\n10,20\n")
    with pytest.raises(DataError, match=r"c\.csv, line 1: .*'y,x'.*a\.csv: 'x,y'"):
        read_all([a, c])


def test_equal_headers_quoted_or_not_read_every_row(tmp_path: Path) -> None:
    paths = [write(tmp_path / "a.csv", "x,y\n1,2\n3,4\n"),
             write(tmp_path / "b.csv", b'\xef\xbb\xbf"x","y"\r\n5,6\r\n'),
             write(tmp_path / "e.csv", ""),
             write(tmp_path / "c.csv", "x,y\n7,8\n")]
    want = pd.concat([pd.read_csv(p) for p in paths if Path(p).stat().st_size], ignore_index=True)
    _, got = read_all(paths)
    assert got.to_pydict() == want.to_dict("list")
    # the header is taken from the first file that has one
    _, got = read_all(paths[2:] + paths[:2])
    assert got.column_names == ["x", "y"] and got.num_rows == len(want)


# -- 4. quoted header names ---------------------------------------------------------

def test_quoted_header_names_are_unquoted_as_pandas_reads_them(tmp_path: Path) -> None:
    frame = pd.DataFrame({"user id": [1, 2], "city, state": ["a", "b"], "say \"hi\"": [0.5, 1.5]})
    path = str(tmp_path / "q.csv")
    frame.to_csv(path, index=False, quoting=csv.QUOTE_ALL)
    want = pd.read_csv(path)
    ds, got = read_all(path)
    assert ds.arrow_schema.names == list(want.columns) == list(frame.columns)
    assert got.to_pydict() == want.to_dict("list")
    # header=False: a quoted line of the names is recognised as the header
    with pytest.raises(DataError, match=r"q\.csv, line 1: the line holds the column names"):
        read_all(path, names=list(frame.columns), header=False,
                 dtypes={n: "string" for n in frame.columns})


# -- 2. integers past int64 ---------------------------------------------------------

def test_integers_past_int64_are_inferred_uint64_exactly(tmp_path: Path) -> None:
    ids = [18446744073709551557, 18446744073709551558, 9223372036854775809, 12]
    path = write(tmp_path / "ids.csv", "id,x\n" + "".join(f"{i},{n}\n" for n, i in enumerate(ids)))
    want = pd.read_csv(path)["id"]
    ds, got = read_all(path)
    assert ds.arrow_schema.field("id").type == pa.uint64() and str(want.dtype) == "uint64"
    assert got.column("id").to_pylist() == [int(v) for v in want] == ids


def test_a_later_value_that_uint64_cannot_hold_is_an_error(tmp_path: Path) -> None:
    lines = ["id,x"] + [f"{2**63 + k},{k}" for k in range(5000)] + ["-1,0"]
    path = write(tmp_path / "late.csv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"late\.csv, line 5002, column 'id': value '-1' is not a "
                                        r"valid uint64.*inferred"):
        read_all(path, block_size="64KB")


@pytest.mark.parametrize(("values", "named"), [
    ([-1, 2**63], r"9223372036854775808 \(past int64\) and -1"),
    ([1, 2**64], r"18446744073709551616, more than uint64"),
    (["+9007199254740993", 1], r"9007199254740993 \(past 2\*\*53\), and a '\+' sign"),
])
def test_integers_no_integer_type_holds_are_refused(tmp_path: Path, values, named) -> None:
    path = write(tmp_path / "big.csv", "k,v\n" + "".join(f"1,{v}\n" for v in values))
    with pytest.raises(DataError, match=rf"big\.csv: column 'v' .*{named}.*dtypes=\{{'v': 'string'\}}"):
        Dataset(path, cache=None)


# -- 3. hexadecimal literals --------------------------------------------------------

HEX = "1\t0x10\n2\t0xff\n3\t0XFFFFFFFFFFFFFFFF\n4\t12\n"


@pytest.mark.parametrize(("dtype", "value"), [
    ("int64", "0xFFFFFFFFFFFFFFFF"), ("int64", "0x10"), ("uint64", " 0X1f"), ("int32", "0x10")])
def test_hex_in_a_declared_integer_column_is_refused(tmp_path: Path, dtype: str, value: str) -> None:
    path = write(tmp_path / "h.tsv", f"1\t5\n2\t{value}\n3\t12\n")
    with pytest.raises(ValueError):  # pandas refuses it too
        pd.read_csv(path, sep="\t", names=["k", "v"], dtype={"v": dtype})
    with pytest.raises(DataError, match=rf"h\.tsv, line 2, column 'v': value '{value}' is not a "
                                        rf"valid {dtype} \(a hexadecimal literal"):
        read_all(path, names=["k", "v"], dtypes={"v": dtype})


def test_hex_in_an_undeclared_column_is_text_as_pandas_reads_it(tmp_path: Path) -> None:
    path = write(tmp_path / "h.tsv", HEX)
    want = pd.read_csv(path, sep="\t", names=["k", "v"])
    ds, got = read_all(path, names=["k", "v"])
    assert ds.arrow_schema.field("v").type == pa.string()
    assert got.to_pydict() == want.to_dict("list")


def test_hex_after_the_inference_block_is_refused(tmp_path: Path) -> None:
    lines = ["k,v"] + [f"{k},{k}" for k in range(20000)] + ["1,0x1F"]
    path = write(tmp_path / "late.csv", "\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"late\.csv, line 20002, column 'v': value '0x1F' is not a "
                                        r"valid int64.*dtypes=\{'v': 'string'\}"):
        read_all(path, block_size="64KB")


# -- 5. blank lines, BOM, one column ------------------------------------------------

def blank_line_file(tmp_path: Path, blanks: int) -> tuple[str, str, int]:
    lines = [f"{i}\tv{i}" for i in range(200)]
    text = "\n".join(lines[:100]) + "\n" * (blanks + 1) + "\n".join(lines[100:]) + "\n"
    return write(tmp_path / "x.tsv", text), text, text.splitlines().index("") + 1


@pytest.mark.parametrize("store", ["local", "memory"])
def test_a_blank_line_where_a_block_ends_is_an_error(tmp_path: Path, store: str) -> None:
    path, text, line = blank_line_file(tmp_path, 1)
    if store == "memory":
        path = f"memory://{tmp_path.name}/x.tsv"
        fsspec.filesystem("memory").pipe(path, text.encode())
    blank = text.index("\n\n") + 1
    part_size = cutting_at(len(text), {blank})  # the previous block ends with the blank line
    ds = Dataset(path, names=["a", "b"], cache=None, part_size=part_size)
    assert blank in [p.offset for p in ds.pieces]
    for size in (None, part_size):
        with pytest.raises(DataError, match=rf"x\.tsv, line {line}: expected 2 fields .* blank line"):
            read_all(path, names=["a", "b"], part_size=size)


def test_a_block_of_blank_lines_inside_the_data_is_an_error(tmp_path: Path) -> None:
    path, text, line = blank_line_file(tmp_path, 30)
    for part_size in range(40, 400, 9):
        with pytest.raises(DataError, match=rf"x\.tsv, line {line}: .* blank line"):
            read_all(path, names=["a", "b"], part_size=part_size)


@pytest.mark.parametrize("store", ["local", "memory"])
def test_blank_lines_ending_the_file_are_dropped_wherever_blocks_end(tmp_path: Path, store) -> None:
    text = "".join(f"{i}\tv{i}\n" for i in range(60)) + "\n" * 40
    path = write(tmp_path / "end.tsv", text)
    if store == "memory":
        path = f"memory://{tmp_path.name}/end.tsv"
        fsspec.filesystem("memory").pipe(path, text.encode())
    want = pd.read_csv(io.StringIO(text), sep="\t", names=["a", "b"])
    for part_size in (None, *range(20, 300, 11)):
        _, got = read_all(path, names=["a", "b"], part_size=part_size)
        assert got.to_pydict() == want.to_dict("list"), part_size


def test_the_blank_line_error_names_its_line_after_a_header(tmp_path: Path) -> None:
    text = "a\tb\n1\tx\n\n2\ty\n"
    path = write(tmp_path / "h.tsv", text)
    line = text.splitlines().index("") + 1
    with pytest.raises(DataError, match=rf"h\.tsv, line {line}: .* blank line"):
        read_all(path, names=["a", "b"], header=True)


def test_a_file_of_only_a_bom_is_empty(tmp_path: Path) -> None:
    a = write(tmp_path / "a.tsv", "1\tx\n")
    b = write(tmp_path / "b.tsv", b"\xef\xbb\xbf")
    want = pd.read_csv(a, sep="\t", names=["a", "b"])
    _, got = read_all([a, b], names=["a", "b"])
    assert got.to_pydict() == want.to_dict("list")
    c = write(tmp_path / "c.csv", "a,b\n1,x\n")
    d = write(tmp_path / "d.csv", b"\xef\xbb\xbf")
    _, got = read_all([c, d])
    assert got.to_pydict() == pd.read_csv(c).to_dict("list")


def test_one_column_rows_do_not_depend_on_part_size(tmp_path: Path) -> None:
    text = ("".join(f"{i}\n" for i in range(40)) + "\n" * 30
            + "".join(f"{i}\n" for i in range(40, 60)) + "\n\n\n")
    path = write(tmp_path / "one.tsv", text)
    want = pd.read_csv(path, names=["v"], skip_blank_lines=False)["v"]
    want = [None if pd.isna(v) else int(v) for v in want]
    for part_size in (None, 20, 26, 37, 50, 90):
        _, got = read_all(path, names=["v"], dtypes={"v": "int64"}, part_size=part_size)
        assert got.column("v").to_pylist() == want, part_size


# -- 6. quoted values holding a line break ------------------------------------------

@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_quoted_line_break_cut_by_a_part_is_an_error_never_a_made_up_row(tmp_path: Path,
                                                                           where: str) -> None:
    rows = [[str(i), f"v{i}", str(i)] for i in range(150)]
    special = ["999", "first half\n7,second half", "5"]
    if where == "last":
        rows, special = [r[:2] for r in rows], special[:2]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([list("abc")[:len(special)], *rows[:80],
                                                   special, *rows[80:]])
    text = out.getvalue()
    path = write(tmp_path / "q.csv", text)
    want = pd.read_csv(path, dtype=str).to_dict("list")
    start = text.index('999,"first')
    refused = 0
    for part_size in (None, cutting_at(len(text), set(range(start, start + 16))),
                      *range(40, 1200, 23)):
        try:
            _, got = read_all(path, part_size=part_size, dtypes={n: "string" for n in want})
        except DataError as exc:
            assert part_size is not None
            assert f"q.csv, line {text.count(chr(10), 0, start) + 1}" in str(exc)
            assert "part_size" in str(exc)
            refused += 1
            continue
        assert got.to_pydict() == want, part_size
    assert refused


def test_a_part_read_alone_that_begins_inside_a_quoted_value_says_so(tmp_path: Path) -> None:
    """Parts are read on several threads, so the part after a cut quoted value may
    fail first: it names the cut value (and the way out), never its broken first row
    as a row of the wrong field count. Each part read alone: one that begins inside a
    quoted value (known here by Python's csv module reading the file up to the part)
    says so, one that ends inside one says that, the others read pandas' rows."""
    rows = [[str(i), f"a {i}\nb {i}\nc", str(2 * i)] for i in range(300)]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows([["id", "text", "v"], *rows])
    text = out.getvalue()
    path = write(tmp_path / "q.csv", text)
    want = pd.read_csv(path, dtype=str)
    ds = Dataset(path, cache=None, part_size=900, dtypes={"id": "string", "text": "string", "v": "string"})
    assert len(ds.pieces) > 10
    inside = 0
    for piece in ds.pieces:
        # where the part's block begins: after the first line break at or past its offset
        begin = text.index("\n", piece.offset) + 1 if piece.offset else 0
        in_quotes = text.count('"', 0, begin) % 2 == 1
        try:
            got = ds.read_piece(piece).to_pandas()
        except DataError as exc:
            assert "expected 3 fields" not in str(exc)
            assert "part_size" in str(exc) and "read the file as one part" in str(exc)
            if in_quotes:
                line = text.count("\n", 0, begin) + 1
                assert f"q.csv, line {line}: this part of the file (from byte {piece.offset:,}) " \
                       "begins inside a quoted value that holds a line break" in str(exc)
                inside += 1
            else:
                assert "a quoted value starts here and holds a line break" in str(exc)
            continue
        assert not in_quotes
        first = int(got["id"].iloc[0])
        pd.testing.assert_frame_equal(got.reset_index(drop=True),
                                      want.iloc[first:first + len(got)].reset_index(drop=True),
                                      check_dtype=False)
    assert inside


@pytest.mark.parametrize("stray", ['5,5" floppy', '5,x"y'])
def test_a_quote_inside_an_unquoted_field_does_not_pass_for_a_cut_value(tmp_path: Path, stray: str) -> None:
    """A quote inside an unquoted field is plain data to the parser (pandas reads
    ``5" floppy``): counted, it would make a genuine field-count error at the start
    of a later part look like a cut quoted value. Each part read alone: the one
    holding the bad line names it with its field count."""
    first_lines = 0
    for bad in range(250, 320):  # blocks of 600 bytes: some bad line starts a part
        lines = ["id,name", *[f"{i},item{i:04d}" for i in range(400)]]
        lines[6] = stray
        lines[bad] = f"{bad - 1},oops,extra"
        text = "\n".join(lines) + "\n"
        path = write(tmp_path / "s.csv", text)
        if bad == 250:
            assert pd.read_csv(path, nrows=8).iloc[5, 1] == stray.split(",")[1]
        ds = Dataset(path, cache=None, part_size=1000)
        starts = {text.count("\n", 0, text.index("\n", p.offset) + 1) + 1 for p in ds.pieces if p.offset}
        first_lines += bad + 1 in starts
        seen = 0
        for piece in ds.pieces:
            try:
                ds.read_piece(piece)
            except DataError as exc:
                assert "begins inside a quoted value" not in str(exc)
                assert f"s.csv, line {bad + 1}: expected 2 fields separated by ',', got 3" in str(exc)
                seen += 1
        assert seen == 1
    assert first_lines  # the case that was misread: the bad line first in its part


def test_a_quote_left_open_at_the_end_of_the_file_is_an_error(tmp_path: Path) -> None:
    text = 'a,b\n1,x\n2,"abc\n3,def\n'
    path = write(tmp_path / "open.csv", text)
    with pytest.raises(pd.errors.ParserError):  # pandas: "EOF inside string"
        pd.read_csv(path)
    with pytest.raises(DataError, match=r"open\.csv, line 3, column 'b': .*closing quote is missing"):
        read_all(path)

"""Raw TSV blocks parsed by polars where that gives exactly Arrow's table, by Arrow
(with its line-numbered errors) everywhere else."""

import polars as pl
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest

import tabstream as ts
from tabstream.core.errors import DataError

NAMES = ["label", "I1", "C1", "C2"]
DTYPES = {"label": "int64", "I1": "int64", "C1": "string", "C2": "string"}
ARROW_TYPES = {"label": pa.int64(), "I1": pa.int64(), "C1": pa.string(), "C2": pa.string()}


def arrow_reference(text, skip_header=False):
    """The table as pyarrow's CSV reader gives it (a second, independent parse)."""
    return pacsv.read_csv(
        pa.BufferReader(text.encode()),
        read_options=pacsv.ReadOptions(column_names=NAMES, skip_rows=1 if skip_header else 0),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False),
        convert_options=pacsv.ConvertOptions(column_types=ARROW_TYPES, null_values=[""],
                                             strings_can_be_null=True))


def read_all(ds):
    return pa.concat_tables([ds.read_piece(p) for p in ds.pieces])


@pytest.fixture
def polars_calls(monkeypatch):
    calls = []
    original = pl.read_csv

    def spy(*args, **kwargs):
        calls.append(kwargs.get("separator"))
        return original(*args, **kwargs)

    monkeypatch.setattr(pl, "read_csv", spy)
    return calls


CLEAN = ("1\t5\ta1\tx\n0\t\t\"q\ty\n1\t-3\t\t\n0\t12\tb b\t'z'\n" * 20)


@pytest.mark.parametrize("part_size", [None, 300])
def test_clean_tsv_is_parsed_by_polars_and_equals_arrow(tmp_path, polars_calls, part_size):
    path = tmp_path / "day.tsv"
    path.write_text(CLEAN)
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size, cache=None)
    got = read_all(ds)
    assert polars_calls  # the fast path ran
    assert got.schema == arrow_reference(CLEAN).schema
    assert got.equals(arrow_reference(CLEAN))


def test_header_is_skipped_on_the_polars_path(tmp_path, polars_calls):
    text = "\t".join(NAMES) + "\n" + CLEAN
    path = tmp_path / "day.tsv"
    path.write_text(text)
    got = read_all(ts.Dataset(str(path), dtypes=DTYPES, sep="\t", header=True, cache=None))
    assert polars_calls
    assert got.equals(arrow_reference(text, skip_header=True))


@pytest.mark.parametrize("bad_line, message", [
    ("1\t5\tshort\n", r"day\.tsv.*line 3"),                  # a field missing: polars would fill null
    ("1\t5\ta\tb\textra\n", r"day\.tsv.*line 3"),            # a field too many
    ("1\tfive\ta\tb\n", r"day\.tsv.*line 3"),                 # not an integer
])
def test_bad_lines_are_reported_by_line_as_before(tmp_path, bad_line, message):
    path = tmp_path / "day.tsv"
    path.write_text("1\t5\ta\tb\n0\t6\tc\td\n" + bad_line + "1\t7\te\tf\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", cache=None)
    with pytest.raises(DataError, match=message):
        read_all(ds)


def test_crlf_and_float_columns_take_arrows_path(tmp_path, polars_calls):
    path = tmp_path / "day.tsv"
    path.write_text("1\t5\ta\tb\r\n0\t6\tc\td\r\n")
    got = read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", cache=None))
    assert polars_calls == []
    assert got.column("C2").to_pylist() == ["b", "d"]
    path2 = tmp_path / "floats.tsv"
    path2.write_text("1\t0.5\ta\tb\n")
    got = read_all(ts.Dataset(str(path2), names=NAMES, dtypes={**DTYPES, "I1": "float64"}, sep="\t",
                              cache=None))
    assert polars_calls == []
    assert got.column("I1").to_pylist() == [0.5]

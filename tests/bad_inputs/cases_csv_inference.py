"""CSV read without ``dtypes=`` (types inferred from the first block, then fixed) and
loaders over in-memory Datasets: a value that does not fit the inferred type names
the file, the line, the column, the value and the ``dtypes=`` that reads it; what
reads must equal pandas' reading."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.loaders import Loader


def _late_csv(tmp, late: str, column: str = "i", rows: int = 20000) -> str:
    """``rows`` rows of clean numbers (past the 64 KB inference block), then one row
    whose ``column`` holds ``late``."""
    fields = {"i": lambda k: str(k), "f": lambda k: f"{k}.5", "b": lambda k: "true" if k % 2 else "false"}
    lines = ["i,f,b"] + [",".join(fields[c](k) for c in "ifb") for k in range(rows)]
    last = {c: fields[c](0) for c in "ifb"}
    last[column] = late
    lines.append(",".join(last[c] for c in "ifb"))
    path = tmp / f"late_{column}.csv"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _read(path: str, **kw) -> pd.DataFrame:
    return ts.Dataset(path, block_size="64KB", **kw).to_ddf().compute()


def _word_in_int_column(tmp):
    _read(_late_csv(tmp, "n/a"))


def _decimal_in_int_column(tmp):
    _read(_late_csv(tmp, "2.5"))


def _word_in_float_column(tmp):
    _read(_late_csv(tmp, "NaNa", column="f"))


def _word_in_bool_column(tmp):
    _read(_late_csv(tmp, "maybe", column="b"))


def _word_in_second_file(tmp):
    (tmp / "day_0.csv").write_text("id,score\n1,0.5\n2,0.25\n")
    (tmp / "day_1.csv").write_text("id,score\n3,0.5\nfour,0.75\n")
    ts.Dataset(str(tmp / "day_*.csv")).to_ddf().compute()


def _the_fix_reads_it(tmp):
    path = _late_csv(tmp, "n/a")
    got = _read(path, dtypes={"i": "string"})
    want = pd.read_csv(path, dtype={"i": str}, keep_default_na=False)
    assert got["i"].tolist() == want["i"].tolist()
    np.testing.assert_allclose(got["f"].to_numpy(dtype=float), want["f"].to_numpy())


def _empty_in_sample_then_numbers(tmp):
    # a column empty throughout the sample is read as strings: its later numbers
    # are kept as written, never lost
    path = tmp / "sparse.csv"
    rows = ["k,x"] + [f"{k}," for k in range(20000)] + ["20000,7.25"]
    path.write_text("\n".join(rows) + "\n")
    got = _read(str(path))
    want = pd.read_csv(io.StringIO(path.read_text()), dtype={"x": str})
    assert got["x"].isna().sum() == want["x"].isna().sum() == 20000
    assert got["x"].iloc[-1] == want["x"].iloc[-1] == "7.25"
    assert got["k"].tolist() == want["k"].tolist()


def _in_memory_int_column_with_nulls(tmp):
    df = pd.DataFrame({"a": pd.array([1, None, 3], dtype="Int64"), "label": [0, 1, 0]})
    list(Loader(ts.Dataset(df), 2))


def _in_memory_string_column(tmp):
    Loader(ts.Dataset(pd.DataFrame({"city": ["x", "y"], "label": [0, 1]})), 2)


CASES = [
    ("word in an int column past the first block", _word_in_int_column, DataError,
     r"late_i\.csv, line 20002, column 'i': value 'n/a' is not a valid int64: the column's type "
     r"was inferred as int64 from the first block of .*late_i\.csv and is fixed for every block; "
     r"pass dtypes=\{'i': 'string'\}"),
    ("decimal in an int column past the first block", _decimal_in_int_column, DataError,
     r"line 20002, column 'i': value '2\.5' is not a valid int64: .*pass dtypes=\{'i': 'string'\}"),
    ("word in a float column past the first block", _word_in_float_column, DataError,
     r"line 20002, column 'f': value 'NaNa' is not a valid float64: the column's type was inferred"),
    ("word in a bool column past the first block", _word_in_bool_column, DataError,
     r"line 20002, column 'b': value 'maybe' is not a valid bool: .*pass dtypes=\{'b': 'string'\}"),
    ("word in an int column of the second file", _word_in_second_file, DataError,
     r"day_1\.csv, line 3, column 'id': value 'four' is not a valid int64: the column's type was "
     r"inferred as int64 from the first block of .*day_0\.csv"),
    ("dtypes= as the message says reads it", _the_fix_reads_it, None, None),
    ("column empty in the sample keeps later values", _empty_in_sample_then_numbers, None, None),
    ("loader over a DataFrame with a null int", _in_memory_int_column_with_nulls, DataError,
     r"column 'a' has 1 nulls in row group 0 of 'the in-memory Dataset'; only float columns may "
     r"hold nulls"),
    ("loader over a DataFrame with a string column", _in_memory_string_column, TypeError,
     r"column 'city' has type .*string; loaders deliver numbers.*encode it first"),
]

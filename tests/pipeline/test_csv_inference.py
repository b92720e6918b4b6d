"""CSV without ``dtypes=``: column types inferred as pandas infers them (Arrow's CSV
reader on the first parse block), then fixed for every block; a later value that
does not fit is an error naming the file, line, column and value."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.core.errors import DataError


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_numbers_bools_and_strings_are_typed_as_pandas_types_them(tmp_path: Path) -> None:
    text = ("i,f,s,b,when\n"
            "1,1.5,x,True,2020-01-01\n"
            "2,2,y,False,2020-01-02\n"
            "3,-0.25,z,True,2020-01-03\n")
    ds = ts.Dataset(write(tmp_path / "a.csv", text))
    want = pd.read_csv(io.StringIO(text))
    assert [ds.arrow_schema.field(n).type for n in want.columns] == [
        pa.string() if pd.api.types.is_string_dtype(want[n]) else pa.from_numpy_dtype(want[n].dtype)
        for n in want.columns]
    got = ds.to_ddf().compute()
    for name in want.columns:
        assert got[name].tolist() == want[name].tolist(), name


def test_missing_values_are_nulls_and_integers_stay_integers(tmp_path: Path) -> None:
    text = "i,f,empty\n1,,\n,2.5,\n3,3,\n"
    ds = ts.Dataset(write(tmp_path / "a.csv", text))
    assert ds.arrow_schema.field("i").type == pa.int64()   # pandas: float64 with NaN
    assert ds.arrow_schema.field("f").type == pa.float64()
    assert ds.arrow_schema.field("empty").type == pa.string()  # nothing to infer from
    want = pd.read_csv(io.StringIO(text))
    got = ds.to_ddf().compute()
    np.testing.assert_array_equal(got["i"].isna().to_numpy(), want["i"].isna().to_numpy())
    np.testing.assert_array_equal(got["i"].dropna().astype("float64").to_numpy(),
                                  want["i"].dropna().to_numpy())
    np.testing.assert_array_equal(got["f"].to_numpy(dtype=float), want["f"].to_numpy())
    assert got["empty"].isna().all()


def test_declared_dtypes_win_and_the_rest_is_inferred(tmp_path: Path) -> None:
    text = "id,score,name\n7,0.5,a\n8,1.5,b\n"
    ds = ts.Dataset(write(tmp_path / "a.csv", text), dtypes={"id": "string"})
    assert [f.type for f in ds.arrow_schema] == [pa.string(), pa.float64(), pa.string()]
    assert ds.to_ddf().compute()["id"].tolist() == ["7", "8"]


def test_the_type_is_fixed_for_every_block_and_file(tmp_path: Path) -> None:
    """Several pieces and files: every partition has the type inferred from the first
    file's first block, even where a block alone would infer another (all-integer
    floats), and the values are pandas' reading of the whole file."""
    rng = np.random.default_rng(0)
    n = 4000
    frames = []
    for k in range(2):
        x = rng.random(n) if k == 0 else np.arange(n, dtype=float)   # file 1: whole numbers
        frames.append(pd.DataFrame({"id": np.arange(n) + k * n, "x": x}))
        frames[-1].to_csv(tmp_path / f"part_{k}.csv", index=False)
    ds = ts.Dataset(str(tmp_path / "part_*.csv"), block_size="16KB", part_size="40KB")
    assert ds.npartitions > 2
    assert [f.type for f in ds.arrow_schema] == [pa.int64(), pa.float64()]
    for part in ds.to_iter():
        assert part["x"].dtype == np.float64
    got = ds.to_ddf().compute()
    want = pd.concat([pd.read_csv(tmp_path / f"part_{k}.csv") for k in range(2)])
    np.testing.assert_array_equal(got["id"].to_numpy(dtype=np.int64), want["id"].to_numpy())
    np.testing.assert_allclose(got["x"].to_numpy(dtype=float), want["x"].to_numpy())


def test_a_later_value_that_does_not_fit_names_file_line_column_and_the_fix(tmp_path: Path) -> None:
    lines = ["i,f"] + [f"{k},{k}.5" for k in range(20000)] + ["oops,1.0"]
    path = write(tmp_path / "late.csv", "\n".join(lines) + "\n")
    ds = ts.Dataset(path, block_size="64KB")
    assert ds.arrow_schema.field("i").type == pa.int64()
    with pytest.raises(DataError, match=(
            rf"^{path}, line 20002, column 'i': value 'oops' is not a valid int64: the column's "
            rf"type was inferred as int64 from the first block of {path} and is fixed for every "
            r"block; pass dtypes=\{'i': 'string'\}")):
        ds.to_ddf().compute()
    # the fix the message gives reads it
    fixed = ts.Dataset(path, block_size="64KB", dtypes={"i": "string"}).to_ddf().compute()
    assert fixed["i"].iloc[-1] == "oops" and len(fixed) == 20001


def test_an_empty_first_file_lends_no_types(tmp_path: Path) -> None:
    write(tmp_path / "a_0.csv", "i,s\n")
    write(tmp_path / "a_1.csv", "i,s\n4,x\n5,y\n")
    ds = ts.Dataset(str(tmp_path / "a_*.csv"))
    assert [f.type for f in ds.arrow_schema] == [pa.int64(), pa.string()]
    assert ds.to_ddf().compute()["i"].tolist() == [4, 5]


def test_headerless_tsv_with_names_is_inferred_too(tmp_path: Path) -> None:
    text = "1\t0.5\tab\n0\t\tcd\n"
    ds = ts.Dataset(write(tmp_path / "day.tsv", text), names=["label", "I1", "C1"])
    want = pd.read_csv(io.StringIO(text), sep="\t", names=["label", "I1", "C1"])
    assert [f.type for f in ds.arrow_schema] == [pa.int64(), pa.float64(), pa.string()]
    got = ds.to_ddf().compute()
    assert got["label"].tolist() == want["label"].tolist()
    np.testing.assert_array_equal(got["I1"].to_numpy(dtype=float), want["I1"].to_numpy())
    assert got["C1"].tolist() == want["C1"].tolist()

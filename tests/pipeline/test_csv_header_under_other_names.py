"""header=False with a file whose first line is a header under other names than
``names=``: refused, naming the file, line 1 and the columns, instead of read as a
row of data that turns every numeric column into strings. Files that only look
odd at line 1 (a missing marker, a string column) still read as pandas reads them."""
import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError


def read(path, **kwargs):
    return ts.Dataset(str(path), **kwargs).to_ddf().compute().reset_index(drop=True)


def test_a_header_under_other_names_is_refused(tmp_path):
    path = tmp_path / "hdr.csv"
    path.write_text("user,item,price\n1,x,2.5\n2,y,3.5\n3,x,4.5\n")
    with pytest.raises(DataError, match=r"hdr\.csv, line 1: .* column\(s\) 'p': 'user' \(the rest int64\), "
                                        r"'r': 'price' \(the rest float64\), .*is line 1 a header line"):
        ts.Dataset(str(path), names=["p", "q", "r"])
    # the fixes the message offers work
    got = read(path, names=["p", "q", "r"], header=True)
    pd.testing.assert_frame_equal(got, pd.read_csv(path, names=["p", "q", "r"], header=0), check_dtype=False)
    got = read(path, names=["p", "q", "r"], dtypes={"p": "string", "r": "string"})
    assert got["p"].tolist() == ["user", "1", "2", "3"]


def test_a_tsv_header_is_refused_too(tmp_path):
    path = tmp_path / "day.tsv"
    path.write_text("label\tI1\tC1\n0\t5\t68fd1e64\n1\t\t05db9164\n")
    with pytest.raises(DataError, match=r"day\.tsv, line 1: .*'click': 'label' \(the rest int64\), 'i1': 'I1'"):
        ts.Dataset(str(path), names=["click", "i1", "c1"], sep="\t")


@pytest.mark.parametrize("text", [
    "1,x,\n2,y,3.5\n3,x,4.5\n",           # an empty field (missing) in line 1
    "1,hello,2.5\n2,7,3.5\n3,8,4.5\n",    # line 1 the only text of column q
    "1,x,2.5\n",                          # one line: nothing to compare with
    "a,b,c\n",                            # one line of words: nothing to compare with
    "1,x,2.5\n2,y,3.5\n",                # string column q throughout
])
def test_lines_that_only_look_odd_read_as_pandas_reads_them(tmp_path, text):
    path = tmp_path / "ok.csv"
    path.write_text(text)
    names = ["p", "q", "r"]
    if text.startswith("1,hello"):
        # line 1 is the only text of column q: refused (a header, or a value that
        # would silently make the column text) unless q is declared
        with pytest.raises(DataError, match="'q': 'hello'"):
            ts.Dataset(str(path), names=names)
        got = read(path, names=names, dtypes={"q": "string"})
        assert got["q"].tolist() == ["hello", "7", "8"]
        return
    got = read(path, names=names)
    expected = pd.read_csv(path, names=names, header=None)
    assert got.shape == expected.shape
    for name in names:
        assert got[name].isna().tolist() == expected[name].isna().tolist()
        assert got[name].dropna().astype(str).tolist() == expected[name].dropna().astype(str).tolist()

"""``partition_on`` names folders after columns and values: a column name that would
make a path (``/``, ``..``, ``=``) or a hidden folder is refused naming the column; a
value is percent-encoded so that any value reads back as it was written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError


@pytest.mark.parametrize(("name", "why"), [
    ("a/b", r"holds '/'"),
    ("..", r"holds '\.\.'"),
    ("x..y", r"holds '\.\.'"),
    ("k=v", r"holds '='"),
    ("a\\b", r"holds '\\\\'"),
    (".hidden", r"starts with '\.'"),
    ("_meta", r"starts with '_'"),
])
def test_a_column_name_that_makes_a_path_is_refused(tmp_path, name, why):
    df = pd.DataFrame({name: [1, 2, 1], "v": [1.0, 2.0, 3.0]})
    with pytest.raises(ValueError, match=re.escape(f"partition_on: column name {name!r}")
                       + rf" {why}.*rename the column first"):
        ts.Dataset(df).to_parquet(str(tmp_path / "out"), partition_on=[name])
    assert os.listdir(tmp_path) == [], "nothing written"


def test_values_that_look_like_paths_read_back_as_written(tmp_path):
    values = ["..", "a=b", "../x", "%2F", "", "c/d", ".", "_y", "x/../../y"]
    df = pd.DataFrame({"k": values, "v": range(len(values))})
    out = tmp_path / "out"
    ts.Dataset(df).to_parquet(str(out), partition_on=["k"])
    # every data file is exactly two levels below the export: out/k=<value>/part
    files = [Path(d) / f for d, _, fs in os.walk(out) for f in fs if f.endswith(".parquet")]
    assert len(files) == len(values)
    assert all(f.parent.parent == out and f.parent.name.startswith("k=") for f in files)
    assert sorted(os.listdir(tmp_path)) == ["out"], "nothing written beside the export"
    back = ts.Dataset(str(out)).to_ddf().compute().sort_values("v").reset_index(drop=True)
    pd.testing.assert_frame_equal(back[["k", "v"]], df, check_dtype=False)


def test_a_value_named_as_the_missing_folder_is_refused(tmp_path):
    df = pd.DataFrame({"k": ["a", "__HIVE_DEFAULT_PARTITION__"], "v": [1, 2]})
    with pytest.raises(DataError, match=r"column 'k' holds the value '__HIVE_DEFAULT_PARTITION__'.*"
                                        r"these rows would be null"):
        ts.Dataset(df).to_parquet(str(tmp_path / "out"), partition_on=["k"])
    assert os.listdir(tmp_path) == []

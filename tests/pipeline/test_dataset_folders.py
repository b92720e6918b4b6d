"""What ``Dataset(folder)`` reads (issue 27): the folder's own files, its hive
partition folders and the exports in it; any other subfolder (``write_data``'s
``probabilities/``) is left out with one warning naming it. Parquet files whose
columns differ are unified with one warning naming the files and the columns, or
refused with ``strict_schema=True``; a ``_schema.json`` naming columns no file holds
is refused."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data
from tabstream.pipeline.dataset import DatasetWarning


def _rows(ds: ts.Dataset) -> pd.DataFrame:
    return pa.concat_tables([ds.read_piece(p) for p in ds.pieces]).to_pandas()


@pytest.mark.parametrize("fmt", ["parquet", "tsv"])
def test_write_data_probabilities_are_not_rows(tmp_path, fmt):
    # before: the parquet folder read the probabilities as 2x the rows (nulls in every
    # data column), the TSV folder parsed the probability parquet files as text
    files = write_data("criteo", tmp_path / "raw", 600, num_files=2, fmt=fmt, return_probability=True)
    kwargs = {} if fmt == "parquet" else {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}
    prob = tmp_path / "raw" / "probabilities"
    with pytest.warns(DatasetWarning, match=rf"does not read its subfolders: {prob}/ \(2 files\).*"
                                            rf"pass its path \(e\.g\. '{prob}'\)") as said:
        ds = ts.Dataset(str(tmp_path / "raw"), **kwargs)
    assert len(said) == 1
    assert ds.files == sorted(files)
    if fmt == "parquet":
        expected = pd.concat([pd.read_parquet(f) for f in sorted(files)], ignore_index=True)
    else:
        expected = pd.concat([pd.read_csv(f, sep="\t", header=None, names=CRITEO_COLUMNS) for f in sorted(files)],
                             ignore_index=True)
    got = _rows(ds)
    assert ds.num_rows == len(expected) == 600
    assert got.columns.tolist() == expected.columns.tolist()
    np.testing.assert_array_equal(got["label"].to_numpy(), expected["label"].to_numpy())
    # the subfolder itself reads when named
    probs = ts.Dataset(str(prob))
    assert probs.schema.column_names == ["probability"]
    assert probs.num_rows == 600


def test_hive_folders_and_nested_exports_are_data(tmp_path):
    frame = pd.DataFrame({"row": np.arange(40), "day": np.repeat([1, 2], 20)})
    for day, part in frame.groupby("day"):
        (tmp_path / "root" / "hive" / f"day={day}").mkdir(parents=True)
        part.drop(columns="day").to_parquet(tmp_path / "root" / "hive" / f"day={day}" / "p.parquet", index=False)
    ds = ts.Dataset(str(tmp_path / "root" / "hive"))
    got = _rows(ds).sort_values("row", ignore_index=True)
    pd.testing.assert_frame_equal(got[["row", "day"]], frame, check_dtype=False)

    # root/train and root/valid, each an export: both read, nothing warned
    ts.Dataset(frame.iloc[:25]).to_parquet(str(tmp_path / "exports" / "train"))
    ts.Dataset(frame.iloc[25:]).to_parquet(str(tmp_path / "exports" / "valid"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        both = ts.Dataset(str(tmp_path / "exports"))
    pd.testing.assert_frame_equal(_rows(both), frame, check_dtype=False)


def test_side_folder_in_an_export_is_left_out(tmp_path):
    frame = pd.DataFrame({"row": np.arange(30)})
    out = tmp_path / "out"
    ts.Dataset(frame).to_parquet(str(out))
    (out / "notes").mkdir()
    pd.DataFrame({"other": [1.0, 2.0]}).to_parquet(out / "notes" / "x.parquet")
    with pytest.warns(DatasetWarning, match=rf"{out}/notes/ \(1 file\)"):
        ds = ts.Dataset(str(out))
    pd.testing.assert_frame_equal(_rows(ds), frame, check_dtype=False)


def test_folder_with_only_side_folders_says_how_to_read_them(tmp_path):
    for day in ("2024-01-01", "2024-01-02"):
        (tmp_path / "logs" / day).mkdir(parents=True)
        pd.DataFrame({"a": [1]}).to_parquet(tmp_path / "logs" / day / "p.parquet")
    logs = tmp_path / "logs"
    with pytest.raises(FileNotFoundError, match=rf"folder '{logs}' holds no data files of its own, only in "
                                                rf"subfolders that are not data: {logs}/2024-01-01/ \(1 file\), "
                                                rf"{logs}/2024-01-02/ \(1 file\).*glob such as '{logs}/\*/\*\.parquet'"):
        ts.Dataset(str(logs))
    # the glob the message suggests reads both
    assert ts.Dataset(str(logs / "*" / "*.parquet")).num_rows == 2


def _two_schemas(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    wide = pd.DataFrame({"id": [1, 2], "x": [0.5, 1.5], "y": ["a", "b"]})
    narrow = pd.DataFrame({"id": [3]})
    wide.to_parquet(folder / "a.parquet", index=False)
    narrow.to_parquet(folder / "b.parquet", index=False)
    return folder, wide, narrow


def test_unified_schemas_warn_once_naming_files_and_columns(tmp_path):
    folder, wide, narrow = _two_schemas(tmp_path)
    with pytest.warns(DatasetWarning, match=rf"\['x', 'y'\] null in the rows of {folder}/b\.parquet "
                                            rf"\(held by {folder}/a\.parquet\).*strict_schema=True") as said:
        ds = ts.Dataset(str(folder))
    assert len(said) == 1
    expected = pd.concat([wide, narrow], ignore_index=True)
    got = _rows(ds)
    assert got["id"].tolist() == expected["id"].tolist()
    assert got["x"].isna().tolist() == expected["x"].isna().tolist()
    assert got["y"].isna().tolist() == expected["y"].isna().tolist()


def test_strict_schema_refuses_naming_both_files_and_the_columns(tmp_path):
    folder, _, _ = _two_schemas(tmp_path)
    with pytest.raises(SchemaError, match=rf"{folder}/b\.parquet: lacks the columns \['x', 'y'\] that "
                                          rf"{folder}/a\.parquet has; strict_schema=True refuses"):
        ts.Dataset(str(folder), strict_schema=True)
    with pytest.raises(TypeError, match="strict_schema must be True or False, got 'yes'"):
        ts.Dataset(str(folder), strict_schema="yes")
    # files that agree read under strict_schema=True
    (folder / "b.parquet").unlink()
    assert ts.Dataset(str(folder), strict_schema=True).num_rows == 2


def test_schema_file_listing_columns_no_file_holds(tmp_path):
    out = tmp_path / "out"
    ts.Dataset(pd.DataFrame({"a": [1, 2], "b": [0.5, 1.5]})).to_parquet(str(out))
    schema = json.loads((out / "_schema.json").read_text())
    assert [c["name"] for c in schema["columns"]] == ["a", "b"]
    schema["columns"].append({**schema["columns"][0], "name": "ghost"})
    (out / "_schema.json").write_text(json.dumps(schema))
    with pytest.raises(DataError, match=rf"{out}/_schema\.json: lists the columns \['ghost'\], which none of "
                                        r"the 1 data file holds \(they hold \['a', 'b'\]\)"):
        ts.Dataset(str(out))
    # a schema the user passes replaces the file's
    given = ts.Schema([ts.ColumnSchema("a", "int64"), ts.ColumnSchema("b", "float64")])
    assert ts.Dataset(str(out), schema=given).num_rows == 2


def test_duplicate_column_names_in_a_parquet_file(tmp_path):
    pq.write_table(pa.Table.from_arrays([pa.array([1]), pa.array([2]), pa.array([3])], names=["a", "b", "a"]),
                   tmp_path / "dup.parquet")
    with pytest.raises(DataError, match=r"dup\.parquet: the file has 1 column name more than once: \['a'\]"):
        ts.Dataset(str(tmp_path / "dup.parquet"))

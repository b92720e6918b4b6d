"""``to_parquet(partition_on=[...])`` writes hive-style ``col=value`` folders that
Dataset, pyarrow.dataset and pandas read back with the partition columns."""

from __future__ import annotations

import json
import urllib.parse

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError


def _frame(n: int = 600) -> pd.DataFrame:
    rng = np.random.default_rng(11)
    day = rng.integers(0, 3, n).astype(object)
    day[rng.random(n) < 0.1] = None
    return pd.DataFrame({
        "day": pd.array(day, dtype="Int64"),
        "site": np.array(["a b", "c/d", "e"])[rng.integers(0, 3, n)],
        "x": rng.normal(size=n),
        "row": np.arange(n),
    })


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("row", "ascending")])


@pytest.mark.parametrize("shuffle", [None, "per_worker"])
def test_partition_on_writes_hive_folders_read_back(tmp_path, shuffle):
    frame = _frame()
    out = tmp_path / "out"
    ts.Dataset(frame, part_size=4000).to_parquet(str(out), partition_on=["day", "site"],
                                                 num_files=2, shuffle=shuffle, seed=1)
    manifest = json.loads((out / "_manifest.json").read_text())
    # every file sits in the folder of its rows' values, without those columns
    for entry in manifest["files"]:
        day_part, site_part, _ = entry["path"].split("/")
        table = pq.read_table(out / entry["path"])
        assert table.column_names == ["x", "row"]
        rows = frame.set_index("row").loc[table["row"].to_pylist()]
        expected_day = rows["day"].iloc[0]
        assert day_part == ("day=__HIVE_DEFAULT_PARTITION__" if pd.isna(expected_day) else f"day={expected_day}")
        assert rows["day"].isna().all() if pd.isna(expected_day) else (rows["day"] == expected_day).all()
        assert site_part == "site=" + urllib.parse.quote(rows["site"].iloc[0], safe="")
        assert (rows["site"] == rows["site"].iloc[0]).all()
        assert entry["num_rows"] == table.num_rows
    assert sum(e["num_rows"] for e in manifest["files"]) == len(frame)
    expected = _sorted(pa.Table.from_pandas(frame, preserve_index=False)).replace_schema_metadata(None)
    back = ts.Dataset(str(out))
    assert back.schema.column_names == ["x", "row", "day", "site"]
    got = _sorted(pa.concat_tables([back.read_piece(p) for p in back.pieces]))
    assert got.select(expected.column_names).cast(expected.schema).equals(expected)
    # pyarrow.dataset with hive partitioning reads the same rows
    other = _sorted(pds.dataset(str(out), partitioning="hive").to_table())
    assert other["row"].equals(expected["row"]) and other["site"].to_pylist() == expected["site"].to_pylist()


def test_partition_on_after_a_workflow(tmp_path):
    frame = _frame()
    wf = ts.Workflow((["site"] >> ops.Categorify()) + ["day", "x", "row"]).fit(ts.Dataset(frame))
    out = tmp_path / "out"
    wf.transform(ts.Dataset(frame)).to_parquet(str(out), partition_on=["site"])
    ids = wf.transform(frame)
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert folders == sorted(f"site={i}" for i in ids["site"].unique())
    back = ts.Dataset(str(out))
    got = _sorted(pa.concat_tables([back.read_piece(p) for p in back.pieces]))
    assert got["site"].to_pylist() == ids.sort_values("row")["site"].tolist()


def test_partition_on_bad_arguments(tmp_path):
    ds = ts.Dataset(_frame())
    with pytest.raises(ValueError, match=r"partition_on: columns \['nope'\] are not in the output"):
        ds.to_parquet(str(tmp_path / "a"), partition_on=["nope"])
    with pytest.raises(TypeError, match=r"partition_on: column 'x' is float64; folders can be made"):
        ds.to_parquet(str(tmp_path / "b"), partition_on=["x"])
    with pytest.raises(TypeError, match=r"partition_on must be a list of column names, got 'day'"):
        ds.to_parquet(str(tmp_path / "c"), partition_on="day")
    with pytest.raises(ValueError, match=r"partition_on cannot be combined with shuffle='full'"):
        ds.to_parquet(str(tmp_path / "d"), partition_on=["day"], shuffle="full")
    assert not list(tmp_path.iterdir())


def test_mixed_hive_folders_are_refused(tmp_path):
    for sub in ("day=1", "other=2"):
        (tmp_path / "d" / sub).mkdir(parents=True)
        pq.write_table(pa.table({"x": [1.0]}), tmp_path / "d" / sub / "p.parquet")
    with pytest.raises(DataError, match=r"other=2/p\.parquet: its folders name the partition columns "
                                        r"\['other'\], but .*day=1/p\.parquet has \['day'\]"):
        ts.Dataset(str(tmp_path / "d"))


def test_pandas_reads_partitioned_export(tmp_path):
    """pandas.read_parquet(dir) with no arguments (hive columns come back as
    categories). Without missing partition values: pyarrow's pandas conversion
    cannot yet unify dictionaries with nulls."""
    frame = _frame().dropna()
    out = tmp_path / "out"
    ts.Dataset(frame).to_parquet(str(out), partition_on=["day", "site"])
    back = pd.read_parquet(out).sort_values("row")
    assert back["row"].tolist() == frame["row"].tolist()
    assert back["x"].tolist() == frame["x"].tolist()
    assert back["site"].astype(str).tolist() == frame["site"].tolist()
    assert back["day"].astype(int).tolist() == frame["day"].astype(int).tolist()


def test_loader_refuses_a_partitioned_export(tmp_path):
    from tabstream.loaders import Loader

    frame = _frame().dropna()
    ts.Dataset(frame).to_parquet(str(tmp_path / "out"), partition_on=["day"])
    with pytest.raises(DataError, match=r"day=\d/part_\d+\.parquet: the dataset is hive-partitioned "
                                        r"\(col=value folders for \['day'\]\); loaders read"):
        Loader(str(tmp_path / "out"), batch_size=16, features=["x"], labels=["row"], shuffle=True)


@pytest.mark.parametrize(("values", "dtype"), [
    (["02134", "2134", "10001"], "string"),   # leading zeros: as integers two would be one
    (["true", "false", "true"], "string"),    # not booleans
    ([3, -1, 12], "int32"),                   # the stored width, not a guessed int64
    ([True, False, True], "bool"),
])
def test_partition_columns_read_back_with_their_stored_dtype(tmp_path, values, dtype):
    """An export's partition columns read back through Dataset take the dtype its
    schema stores, not one guessed from the folder names; pandas reads the same."""
    frame = pd.DataFrame({"key": pd.array(values, dtype="string" if dtype == "string" else dtype),
                          "v": [1, 2, 3]})
    ts.Dataset(frame).to_parquet(str(tmp_path / "out"), partition_on=["key"])
    back = ts.Dataset(str(tmp_path / "out"))
    assert back.schema["key"].dtype == dtype
    got = back.compute().sort_values("v")
    assert got["key"].tolist() == list(values)
    assert got["v"].tolist() == [1, 2, 3]


def test_hive_folders_without_a_schema_still_guess_integers(tmp_path):
    for day in (1, 2):
        (tmp_path / f"day={day}").mkdir()
        pd.DataFrame({"v": [day * 10]}).to_parquet(tmp_path / f"day={day}" / "part.parquet")
    got = ts.Dataset(str(tmp_path)).compute().sort_values("v")
    assert got["day"].tolist() == [1, 2] and str(got["day"].dtype).lower().startswith("int")

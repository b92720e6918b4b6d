"""A file rewritten and read again through a new Dataset gives its new rows, while
the old Dataset still lives (a notebook's variable, or a failed read's traceback):
dask reuses a live graph's expression of the same token, and two Datasets of one
path tokenized alike, so the new one read through the old one's partition cache.
The expected rows are those pandas reads from the file as it is."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError


def _write(path: Path, word: str, bad: int | None = None) -> None:
    rows = [word] * 300
    if bad is not None:
        rows[bad] = word[:2] + "," + word[2:]  # one field too many
    path.write_text("id,name\n" + "".join(f"{i},{v}\n" for i, v in enumerate(rows)))


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_rewritten_file_reads_anew_while_the_old_dataset_lives(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    kept = []
    for word in ("aaaa", "bbbb", "cccc"):
        if fmt == "csv":
            _write(path, word)
        else:
            pd.DataFrame({"id": range(300), "name": [word] * 300}).to_parquet(path, row_group_size=50)
        ds = ts.Dataset(str(path), part_size="1KB" if fmt == "csv" else None)
        frame = ds.to_ddf()
        got = frame.compute()
        want = pd.read_csv(path) if fmt == "csv" else pd.read_parquet(path)
        assert got["name"].tolist() == want["name"].tolist() == [word] * 300
        kept.append((ds, frame))  # the old Datasets and their dask frames stay alive


def test_a_rewritten_file_reads_anew_after_a_failed_read(tmp_path):
    path = tmp_path / "x.csv"
    _write(path, "aaaa", bad=250)
    with pytest.raises(DataError, match="line 252"):
        ts.Dataset(str(path), part_size="1KB").compute()
    _write(path, "bbbb", bad=200)  # the same size: only the contents differ
    with pytest.raises(DataError, match="line 202"):
        ts.Dataset(str(path), part_size="1KB").compute()
    _write(path, "cccc")
    assert ts.Dataset(str(path), part_size="1KB").compute()["name"].tolist() == ["cccc"] * 300


def test_splits_of_one_dataset_stay_apart(tmp_path):
    path = tmp_path / "x.parquet"
    pd.DataFrame({"id": range(1000)}).to_parquet(path, row_group_size=100)
    ds = ts.Dataset(str(path))
    train, valid = ds.split([0.7, 0.3], seed=1)
    a, b = train.compute()["id"], valid.compute()["id"]
    assert len(a) + len(b) == 1000 and not set(a) & set(b)
    assert sorted(ds.compute()["id"]) == list(range(1000))

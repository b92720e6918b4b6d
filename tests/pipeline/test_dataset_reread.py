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
    """The file (re)written as a new file put in place (a rename): a file truncated
    in place while a task of a failed read still maps it would be a bus error."""
    rows = [word] * 300
    if bad is not None:
        rows[bad] = word[:2] + "," + word[2:]  # one field too many
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("id,name\n" + "".join(f"{i},{v}\n" for i, v in enumerate(rows)))
    tmp.replace(path)


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_a_rewritten_file_reads_anew_while_the_old_dataset_lives(tmp_path, fmt):
    path = tmp_path / f"x.{fmt}"
    kept = []
    for word in ("aaaa", "bbbb", "cccc"):
        if fmt == "csv":
            _write(path, word)
        else:
            tmp = path.with_name("new.parquet")
            pd.DataFrame({"id": range(300), "name": [word] * 300}).to_parquet(tmp, row_group_size=50)
            tmp.replace(path)
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


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_datasets_sharing_a_cache_dir_read_their_own_rows(tmp_path, fmt):
    """Two Datasets given one ``cache_dir`` (train and valid, say), and a third after
    the first file was rewritten, each read their own file's rows (the cache's files
    are named by partition only: kept in the folder itself, they were read as the
    other Dataset's). Each Dataset's cache is a folder of its own in ``cache_dir``,
    removed with it; what else the folder holds is left alone."""
    import gc

    from tabstream import ops

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")

    def write(name, items):
        frame = pd.DataFrame({"item": items, "label": list(range(len(items)))})
        path = tmp_path / f"{name}.{fmt}"
        tmp = tmp_path / f"new.{fmt}"
        if fmt == "csv":
            frame.to_csv(tmp, index=False)
        else:
            frame.to_parquet(tmp)
        tmp.replace(path)  # a new file put in place, as a careful writer does
        return str(path), frame

    train_path, train = write("train", ["a", "b", "c"])
    valid_path, valid = write("valid", ["x", "y"])
    kw = {"cache_dir": str(cache)} if fmt == "parquet" else {"cache_dir": str(cache), "cache": "disk"}
    ds_train, ds_valid = ts.Dataset(train_path, **kw), ts.Dataset(valid_path, **kw)
    wf = ts.Workflow(["item"] >> ops.Categorify()).fit(ds_train)
    out = wf.transform(ds_valid).to_parquet(str(tmp_path / "out"))
    assert out.num_rows == 2
    assert ds_valid.compute()["item"].tolist() == valid["item"].tolist()
    assert ds_train.compute()["item"].tolist() == train["item"].tolist()
    write("train", ["d", "e", "f"])  # rewritten, the same size
    again = ts.Dataset(train_path, **kw)
    assert again.compute()["item"].tolist() == ["d", "e", "f"]
    folders = [p for p in cache.iterdir() if p.is_dir()]
    assert folders and all(p.name.startswith("tabstream-cache-") for p in folders)
    del ds_train, ds_valid, again, wf, out
    gc.collect()
    assert [p.name for p in cache.iterdir()] == ["notes.txt"]

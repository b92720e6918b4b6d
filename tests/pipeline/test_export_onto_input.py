"""An export never replaces or hides its own input: an output path that is one of
the dataset's input files, or a folder holding one (directly, deeper, through a
symlink, or on an object store), is refused before any work, with or without
``overwrite``, and the input stays byte for byte. The command line asks the same
before fitting. Outputs beside the input still export.

Expected results come from a second, plain route: file bytes read back and the
rows read with pandas."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream.cli import main
from tabstream.datasets.synthetic import write_data
from tabstream.ops import Categorify


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _frame(n: int = 60) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"a": rng.choice(list("uvwxyz"), n), "b": rng.integers(0, 100, n)})


def _workflow() -> ts.Workflow:
    return ts.Workflow(["a"] >> Categorify())


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("target", ["the-folder", "the-file", "a-parent", "a-symlink"])
def test_export_onto_its_input_is_refused(tmp_path, target, overwrite):
    data = tmp_path / "logs" / "data"
    data.mkdir(parents=True)
    _frame().to_parquet(data / "day0.parquet")
    _frame().iloc[::2].to_parquet(data / "day1.parquet")
    (tmp_path / "link").symlink_to(data)
    out = {"the-folder": data, "the-file": data / "day1.parquet", "a-parent": tmp_path / "logs",
           "a-symlink": tmp_path / "link"}[target]
    before = _files(tmp_path / "logs")
    ds = ts.Dataset(str(data))
    wf = _workflow()
    wf.fit(ds)
    with pytest.raises(FileExistsError, match=r"cannot export to .*: it is (the input file|a folder holding "
                                              r"the input .*day0\.parquet).* of this export; the export would "
                                              r"replace or hide what it reads") as err:
        wf.transform(ds).to_parquet(str(out), overwrite=overwrite)
    if target == "the-file":
        assert "it is the input file" in str(err.value)
    assert _files(tmp_path / "logs") == before
    assert sorted(os.listdir(tmp_path)) == ["link", "logs"]  # no scratch folder beside it
    # the dataset itself (no workflow) is refused alike
    with pytest.raises(FileExistsError, match="replace or hide what it reads"):
        ds.to_parquet(str(out), overwrite=overwrite)
    assert _files(tmp_path / "logs") == before


def test_export_beside_or_below_the_input_files_still_works(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    df = _frame()
    df.to_parquet(data / "day0.parquet")
    ds = ts.Dataset(str(data / "day0.parquet"))
    wf = _workflow()
    wf.fit(ds)
    # a sibling folder whose name starts like the input file's
    wf.transform(ds).to_parquet(str(data / "day0.parquet_out"))
    # a new folder inside the input's folder, which holds no input file
    wf.transform(ds).to_parquet(str(data / "sub" / "out"))
    expected = df["a"].map({v: i for i, v in enumerate(sorted(df["a"].unique()))})
    for out in (data / "day0.parquet_out", data / "sub" / "out"):
        got = pd.read_parquet(out)["a"].to_numpy()
        # Categorify's ids are a bijection of the values: the same partition of rows
        assert len(got) == len(df)
        pairs = set(zip(got.tolist(), expected.tolist()))
        assert len(pairs) == df["a"].nunique()


@pytest.mark.parametrize("target", ["s3://bkt/logs", "s3://bkt//logs/", "s3://bkt"])
def test_object_store_prefix_holding_the_input_is_refused(s3, target):
    fs, options = s3
    fs.pipe_file("bkt/logs/day0.parquet", _frame().to_parquet())
    ds = ts.Dataset("s3://bkt/logs", storage_options=options)
    with pytest.raises(FileExistsError, match="replace or hide what it reads"):
        ds.to_parquet(target, storage_options=options, overwrite=True)
    fs.invalidate_cache()
    assert fs.find("bkt/logs") == ["bkt/logs/day0.parquet"]


@pytest.mark.parametrize("as_folder", [False, True])
def test_cli_fit_with_output_onto_the_input_refuses_before_fitting(tmp_path, capsys, as_folder):
    write_data("criteo", tmp_path / "raw", 1500, num_files=2, fmt="tsv", seed=2)
    before = _files(tmp_path / "raw")
    out = tmp_path / "raw" if as_folder else tmp_path / "raw" / "part_00000.tsv"
    wf_dir = tmp_path / "wf"
    assert main(["fit", str(tmp_path / "raw"), "--output", str(out), "--overwrite",
                 "--workflow-dir", str(wf_dir), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"--output cannot export to {str(out)!r}" in err and "nothing was fitted or written" in err
    assert "pass an --output path outside the input" in err
    assert _files(tmp_path / "raw") == before
    assert not wf_dir.exists()  # refused before the fit and the save


def test_cli_transform_onto_its_input_refuses(tmp_path, capsys):
    write_data("criteo", tmp_path / "raw", 1500, num_files=1, fmt="tsv", seed=2)
    assert main(["fit", str(tmp_path / "raw"), "--workflow-dir", str(tmp_path / "wf"), "--quiet"]) == 0
    before = _files(tmp_path / "raw")
    capsys.readouterr()
    target = str(tmp_path / "raw" / "part_00000.tsv")
    assert main(["transform", str(tmp_path / "wf"), target, target, "--criteo-tsv", "--overwrite",
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"output cannot export to {target!r}: it is the input file" in err
    assert "pass an output path outside the input" in err
    assert _files(tmp_path / "raw") == before

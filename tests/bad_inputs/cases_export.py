"""Exports a user gets wrong: empty inputs, an existing output, bad arguments."""

from __future__ import annotations

import os

import pandas as pd
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream.core.errors import ExportError


def _fitted_workflow(tmp) -> str:
    cli("synth", "criteo", tmp / "raw", "--rows", 400, "--format", "tsv")
    cli("fit", tmp / "raw" / "part_00000.tsv", "--workflow-dir", tmp / "wf", "--freq-threshold", 0, "--quiet")
    return str(tmp / "wf")


def _empty_input_cli(tmp):
    wf = _fitted_workflow(tmp)
    (tmp / "empty.tsv").write_bytes(b"")
    try:
        cli("transform", wf, tmp / "empty.tsv", tmp / "out", "--criteo-tsv", "--quiet")
    finally:
        assert not os.path.exists(tmp / "out")
        assert not [n for n in os.listdir(tmp) if n.startswith(".")], "no hidden leftovers"


def _empty_frame_api(tmp):
    ts.Dataset(pd.DataFrame({"a": pd.Series([], dtype="int64")})).to_parquet(str(tmp / "out"))


def _output_exists_cli(tmp):
    """The output folder holds an export: refused before anything is read (a folder
    of other files takes the export, as the API's to_parquet does)."""
    wf = _fitted_workflow(tmp)
    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(tmp / "out"))
    before = sorted(p.name for p in (tmp / "out").iterdir())
    try:
        cli("transform", wf, tmp / "raw" / "part_00000.tsv", tmp / "out", "--criteo-tsv", "--quiet")
    finally:
        assert sorted(p.name for p in (tmp / "out").iterdir()) == before


def _output_of_other_files_cli(tmp):
    """A folder of the user's files takes the export, as the API's to_parquet does:
    their file stays, and reading the folder gives exactly the exported rows."""
    wf = _fitted_workflow(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("mine")
    cli("transform", wf, tmp / "raw" / "part_00000.tsv", tmp / "out", "--criteo-tsv", "--quiet")
    assert (tmp / "out" / "keep.txt").read_text() == "mine"
    raw = pd.read_csv(tmp / "raw" / "part_00000.tsv", sep="\t", header=None)
    assert len(ts.Dataset(str(tmp / "out")).to_ddf().compute()) == len(raw)


def _bad_shuffle_api(tmp):
    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(tmp / "out"), shuffle="sideways")


CASES = [
    ("empty input (CLI)", _empty_input_cli, CliFailed,
     r"ExportError: export to '.*out' refused: Dataset\('.*empty\.tsv'.* has no rows after the workflow"
     r".*\n  hint: check the input path"),
    ("empty DataFrame (API)", _empty_frame_api, ExportError, r"refused: Dataset\(.*has no rows, and an empty export"),
    ("output folder exists (CLI)", _output_exists_cli, CliFailed,
     r"FileExistsError: output folder .*out' already exists; pass overwrite=True to replace it: it "
     r"holds a tabstream export .*nothing was fitted or written\n  hint: pass --overwrite"),
    ("output folder of other files (CLI)", _output_of_other_files_cli, None, None),
    ("unknown shuffle (API)", _bad_shuffle_api, ValueError, r"shuffle must be one of .* got 'sideways'"),
]

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
    wf = _fitted_workflow(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "keep.txt").write_text("mine")
    try:
        cli("transform", wf, tmp / "raw" / "part_00000.tsv", tmp / "out", "--criteo-tsv", "--quiet")
    finally:
        assert (tmp / "out" / "keep.txt").read_text() == "mine"


def _bad_shuffle_api(tmp):
    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(tmp / "out"), shuffle="sideways")


CASES = [
    ("empty input (CLI)", _empty_input_cli, CliFailed,
     r"ExportError: export to '.*out' refused: Dataset\('.*empty\.tsv'.* has no rows after the workflow"
     r".*\n  hint: check the input path"),
    ("empty DataFrame (API)", _empty_frame_api, ExportError, r"refused: Dataset\(.*has no rows, and an empty export"),
    ("output folder exists (CLI)", _output_exists_cli, CliFailed,
     r"FileExistsError: .*out' already exists.*\n  hint: pass --overwrite"),
    ("unknown shuffle (API)", _bad_shuffle_api, ValueError, r"shuffle must be one of .* got 'sideways'"),
]

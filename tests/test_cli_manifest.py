"""``tabstream inspect`` and ``tabstream train`` refuse an export whose files
disagree with its ``_manifest.json`` (they read it through Dataset and Loader), with
one line naming the file and the expected and found row counts."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.cli import main


def _export(tmp_path):
    rows = 1200
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"C1": rng.integers(0, 50, rows), "I1": rng.random(rows).astype("float32"),
                       "label": rng.integers(0, 2, rows)})
    out = tmp_path / "export"
    ts.Dataset(df, part_size=4000).to_parquet(str(out), num_files=3)
    counts = {e["path"]: e["num_rows"] for e in json.loads((out / "_manifest.json").read_text())["files"]}
    return out, df, counts


def _tamper(out, how):
    if how == "deleted":
        (out / "part_00001.parquet").unlink()
        return r"part_00001.parquet: listed in .*_manifest.json with {n} rows, but the file is missing \(found 0 rows\)"
    if how == "smaller":
        pq.write_table(pq.read_table(out / "part_00001.parquet").slice(0, 25), out / "part_00001.parquet")
        return r"part_00001.parquet: .*_manifest.json lists {n} rows, found 25 rows"
    pq.write_table(pq.read_table(out / "part_00000.parquet").slice(0, 5), out / "part_00007.parquet")
    return r"part_00007.parquet: not listed in .*_manifest.json \(found 5 rows, expected no such file\)"


def test_inspect_counts_an_untouched_export(tmp_path, capsys):
    out, df, _ = _export(tmp_path)
    assert main(["inspect", str(out), "--json", "--quiet"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["num_rows"] == len(df)
    distinct = {c["name"]: c["distinct"] for c in report["columns"]}
    assert distinct["C1"] == df["C1"].nunique()


@pytest.mark.parametrize("command", ["inspect", "train"])
@pytest.mark.parametrize("how", ["deleted", "smaller", "extra"])
def test_tampered_export_is_refused(tmp_path, capsys, command, how):
    out, _, counts = _export(tmp_path)
    expected = counts["part_00001.parquet"]
    msg = _tamper(out, how).format(n=expected)
    argv = ["inspect", str(out), "--quiet"] if command == "inspect" else \
        ["train", str(out), "--epochs", "1", "--quiet"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert "hint: the export folder was changed after it was written" in err, err
    assert re.search(rf"tabstream {command}: DataError: .*{msg}", err), err

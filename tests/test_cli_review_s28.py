"""Regressions of the s28 command-line review: output folders checked before any
work and never emptied of what tabstream did not write (demo, synth, fit
--workflow-dir), a workflow file's functions saved by its module name, inspect's
--top and exact integer min/max, a closed pipe ending the command quietly.

Expected results come from a second, plain route: file listings, pyarrow/pandas
reads of the files, numpy over the values written."""

import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tabstream.cli import main
from tabstream.datasets.synthetic import CRITEO_COLUMNS, write_data

TABSTREAM = os.path.join(os.path.dirname(sys.executable), "tabstream")  # the console script


def run(*args: str, expect: int = 0) -> None:
    assert main(list(args)) == expect


def tree(folder) -> dict[str, bytes | None]:
    """Every path under ``folder`` (relative) with a file's bytes, None for a folder."""
    out: dict[str, bytes | None] = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder)] = None
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                out[os.path.relpath(os.path.join(root, f), folder)] = fh.read()
    return out


def text_lines(path) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


# -- demo ---------------------------------------------------------------------
def test_demo_refuses_a_folder_holding_other_files(tmp_path, capsys):
    out = tmp_path / "victim"
    (out / "my_project").mkdir(parents=True)
    (out / "my_project" / "notes.txt").write_text("precious")
    (out / "thesis.tex").write_text("precious")
    before = tree(out)
    run("demo", "--output", str(out), "--rows", "2000", "--days", "2", "--no-train", "--quiet", expect=1)
    assert tree(out) == before
    err = capsys.readouterr().err
    assert str(out) in err and "my_project/" in err and "thesis.tex" in err
    assert "--overwrite" not in err  # demo has none


def test_demo_refuses_an_earlier_run_with_other_files_in_raw(tmp_path, capsys):
    out = tmp_path / "demo"
    for sub in ("raw/probabilities", "train", "valid", "workflow"):
        (out / sub).mkdir(parents=True)
    (out / "raw" / "part_00000.tsv").write_text("1\t2\n")
    (out / "raw" / "notes.txt").write_text("mine")
    before = tree(out)
    run("demo", "--output", str(out), "--rows", "2000", "--days", "2", "--no-train", "--quiet", expect=1)
    assert tree(out) == before
    assert "raw/notes.txt" in capsys.readouterr().err


def test_demo_refuses_train_valid_workflow_folders_of_the_users_own(tmp_path, capsys):
    """train/, valid/ and workflow/ are the demo's names, and common names for a
    user's own data: they count as the demo's only when they hold one export (or one
    saved workflow) and nothing else."""
    out = tmp_path / "project"
    for sub in ("train", "valid", "workflow"):
        (out / sub).mkdir(parents=True)
    (out / "train" / "my_train_2025.csv").write_text("labelled")
    (out / "valid" / "holdout.csv").write_text("holdout")
    (out / "workflow" / "notes.md").write_text("notes")
    before = tree(out)
    run("demo", "--output", str(out), "--rows", "2000", "--days", "2", "--no-train", "--quiet", expect=1)
    assert tree(out) == before
    err = capsys.readouterr().err
    assert "train/my_train_2025.csv" in err and "valid/holdout.csv" in err and "workflow/notes.md" in err


def test_demo_output_dot_is_refused_in_a_project_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "setup.py").write_text("# a project")
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    run("demo", "--output", ".", "--rows", "2000", "--days", "2", "--no-train", "--quiet", expect=1)
    assert tree(tmp_path) == before
    assert "setup.py" in capsys.readouterr().err


@pytest.mark.parametrize("rows, days", [("3", "4"), ("2000", "1")])
def test_demo_checks_its_arguments_before_touching_the_folder(tmp_path, capsys, rows, days):
    out = tmp_path / "demo"  # looks like an earlier demo run's
    for sub in ("raw/probabilities", "train", "valid", "workflow"):
        (out / sub).mkdir(parents=True)
    (out / "raw" / "part_00000.tsv").write_text("1\t2\n")
    before = tree(out)
    run("demo", "--output", str(out), "--rows", rows, "--days", days, "--no-train", "--quiet", expect=1)
    assert tree(out) == before
    assert f"--days {days}" in capsys.readouterr().err


def test_demo_replaces_its_own_earlier_run(tmp_path, capsys):
    out = tmp_path / "demo"
    run("demo", "--output", str(out), "--rows", "3000", "--days", "3", "--no-train", "--quiet")
    run("demo", "--output", str(out), "--rows", "2000", "--days", "2", "--no-train", "--quiet", "--seed", "1")
    assert sorted(os.listdir(out)) == ["raw", "train", "valid", "workflow"]
    raw = sorted(os.listdir(out / "raw"))
    assert raw == ["part_00000.tsv", "part_00001.tsv", "probabilities"]
    assert sorted(os.listdir(out / "raw" / "probabilities")) == ["part_00000.parquet", "part_00001.parquet"]
    train_rows = sum(pq.read_metadata(p).num_rows for p in (out / "train").glob("*.parquet"))
    assert train_rows == text_lines(out / "raw" / "part_00000.tsv") == 1000


# -- fit --workflow-dir ---------------------------------------------------------
@pytest.fixture
def raw_tsv(tmp_path):
    write_data("criteo", tmp_path / "raw", 2000, num_files=2, fmt="tsv", seed=1)
    return tmp_path / "raw"


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_fit_refuses_a_busy_workflow_dir_before_fitting(tmp_path, raw_tsv, capsys, overwrite):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("keep")
    run("fit", str(raw_tsv), "--workflow-dir", str(busy), "--output", str(tmp_path / "out"), "--quiet",
        *overwrite, expect=1)
    assert tree(busy) == {"notes.txt": b"keep"}
    assert not (tmp_path / "out").exists()
    captured = capsys.readouterr()
    assert "fit" not in captured.out  # no timings: nothing ran
    err = captured.err
    assert "--workflow-dir" in err and "notes.txt" in err and "nothing was fitted" in err
    hint = err.split("hint:", 1)[1]
    assert "pass --overwrite" not in hint and "--overwrite applies to --output only" in hint


def test_fit_replaces_an_earlier_save_in_the_workflow_dir(tmp_path, raw_tsv, capsys):
    wf = tmp_path / "wf"
    run("fit", str(raw_tsv), "--workflow-dir", str(wf), "--quiet")
    run("fit", str(raw_tsv), "--workflow-dir", str(wf), "--quiet", "--freq-threshold", "1")
    assert "workflow.json" in os.listdir(wf)


# -- fit --workflow-file ----------------------------------------------------------
WORKFLOW_FILE = '''import tabstream as ts
from tabstream import ops

def double(col):
    return col * 2

workflow = ts.Workflow((["I1"] >> ops.FillMissing(0) >> ops.LambdaOp({f})) + ["label"])
'''


@pytest.fixture
def forget_module():
    """Workflow files are imported into this process: forget them after the test."""
    path = list(sys.path)
    yield
    for name in ("my_wf_s28", "lambda_wf", "tabstream_user_workflow"):
        sys.modules.pop(name, None)
    sys.path[:] = path


def _fit_args(raw_tsv, wf_file, wf_dir, out):
    return ("fit", str(raw_tsv / "part_00000.tsv"), "--workflow-file", str(wf_file),
            "--names", ",".join(CRITEO_COLUMNS), "--dtypes", "I1=float32",
            "--workflow-dir", str(wf_dir), "--output", str(out), "--quiet")


def test_workflow_file_function_saved_by_module_name_loads_again(tmp_path, raw_tsv, capsys, forget_module):
    folder = tmp_path / "wfl"
    folder.mkdir()
    (folder / "my_wf_s28.py").write_text(WORKFLOW_FILE.format(f="double"))
    run(*_fit_args(raw_tsv, folder / "my_wf_s28.py", tmp_path / "wf", tmp_path / "out"))
    assert '"my_wf_s28:double"' in (tmp_path / "wf" / "workflow.json").read_text()
    assert "--allow-module my_wf_s28" in capsys.readouterr().out
    # a new process, run from the file's folder, as the user would
    proc = subprocess.run([TABSTREAM, "transform", str(tmp_path / "wf"), str(raw_tsv / "part_00001.tsv"),
                           str(tmp_path / "again"), "--criteo-tsv", "--quiet", "--allow-module", "my_wf_s28"],
                          cwd=folder, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    got = pd.read_parquet(tmp_path / "again").sort_index()
    raw = pd.read_csv(raw_tsv / "part_00001.tsv", sep="\t", header=None, names=CRITEO_COLUMNS)
    np.testing.assert_allclose(got["I1"].to_numpy(), raw["I1"].fillna(0).to_numpy() * 2)


@pytest.mark.parametrize("name, f, why", [
    ("lambda_wf.py", "lambda c: c * 2", "lambda"),
    ("my-wf.py", "double", "not a Python module name"),
])
def test_workflow_file_that_cannot_be_saved_fails_before_the_fit(tmp_path, raw_tsv, capsys, forget_module,
                                                                 name, f, why):
    (tmp_path / name).write_text(WORKFLOW_FILE.format(f=f))
    # the input does not exist: only a check made before reading any data reports the save
    args = list(_fit_args(raw_tsv, tmp_path / name, tmp_path / "wf", tmp_path / "out"))
    args[1] = str(tmp_path / "no_such_input.tsv")
    run(*args, expect=1)
    err = capsys.readouterr().err
    assert "FunctionResolutionError" in err and why in err and "nothing was fitted" in err
    assert not (tmp_path / "wf").exists() and not (tmp_path / "out").exists()


# -- synth ----------------------------------------------------------------------
def test_synth_into_an_earlier_synth_folder_holds_only_the_new_rows(tmp_path, capsys):
    out = tmp_path / "synth"
    run("synth", "criteo", str(out), "--rows", "1000", "--files", "4", "--format", "tsv", "--probabilities")
    run("synth", "criteo", str(out), "--rows", "10", "--files", "1", "--format", "parquet", "--seed", "2")
    assert sorted(os.listdir(out)) == ["part_00000.parquet"]
    assert pq.read_table(out / "part_00000.parquet").num_rows == 10


def test_synth_refuses_a_folder_of_other_files(tmp_path, capsys):
    out = tmp_path / "synth"
    out.mkdir()
    pd.DataFrame({"x": [1, 2]}).to_parquet(out / "mine.parquet")
    (out / "part_00000.parquet.bak").write_text("mine")
    before = tree(out)
    run("synth", "criteo", str(out), "--rows", "10", expect=1)
    assert tree(out) == before
    err = capsys.readouterr().err
    assert str(out) in err and "mine.parquet" in err and "part_00000.parquet.bak" in err
    assert "--overwrite" not in err  # synth has none


def test_write_data_refuses_other_files_in_probabilities(tmp_path):
    write_data("criteo", tmp_path, 100, num_files=2, return_probability=True)
    (tmp_path / "probabilities" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"probabilities/notes\.txt"):
        write_data("criteo", tmp_path, 100)
    assert sorted(os.listdir(tmp_path)) == ["part_00000.parquet", "part_00001.parquet", "probabilities"]


# -- inspect ----------------------------------------------------------------------
def test_inspect_text_report_lists_top_n_values(tmp_path, capsys):
    values = pd.Series([f"v{i % 12}" for i in range(1200)] + ["rare"], dtype="string")
    pd.DataFrame({"c": values}).to_parquet(tmp_path / "top.parquet")
    capsys.readouterr()
    run("inspect", str(tmp_path / "top.parquet"), "--top", "12", "--quiet")
    line = capsys.readouterr().out.split("top values")[1].splitlines()[1]
    listed = [item.strip().split(" (")[0] for item in line.split(None, 1)[1].split(", ")]
    expected = values.value_counts().sort_index().sort_values(ascending=False, kind="stable")
    assert listed == list(expected.index[:12])


def test_inspect_integer_min_max_are_exact(tmp_path, capsys):
    ids = np.array([2**60 + 1, 2**60 + 999, 9_007_199_254_740_993, 2**63 - 1], dtype="int64")
    folder = tmp_path / "ids"
    folder.mkdir()
    for i, part in enumerate((ids[:2], ids[2:])):  # one partition each: merged exactly
        pd.DataFrame({"user_id": part}).to_parquet(folder / f"part_{i}.parquet")
    capsys.readouterr()
    run("inspect", str(folder), "--json", "--quiet")
    (col,) = json.loads(capsys.readouterr().out)["columns"]
    assert (col["min"], col["max"]) == (int(ids.min()), int(ids.max()))
    assert type(col["min"]) is int and type(col["max"]) is int
    assert (col["quantiles"]["0.0"], col["quantiles"]["1.0"]) == (int(ids.min()), int(ids.max()))
    assert col["mean"] == pytest.approx(float(ids.astype(np.float64).mean()))
    run("inspect", str(folder), "--quiet")
    assert str(int(ids.max())) in capsys.readouterr().out


def test_inspect_into_a_closed_pipe_ends_quietly(tmp_path):
    pd.DataFrame({"c": [f"v{i}" for i in range(300)]}).to_parquet(tmp_path / "x.parquet")
    with subprocess.Popen([TABSTREAM, "inspect", str(tmp_path / "x.parquet"), "--quiet"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        proc.stdout.close()  # the reader goes away before the command writes
        err = proc.stderr.read().decode()
        assert proc.wait() == 141  # 128 + SIGPIPE, as `seq 1 100000 | head -1` reports
    assert err == ""

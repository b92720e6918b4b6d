"""The command line explains itself (help and defaults for every option,
``--version``), reads any raw log (``--sep``, ``--names``, ``--header``,
``--dtypes``) and refuses an existing output before doing any work."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.cli import build_parser, main


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_option_of_every_command_has_help_and_shows_its_default():
    parser = build_parser()
    commands = _subparsers(parser)
    assert set(commands) == {"synth", "fit", "transform", "inspect", "train", "reshard", "demo"}
    for name, sub in [("tabstream", parser), *commands.items()]:
        formatter = sub._get_formatter()
        for action in sub._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction,
                                   argparse._SubParsersAction)):
                continue
            assert action.help, f"{name} {action.dest}: no help text"
            if not action.option_strings:
                continue
            flag = action.option_strings[-1]
            shown = formatter._expand_help(action)  # the text --help prints for it
            if action.default is None:
                assert "(default: " in shown and "(default: None)" not in shown, \
                    f"{name} {flag}: no default in words: {shown!r}"
            else:
                assert f"(default: {action.default})" in shown, f"{name} {flag}: {shown!r}"


def test_part_size_and_files_per_proc_help_say_what_the_code_does(tmp_path):
    fit = _subparsers(build_parser())["fit"]
    transform = _subparsers(build_parser())["transform"]
    helps = {a.option_strings[-1]: fit._get_formatter()._expand_help(a) for a in fit._actions if a.option_strings}
    # the default a Dataset really takes when --part-size is not given
    ds = ts.Dataset(pd.DataFrame({"x": [1, 2]}))
    assert f"(default: {ds.part_size // 2**20}MB)" in helps["--part-size"]
    files = next(a for a in transform._actions if "--out-files-per-proc" in a.option_strings)
    text = transform._get_formatter()._expand_help(files)
    assert "per worker" in text and "split equally" in text and "(default: 1)" in text


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"tabstream {version('tabstream')}"


def _saved_workflow(tmp_path, df: pd.DataFrame) -> str:
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.Normalize()) + ["y"])
    wf.fit(ts.Dataset(df))
    wf.save(str(tmp_path / "wf"))
    return str(tmp_path / "wf")


def _raw_frame(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"y": rng.integers(0, 2, n), "x": rng.normal(size=n).round(3),
                         "c": rng.choice(["a", "b", "c", "d"], n)})


@pytest.mark.parametrize("header", [False, True])
def test_transform_reads_a_generic_raw_log(tmp_path, header):
    df = _raw_frame()
    wf_dir = _saved_workflow(tmp_path, df)
    raw = tmp_path / "log.txt"
    df.to_csv(raw, sep="|", header=header, index=False)
    argv = ["transform", wf_dir, str(raw), str(tmp_path / "out"), "--engine", "csv", "--sep", "pipe",
            "--names", "y,x,c", "--dtypes", "y=int64,x=float64", "--quiet"]
    assert main(argv + (["--header"] if header else [])) == 0
    got = pd.read_parquet(tmp_path / "out").sort_index(axis=1)
    expected = ts.Workflow.load(wf_dir).transform(df).sort_index(axis=1)
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True),
                                  check_dtype=False)


def test_inspect_reads_a_raw_log_with_its_own_header(tmp_path, capsys):
    df = _raw_frame()
    df.to_csv(tmp_path / "log.csv", sep=";", index=False)
    assert main(["inspect", str(tmp_path / "log.csv"), "--sep", ";", "--dtypes", "x=float64",
                 "--json", "--quiet"]) == 0
    cols = {c["name"]: c for c in json.loads(capsys.readouterr().out)["columns"]}
    assert cols["x"]["mean"] == pytest.approx(df["x"].mean())
    assert cols["c"]["distinct"] == df["c"].nunique()
    # undeclared columns are typed as pandas types them (integers here), declared ones as given
    assert cols["y"]["dtype"] == str(pd.read_csv(tmp_path / "log.csv", sep=";")["y"].dtype)
    assert cols["c"]["dtype"] == "string"


def test_inspect_text_report_and_plots(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    df = _raw_frame()
    df.to_parquet(tmp_path / "d.parquet")
    assert main(["inspect", str(tmp_path / "d.parquet"), "--plots", str(tmp_path / "p"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "overview.png" in out and "top values" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("x "))
    assert f"{df['x'].median():.4g}" in line.split()
    assert sorted(p.name for p in (tmp_path / "p").iterdir()) == ["c.png", "overview.png", "x.png", "y.png"]


def test_fit_refuses_an_existing_output_before_fitting(tmp_path, capsys):
    df = _raw_frame()
    df.to_parquet(tmp_path / "raw.parquet")
    (tmp_path / "wf.py").write_text(
        "import tabstream as ts\nfrom tabstream import ops\n"
        "workflow = ts.Workflow(['c'] >> ops.Categorify())\n")
    # the output holds an export (a folder of other files would take the new one)
    import tabstream as ts

    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(tmp_path / "out"))
    code = main(["fit", str(tmp_path / "raw.parquet"), "--workflow-file", str(tmp_path / "wf.py"),
                 "--workflow-dir", str(tmp_path / "wf"), "--output", str(tmp_path / "out"), "--quiet"])
    assert code == 1
    err = capsys.readouterr().err
    assert "FileExistsError: output folder" in err and "nothing was fitted or written" in err
    assert "holds a tabstream export" in err
    assert "--overwrite" in err
    assert not (tmp_path / "wf").exists()  # the fit never ran, so nothing was saved
    assert main(["fit", str(tmp_path / "raw.parquet"), "--workflow-file", str(tmp_path / "wf.py"),
                 "--output", str(tmp_path / "out"), "--overwrite", "--quiet"]) == 0
    got = pd.read_parquet(tmp_path / "out")
    assert got["c"].nunique() == df["c"].nunique()


def test_fit_recipe_on_generic_options(tmp_path):
    from tabstream.datasets.synthetic import CRITEO_COLUMNS

    main(["synth", "criteo", str(tmp_path / "raw"), "--rows", "300", "--format", "tsv"])
    lines = (tmp_path / "raw" / "part_00000.tsv").read_text().splitlines()
    (tmp_path / "h.tsv").write_text("\n".join(["\t".join(CRITEO_COLUMNS), *lines]) + "\n")
    assert main(["fit", str(tmp_path / "h.tsv"), "--header", "--dtypes",
                 ",".join(f"{n}=float32" for n in CRITEO_COLUMNS[1:14]),
                 "--output", str(tmp_path / "out"), "--quiet"]) == 0
    assert len(pd.read_parquet(tmp_path / "out")) == 300


@pytest.mark.parametrize(("option", "value"), [("--epochs", "0"), ("--epochs", "-2"), ("--batch-size", "0"),
                                               ("--epochs", "two")])
def test_train_counts_must_be_at_least_one(tmp_path, capsys, option, value):
    """`tabstream train --epochs 0` trained nothing and said nothing; now argparse's
    one-line usage error names the option."""
    with pytest.raises(SystemExit) as exc:
        main(["train", str(tmp_path), option, value])
    assert exc.value.code == 2
    assert f"argument {option}: expected a whole number of at least 1" in capsys.readouterr().err


def test_options_extend_the_workflow_files_and_the_recipes_read_settings(tmp_path):
    """--dtypes adds to the settings a workflow file (or the Criteo recipe) reads with,
    --sep/--names replace theirs; before, any option dropped all of them."""
    (tmp_path / "nohdr.csv").write_text("1,x,0\n2,y,1\n3,x,0\n")
    (tmp_path / "wf.py").write_text(
        "import tabstream as ts\nfrom tabstream import ops\n"
        "workflow = ts.Workflow((['b'] >> ops.Categorify()) + ['a', 'label'])\n"
        "dataset_kwargs = {'names': ['a', 'b', 'label'], 'dtypes': {'a': 'float32'}}\n")
    for extra, label in ((["--dtypes", "label=int8"], "int8"), (["--sep", "comma"], "int64")):
        out = tmp_path / f"out{label}"
        assert main(["fit", str(tmp_path / "nohdr.csv"), "--workflow-file", str(tmp_path / "wf.py"),
                     *extra, "--output", str(out), "--quiet"]) == 0
        got = pd.read_parquet(out)
        assert str(got["a"].dtype) == "float32" and str(got["label"].dtype) == label
        assert got.sort_values("a")["label"].tolist() == [0, 1, 0]
    from tabstream.datasets.synthetic import CRITEO_COLUMNS

    main(["synth", "criteo", str(tmp_path / "raw"), "--rows", "300", "--format", "tsv"])
    assert main(["fit", str(tmp_path / "raw"), "--dtypes", "I1=float32", "--output", str(tmp_path / "crit"),
                 "--quiet"]) == 0
    raw = pd.read_csv(tmp_path / "raw" / "part_00000.tsv", sep="\t", names=CRITEO_COLUMNS, header=None)
    assert sorted(pd.read_parquet(tmp_path / "crit")["label"].tolist()) == sorted(raw["label"].tolist())

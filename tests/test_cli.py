import json
import subprocess
import sys

import pytest

from tabstream.cli import build_parser, main


def run(*args, expect=0):
    code = main(list(args))
    assert code == expect
    return code


@pytest.mark.parametrize("command", ["synth", "fit", "transform", "inspect", "train", "demo"])
def test_help_for_every_command(command, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args([command, "--help"])
    assert exc.value.code == 0
    assert "usage: tabstream " + command in capsys.readouterr().out


def test_synth_fit_transform_inspect(tmp_path, capsys):
    raw = tmp_path / "raw"
    run("synth", "criteo", str(raw), "--rows", "3000", "--files", "2", "--format", "tsv")
    assert sorted(p.name for p in raw.glob("*.tsv")) == ["part_00000.tsv", "part_00001.tsv"]
    run("fit", str(raw), "--recipe", "criteo", "--workflow-dir", str(tmp_path / "wf"),
        "--output", str(tmp_path / "train"), "--shuffle", "per_worker", "--quiet")
    run("transform", str(tmp_path / "wf"), str(raw / "part_00001.tsv"), str(tmp_path / "again"),
        "--criteo-tsv", "--quiet")
    capsys.readouterr()
    run("inspect", str(tmp_path / "again"), "--json", "--quiet")
    report = json.loads(capsys.readouterr().out)
    assert report["num_rows"] == 1500
    cols = {c["name"]: c for c in report["columns"]}
    assert cols["C1"]["cardinality"] >= cols["C1"]["distinct"]
    assert cols["I1"]["null_rate"] == 0.0 and cols["label"]["tags"] == ["binary_classification", "target"]


def test_inspect_reports_null_rates_of_raw_logs(tmp_path, capsys):
    raw = tmp_path / "raw"
    run("synth", "criteo", str(raw), "--rows", "2000", "--format", "tsv")
    capsys.readouterr()
    run("inspect", str(raw), "--criteo-tsv", "--json", "--quiet")
    report = json.loads(capsys.readouterr().out)
    import pyarrow.csv as pacsv

    from tabstream.datasets.synthetic import CRITEO_COLUMNS

    table = pacsv.read_csv(str(raw / "part_00000.tsv"),
                           read_options=pacsv.ReadOptions(column_names=CRITEO_COLUMNS),
                           parse_options=pacsv.ParseOptions(delimiter="\t"),
                           convert_options=pacsv.ConvertOptions(strings_can_be_null=True))
    for col in report["columns"]:
        assert col["null_rate"] == pytest.approx(table.column(col["name"]).null_count / 2000)


def test_errors_are_one_line_with_hint(tmp_path, capsys):
    run("inspect", str(tmp_path / "missing.parquet"), expect=1)
    err = capsys.readouterr().err
    assert "FileNotFoundError" in err and "hint:" in err and "Traceback" not in err


def test_debug_shows_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "tabstream.cli", "--debug", "inspect", str(tmp_path / "nope")],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_demo_runs_without_training(tmp_path, capsys):
    run("demo", "--rows", "20000", "--output", str(tmp_path / "demo"), "--no-train", "--quiet")
    out = capsys.readouterr().out
    assert "fit" in out and "export train" in out and "C26" in out
    assert (tmp_path / "demo" / "train" / "_schema.json").exists()
    assert (tmp_path / "demo" / "valid" / "_manifest.json").exists()


def test_train_command_reports_auc(tmp_path, capsys):
    pytest.importorskip("torch")
    raw = tmp_path / "raw"
    run("synth", "criteo", str(raw), "--rows", "6000", "--files", "2", "--format", "parquet")
    run("fit", str(raw / "part_00000.parquet"), "--workflow-dir", str(tmp_path / "wf"),
        "--output", str(tmp_path / "train"), "--quiet", "--freq-threshold", "2")
    run("transform", str(tmp_path / "wf"), str(raw / "part_00001.parquet"), str(tmp_path / "valid"), "--quiet")
    capsys.readouterr()
    run("train", str(tmp_path / "train"), "--valid", str(tmp_path / "valid"), "--quiet", "--batch-size", "512")
    out = capsys.readouterr().out
    assert "epoch 1:" in out and "val AUC" in out
    auc = float(out.split("val AUC")[1].split()[0])
    assert 0.0 <= auc <= 1.0


@pytest.mark.slow
def test_demo_trains_close_to_the_oracle(tmp_path, capsys):
    pytest.importorskip("torch")
    from tabstream.demo import run_demo

    result = run_demo(rows=400_000, output=str(tmp_path / "demo"), progress=False)
    assert result["oracle_auc"] - result["val_auc"] < 0.04
    assert result["val_auc"] > 0.7


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    """A 600-row criteo-like export, from tabstream's synthetic generator and fit."""
    root = tmp_path_factory.mktemp("tiny_export")
    run("synth", "criteo", str(root / "raw"), "--rows", "600", "--format", "parquet")
    run("fit", str(root / "raw"), "--workflow-dir", str(root / "wf"),
        "--output", str(root / "train"), "--quiet", "--freq-threshold", "2")
    return root / "train"


def _checkpoint(folder):
    import torch

    return torch.load(folder / "checkpoint.pt", weights_only=True)


def _assert_same_model(a, b):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].equal(b[key]), key


def test_train_checkpoint_dir_resumes_instead_of_retraining(tiny_export, tmp_path, capsys):
    pytest.importorskip("torch")
    train = str(tiny_export)
    common = ("--quiet", "--batch-size", "128", "--seed", "3")
    # reference: two epochs in one go
    run("train", train, "--epochs", "2", "--checkpoint-dir", str(tmp_path / "straight"), *common)
    straight = _checkpoint(tmp_path / "straight")
    assert (straight["epoch"], straight["step"]) == (2, 0)

    ck = tmp_path / "ck"
    run("train", train, "--epochs", "1", "--checkpoint-dir", str(ck), *common)
    assert _checkpoint(ck)["epoch"] == 1
    capsys.readouterr()
    run("train", train, "--epochs", "2", "--checkpoint-dir", str(ck), *common)
    out = capsys.readouterr().out
    assert f"resumed from {ck / 'checkpoint.pt'}: 1 epoch(s) done; training epochs 2 to 2" in out
    assert "epoch 1:" in out and "epoch 2:" in out  # the resumed history is reported too
    resumed = _checkpoint(ck)
    assert resumed["epoch"] == 2
    _assert_same_model(resumed["model"], straight["model"])  # as if it never stopped
    assert resumed["history"]["loss"] == straight["history"]["loss"]

    # all epochs done: nothing is trained, the checkpoint stays as it was, and it says so
    before = (ck / "checkpoint.pt").read_bytes()
    run("train", train, "--epochs", "2", "--checkpoint-dir", str(ck), *common)
    out = capsys.readouterr().out
    assert (f"{ck / 'checkpoint.pt'}: all 2 epoch(s) already trained (2 epoch(s) done); "
            "nothing to train. Pass --epochs 3 or more") in out
    assert (ck / "checkpoint.pt").read_bytes() == before

    # --no-resume starts over: one fresh epoch, equal to the first one-epoch run
    fresh = tmp_path / "fresh"
    run("train", train, "--epochs", "1", "--checkpoint-dir", str(fresh), *common)
    run("train", train, "--epochs", "1", "--checkpoint-dir", str(ck), "--no-resume", *common)
    out = capsys.readouterr().out
    assert "resumed" not in out and "nothing to train" not in out
    again = _checkpoint(ck)
    assert (again["epoch"], again["history"]["epoch"]) == (1, [1])
    _assert_same_model(again["model"], _checkpoint(fresh)["model"])


def test_train_refuses_a_checkpoint_of_another_model(tiny_export, tmp_path, capsys):
    pytest.importorskip("torch")
    ck = tmp_path / "ck"
    run("train", str(tiny_export), "--checkpoint-dir", str(ck), "--quiet", "--batch-size", "256")
    capsys.readouterr()
    run("train", str(tiny_export), "--checkpoint-dir", str(ck), "--model", "dcn", "--quiet",
        expect=1)
    err = capsys.readouterr().err
    assert (f"SchemaError: checkpoint {ck / 'checkpoint.pt'} was written for a DLRM model, "
            "not DCN") in err
    assert "hint:" in err and "Traceback" not in err

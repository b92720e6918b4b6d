"""Workflow folders from someone else, and what issue 27 found around them: code
beside workflow.json (never imported), deeply nested JSON (a DataError naming the
file), a fit left with no rows by a Filter, a save into a folder of other files.
The subprocess forms (python -c / -m started in the folder, SIGKILLed savers) are
in tests/pipeline/test_untrusted_folders.py and test_workflow_save_atomic.py."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pandas as pd
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.ops.functions import FunctionResolutionError

EVIL = "import pathlib\npathlib.Path({marker!r}).write_text('imported')\n\ndef double(s):\n    return s * 2\n"


def _frame():
    return pd.DataFrame({"x": np.linspace(-2.0, 2.0, 30) * 1.7, "c": list("abc") * 10})


def _saved(tmp, f="numpy:round"):
    """A fitted workflow saved in tmp/wf whose LambdaOp's function is then named ``f``."""
    frame = _frame()
    wf = ts.Workflow((["x"] >> ops.LambdaOp(np.round)) + (["c"] >> ops.Categorify()))
    wf.fit(ts.Dataset(frame)).save(str(tmp / "wf"))
    frame.to_parquet(tmp / "raw.parquet", index=False)
    path = tmp / "wf" / "workflow.json"
    doc = json.loads(path.read_text())
    for node in doc["nodes"]:
        if node["kind"] == "op" and node["op"]["class"] == "LambdaOp":
            node["op"]["params"]["f"] = f
    path.write_text(json.dumps(doc))
    return tmp / "wf", frame


class _Inside:
    """As ``python -c`` started in ``where``: the current directory is ``where`` and
    ``''`` leads sys.path."""

    def __init__(self, where):
        self.where = where

    def __enter__(self):
        self.cwd = os.getcwd()
        os.chdir(self.where)
        sys.path.insert(0, "")

    def __exit__(self, *exc):
        sys.path.remove("")
        os.chdir(self.cwd)


def _never_imported(tmp, module):
    """Checks after the load: the module's top-level code never ran."""
    assert not (tmp / "marker").exists(), "the folder's module was imported"
    assert module not in sys.modules


def _evil_in_folder(tmp):
    folder, _ = _saved(tmp, "h27_evilmod:double")
    (folder / "h27_evilmod.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    try:
        with _Inside(folder):
            ts.Workflow.load(".")
    finally:
        _never_imported(tmp, "h27_evilmod")


def _evil_in_cwd(tmp):
    folder, _ = _saved(tmp, "h27_evilcwd:double")
    work = tmp / "work"
    work.mkdir()
    (work / "h27_evilcwd.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    try:
        with _Inside(work):
            ts.Workflow.load(str(folder))
    finally:
        _never_imported(tmp, "h27_evilcwd")


def _evil_package_in_folder(tmp):
    """A package (a folder with __init__.py) instead of a module file."""
    folder, _ = _saved(tmp, "h27_evilpkg.sub:double")
    pkg = folder / "h27_evilpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    (pkg / "sub.py").write_text("def double(s):\n    return s * 2\n")
    try:
        with _Inside(folder):
            ts.Workflow.load(".")
    finally:
        _never_imported(tmp, "h27_evilpkg")


def _evil_on_sys_path(tmp):
    """A folder on sys.path that is not site-packages (as PYTHONPATH puts one)."""
    folder, _ = _saved(tmp, "h27_evilpath:double")
    other = tmp / "other"
    other.mkdir()
    (other / "h27_evilpath.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    sys.path.insert(0, str(other))
    try:
        ts.Workflow.load(str(folder))
    finally:
        sys.path.remove(str(other))
        _never_imported(tmp, "h27_evilpath")


def _installed_function_in_the_folder(tmp):
    """numpy:round loads from site-packages with the folder as the current
    directory and transforms as pandas rounds."""
    folder, frame = _saved(tmp)
    (folder / "numpy.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    with _Inside(folder):
        out = ts.Workflow.load(".").transform(frame)
    assert not (tmp / "marker").exists()
    np.testing.assert_array_equal(out["x"].to_numpy(), frame["x"].round().to_numpy())


def _load_with(name):
    def run(tmp):
        folder, _ = _saved(tmp, name)
        ts.Workflow.load(str(folder))
    return run


def _allowed_modules_a_string(tmp):
    folder, _ = _saved(tmp)
    ts.Workflow.load(str(folder), allowed_modules="mymod")


def _cli_transform_in_the_folder(tmp):
    folder, _ = _saved(tmp, "h27_evilcli:double")
    (folder / "h27_evilcli.py").write_text(EVIL.format(marker=str(tmp / "marker")))
    try:
        with _Inside(folder):
            cli("transform", ".", tmp / "raw.parquet", tmp / "out", "--quiet")
    finally:
        _never_imported(tmp, "h27_evilcli")
        assert not (tmp / "out").exists()


def _deep(rel, text):
    def run(tmp):
        frame = _frame()
        ts.Dataset(frame).to_parquet(str(tmp / "out"))
        (tmp / "out" / rel).write_text(text)
        _ = ts.Dataset(str(tmp / "out")).schema
    return run


def _deep_workflow(tmp):
    folder, _ = _saved(tmp)
    (folder / "workflow.json").write_text('{"format": ' * 50_000 + "1" + "}" * 50_000)
    ts.Workflow.load(str(folder))


def _fit_after_filter_removes_everything(tmp):
    ts.Workflow(["x", "c"] >> ops.Filter(_none) >> ops.Categorify()).fit(ts.Dataset(_frame(), part_size=400))


def _none(df):
    return df["x"] > 100


def _save_into_a_folder_of_other_files(tmp):
    (tmp / "wf").mkdir()
    (tmp / "wf" / "model.pt").write_bytes(b"weights")
    try:
        ts.Workflow(["c"] >> ops.Categorify()).fit(ts.Dataset(_frame())).save(str(tmp / "wf"))
    finally:
        assert os.listdir(tmp / "wf") == ["model.pt"]


REFUSE = r"refusing to import module '{m}' for the saved function '{f}': it would run .*{file}, which is {where}"
ALLOW = r".*allowed_modules=\['{m}'\].*functions=\{{'{f}': f\}}"

CASES = [
    ("module beside workflow.json, python -c in the folder", _evil_in_folder, FunctionResolutionError,
     REFUSE.format(m="h27_evilmod", f="h27_evilmod:double", file=r"wf/h27_evilmod\.py",
                   where="in the workflow folder") + ALLOW.format(m="h27_evilmod", f="h27_evilmod:double")),
    ("package beside workflow.json", _evil_package_in_folder, FunctionResolutionError,
     REFUSE.format(m="h27_evilpkg", f="h27_evilpkg.sub:double", file=r"wf/h27_evilpkg/__init__\.py",
                   where="in the workflow folder")),
    ("module in the current directory", _evil_in_cwd, FunctionResolutionError,
     REFUSE.format(m="h27_evilcwd", f="h27_evilcwd:double", file=r"work/h27_evilcwd\.py",
                   where="in the current directory")),
    ("module on a sys.path folder outside site-packages", _evil_on_sys_path, FunctionResolutionError,
     REFUSE.format(m="h27_evilpath", f="h27_evilpath:double", file=r"other/h27_evilpath\.py",
                   where=r"not in an installed package \(site-packages\)")),
    ("installed function, numpy.py shadow in the folder", _installed_function_in_the_folder, None, None),
    ("function of tabstream itself", _load_with("tabstream.cli:main"), FunctionResolutionError,
     r"LambdaOp: refusing the function 'tabstream.cli:main': module 'tabstream.cli' is part of tabstream itself"),
    ("standard library function", _load_with("logging.config:listen"), FunctionResolutionError,
     r"module 'logging' is part of the standard library, not an installed package.*allowed_modules=\['logging'\]"),
    ("installed file reader", _load_with("pandas:read_csv"), FunctionResolutionError,
     r"module 'pandas.io.parsers.readers' may not be used for saved functions"),
    ("installed class, not a function", _load_with("pandas:DataFrame"), FunctionResolutionError,
     r"the saved name 'pandas:DataFrame' does not name a plain Python function"),
    ("allowed_modules given as one string", _allowed_modules_a_string, TypeError,
     r"allowed_modules must be a list of module names, got 'mymod'"),
    ("cli transform started in the folder", _cli_transform_in_the_folder, CliFailed,
     r"^tabstream transform: FunctionResolutionError: .*refusing to import module 'h27_evilcli'.*"
     r"h27_evilcli\.py, which is in the workflow folder"),
    ("workflow.json nested 50000 deep", _deep_workflow, DataError,
     r"wf/workflow\.json: JSON nested 50000 levels deep; no saved workflow is nested more than 100 levels"),
    ("_manifest.json nested 100000 deep", _deep("_manifest.json", "[" * 100_000 + "]" * 100_000), DataError,
     r"out/_manifest\.json: JSON nested 100000 levels deep; no export manifest"),
    ("_schema.json nested 100000 deep", _deep("_schema.json", '{"a":' * 100_000 + "0" + "}" * 100_000),
     DataError, r"out/_schema\.json: JSON nested 100000 levels deep; no schema file"),
    ("fit after a Filter removed every row", _fit_after_filter_removes_everything, DataError,
     r"Categorify \(node \d+\) has no rows to fit on after Filter\(f='_none'\) \(node \d+\), which removed all "
     r"30 rows"),
    ("save into a folder of other files", _save_into_a_folder_of_other_files, FileExistsError,
     r"the folder holds model\.pt, which are not part of a saved workflow"),
]

"""Loading a workflow never runs code from where the data is (issue 27, item 1).

A saved workflow names its user functions as ``module:function``. A folder from
someone else may hold ``.py`` files beside ``workflow.json``, and a user may start
``python -c``, ``python -m`` or a notebook inside it (``''`` or the folder first on
``sys.path``). These tests start real interpreters there, with modules that leave
a marker file when imported, and check that the marker never appears, that the
error names the module, its file and the option that allows it, and that an
installed package's function still loads and transforms as pandas does (only
numpy, pandas and pyarrow.compute without the user's say-so: other installed
packages, imported or not, are refused unless named in allowed_modules).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import click.termui
import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.ops.functions import FunctionResolutionError

REPO = Path(ts.__file__).resolve().parents[1]

EVIL = """\
import pathlib
pathlib.Path({marker!r}).write_text("imported")


def double(s):
    return s * 2
"""


def _frame() -> pd.DataFrame:
    return pd.DataFrame({"x": np.linspace(-3.0, 3.0, 41) * 1.37, "label": np.arange(41) % 2})


def _save_round(folder: Path, rename: bool = False) -> pd.DataFrame:
    """A workflow of installed functions only: numpy's round, and with ``rename``
    click's unstyle (click is installed with dask, but not a trusted package)."""
    frame = _frame()
    node = ["x"] >> ops.LambdaOp(np.round)
    if rename:
        node = node >> ops.Rename(f=click.termui.unstyle)
    wf = ts.Workflow(node + ["label"])
    wf.fit(ts.Dataset(frame)).save(str(folder))
    frame.to_parquet(folder.parent / "raw.parquet", index=False)
    return frame


def _tamper(folder: Path, name: str) -> None:
    path = folder / "workflow.json"
    doc = json.loads(path.read_text())
    for node in doc["nodes"]:
        if node["kind"] == "op" and node["op"]["class"] == "LambdaOp":
            node["op"]["params"]["f"] = name
    path.write_text(json.dumps(doc))


def _evil(where: Path, module: str, marker: Path) -> Path:
    path = where / f"{module}.py"
    path.write_text(EVIL.format(marker=str(marker)))
    return path


def _python(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=180)


LOAD = """\
import sys, tabstream as ts
try:
    ts.Workflow.load({folder!r})
except Exception as exc:
    print(type(exc).__name__, exc, file=sys.stderr)
    sys.exit(3)
print("loaded")
"""


@pytest.fixture
def evil_folder(tmp_path):
    folder = tmp_path / "wf"
    _save_round(folder)
    _tamper(folder, "evilmod:double")
    marker = tmp_path / "marker"
    return folder, _evil(folder, "evilmod", marker), marker


def test_python_c_inside_the_folder_never_imports_from_it(evil_folder):
    folder, evil, marker = evil_folder
    proc = _python(["-c", LOAD.format(folder=".")], cwd=folder)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    err = proc.stderr
    assert err.startswith("FunctionResolutionError")
    assert "module 'evilmod'" in err and str(evil) in err and "in the workflow folder" in err
    assert "allowed_modules=['evilmod']" in err and "functions={'evilmod:double': f}" in err
    assert re.search(r"wf/workflow\.json: node \d+: LambdaOp: refusing to import module 'evilmod'", err)


def test_python_m_cli_inside_the_folder_never_imports_from_it(evil_folder, tmp_path):
    folder, evil, marker = evil_folder
    proc = _python(["-m", "tabstream.cli", "transform", ".", "../raw.parquet", "../out"], cwd=folder)
    assert proc.returncode != 0
    assert not marker.exists()
    assert not (tmp_path / "out").exists()
    assert "Traceback" not in proc.stderr
    assert str(evil) in proc.stderr and "allowed_modules=['evilmod']" in proc.stderr


def test_cli_allow_module_imports_a_module_the_user_trusts(evil_folder, tmp_path):
    """--allow-module is Workflow.load's allowed_modules on the command line."""
    folder, _, marker = evil_folder
    proc = _python(["-m", "tabstream.cli", "transform", ".", "../raw.parquet", "../out",
                    "--allow-module", "evilmod", "--quiet"], cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert marker.exists()
    got = pd.read_parquet(tmp_path / "out").sort_values("label", kind="stable")
    frame = pd.read_parquet(tmp_path / "raw.parquet")
    np.testing.assert_allclose(np.sort(got["x"].to_numpy()), np.sort(frame["x"].to_numpy() * 2))


def test_module_in_the_current_directory_is_not_imported(tmp_path):
    """The folder is elsewhere; the module lies in the directory the user started in."""
    folder = tmp_path / "wf"
    _save_round(folder)
    _tamper(folder, "evilmod:double")
    work = tmp_path / "work"
    work.mkdir()
    marker = tmp_path / "marker"
    evil = _evil(work, "evilmod", marker)
    proc = _python(["-c", LOAD.format(folder=str(folder))], cwd=work)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert str(evil) in proc.stderr and "in the current directory" in proc.stderr
    assert "allowed_modules=['evilmod']" in proc.stderr


def test_installed_functions_load_and_a_shadowing_file_is_never_imported(tmp_path):
    """numpy:round loads in a fresh interpreter started in the folder; click's
    unstyle (an installed package, but not a trusted one) is refused there, naming
    allowed_modules, while the folder holds a click.py shadowing the installed click
    that never runs; named in allowed_modules from elsewhere, the installed click
    loads and the output is pandas'."""
    folder = tmp_path / "wf"
    frame = _save_round(folder, rename=True)
    marker = tmp_path / "marker"
    _evil(folder, "click", marker)
    code = (
        "import sys, json, pandas as pd, tabstream as ts\n"
        "assert 'click' not in sys.modules\n"
        "try:\n"
        "    ts.Workflow.load('.')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__, exc, file=sys.stderr); sys.exit(3)\n"
    )
    proc = _python(["-c", code], cwd=folder)
    assert proc.returncode == 3, proc.stderr
    assert not marker.exists()
    assert re.search(r"Rename: refusing the function 'click\.termui:unstyle': module 'click' is an "
                     r"installed package .*allowed_modules=\['click'\]", proc.stderr), proc.stderr
    code = (
        "import sys, json, pandas as pd, tabstream as ts\n"
        f"wf = ts.Workflow.load({str(folder)!r}, allowed_modules=['click'])\n"
        "out = wf.transform(pd.read_parquet('raw.parquet'))\n"
        "print(json.dumps({'click': sys.modules['click'].__file__, 'x': out['x'].tolist(),\n"
        "                  'label': out['label'].tolist(), 'columns': list(out.columns)}))\n"
    )
    proc = _python(["-c", code], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert not marker.exists()
    got = json.loads(proc.stdout)
    assert Path(got["click"]).resolve() == Path(click.__file__).resolve()
    assert got["columns"] == ["x", "label"]
    np.testing.assert_array_equal(got["x"], frame["x"].round().to_numpy())
    assert got["label"] == frame["label"].tolist()


def test_allowed_modules_is_the_opt_in(evil_folder):
    """What a user who trusts the module does: name it; then it is imported (the
    marker appears) and its function runs."""
    folder, _, marker = evil_folder
    code = ("import json, pandas as pd, tabstream as ts\n"
            "wf = ts.Workflow.load('.', allowed_modules=['evilmod'])\n"
            "print(json.dumps(wf.transform(pd.read_parquet('../raw.parquet'))['x'].tolist()))\n")
    proc = _python(["-c", code], cwd=folder)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "imported"
    np.testing.assert_array_equal(json.loads(proc.stdout), (_frame()["x"] * 2).to_numpy())


def double(s):
    return s * 2


def test_passing_the_function_never_imports(evil_folder):
    folder, _, marker = evil_folder
    loaded = ts.Workflow.load(str(folder), functions={"evilmod:double": double})
    assert not marker.exists()
    pd.testing.assert_series_equal(loaded.transform(_frame())["x"], _frame()["x"] * 2)


def test_a_module_on_sys_path_outside_site_packages_is_refused(tmp_path, monkeypatch):
    """A folder on sys.path that is not site-packages (PYTHONPATH, a script's own
    folder) is not an installed package either."""
    folder = tmp_path / "wf"
    _save_round(folder)
    _tamper(folder, "tabstream_h27_notinstalled:double")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marker = tmp_path / "marker"
    evil = _evil(elsewhere, "tabstream_h27_notinstalled", marker)
    monkeypatch.syspath_prepend(str(elsewhere))
    with pytest.raises(FunctionResolutionError,
                       match=f"module 'tabstream_h27_notinstalled'.*{evil}.*not in an installed package"
                             r".*allowed_modules=\['tabstream_h27_notinstalled'\]"):
        ts.Workflow.load(str(folder))
    assert not marker.exists()
    assert "tabstream_h27_notinstalled" not in sys.modules


@pytest.mark.parametrize(("name", "message"), [
    ("tabstream.cli:main", "module 'tabstream.cli' is part of tabstream itself"),
    ("tabstream.ops.functions:resolve_function", "module 'tabstream.ops.functions' is part of tabstream itself"),
    ("logging.config:listen", "module 'logging' is part of the standard library.*allowed_modules"),
    ("pandas:read_csv", "module 'pandas.io.parsers.readers' may not be used"),
    # installed packages other than numpy, pandas and pyarrow.compute, even imported ones
    # (this test module imports click): their public functions include loaders of native
    # code, which a tampered name would hand a path the folder holds
    ("click.termui:unstyle", r"module 'click' is an installed package .*allowed_modules=\['click'\]"),
    ("pyarrow.parquet:read_table", "module 'pyarrow' is an installed package"),
    ("tensorflow.python.framework.load_library:load_library",
     "module 'tensorflow.python.framework.load_library' may not be used"),
    ("numpy.ctypeslib:load_library", "module 'numpy.ctypeslib' may not be used"),
])
def test_tabstream_itself_the_standard_library_and_file_readers_are_refused(tmp_path, name, message):
    folder = tmp_path / "wf"
    _save_round(folder)
    _tamper(folder, name)
    with pytest.raises(FunctionResolutionError, match=f"LambdaOp: refusing the function '{name}'.*{message}"):
        ts.Workflow.load(str(folder))


def test_saving_a_tabstream_function_is_refused(tmp_path):
    from tabstream.pipeline.workflow import _safe  # a str -> str function of tabstream's

    wf = ts.Workflow(["x"] >> ops.Rename(f=_safe)).fit(ts.Dataset(_frame()))
    with pytest.raises(FunctionResolutionError,
                       match="module 'tabstream.pipeline.workflow' is part of tabstream itself"):
        wf.save(str(tmp_path / "wf"))
    assert not (tmp_path / "wf").exists()


def test_allowed_modules_must_be_a_list_of_names(tmp_path):
    folder = tmp_path / "wf"
    _save_round(folder)
    with pytest.raises(TypeError, match="allowed_modules must be a list of module names, got 'evilmod'"):
        ts.Workflow.load(str(folder), allowed_modules="evilmod")
    with pytest.raises(TypeError, match=r"bad entries: \['evil mod'\]"):
        ts.Workflow.load(str(folder), allowed_modules=["evil mod"])


def test_tabstream_installed_as_a_package_still_loads_its_contract_functions(monkeypatch):
    """With tabstream in site-packages (a wheel, not this editable checkout) its two
    pure contract functions still resolve (the installed-package rule is not theirs:
    the own-package rule lets those two through and no other)."""
    from tabstream.ops import functions
    from tabstream.testing.op_contract import contract_double

    installed = str(REPO)  # the checkout's folder, taken for site-packages
    monkeypatch.setattr(functions, "_site_roots", lambda: (installed,))
    assert functions.resolve_function("tabstream.testing.op_contract:contract_double") is contract_double
    with pytest.raises(FunctionResolutionError, match="part of tabstream itself"):
        functions.resolve_function("tabstream.cli:main")
    # and another package under that folder is refused as installed (the rule is in force)
    with pytest.raises(FunctionResolutionError, match="module 'tests' is an installed package"):
        functions.resolve_function("tests.pipeline.test_untrusted_folders:double")


def test_an_allowed_module_is_found_in_the_current_directory_without_it_on_sys_path(evil_folder,
                                                                                   tmp_path):
    """``python -P`` (as a console script such as ``tabstream``) does not put the
    current directory on ``sys.path``; a module the user names in allowed_modules is
    still found there, as documented, and only that one."""
    folder, _, marker = evil_folder
    code = ("import json, sys, pandas as pd, tabstream as ts\n"
            "import os\n"
            "assert os.getcwd() not in [os.path.abspath(p) for p in sys.path if p], sys.path\n"
            "wf = ts.Workflow.load('.', allowed_modules=['evilmod'])\n"
            "print(json.dumps(wf.transform(pd.read_parquet('../raw.parquet'))['x'].tolist()))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # no empty entry (it would mean the cwd)
    proc = subprocess.run([sys.executable, "-P", "-c", code], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert marker.read_text() == "imported"
    np.testing.assert_array_equal(json.loads(proc.stdout), (_frame()["x"] * 2).to_numpy())

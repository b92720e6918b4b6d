"""Writes that find no room or no permission, for the export and Categorify's spills:
an error naming the folder and the setting that moves the writes (``output_path``,
``spill_dir``), and no temporary file left behind. Real faults in subprocesses: a
file-size limit (writes fail with EFBIG, as on a full disk) and a folder the process
may not write (chmod; as root, which chmod does not stop, the process drops to
``nobody`` first). The spills of a killed fit are removed by the next spill into the
same folder."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.operators import StatOperator
from tabstream.core.scratch import owner_tag

ROOT = Path(__file__).resolve().parents[2]
SPILL = re.compile(r"tabstream-categorify-.*\.arrow")


def _python(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(PRELUDE + script), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run(script: str, *args: str) -> dict:
    proc = _python(script, *args)
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


PRELUDE = """
    import json, os, resource, signal, sys
    import numpy as np, pandas as pd
    import tabstream as ts
    from tabstream import ops
    from tabstream.core.errors import ExportError

    def full_disk(limit):
        # writes past `limit` bytes fail with EFBIG, as on a full disk (without the
        # signal ignored the process would be killed instead)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    def unprivileged():
        if os.geteuid() == 0:  # root writes into any folder: be nobody from here on
            os.setgid(65534)
            os.setuid(65534)

    def frame(n=200_000):
        rng = np.random.default_rng(0)
        return pd.DataFrame({"c": rng.integers(0, 10**9, n), "y": rng.random(n)})
"""


@pytest.fixture
def read_only(tmp_path):
    """A folder the subprocesses may not write: chmod 555 (as root: a root-owned 755
    folder, traversable by ``nobody``, whom the subprocess becomes)."""
    if os.geteuid() == 0:
        base = Path(tempfile.mkdtemp(prefix="tabstream-ro-"))
        base.chmod(0o755)
        folder = base / "ro"
        folder.mkdir(mode=0o755)
        yield folder
        shutil.rmtree(base)
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)


# -- export ---------------------------------------------------------------------
EXPORT = """
    out, mode = sys.argv[1], sys.argv[2]
    ds = ts.Dataset(frame(), part_size="300KB")
    ds.to_parquet(sys.argv[3], num_files=2)  # every module imported before the fault
    full_disk(64 * 1024) if mode == "full" else unprivileged()
    try:
        ds.to_parquet(out, num_files=4)
        print(json.dumps({"error": None}))
    except ExportError as exc:
        print(json.dumps({"error": str(exc), "hint": exc.hint}))
"""


def test_export_to_a_full_disk_names_the_folder_and_output_path(tmp_path):
    exports = tmp_path / "exports"
    exports.mkdir()
    result = _run(EXPORT, str(exports / "out"), "full", str(tmp_path / "warm"))
    assert result["error"] is not None
    assert re.fullmatch(
        rf"export to '{exports}/out' failed, nothing was written: the filesystem of '{exports}' is full "
        r"\(\[Errno 27\] File too large\): free space there, or give output_path a folder on another disk",
        result["error"]), result["error"]
    assert "output_path" in result["hint"]
    assert os.listdir(exports) == [], "no temporary folder left behind"


def test_export_to_a_read_only_folder_names_the_folder_and_output_path(tmp_path, read_only):
    result = _run(EXPORT, str(read_only / "out"), "read-only", str(tmp_path / "warm"))
    assert result["error"] is not None
    assert re.fullmatch(
        rf"export to '{read_only}/out' failed, nothing was written: '{read_only}' cannot be written "
        r"\(\[Errno 13\] Permission denied: .*\): make it writable, or give output_path a folder you may write",
        result["error"]), result["error"]
    assert os.listdir(read_only) == []


# -- Categorify spills ------------------------------------------------------------
FIT = """
    spill_dir, mode = sys.argv[1], sys.argv[2]
    ds = ts.Dataset(frame(), part_size="200KB")
    warm = ts.Workflow(["c"] >> ops.Categorify(spill_rows=2000, spill_dir=sys.argv[3]))
    warm.fit(ds)  # every module imported before the fault
    wf = ts.Workflow(["c"] >> ops.Categorify(spill_rows=2000, spill_dir=spill_dir))
    full_disk(int(mode)) if mode.isdigit() else unprivileged()
    try:
        wf.fit(ds)
        print(json.dumps({"error": None}))
    except OSError as exc:
        print(json.dumps({"error": str(exc), "errno": exc.errno, "type": type(exc).__name__}))
"""


@pytest.mark.parametrize("limit", [40_000, 180_000])  # spills take 140-220 kB: all fail, or some
def test_spill_to_a_full_disk_names_spill_dir_and_leaves_no_spill(tmp_path, limit):
    spills = tmp_path / "spills"
    result = _run(FIT, str(spills), str(limit), str(tmp_path / "warm"))
    assert result["type"] == "OSError" and result["errno"] == 27
    assert re.fullmatch(
        r"\[Errno 27\] Categorify: a spill of partial counts \(more than spill_rows=2000 distinct values\) "
        rf"failed, the filesystem of '{spills}' is full \(\[Errno 27\] File too large\): free space there, "
        rf"or give spill_dir a folder on another disk \(now spill_dir='{spills}'\); or raise spill_rows to "
        r"spill less", result["error"]), result["error"]
    assert os.listdir(spills) == [], "no spill file left behind"


def test_spill_to_a_read_only_folder_names_spill_dir(tmp_path, read_only):
    result = _run(FIT, str(read_only), "read-only", str(tmp_path / "warm"))
    assert result["errno"] == 13
    assert re.fullmatch(
        r"\[Errno 13\] Categorify: a spill of partial counts \(more than spill_rows=2000 distinct values\) "
        rf"failed, '{read_only}' cannot be written \(\[Errno 13\] Permission denied: .*\): make it "
        rf"writable, or give spill_dir a folder you may write \(now spill_dir='{read_only}'\); or raise "
        r"spill_rows to spill less", result["error"]), result["error"]
    assert os.listdir(read_only) == []


# -- leftovers of a killed fit ------------------------------------------------------
KILLED_FIT = """
    import time
    from tabstream.ops.categorify import Categorify

    def blocked(self, name, counts):  # the partials are spilled; stop before the merge
        print("ready", flush=True)
        time.sleep(600)

    Categorify._merge_spilled = blocked
    ds = ts.Dataset(frame(50_000), part_size="100KB")
    ts.Workflow(["c"] >> ops.Categorify(spill_rows=2000, spill_dir=sys.argv[1])).fit(ds)
"""


def test_next_fit_removes_the_spills_of_a_killed_one(tmp_path):
    spills = tmp_path / "spills"
    proc = _python(KILLED_FIT, str(spills))
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else "(no output in 120 s)"
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the fit did not start: {line!r} {proc.stderr.read()}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    killed = sorted(os.listdir(spills))
    assert killed and all(re.fullmatch(rf"tabstream-categorify-[0-9a-f]{{8}}-{proc.pid}-s\d+-[0-9a-f]{{32}}"
                                       r"\.arrow", n) for n in killed), killed

    host, pid, start = owner_tag().split("-")
    others = {
        f"tabstream-categorify-{host}-{pid}-{start}-{'a' * 32}.arrow": True,      # alive (this process)
        f"tabstream-categorify-{host}-{pid}-s1-{'b' * 32}.arrow": False,          # pid reused since
        f"tabstream-categorify-00000000-{pid}-s1-{'c' * 32}.arrow": True,         # another host, fresh
        f"tabstream-categorify-{'d' * 32}.arrow": True,                           # unowned, fresh
        f"tabstream-categorify-{'e' * 32}.arrow": False,                          # unowned, two days old
        "notes.arrow": True,                                                      # not a spill
    }
    for name in others:
        (spills / name).write_bytes(b"x")
    old = time.time() - 2 * 86400
    os.utime(spills / f"tabstream-categorify-{'e' * 32}.arrow", (old, old))

    frame = pd.DataFrame({"c": np.random.default_rng(1).integers(0, 10**9, 30_000)})
    wf = ts.Workflow(["c"] >> ops.Categorify(spill_rows=2000, spill_dir=str(spills)))
    wf.fit(ts.Dataset(frame, part_size="60KB"))
    assert sorted(os.listdir(spills)) == sorted(n for n, kept in others.items() if kept)
    # the fit itself is whole: every value of the input has an id
    encoded = wf.transform(frame)["c"].to_numpy()
    assert len(np.unique(encoded)) == frame["c"].nunique() and encoded.min() >= 3


class _FailsAtFinalize(StatOperator):
    """A statistics op whose fit fails after every partial is in (another op's
    spills are written by then)."""

    def fit_partition(self, table):
        return table.num_rows

    def combine(self, partials):
        return sum(partials)

    def finalize(self, partial):
        raise RuntimeError(f"finalize failed after {partial} rows")

    def get_state(self):
        return {}, {}

    def set_state(self, values, tables):
        self.fitted = True

    def transform(self, table):
        return table


@pytest.mark.parametrize("order", ["failing op first", "Categorify first"])
def test_a_fit_that_fails_for_another_reason_removes_its_spills(tmp_path, order):
    # Categorify spills past spill_rows; the other op of the same fit level fails:
    # nothing will read the spills, so the failed fit removes them (not only at exit)
    spills = tmp_path / "spills"
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"c": [f"v{i}" for i in rng.integers(0, 50_000, 40_000)], "x": np.arange(40_000)})
    cat = ["c"] >> ops.Categorify(spill_rows=2000, spill_dir=str(spills))
    boom = ["x"] >> _FailsAtFinalize()
    wf = ts.Workflow(boom + cat if order == "failing op first" else cat + boom)
    with pytest.raises(RuntimeError, match="finalize failed after 40000 rows"):
        wf.fit(ts.Dataset(df, npartitions=8))
    assert os.listdir(spills) == [], "the failed fit's spills are removed"

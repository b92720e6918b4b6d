"""Workflow.save is atomic on a local disk (issue 27, item 2): a saver killed at
any point leaves the previous save loadable, two processes saving to one path
leave exactly one of their workflows (never a mix that loads), and the hidden
folders of killed savers are removed by the next save. Real subprocesses, killed
with SIGKILL at known points."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
import tabstream.pipeline.workflow as workflow_module

REPO = Path(ts.__file__).resolve().parents[1]

BUILD = """
import tabstream as ts


def build(which):
    from tabstream import ops
    if which == "A":
        return ts.Workflow((["c"] >> ops.Categorify()) + (["v"] >> ops.Normalize()))
    return ts.Workflow((["c"] >> ops.Categorify(max_size=4)) + (["v"] >> ops.FillMedian() >> ops.Normalize()))
"""
namespace: dict = {}
exec(BUILD, namespace)  # the same workflows in this process and in the savers
build = namespace["build"]

SAVER = BUILD + """
import os, signal, sys, time
import pandas as pd
import tabstream.pipeline.workflow as W

frame = pd.read_parquet(sys.argv[1])
which, path, mode, n = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
wf = build(which).fit(ts.Dataset(frame))

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

if mode == "kill-writing":  # after the first stats file of the new save
    real = W.pq.write_table
    def write_then_die(table, where, **kwargs):
        real(table, where, **kwargs)
        die()
    W.pq.write_table = write_then_die
elif mode == "kill-swapped":  # the new save is in place, the previous one not yet removed
    W.shutil.rmtree = die
elif mode.startswith("race"):
    if mode == "race-plain":  # as where renameat2 is missing: two renames
        W._renameat2 = lambda: None
    go = sys.argv[6]
    while not os.path.exists(go):
        time.sleep(0.005)
for _ in range(n):
    wf.save(path)
print("done")
"""


def frame() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    v = rng.normal(size=300)
    v[::7] = np.nan
    return pd.DataFrame({"c": np.array(list("abcdefg"), dtype=object)[rng.integers(0, 7, 300)], "v": v})


@pytest.fixture
def raw(tmp_path):
    df = frame()
    df["c"] = df["c"].astype("str")
    path = tmp_path / "raw.parquet"
    df.to_parquet(path, index=False)
    return pd.read_parquet(path), path


def expected(which: str, df: pd.DataFrame) -> pd.DataFrame:
    return build(which).fit(ts.Dataset(df)).transform(df)


def saver(raw_path: Path, which: str, path: Path, mode: str, n: int = 1, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", SAVER, str(raw_path), which, str(path), mode, str(n), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(".wf."))


@pytest.mark.parametrize("mode", ["kill-writing", "kill-swapped"])
def test_a_killed_saver_leaves_a_whole_save_and_its_folder_is_removed_next_time(raw, tmp_path, mode):
    df, raw_path = raw
    path = tmp_path / "wf"
    build("A").fit(ts.Dataset(df)).save(str(path))
    proc = saver(raw_path, "B", path, mode)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == -signal.SIGKILL, err
    left = leftovers(tmp_path)
    assert len(left) == 1 and re.fullmatch(rf"\.wf\.tmp-[0-9a-f]{{8}}-{proc.pid}(-s[0-9]+)?-[0-9a-f]{{12}}", left[0])
    # killed while writing: the previous save; killed after the swap: the new one, whole
    which = "A" if mode == "kill-writing" else "B"
    pd.testing.assert_frame_equal(ts.Workflow.load(str(path)).transform(df), expected(which, df))
    # the next save removes the dead saver's folder
    build("B").fit(ts.Dataset(df)).save(str(path))
    assert leftovers(tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == ["raw.parquet", "wf"]
    pd.testing.assert_frame_equal(ts.Workflow.load(str(path)).transform(df), expected("B", df))


@pytest.mark.parametrize("mode", ["race", "race-plain"])
def test_two_savers_leave_exactly_one_workflow(raw, tmp_path, mode):
    df, raw_path = raw
    path = tmp_path / "wf"
    go = tmp_path / "go"
    want = {w: expected(w, df) for w in "AB"}
    procs = [saver(raw_path, w, path, mode, 12, str(go)) for w in "AB"]
    time.sleep(0.5)
    go.write_text("")
    seen = set()
    while any(p.poll() is None for p in procs):  # loads during the race: one or the other, whole
        try:
            got = ts.Workflow.load(str(path)).transform(df)
        except (FileNotFoundError, ts.DataError):
            continue  # between saves, or a stats file swapped away under the reader: an error, not a mix
        matches = [w for w in "AB" if got.equals(want[w])]
        assert len(matches) == 1, got
        seen.add(matches[0])
    for p in procs:
        out, err = p.communicate(timeout=180)
        assert p.returncode == 0 and out.strip() == "done", err
    final = ts.Workflow.load(str(path)).transform(df)
    assert sum(final.equals(want[w]) for w in "AB") == 1
    assert leftovers(tmp_path) == []
    assert sorted(os.listdir(path)) == ["stats", "workflow.json"]
    assert seen  # the reader saw at least one whole save


def test_a_folder_holding_other_files_is_refused(raw, tmp_path):
    df, _ = raw
    path = tmp_path / "wf"
    path.mkdir()
    (path / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match=r"cannot save the workflow to '.*wf': the folder holds notes\.txt, "
                                              r"which are not part of a saved workflow.*new or empty folder"):
        build("A").fit(ts.Dataset(df)).save(str(path))
    assert os.listdir(path) == ["notes.txt"]
    assert leftovers(tmp_path) == []
    (path / "notes.txt").unlink()  # an empty folder is fine
    build("A").fit(ts.Dataset(df)).save(str(path))
    pd.testing.assert_frame_equal(ts.Workflow.load(str(path)).transform(df), expected("A", df))


def test_without_renameat2_the_save_is_two_renames(raw, tmp_path, monkeypatch):
    df, _ = raw
    monkeypatch.setattr(workflow_module, "_renameat2", lambda: None)
    path = tmp_path / "wf"
    build("A").fit(ts.Dataset(df)).save(str(path))
    build("B").fit(ts.Dataset(df)).save(str(path))
    assert leftovers(tmp_path) == []
    pd.testing.assert_frame_equal(ts.Workflow.load(str(path)).transform(df), expected("B", df))

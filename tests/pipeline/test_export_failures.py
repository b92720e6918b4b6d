"""Exports that fail: real faults (a file-size limit, a kill -9) in subprocesses.

A failed export closes every file it opened and leaves no folder behind; the
hidden folder of a killed export is removed by the next export to the same place,
but never the folder of an export that is still running; an export of zero rows
is refused.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import ExportError

ROOT = Path(__file__).resolve().parents[2]


def _python(script: str, *args: str, **popen: object) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _open_paths_under(folder: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"row_id": np.arange(n), "x": rng.integers(0, 2**62, n), "y": rng.random(n)})


def _read_back(folder: Path) -> pd.DataFrame:
    with open(folder / "_manifest.json") as f:
        manifest = json.load(f)
    frames = [pq.read_table(folder / entry["path"]).to_pandas() for entry in manifest["files"]]
    return pd.concat(frames, ignore_index=True).sort_values("row_id").reset_index(drop=True)


# -- disk full ------------------------------------------------------------------
DISK_FULL = """
    import json, os, resource, signal, sys
    import numpy as np, pandas as pd
    import tabstream as ts
    from tabstream.core.errors import ExportError

    out, limit = sys.argv[1], int(sys.argv[2])
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"x": rng.integers(0, 2**62, 200_000), "y": rng.random(200_000)})
    ds = ts.Dataset(df, part_size="300KB")
    # Writes past `limit` bytes fail with EFBIG, as on a full disk (without the
    # signal the process would be killed instead).
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    result = {"error": None, "open": []}
    try:
        ds.to_parquet(out, num_files=4)
    except ExportError as exc:
        # Checked while the error is still held, as a notebook holds the last one.
        result["error"] = str(exc)
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(os.path.dirname(out)):
                result["open"].append(target)
    print(json.dumps(result))
"""


@pytest.mark.parametrize("limit", [64 * 1024, 700 * 1024])
def test_disk_full_closes_every_file_and_leaves_nothing(tmp_path, limit):
    exports = tmp_path / "exports"
    exports.mkdir()
    proc = _python(DISK_FULL, str(exports / "out"), str(limit))
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    result = json.loads(stdout.strip().splitlines()[-1])
    assert result["error"] is not None, "the export should have hit the size limit"
    assert "File too large" in result["error"]
    assert result["open"] == [], "files of the failed export are still open"
    assert os.listdir(exports) == [], "a failed export leaves no folder, hidden or not"


def test_failure_waits_for_running_siblings_before_cleaning_up(tmp_path, monkeypatch):
    """One task fails while another has a file open: when the error reaches the
    caller nothing is open any more and nothing is left on disk."""
    import dask

    import tabstream.pipeline.export as export_mod

    original = export_mod._Plan.read
    opened = threading.Event()

    def read(self, piece_index):
        if piece_index == 0:  # group 0 fails once group 1 holds its file open
            opened.wait(10)
            raise RuntimeError("bad partition 0")
        if piece_index == 3:  # group 1 has written piece 2, so its file is open
            opened.set()
            time.sleep(0.5)
        return original(self, piece_index)

    monkeypatch.setattr(export_mod._Plan, "read", read)
    df = _frame(4000)
    ds = ts.Dataset(df, part_size=df.memory_usage().sum() // 4 + 1)
    assert ds.npartitions == 4
    exports = tmp_path / "exports"
    exports.mkdir()
    with dask.config.set(num_workers=2), pytest.raises(ExportError, match="bad partition 0"):
        ds.to_parquet(str(exports / "out"), num_files=2)
    assert _open_paths_under(exports) == []
    time.sleep(0.7)  # were a sibling still running, it would write now
    assert os.listdir(exports) == []


def test_a_filter_retry_waits_for_the_first_pass_before_clearing(tmp_path, monkeypatch):
    """A Filter changes the row count: the first pass stops at the first piece whose
    rows differ from the plan, and the export counts again and writes again into a
    cleared folder. A sibling of that first pass still writing its file must end
    before the folder is cleared (else its file lands in the second pass's folder,
    or the clearing fails on it: "Directory not empty")."""
    import dask

    import tabstream.pipeline.export as export_mod

    events: list[str] = []
    original_read, original_close = export_mod._Plan.read, export_mod._FileWriter.close
    original_clear = export_mod._clear_written
    slowed: set[int] = set()

    def read(self, piece_index):
        if piece_index == 2 and piece_index not in slowed:  # group 1, first pass
            slowed.add(piece_index)
            time.sleep(0.5)
        return original_read(self, piece_index)

    def close(self):
        events.append(f"close {self.name}")
        return original_close(self)

    def clear(*args):
        events.append("clear")
        return original_clear(*args)

    monkeypatch.setattr(export_mod._Plan, "read", read)
    monkeypatch.setattr(export_mod._FileWriter, "close", close)
    monkeypatch.setattr(export_mod, "_clear_written", clear)
    df = _frame(4000)
    ds = ts.Dataset(df, part_size=df.memory_usage().sum() // 4 + 1)
    assert ds.npartitions == 4
    keep = df["row_id"] >= 100  # drops rows of piece 0 only
    wf = ts.Workflow(["row_id", "y"] >> ops.Filter(lambda f: f["row_id"] >= 100))
    with dask.config.set(num_workers=2):
        wf.fit(ds)
        wf.transform(ds).to_parquet(str(tmp_path / "out"), num_files=2)
    assert "clear" in events
    first_pass = events[:events.index("clear")]
    assert "close part_00001.parquet" in first_pass, events
    got = pd.read_parquet(tmp_path / "out").sort_values("row_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, df.loc[keep, ["row_id", "y"]].reset_index(drop=True), check_dtype=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# -- killed exports -------------------------------------------------------------
BLOCKED = """
    import sys, time
    import numpy as np, pandas as pd
    import tabstream as ts
    import tabstream.pipeline.export_folder as export_folder

    def blocked(*args, **kwargs):  # everything is written; stop just before the rename
        print("ready", flush=True)
        time.sleep(600)

    export_folder.publish = blocked
    df = pd.DataFrame({"row_id": np.arange(5000), "y": np.random.default_rng(1).random(5000)})
    ts.Dataset(df, part_size="40KB").to_parquet(sys.argv[1], num_files=3)
"""


def _start_blocked_export(out: Path) -> subprocess.Popen:
    proc = _python(BLOCKED, str(out))
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else "(no output in 120 s)"
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the export did not start: {line!r} {proc.stderr.read()}")
    return proc


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_next_export_removes_the_folder_of_a_killed_one(tmp_path):
    out = tmp_path / "out"
    proc = _start_blocked_export(out)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    leftovers = _hidden(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".out.tmp-")
    assert any(name.endswith(".parquet") for name in os.listdir(tmp_path / leftovers[0]))
    assert not out.exists()

    df = _frame(300, seed=2)
    ts.Dataset(df).to_parquet(str(out))
    assert _hidden(tmp_path) == [], "the killed export's folder is gone"
    pd.testing.assert_frame_equal(_read_back(out), df, check_dtype=False)


BLOCKED_GROUPBY = """
    import sys, time
    import numpy as np, pandas as pd
    import tabstream as ts
    from tabstream import ops
    import tabstream.pipeline.export as export_mod

    def blocked(*args, **kwargs):  # the groupby spill is written; stop before the export
        print("ready", flush=True)
        time.sleep(600)

    export_mod.export = blocked
    df = pd.DataFrame({"s": np.arange(4000) % 50, "i": np.arange(4000)})
    ds = ts.Dataset(df, part_size="8KB")
    wf = ts.Workflow(["s", "i"] >> ops.Groupby(groupby_cols=["s"], aggs={"i": ["sum"]}))
    wf.fit(ds)
    wf.transform(ds).to_parquet(sys.argv[1])
"""


def test_next_export_removes_the_spill_folder_of_a_killed_groupby_export(tmp_path):
    # Before: the spill folder was named .out.groupby-<id>, which no export removed.
    out = tmp_path / "out"
    proc = _python(BLOCKED_GROUPBY, str(out))
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else "(no output in 120 s)"
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the groupby export did not start: {line!r} {proc.stderr.read()}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    leftovers = _hidden(tmp_path)
    assert len(leftovers) == 1 and leftovers[0].startswith(".out.tmp-")
    assert any(f.endswith(".parquet") for _, _, files in os.walk(tmp_path / leftovers[0]) for f in files)

    df = _frame(300, seed=3)
    ts.Dataset(df).to_parquet(str(out))
    assert _hidden(tmp_path) == [], "the killed groupby export's spill folder is gone"
    pd.testing.assert_frame_equal(_read_back(out), df, check_dtype=False)


def test_folder_of_a_running_export_is_kept(tmp_path):
    out = tmp_path / "out"
    proc = _start_blocked_export(out)
    try:
        running = _hidden(tmp_path)
        assert len(running) == 1
        ts.Dataset(_frame(100)).to_parquet(str(out))
        assert _hidden(tmp_path) == running, "another process's export is still running"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    ts.Dataset(_frame(100)).to_parquet(str(out), overwrite=True)
    assert _hidden(tmp_path) == []


@pytest.mark.parametrize(("name", "age_days", "removed"), [
    (".out.tmp-00000000-123-0123456789ab", 2, True),   # another host, two days old
    (".out.tmp-00000000-123-0123456789ab", 0, False),  # another host, fresh: may be running
    (".out.tmp-0123456789ab", 2, True),                # naming of older versions, old
    (".out.tmp-0123456789ab", 0, False),
    (".other.tmp-0123456789ab", 2, False),             # another export's folder
    (".out.tmp-mine", 2, False),                       # not named as exports name them
    (".out.old-00000000-123-0123456789ab", 2, True),   # a replaced export, the new one in place
])
def test_only_stale_export_folders_are_removed(tmp_path, name, age_days, removed):
    out = tmp_path / "out"
    ts.Dataset(_frame(50)).to_parquet(str(out))
    leftover = tmp_path / name
    (leftover / "sub").mkdir(parents=True)
    (leftover / "sub" / "part_00000.parquet").write_bytes(b"x")
    then = time.time() - age_days * 86400 - 60
    os.utime(leftover, (then, then))
    ts.Dataset(_frame(50)).to_parquet(str(out), overwrite=True)
    assert leftover.exists() is not removed


# -- zero rows ------------------------------------------------------------------
def _empty_csv(tmp_path: Path) -> ts.Dataset:
    path = tmp_path / "empty.tsv"
    path.write_bytes(b"")
    return ts.Dataset(str(path), names=["a", "b"], dtypes={"a": "int64"}, sep="\t")


def test_zero_row_export_is_refused(tmp_path):
    ds = _empty_csv(tmp_path)
    assert ds.num_rows == 0
    with pytest.raises(ExportError, match=r"export to '.*out' refused: Dataset\('.*empty\.tsv'.*has no rows"
                                          r".*nothing was written") as info:
        ds.to_parquet(str(tmp_path / "out"))
    assert "empty file" in info.value.hint
    assert sorted(os.listdir(tmp_path)) == ["empty.tsv"]


def test_zero_rows_after_the_workflow_is_refused(tmp_path):
    df = _frame(200)
    wf = ts.Workflow(["row_id", "x", "y"] >> ops.Filter(lambda frame: frame["row_id"] < 0))
    ds = ts.Dataset(df)
    wf.fit(ds)
    assert len(wf.transform(df)) == 0
    with pytest.raises(ExportError, match=r"has no rows after the workflow"):
        wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []


def test_failed_overwrite_keeps_the_previous_export(tmp_path, monkeypatch):
    out = tmp_path / "out"
    first = _frame(120, seed=1)
    ts.Dataset(first).to_parquet(str(out))
    original = os.rename

    def rename(src, dst, *args, **kwargs):
        if ".tmp-" in str(src) and not os.path.lexists(dst):  # the new export's rename in fails
            raise OSError("rename refused")
        return original(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(ExportError, match="rename refused"):
        ts.Dataset(_frame(80, seed=2)).to_parquet(str(out), overwrite=True)
    monkeypatch.undo()
    assert _hidden(tmp_path) == []
    pd.testing.assert_frame_equal(_read_back(out), first, check_dtype=False)

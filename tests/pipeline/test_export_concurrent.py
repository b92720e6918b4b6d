"""Two exports to one path at once, in real processes (and threads): with
``overwrite=False`` exactly one succeeds and the other gets FileExistsError; with
``overwrite=True`` both succeed and one of them is in place, whole. Never one export
inside the other, never a hidden temporary folder left behind."""

from __future__ import annotations

import json
import os
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

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
    import json, os, sys, time
    import numpy as np, pandas as pd
    import tabstream as ts

    out, go, writer, overwrite, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5] == "1"

    def wait_for_go():
        open(f"{go}.ready{writer}", "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(f"{go}{writer}") and time.monotonic() < deadline:
            time.sleep(0.0005)

    if hold:  # the export is written, past every check, held at its rename into place
        rename = os.rename

        def held(src, dst, *args, **kwargs):
            if ".out.tmp-" in str(src) and str(dst) == out:
                wait_for_go()
            return rename(src, dst, *args, **kwargs)

        os.rename = held
    df = pd.DataFrame({"row_id": np.arange(3000 + 1000 * writer), "writer": writer})
    ds = ts.Dataset(df, part_size="16KB")
    if not hold:
        wait_for_go()
    try:
        result = ds.to_parquet(out, num_files=3, overwrite=overwrite)
        print(json.dumps({"ok": True, "rows": result.num_rows}))
    except FileExistsError as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
"""


def _start(out: Path, go: Path, writer: int, overwrite: bool, hold: bool) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(out), str(go), str(writer),
                             str(int(overwrite)), str(int(hold))],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _check_one_whole_export(folder: Path) -> int:
    """The folder is exactly one complete export: returns its writer."""
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".")], "hidden leftovers"
    entries = sorted(p.name for p in folder.iterdir())
    assert all(not (folder / e).is_dir() for e in entries), f"a folder inside the export: {entries}"
    manifest = json.loads((folder / "_manifest.json").read_text())
    assert entries == sorted([*(f["path"] for f in manifest["files"]), "_manifest.json", "_metadata",
                              "_schema.json"])
    frame = pd.concat([pq.read_table(folder / f["path"]).to_pandas() for f in manifest["files"]])
    writers = frame["writer"].unique()
    assert len(writers) == 1, f"rows of several exports: {writers}"
    writer = int(writers[0])
    expected = pd.DataFrame({"row_id": np.arange(3000 + 1000 * writer), "writer": writer})
    assert manifest["num_rows"] == len(expected)
    assert [f["num_rows"] for f in manifest["files"]] == [
        len(pq.read_table(folder / f["path"])) for f in manifest["files"]]
    pd.testing.assert_frame_equal(frame.sort_values("row_id").reset_index(drop=True), expected,
                                  check_dtype=False)
    return writer


@pytest.mark.parametrize("release", ["together", "in-turn", "from-the-start"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_two_processes_export_to_one_path(tmp_path, overwrite, release):
    """``together``: both held at their rename into place, let go at once; ``in-turn``:
    writer 1 renames while writer 2 waits past every check, then writer 2 renames;
    ``from-the-start``: both start exporting at once."""
    out, go = tmp_path / "out", tmp_path / "go"
    procs = [_start(out, go, w, overwrite, release != "from-the-start") for w in (1, 2)]
    try:
        deadline = time.monotonic() + 120
        while not all(Path(f"{go}.ready{w}").exists() for w in (1, 2)):
            assert time.monotonic() < deadline, "the writers did not get ready"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
            time.sleep(0.01)
        for w in (1, 2):
            os.remove(f"{go}.ready{w}")
        if release == "in-turn":
            Path(f"{go}1").touch()
            results = [_result(procs[0])]
            Path(f"{go}2").touch()
            results.append(_result(procs[1]))
        else:
            for w in (1, 2):
                Path(f"{go}{w}").touch()
            results = [_result(p) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for w in (1, 2):
        Path(f"{go}{w}").unlink()
    writer = _check_one_whole_export(out)
    if overwrite:
        assert [r["ok"] for r in results] == [True, True]
        if release == "in-turn":
            assert writer == 2, "the last writer wins"
    else:
        assert sorted(r["ok"] for r in results) == [False, True]
        loser = next(r for r in results if not r["ok"])
        assert loser["error"] == "FileExistsError"
        assert f"'{out}'" in loser["message"] and "overwrite=True" in loser["message"]
        assert results[writer - 1]["ok"], "the export in place is the one that succeeded"
        assert results[writer - 1]["rows"] == 3000 + 1000 * writer
        if release == "in-turn":
            assert writer == 1, "the first writer wins"


def test_two_threads_export_to_one_path(tmp_path):
    out = tmp_path / "out"
    barrier = threading.Barrier(2)
    outcome: dict[int, object] = {}

    def run(writer: int) -> None:
        df = pd.DataFrame({"row_id": np.arange(3000 + 1000 * writer), "writer": writer})
        ds = ts.Dataset(df, part_size="16KB")
        barrier.wait()
        try:
            outcome[writer] = ds.to_parquet(str(out), num_files=3).num_rows
        except FileExistsError as exc:
            outcome[writer] = exc

    threads = [threading.Thread(target=run, args=(w,)) for w in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    writer = _check_one_whole_export(out)
    assert outcome[writer] == 3000 + 1000 * writer
    assert isinstance(outcome[3 - writer], FileExistsError)

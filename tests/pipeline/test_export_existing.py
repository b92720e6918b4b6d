"""Exports into an existing folder that holds other files (NVTabular writes into
such a folder; so does tabstream, safely): the user's files stay byte for byte and
are never read as the export's data; a previous export needs ``overwrite=True``; a
name of the export already taken by a user's file is refused; a kill -9 between the
moves leaves a folder readers refuse, and the next export into it undoes the
interrupted one; of two exports into one folder at once exactly one succeeds.
Real subprocesses for the kills and the races."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.core.scratch import _host, process_start

ROOT = Path(__file__).resolve().parents[2]


def _frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"row_id": np.arange(n), "x": rng.integers(0, 2**40, n), "y": rng.random(n)})


def _user_folder(folder: Path) -> dict[str, bytes]:
    """A folder of a user's own files (a parquet file of other columns, a CSV, notes, a
    subfolder of parquet, a hidden file); returns every file's bytes."""
    (folder / "raw").mkdir(parents=True)
    pd.DataFrame({"other": [7, 8, 9]}).to_parquet(folder / "mine.parquet")
    pd.DataFrame({"row_id": [1, 2], "x": [5, 6], "y": [0.5, 0.25]}).to_parquet(folder / "raw" / "day1.parquet")
    (folder / "notes.csv").write_text("a,b\n1,2\n")
    (folder / "README.txt").write_text("my data\n")
    (folder / ".hidden").write_text("x")
    return _files(folder)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _ours(folder: Path) -> dict[str, bytes]:
    manifest = json.loads((folder / "_manifest.json").read_text())
    return {e["path"]: e["num_rows"] for e in manifest["files"]}


def _read(ds: ts.Dataset) -> pd.DataFrame:
    frame = ds.to_ddf().compute()
    return frame.sort_values("row_id").reset_index(drop=True)


def _same(got: pd.DataFrame, df: pd.DataFrame) -> None:
    pd.testing.assert_frame_equal(got.sort_values("row_id").reset_index(drop=True),
                                  df.reset_index(drop=True), check_dtype=False)


def _no_scratch(folder: Path) -> None:
    """No lock, journal, temporary folder or draft left in the folder or beside it."""
    inside = [p.name for p in folder.iterdir() if p.name.startswith(".tabstream")]
    beside = [p.name for p in folder.parent.iterdir() if p.name.startswith(".")]
    assert inside == [] and beside == [], (inside, beside)


def test_export_into_a_folder_of_other_files(tmp_path):
    out = tmp_path / "data"
    before = _user_folder(out)
    df = _frame(1000)
    result = ts.Dataset(df, part_size="8KB").to_parquet(str(out), num_files=3)
    assert result.num_rows == 1000
    after = _files(out)
    assert {k: after[k] for k in before} == before, "the user's files are untouched"
    ours = _ours(out)
    assert sorted(ours) == ["part_00000.parquet", "part_00001.parquet", "part_00002.parquet"]
    assert sorted(after) == sorted([*before, *ours, "_manifest.json", "_metadata", "_schema.json"])
    manifest = json.loads((out / "_manifest.json").read_text())
    assert manifest["others"] == [".hidden", "README.txt", "mine.parquet", "notes.csv", "raw"]
    _no_scratch(out)
    # the folder, and a glob over it, read the export alone (mine.parquet, raw/ and
    # notes.csv would otherwise be mixed in, or refused as not in the manifest)
    _same(_read(ts.Dataset(str(out))), df)
    _same(_read(ts.Dataset(str(out / "*.parquet"))), df)
    _same(pd.concat([pd.read_parquet(out / f) for f in sorted(ours)]), df)
    # a user's file, picked by its path, is read as it is (not checked against the export)
    pd.testing.assert_frame_equal(_read_plain(out / "mine.parquet"), pd.DataFrame({"other": [7, 8, 9]}),
                                  check_dtype=False)


def _read_plain(path: Path) -> pd.DataFrame:
    return ts.Dataset(str(path)).to_ddf().compute().reset_index(drop=True)


def test_loader_reads_the_export_alone(tmp_path):
    from tabstream.loaders import Loader

    out = tmp_path / "data"
    _user_folder(out)
    df = _frame(300)
    ts.Dataset(df).to_parquet(str(out), num_files=2)
    seen = []
    for features, _labels in Loader(str(out), 64, labels=["y"], shuffle=False):
        seen.extend(np.asarray(features["row_id"]).tolist())
    assert sorted(seen) == df["row_id"].tolist()


def test_a_previous_export_needs_overwrite_and_the_user_files_stay(tmp_path):
    out = tmp_path / "data"
    before = _user_folder(out)
    first = _frame(900, seed=1)
    ts.Dataset(first, part_size="8KB").to_parquet(str(out), num_files=4)
    with pytest.raises(FileExistsError, match=rf"'{out}' already exists; pass overwrite=True to replace it: "
                                              r"it holds a tabstream export \(_manifest.json\) beside other"):
        ts.Dataset(_frame(10)).to_parquet(str(out))
    _same(_read(ts.Dataset(str(out))), first)
    second = _frame(200, seed=2)
    ts.Dataset(second).to_parquet(str(out), num_files=2, overwrite=True)
    after = _files(out)
    assert {k: after[k] for k in before} == before
    # the previous export's files are gone: no stale part_00002/3 left to be mixed in
    assert sorted(k for k in after if k.startswith("part_")) == ["part_00000.parquet", "part_00001.parquet"]
    _same(_read(ts.Dataset(str(out))), second)
    _same(pd.concat([pd.read_parquet(out / f) for f in _ours(out)]), second)
    _no_scratch(out)


def test_a_folder_of_one_export_is_still_replaced_whole(tmp_path):
    out = tmp_path / "data"
    ts.Dataset(_frame(500)).to_parquet(str(out), num_files=5)
    with pytest.raises(FileExistsError, match=r"already exists; pass overwrite=True to replace it: it holds "
                                              r"a tabstream export"):
        ts.Dataset(_frame(10)).to_parquet(str(out))
    df = _frame(50, seed=3)
    ts.Dataset(df).to_parquet(str(out), overwrite=True)
    assert "others" not in json.loads((out / "_manifest.json").read_text())
    assert sorted(os.listdir(out)) == ["_manifest.json", "_metadata", "_schema.json", "part_00000.parquet"]
    _same(_read(ts.Dataset(str(out))), df)


@pytest.mark.parametrize(("taken", "kwargs"), [
    ("part_00001.parquet", {"num_files": 3}),
    ("_metadata", {}),
    ("_schema.json", {}),
    ("_manifest.json", {}),        # another tool's manifest
    ("_keysets", {"write_keysets": True}),
    ("c=1", {"partition_on": ["c"]}),
])
def test_a_name_in_the_way_is_refused_and_nothing_changes(tmp_path, taken, kwargs):
    out = tmp_path / "data"
    _user_folder(out)
    if taken == "c=1":
        (out / taken).mkdir()
        pd.DataFrame({"other": [1]}).to_parquet(out / taken / "x.parquet")
    elif taken == "_keysets":
        (out / taken).write_text("mine")
    else:
        (out / taken).write_text('{"mine": true}')
    before = _files(out)
    df = _frame(90).assign(c=lambda d: d["row_id"] % 3)
    ds = ts.Dataset(df)
    if kwargs.get("write_keysets"):
        from tabstream import ops

        wf = ts.Workflow(["c"] >> ops.Categorify()).fit(ds)
        ds = wf.transform(ds)
    with pytest.raises(FileExistsError, match=rf"export into '{out}': {out}/{taken} is in the way: the export "
                                              r"writes a file of that name, and this one is not part of a "
                                              r"tabstream export"):
        ds.to_parquet(str(out), **kwargs)
    assert _files(out) == before
    _no_scratch(out)


# -- kill -9 part-way, and the next export ---------------------------------------------
KILLED = """
    import os, sys, time
    import numpy as np, pandas as pd
    import tabstream as ts

    out, stage, n, seed, overwrite = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
    rename, unlink = os.rename, os.unlink
    moved = []

    def stop():
        print("ready", flush=True)
        time.sleep(600)

    def held(src, dst, *args, **kwargs):
        if "/.tabstream-tmp-" in str(src) and os.path.dirname(str(dst)) == out:
            if stage == "between-moves" and len(moved) == 1:
                stop()
            moved.append(dst)
        return rename(src, dst, *args, **kwargs)

    def held_unlink(path, *args, **kwargs):
        if stage == "manifest-in" and str(path).endswith(".tabstream-publish.json"):
            stop()
        return unlink(path, *args, **kwargs)

    os.rename, os.unlink = held, held_unlink
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"row_id": np.arange(n), "x": rng.integers(0, 2**40, n), "y": rng.random(n)})
    ts.Dataset(df, part_size="8KB").to_parquet(out, num_files=3, overwrite=overwrite)
    print("finished", flush=True)
"""


def _python(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _kill_when_ready(proc: subprocess.Popen) -> None:
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        line = proc.stdout.readline() if ready else "(no output in 120 s)"
        assert line.strip() == "ready", f"the export did not stop where asked: {line!r} {proc.stderr.read()}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()


@pytest.mark.parametrize(("previous", "stage"), [(True, "between-moves"), (True, "manifest-in"),
                                               (False, "manifest-in")])
def test_killed_between_the_moves(tmp_path, stage, previous):
    """Killed after one file moved in (an overwrite: the previous export put back), or
    after the manifest moved in (complete: kept). A first export killed between the
    moves: :func:`test_a_killed_first_export_is_removed_by_the_next`."""
    out = tmp_path / "data"
    before = _user_folder(out)
    old = _frame(400, seed=4)
    if previous:
        ts.Dataset(old, part_size="8KB").to_parquet(str(out), num_files=2)
    _kill_when_ready(_python(KILLED, str(out), stage, "700", "5", str(int(previous))))
    new = _frame(700, seed=5)
    assert (out / ".tabstream-publish.json").exists() and (out / ".tabstream-export.lock").exists()
    interrupted = rf"{out}: an export into this folder was interrupted, or is being published now"
    for path in (out, out / "*.parquet", out / "part_00000.parquet"):
        with pytest.raises(DataError, match=interrupted):
            ts.Dataset(str(path))
    assert (out / "_manifest.json").exists() is (stage == "manifest-in")
    # the next export into the folder undoes the killed one (its owner is dead)
    if stage == "between-moves":
        # the previous export is put back whole: a plain export is refused as before
        with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
            ts.Dataset(_frame(10)).to_parquet(str(out))
        _same(_read(ts.Dataset(str(out))), old)
    else:
        # the killed export had put its manifest in place: complete, kept
        with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
            ts.Dataset(_frame(10)).to_parquet(str(out))
        _same(_read(ts.Dataset(str(out))), new)
    after = _files(out)
    assert {k: after[k] for k in before} == before
    _no_scratch(out)
    latest = _frame(333, seed=6)
    ts.Dataset(latest).to_parquet(str(out), num_files=2, overwrite=True)
    _same(_read(ts.Dataset(str(out))), latest)
    after = _files(out)
    assert {k: after[k] for k in before} == before
    assert sorted(after) == sorted([*before, "part_00000.parquet", "part_00001.parquet", "_manifest.json",
                                    "_metadata", "_schema.json"])
    _no_scratch(out)


def test_a_killed_first_export_is_removed_by_the_next(tmp_path):
    out = tmp_path / "data"
    before = _user_folder(out)
    _kill_when_ready(_python(KILLED, str(out), "between-moves", "700", "5", "0"))
    moved = [p.name for p in out.iterdir() if p.name.startswith("part_")]
    assert len(moved) == 1, moved  # one file of the killed export is in place
    latest = _frame(120, seed=7)
    ts.Dataset(latest).to_parquet(str(out))  # no overwrite needed: no export was there
    _same(_read(ts.Dataset(str(out))), latest)
    after = _files(out)
    assert sorted(after) == sorted([*before, "part_00000.parquet", "_manifest.json", "_metadata",
                                    "_schema.json"])
    _no_scratch(out)


# -- two exports at once ----------------------------------------------------------
RACER = """
    import json, os, sys, time
    import numpy as np, pandas as pd
    import tabstream as ts
    from tabstream.pipeline import export_folder

    out, go, writer, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
    finish = export_folder.PublishInto.finish

    def wait_for(path):
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.0005)

    def held(self):  # written, lock held: waits before its moves
        open(f"{go}.held{writer}", "w").close()
        wait_for(f"{go}.release{writer}")
        return finish(self)

    if hold:
        export_folder.PublishInto.finish = held
    df = pd.DataFrame({"row_id": np.arange(2000 + 1000 * writer), "writer": writer})
    ds = ts.Dataset(df, part_size="16KB")
    open(f"{go}.ready{writer}", "w").close()
    wait_for(f"{go}{writer}")
    try:
        result = ds.to_parquet(out, num_files=3)
        print(json.dumps({"ok": True, "rows": result.num_rows}))
    except FileExistsError as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
"""


def _outcome(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _wait(path: Path, procs: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} did not appear"
        assert all(p.poll() is None for p in procs), [p.communicate() for p in procs]
        time.sleep(0.01)


def _one_export_and_the_user_files(out: Path, before: dict[str, bytes]) -> int:
    after = _files(out)
    assert {k: after[k] for k in before} == before
    ours = _ours(out)
    assert sorted(after) == sorted([*before, *ours, "_manifest.json", "_metadata", "_schema.json"])
    frame = pd.concat([pd.read_parquet(out / f) for f in ours])
    writers = frame["writer"].unique().tolist()
    assert len(writers) == 1, f"rows of several exports: {writers}"
    writer = int(writers[0])
    expected = pd.DataFrame({"row_id": np.arange(2000 + 1000 * writer), "writer": writer})
    _same(_read(ts.Dataset(str(out))), expected)
    _no_scratch(out)
    return writer


@pytest.mark.parametrize("release", ["together", "one-holds-the-lock"])
def test_two_processes_export_into_one_folder(tmp_path, release):
    out, go = tmp_path / "data", tmp_path / "go"
    before = _user_folder(out)
    hold = release == "one-holds-the-lock"
    procs = [_python(RACER, str(out), str(go), str(w), str(int(hold and w == 1))) for w in (1, 2)]
    try:
        for w in (1, 2):
            _wait(Path(f"{go}.ready{w}"), procs)
        if hold:
            Path(f"{go}1").touch()
            _wait(Path(f"{go}.held1"), procs)  # writer 1 holds the lock, all written
            Path(f"{go}2").touch()
            results = {2: _outcome(procs[1])}
            Path(f"{go}.release1").touch()
            results[1] = _outcome(procs[0])
        else:
            for w in (1, 2):
                Path(f"{go}{w}").touch()
            results = {w: _outcome(p) for w, p in zip((1, 2), procs)}
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p in tmp_path.glob("go*"):
        p.unlink()
    writer = _one_export_and_the_user_files(out, before)
    assert results[writer]["ok"] and results[writer]["rows"] == 2000 + 1000 * writer
    loser = results[3 - writer]
    assert not loser["ok"] and loser["error"] == "FileExistsError"
    if hold:
        assert writer == 1
        assert loser["message"].startswith(f"'{out}': another export into this folder is under way (its lock "
                                           f"{out}/.tabstream-export.lock is held by process {procs[0].pid})")
    else:  # refused at the lock, or (when it came after) by the export now in place
        assert ("another export into this folder is under way" in loser["message"]
                or "already exists; pass overwrite=True" in loser["message"]), loser


def _lock_text(pid: int, host: str | None = None) -> str:
    start = process_start(pid)
    return f"{host or _host()}-{pid}-" + (f"s{start}-" if start is not None else "") + "0123456789ab"


def test_a_stale_lock_is_broken_and_a_live_one_refuses(tmp_path):
    out = tmp_path / "data"
    before = _user_folder(out)
    lock = out / ".tabstream-export.lock"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        lock.write_text(_lock_text(sleeper.pid))
        with pytest.raises(FileExistsError, match=rf"another export into this folder is under way \(its lock "
                                                  rf"{lock} is held by process {sleeper.pid}\)"):
            ts.Dataset(_frame(10)).to_parquet(str(out))
        assert _files(out) == {**before, ".tabstream-export.lock": lock.read_bytes()}
    finally:
        sleeper.kill()
        sleeper.wait()
    # its owner is gone now: the lock is stale
    df = _frame(60)
    ts.Dataset(df).to_parquet(str(out))
    _same(_read(ts.Dataset(str(out))), df)
    _no_scratch(out)
    # a lock of another host: kept a day, then taken for stale
    lock.write_text(_lock_text(12345, host="00000000"))
    with pytest.raises(FileExistsError, match=r"held by process 12345 of another host"):
        ts.Dataset(df).to_parquet(str(out), overwrite=True)
    then = time.time() - 2 * 86400
    os.utime(lock, (then, then))
    ts.Dataset(df.iloc[:20]).to_parquet(str(out), overwrite=True)
    _same(_read(ts.Dataset(str(out))), df.iloc[:20])
    _no_scratch(out)


def test_object_store_prefix_with_other_keys_is_refused(s3):
    fs, options = s3
    fs.pipe_file("bkt/mixed/mine.csv", b"a\n1\n")
    with pytest.raises(FileExistsError, match=r"'s3://bkt/mixed' already exists; pass overwrite=True to replace "
                                              r"it \(on an object store an export is not published into a "
                                              r"prefix that holds other keys"):
        ts.Dataset(_frame(10)).to_parquet("s3://bkt/mixed", storage_options=options)
    fs.invalidate_cache()
    assert fs.find("bkt/mixed") == ["bkt/mixed/mine.csv"]


def test_a_killed_object_store_export_is_refused_before_any_work(s3, monkeypatch):
    """A prefix holding a killed export's lock and part files: without overwrite the
    target check (what the CLI asks before fitting) refuses it, as the export's own
    begin() would after the fit; with overwrite it goes ahead (begin breaks the lock)."""
    from tabstream.pipeline import export_folder
    from tabstream.pipeline.export_folder import LOCK_FILE, check_target

    fs, options = s3
    fs.pipe_file(f"bkt/killed/{LOCK_FILE}", b"gone-host-4202345-0123456789ab")
    fs.pipe_file("bkt/killed/part_00000.parquet", b"half written")
    # the owner's host is unknown here: the lock counts as stale by its age alone
    monkeypatch.setattr(export_folder, "STALE_SECONDS", 0.0)
    with pytest.raises(FileExistsError, match=r"'s3://bkt/killed' already exists; pass overwrite=True "
                                              r"to replace it \(it holds keys an export to it left when "
                                              r"it was killed"):
        check_target(fs, "bkt/killed", "s3://bkt/killed", overwrite=False)
    fs.invalidate_cache()
    assert sorted(fs.find("bkt/killed")) == [f"bkt/killed/{LOCK_FILE}", "bkt/killed/part_00000.parquet"]
    assert check_target(fs, "bkt/killed", "s3://bkt/killed", overwrite=True) == "new"
    df = _frame(30)
    ts.Dataset(df).to_parquet("s3://bkt/killed", overwrite=True, storage_options=options)
    _same(_read(ts.Dataset("s3://bkt/killed", storage_options=options)), df)

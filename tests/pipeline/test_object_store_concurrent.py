"""Two exports to one object-store prefix at the same time, against a moto S3 server
started on 127.0.0.1: the export takes a lock in the prefix with an exclusive write
(S3's ``If-None-Match: *``), so with ``overwrite=False`` one export succeeds and the
other fails with FileExistsError naming the prefix, and with ``overwrite=True`` the
prefix always holds one export, whole. The overlap is made deterministic by holding a
writer (a real process) in the store client, where it starts on the prefix (its
first request for unfinished uploads) or once its first data file is uploaded, until
the test lets it go; what the prefix holds afterwards is read with plain
pandas and compared with the rows each writer wrote."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import ExportError

ROOT = Path(__file__).resolve().parents[2]
SIDECARS = {"_manifest.json", "_schema.json", "_metadata"}
LOCK = ".tabstream-export.lock"

WRITER = """
    import json, os, sys, time
    import numpy as np, pandas as pd
    import s3fs
    import tabstream as ts
    from tabstream.core.errors import ExportError

    out, options, tag, rows = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    overwrite, hold, point = sys.argv[5] == "1", sys.argv[6], sys.argv[7]

    def wait_for_the_test():
        if not os.path.exists(hold + ".held"):
            open(hold + ".held", "w").close()
            deadline = time.monotonic() + 120
            while not os.path.exists(hold + ".go") and time.monotonic() < deadline:
                time.sleep(0.01)

    # held in the store client (s3fs), not in tabstream: where the export starts on the
    # prefix (it asks for the unfinished uploads under it), or after its first data file
    if hold and point == "begin":
        call = s3fs.S3FileSystem.call_s3

        def held_call(self, method, *args, **kwargs):
            if method == "list_multipart_uploads":
                wait_for_the_test()
            return call(self, method, *args, **kwargs)

        s3fs.S3FileSystem.call_s3 = held_call
    elif hold:
        commit = s3fs.core.S3File.commit

        def held_commit(self):
            commit(self)
            if self.key.endswith(".parquet"):
                wait_for_the_test()

        s3fs.core.S3File.commit = held_commit
    frame = pd.DataFrame({"writer": tag, "x": np.arange(rows, dtype="int64")})
    try:
        result = ts.Dataset(frame, part_size="16KB").to_parquet(out, num_files=2, overwrite=overwrite,
                                                                storage_options=options)
        print(json.dumps({"ok": True, "files": result.files, "rows": result.num_rows}))
    except (FileExistsError, ExportError) as exc:
        print(json.dumps({"ok": False, "error": type(exc).__name__, "message": str(exc)}))
"""


def _frame(tag: str, rows: int) -> pd.DataFrame:
    return pd.DataFrame({"writer": tag, "x": np.arange(rows, dtype="int64")})


def _start(out: str, options: dict, tag: str, rows: int, overwrite: bool, hold: Path | None,
           point: str = "file") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), out, json.dumps(options), tag,
                             str(rows), str(int(overwrite)), str(hold or ""), point],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1])


def _wait_for(path: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the writer ended before it was held: {proc.communicate()}")
        assert time.monotonic() < deadline, "the writer was not held in time"
        time.sleep(0.01)


def _overlap(out: str, options: dict, first: tuple, second: tuple, point: str,
             tmp_path: Path) -> tuple[dict, dict]:
    """``first`` (tag, rows, overwrite) starts and is held at ``point`` (``"begin"``:
    where it starts on the prefix; ``"file"``: after its first data file); then
    ``second`` runs from start to end; then ``first`` goes on. Their results."""
    hold = tmp_path / "hold"
    a = _start(out, options, *first, hold=hold, point=point)
    try:
        _wait_for(Path(f"{hold}.held"), a)
        b = _start(out, options, *second, hold=None)
        second_result = _result(b)
        Path(f"{hold}.go").touch()
        first_result = _result(a)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    return first_result, second_result


def _keys(fs, prefix: str) -> set[str]:
    fs.invalidate_cache()
    return {k[len(prefix) + 1:] for k in fs.find(prefix)}


def _read_back(fs, prefix: str) -> pd.DataFrame:
    """The rows the prefix's manifest names, read with plain pandas, by writer and x."""
    manifest = json.loads(fs.cat_file(f"{prefix}/_manifest.json"))
    frame = pd.concat([pd.read_parquet(io.BytesIO(fs.cat_file(f"{prefix}/{f['path']}")))
                       for f in manifest["files"]], ignore_index=True)
    assert manifest["num_rows"] == len(frame)
    return frame.sort_values(["writer", "x"]).reset_index(drop=True)


def _check_whole(fs, options: dict, prefix: str, expected: pd.DataFrame) -> None:
    """The prefix is exactly one export with ``expected``'s rows, no other key, and
    tabstream reads it as such."""
    manifest = json.loads(fs.cat_file(f"{prefix}/_manifest.json"))
    assert _keys(fs, prefix) == SIDECARS | {f["path"] for f in manifest["files"]}
    pd.testing.assert_frame_equal(_read_back(fs, prefix), expected, check_dtype=False)
    back = ts.Dataset(f"s3://{prefix}", storage_options=options).to_ddf().compute()
    pd.testing.assert_frame_equal(back.sort_values(["writer", "x"]).reset_index(drop=True), expected,
                                  check_dtype=False)


@pytest.mark.parametrize("point", ["begin", "file"])
@pytest.mark.parametrize("second_overwrites", [False, True])
def test_a_second_export_to_a_new_prefix_under_way_is_refused(s3, tmp_path, second_overwrites, point):
    """A (3,000 rows) is under way in a new prefix when B (2,000 rows) runs from start
    to end: B fails at once with FileExistsError naming the prefix, also with
    ``overwrite=True``; A finishes, and the prefix holds A's rows alone. (Before,
    both reported success: B's manifest named files A then replaced, or B's files were
    deleted under A's manifest.)"""
    fs, options = s3
    prefix = f"bkt/new-{int(second_overwrites)}-{point}"
    first, second = _overlap(f"s3://{prefix}", options, ("A", 3000, False), ("B", 2000, second_overwrites),
                             point, tmp_path)
    assert first["ok"], first
    assert not second["ok"] and second["error"] == "FileExistsError", second
    assert f"'s3://{prefix}'" in second["message"] and "another export to this prefix is under way" in \
        second["message"]
    _check_whole(fs, options, prefix, _frame("A", 3000))


@pytest.mark.parametrize("point", ["begin", "file"])
def test_two_overwrites_at_once_leave_one_export_whole(s3, tmp_path, point):
    """The prefix holds an export (OLD); A's overwrite is under way when B's overwrite
    runs: B is refused, A replaces OLD whole, no key of OLD or B is left. (Before,
    both succeeded and the prefix was left unreadable, "not listed in _manifest.json",
    or with OLD's manifest over deleted files.)"""
    fs, options = s3
    prefix = f"bkt/over-{point}"
    ts.Dataset(_frame("OLD", 500)).to_parquet(f"s3://{prefix}", num_files=2, storage_options=options)
    first, second = _overlap(f"s3://{prefix}", options, ("A", 3000, True), ("B", 2000, True), point, tmp_path)
    assert first["ok"], first
    assert not second["ok"] and second["error"] == "FileExistsError", second
    assert f"'s3://{prefix}'" in second["message"]
    _check_whole(fs, options, prefix, _frame("A", 3000))


@pytest.mark.parametrize("overwrite", [False, True])
def test_two_threads_export_to_one_prefix_at_once(s3, overwrite):
    """Both start together (threads of one process, one s3fs filesystem): one export
    succeeds, the other fails naming the prefix; the prefix is the winner's, whole."""
    fs, options = s3
    prefix = f"bkt/threads-{int(overwrite)}"
    if overwrite:
        ts.Dataset(_frame("OLD", 500)).to_parquet(f"s3://{prefix}", num_files=2, storage_options=options)
    barrier = threading.Barrier(2)
    outcome: dict[str, object] = {}

    def run(tag: str, rows: int) -> None:
        ds = ts.Dataset(_frame(tag, rows), part_size="16KB")
        barrier.wait()
        try:
            outcome[tag] = ds.to_parquet(f"s3://{prefix}", num_files=2, overwrite=overwrite,
                                         storage_options=options).num_rows
        except Exception as exc:  # checked below: the loser's error names the prefix
            outcome[tag] = exc

    threads = [threading.Thread(target=run, args=args) for args in (("A", 3000), ("B", 2000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    winners = [tag for tag, value in outcome.items() if isinstance(value, int)]
    assert len(winners) == 1, outcome
    loser = outcome["B" if winners == ["A"] else "A"]
    assert isinstance(loser, (FileExistsError, ExportError)) and f"'s3://{prefix}'" in str(loser), loser
    _check_whole(fs, options, prefix, _frame(winners[0], 3000 if winners == ["A"] else 2000))


@pytest.mark.parametrize("intruder", ["a key", "the lock"])
def test_a_writer_that_ignores_the_lock_fails_the_export_loudly(s3, tmp_path, intruder):
    """While A is held mid-export, another writer (one that ignores the lock: an older
    version, a store without exclusive writes) puts a data file into the prefix, or
    takes the lock over: A fails with ExportError naming the prefix instead of
    publishing a manifest beside files it does not name, and leaves none of its own
    keys; the other writer's key stays. (Before, A reported success.)"""
    fs, options = s3
    prefix = f"bkt/intruded-{intruder.replace(' ', '-')}"
    hold = tmp_path / "hold"
    a = _start(f"s3://{prefix}", options, "A", 3000, False, hold)
    try:
        _wait_for(Path(f"{hold}.held"), a)
        if intruder == "a key":
            other = f"{prefix}/part_00007-0badc0de.parquet"
            buf = io.BytesIO()
            _frame("X", 10).to_parquet(buf, index=False)
            fs.pipe_file(other, buf.getvalue())
        else:
            other = f"{prefix}/{LOCK}"
            fs.pipe_file(other, b"0badc0de-1-s1-0123456789ab")  # another owner's text
        Path(f"{hold}.go").touch()
        result = _result(a)
    finally:
        if a.poll() is None:
            a.kill()
            a.wait()
    assert not result["ok"] and result["error"] == "ExportError", result
    assert f"'s3://{prefix}'" in result["message"] and "nothing was published" in result["message"]
    assert _keys(fs, prefix) == {other[len(prefix) + 1:]}


def test_the_lock_of_a_killed_export_is_broken_by_the_next(s3, tmp_path):
    """An export killed (SIGKILL) mid-way leaves its data files and its lock: the next
    export without overwrite is refused as before (the prefix holds keys), the next
    with overwrite replaces it whole and leaves no lock."""
    fs, options = s3
    prefix = "bkt/killed-lock"
    hold = tmp_path / "hold"
    a = _start(f"s3://{prefix}", options, "A", 3000, False, hold)
    try:
        _wait_for(Path(f"{hold}.held"), a)
    finally:
        os.kill(a.pid, signal.SIGKILL)
        a.communicate(timeout=30)
    assert LOCK in _keys(fs, prefix)
    with pytest.raises(FileExistsError, match=r"'s3://bkt/killed-lock' already exists; pass overwrite=True"):
        ts.Dataset(_frame("B", 2000)).to_parquet(f"s3://{prefix}", num_files=2, storage_options=options)
    ts.Dataset(_frame("B", 2000)).to_parquet(f"s3://{prefix}", num_files=2, overwrite=True,
                                             storage_options=options)
    _check_whole(fs, options, prefix, _frame("B", 2000))


def test_a_store_that_ignores_exclusive_writes_gets_a_warning_and_names_of_its_own(s3, monkeypatch):
    """A store that accepts ``If-None-Match: *`` on a key that exists (some S3-compatible
    servers), imitated by a client that drops the condition: the export says so in a
    warning naming the prefix and the docs, writes file names of its own, and is read
    back whole; a second export to the prefix is still refused."""
    import s3fs

    fs, options = s3
    call, async_call = s3fs.S3FileSystem.call_s3, s3fs.S3FileSystem._call_s3

    def plain(kwargs: dict) -> dict:
        return {k: v for k, v in kwargs.items() if k not in ("IfNoneMatch", "IfMatch")}

    async def ignoring_async(self, method, *args, **kwargs):
        return await async_call(self, method, *args, **plain(kwargs))

    def ignoring(self, method, *args, **kwargs):
        return call(self, method, *args, **plain(kwargs))

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", ignoring_async)
    monkeypatch.setattr(s3fs.S3FileSystem, "call_s3", ignoring)
    prefix = "bkt/no-conditions"
    with pytest.warns(UserWarning, match=r"export to 's3://bkt/no-conditions': the object store does not "
                                         r"honour exclusive writes .*docs/scaling-out.md"):
        result = ts.Dataset(_frame("A", 3000)).to_parquet(f"s3://{prefix}", num_files=2,
                                                          storage_options=options)
    assert all(name.startswith("part_0000") and "-" in name for name in result.files), result.files
    _check_whole(fs, options, prefix, _frame("A", 3000))
    with pytest.raises(FileExistsError, match=r"'s3://bkt/no-conditions' already exists"):
        ts.Dataset(_frame("B", 2000)).to_parquet(f"s3://{prefix}", num_files=2, storage_options=options)

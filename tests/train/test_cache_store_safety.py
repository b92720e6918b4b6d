"""ParameterServer folders: one holder at a time, reopened by open_or_create, full
disks reported (never SIGBUS), exports that never hold a whole table."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig

TABLES = [TableConfig("C1", 1000, 4, ("C1",)), TableConfig("C2", 50, 2, ("C2",))]
REPO = Path(__file__).resolve().parents[2]


def run_python(code, **kw):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120, **kw)


def test_a_second_opener_is_told_who_holds_the_server(tmp_path):
    ps = ParameterServer(tmp_path / "ps", TABLES, storage="disk")
    ps.apply("C1", [1], np.ones((1, 4), np.float32))
    ps.flush()
    with pytest.raises(DataError, match=r"ps is open in this process \(another ParameterServer "
                                        r"object\) since .*one process at a time"):
        ParameterServer.open(tmp_path / "ps")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from tabstream.train.cache_store import ParameterServer
            ps = ParameterServer.open({str(tmp_path / 'ps2')!r})
            print("open", flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        ParameterServer(tmp_path / "ps2", TABLES, storage="memory").close()
        assert holder.stdout.readline().strip() == "open"
        with pytest.raises(DataError, match=rf"ps2 is open in process {holder.pid} on host "):
            ParameterServer.open(tmp_path / "ps2")
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
    # the holder died without closing: its lock is taken over
    ps2 = ParameterServer.open(tmp_path / "ps2")
    ps2.close()
    # closing releases; the server reopens as committed
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_array_equal(again.touched("C1"), [1])
    again.close()


def test_a_dropped_server_releases_its_lock(tmp_path):
    ParameterServer(tmp_path / "ps", TABLES, storage="disk")  # never closed, dropped
    ParameterServer.open(tmp_path / "ps").close()


def test_a_killed_holder_leaves_a_lock_that_is_taken_over(tmp_path):
    out = run_python(f"""
        import os, signal
        from tabstream.train.cache_store import ParameterServer
        from tabstream.train.tables import TableConfig
        ps = ParameterServer({str(tmp_path / 'ps')!r}, [TableConfig("C1", 10, 2, ("C1",))])
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert out.returncode == -9
    assert (tmp_path / "ps" / "_lock").exists()
    ParameterServer.open(tmp_path / "ps").close()


def test_open_or_create_creates_then_reopens_and_refuses_other_tables(tmp_path):
    path = tmp_path / "ps"
    ps = ParameterServer.open_or_create(path, TABLES, storage="disk", optimizer="adam", lr=0.05)
    new = ps.apply("C2", [3, 3, 7], np.ones((3, 2), np.float32))
    ps.flush()
    ps.close()
    ps = ParameterServer.open_or_create(path, TABLES, storage="disk", optimizer="adam", lr=0.05)
    np.testing.assert_array_equal(ps.lookup("C2", [3, 7]), new)
    assert ps.version == 1 and ps.optimizer == "adam"
    ps.close()
    other = [TableConfig("C1", 999, 4, ("C1",)), TABLES[1]]
    with pytest.raises(DataError, match=r"holds a parameter server of other tables or settings: "
                                        r"table 'C1': folder .*'cardinality': 1000.*given "
                                        r".*'cardinality': 999"):
        ParameterServer.open_or_create(path, other, storage="disk", optimizer="adam", lr=0.05)
    with pytest.raises(DataError, match=r"optimizer: folder 'adam', given 'adagrad'"):
        ParameterServer.open_or_create(path, TABLES, storage="disk", lr=0.05)
    with pytest.raises(DataError, match=r"lr: folder 0.05, given 0.1"):
        ParameterServer.open_or_create(path, TABLES, storage="disk", optimizer="adam", lr=0.1)
    # a refusal leaves the folder free for the right call
    ParameterServer.open_or_create(path, TABLES, storage="disk", optimizer="adam", lr=0.05).close()


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_export_delta_in_blocks_equals_the_rows(tmp_path, storage):
    ps = ParameterServer(tmp_path / "ps", TABLES, storage=storage)
    rng = np.random.default_rng(0)
    ids = rng.choice(1000, 300, replace=False)
    ps.apply("C1", ids, rng.normal(size=(300, 4)).astype(np.float32))
    # a block of 64 MB holds all 300 rows; shrink it through the dimension: not
    # possible, so check the writer on its own with a tiny block too
    counts = ps.export_delta(tmp_path / "d0")
    got = pq.read_table(tmp_path / "d0" / "C1" / "part_00000.parquet").to_pandas()
    assert counts == {"C1": 300, "C2": 0}
    np.testing.assert_array_equal(got["key"], np.sort(ids))
    np.testing.assert_array_equal(np.stack(got["value"]), ps.lookup("C1", np.sort(ids)))
    assert pq.read_table(tmp_path / "d0" / "C2" / "part_00000.parquet").num_rows == 0
    # the next export holds only what changed after this one
    ps.apply("C1", [5, 999], np.ones((2, 4), np.float32))
    ps.export_delta(tmp_path / "d1")
    got = pq.read_table(tmp_path / "d1" / "C1" / "part_00000.parquet").to_pandas()
    np.testing.assert_array_equal(got["key"], [5, 999])
    ps.close()


def test_touched_does_not_map_the_version_file(tmp_path):
    """The scan reads the change log, never the records: the process's resident
    size does not grow by the records file's size (160 MB here)."""
    out = run_python(f"""
        import numpy as np, psutil
        from tabstream.train.cache_store import ParameterServer
        from tabstream.train.tables import TableConfig
        ps = ParameterServer({str(tmp_path / 'ps')!r}, [TableConfig("big", 10_000_000, 1, ("big",))])
        ids = np.arange(0, 10_000_000, 1_000_003)
        ps.apply("big", ids, np.ones((len(ids), 1), np.float32))
        ps.flush()
        # the file is in the page cache; only a map would make it resident here
        open({str(tmp_path / 'ps' / 'big.slots.f32')!r}, "rb").read()
        before = psutil.Process().memory_info().rss
        touched = ps.touched("big")
        grew = psutil.Process().memory_info().rss - before
        print(int(np.array_equal(touched, ids)), grew)
    """)
    assert out.returncode == 0, out.stderr
    same, grew = out.stdout.split()
    assert same == "1"
    assert int(grew) < 16 << 20  # the change log (80 bytes), not the 160 MB file


FULL_DISK = """
    import os, sys
    import numpy as np
    from tabstream.core.errors import DataError
    from tabstream.train.cache_store import ParameterServer
    from tabstream.train.tables import TableConfig
    # 5,000 rows of 520 bytes (weight, adagrad state, version), 16 rows apart: their
    # packed records (2.6 MB) do not fit the 2 MB filesystem
    ps = ParameterServer(sys.argv[1] + "/ps", [TableConfig("t", 200_000, 64, ("t",))], storage="disk")
    ids = np.arange(0, 200_000, 16)[:5000]
    first = ids[:20]
    ps.apply("t", first, np.ones((20, 64), np.float32))
    ps.flush()
    kept = ps.lookup("t", first)
    try:
        ps.apply("t", ids, np.ones((len(ids), 64), np.float32))
    except DataError as exc:
        print("ERROR", exc, "|", exc.hint)
    assert np.array_equal(ps.lookup("t", first), kept)
    assert set(ps.touched("t").tolist()) == set(first.tolist())
    try:
        ps.export_delta(sys.argv[1] + "/delta")
    except DataError as exc:
        print("EXPORT", exc)
    print("LEFT", sorted(n for n in os.listdir(sys.argv[1]) if n.startswith(".")))
    ps.close()
    ps = ParameterServer.open(sys.argv[1] + "/ps")
    assert np.array_equal(ps.lookup("t", first), kept)
    print("REOPENED", ps.version)
"""


def test_a_full_disk_is_an_error_not_sigbus(tmp_path):
    """A 2 MB tmpfs in a private mount namespace (``unshare``, no privileges needed)."""
    script = tmp_path / "full.py"
    script.write_text(textwrap.dedent(FULL_DISK))
    mount = tmp_path / "mnt"
    mount.mkdir()
    cmd = f"mount -t tmpfs -o size=2m none {mount} && PYTHONPATH={REPO} {sys.executable} {script} {mount}"
    out = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", cmd],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr  # SIGBUS would be -7
    assert f"ERROR parameter server {mount}/ps: could not write table 't' (No space left on " \
           "device); this update was not applied" in out.stdout, out.stdout
    assert "free space on that disk, or move the server (its path)" in out.stdout
    assert "REOPENED 1" in out.stdout


def test_a_memory_snapshot_is_on_the_disk_before_it_is_renamed_into_place(tmp_path, monkeypatch):
    # power-loss safety cannot be staged here; what it rests on can be watched: every
    # file of the snapshot is fsynced, then its folder, before the rename that publishes
    # it, and the server folder after the renames; the reopened server has the rows
    events: list[tuple[str, str]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", f"{src} -> {dst}"))
        return real_replace(src, dst)

    ps = ParameterServer(tmp_path / "ps", TABLES, storage="memory")
    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    ps.apply("C1", [3, 7], rows)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ps.flush()
    monkeypatch.undo()
    expected = ps.lookup("C1", np.array([3, 7]))
    ps.close()

    folder = str(tmp_path / "ps")
    publish = next(i for i, (kind, what) in enumerate(events)
                   if kind == "replace" and what.endswith(f"-> {folder}/_snapshot"))
    synced_before = set()
    for kind, what in events[:publish]:
        if kind == "fsync":
            synced_before.add(what)
        else:  # a file synced, then renamed (the mark): synced under its new name
            src, dst = what.split(" -> ")
            if src in synced_before:
                synced_before.add(dst)
    tmp = f"{folder}/._snapshot.tmp"
    written = {f"{tmp}/{name}" for name in os.listdir(f"{folder}/_snapshot")}
    assert written and written <= synced_before  # every file, the mark included
    assert tmp in synced_before  # the folder's entries
    assert ("fsync", folder) in events[publish + 1:]  # the renames
    again = ParameterServer.open(tmp_path / "ps")
    got = again.lookup("C1", np.array([3, 7]))
    again.close()
    np.testing.assert_array_equal(got, expected)
    assert not np.array_equal(got, ParameterServer(tmp_path / "fresh", TABLES, storage="memory").lookup("C1", np.array([3, 7])))


def test_exports_and_merged_logs_reach_the_disk_before_they_count(tmp_path, monkeypatch):
    """What is forced to the disk, in order (a power loss keeps only that): every file
    of an export before its folder is renamed into place, that rename before the meta
    says the export is done, and the rename of a merged change log before anything
    appends to it again. Recorded from the fsync and rename calls themselves."""
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.path.realpath(os.readlink(f"/proc/self/fd/{fd}"))))
        return real_fsync(fd)

    def replace(src, dst, **kw):
        events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))
        return real_replace(src, dst, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ps = ParameterServer(tmp_path / "ps", TABLES, storage="disk")
    for step in range(4):  # commits whose change-log segments the second export merges
        ps.apply("C1", [step, 10 + step], np.full((2, 4), step, np.float32))
        ps.flush()
    ps.export_delta(tmp_path / "d0")
    ps.apply("C1", [7], np.ones((1, 4), np.float32))
    ps.export_delta(tmp_path / "d1")
    ps.apply("C1", [8], np.ones((1, 4), np.float32))
    ps.flush()
    ps.close()
    root = os.path.realpath(tmp_path)
    meta = os.path.join(root, "ps", "_server.json")
    for name in ("d0", "d1"):
        out = os.path.join(root, name)
        [at] = [i for i, e in enumerate(events) if e[0] == "replace" and e[2] == out]
        tmp = events[at][1]
        synced_before = set()  # forced to the disk under that name (or then renamed to it)
        for e in events[:at]:
            if e[0] == "fsync" or e[1] in synced_before:
                synced_before.add(e[-1])
        for folder, _, files in os.walk(out):
            before = folder.replace(out, tmp, 1)
            assert before in synced_before, folder
            for f in files:
                assert os.path.join(before, f) in synced_before, (folder, f)
        done = next(i for i, e in enumerate(events) if i > at and e[0] == "replace" and e[2] == meta)
        assert ("fsync", root) in events[at + 1:done]
    log = os.path.join(root, "ps", "C1.changes.i64")
    merged = [i for i, e in enumerate(events) if e[0] == "replace" and e[2] == log]
    assert merged, "the second export merges the change log's old segments"
    for at in merged:
        appended = next((i for i, e in enumerate(events) if i > at and e == ("fsync", log)), len(events))
        assert ("fsync", os.path.join(root, "ps")) in events[at + 1:appended]
    # and the exports hold the rows: the first the 4 commits' 8 ids, the second id 7
    got = pq.read_table(tmp_path / "d0" / "C1" / "part_00000.parquet").to_pandas()
    assert got["key"].tolist() == [0, 1, 2, 3, 10, 11, 12, 13]
    assert pq.read_table(tmp_path / "d1" / "C1" / "part_00000.parquet").column("key").to_pylist() == [7]

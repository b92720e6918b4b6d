"""ParameterServer folders whose files or ``_server.json`` were damaged or edited:
refused by ``open`` with the file, the field and the value named, before anything
in the folder is changed; folders a crash leaves still open at their last commit.

Expected rows are computed a second way: initial values by ``initial_rows`` (a
pure hash) and adagrad steps by plain numpy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer, initial_rows
from tabstream.train.tables import TableConfig

ROOT = Path(__file__).resolve().parents[2]
IDS = np.array([1, 5, 7, 999])
ALL = np.arange(1000)


def _tables():
    return [TableConfig("C1", 1000, 4, ("C1",))]


def _numpy_adagrad(w, s, ids, g, lr, eps=1e-10):
    s[ids] += g * g
    w[ids] -= lr * g / (np.sqrt(s[ids]) + eps)


def _expected(steps):
    """Rows of C1 after ``steps`` adagrad steps of gradient 1 on ``IDS`` (lr 0.5, seed 3)."""
    w = initial_rows(3, "C1", ALL, 4, 0.05).astype(np.float64)
    s = np.zeros_like(w)
    for _ in range(steps):
        _numpy_adagrad(w, s, IDS, np.ones((len(IDS), 4)), 0.5)
    return w


def _trained(folder, storage="disk", steps=3):
    ps = ParameterServer(folder, _tables(), storage=storage, seed=3, lr=0.5)
    for _ in range(steps):
        ps.apply("C1", IDS, np.ones((len(IDS), 4), np.float32))
    ps.flush()
    ps.close()


def _edit_meta(folder, edit):
    meta = json.loads((folder / "_server.json").read_text())
    edit(meta)
    (folder / "_server.json").write_text(json.dumps(meta))


def test_a_trained_folder_reopens_with_its_rows(tmp_path):
    _trained(tmp_path / "ps")
    ps = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(3), rtol=1e-5, atol=1e-6)
    ps.close()


@pytest.mark.parametrize("damage", ["emptied", "missing"])
def test_a_rows_file_emptied_or_missing_is_refused_and_left_as_found(tmp_path, damage):
    _trained(tmp_path / "ps")
    rows = tmp_path / "ps" / "C1.slots.f32"
    if damage == "emptied":
        rows.write_bytes(b"")
    else:
        rows.unlink()
    said = "empty \\(0 bytes\\)" if damage == "emptied" else "missing"
    for _ in range(2):  # the refusal did not make the file whole: refused again
        with pytest.raises(DataError, match=rf"C1\.slots\.f32 is {said}, but the last commit in "
                                            r"_server\.json \(field 'mark\.slots\.C1'\) has 4 rows "
                                            r"in it; the folder is damaged") as info:
            ParameterServer.open(tmp_path / "ps")
        assert "restore the folder from a copy" in info.value.hint
        assert (rows.stat().st_size == 0) if damage == "emptied" else not rows.exists()


def test_an_empty_rows_file_of_a_mark_without_rows_opens(tmp_path):
    ParameterServer(tmp_path / "ps", _tables(), seed=3).close()  # created, nothing written
    (tmp_path / "ps" / "C1.slots.f32").write_bytes(b"")
    ps = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_array_equal(ps.lookup("C1", ALL), initial_rows(3, "C1", ALL, 4, 0.05))
    ps.close()


def test_storage_disk_edited_to_memory_is_refused(tmp_path):
    _trained(tmp_path / "ps")
    _edit_meta(tmp_path / "ps", lambda m: m.__setitem__("storage", "memory"))
    with pytest.raises(DataError, match=r"_server\.json: field 'storage' is 'memory', but the folder "
                                        r"holds \['C1\.slots\.f32', 'C1\.slots\.i64', "
                                        r"'C1\.changes\.i64', 'mark\.slots'\]: expected 'disk'"):
        ParameterServer.open(tmp_path / "ps")


def test_storage_memory_edited_to_disk_is_refused_without_making_disk_files(tmp_path):
    _trained(tmp_path / "ps", storage="memory")
    _edit_meta(tmp_path / "ps", lambda m: m.__setitem__("storage", "disk"))
    before = sorted(p.name for p in (tmp_path / "ps").iterdir())
    with pytest.raises(DataError, match=r"_server\.json: field 'storage' is 'disk', but the folder "
                                        r"holds \['_snapshot'\]: expected 'memory'"):
        ParameterServer.open(tmp_path / "ps")
    assert sorted(p.name for p in (tmp_path / "ps").iterdir()) == before
    _edit_meta(tmp_path / "ps", lambda m: m.__setitem__("storage", "memory"))  # put back: opens
    ps = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(3), rtol=1e-5, atol=1e-6)
    ps.close()


def test_a_mark_lowered_below_the_rows_written_is_refused(tmp_path):
    _trained(tmp_path / "ps")
    _edit_meta(tmp_path / "ps", lambda m: m["mark"]["slots"].__setitem__("C1", 1))
    # slots go to ids in first-write order: slot 0 is id 1, the mark now drops 5, 7, 999
    with pytest.raises(DataError, match=r"C1\.changes\.i64 says commit 3 changed rows \[5, 7, 999\] "
                                        r"of table 'C1', which hold no slot among the last "
                                        r"commit's: field 'mark\.slots\.C1' of _server\.json is 1"):
        ParameterServer.open(tmp_path / "ps")


def test_a_mark_raised_past_the_ids_written_is_refused(tmp_path):
    _trained(tmp_path / "ps")
    _edit_meta(tmp_path / "ps", lambda m: m["mark"]["slots"].__setitem__("C1", 100))
    # the id file's blocks past the 4 ids written are zeros: id 0 in 96 slots
    with pytest.raises(DataError, match=r"C1\.slots\.i64 gives id 0 more than one of the 100 "
                                        r"committed slots \(field 'mark\.slots\.C1'"):
        ParameterServer.open(tmp_path / "ps")


def _set(path, value):
    def edit(meta):
        *parents, last = path.split(".")
        node = meta
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return edit


@pytest.mark.parametrize(("path", "value", "expected"), [
    ("mark", "x", r"field 'mark' is 'x', expected an object \(a commit's counters\)"),
    ("betas", [0.9], r"field 'betas' is \[0\.9\], expected a list of two numbers"),
    ("lr", -1, r"field 'lr' is -1, expected a positive number"),
    ("lr", "0.5", r"field 'lr' is '0\.5', expected a positive number"),
    ("seed", 1.5, r"field 'seed' is 1\.5, expected an integer"),
    ("seed", True, r"field 'seed' is True, expected an integer"),
    ("optimizer", "sgd", r"field 'optimizer' is 'sgd', expected one of \('adagrad', 'adam'\)"),
    ("storage", ["disk"], r"field 'storage' is \['disk'\], expected one of \('disk', 'memory'\)"),
    ("eps", None, r"field 'eps' is None, expected a finite number"),
    ("init_scale", "x", r"field 'init_scale' is 'x', expected a finite number"),
    ("mark.version", -1, r"field 'mark\.version' is -1, expected an integer >= 0"),
    ("mark.last_export", "3", r"field 'mark\.last_export' is '3', expected an integer >= 0"),
    ("mark.table_steps", {}, r"field 'mark\.table_steps' is \{\}, expected an object of the steps "
                             r"of tables \['C1'\]"),
    ("mark.table_steps.C1", 1.5, r"field 'mark\.table_steps\.C1' is 1\.5, expected an integer >= 0"),
    ("mark.slots.C1", -1, r"field 'mark\.slots\.C1' is -1, expected an integer >= 0 and <= 1000"),
    ("mark.slots.C1", 1001, r"field 'mark\.slots\.C1' is 1001, expected an integer >= 0 and <= 1000"),
    ("mark.resets", {"C1": [5000]}, r"field 'mark\.resets\.C1' is \[5000\], expected a list of "
                                    r"ids from 0 to 999"),
    ("mark.resets", {"C9": [1]}, r"field 'mark\.resets' is \{'C9': \[1\]\}, expected an object of "
                                 r"ids per table"),
    ("mark.changes.C1", 99, r"field 'mark\.changes\.C1' is 99, expected an integer from 0 to 3 "
                            r"\(the commit's version\)"),
    ("mark.changes", [1], r"field 'mark\.changes' is \[1\], expected an object of the commits of "
                          r"tables \['C1'\]"),
    ("previous", "x", r"field 'previous' is 'x', expected an object"),
    ("pending_export", 5, r"field 'pending_export' is 5, expected null or"),
    ("tables.0.name", "_C1", r"field 'tables\.name' is '_C1', expected a table name that can "
                             r"name a file"),
])
def test_bad_server_json_fields_are_data_errors_naming_field_and_value(tmp_path, path, value, expected):
    _trained(tmp_path / "ps")
    _edit_meta(tmp_path / "ps", _set(path, value))
    with pytest.raises(DataError, match=r"_server\.json: " + expected) as info:
        ParameterServer.open(tmp_path / "ps")
    assert "restore the folder from a copy" in info.value.hint


def test_a_memory_snapshot_mark_edited_is_refused_naming_it(tmp_path):
    _trained(tmp_path / "ps", storage="memory")
    mark = tmp_path / "ps" / "_snapshot" / "mark.json"
    state = json.loads(mark.read_text())
    state["table_steps"] = {"C1": "3"}
    mark.write_text(json.dumps(state))
    with pytest.raises(DataError, match=r"_snapshot/mark\.json: field 'table_steps\.C1' is '3', "
                                        r"expected an integer >= 0"):
        ParameterServer.open(tmp_path / "ps")


# A kill -9 at a chosen point: the function named is replaced, in the child process
# only, by one that kills the process (the moment a real crash can hit).
_KILLED_AT = textwrap.dedent("""
    import os, signal, sys, numpy as np
    import tabstream.train.cache_store as cs
    from tabstream.train.tables import TableConfig
    ps = cs.ParameterServer(sys.argv[1], [TableConfig("C1", 1000, 4, ("C1",))], seed=3, lr=0.5)
    g = lambda n: np.ones((n, 4), np.float32)
    for _ in range(3):
        ps.apply("C1", [1, 5, 7, 999], g(4))
    ps.flush()                                          # mark 3: ids 1, 5, 7, 999
    ps.apply("C1", [5, 20, 30], g(3))                   # 20, 30: slots past the mark's
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    if sys.argv[2] == "flush":
        cs.write_json_file = killed                     # the change log has the segment of 4,
        ps.flush()                                      # _server.json still says mark 3
    else:
        ps.flush()                                      # mark 4: 20, 30 committed
        ps.apply("C1", [40], g(1))
        cs.write_json_file = killed                     # killed at the rollback's decision write:
        ps.rollback_to(3)                               # _server.json still says mark 4, no row moved
""")


@pytest.mark.parametrize("point", ["flush", "rollback_to"])
def test_a_folder_killed_inside_a_commit_or_a_rollback_still_opens(tmp_path, point):
    script = tmp_path / "killed.py"
    script.write_text(_KILLED_AT)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "ps"), point],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1"))
    assert out.returncode == -signal.SIGKILL, out.stderr
    ps = ParameterServer.open(tmp_path / "ps")
    if point == "flush":  # back at mark 3: ids past it and its change-log segment ignored
        assert ps.version == 3
        np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(3), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(ps.touched("C1"), IDS)
    else:  # the mark _server.json names (the rollback was not decided)
        assert ps.version == 4
    ps.close()


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_a_table_trained_more_steps_than_it_has_rows_reopens(tmp_path, storage):
    """``table_steps`` counts steps, not rows: a 3-row table after 7 steps reopens (the
    check of the mark bounded it by the table's rows) with the rows numpy's adagrad gives."""
    ps = ParameterServer(tmp_path / "ps", [TableConfig("small", 3, 2, ("small",))], storage=storage,
                         seed=3, lr=0.5)
    ids, g = np.array([0, 2]), np.ones((2, 2))
    for _ in range(7):
        ps.apply("small", ids, g.astype(np.float32))
    ps.flush()
    assert ps.table_steps["small"] == 7
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")
    w = initial_rows(3, "small", np.arange(3), 2, 0.05).astype(np.float64)
    state = np.zeros_like(w)
    for _ in range(7):
        _numpy_adagrad(w, state, ids, g, 0.5)
    np.testing.assert_allclose(again.lookup("small", np.arange(3)), w, rtol=1e-5, atol=1e-6)
    assert again.table_steps["small"] == 7
    again.close()


def _change_log_commits(path):
    """The commits of a change log's whole segments, read as its format says: magic
    (8 bytes), commit and count (int64), the ids, the count again."""
    data, out, pos = path.read_bytes(), [], 0
    while pos + 32 <= len(data):
        tag, n = np.frombuffer(data, np.int64, 2, pos + 8)
        end = pos + 24 + 8 * int(n)
        if end + 8 > len(data):
            break
        out.append((int(tag), pos, end + 8))
        pos = end + 8
    return out


@pytest.mark.parametrize("cut", ["inside-the-last", "whole-last", "everything"])
def test_a_change_log_cut_short_is_refused_and_left_as_found(tmp_path, cut):
    """A change log that lost committed segments (cut inside its last one, at a
    segment's end, or emptied) would leave those rows out of every later
    export_delta: open refuses it, naming the file, the field and both commits, and
    changes nothing. A log with an uncommitted segment after the mark still opens."""
    folder = tmp_path / "ps"
    ps = ParameterServer(folder, _tables(), storage="disk", seed=3, lr=0.5)
    for step in range(3):  # three commits, each changing rows
        ps.apply("C1", (IDS + step) % 1000, np.ones((len(IDS), 4), np.float32))
        ps.flush()
    ps.close()
    log = folder / "C1.changes.i64"
    segments = _change_log_commits(log)
    assert [tag for tag, _, _ in segments] == [1, 2, 3]
    keep = {"inside-the-last": segments[-1][2] - 5, "whole-last": segments[-1][1], "everything": 0}[cut]
    with open(log, "r+b") as f:
        f.truncate(keep)
    before = {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != "_lock"}
    last = {"inside-the-last": "commit 2's", "whole-last": "commit 2's", "everything": "no whole segment"}[cut]
    with pytest.raises(DataError, match=rf"C1\.changes\.i64: the last commit \(field 'mark\.changes\.C1' "
                                        rf"of _server\.json\) changed rows in commit 3, but .*{last}"):
        ParameterServer.open(folder)
    assert {p.name: p.read_bytes() for p in folder.iterdir()
            if p.is_file() and p.name != "_lock"} == before


def test_an_uncommitted_change_log_segment_is_dropped_and_the_folder_opens(tmp_path):
    """A flush killed after its change-log segment, before its mark: the segment (of a
    commit after the mark) is ignored and cut, the rows are the mark's."""
    folder = tmp_path / "ps"
    _trained(folder, steps=2)
    log = folder / "C1.changes.i64"
    whole = log.read_bytes()
    # a segment of the next commit appended as a flush would, then no mark for it
    mark = json.loads((folder / "_server.json").read_text())["mark"]["version"]
    extra = whole[:8] + np.array([mark + 1, 2], np.int64).tobytes() \
        + np.array([3, 4], np.int64).tobytes() + np.int64(2).tobytes()
    log.write_bytes(whole + extra)
    ps = ParameterServer.open(folder)
    np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(2), rtol=1e-6)
    assert set(ps.touched("C1").tolist()) == set(IDS.tolist())
    ps.close()
    assert log.read_bytes() == whole


# -- healthy folders the change-log record must not refuse --------------------------
def test_an_upgraded_older_folder_reopens_after_close(tmp_path):
    """Folders of formats 1 and 2 are upgraded by open (their change logs written
    anew); closed without a flush and opened again, they open (the mark records the
    rewritten logs' last commits, not what was there before the upgrade)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_cache_store_format import write_format_1, write_format_2

    for k, writer in enumerate((write_format_1, write_format_2)):
        folder = tmp_path / f"ps{k}"
        writer(folder, np.random.default_rng(k))
        ps = ParameterServer.open(folder)
        rows = ps.lookup(ps.configs[0].name, np.arange(ps.configs[0].cardinality))
        ps.close()
        ps = ParameterServer.open(folder)
        np.testing.assert_array_equal(ps.lookup(ps.configs[0].name, np.arange(ps.configs[0].cardinality)), rows)
        ps.close()


def _fail_next_meta_write(monkeypatch):
    import tabstream.train.cache_store as cache_store

    real = cache_store.write_json_file

    def full_disk(*args, **kwargs):
        monkeypatch.setattr(cache_store, "write_json_file", real)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cache_store, "write_json_file", full_disk)


@pytest.mark.parametrize("then", ["flush", "train-and-flush", "export_delta", "flush-without-rollback"])
def test_a_flush_failed_on_a_full_disk_then_rolled_back_reopens(tmp_path, monkeypatch, then):
    """A flush that wrote its change-log segment and then failed on a full disk
    (``_server.json`` not written), the uncommitted work discarded with
    ``rollback_to(mark)`` (or the flush simply tried again): every later route opens
    again, with the rows numpy computes and the changed rows the log names."""
    folder = tmp_path / "ps"
    ps = ParameterServer(folder, _tables(), storage="disk", seed=3, lr=0.5)
    g = np.ones((len(IDS), 4), np.float32)
    ps.apply("C1", IDS, g)
    ps.flush()                                   # mark 1
    ps.apply("C1", np.array([5, 7, 3]), np.ones((3, 4), np.float32))  # 3 first written here
    _fail_next_meta_write(monkeypatch)
    with pytest.raises(DataError, match="could not commit"):
        ps.flush()
    steps, touched = 1, set(IDS.tolist())
    if then == "flush-without-rollback":
        ps.flush()
        touched |= {3}
    else:
        ps.rollback_to(ps.mark)                  # the failed interval discarded
        if then == "train-and-flush":
            ps.apply("C1", IDS, g)
            ps.flush()
            steps = 2
        elif then == "export_delta":
            ps.export_delta(tmp_path / "delta")
        else:
            ps.flush()
    ps.close()
    ps = ParameterServer.open(folder)
    assert set(ps.touched("C1").tolist()) == touched
    if then != "flush-without-rollback":
        np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(steps), rtol=1e-6)
    ps.close()


def test_a_rollback_killed_in_a_folder_whose_previous_mark_predates_the_record(tmp_path):
    """A folder whose marks were written before ``mark.changes`` existed, opened by
    this version (which records it from then on), and a rollback to the previous mark
    killed right after the change log was cut: open finishes the rollback."""
    folder = tmp_path / "ps"
    _trained(folder, steps=1)                    # mark 1
    ps = ParameterServer.open(folder)
    ps.apply("C1", IDS, np.ones((len(IDS), 4), np.float32))
    ps.flush()                                   # mark 2, previous 1
    ps.close()

    def strip(meta):
        for key in ("mark", "previous"):
            meta[key].pop("changes", None)       # as the older version wrote them
    _edit_meta(folder, strip)
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import tabstream.train.cache_store as cs
        ps = cs.ParameterServer.open({str(folder)!r})
        real = cs._keep_segments
        def cut_then_die(path, upto):
            real(path, upto)
            os.kill(os.getpid(), signal.SIGKILL)
        cs._keep_segments = cut_then_die
        ps.rollback_to(1)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    ps = ParameterServer.open(folder)
    assert ps.mark == 1
    np.testing.assert_allclose(ps.lookup("C1", ALL), _expected(1), rtol=1e-6)
    ps.close()

"""ParameterServer storage format 3 (records packed in slots, an id per slot, a
change log) and the upgrade in place by ``open`` of a format-1 folder (three files
per table) and of a format-2 folder (a record at ``id * width``, a sparse file).

The old folders are written here by hand, byte by byte as those formats laid them
out, so the tests do not depend on old code; the expected rows are plain numpy.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer, initial_rows
from tabstream.train.tables import TableConfig

ROWS, DIM = 5000, 4


def _table_dict(name, rows, dim):
    return {"name": name, "cardinality": rows, "dim": dim, "feature_names": [name],
            "is_list": False, "combiner": "sum"}



def _write_old_meta(folder, fmt: int) -> None:
    """The ``_server.json`` of a hand-written format-``fmt`` folder: marked at version 5,
    the previous mark at 4."""
    mark = {"version": 5, "table_steps": {"t": 5}, "last_export": 3, "vocabulary_delta": 0}
    previous = {"version": 4, "table_steps": {"t": 4}, "last_export": 3, "vocabulary_delta": 0}
    meta = {"format": f"tabstream.ParameterServer/{fmt}", "storage": "disk", "seed": 0,
            "optimizer": "adagrad", "lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-10,
            "init_scale": 0.05, "tables": [_table_dict("t", ROWS, DIM)], "mark": mark,
            "previous": previous}
    (folder / "_server.json").write_text(json.dumps(meta))

def write_format_1(folder, rng):
    """A format-1 adagrad server of one table: rows touched at versions 1..6, the
    mark at 5 (last export at 3, previous mark 4), and an undo log after the mark
    holding the committed values of the rows version 6 changed (a crash after
    that update). Returns the committed ``(weight, state, version)`` arrays."""
    folder.mkdir()
    w = np.zeros((ROWS, DIM), np.float32)
    s = np.zeros((ROWS, DIM), np.float32)
    v = np.zeros(ROWS, np.int64)
    ids = {k: np.sort(rng.choice(ROWS, 40, replace=False)) for k in range(1, 6)}
    for version, rows in ids.items():
        w[rows] = rng.normal(size=(len(rows), DIM))
        s[rows] = rng.random((len(rows), DIM))
        v[rows] = version
    committed = (w.copy(), s.copy(), v.copy())
    # version 6, not committed: some rows changed, their old values in the undo log
    changed = np.sort(np.concatenate([ids[5][:5], ids[1][:5], [ROWS - 1]]))
    old_w, old_s, old_v = w[changed].copy(), s[changed].copy(), v[changed].copy()
    w[changed] += 1.0
    s[changed] += 1.0
    v[changed] = 6
    body = b"".join([np.int64(0).tobytes(), np.int64(len(changed)).tobytes(),
                     changed.astype(np.int64).tobytes(), old_w.tobytes(), old_s.tobytes(),
                     old_v.tobytes()])
    (folder / "_undo").mkdir()
    (folder / "_undo" / f"from_{5:012d}.log").write_bytes(
        b"TSUNDO01" + body + np.int64(len(body)).tobytes())
    # sparse files of the full size, as format 1 made them
    for suffix, arr in (("weight.f32", w), ("state.f32", s), ("version.i64", v)):
        arr.tofile(folder / f"t.{suffix}")
    _write_old_meta(folder, 1)
    return committed


@pytest.mark.parametrize("seed", [0, 1])
def test_a_format_1_folder_is_upgraded_in_place_at_its_last_commit(tmp_path, seed):
    w, s, v = write_format_1(tmp_path / "ps", np.random.default_rng(seed))
    ps = ParameterServer.open(tmp_path / "ps")
    ids = np.arange(ROWS)
    fresh = v == 0
    expected = w.copy()
    expected[fresh] = initial_rows(0, "t", ids[fresh], DIM, 0.05)
    np.testing.assert_array_equal(ps.lookup("t", ids), expected)
    np.testing.assert_array_equal(ps.optimizer_state("t", ids), s)
    np.testing.assert_array_equal(ps.touched("t"), np.flatnonzero(v))
    assert (ps.version, ps.mark, ps.previous_mark, ps.last_export) == (5, 5, 4, 3)
    names = sorted(p.name for p in (tmp_path / "ps").iterdir())
    assert "t.weight.f32" not in names and "t.version.i64" not in names
    assert json.loads((tmp_path / "ps" / "_server.json").read_text())["format"] == \
        "tabstream.ParameterServer/3"
    # the export after the upgrade holds exactly the rows changed after the last one (3)
    ps.export_delta(tmp_path / "d")
    got = pd.read_parquet(tmp_path / "d" / "t").sort_values("key")
    np.testing.assert_array_equal(got["key"], np.flatnonzero(v > 3))
    np.testing.assert_array_equal(np.stack(got["value"].to_numpy()), w[v > 3])
    # training goes on; the previous mark's rollback still tells version 5's rows apart
    ps.apply("t", [7, 8], np.ones((2, DIM), np.float32))
    ps.flush()
    ps.rollback_to(5)
    np.testing.assert_array_equal(ps.lookup("t", ids), expected)
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")  # format 3 now: opens as it is
    np.testing.assert_array_equal(again.lookup("t", ids), expected)
    again.close()


def test_an_unknown_format_is_refused_naming_the_fix(tmp_path):
    ParameterServer(tmp_path / "ps", [TableConfig("t", 10, 2, ("t",))]).close()
    meta = json.loads((tmp_path / "ps" / "_server.json").read_text())
    meta["format"] = "tabstream.ParameterServer/9"
    (tmp_path / "ps" / "_server.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"format 'tabstream.ParameterServer/9', expected "
                                        r"'tabstream.ParameterServer/3' \(or 'tabstream.Parameter"
                                        r"Server/2' or 'tabstream.ParameterServer/1', which "
                                        r"open\(\) upgrades in place\)") as info:
        ParameterServer.open(tmp_path / "ps")
    assert "open it with the tabstream version that wrote it" in info.value.hint


def test_a_format_1_folder_missing_a_file_is_refused(tmp_path):
    write_format_1(tmp_path / "ps", np.random.default_rng(0))
    (tmp_path / "ps" / "t.state.f32").unlink()
    with pytest.raises(DataError, match=r"format 'tabstream.ParameterServer/1'\) lacks "
                                        r"t.state.f32 or has it at another size"):
        ParameterServer.open(tmp_path / "ps")


def _segment(tag, ids):
    ids = np.asarray(ids, np.int64)
    return (b"TSCHG001" + np.array([tag, len(ids)], np.int64).tobytes() + ids.tobytes()
            + np.int64(len(ids)).tobytes())


def _undo_record(ids, w, s, v):
    body = b"".join([np.int64(0).tobytes(), np.int64(len(ids)).tobytes(),
                     np.asarray(ids, np.int64).tobytes(), w.tobytes(), s.tobytes(),
                     np.asarray(v, np.int64).tobytes()])
    return b"TSUNDO01" + body + np.int64(len(body)).tobytes()


def write_format_2(folder, rng):
    """A format-2 adagrad server of one table: a record of 10 float32 per row at
    ``id * 10`` (weight 4, state 4, version as int64), updates at versions 1..6,
    one change-log segment per commit 1..5, the mark at 5 (previous mark 4, last
    export 3), the undo log of the interval (4, 5] and the one after the mark (a
    crash after version 6). Returns the ``(weight, state, version)`` arrays at
    marks 4 and 5."""
    folder.mkdir()
    w = np.zeros((ROWS, DIM), np.float32)
    s = np.zeros((ROWS, DIM), np.float32)
    v = np.zeros(ROWS, np.int64)
    (folder / "_undo").mkdir()
    changes, states = b"", {}
    for version in range(1, 7):
        rows = np.sort(rng.choice(ROWS, 40, replace=False))
        if version == 6:
            rows = np.union1d(rows, [ROWS - 1])
        if version >= 5:  # the undo log of the interval this update opens
            (folder / "_undo" / f"from_{version - 1:012d}.log").write_bytes(
                _undo_record(rows, w[rows], s[rows], v[rows]))
        w[rows] = rng.normal(size=(len(rows), DIM))
        s[rows] = rng.random((len(rows), DIM))
        v[rows] = version
        if version <= 5:
            changes += _segment(version, rows)
            states[version] = (w.copy(), s.copy(), v.copy())
    records = np.zeros((ROWS, 10), np.float32)
    records[:, :DIM], records[:, DIM:2 * DIM] = w, s
    records[:, 8:] = v.reshape(-1, 1).view(np.float32)
    records.tofile(folder / "t.rows.f32")
    (folder / "t.changes.i64").write_bytes(changes)
    _write_old_meta(folder, 2)
    return states[4], states[5]


def _expected_rows(w, v):
    out = w.copy()
    fresh = v == 0
    out[fresh] = initial_rows(0, "t", np.flatnonzero(fresh), DIM, 0.05)
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_a_format_2_folder_is_upgraded_in_place_at_its_last_commit(tmp_path, seed):
    (w4, s4, v4), (w5, s5, v5) = write_format_2(tmp_path / "ps", np.random.default_rng(seed))
    ps = ParameterServer.open(tmp_path / "ps")
    ids = np.arange(ROWS)
    np.testing.assert_array_equal(ps.lookup("t", ids), _expected_rows(w5, v5))
    np.testing.assert_array_equal(ps.optimizer_state("t", ids), s5)
    np.testing.assert_array_equal(ps.touched("t"), np.flatnonzero(v5))
    assert (ps.version, ps.mark, ps.previous_mark, ps.last_export) == (5, 5, 4, 3)
    names = sorted(p.name for p in (tmp_path / "ps").iterdir())
    assert "t.rows.f32" not in names and "t.slots.f32" in names
    assert json.loads((tmp_path / "ps" / "_server.json").read_text())["format"] == \
        "tabstream.ParameterServer/3"
    # the slot file holds the rows ever written, nothing for the others
    assert os.stat(tmp_path / "ps" / "t.slots.f32").st_blocks * 512 < 1 << 20
    ps.export_delta(tmp_path / "d")
    got = pd.read_parquet(tmp_path / "d" / "t").sort_values("key")
    np.testing.assert_array_equal(got["key"], np.flatnonzero(v5 > 3))
    np.testing.assert_array_equal(np.stack(got["value"].to_numpy()), w5[v5 > 3])
    ps.close()
    # the previous mark's undo log still takes the server back to version 4, rows
    # first written in (4, 5] included (they read as never written again)
    ps = ParameterServer.open(tmp_path / "ps")
    ps.apply("t", [7, 8], np.ones((2, DIM), np.float32))
    ps.rollback_to(4)
    np.testing.assert_array_equal(ps.lookup("t", ids), _expected_rows(w4, v4))
    np.testing.assert_array_equal(ps.optimizer_state("t", ids), s4)
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_array_equal(again.lookup("t", ids), _expected_rows(w4, v4))
    again.close()


def test_a_format_2_folder_with_a_short_file_is_refused(tmp_path):
    write_format_2(tmp_path / "ps", np.random.default_rng(0))
    with open(tmp_path / "ps" / "t.rows.f32", "r+b") as f:
        f.truncate(400)
    with pytest.raises(DataError, match=r"format 'tabstream.ParameterServer/2'\) lacks "
                                        r"t.rows.f32 or has it at another size \(expected "
                                        r"200000 bytes\); it cannot be upgraded"):
        ParameterServer.open(tmp_path / "ps")


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_rows_read_ahead_are_never_stale(tmp_path, storage):
    """Rows read ahead, then written (an update, a reset), then looked up: the
    lookup answers the written values; rows read ahead and not written come
    from the reading, equal to a plain lookup."""
    ps = ParameterServer(tmp_path / "ps", [TableConfig("t", 1000, 4, ("t",))], storage=storage)
    ps.apply("t", [1, 2, 3], np.ones((3, 4), np.float32))
    ids = np.array([1, 2, 3, 500, 999])
    ps.read_ahead("t", ids)
    new = ps.apply("t", [2, 500], np.full((2, 4), 0.5, np.float32))
    ps.apply_vocabulary_delta({"t": [3]})
    got = ps.lookup("t", ids)
    np.testing.assert_array_equal(got[[1, 3]], new)
    np.testing.assert_array_equal(got[2], initial_rows(0, "t", np.array([3]), 4, 0.05)[0])
    ps.read_ahead("t", ids)
    ps.flush()  # a commit in between waits for the reading and drops it
    np.testing.assert_array_equal(ps.lookup("t", ids), got)
    ps.read_ahead("t", ids)
    np.testing.assert_array_equal(ps.lookup("t", ids), got)
    ps.read_ahead("t", [4])
    ps.close()  # waits for the reading

"""ParameterServer storage format 2 (one record per row, a change log) and the
upgrade of a format-1 folder (three files per table) in place by ``open``.

The format-1 folder is written here by hand, byte by byte as that format laid it
out, so the test does not depend on old code; the expected rows are plain numpy.
"""

from __future__ import annotations

import json

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
    mark = {"version": 5, "table_steps": {"t": 5}, "last_export": 3, "vocabulary_delta": 0}
    previous = {"version": 4, "table_steps": {"t": 4}, "last_export": 3, "vocabulary_delta": 0}
    meta = {"format": "tabstream.ParameterServer/1", "storage": "disk", "seed": 0,
            "optimizer": "adagrad", "lr": 0.1, "betas": [0.9, 0.999], "eps": 1e-10,
            "init_scale": 0.05, "tables": [_table_dict("t", ROWS, DIM)], "mark": mark,
            "previous": previous}
    (folder / "_server.json").write_text(json.dumps(meta))
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
        "tabstream.ParameterServer/2"
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
    again = ParameterServer.open(tmp_path / "ps")  # format 2 now: opens as it is
    np.testing.assert_array_equal(again.lookup("t", ids), expected)
    again.close()


def test_an_unknown_format_is_refused_naming_the_fix(tmp_path):
    ParameterServer(tmp_path / "ps", [TableConfig("t", 10, 2, ("t",))]).close()
    meta = json.loads((tmp_path / "ps" / "_server.json").read_text())
    meta["format"] = "tabstream.ParameterServer/9"
    (tmp_path / "ps" / "_server.json").write_text(json.dumps(meta))
    with pytest.raises(DataError, match=r"format 'tabstream.ParameterServer/9', expected "
                                        r"'tabstream.ParameterServer/2' \(or 'tabstream.Parameter"
                                        r"Server/1', which open\(\) upgrades in place\)") as info:
        ParameterServer.open(tmp_path / "ps")
    assert "open it with the tabstream version that wrote it" in info.value.hint


def test_a_format_1_folder_missing_a_file_is_refused(tmp_path):
    write_format_1(tmp_path / "ps", np.random.default_rng(0))
    (tmp_path / "ps" / "t.state.f32").unlink()
    with pytest.raises(DataError, match=r"format 'tabstream.ParameterServer/1'\) lacks "
                                        r"t.state.f32 or has it at another size"):
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

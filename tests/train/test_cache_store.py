"""ParameterServer without any framework: lazy init, optimizer rules against a
plain numpy re-implementation, persistence, crash safety, prefetch and export_delta."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tabstream.core.errors import DataError, SchemaError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig

ROOT = Path(__file__).resolve().parents[2]


def configs(card=1000, dim=4):
    return [TableConfig("C1", card, dim, ("C1",)), TableConfig("C2", 50, 2, ("C2", "C3"))]


@pytest.mark.parametrize("storage", ["disk", "memory"])
@pytest.mark.parametrize("seed", [0, 7])
def test_initial_rows_are_a_function_of_seed_table_row(tmp_path, storage, seed):
    ps = ParameterServer(tmp_path / "ps", configs(), storage=storage, seed=seed)
    a = ps.lookup("C1", [3, 999, 3])
    assert a.dtype == np.float32 and a.shape == (3, 4)
    np.testing.assert_array_equal(a[0], a[2])
    assert np.all(np.abs(a) <= 0.05)
    other = ParameterServer(tmp_path / "ps2", configs(), storage=storage, seed=seed + 1)
    assert not np.array_equal(other.lookup("C1", [3]), a[:1])
    # each row alone, in any order, gives the same values
    np.testing.assert_array_equal(ps.lookup("C1", [999])[0], a[1])
    # values are spread over the whole range, not constant
    many = ps.lookup("C1", np.arange(1000))
    assert many.std() == pytest.approx(0.05 / np.sqrt(3), rel=0.1)


def test_disk_files_are_sparse_until_rows_are_touched(tmp_path):
    ps = ParameterServer(tmp_path / "ps", configs(card=2_000_000, dim=16), storage="disk")
    ps.lookup("C1", np.arange(0, 2_000_000, 997))
    ps.apply("C1", [5, 1_999_999], np.ones((2, 16), np.float32))
    ps.flush()
    # one record per row: weight (16), adagrad state (16), version (2 float32 slots)
    st = os.stat(tmp_path / "ps" / "C1.slots.f32")
    assert st.st_size == 2_000_000 * (16 + 16 + 2) * 4
    assert st.st_blocks * 512 < 1 << 20  # a few pages, not 272 MB


def numpy_adagrad(w, s, ids, g, lr, eps):
    uniq = np.unique(ids)
    gs = np.stack([g[ids == u].sum(0) for u in uniq])
    s[uniq] += gs * gs
    w[uniq] -= lr * gs / (np.sqrt(s[uniq]) + eps)


def numpy_adam(w, m, v, ids, g, lr, b1, b2, eps, t):
    uniq = np.unique(ids)
    gs = np.stack([g[ids == u].sum(0) for u in uniq])
    m[uniq] = b1 * m[uniq] + (1 - b1) * gs
    v[uniq] = b2 * v[uniq] + (1 - b2) * gs * gs
    mhat, vhat = m[uniq] / (1 - b1**t), v[uniq] / (1 - b2**t)
    w[uniq] -= lr * mhat / (np.sqrt(vhat) + eps)


@pytest.mark.parametrize("storage", ["disk", "memory"])
@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_apply_matches_the_textbook_rule_and_touches_only_its_rows(tmp_path, storage, optimizer):
    rng = np.random.default_rng(3)
    ps = ParameterServer(tmp_path / "ps", configs(card=40), storage=storage, optimizer=optimizer, lr=0.1)
    w = ps.lookup("C1", np.arange(40)).astype(np.float64)
    s = np.zeros((40, 4))
    m, v = np.zeros((40, 4)), np.zeros((40, 4))
    for t in range(1, 6):
        ids = rng.integers(0, 10, 12)  # duplicates in every step; rows 10.. never touched
        g = rng.normal(size=(12, 4)).astype(np.float32)
        new = ps.apply("C1", ids, g)
        if optimizer == "adagrad":
            numpy_adagrad(w, s, ids, g.astype(np.float64), 0.1, 1e-10)
        else:
            numpy_adam(w, m, v, ids, g.astype(np.float64), 0.1, 0.9, 0.999, 1e-8, t)
        np.testing.assert_allclose(new, w[np.unique(ids)], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ps.lookup("C1", np.arange(40)), w, rtol=1e-5, atol=1e-6)
    state = ps.optimizer_state("C1", np.arange(40))
    expected_state = s if optimizer == "adagrad" else np.concatenate([m, v], axis=1)
    np.testing.assert_allclose(state, expected_state, rtol=1e-5, atol=1e-7)
    assert not state[10:].any()  # optimizer state only for touched rows
    assert set(ps.touched("C1")) == set(range(10)) & set(ps.touched("C1"))


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_open_restores_rows_state_and_settings_after_flush(tmp_path, storage):
    ps = ParameterServer(tmp_path / "ps", configs(), storage=storage, optimizer="adam", lr=0.05, seed=3)
    ps.apply("C1", [1, 2], np.ones((2, 4), np.float32))
    ps.apply("C2", [4], np.ones((1, 2), np.float32))
    ps.flush()
    rows, state = ps.lookup("C1", [1, 2, 3]), ps.optimizer_state("C1", [1, 2, 3])
    ps.apply("C1", [1], np.ones((1, 4), np.float32))  # not committed: rolled back on open
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")
    assert (again.optimizer, again.lr, again.seed, again.storage) == ("adam", 0.05, 3, storage)
    np.testing.assert_array_equal(again.lookup("C1", [1, 2, 3]), rows)
    np.testing.assert_array_equal(again.optimizer_state("C1", [1, 2, 3]), state)
    assert again.table_steps == {"C1": 1, "C2": 1}
    assert list(again.touched("C1")) == [1, 2]


def test_bad_inputs_are_refused_with_clear_messages(tmp_path):
    with pytest.raises(ValueError, match="storage must be one of"):
        ParameterServer(tmp_path / "a", configs(), storage="ssd")
    with pytest.raises(ValueError, match="optimizer must be one of"):
        ParameterServer(tmp_path / "a", configs(), optimizer="sgd")
    with pytest.raises(TypeError, match="TableConfig objects, got dict"):
        ParameterServer(tmp_path / "a", [{"name": "C1"}])
    ps = ParameterServer(tmp_path / "ps", configs())
    with pytest.raises(DataError, match="already holds a parameter server"):
        ParameterServer(tmp_path / "ps", configs())
    with pytest.raises(ValueError, match=r"table 'C1': id 1000 is out of range; the table has 1000 rows"):
        ps.lookup("C1", [3, 1000])
    with pytest.raises(TypeError, match="ids must be integers, got dtype float64"):
        ps.lookup("C1", [1.5])
    with pytest.raises(SchemaError, match="has no table 'C9'"):
        ps.lookup("C9", [1])
    with pytest.raises(ValueError, match="gradients have 3 columns, the table's dim is 4"):
        ps.apply("C1", [1], np.ones((1, 3)))
    with pytest.raises(DataError, match="holds no parameter server"):
        ParameterServer.open(tmp_path / "nothing")
    ps.close()  # the folder is locked while open
    (tmp_path / "ps" / "C1.slots.f32").write_bytes(b"\0" * 10)
    with pytest.raises(DataError, match=r"C1.slots.f32 has 10 bytes, expected 40000 \(1000 "
                                        r"records of 10 float32\)"):
        ParameterServer.open(tmp_path / "ps")


def test_export_delta_holds_exactly_the_rows_updated_since_the_last_export(tmp_path):
    ps = ParameterServer(tmp_path / "ps", configs(), storage="disk", lr=0.1)
    ps.apply("C1", [5, 9, 5], np.ones((3, 4), np.float32))
    first = ps.export_delta(tmp_path / "d1")
    assert first == {"C1": 2, "C2": 0}
    at_first = {"C1": ps.lookup("C1", [5, 9])}
    ps.apply("C1", [9, 11], np.ones((2, 4), np.float32))
    ps.apply("C2", [0], np.ones((1, 2), np.float32))
    ps.export_delta(tmp_path / "d2")
    at_second = {"C1": ps.lookup("C1", [9, 11]), "C2": ps.lookup("C2", [0])}
    for d, table, keys, rows in [("d1", "C1", [5, 9], at_first["C1"]),
                                 ("d2", "C1", [9, 11], at_second["C1"]),
                                 ("d2", "C2", [0], at_second["C2"]), ("d1", "C2", [], None)]:
        df = pd.read_parquet(tmp_path / d / table)
        assert list(df["key"]) == keys
        assert str(df["key"].dtype) == "int64"
        if keys:
            np.testing.assert_array_equal(np.stack(df["value"].to_numpy()), rows)
    import pyarrow.parquet as pq
    schema = pq.read_schema(tmp_path / "d2" / "C1" / "part_00000.parquet")
    assert str(schema.field("value").type) == "list<element: float>"
    with pytest.raises(DataError, match="d2 already exists; each export goes to a new folder"):
        ps.export_delta(tmp_path / "d2")


def test_prefetch_reads_keysets_of_an_export(tmp_path):
    import tabstream as ts
    from tabstream import ops

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"C1": rng.integers(0, 30, 200), "C2": rng.integers(0, 9, 200)})
    wf = ts.Workflow(["C1", "C2"] >> ops.Categorify())
    ds = ts.Dataset(df)
    wf.fit(ds)
    wf.transform(ds).to_parquet(str(tmp_path / "day0"), num_files=2, write_keysets=True)
    out = pd.read_parquet(tmp_path / "day0")
    cards = wf.output_schema
    ps = ParameterServer(tmp_path / "ps", [
        TableConfig("C1", cards["C1"].cardinality, 4, ("C1",)),
        TableConfig("C2", cards["C2"].cardinality, 2, ("C2",)),
    ])
    seen = {}
    ps.attach(lambda event, table, ids, rows: seen.update({table: (list(ids), rows)}))
    staged = ps.prefetch(tmp_path / "day0")
    assert staged == {"C1": out["C1"].nunique(), "C2": out["C2"].nunique()}
    assert seen["C1"][0] == sorted(out["C1"].unique())
    np.testing.assert_array_equal(seen["C1"][1], ps.lookup("C1", seen["C1"][0]))
    # a mapping works too; a feature name is mapped to its table
    assert ps.prefetch({"C2": [1, 1, 2], "unknown": [5]}) == {"C2": 2}
    with pytest.raises(FileNotFoundError, match="keyset file or folder .*nope does not exist"):
        ps.prefetch(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no keyset files"):
        ps.prefetch(tmp_path / "empty")


def _run_steps(ps, n_steps):
    rng = np.random.default_rng(0)
    for _ in range(n_steps):
        ids = rng.integers(0, 200_000, 20_000)
        ps.apply("C1", ids, rng.normal(size=(20_000, 8)).astype(np.float32))


_TRAINER = textwrap.dedent("""
    import sys, numpy as np
    from tabstream.train.cache_store import ParameterServer
    from tabstream.train.tables import TableConfig
    ps = ParameterServer(sys.argv[1], [TableConfig("C1", 200_000, 8, ("C1",))], optimizer="adam")
    rng = np.random.default_rng(0)
    step = 0
    while True:
        step += 1
        ids = rng.integers(0, 200_000, 20_000)
        ps.apply("C1", ids, rng.normal(size=(20_000, 8)).astype(np.float32))
        if step % 3 == 0:
            print(ps.flush(), flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.05, 0.23])
def test_kill_9_during_training_reopens_at_a_committed_step(tmp_path, delay):
    script = tmp_path / "trainer.py"
    script.write_text(_TRAINER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    with subprocess.Popen([sys.executable, str(script), str(tmp_path / "ps")],
                          stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            committed = [int(proc.stdout.readline()) for _ in range(2)]
            time.sleep(delay)  # somewhere inside a later step or commit
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    ps = ParameterServer.open(tmp_path / "ps")
    assert ps.version % 3 == 0 and ps.version >= committed[-1]
    # the same steps replayed in memory, by a second server: equal rows and state
    expected = ParameterServer(tmp_path / "mem", ps.configs, storage="memory", optimizer="adam")
    _run_steps(expected, ps.version)
    ids = np.arange(200_000)
    np.testing.assert_array_equal(ps.lookup("C1", ids), expected.lookup("C1", ids))
    np.testing.assert_array_equal(ps.optimizer_state("C1", ids), expected.optimizer_state("C1", ids))
    np.testing.assert_array_equal(ps.touched("C1"), expected.touched("C1"))


_EXPORTER = textwrap.dedent("""
    import sys, numpy as np
    from pathlib import Path
    from tabstream.train.cache_store import ParameterServer
    from tabstream.train.tables import TableConfig
    ps = ParameterServer(sys.argv[1], [TableConfig("C1", 100_000, 8, ("C1",)),
                                       TableConfig("C2", 1000, 4, ("C2",))])
    rng = np.random.default_rng(0)
    k = 0
    while True:
        for _ in range(2):
            ps.apply("C1", rng.integers(0, 100_000, 5000), rng.normal(size=(5000, 8)))
            ps.apply("C2", rng.integers(0, 1000, 500), rng.normal(size=(500, 4)))
        ps.export_delta(Path(sys.argv[2]) / f"d{k:04d}")
        k += 1
        print(k, flush=True)
""")


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.11])
def test_kill_9_during_exports_leaves_complete_chained_deltas(tmp_path, delay):
    import json

    script = tmp_path / "exporter.py"
    script.write_text(_EXPORTER)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    deltas = tmp_path / "deltas"
    with subprocess.Popen([sys.executable, str(script), str(tmp_path / "ps"), str(deltas)],
                          stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            for _ in range(3):
                proc.stdout.readline()
            time.sleep(delay)
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    ps = ParameterServer.open(tmp_path / "ps")
    ps.apply("C1", [1], np.ones((1, 8), np.float32))
    ps.export_delta(deltas / "zfinal")
    done = sorted(d for d in deltas.iterdir() if not d.name.startswith("."))
    chain = [json.loads((d / "_delta.json").read_text()) for d in done]
    # every visible folder is complete, and consecutive exports neither overlap nor miss
    assert chain[0]["from_version"] == 0
    for before, after in zip(chain, chain[1:]):
        assert after["from_version"] == before["to_version"]
    for d, info in zip(done, chain):
        for table, rows in info["rows"].items():
            keys = pd.read_parquet(d / table)["key"]
            assert len(keys) == rows and keys.is_unique
    # all rows ever updated are in some delta; the last delta's values are the server's
    for table in ("C1", "C2"):
        exported = pd.concat(pd.read_parquet(d / table) for d in done).drop_duplicates("key", keep="last")
        assert sorted(exported["key"]) == list(ps.touched(table))
        np.testing.assert_array_equal(np.stack(exported.sort_values("key")["value"].to_numpy()),
                                      ps.lookup(table, ps.touched(table)))


def _rss_kb(kind):
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith(kind)).split()[1])


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("storage,kind", [("memory", "RssAnon"), ("disk", "RssFile")])
def test_resident_memory_follows_touched_rows_not_the_table(tmp_path, storage, kind):
    rows, dim, touched = 10_000_000, 16, 2000
    ps = ParameterServer(tmp_path / "ps", [TableConfig("C1", rows, dim, ("C1",))], storage=storage,
                         release_bytes=8 << 20)
    ids = np.random.default_rng(0).choice(rows, touched, replace=False)
    before = _rss_kb(kind)
    for part in np.array_split(ids, 10):
        ps.apply("C1", part, np.ones((len(part), dim), np.float32))
    grown_mb = (_rss_kb(kind) - before) / 1024
    table_mb = rows * dim * 4 * 2 / 2**20  # weights + adagrad state: 1,220 MB
    # about 3 pages of 4 KB per touched row (weight, state, version) at most
    assert grown_mb < touched * 3 * 4 / 1024 + 16, (grown_mb, table_mb)
    np.testing.assert_array_equal(ps.touched("C1"), np.sort(ids))


_NEW_ROWS_THEN_KILLED = textwrap.dedent("""
    import os, signal, sys, numpy as np
    from tabstream.train.cache_store import ParameterServer
    from tabstream.train.tables import TableConfig
    ps = ParameterServer(sys.argv[1], [TableConfig("C1", 1000, 4, ("C1",))], lr=0.1)
    ps.apply("C1", [3, 500, 999], np.ones((3, 4), np.float32))
    ps.flush()
    # after the mark: rows 3 and 999 rewritten, rows 10 and 20 new (slots after the mark's)
    ps.apply("C1", [3, 10, 20, 999], np.full((4, 4), 2.0, np.float32))
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_rows_first_written_after_the_mark_go_with_their_slots_on_reopen(tmp_path):
    """kill -9 after new rows were appended past the committed slots: the reopened
    server has the committed rows, the new ones read as never written; rows written
    next take those slots again and commit as they should."""
    script = tmp_path / "killed.py"
    script.write_text(_NEW_ROWS_THEN_KILLED)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "ps")], capture_output=True,
                         text=True, env=dict(os.environ, PYTHONPATH=str(ROOT)), timeout=120)
    assert out.returncode == -signal.SIGKILL, out.stderr
    w = ParameterServer(tmp_path / "ref", configs(), storage="memory").lookup("C1", np.arange(1000))
    s = np.zeros_like(w)
    numpy_adagrad(w, s, np.array([3, 500, 999]), np.ones((3, 4), np.float32), 0.1, 1e-10)
    ids = np.arange(1000)
    ps = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_array_equal(ps.lookup("C1", ids), w)
    np.testing.assert_array_equal(ps.optimizer_state("C1", ids), s)
    np.testing.assert_array_equal(ps.touched("C1"), [3, 500, 999])
    ps.apply("C1", [20, 40, 500], np.full((3, 4), 3.0, np.float32))
    numpy_adagrad(w, s, np.array([20, 40, 500]), np.full((3, 4), 3.0, np.float32), 0.1, 1e-10)
    ps.flush()
    ps.close()
    again = ParameterServer.open(tmp_path / "ps")
    np.testing.assert_allclose(again.lookup("C1", ids), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(again.optimizer_state("C1", ids), s, rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(again.touched("C1"), [3, 20, 40, 500, 999])
    # five rows ever written: five records of 10 float32 and five ids, nothing for 10
    assert np.fromfile(tmp_path / "ps" / "C1.slots.i64", np.int64)[:5].tolist() == [3, 500, 999,
                                                                                    20, 40]
    again.close()


def test_without_posix_fallocate_blocks_are_taken_by_writing_zeros(tmp_path, monkeypatch):
    """Where os has no posix_fallocate (macOS), the slots' blocks are written as
    zeros: the rows are those of a memory server given the same updates."""
    monkeypatch.delattr(os, "posix_fallocate")
    ps = ParameterServer(tmp_path / "ps", configs(card=100_000, dim=4), storage="disk")
    ref = ParameterServer(tmp_path / "ref", configs(card=100_000, dim=4), storage="memory")
    rng = np.random.default_rng(0)
    for _ in range(3):
        ids = rng.integers(0, 100_000, 3000)
        grads = rng.normal(size=(3000, 4)).astype(np.float32)
        ps.apply("C1", ids, grads)
        ref.apply("C1", ids, grads)
    ps.flush()
    st = os.stat(tmp_path / "ps" / "C1.slots.f32")
    assert 0 < st.st_blocks * 512 < 1 << 20  # ~8,000 rows of 40 bytes, in 256 kB chunks
    ps.close()
    ps = ParameterServer.open(tmp_path / "ps")
    ids = np.arange(100_000)
    np.testing.assert_array_equal(ps.lookup("C1", ids), ref.lookup("C1", ids))
    np.testing.assert_array_equal(ps.optimizer_state("C1", ids), ref.optimizer_state("C1", ids))
    ps.close()

"""``ParameterServer.rollback_to(previous mark)`` killed at every step: the folder
reopens fully at the last mark or fully at the previous one (the rollback finished by
``open``), never with rows of both.

The kills are real: a forked child trains a disk server over two commits, saves what
the server answers at each (every row, optimizer state, version, touched ids) to an
``.npz`` before any rollback, trains on without committing, and calls
``rollback_to(previous)``; a hook in the child sends it SIGKILL before the k-th call
of any function a rollback changes the folder with (row restores, syncs, slot cuts,
change-log rewrites, ``_server.json`` writes, renames, deletions, fsyncs). For every
k the parent reopens the folder and compares everything with the saved answers
(rows a replayed vocabulary reset starts over: ``initial_rows`` and zero state).

A Hypothesis state machine then mixes such kills (at a drawn step) with training,
resets, commits, rollbacks and plain crashes, against a numpy adagrad reference.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import traceback
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import tabstream.train.cache_store as cs
from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer, initial_rows
from tabstream.train.tables import TableConfig

TABLES = [TableConfig("a", 48, 3, ("a",)), TableConfig("b", 32, 2, ("b",))]
ROWS = {c.name: c.cardinality for c in TABLES}
SEED, LR, SCALE = 7, 0.1, 0.05
RESET_A, RESET_B = [3, 12, 25], [5]  # committed in (previous, last]; made after last

# what a rollback changes the folder with: a kill before any call of one of these
_STEPS = [(cs, "write_json_file"), (cs, "sync_folder"), (cs, "_keep_segments"),
          (cs, "_append_segment"), (cs._Table, "restore"), (cs._Table, "sync"),
          (cs._Table, "cut"), (cs._Table, "write"), (ParameterServer, "_log"),
          (Path, "unlink"), (os, "fsync"), (os, "replace")]


def _kill_before_call(k: int, counted: list[int]) -> None:
    """In this (child) process only: SIGKILL before the ``k``-th call of ``_STEPS``
    (counting from 0; ``counted[0]``: the calls so far)."""
    for owner, name in _STEPS:
        real = getattr(owner, name)

        def hooked(*args, _real=real, **kwargs):
            if counted[0] == k:
                os.kill(os.getpid(), signal.SIGKILL)
            counted[0] += 1
            return _real(*args, **kwargs)

        setattr(owner, name, hooked)


def _in_child(work, log: Path) -> int:
    """Run ``work()`` in a forked process; its wait status (a traceback goes to ``log``)."""
    with warnings.catch_warnings():  # fork of a process with threads (Python 3.12+)
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            work()
            code = 0
        except BaseException:
            log.write_text(traceback.format_exc())
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


def _killed(status: int, log: Path) -> None:
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (
        f"child status {status}: " + (log.read_text() if log.exists() else "no traceback"))


def _answers(ps: ParameterServer) -> dict[str, np.ndarray]:
    """Everything the server answers about its rows."""
    out = {"version": np.array(ps.version),
           "previous": np.array(-1 if ps.previous_mark is None else ps.previous_mark)}
    for cfg in ps.configs:
        ids = np.arange(cfg.cardinality)
        out[f"{cfg.name}.rows"] = ps.lookup(cfg.name, ids)
        out[f"{cfg.name}.state"] = ps.optimizer_state(cfg.name, ids)
        out[f"{cfg.name}.touched"] = ps.touched(cfg.name)
    return out


def _train(ps: ParameterServer, rng: np.random.Generator, low: int, high: int, steps: int) -> None:
    for _ in range(steps):  # several log records per table: a kill can fall between them
        for cfg in ps.configs:
            ids = rng.choice(np.arange(low, min(high, cfg.cardinality)), size=6, replace=False)
            ps.apply(cfg.name, ids, rng.normal(size=(6, cfg.dim)).astype(np.float32))


def _scenario(folder: Path, saved: Path, optimizer: str, resets: bool, kill_at: int) -> None:
    """The child: two commits, their answers saved, uncommitted training, then
    ``rollback_to(previous)`` killed before call ``kill_at`` (or after it returns)."""
    rng = np.random.default_rng(0)
    ps = ParameterServer(folder, TABLES, seed=SEED, optimizer=optimizer, lr=LR, init_scale=SCALE)
    _train(ps, rng, 0, 20, 3)
    ps.flush()  # the previous mark: rows 0..19
    previous = _answers(ps)
    _train(ps, rng, 10, 30, 3)  # 10..19 logged for undo, 20..29 first written (cut)
    if resets:
        ps.apply_vocabulary_delta({"a": RESET_A})
    ps.flush()  # the last mark
    last = _answers(ps)
    np.savez(saved, **{f"previous.{k}": v for k, v in previous.items()},
             **{f"last.{k}": v for k, v in last.items()})
    _train(ps, rng, 0, 48, 2)  # after the last mark: undone first
    if resets:
        ps.apply_vocabulary_delta({"b": RESET_B})
    counted = [0]
    _kill_before_call(kill_at, counted)
    ps.rollback_to(int(previous["version"]))
    saved.with_suffix(".calls").write_text(str(counted[0]))
    os.kill(os.getpid(), signal.SIGKILL)  # done, and never closed


def _saved(path: Path, which: str) -> dict[str, np.ndarray]:
    with np.load(path) as f:
        return {k.split(".", 1)[1]: f[k] for k in f.files if k.startswith(which + ".")}


def _at_previous(saved: Path, resets: dict[str, list[int]]) -> dict[str, np.ndarray]:
    """The answers after a rollback to the previous mark that made ``resets`` again:
    the saved answers there, the reset rows at their initial values and zero state
    (one commit, a version per table reset)."""
    out = _saved(saved, "previous")
    p = int(out["version"])
    for table, ids in resets.items():
        ids = np.asarray(ids)
        out[f"{table}.rows"][ids] = initial_rows(SEED, table, ids, out[f"{table}.rows"].shape[1],
                                                 SCALE)
        out[f"{table}.state"][ids] = 0
        out[f"{table}.touched"] = np.union1d(out[f"{table}.touched"], ids)
    out["version"] = np.array(p + len(resets))
    out["previous"] = np.array(p if resets else -1)
    return out


def _differences(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> list[str]:
    return [k for k in expected if not np.array_equal(got[k], expected[k])]


def _reopened(folder: Path) -> dict[str, np.ndarray]:
    ps = ParameterServer.open(folder)
    try:
        return _answers(ps)
    finally:
        ps.close()


@pytest.mark.parametrize(("optimizer", "resets"), [("adagrad", False), ("adam", True)])
def test_a_rollback_killed_at_any_step_reopens_at_one_mark_and_rolls_back_again(
        tmp_path, optimizer, resets):
    counting = tmp_path / "count"
    counting.mkdir()
    log = tmp_path / "child.log"
    _killed(_in_child(lambda: _scenario(counting / "ps", counting / "saved.npz", optimizer,
                                        resets, -1), log), log)
    calls = int((counting / "saved.calls").read_text())
    assert calls > 10  # the hooks saw the rollback's steps
    replayed = {"a": RESET_A, "b": RESET_B} if resets else {}
    outcomes = []
    for k in range(calls + 1):  # calls: killed after rollback_to returned
        run = tmp_path / f"k{k}"
        run.mkdir()
        folder, saved = run / "ps", run / "saved.npz"
        _killed(_in_child(lambda f=folder, s=saved, k=k: _scenario(f, s, optimizer, resets, k),
                          log), log)
        last, previous = _saved(saved, "last"), _at_previous(saved, replayed)
        got = _reopened(folder)
        if not _differences(got, last):
            outcome = "last"
        else:
            assert not _differences(got, previous), (
                f"killed before step {k} of {calls}: reopened with rows of both marks "
                f"(differs from the last mark in {_differences(got, last)}, from the "
                f"previous in {_differences(got, previous)})")
            outcome = "previous"
        outcomes.append(outcome)
        assert not _differences(_reopened(folder), got)  # open finished it for good

        # rolling back again after the reopen works as documented
        ps = ParameterServer.open(folder)
        p = int(_saved(saved, "previous")["version"])
        if outcome == "previous":
            with pytest.raises(DataError, match="cannot go back to version"):
                ps.rollback_to(int(last["version"]))
            expected = previous  # P: nothing to do; P + resets: made again from P
        else:  # the resets after the last mark were never committed: those in it only
            expected = _at_previous(saved, {"a": RESET_A} if resets else {})
        ps.rollback_to(p)
        ps.close()
        assert not _differences(_reopened(folder), expected), f"killed before step {k}"
        shutil.rmtree(run)
    # decided at one step: the last mark before it, the previous one from it on
    assert outcomes[0] == "last" and outcomes[-1] == "previous", outcomes
    first = outcomes.index("previous")
    assert outcomes[first:] == ["previous"] * (len(outcomes) - first), outcomes


def _two_marks(folder: Path, storage: str = "disk") -> dict[str, np.ndarray]:
    """A closed server with two commits; the answers at the first (the previous mark)."""
    ps = ParameterServer(folder, TABLES, storage=storage, seed=SEED, lr=LR, init_scale=SCALE)
    rng = np.random.default_rng(1)
    _train(ps, rng, 0, 20, 2)
    ps.flush()
    previous = _answers(ps)
    _train(ps, rng, 10, 30, 2)
    ps.flush()
    ps.close()
    return previous


def _edit_meta(folder: Path, **fields) -> str:
    meta = json.loads((folder / "_server.json").read_text())
    meta.update(fields)
    (folder / "_server.json").write_text(json.dumps(meta))
    return (folder / "_server.json").read_text()


def test_open_finishes_a_rollback_its_server_json_records(tmp_path):
    """A folder whose ``_server.json`` records a rollback to the previous mark (the
    rows not yet restored): ``open`` finishes it, for good."""
    previous = _two_marks(tmp_path / "ps")
    _edit_meta(tmp_path / "ps", rollback={"to": int(previous["version"]), "resets": {},
                                          "vocabulary_delta": 0})
    previous["previous"] = np.array(-1)  # one mark is kept: the one gone back to
    assert not _differences(_reopened(tmp_path / "ps"), previous)
    assert "rollback" not in json.loads((tmp_path / "ps" / "_server.json").read_text())
    assert not _differences(_reopened(tmp_path / "ps"), previous)


@pytest.mark.parametrize(("rollback", "expected"), [
    (5, r"field 'rollback' is 5, expected null or an object \(a rollback under way\)"),
    ({"to": 99, "resets": {}, "vocabulary_delta": 0},
     r"field 'rollback\.to' is 99, expected 4, the version of 'previous'"),
    ({"to": 4, "resets": {}, "vocabulary_delta": "1"},
     r"field 'rollback\.vocabulary_delta' is '1', expected an integer >= 0"),
    ({"to": 4, "resets": {"a": [48]}, "vocabulary_delta": 0},
     r"field 'rollback\.resets\.a' is \[48\], expected a list of ids from 0 to 47"),
    ({"to": 4, "resets": {"c": [1]}, "vocabulary_delta": 0},
     r"field 'rollback\.resets' is \{'c': \[1\]\}, expected an object of ids per table"),
])
def test_a_bad_rollback_field_is_refused_naming_it_and_left_as_found(tmp_path, rollback, expected):
    previous = _two_marks(tmp_path / "ps")
    assert int(previous["version"]) == 4  # two steps of two tables
    text = _edit_meta(tmp_path / "ps", rollback=rollback)
    with pytest.raises(DataError, match=expected):
        ParameterServer.open(tmp_path / "ps")
    assert (tmp_path / "ps" / "_server.json").read_text() == text


def test_a_rollback_field_of_a_memory_server_is_refused(tmp_path):
    _two_marks(tmp_path / "ps", storage="memory")
    _edit_meta(tmp_path / "ps", rollback={"to": 4, "resets": {}, "vocabulary_delta": 0})
    with pytest.raises(DataError, match=r"field 'rollback' is .*, expected null \(only a disk "
                                        r"server of format .* records a rollback under way\)"):
        ParameterServer.open(tmp_path / "ps")


# -- a state machine -------------------------------------------------------------


def _fresh_reference() -> dict[str, list[np.ndarray]]:
    return {c.name: [initial_rows(SEED, c.name, np.arange(c.cardinality), c.dim, SCALE)
                     .astype(np.float64), np.zeros((c.cardinality, c.dim))] for c in TABLES}


def _copy(ref: dict[str, list[np.ndarray]]) -> dict[str, list[np.ndarray]]:
    return {t: [w.copy(), s.copy()] for t, (w, s) in ref.items()}


def _reset(ref: dict[str, list[np.ndarray]], table: str, ids: list[int]) -> None:
    ids_arr = np.asarray(sorted(set(ids)))
    w, s = ref[table]
    w[ids_arr] = initial_rows(SEED, table, ids_arr, w.shape[1], SCALE)
    s[ids_arr] = 0


def _matches(ps: ParameterServer, ref: dict[str, list[np.ndarray]]) -> bool:
    return all(np.allclose(ps.lookup(t, np.arange(ROWS[t])), w, rtol=1e-5, atol=1e-6)
               and np.allclose(ps.optimizer_state(t, np.arange(ROWS[t])), s, rtol=1e-5, atol=1e-6)
               for t, (w, s) in ref.items())


class RollbackCrashMachine(RuleBasedStateMachine):
    """A disk server (adagrad) and a numpy reference of its rows and state, with
    commits, vocabulary resets of table ``a``, rollbacks, crashes, and kills inside
    a rollback to the previous mark (a forked child holding the open server)."""

    @initialize()
    def setup(self):
        self.tmp = Path(tempfile.mkdtemp())
        self.ps = ParameterServer(self.tmp / "ps", TABLES, seed=SEED, lr=LR, init_scale=SCALE)
        self.ref = _fresh_reference()
        self.marks = {0: _copy(self.ref)}  # server version -> reference then
        self.pending: list[int] = []  # ids of "a" reset since the last commit
        self.commit: list[int] = []  # and by the last commit

    def teardown(self):
        if hasattr(self, "ps"):
            self.ps.close()
            shutil.rmtree(self.tmp, ignore_errors=True)

    @rule(table=st.sampled_from(["a", "b"]), ids=st.sets(st.integers(0, 47), min_size=1, max_size=6),
          seed=st.integers(0, 2**16))
    def train(self, table, ids, seed):
        arr = np.array(sorted({i % ROWS[table] for i in ids}))
        w, s = self.ref[table]
        g = np.random.default_rng(seed).normal(size=(len(arr), w.shape[1])).astype(np.float32)
        self.ps.apply(table, arr, g)
        s[arr] += g.astype(np.float64) ** 2
        w[arr] -= LR * g / (np.sqrt(s[arr]) + 1e-10)

    @rule(ids=st.lists(st.integers(0, 47), min_size=1, max_size=4))
    def reset_rows(self, ids):
        self.ps.apply_vocabulary_delta({"a": ids})
        _reset(self.ref, "a", ids)
        self.pending += ids

    @rule()
    def flush(self):
        changed = self.ps.version != self.ps.mark
        self.marks[self.ps.flush()] = _copy(self.ref)
        if changed:
            self.commit, self.pending = self.pending, []

    def _at_previous(self, previous: int, replay: list[int]) -> dict[str, list[np.ndarray]]:
        ref = _copy(self.marks[previous])
        if replay:
            _reset(ref, "a", replay)
        return ref

    def _went_back(self, ref: dict[str, list[np.ndarray]], replay: list[int]) -> None:
        self.ref = ref
        if replay:
            self.marks[self.ps.mark] = _copy(ref)
        self.commit, self.pending = sorted(set(replay)), []

    @precondition(lambda self: self.ps.previous_mark is not None)
    @rule()
    def roll_back(self):
        previous, replay = self.ps.previous_mark, self.pending + self.commit
        self.ps.rollback_to(previous)
        self._went_back(self._at_previous(previous, replay), replay)

    @rule()
    def crash_and_reopen(self):
        self.ps.close()
        self.ps = ParameterServer.open(self.tmp / "ps")
        self.ref = _copy(self.marks[self.ps.version])
        self.pending = []

    @precondition(lambda self: self.ps.previous_mark is not None)
    @rule(kill_at=st.integers(0, 40))
    def crash_in_a_roll_back(self, kill_at):
        """The process dies inside rollback_to(previous mark) (or right after it);
        a new one reopens the server: at the last mark, or at the previous one
        with the rollback's resets made again."""
        last, previous = self.ps.mark, self.ps.previous_mark
        replay = self.pending + self.commit
        log = self.tmp / "child.log"

        def child():
            _kill_before_call(kill_at, [0])
            self.ps.rollback_to(previous)
            os.kill(os.getpid(), signal.SIGKILL)

        _killed(_in_child(child, log), log)
        self.ps.close()  # this process's object is stale: the child changed the folder
        self.ps = ParameterServer.open(self.tmp / "ps")
        back = self._at_previous(previous, replay)
        at_previous = (self.ps.version == previous + (1 if replay else 0)
                       and self.ps.previous_mark == (previous if replay else None)
                       and _matches(self.ps, back))
        at_last = (self.ps.version == last and self.ps.previous_mark == previous
                   and _matches(self.ps, self.marks[last]))
        assert at_previous or at_last, f"killed before step {kill_at}: rows of both marks"
        # both: the two marks answer alike (e.g. the last one only reset rows never
        # trained), and either reference serves from here on
        event("a killed rollback reopened at the " + ("last mark" if at_last else "previous mark")
              + (" (the two alike)" if at_last and at_previous else ""))
        if at_last:
            self.ref, self.pending = _copy(self.marks[last]), []
        else:
            self._went_back(back, replay)

    @invariant()
    def server_equals_the_reference(self):
        if hasattr(self, "ps"):
            assert _matches(self.ps, self.ref)


RollbackCrashMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=15, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_rollback_crashes_against_a_numpy_reference = RollbackCrashMachine.TestCase

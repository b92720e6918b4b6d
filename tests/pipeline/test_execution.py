"""Where local tasks run: one set of threads per process for the passes started
from the main thread (fit, export), dask's own pools elsewhere; a task group ends
its own tasks without shutting the shared threads down."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import dask.config
import numpy as np
import pandas as pd
import pytest
from dask import delayed

import tabstream as ts
import tabstream.pipeline.export as export_mod
from tabstream import ops
from tabstream.pipeline.execution import TaskGroup, local_compute, shared_pool


def _where() -> str:
    time.sleep(0.01)  # so that both threads get tasks
    return threading.current_thread().name


def _ident() -> int:
    time.sleep(0.01)
    return threading.get_ident()


def _shared_idents() -> set[int]:
    pool = shared_pool()
    assert pool is not None and shared_pool() is pool
    return {t.ident for t in pool._threads}


def test_passes_from_the_main_thread_share_one_set_of_threads():
    first = set(local_compute([delayed(_ident, pure=False)() for _ in range(8)]))
    second = set(local_compute([delayed(_ident, pure=False)() for _ in range(8)]))
    assert first and second and first | second <= _shared_idents()


def test_a_fit_and_its_export_run_on_the_same_threads(tmp_path, monkeypatch):
    seen: dict[str, set[int]] = {"fit": set(), "export": set()}
    original_fit, original_read = ops.Normalize.fit_partition, export_mod._Plan.read

    def fit(self, table):
        seen["fit"].add(threading.get_ident())
        return original_fit(self, table)

    def read(self, piece_index):
        seen["export"].add(threading.get_ident())
        return original_read(self, piece_index)

    monkeypatch.setattr(ops.Normalize, "fit_partition", fit)
    monkeypatch.setattr(export_mod._Plan, "read", read)
    df = pd.DataFrame({"x": np.arange(4000, dtype=np.float64)})
    ds = ts.Dataset(df, part_size=df.memory_usage().sum() // 8 + 1)
    wf = ts.Workflow(["x"] >> ops.Normalize())
    wf.fit(ds, progress=False)
    wf.transform(ds).to_parquet(str(tmp_path / "out"), progress=False)
    assert seen["fit"] and seen["export"]
    assert seen["fit"] | seen["export"] <= _shared_idents()
    out = pd.read_parquet(tmp_path / "out")
    np.testing.assert_allclose(np.sort(out["x"].to_numpy()),
                               (df["x"] - df["x"].mean()) / df["x"].std(), rtol=1e-5)


def test_tasks_that_compute_inside_a_task_do_not_wait_on_their_own_threads():
    """A task that computes more (from a pool thread) gets dask's pool for its
    thread, not the shared one, which could be busy with its callers."""
    def inner() -> list[str]:
        assert shared_pool() is None
        return local_compute([delayed(_where, pure=False)() for _ in range(4)])

    outer = local_compute([delayed(inner, pure=False)() for _ in range(4)])
    names = {n for names in outer for n in names}
    assert len(outer) == 4 and not any(n.startswith("tabstream_") for n in names)


def test_a_task_group_drops_queued_tasks_and_waits_for_running_ones():
    pool = shared_pool()
    assert pool is not None
    group = TaskGroup(pool)
    started, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def blocking(name: str) -> None:
        ran.append(name)
        started.set()
        release.wait(10)

    running = [group.submit(blocking, f"running{i}") for i in range(pool._max_workers)]
    queued = group.submit(ran.append, "queued")
    assert started.wait(10)
    threading.Timer(0.3, release.set).start()
    t = time.perf_counter()
    group.close()
    assert time.perf_counter() - t >= 0.2, "close returned before the running tasks ended"
    assert all(f.done() for f in running) and queued.cancelled()
    assert "queued" not in ran
    # the shared threads go on serving others
    assert local_compute([delayed(_where, pure=False)()])[0].startswith("tabstream_")


def test_a_settled_task_group_takes_new_tasks():
    group = TaskGroup(None, workers=1)
    release = threading.Event()
    running = group.submit(release.wait, 10)
    queued = group.submit(lambda: "queued")
    threading.Timer(0.2, release.set).start()
    group.settle()
    assert running.done() and queued.cancelled()
    assert group.submit(lambda: 7).result() == 7
    group.close()


def test_a_task_group_of_its_own_threads_shuts_them_down():
    group = TaskGroup(None, workers=2)
    assert group._max_workers == 2
    assert group.submit(lambda: 5).result() == 5
    group.close()
    with pytest.raises(RuntimeError):
        group._pool.submit(int)


@pytest.mark.parametrize("main", [True, False])
def test_categorify_merges_spills_on_the_shared_threads(tmp_path, monkeypatch, main):
    """Spilled buckets are merged on the shared threads when the fit runs on the
    main thread, on threads of their own otherwise; the vocabulary is pandas'."""
    from tabstream.ops import categorify

    names: set[str] = set()
    original = categorify._Spill.read

    def read(self, bucket):
        names.add(threading.current_thread().name)
        return original(self, bucket)

    monkeypatch.setattr(categorify._Spill, "read", read)
    monkeypatch.setitem(dask.config.config, "num_workers", 2)  # merged side by side on any machine
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"c": rng.choice([f"v{i}" for i in range(300)], 6000)})
    ds = ts.Dataset(df, part_size=df.memory_usage(deep=True).sum() // 6 + 1)
    op = ops.Categorify(spill_rows=10)
    wf = ts.Workflow(["c"] >> op)
    if main:
        wf.fit(ds, progress=False)
    else:
        t = threading.Thread(target=wf.fit, args=(ds,), kwargs={"progress": False})
        t.start()
        t.join(60)
    assert names
    prefix = "tabstream_" if main else "tabstream-tasks_"
    assert all(n.startswith(prefix) for n in names), names
    counts = df["c"].value_counts()
    want = sorted(zip(-counts.to_numpy(), counts.index))
    got = op.tables["c"]
    assert list(zip((-got["counts"].to_numpy()).tolist(), got["values"].to_pylist())) == \
        [(int(a), b) for a, b in want]


def test_a_task_group_runs_at_most_workers_of_its_tasks_at_once():
    """Given fewer workers than the pool has threads, the group runs that many of
    its tasks at a time (Categorify merges one bucket per core, whatever dask's
    num_workers sizes the shared pool to)."""
    pool = ThreadPoolExecutor(4)
    running, most = [0], [0]
    lock = threading.Lock()

    def task(i: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.02)
        with lock:
            running[0] -= 1
        return i * i

    try:
        group = TaskGroup(pool, workers=2)
        assert group._max_workers == 2
        assert list(group.map(task, range(12))) == [i * i for i in range(12)]
        group.close()
        assert most[0] == 2
        most[0] = 0
        group = TaskGroup(pool)
        assert list(group.map(task, range(12))) == [i * i for i in range(12)]
        group.close()
        assert most[0] == 4
    finally:
        pool.shutdown()


FORKED = """
import multiprocessing, sys
import numpy as np, pandas as pd
import tabstream as ts
from tabstream import ops

def fit_and_export(out):
    df = pd.DataFrame({"c": np.arange(3000) % 7, "x": np.arange(3000.0)})
    ds = ts.Dataset(df, part_size=df.memory_usage().sum() // 4 + 1)
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.Normalize()))
    wf.fit(ds, progress=False)
    wf.transform(ds).to_parquet(out, progress=False)
    return wf

if __name__ == "__main__":
    fit_and_export(sys.argv[1] + "/parent")  # the shared threads exist now
    child = multiprocessing.get_context("fork").Process(target=fit_and_export,
                                                        args=(sys.argv[1] + "/child",))
    child.start()
    child.join(60)
    print("alive" if child.is_alive() else f"exit {child.exitcode}")
    if child.is_alive():
        child.kill()
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_a_fit_fits_and_exports(tmp_path):
    """The parent's shared threads do not exist in a forked child: the child makes
    its own instead of waiting for ever on an executor without threads."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "exit 0"
    parent = pd.read_parquet(tmp_path / "parent").sort_values("x", ignore_index=True)
    child = pd.read_parquet(tmp_path / "child").sort_values("x", ignore_index=True)
    pd.testing.assert_frame_equal(parent, child)
    assert sorted(child["c"].unique()) == list(range(3, 10))  # 7 values after the reserved ids


def test_map_shared_keeps_order_and_context_and_ends_every_call_on_a_failure():
    """map_shared: results in the items' order whatever finishes first; each call sees
    the caller's context (a ContextVar set before, as the backend in use is); when a
    call fails its error is raised only once no other call runs, and the calls not
    started are dropped."""
    import contextvars

    from tabstream.core.threads import map_shared

    var = contextvars.ContextVar("probe", default="unset")
    var.set("caller's")

    def slow_first(i):
        time.sleep(0.2 if i == 0 else 0.0)
        return i * i, var.get(), threading.current_thread() is threading.main_thread()

    out = map_shared(slow_first, range(6), 2)
    assert [r[0] for r in out] == [i * i for i in range(6)]
    assert {r[1] for r in out} == {"caller's"}
    assert not all(r[2] for r in out)  # ran on other threads
    assert [r[0] for r in map_shared(slow_first, range(3), 1)] == [0, 1, 4]

    running, started, ended = threading.Lock(), [], []

    def fail_second(i):
        started.append(i)
        if i == 1:
            raise ValueError("item 1")
        time.sleep(0.3)
        with running:
            ended.append(i)
        return i

    with pytest.raises(ValueError, match="item 1"):
        map_shared(fail_second, range(40), 2)
    with running:
        at_the_raise = list(ended)
    assert sorted(at_the_raise) == sorted(i for i in started if i != 1)  # none still running
    time.sleep(0.4)
    assert ended == at_the_raise and len(started) < 40  # none started after


KEPT_FORKED = """
import multiprocessing
import threading
from tabstream.core.threads import kept_pool, map_shared

def squares():
    pool = kept_pool("probe", 2)
    out = map_shared(lambda i: (i * i, threading.current_thread().name), range(8), 2, pool)
    assert [r[0] for r in out] == [i * i for i in range(8)]
    assert any(r[1].startswith("tabstream-probe") for r in out)

if __name__ == "__main__":
    squares()  # the kept pool's threads exist now
    child = multiprocessing.get_context("fork").Process(target=squares)
    child.start()
    child.join(60)
    print("alive" if child.is_alive() else f"exit {child.exitcode}")
    if child.is_alive():
        child.kill()
"""


def test_kept_pool_is_one_per_use_and_remade_in_a_forked_child(tmp_path):
    """kept_pool: the same threads for a use on every call (a new pool when the count
    changes); a child forked after the parent used them runs its calls on threads
    of its own instead of waiting for ever."""
    from tabstream.core.threads import kept_pool, map_shared

    first = kept_pool("probe-test", 2)
    assert kept_pool("probe-test", 2) is first
    first.submit(time.sleep, 0).result()  # a thread of it runs
    assert kept_pool("probe-test", 3) is not first
    with pytest.raises(RuntimeError):  # the replaced pool is shut down: its threads end
        first.submit(time.sleep, 0)
    names = map_shared(lambda _: threading.current_thread().name, range(6), 3, kept_pool("probe-test", 3))
    assert all(n.startswith("tabstream-probe-test") for n in names)
    if not hasattr(os, "fork"):
        return
    script = tmp_path / "kept_forked.py"
    script.write_text(KEPT_FORKED)
    env = {**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.dirname(__file__)))}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "exit 0"


def test_local_workers_is_the_setting_else_the_usable_cpus(monkeypatch):
    """One count of the CPUs in the project: dask's ``num_workers`` when set, else
    usable_cpus (affinity mask and cgroup quota), which the loaders use too."""
    from tabstream.core.threads import local_workers, usable_cpus

    monkeypatch.delitem(dask.config.config, "num_workers", raising=False)
    assert local_workers() == usable_cpus()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(48)))
    assert local_workers() == usable_cpus() <= 48
    monkeypatch.setitem(dask.config.config, "num_workers", 3)
    assert local_workers() == 3

"""Where local tasks run: one set of threads per process for the passes started
from the main thread (fit, export), dask's own pools elsewhere; a task group ends
its own tasks without shutting the shared threads down."""

from __future__ import annotations

import threading
import time

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


def test_passes_from_the_main_thread_share_one_set_of_threads():
    first = set(local_compute([delayed(_where, pure=False)() for _ in range(8)]))
    second = set(local_compute([delayed(_where, pure=False)() for _ in range(8)]))
    pool = shared_pool()
    assert pool is not None and shared_pool() is pool
    assert first | second <= {t.name for t in threading.enumerate() if t.name.startswith("tabstream_")}
    assert all(name.startswith("tabstream_") for name in first | second)


def test_a_fit_and_its_export_run_on_the_same_threads(tmp_path, monkeypatch):
    seen: dict[str, set[str]] = {"fit": set(), "export": set()}
    original_fit, original_read = ops.Normalize.fit_partition, export_mod._Plan.read

    def fit(self, table):
        seen["fit"].add(threading.current_thread().name)
        return original_fit(self, table)

    def read(self, piece_index):
        seen["export"].add(threading.current_thread().name)
        return original_read(self, piece_index)

    monkeypatch.setattr(ops.Normalize, "fit_partition", fit)
    monkeypatch.setattr(export_mod._Plan, "read", read)
    df = pd.DataFrame({"x": np.arange(4000, dtype=np.float64)})
    ds = ts.Dataset(df, part_size=df.memory_usage().sum() // 8 + 1)
    wf = ts.Workflow(["x"] >> ops.Normalize())
    wf.fit(ds, progress=False)
    wf.transform(ds).to_parquet(str(tmp_path / "out"), progress=False)
    assert seen["fit"] and seen["export"]
    assert all(n.startswith("tabstream_") for n in seen["fit"] | seen["export"])
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
    monkeypatch.setattr("dask.system.CPU_COUNT", 2)  # merged side by side on any machine
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

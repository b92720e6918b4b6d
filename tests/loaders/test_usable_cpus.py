"""The CPUs the loader counts for its copying threads: the affinity mask, lowered by
a container's cgroup CPU quota (v2 ``cpu.max`` along the process's group path, v1
``cpu.cfs_quota_us``), as dask counts them for its scheduler."""

import os

import pytest

import tabstream.loaders.batching as batching
from tabstream.core.threads import usable_cpus

HOST = 64  # the affinity mask of a large host


@pytest.fixture
def big_host(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(HOST)), raising=False)


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _cpus(tmp_path, group="/"):
    proc = tmp_path / "proc_cgroup"
    _write(proc, f"12:cpuset:/\n0::{group}\n")
    return usable_cpus(str(tmp_path / "cg"), str(proc))


def test_no_cgroup_files_leave_the_affinity_mask(tmp_path, big_host):
    assert usable_cpus(str(tmp_path / "absent"), str(tmp_path / "absent" / "cgroup")) == HOST


def test_the_real_machine_gives_at_most_its_affinity_mask():
    assert 1 <= usable_cpus() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize(("files", "expected"), [
    # (cpu.max per group along /kubepods/pod/ctr, from the process's own up), quota/period rounded up
    ({"kubepods/pod/ctr": "max 100000", "kubepods/pod": "150000 100000", "": "800000 100000"}, 2),
    ({"kubepods/pod/ctr": "250000 100000"}, 3),
    ({"kubepods/pod/ctr": "50000 100000"}, 1),  # half a CPU: one
    ({"": "400000 50000"}, 8),
    ({"kubepods/pod/ctr": "max 100000", "": "max 100000"}, HOST),
    ({"kubepods/pod/ctr": "abc 100000", "kubepods": "max", "": "100000 0"}, HOST),  # not understood
])
def test_cgroup2_quota_along_the_group_path(tmp_path, big_host, files, expected):
    for group, text in files.items():
        _write(tmp_path / "cg" / group / "cpu.max", text + "\n")
    assert _cpus(tmp_path, "/kubepods/pod/ctr") == expected


@pytest.mark.parametrize(("folder", "quota", "period", "expected"), [
    ("cpu", "300000", "100000", 3),
    ("cpu,cpuacct", "120000", "100000", 2),
    ("cpuacct,cpu", "100000", "100000", 1),
    ("cpu", "-1", "100000", HOST),  # no limit
])
def test_cgroup1_quota(tmp_path, big_host, folder, quota, period, expected):
    _write(tmp_path / "cg" / folder / "cpu.cfs_quota_us", quota + "\n")
    _write(tmp_path / "cg" / folder / "cpu.cfs_period_us", period + "\n")
    assert _cpus(tmp_path) == expected


def test_the_smaller_of_both_quotas_and_the_mask(tmp_path, monkeypatch):
    _write(tmp_path / "cg" / "cpu.max", "600000 100000\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_quota_us", "500000\n")
    _write(tmp_path / "cg" / "cpu" / "cpu.cfs_period_us", "100000\n")
    for mask, expected in ((64, 5), (4, 4)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, n=mask: set(range(n)), raising=False)
        assert _cpus(tmp_path) == expected


def test_fill_threads_from_the_usable_cpus(tmp_path, big_host):
    # half the CPUs, at most 4; one below 4 CPUs
    assert [batching._fill_threads(c) for c in range(1, 11)] == [1, 1, 1, 2, 2, 3, 3, 4, 4, 4]
    # a container limited to 2 CPUs on a large host copies on one thread
    _write(tmp_path / "cg" / "cpu.max", "200000 100000\n")
    assert batching._fill_threads(_cpus(tmp_path)) == 1
    assert batching._fill_threads(HOST) == 4


def test_the_loader_counts_the_usable_cpus():
    assert batching._FILL_THREADS == batching._fill_threads(usable_cpus())

"""The CPUs and memory tabstream plans with are those the process may use (CPU
affinity, a container's limits), not the machine's: in a 2-CPU container on a 64-core
host, 64 export threads would hold 64 partitions at once. Each case runs in a fresh
interpreter whose limits are set before tabstream is imported."""

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(setup: str, report: str) -> dict:
    code = f"{setup}\nimport json\n{report}"
    env = {**os.environ, "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs CPU affinity and at least 2 usable CPUs")
def test_workers_follow_cpu_affinity():
    got = run_child(
        "import os\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})",
        "from tabstream.pipeline.execution import num_workers\n"
        "print(json.dumps({'workers': num_workers(), 'usable': len(os.sched_getaffinity(0)), "
        "'machine': os.cpu_count()}))")
    assert got["usable"] == 1 and got["machine"] > 1  # the child sees a machine larger than its share
    assert got["workers"] == got["usable"]


@pytest.mark.parametrize("limit_gib", [4, 12])
def test_parquet_cache_budget_follows_a_memory_limit(limit_gib):
    """RLIMIT_RSS stands in for a container's memory limit (cgroup files cannot be
    written here); the default budget is a quarter of the smaller of it and the
    machine's memory, at least 1 GiB."""
    import psutil

    limit = limit_gib * 2**30
    got = run_child(
        f"import resource\nresource.setrlimit(resource.RLIMIT_RSS, ({limit}, {limit}))",
        "from tabstream.pipeline import partition_cache\n"
        "print(json.dumps({'budget': partition_cache._parquet_cache_budget()}))")
    expected = max(2**30, min(limit, psutil.virtual_memory().total) // 4)
    assert got["budget"] == expected


def test_an_explicit_budget_wins(monkeypatch):
    from tabstream.pipeline import partition_cache

    monkeypatch.setattr(partition_cache, "PARQUET_CACHE_MAX_BYTES", 12345)
    assert partition_cache._parquet_cache_budget() == 12345


def test_budget_when_distributed_is_shadowed(tmp_path):
    """A script folder holding a distributed.py (benchmarks/ has one) shadows dask's
    package: the budget never imports it, and is the machine's share as usual."""
    from tabstream.pipeline import partition_cache

    (tmp_path / "distributed.py").write_text("raise RuntimeError('imported the shadow')\n")
    got = run_child(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})",
        "from tabstream.pipeline import partition_cache\n"
        "print(json.dumps({'budget': partition_cache._parquet_cache_budget(), "
        "'imported': 'distributed' in sys.modules}))")
    assert got["budget"] == max(2**30, partition_cache._memory_limit() // 4)  # same limits as this process
    assert got["imported"] is False


def test_memory_limit_reads_cgroup_files(tmp_path, monkeypatch):
    """The smallest positive limit among the cgroup files that hold a number wins;
    "max" (v2's no limit), a missing file and garbage are skipped."""
    import resource

    import psutil

    from tabstream.pipeline import partition_cache

    monkeypatch.setattr(resource, "getrlimit", lambda which: (-1, -1))  # no RSS limit here
    total = psutil.virtual_memory().total
    files = {"v1": str(total // 3), "v1_soft": "max\n", "v2": "garbage", "v2_high": f"{total // 5}\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / n) for n in files] + [str(tmp_path / "missing")]
    monkeypatch.setattr(partition_cache, "_CGROUP_LIMITS", tuple(paths))
    assert partition_cache._memory_limit() == total // 5
    monkeypatch.setattr(partition_cache, "_CGROUP_LIMITS", (str(tmp_path / "v1_soft"), str(tmp_path / "missing")))
    assert partition_cache._memory_limit() == total


def test_a_local_fit_and_export_never_import_distributed(tmp_path):
    """dask imports ``distributed`` to look for a client when given a scheduler by
    name; tabstream passes the threaded scheduler's function, so a fit and an export
    on one machine never pay that import (0.14 s, 13 MB)."""
    got = run_child(
        "import sys",
        "import numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq\n"
        "import tabstream\nfrom tabstream import ops\n"
        f"pq.write_table(pa.table({{'c': pa.array(['a', 'b', 'a'] * 50000), "
        f"'x': np.arange(150000.0)}}), {str(tmp_path / 'in.parquet')!r}, row_group_size=20000)\n"
        f"ds = tabstream.Dataset({str(tmp_path / 'in.parquet')!r}, part_size='200kB')\n"
        "wf = tabstream.Workflow((['c'] >> ops.Categorify(spill_rows=1)) + (['x'] >> ops.Normalize()))\n"
        "wf.fit(ds, progress=False)\n"
        f"wf.transform(ds).to_parquet({str(tmp_path / 'out')!r}, progress=False)\n"
        f"ids = pq.read_table({str(tmp_path / 'out')!r}).column('c').to_pylist()\n"
        "print(json.dumps({'distributed': 'distributed' in sys.modules, 'parts': ds.npartitions, "
        "'ids': sorted(set(ids)), 'rows': len(ids)}))")
    assert got["distributed"] is False
    assert got["parts"] > 1 and got["rows"] == 150000
    assert got["ids"] == [3, 4]  # "a" (more frequent) then "b", after the reserved ids


@pytest.mark.skipif(not os.path.exists("/proc/sys/vm/dirty_background_ratio"), reason="Linux only")
def test_a_disk_cache_stays_under_the_writeback_threshold(tmp_path):
    """On a disk, the budget is at most what the kernel keeps before writing back
    (read here from /proc and psutil); on tmpfs, the memory share alone. Each folder's
    filesystem is named by ``df``."""
    import psutil

    from tabstream.pipeline import partition_cache

    memory_share = partition_cache._parquet_cache_budget()
    with open("/proc/sys/vm/dirty_background_bytes") as f:
        fixed = int(f.read())
    with open("/proc/sys/vm/dirty_background_ratio") as f:
        ratio = int(f.read())
    threshold = fixed or psutil.virtual_memory().available * ratio // 100
    folders = [str(tmp_path), REPO] + (["/dev/shm"] if os.path.isdir("/dev/shm") else [])
    for folder in folders:
        out = subprocess.run(["df", "--output=fstype", folder], capture_output=True, text=True, check=True)
        in_memory = out.stdout.split()[-1] in ("tmpfs", "ramfs")
        got = partition_cache._parquet_cache_budget(folder)
        if in_memory:
            assert got == memory_share, folder
        else:
            expected = min(memory_share, threshold)
            assert abs(got - expected) <= expected * 0.05, folder  # available memory moves a little


def test_categorify_spills_beside_a_shadowed_distributed(tmp_path):
    """A distributed.py on the path, imported by the script (a folder of scripts may
    hold one): a spilling Categorify still fits, counting as on no dask worker."""
    (tmp_path / "distributed.py").write_text("NAME = 'not the package'\n")
    got = run_child(
        f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport distributed",
        "import pyarrow as pa, pyarrow.parquet as pq\n"
        "import tabstream\nfrom tabstream import ops\n"
        f"pq.write_table(pa.table({{'c': pa.array(['a', 'b', 'b', 'c'] * 5000)}}), "
        f"{str(tmp_path / 'in.parquet')!r}, row_group_size=2000)\n"
        f"ds = tabstream.Dataset({str(tmp_path / 'in.parquet')!r}, part_size='20kB')\n"
        "op = ops.Categorify(spill_rows=1)\n"
        "tabstream.Workflow(['c'] >> op).fit(ds, progress=False)\n"
        "t = op.tables['c']\n"
        "print(json.dumps({'values': t['values'].to_pylist(), 'counts': t['counts'].to_pylist(), "
        "'parts': ds.npartitions}))")
    assert got["parts"] > 1
    assert got["values"] == ["b", "a", "c"] and got["counts"] == [10000, 5000, 5000]

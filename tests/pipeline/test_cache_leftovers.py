"""A Dataset's partition-cache folder is named with its owner; a killed process's
folder is removed by the next process that makes one."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tabstream.pipeline.partition_cache as partition_cache

REPO = Path(__file__).resolve().parents[2]


def test_a_killed_process_leaves_a_cache_folder_the_next_one_removes(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    code = ("import os, signal; from tabstream.pipeline.partition_cache import _new_cache_dir; "
            "print(_new_cache_dir(), flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(tmp_path)))
    assert out.returncode == -9
    dead = Path(out.stdout.strip())
    assert dead.is_dir() and dead.parent == tmp_path
    (dead / "piece000000-x.arrow").write_bytes(b"cached")
    # an unnamed folder of an older version: removed only once a day old
    old, young = tmp_path / "tabstream-cache-abc123", tmp_path / "tabstream-cache-def456"
    old.mkdir(), young.mkdir()
    day_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (day_ago, day_ago))
    other = tmp_path / "somebody-else"
    other.mkdir()
    monkeypatch.setattr(partition_cache, "_cache_leftovers_checked", set())
    mine = Path(partition_cache._new_cache_dir())
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine.name, young.name, other.name])
    assert mine.name.startswith("tabstream-cache-") and f"-{os.getpid()}-" in mine.name
    # this process is alive: its folder survives the next check
    monkeypatch.setattr(partition_cache, "_cache_leftovers_checked", set())
    second = Path(partition_cache._new_cache_dir())
    assert mine.is_dir() and second.is_dir()

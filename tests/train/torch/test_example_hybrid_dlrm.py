"""Smoke test: examples/hybrid_dlrm.py builds a small Criteo-like export and trains
DLRM on 2 gloo ranks, hybrid-parallel (mixed plan) and data-parallel."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "hybrid_dlrm.py"


@pytest.mark.slow
def test_hybrid_dlrm_example() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLE), "--rows", "3000", "--batch-size", "500"],
        capture_output=True, text=True, timeout=540, env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    for kind in ("row_wise", "column_wise", "table_wise", "data_parallel"):
        assert kind in out, out
    assert "rank 0: " in out and "rank 1: " in out and "replicated on each" in out
    rows = [dict(kv.split("=") for kv in line.split()[1:])
            for line in out.splitlines() if line.startswith("result ")]
    assert sorted((r["rank"], r["mode"]) for r in rows) == [
        ("0", "data-parallel"), ("0", "hybrid"), ("1", "data-parallel"), ("1", "hybrid")]
    by = {(r["rank"], r["mode"]): r for r in rows}
    for rank in ("0", "1"):
        hybrid, ddp = by[(rank, "hybrid")], by[(rank, "data-parallel")]
        assert int(hybrid["bytes"]) < int(ddp["bytes"])     # shards hold part of the tables
        assert float(hybrid["step_ms"]) > 0 and hybrid["steps"] == ddp["steps"]
        # the same model on the same batches: the two modes train alike
        assert float(hybrid["loss"]) == pytest.approx(float(ddp["loss"]), abs=1e-4)

"""Smoke test: examples/multi_hot_ddp.py writes multi-hot parts, one per worker, and
trains a per-id embedding model on 2 data-parallel ranks in lock-step (torch DDP and
Keras under MultiWorkerMirroredStrategy)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "multi_hot_ddp.py"


@pytest.mark.slow
@pytest.mark.parametrize("framework", [
    pytest.param("torch", marks=pytest.mark.torch),
    pytest.param("tensorflow", marks=pytest.mark.tensorflow),
])
def test_multi_hot_ddp_example(framework: str) -> None:
    pytest.importorskip(framework)
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--framework", framework, "--rows", "6000",
         "--epochs", "2", "--batch-size", "512"],
        capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = [dict(kv.split("=") for kv in line.split()[1:])
             for line in result.stdout.splitlines() if line.startswith("result ")]
    assert sorted(r["rank"] for r in lines) == ["0", "1"], result.stdout
    # each part holds 3000 rows: 5 full batches of 512 per epoch, 2 epochs
    assert {r["steps"] for r in lines} == {str(2 * (3000 // 512))}
    assert len({r["checksum"] for r in lines}) == 1, "the replicas diverged"
    first = [float(r["first_loss"]) for r in lines]
    last = [float(r["last_loss"]) for r in lines]
    assert all(math.isfinite(x) for x in first + last)
    assert sum(last) < sum(first), "training did not lower the loss"

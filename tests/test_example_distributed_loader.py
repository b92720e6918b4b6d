"""Smoke test: examples/distributed_loader.py builds an export with the Criteo recipe
and reads it from 2 torch.distributed processes; the shares add up to the data."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "distributed_loader.py"


@pytest.mark.slow
@pytest.mark.torch
def test_distributed_loader_example() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rows", "7001", "--batch-size", "1000", "--epochs", "2"],
        capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shares = [dict(kv.split("=") for kv in line.split()[1:])
              for line in result.stdout.splitlines() if line.startswith("share ")]
    assert len(shares) == 4, result.stdout
    for epoch in ("0", "1"):
        epoch_shares = [s for s in shares if s["epoch"] == epoch]
        assert sorted(s["rank"] for s in epoch_shares) == ["0", "1"]
        total = int(epoch_shares[0]["total"])
        assert total == 7001
        assert sum(int(s["rows"]) for s in epoch_shares) == total
        assert len({s["batches"] for s in epoch_shares}) == 1, "ranks got different batch counts"
    assert re.search(r"rank 0/2 epoch 0: \d+ rows in \d+ batches", result.stdout)

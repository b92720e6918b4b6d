"""Smoke test: examples/multihot_data_parallel.py turns multi-hot rows into one
parquet part per worker and trains DLRM data-parallel on 2 local workers (torch DDP
and Keras MultiWorkerMirroredStrategy): each rank reads its own part, and the
replicas end with equal weights."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "multihot_data_parallel.py"
LINE = re.compile(r"^rank (\d)/2: part (\S+), ([\d,]+) rows, (\d+) steps/epoch, loss ([\d.]+), "
                  r"weights checksum (-?[\d.]+)$", re.MULTILINE)
ROWS, FIELDS, BATCH = 1_202, 12, 200


def run(framework: str) -> list[tuple[str, ...]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--framework", framework, "--rows", str(ROWS),
         "--fields", str(FIELDS), "--batch-size", str(BATCH)],
        capture_output=True, text=True, timeout=400, env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(rf"^export: 1,202 rows x {FIELDS} fields x 10 ids -> ", result.stdout,
                     re.MULTILINE), result.stdout
    lines = sorted(LINE.findall(result.stdout))
    assert [line[0] for line in lines] == ["0", "1"], result.stdout
    return lines


@pytest.mark.slow
@pytest.mark.parametrize("framework", [
    pytest.param("torch", marks=pytest.mark.torch),
    pytest.param("tensorflow", marks=pytest.mark.tensorflow),
])
def test_multihot_example_trains_each_rank_on_its_own_part(framework):
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    lines = run(framework)
    parts = [line[1] for line in lines]
    assert len(set(parts)) == 2, parts  # two different parts
    rows = [int(line[2].replace(",", "")) for line in lines]
    assert sum(rows) == ROWS  # the parts together hold every row once
    steps = {int(line[3]) for line in lines}
    assert steps == {math.ceil(min(rows) / BATCH)}  # the same on both ranks
    # gradients were summed over the ranks every step: the replicas agree
    assert lines[0][5] == lines[1][5]
    for line in lines:
        assert 0.3 < float(line[4]) < 1.0  # a binary cross-entropy near ln 2 after a few steps

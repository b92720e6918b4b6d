"""The optimizer benchmark runs end to end (tiny sizes; speed is not asserted here)."""

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "optimizers_torch.py"


@pytest.mark.slow  # runs the benchmark script
def test_benchmark_runs_every_setup(capsys):
    spec = importlib.util.spec_from_file_location("optimizers_torch", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    results = bench.run(rows=200_000, dim=8, batch=512, steps=3, dense_steps=2)
    assert list(results) == ["dense Adam", "dense Adam (fused)", "SparseAdam + Adam",
                             "LazyAdam + Adam", "LazyAdam (alone)"]
    assert all(v > 0 for v in results.values())
    assert "x the fastest dense Adam" in capsys.readouterr().out

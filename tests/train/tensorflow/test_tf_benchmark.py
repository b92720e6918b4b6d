import importlib.util
import pathlib

import pytest

pytest.importorskip("tensorflow")

SCRIPT = pathlib.Path(__file__).resolve().parents[3] / "benchmarks" / "optimizers_tf.py"


@pytest.mark.slow  # runs the benchmark script
def test_optimizer_benchmark_runs_on_a_small_table(capsys):
    spec = importlib.util.spec_from_file_location("optimizers_tf_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    variants = ("EmbeddingTable + Adam", "EmbeddingTable + MultiOptimizer")
    results = bench.run(rows=1_000, dim=8, batch=64, steps=(2, 2), warmup=1, variants=variants)
    assert set(results) == set(variants)
    assert all(rate > 0 for rate in results.values())
    assert "EmbeddingTable + MultiOptimizer: " in capsys.readouterr().out

"""Smoke tests: the training examples run end to end on small synthetic data and
print what their docstrings promise.

examples/two_tower_multi_optimizer.py prints one line per optimizer setup::

    adam             epoch    0.49 s   recall@10 0.0473
    multi-optimizer  epoch    0.32 s   recall@10 0.0513
    baselines: random recall@10 0.0694, most popular items recall@10 0.1045 (144 candidates)

examples/dlrm_keras.py prints one line per input pipeline::

    tabstream loader    12,345 samples/s   val AUC 0.6812   val log-loss 0.5321   (setup 0.01 s)
    tf.data by hand      4,567 samples/s   val AUC 0.6790   val log-loss 0.5330   (setup 1.20 s)
    oracle val AUC 0.8065 (true click probabilities); a constant guess has AUC 0.5

Baselines. At 20,000 rows most validation users and items were never seen in
training (their ids are all Categorify's out-of-vocabulary id), so retrieval has
nothing to learn from and only the range of recall@10 is checked there; at
200,000 rows (slow) both setups must beat random ranking of the candidates. A
ranking model's validation AUC must beat a constant prediction (0.5) by 0.02 and
stay below the oracle AUC of the true click probabilities (plus noise).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
NUMBER = r"([0-9][0-9,]*\.?[0-9]*)"


def run_example(name: str, *args: str, timeout: int = 540) -> str:
    """Run ``examples/<name>`` in a fresh interpreter; return its stdout."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args],
                            capture_output=True, text=True, timeout=timeout, env=env)
    assert result.returncode == 0, result.stdout + result.stderr[-5000:]
    return result.stdout


def number(text: str) -> float:
    return float(text.replace(",", ""))


# -- two tower --------------------------------------------------------------------------------

TWO_TOWER_LINE = re.compile(rf"^(adam|multi-optimizer)\s+epoch\s+{NUMBER} s\s+recall@10 {NUMBER}$",
                            re.MULTILINE)
BASELINE_LINE = re.compile(rf"^baselines: random recall@10 {NUMBER}, most popular items "
                           rf"recall@10 {NUMBER} \({NUMBER} candidates\)$", re.MULTILINE)


def check_two_tower(out: str) -> dict[str, tuple[float, float]]:
    """Both setups' (epoch seconds, recall@10) and the random baseline, range-checked."""
    runs = {m[0]: (number(m[1]), number(m[2])) for m in TWO_TOWER_LINE.findall(out)}
    assert set(runs) == {"adam", "multi-optimizer"}, out
    for epoch_s, recall in runs.values():
        assert epoch_s > 0
        assert 0.0 <= recall <= 1.0
    baseline = BASELINE_LINE.search(out)
    assert baseline, out
    random_recall, popular_recall, candidates = (number(g) for g in baseline.groups())
    assert random_recall == pytest.approx(min(1.0, 10 / candidates), abs=1e-4)
    assert 0.0 <= popular_recall <= 1.0
    ratio = re.search(rf"^adam / multi-optimizer epoch time: {NUMBER}x$", out, re.MULTILINE)
    assert ratio and number(ratio[1]) > 0, out
    assert re.search(r"large \(>= [0-9,]+ rows\): user_id, item_id$", out, re.MULTILINE), out
    return {**runs, "random": (0.0, random_recall)}


@pytest.mark.torch
def test_two_tower_example_torch_small() -> None:
    pytest.importorskip("torch")
    out = run_example("two_tower_multi_optimizer.py", "--rows", "20000", "--threshold", "1000",
                      "--batch-size", "512")
    check_two_tower(out)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_two_tower_example_tensorflow_small() -> None:
    pytest.importorskip("tensorflow")
    out = run_example("two_tower_multi_optimizer.py", "--framework", "tensorflow",
                      "--rows", "20000", "--threshold", "1000", "--batch-size", "512")
    check_two_tower(out)


@pytest.mark.slow
@pytest.mark.torch
def test_two_tower_example_torch_beats_random_ranking() -> None:
    pytest.importorskip("torch")
    out = run_example("two_tower_multi_optimizer.py", "--rows", "200000", "--threshold", "10000")
    runs = check_two_tower(out)
    _, random_recall = runs["random"]
    for setup in ("adam", "multi-optimizer"):
        assert runs[setup][1] > random_recall, (setup, out)


# -- DLRM in Keras ------------------------------------------------------------------------------

DLRM_LINE = re.compile(rf"^(tabstream loader|tf\.data by hand)\s+{NUMBER} samples/s\s+val AUC "
                       rf"{NUMBER}\s+val log-loss {NUMBER}\s+\(setup {NUMBER} s\)$", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.tensorflow
def test_dlrm_keras_example() -> None:
    pytest.importorskip("tensorflow")
    out = run_example("dlrm_keras.py", "--rows", "20000", "--batch-size", "1024",
                      "--freq-threshold", "2")
    runs = {m[0]: [number(v) for v in m[1:]] for m in DLRM_LINE.findall(out)}
    assert set(runs) == {"tabstream loader", "tf.data by hand"}, out
    oracle = re.search(rf"^oracle val AUC {NUMBER}", out, re.MULTILINE)
    assert oracle, out
    oracle_auc = number(oracle[1])
    for samples_per_sec, auc, logloss, setup_s in runs.values():
        assert samples_per_sec > 0 and setup_s >= 0
        assert 0.5 + 0.02 < auc <= min(1.0, oracle_auc + 0.02), out
        assert 0.0 < logloss < 1.0
    assert re.search(rf"^tabstream loader / tf.data by hand samples/s: {NUMBER}x$", out,
                     re.MULTILINE), out

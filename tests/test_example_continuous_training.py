"""Smoke test: examples/continuous_training.py trains file lists in two passes through
the embedding cache, exports deltas, survives a crash (Keras: a kill -9 of the
training process); each delta holds exactly the ids of its list's keysets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "continuous_training.py"


@pytest.mark.slow
@pytest.mark.parametrize("framework", [
    pytest.param("torch", marks=pytest.mark.torch),
    pytest.param("tensorflow", marks=pytest.mark.tensorflow)])
def test_continuous_training_example(tmp_path, framework) -> None:
    pytest.importorskip(framework)
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--framework", framework, "--rows", "2000", "--lists", "3",
         "--passes", "2", "--batch-size", "256", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = re.findall(r"pass (\d) list (\d): loss ([\d.]+)  val_auc ([\d.]+)  delta ([\d,]+) rows",
                       result.stdout)
    assert [(p, i) for p, i, *_ in lines] == [(str(p), str(i)) for p in (1, 2) for i in (1, 2, 3)]
    if framework == "torch":
        assert "pass 2 list 2: crashed after" in result.stdout
    else:  # the first start's process was killed with SIGKILL half way through list 2
        assert re.search(r"killing this process \(kill -9\) after \d+ batches\n"
                         r"pass 2 list 2: killed with kill -9; restarting the job", result.stdout)
    assert "(resumed)" in result.stdout
    for p, i, loss, auc, delta in lines:
        keysets = pd.concat(pd.read_parquet(f) for f in
                            sorted((tmp_path / "lists" / f"list_{int(i) - 1:02d}" / "_keysets").glob("*.parquet")))
        expected = keysets.drop_duplicates().shape[0]
        assert int(delta.replace(",", "")) == expected, (p, i)
        position = (int(p) - 1) * 3 + int(i) - 1
        written = sum(len(pd.read_parquet(d)) for d in
                      (tmp_path / "deltas" / f"{position:05d}").iterdir() if d.is_dir())
        assert written == expected
        assert 0.0 < float(auc) <= 1.0 and float(loss) > 0
    # the model learns: the last list's validation AUC beats the first's
    assert float(lines[-1][3]) > float(lines[0][3])

"""Smoke test: examples/continuous_training.py trains file lists in two passes through
the embedding cache, exports deltas, survives a crash; each delta holds exactly the
ids of its list's keysets."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytest.importorskip("torch")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "continuous_training.py"


@pytest.mark.slow
@pytest.mark.torch
def test_continuous_training_example(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--rows", "2000", "--lists", "3", "--passes", "2",
         "--batch-size", "256", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = re.findall(r"pass (\d) list (\d): loss ([\d.]+)  val_auc ([\d.]+)  delta ([\d,]+) rows",
                       result.stdout)
    assert [(p, i) for p, i, *_ in lines] == [(str(p), str(i)) for p in (1, 2) for i in (1, 2, 3)]
    assert "pass 2 list 2: crashed after" in result.stdout
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

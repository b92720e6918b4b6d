"""examples/continuous_training.py --living-vocabulary: fixed vs living vocabulary
over 6 drifting days; the printed numbers are checked against the files it left."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "continuous_training.py"
CATS = [f"C{i}" for i in range(1, 27)]


@pytest.mark.slow
@pytest.mark.torch
def test_living_vocabulary_example(tmp_path) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), "--living-vocabulary", "--rows", "3000", "--lists", "6",
         "--batch-size", "512", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=540,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = re.findall(r"day (\d): oov fixed ([\d.]+) living ([\d.]+)  val_auc fixed ([\d.]+) living ([\d.]+)  "
                       r"admitted ([\d,]+) recycled ([\d,]+)", result.stdout)
    assert [int(d) for d, *_ in lines] == [1, 2, 3, 4, 5, 6]
    chain = sorted((tmp_path / "living_workflow" / "vocabulary").iterdir())
    assert [p.name for p in chain] == [f"update_{i:05d}" for i in range(1, 6)]
    for day, oov_f, oov_l, auc_f, auc_l, admitted, recycled in lines:
        d = int(day) - 1
        for name, printed in (("fixed", oov_f), ("living", oov_l)):
            ids = pd.read_parquet(tmp_path / name / f"day_{d:02d}", columns=CATS).to_numpy()
            assert float(printed) == pytest.approx((ids == 2).sum() / (ids != 1).sum(), abs=6e-4)
        assert 0.0 < float(auc_f) <= 1.0 and 0.0 < float(auc_l) <= 1.0
        if d == 0:
            assert (oov_f, auc_f) == (oov_l, auc_l) and admitted == recycled == "0"
            continue
        assert float(oov_l) < float(oov_f)  # the living vocabulary follows the drift
        doc = json.loads((chain[d - 1] / "_delta.json").read_text())
        entries = doc["vocabularies"].values()
        assert sum(e["admitted"] for e in entries) == int(admitted.replace(",", ""))
        assert sum(e["recycled"] for e in entries) == int(recycled.replace(",", ""))
        # the export after the day holds the reset rows of every recycled id
        for entry in entries:
            changes = pd.read_parquet(chain[d - 1] / entry["file"])
            ids = set(changes[changes.change == "admitted"].id) & set(changes[changes.change == "evicted"].id)
            if ids:
                table = entry["columns"][0]
                keys = set(pd.read_parquet(tmp_path / "living" / "deltas" / f"{d:05d}" / table)["key"])
                assert ids <= keys
    # the fixed vocabulary falls behind the drift: its OOV share grows
    assert float(lines[-1][1]) > float(lines[0][1]) + 0.05
    assert np.isfinite([float(x) for x in lines[-1][3:5]]).all()

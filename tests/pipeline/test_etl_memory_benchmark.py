"""The ETL memory script runs end to end on tiny data, and its figures add up (memory
is not asserted against a target here: that is benchmarks/RESULTS.md's job)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "etl_memory.py"


def test_etl_memory_script_reports_each_pass(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--rows", "16000", "--format", "tsv",
                          "--data-dir", str(tmp_path), "--release"],
                         capture_output=True, text=True, check=True).stdout
    assert "16,000 rows from tsv" in out
    for phase in ("fit", "export"):
        m = re.search(rf"^{phase}\s+peak\s+(\d+) MB: anonymous (\d+) \(Arrow live (\d+), other (-?\d+)\), "
                      r"file-backed (\d+)", out, re.M)
        assert m, out
        total, anon, arrow, other, file_ = map(int, m.groups())
        assert total == anon + file_ and other == anon - arrow and anon > 0 and file_ > 0
    rest = dict(re.findall(r"^(before|after fit|after export)\s+anonymous\s+(\d+) MB", out, re.M))
    assert set(rest) == {"before", "after fit", "after export"}
    assert "released" in out

"""benchmarks/etl.py's scaling mode (issue 34, item 6) on tiny data: the sizes alternate
inside each repeat, and its ratios are the ones the repeats' own results give
(speed and memory are not asserted here: that is benchmarks/RESULTS.md's job)."""

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "etl.py"


def test_scaling_alternates_sizes_and_its_ratios_add_up(tmp_path):
    sizes, repeats = (3000, 6000), 2
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--rows", ",".join(map(str, sizes)), "--only", "tabstream",
         "--repeats", str(repeats), "--formats", "parquet", "--no-floor", "--idle-wait", "0",
         "--data-dir", str(tmp_path / "data"), "--json", str(tmp_path / "scaling.json")],
        capture_output=True, text=True, check=True).stdout
    # smallest first, then the next size, in every repeat
    order = re.findall(r"^===== ([\d,]+) rows, repeat (\d+)/(\d+) =====$", out, re.M)
    assert order == [(f"{rows:,}", str(r), str(repeats)) for r in range(1, repeats + 1) for rows in sizes], out

    # each run's own results, as run_size wrote them
    runs = {rows: [json.loads((tmp_path / f"scaling-{rows}-r{r}.json").read_text())["runs"][0]
                   for r in range(1, repeats + 1)] for rows in sizes}
    base, big = sizes
    doc = json.loads((tmp_path / "scaling.json").read_text())
    assert doc["sizes"] == list(sizes) and doc["repeats"] == repeats
    row = next(d for d in doc["scaling"] if d["rows"] == big)
    total = {rows: statistics.median(r["total_s"] for r in runs[rows]) for rows in sizes}
    rss = {rows: statistics.median(r["peak_rss_mb"] for r in runs[rows]) for rows in sizes}
    assert row["total_s"] == total[big] and row["peak_rss_mb"] == rss[big]
    assert abs(row["time_per_row_vs_smallest"] - (total[big] / big) / (total[base] / base)) < 1e-12
    assert abs(row["rss_vs_smallest"] - rss[big] / rss[base]) < 1e-12
    # pairwise: each repeat's run against the smallest size's run of the same repeat
    expected = [(a["total_s"] / big) / (b["total_s"] / base) for a, b in zip(runs[big], runs[base], strict=True)]
    assert row["pairwise_time_per_row"] == expected
    assert row["pairwise_rss"] == [a["peak_rss_mb"] / b["peak_rss_mb"]
                                   for a, b in zip(runs[big], runs[base], strict=True)]
    smallest = next(d for d in doc["scaling"] if d["rows"] == base)
    assert smallest["pairwise_time_per_row"] == [1.0] * repeats
    assert re.search(r"^tabstream\s+parquet\s+6,000\s", out, re.M), out

"""Memory running out during a fit or an export (a real address-space cap,
RLIMIT_AS, in a subprocess) is one line: which stage, that memory ran out, what to
lower; no abort, no raw MemoryError, no partial output. The cap is swept from well
below the process's current size upward until the stage succeeds, so the test does
not depend on this machine's numbers."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """
    import json, os, resource, shutil, sys
    import numpy as np, pandas as pd, pyarrow as pa
    import pyarrow.parquet as pq
    import tabstream as ts
    from tabstream import ops
    from tabstream.core.errors import OutOfMemoryError

    stage, folder = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    n = 3_000_000
    df = pd.DataFrame({"a": rng.random(n), "b": rng.random(n), "c": rng.integers(0, 1000, n)})
    ds = ts.Dataset(df, part_size="64MB")

    def workflow():
        if stage == "fit":
            return ts.Workflow((["a", "b"] >> ops.Normalize()) + (["c"] >> ops.Categorify()))
        return ts.Workflow((["a", "b"] >> ops.FillMissing(0) >> ops.Normalize()) + ["c"])

    wf = workflow()
    small = ts.Dataset(df.head(1000))
    wf.fit(small)  # every module imported, with memory for 1000 rows only (the export's
    # statistics too: fitted on all rows, the fit would leave the export its memory)
    wf.transform(small).to_parquet(os.path.join(folder, "warm"))
    shutil.rmtree(os.path.join(folder, "warm"))
    pa.default_memory_pool().release_unused()

    def vm():
        for line in open("/proc/self/status"):
            if line.startswith("VmSize"):
                return int(line.split()[1]) * 1024

    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    out = os.path.join(folder, "out")
    failures, rows = [], None
    for extra_mb in range(-1536, 4096, 128):
        cap = vm() + extra_mb * 2**20
        if cap < 64 * 2**20:  # below the process itself (a negative cap would mean no cap)
            continue
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
        try:
            if stage == "fit":
                workflow().fit(ds)
            else:
                rows = wf.transform(ds).to_parquet(out).num_rows
            break
        except OutOfMemoryError as exc:
            failures.append({"extra_mb": extra_mb, "message": str(exc), "hint": exc.hint,
                             "left": sorted(os.listdir(folder))})
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    if rows is not None:
        rows = sum(pq.read_metadata(os.path.join(out, f)).num_rows for f in os.listdir(out) if f.endswith(".parquet"))
    print(json.dumps({"failures": failures, "succeeded_at": extra_mb, "rows": rows, "n": n}))
"""


@pytest.mark.parametrize("stage", ["fit", "export"])
def test_running_out_of_memory_is_one_line(tmp_path, stage):
    # Arrow on the system's allocator: mimalloc reserves address space ahead (the
    # process is about 1.6 GB of it after the warm-up), which holds this whole fit, so
    # a cap failed only the start of a pool thread, not the data; since the fit hands
    # freed memory back in every pool thread, the warm-up starts them and no cap failed.
    # On the system's allocator a cap fails the partition's arrays (numpy's and Arrow's).
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1", "ARROW_DEFAULT_MEMORY_POOL": "system"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SWEEP), stage, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]  # no abort, nothing unhandled
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["failures"], "the tightest cap should have failed the stage"
    assert result["succeeded_at"] > result["failures"][-1]["extra_mb"], "and a larger one let it finish"
    where = "fit level 1" if stage == "fit" else re.escape(f"export to '{tmp_path}/out' (nothing was written)")
    lower = "Categorify's spill_rows" if stage == "fit" else "row_group_size"
    for failure in result["failures"]:
        assert re.fullmatch(rf"{where}: memory ran out \([^\n]+\); lower the Dataset's part_size \(each task "
                            rf"holds a partition\), the number of workers \(tasks at once\), or {lower}, or "
                            r"give the process more memory", failure["message"]), failure["message"]
        assert failure["hint"].startswith("lower the Dataset's part_size")
        assert failure["left"] == [], "no partial output, no hidden temporary folder"
    if stage == "export":
        assert result["rows"] == result["n"]

"""``import tabstream.loaders`` stays framework-free, and its public names are pinned."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream.loaders


def test_core_imports_no_framework() -> None:
    code = ("import sys, tabstream.loaders; "
            "bad = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_names() -> None:
    assert sorted(tabstream.loaders.__all__) == [
        "Batch", "Layout", "Loader", "LoaderOptions", "ParquetSource", "RankShare", "open_source",
        "pad_lists", "pad_nested", "split_rows",
    ]


@pytest.mark.parametrize("fill_threads", [1, 2])
def test_plain_loader_skips_the_workflow_import(tmp_path, fill_threads) -> None:
    # A loader over exported files never needs the workflow (and dask, which it
    # imports): that import alone was about a third of a second before the first batch.
    # Also where it copies columns on several threads (machines of 4 cores or more).
    code = f"""
import sys
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
ids = np.arange(1000, dtype=np.int64)
pq.write_table(pa.table({{"x": ids, "label": ids % 2}}), {str(tmp_path / "part.parquet")!r},
               row_group_size=300)
from tabstream.loaders.core import Loader
import tabstream.loaders.batching as batching
batching._FILL_THREADS = {fill_threads}
seen = np.concatenate([f["x"] for f, _ in Loader({str(tmp_path)!r}, 128, labels=["label"])])
assert np.array_equal(np.sort(seen), ids), "not every row exactly once"
heavy = [m for m in ("tabstream.pipeline.workflow", "dask") if m in sys.modules]
print(heavy)
sys.exit(1 if heavy else 0)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_planning_a_loader_skips_pandas(tmp_path) -> None:
    # Building the Dataset under a loader (footers, schema, row groups) reads arrow
    # only; importing pandas there cost about 45 MB of the loader's peak RSS.
    # (The file is written here: pyarrow itself imports pandas to convert numpy.)
    pq.write_table(pa.table({"x": np.arange(1000, dtype=np.int64)}), tmp_path / "part.parquet",
                   row_group_size=300)
    code = f"""
import sys
from tabstream.loaders import open_source
source = open_source({str(tmp_path)!r})
assert [u.num_rows for u in source.units] == [300, 300, 300, 100], source.units
print("pandas" in sys.modules)
sys.exit(1 if "pandas" in sys.modules else 0)
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr

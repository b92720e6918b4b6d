"""``tabstream demo``: the main job end to end on built-in synthetic data.

1. write Criteo-like raw TSV logs, one file per "day" (the last day is held out),
2. fit the Criteo recipe on the training days,
3. export train (shuffled, split per worker) and valid parquet with schema.json,
4. print the schema summary and per-phase timings.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

__all__ = ["run_demo"]


def run_demo(rows: int = 500_000, output: str = "demo_out", days: int = 4, seed: int = 0,
             train: bool = True, progress: bool | None = None) -> dict[str, Any]:
    from tabstream import Dataset
    from tabstream.cli import _print_timings, _schema_summary
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data
    from tabstream.recipes import criteo_workflow

    if days < 2:
        raise ValueError(f"demo needs at least 2 days (train + valid), got {days}")
    timings: dict[str, float] = {}
    raw = os.path.join(output, "raw")
    if os.path.exists(output):
        shutil.rmtree(output)

    t = time.perf_counter()
    files = write_data("criteo", raw, rows, num_files=days, fmt="tsv", seed=seed, return_probability=True)
    timings["synthesize raw TSV"] = time.perf_counter() - t
    print(f"raw logs: {rows:,} rows in {len(files)} TSV files under {raw}")

    read = {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}
    train_ds = Dataset(sorted(files)[:-1], **read)
    valid_ds = Dataset(sorted(files)[-1:], **read)

    wf = criteo_workflow(freq_threshold=15)
    t = time.perf_counter()
    wf.fit(train_ds, progress=progress)
    timings["fit"] = time.perf_counter() - t

    t = time.perf_counter()
    train_out = wf.transform(train_ds).to_parquet(os.path.join(output, "train"), out_files_per_proc=2,
                                                  shuffle="per_worker", progress=progress)
    timings["export train"] = time.perf_counter() - t
    t = time.perf_counter()
    valid_out = wf.transform(valid_ds).to_parquet(os.path.join(output, "valid"), progress=progress)
    timings["export valid"] = time.perf_counter() - t
    wf.save(os.path.join(output, "workflow"))

    print(f"train: {train_out.num_rows:,} rows in {len(train_out.files)} files; "
          f"valid: {valid_out.num_rows:,} rows in {len(valid_out.files)} files")
    print()
    print(_schema_summary(wf.output_schema))
    _print_timings(timings)
    return {"timings": timings, "train": train_out, "valid": valid_out, "workflow": wf}

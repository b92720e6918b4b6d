"""``tabstream demo``: the main job end to end on built-in synthetic data.

1. write Criteo-like raw TSV logs, one file per "day" (the last day is held out),
2. fit the Criteo recipe on the training days,
3. export train (shuffled, split per worker) and valid parquet with _schema.json,
4. print the schema summary and per-phase timings.

The output folder may be new, empty or one of an earlier demo run: the demo removes
its own ``raw/``, ``train/``, ``valid/`` and ``workflow/`` there and nothing else; a
folder holding anything else is refused before anything is written or removed.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

from tabstream.core.errors import listed

__all__ = ["run_demo"]

#: what a demo run writes into its output folder
_DEMO_FOLDERS = ("raw", "train", "valid", "workflow")
#: the hidden folders a killed export or save of the demo leaves beside them
_DEMO_LEFTOVER = re.compile(r"\.(?:raw|train|valid|workflow)\.(?:tmp|old)-.+")


def _not_the_demos(path: str, name: str) -> list[str]:
    """What ``path`` (the demo's folder ``name``) holds that a demo run did not
    write: ``raw/`` holds the synthetic writer's files, ``train/`` and ``valid/`` one
    export, ``workflow/`` one save (``train/`` and ``valid/`` are common names for a
    user's own data)."""
    import fsspec

    from tabstream.datasets.synthetic import earlier_run_files
    from tabstream.pipeline.export_folder import check_target
    from tabstream.pipeline.workflow import check_save_target

    if name == "raw":
        return earlier_run_files(path)[1]
    if name in ("train", "valid"):
        if check_target(fsspec.filesystem("file"), path, path, overwrite=True) == "new":
            return []  # empty, or one export and nothing else
        return sorted(os.listdir(path))
    if name == "workflow":
        try:
            check_save_target(path)
            return []
        except FileExistsError:
            return sorted(os.listdir(path))
    return []  # a killed export's or save's hidden leftover


def _earlier_run(output: str) -> list[str]:
    """The entries of an earlier demo run in ``output`` (paths, to be removed), or
    FileExistsError when the folder holds anything else: the demo never removes what
    it did not write (``--output .`` in a project folder is refused, not emptied).

    ``output``: ``raw/ train/ valid/ workflow/`` of a demo -> those four;
    ``raw/ thesis.tex`` -> FileExistsError naming ``thesis.tex``; a ``train/`` of the
    user's files (not one export) -> FileExistsError naming them.
    """
    if not os.path.lexists(output):
        return []
    if not os.path.isdir(output):
        raise FileExistsError(f"demo output {output!r} exists and is not a folder; pass --output "
                              "a new folder, an empty one or one of an earlier demo run")
    own, foreign = [], []
    for name in sorted(os.listdir(output)):
        path = os.path.join(output, name)
        is_folder = os.path.isdir(path) and not os.path.islink(path)
        if is_folder and (name in _DEMO_FOLDERS or _DEMO_LEFTOVER.fullmatch(name)):
            own.append(path)
            foreign += [f"{name}/{entry}" for entry in _not_the_demos(path, name)]
        else:
            foreign.append(name + ("/" if is_folder else ""))
    if foreign:
        raise FileExistsError(
            f"demo output {output!r} holds {listed(foreign)}, which the demo did not write; the demo "
            f"replaces only its own {', '.join(f'{n}/' for n in _DEMO_FOLDERS)} there. Pass "
            "--output a new folder, an empty one or one of an earlier demo run, or move them out")
    return own


def run_demo(rows: int = 1_000_000, output: str = "demo_out", days: int = 4, seed: int = 0,
             train: bool = True, progress: bool | None = None) -> dict[str, Any]:
    from tabstream import Dataset
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES, write_data
    from tabstream.recipes import criteo_workflow
    from tabstream.reporting import print_timings, schema_summary

    # arguments first, then the folder: nothing is removed for a run that cannot start
    if not isinstance(days, int) or isinstance(days, bool) or days < 2:
        raise ValueError(f"demo needs at least 2 days (train + valid), got --days {days!r}")
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < days:
        raise ValueError(f"demo needs at least one row per day: --rows {rows!r} is less than "
                         f"--days {days}")
    for path in _earlier_run(output):
        shutil.rmtree(path)
    timings: dict[str, float] = {}
    raw = os.path.join(output, "raw")

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
    print(schema_summary(wf.output_schema))
    result: dict[str, Any] = {"timings": timings, "train": train_out, "valid": valid_out, "workflow": wf}
    if train:
        result.update(_train(output, raw, files, timings, seed, progress))
    print_timings(timings)
    return result


def _train(output: str, raw: str, files: list[str], timings: dict[str, float], seed: int,
           progress: bool | None) -> dict[str, Any]:
    """DLRM (PyTorch) for one epoch on the export; validation AUC next to the oracle
    AUC of the generator's true click probabilities on the same rows."""
    import pyarrow.parquet as pq

    from tabstream.pipeline.dataset import Dataset
    from tabstream.train.runner import train_on_export
    from tabstream.train.torch import roc_auc

    t = time.perf_counter()
    history = train_on_export(os.path.join(output, "train"), os.path.join(output, "valid"),
                              model="dlrm", epochs=1, seed=seed, progress=progress)
    timings["train DLRM (1 epoch)"] = time.perf_counter() - t
    # The valid export keeps the raw order (no shuffle), so it lines up with the
    # probabilities the generator wrote for the last day.
    valid = Dataset(os.path.join(output, "valid"))
    labels = [valid.read_piece(p, ["label"]).column("label") for p in valid.pieces]
    import numpy as np
    import pyarrow as pa

    y = pa.chunked_array(labels).to_numpy()
    last = os.path.basename(sorted(files)[-1]).rsplit(".", 1)[0] + ".parquet"
    prob = pq.read_table(os.path.join(raw, "probabilities", last)).column("probability").to_numpy()
    oracle = roc_auc(y, np.log(prob / (1 - prob)))
    auc = history["val_auc"][-1]
    print(f"\nDLRM validation AUC {auc:.4f}   oracle AUC {oracle:.4f}   gap {oracle - auc:.4f}   "
          f"train {history['samples_per_sec'][-1]:,.0f} samples/s")
    return {"val_auc": auc, "oracle_auc": oracle, "samples_per_sec": history["samples_per_sec"][-1]}

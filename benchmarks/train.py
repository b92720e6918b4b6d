"""DLRM (PyTorch) training samples/s on a Criteo-like export: the tabstream torch
loader vs a hand-written ``torch.utils.data.DataLoader``.

    python benchmarks/train.py                          # 2M rows, batch 8192, one full epoch
    python benchmarks/train.py --rows 500000 --steps 40 --repeats 3

Data (made once, under ``bench_data/``): ``--rows`` rows of synthetic Criteo-like
logs as parquet (``bench_data/criteo-<rows>/parquet``, the layout
``benchmarks/etl.py`` uses, shared with it), then the Criteo recipe
(``tabstream.recipes.criteo_workflow``) fitted on them and exported, shuffled, to
``bench_data/train-criteo-<rows>/export``: ``label`` int64, ``I1..I13`` float32,
``C1..C26`` int64 ids.

Cases, each run in a fresh process (peak RSS is the case's own, from ``wait4``),
with the same model (``DLRM(schema)``, same seed), optimizer (``LazyAdam``: sparse
rows for tables of >= 100,000 ids, Adam for the rest), batch size, torch threads
and number of steps (``--steps``, default: one full epoch):

* ``tabstream``: ``tabstream.loaders.torch.Loader(export, batch_size, shuffle=True)``.
* ``handwritten``: what users write: ``pandas.read_parquet`` of the files, numpy
  arrays per feature group, a map-style ``Dataset`` whose ``__getitem__`` returns
  one row ``(continuous (13,), categorical (26,), label)``, and
  ``DataLoader(dataset, batch_size, shuffle=True)`` with the default collate.

Reported per case: training samples/s over the loop (from asking for the first
batch to the last optimizer step: reading is included for tabstream, which reads
while it trains, and excluded for the hand-written loader, which read everything
in *setup*, reported apart), time to the first batch, and peak RSS.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_result, format_table, machine_note, median, run_child  # noqa: E402

CASES = ("tabstream", "handwritten")
CONTINUOUS = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
RAW_FILES = 8


# -- data ---------------------------------------------------------------------------------
def raw_files(bench_dir: str, rows: int) -> list[str]:
    """Criteo-like raw parquet, ``RAW_FILES`` files; generated on first use. A
    ``.complete`` marker tells a finished set from an interrupted one (as in etl.py)."""
    from tabstream.datasets.synthetic import write_data

    folder = os.path.join(bench_dir, f"criteo-{rows}", "parquet")
    marker = os.path.join(folder, ".complete")
    if not os.path.exists(marker):
        print(f"generating {rows:,} Criteo-like rows in {folder} ...", flush=True)
        write_data("criteo", folder, rows, num_files=RAW_FILES, seed=0)
        with open(marker, "w") as f:
            f.write(f"{rows}\n")
    return sorted(glob.glob(os.path.join(folder, "part_*.parquet")))


def ensure_export(bench_dir: str, rows: int) -> str:
    """The Criteo recipe's shuffled export of the raw files (built when missing;
    ``to_parquet`` renames a complete folder into place, so existing means complete)."""
    export_dir = os.path.join(bench_dir, f"train-criteo-{rows}", "export")
    if os.path.exists(export_dir):
        return export_dir
    import tabstream as ts
    from tabstream.recipes import criteo_workflow

    files = raw_files(bench_dir, rows)
    start = time.perf_counter()
    print(f"fitting the Criteo recipe and exporting to {export_dir} ...", flush=True)
    raw = ts.Dataset(files)
    workflow = criteo_workflow()
    workflow.fit(raw)
    workflow.transform(raw).to_parquet(export_dir, out_files_per_proc=2, shuffle="per_worker", seed=0)
    print(f"  done in {time.perf_counter() - start:.1f} s", flush=True)
    return export_dir


# -- the training loop shared by both cases -------------------------------------------------
def make_model(schema, lr: float, threads: int):
    """``DLRM(schema)`` from seed 0 and its LazyAdam, on ``threads`` torch threads."""
    import torch

    from tabstream.train.torch import DLRM, LazyAdam

    torch.set_num_threads(threads)  # FACTS.md: extra threads collapse on 2 shared cores
    torch.manual_seed(0)
    model = DLRM(schema)
    return model, LazyAdam(model.parameters(), lr=lr)


def train_loop(model, optimizer, batches, steps: int | None) -> dict:
    """Train on ``(features dict, labels)`` batches; stop after ``steps`` (None: all).

    Returns samples, steps, seconds (first request to last step) and first-batch seconds.
    """
    import torch.nn.functional as F

    start = time.perf_counter()
    first = None
    samples = done = 0
    for features, labels in batches:
        if first is None:
            first = time.perf_counter() - start
        loss = F.binary_cross_entropy_with_logits(model(features), labels.float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        samples += len(labels)
        done += 1
        if steps is not None and done >= steps:
            break
    return {"samples": samples, "steps": done, "seconds": time.perf_counter() - start,
            "first_batch_s": first, "loss": float(loss)}


# -- cases (run in a child process) ----------------------------------------------------------
def case_tabstream(export_dir: str, args: argparse.Namespace) -> dict:
    from tabstream.loaders.torch import Loader

    start = time.perf_counter()
    loader = Loader(export_dir, batch_size=args.batch_size, shuffle=True, seed=0)
    setup = time.perf_counter() - start
    model, optimizer = make_model(loader.schema, args.lr, args.threads)
    return {**train_loop(model, optimizer, loader, args.steps), "setup_s": setup}


def case_handwritten(export_dir: str, args: argparse.Namespace) -> dict:
    import numpy as np
    import pandas as pd
    import torch
    from torch.utils.data import DataLoader, Dataset

    import tabstream as ts

    class Rows(Dataset):
        """One row per index: (continuous (13,) float32, categorical (26,) int64, label)."""

        def __init__(self, df: pd.DataFrame) -> None:
            self.cont = df[CONTINUOUS].to_numpy(np.float32)
            self.cat = df[CATEGORICAL].to_numpy(np.int64)
            self.label = df["label"].to_numpy(np.float32)

        def __len__(self) -> int:
            return len(self.label)

        def __getitem__(self, i: int):
            return self.cont[i], self.cat[i], self.label[i]

    def as_features(loader: DataLoader):
        # the model takes one tensor per column, as the tabstream loader yields them
        for cont, cat, label in loader:
            features = {c: cat[:, j] for j, c in enumerate(CATEGORICAL)}
            features.update({c: cont[:, j] for j, c in enumerate(CONTINUOUS)})
            yield features, label

    schema = ts.Dataset(export_dir).schema  # the same schema the model gets in the other case
    start = time.perf_counter()
    files = sorted(glob.glob(os.path.join(export_dir, "*.parquet")))
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    loader = DataLoader(Rows(df), batch_size=args.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    del df
    setup = time.perf_counter() - start
    model, optimizer = make_model(schema, args.lr, args.threads)
    return {**train_loop(model, optimizer, as_features(loader), args.steps), "setup_s": setup}


# -- driver -----------------------------------------------------------------------------------
def run_case(case: str, export_dir: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", case, "--export-dir", export_dir,
            "--batch-size", str(args.batch_size), "--threads", str(args.threads),
            "--lr", str(args.lr)]
    if args.steps is not None:
        argv += ["--steps", str(args.steps)]
    child = run_child(argv)
    if not child.ok:
        raise SystemExit(f"case {case} failed (exit {child.returncode}):\n{child.output[-3000:]}")
    result = dict(child.result)
    result["rate"] = result["samples"] / result["seconds"]
    result["peak_rss_mb"] = child.peak_rss_mb
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--batch-size", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=None,
                        help="optimizer steps per case (default: one full epoch)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--bench-dir", default=None, help="default: <repo>/bench_data")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    parser.add_argument("--export-dir", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        emit_result(globals()[f"case_{args.child}"](args.export_dir, args))
        return

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    export_dir = ensure_export(args.bench_dir or os.path.join(root, "bench_data"), args.rows)
    print(machine_note())
    steps = "one full epoch" if args.steps is None else f"{args.steps} steps"
    print(f"DLRM on {export_dir} ({args.rows:,} rows), batch {args.batch_size:,}, {steps}, "
          f"{args.threads} torch thread(s); medians of {args.repeats}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)

    medians: dict[str, dict[str, float]] = {}
    for case in args.cases:
        runs = [run_case(case, export_dir, args) for _ in range(args.repeats)]
        medians[case] = {k: median([r[k] for r in runs])
                         for k in ("samples", "steps", "rate", "setup_s", "first_batch_s",
                                   "peak_rss_mb")}
        m = medians[case]
        rates = ", ".join(f"{r['rate']:,.0f}" for r in runs)
        print(f"  {case:<12} {m['rate']:>10,.0f} samples/s over {int(m['steps'])} steps "
              f"(runs: {rates}), setup {m['setup_s']:.2f} s, peak RSS {m['peak_rss_mb']:.0f} MB",
              flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")

    hand = medians.get("handwritten")
    headers = ["loader", "steps", "samples", "samples/s", "vs handwritten", "setup s",
               "first batch s", "peak RSS MB"]
    rows = [[case, int(m["steps"]), f"{int(m['samples']):,}", f"{m['rate']:,.0f}",
             f"{m['rate'] / hand['rate']:.2f}x" if hand else "", f"{m['setup_s']:.2f}",
             f"{m['first_batch_s']:.2f}", f"{m['peak_rss_mb']:.0f}"]
            for case, m in medians.items()]
    print()
    print(format_table(headers, rows, markdown=args.markdown))


if __name__ == "__main__":
    main()

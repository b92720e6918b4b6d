"""The ``tabstream`` command.

    tabstream synth criteo raw/ --rows 1000000 --files 4 --format tsv
    tabstream fit raw/ --recipe criteo --workflow-dir wf/ --output out/train
    tabstream transform wf/ raw_new/ out/new
    tabstream inspect out/train
    tabstream train out/train --valid out/valid --model dlrm
    tabstream demo
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["main"]

_HINTS = {
    "FileNotFoundError": "check the path; globs need quotes in the shell",
    "FileExistsError": "pass --overwrite to replace it",
    "DataError": "the input does not match what was declared (names/dtypes/sep)",
    "SchemaError": "check the column names against the dataset's schema (tabstream inspect PATH)",
    "NotFittedError": "fit the workflow first (tabstream fit)",
    "ExportError": "check free space and write permission at the output path",
}


def _error_line(command: str, exc: BaseException) -> str:
    """One line naming the error, plus a hint: the error's own ``hint`` when it has
    one, else the table's."""
    name = type(exc).__name__
    hint = getattr(exc, "hint", None) or _HINTS.get(name, "run again with --debug for the full traceback")
    message = " ".join(str(exc).split())  # Arrow messages may span lines
    return f"tabstream {command}: {name}: {message}\n  hint: {hint}"


def _criteo_read_kwargs(path: str, engine: str | None) -> dict[str, Any]:
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES

    if engine == "parquet" or str(path).rstrip("/").endswith((".parquet", ".pq")):
        return {}
    return {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}


def _dataset(path: str, engine: str | None, part_size: str | None, read_kwargs: dict[str, Any]):
    from tabstream import Dataset

    return Dataset(path, engine=engine, part_size=part_size, **read_kwargs)


@contextmanager
def _phase(timings: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start


def _print_timings(timings: dict[str, float], rows: int | None = None) -> None:
    print("\nphase                     seconds" + ("     rows/s" if rows else ""))
    for name, secs in timings.items():
        rate = f"  {rows / secs:>9,.0f}" if rows and secs > 0 else ""
        print(f"  {name:<22} {secs:>8.2f}{rate}")


def _schema_summary(schema: Any) -> str:
    lines = [f"{'column':<14} {'dtype':<8} {'tags':<40} cardinality  emb.dim"]
    for col in schema:
        emb = col.properties.get("embedding_sizes") or {}
        card = str(col.cardinality) if col.cardinality is not None else ""
        tags = ",".join(sorted(t.value for t in col.tags))
        lines.append(f"{col.name:<14} {col.dtype + ('[]' if col.is_list else ''):<8} "
                     f"{tags:<40} {card:>11}  {emb.get('dimension', ''):>7}")
    return "\n".join(lines)


def _load_workflow_file(path: str) -> tuple[Any, dict[str, Any]]:
    """A user's Python file defining ``workflow`` (or ``build_workflow()``) and,
    optionally, ``dataset_kwargs`` for reading the raw data."""
    import os

    from tabstream import Workflow

    if os.path.isdir(path):
        raise ValueError(f"workflow file {path!r} is a folder; --workflow-file takes a Python file "
                         "defining `workflow` (a saved workflow folder is applied with `tabstream transform`)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"workflow file {path!r} does not exist")
    if not path.endswith(".py"):
        raise ValueError(f"workflow file {path!r} is not a Python file (.py) defining `workflow`")
    spec = importlib.util.spec_from_file_location("tabstream_user_workflow", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load workflow file {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    wf = getattr(module, "workflow", None)
    if wf is None and hasattr(module, "build_workflow"):
        wf = module.build_workflow()
    if wf is None:
        raise ValueError(f"{path} defines neither `workflow` nor `build_workflow()`")
    if not isinstance(wf, Workflow):
        raise TypeError(f"{path}: `workflow` must be a tabstream.Workflow, got {type(wf).__name__}; "
                        "wrap the graph: workflow = ts.Workflow(cats + conts)")
    read_kwargs = getattr(module, "dataset_kwargs", {})
    if not isinstance(read_kwargs, dict):
        raise TypeError(f"{path}: `dataset_kwargs` must be a dict of Dataset arguments, "
                        f"got {type(read_kwargs).__name__}")
    return wf, dict(read_kwargs)


# -- commands -----------------------------------------------------------------
def cmd_synth(args: argparse.Namespace) -> None:
    from tabstream.datasets.synthetic import write_data

    start = time.perf_counter()
    files = write_data(args.name, args.output, args.rows, num_files=args.files, fmt=args.format,
                       seed=args.seed, return_probability=args.probabilities)
    secs = time.perf_counter() - start
    print(f"wrote {args.rows:,} {args.name} rows to {len(files)} {args.format} files in "
          f"{args.output} ({secs:.1f} s)")


def cmd_fit(args: argparse.Namespace) -> None:
    if args.workflow_file:
        wf, read_kwargs = _load_workflow_file(args.workflow_file)
    else:
        from tabstream.recipes import RECIPES

        wf = RECIPES[args.recipe](freq_threshold=args.freq_threshold)
        read_kwargs = _criteo_read_kwargs(args.input, args.engine)
    ds = _dataset(args.input, args.engine, args.part_size, read_kwargs)
    timings: dict[str, float] = {}
    with _phase(timings, "fit"):
        wf.fit(ds, progress=not args.quiet)
    if args.workflow_dir:
        wf.save(args.workflow_dir)
        print(f"saved workflow to {args.workflow_dir}")
    if args.output:
        with _phase(timings, "export"):
            wf.transform(ds).to_parquet(args.output, out_files_per_proc=args.out_files_per_proc,
                                        shuffle=args.shuffle, overwrite=args.overwrite,
                                        progress=not args.quiet)
        print(f"exported to {args.output}")
    print(_schema_summary(wf.output_schema))
    _print_timings(timings)


def cmd_transform(args: argparse.Namespace) -> None:
    from tabstream import Workflow

    wf = Workflow.load(args.workflow_dir)
    read_kwargs: dict[str, Any] = {}
    if args.criteo_tsv:
        read_kwargs = _criteo_read_kwargs(args.input, "csv")
    ds = _dataset(args.input, args.engine, args.part_size, read_kwargs)
    result = wf.transform(ds).to_parquet(args.output, out_files_per_proc=args.out_files_per_proc,
                                         num_files=args.num_files, shuffle=args.shuffle,
                                         overwrite=args.overwrite, progress=not args.quiet)
    print(f"wrote {result.num_rows:,} rows to {len(result.files)} files in {args.output}")


def cmd_inspect(args: argparse.Namespace) -> None:
    from tabstream.pipeline.inspect import inspect_dataset

    read_kwargs = _criteo_read_kwargs(args.path, args.engine) if args.criteo_tsv else {}
    ds = _dataset(args.path, args.engine, args.part_size, read_kwargs)
    report = inspect_dataset(ds)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.path}: {report['num_rows']:,} rows in {report['num_files']} files, "
          f"{report['npartitions']} partitions")
    print(f"{'column':<14} {'dtype':<8} {'tags':<34} {'null %':>7} {'distinct':>10} {'cardinality':>11}")
    for col in report["columns"]:
        card = "" if col["cardinality"] is None else f"{col['cardinality']:,}"
        print(f"{col['name']:<14} {col['dtype']:<8} {','.join(col['tags']):<34} "
              f"{100 * col['null_rate']:>6.2f}% {col['distinct']:>10,} {card:>11}")


def cmd_train(args: argparse.Namespace) -> None:
    import os

    from tabstream.train.runner import train_on_export

    history = train_on_export(args.train, args.valid, model=args.model, epochs=args.epochs,
                              batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                              progress=not args.quiet, checkpoint_dir=args.checkpoint_dir,
                              resume=not args.no_resume)
    resumed = history["resumed_from"]
    if resumed is not None:
        ckpt = os.path.join(args.checkpoint_dir, "checkpoint.pt")
        done, step = resumed
        where = f"{done} epoch(s) done" + (f", {step} batches into epoch {done + 1}" if step else "")
        if done >= args.epochs:
            print(f"{ckpt}: all {args.epochs} epoch(s) already trained ({where}); nothing to "
                  f"train. Pass --epochs {done + 1} or more to train on, or --no-resume to "
                  "start over")
        else:
            print(f"resumed from {ckpt}: {where}; training epochs {done + 1} to {args.epochs}")
    for i in range(len(history["loss"])):
        line = (f"epoch {i + 1}: loss {history['loss'][i]:.4f}  "
                f"{history['samples_per_sec'][i]:,.0f} samples/s")
        if "val_auc" in history:
            line += f"  val AUC {history['val_auc'][i]:.4f}  val log-loss {history['val_log_loss'][i]:.4f}"
        print(line)


def cmd_demo(args: argparse.Namespace) -> None:
    from tabstream.demo import run_demo

    run_demo(rows=args.rows, output=args.output, days=args.days, seed=args.seed,
             train=not args.no_train, progress=not args.quiet)


# -- parser -------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabstream",
        description="Raw recommender logs to training-ready parquet, and batches into models.",
    )
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)

    def data_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--engine", choices=["parquet", "csv"], help="input format (default: from extension)")
        p.add_argument("--part-size", default=None, help="partition size, e.g. 64MB")
        p.add_argument("--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("synth", help="write synthetic Criteo-like or e-commerce logs")
    p.add_argument("name", choices=["criteo", "e-commerce"])
    p.add_argument("output", help="output folder")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--files", type=int, default=1)
    p.add_argument("--format", choices=["tsv", "parquet"], default="parquet")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probabilities", action="store_true",
                   help="also write the true click probabilities (probabilities/*.parquet)")
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("fit", help="fit a workflow (built-in recipe or a Python file) and export")
    p.add_argument("input", help="raw data: parquet or TSV files, folder or glob")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--recipe", choices=["criteo"], default="criteo")
    src.add_argument("--workflow-file", help="Python file defining `workflow` (and `dataset_kwargs`)")
    p.add_argument("--freq-threshold", type=int, default=15, help="Categorify threshold (recipe)")
    p.add_argument("--workflow-dir", help="save the fitted workflow here")
    p.add_argument("--output", help="also export the transformed data here")
    p.add_argument("--out-files-per-proc", type=int, default=None)
    p.add_argument("--shuffle", choices=["per_partition", "per_worker", "full"], default=None)
    p.add_argument("--overwrite", action="store_true")
    data_opts(p)
    p.set_defaults(func=cmd_fit)

    p = sub.add_parser("transform", help="apply a saved workflow to new data")
    p.add_argument("workflow_dir")
    p.add_argument("input")
    p.add_argument("output")
    p.add_argument("--criteo-tsv", action="store_true", help="input is headerless Criteo TSV")
    p.add_argument("--out-files-per-proc", type=int, default=None)
    p.add_argument("--num-files", type=int, default=None)
    p.add_argument("--shuffle", choices=["per_partition", "per_worker", "full"], default=None)
    p.add_argument("--overwrite", action="store_true")
    data_opts(p)
    p.set_defaults(func=cmd_transform)

    p = sub.add_parser("inspect", help="schema, row counts, cardinalities and null rates")
    p.add_argument("path")
    p.add_argument("--criteo-tsv", action="store_true", help="input is headerless Criteo TSV")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    data_opts(p)
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("train", help="train a bundled PyTorch model (DLRM, DCN, Wide&Deep) on an export")
    p.add_argument("train", help="export folder to train on (tabstream fit/transform output)")
    p.add_argument("--valid", help="export folder to validate on (AUC, log-loss)")
    p.add_argument("--model", choices=["dlrm", "dcn", "wide_and_deep"], default="dlrm")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=2048)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir",
                   help="save a checkpoint here after every epoch; a rerun resumes from it "
                        "(model, optimizer, epoch, shuffle) and trains only the epochs left")
    p.add_argument("--no-resume", action="store_true",
                   help="with --checkpoint-dir: ignore the checkpoint there, train from scratch "
                        "and overwrite it")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("demo", help="synthetic raw TSV logs -> fit -> train/valid export (-> training)")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--days", type=int, default=4, help="raw files; the last one is the validation day")
    p.add_argument("--output", default="demo_out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-train", action="store_true", help="stop after the export")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line instead of a traceback
        if args.debug:
            raise
        print(_error_line(args.command, exc), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


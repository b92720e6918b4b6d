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
import contextlib
import importlib.util
import json
import keyword
import os
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
    "ImportError": "install the optional dependency the message names",
    "FunctionResolutionError": "a function of your own loads with --allow-module MODULE, run from "
                               "the folder of MODULE.py or with PYTHONPATH=that folder",
}


#: hints of commands that differ from the table's (``--overwrite`` is fit's and transform's)
_COMMAND_HINTS = {
    ("synth", "FileExistsError"): "write into a new or empty folder, or one of an earlier "
                                  "`tabstream synth` run (its files are replaced)",
    ("demo", "FileExistsError"): "pass --output a new folder, an empty one or one of an earlier "
                                 "demo run (its raw/, train/, valid/, workflow/ are replaced)",
    ("reshard", "FileExistsError"): "pass a new or empty output folder",
}


def _error_line(command: str, exc: BaseException) -> str:
    """One line naming the error, plus a hint: the error's own ``hint`` when it has
    one, else the command's, else the table's."""
    name = type(exc).__name__
    hint = (getattr(exc, "hint", None) or _COMMAND_HINTS.get((command, name))
            or _HINTS.get(name, "run again with --debug for the full traceback"))
    message = " ".join(str(exc).split())  # Arrow messages may span lines
    return f"tabstream {command}: {name}: {message}\n  hint: {hint}"


def _criteo_read_kwargs(path: str, engine: str | None) -> dict[str, Any]:
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES

    if engine == "parquet" or str(path).rstrip("/").endswith((".parquet", ".pq")):
        return {}
    if engine is None and not _text_files(path, engine)[1]:
        return {}  # a folder of parquet files (an export): the raw-log options do not apply
    return {"names": CRITEO_COLUMNS, "dtypes": CRITEO_DTYPES, "sep": "\t"}


_SEP_NAMES = {"tab": "\t", "\\t": "\t", "comma": ",", "space": " ", "pipe": "|", "semicolon": ";"}


def _positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1 (``--epochs 0`` trained nothing,
    silently)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
    return value


def _parse_sep(sep: str) -> str:
    value = _SEP_NAMES.get(sep, sep)
    if len(value) != 1:
        raise ValueError(f"--sep {sep!r}: expected one character (or tab, comma, space, pipe, "
                         "semicolon, '\\t'); raw logs have a one-character separator")
    return value


def _parse_names(names: str) -> list[str]:
    parsed = [n.strip() for n in names.split(",")]
    empty = [i + 1 for i, n in enumerate(parsed) if not n]
    if empty:
        raise ValueError(f"--names {names!r}: name {empty[0]} is empty; expected comma-separated "
                         "column names such as label,I1,C1")
    dupes = sorted({n for n in parsed if parsed.count(n) > 1})
    if dupes:
        raise ValueError(f"--names {names!r}: {dupes} given more than once; column names must be unique")
    return parsed


def _parse_dtypes(dtypes: str) -> dict[str, str]:
    from tabstream.core.dtypes import dtype_to_arrow_type

    out: dict[str, str] = {}
    for item in dtypes.split(","):
        name, eq, dtype = item.partition("=")
        name, dtype = name.strip(), dtype.strip()
        if not eq or not name or not dtype:
            raise ValueError(f"--dtypes {dtypes!r}: {item!r} is not NAME=DTYPE; expected e.g. "
                             "I1=float32,C1=string")
        try:
            dtype_to_arrow_type(dtype)
        except TypeError as exc:
            raise TypeError(f"--dtypes: column {name!r}: {exc}") from exc
        out[name] = dtype
    return out


def _text_files(path: str, engine: str | None) -> tuple[Any, list[str]]:
    """The filesystem and files of ``path`` when they are raw text (CSV/TSV), else
    no files. A path that does not exist yields none: the Dataset names it."""
    from tabstream.pipeline.paths import expand_paths, infer_engine

    if engine == "parquet":
        return None, []
    try:
        fs, files, _ = expand_paths(path, {}, engine)
        if not files or (engine is None and infer_engine(files) != "csv"):
            return None, []
    except (ValueError, OSError):
        return None, []
    return fs, files


def _looks_like_data(fields: list[str]) -> str | None:
    """Why ``fields`` (line 1 of a text file) are not column names, or None."""
    for field in fields:
        if not field.strip():
            return "an empty field"
        try:
            float(field)
        except ValueError:
            continue
        return f"the number {field!r}"
    if len(set(fields)) < len(fields):
        return "repeated fields"
    return None


def _check_header_line(path: str, engine: str | None, sep: str | None, criteo_flag: bool = True) -> None:
    """Raw text without ``--names``: refuse when line 1 is plainly a row of data,
    rather than read it as the column names (``criteo_flag``: the command has
    ``--criteo-tsv``, which the hint then offers)."""
    fs, files = _text_files(path, engine)
    if not files:
        return
    with fs.open(files[0], "rb", compression="infer") as f:
        first = f.readline().removeprefix(b"\xef\xbb\xbf").rstrip(b"\r\n").decode(errors="replace")
    if sep is None:
        sep = "\t" if files[0].endswith((".tsv", ".tsv.gz")) else ","
    why = _looks_like_data(first.split(sep))
    if why is not None:
        from tabstream.core.errors import DataError

        raise DataError(
            f"{files[0]}, line 1 holds {why}, so it is a row of data, not column names "
            f"({first[:80]!r}); a headerless raw log needs its column names",
            hint="pass --names label,I1,...,C1,... (and --dtypes NAME=DTYPE,...), "
                 + ("--criteo-tsv for Criteo-shaped logs, " if criteo_flag else "")
                 + "or --header if line 1 holds the names",
        )


def _read_kwargs(args: argparse.Namespace, path: str, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """Dataset arguments for raw text from --criteo-tsv / --sep / --names / --header /
    --dtypes, extending ``base`` (a workflow file's ``dataset_kwargs``, a recipe's
    Criteo settings): each option replaces its setting, ``--dtypes`` adds to the
    dtypes, and ``--names`` keeps only the dtypes of the columns it names. Parquet
    needs none."""
    kwargs: dict[str, Any] = dict(base or {})
    if getattr(args, "criteo_tsv", False):
        kwargs = {**_criteo_read_kwargs(path, "csv"), **kwargs}
    if args.sep is not None:
        kwargs["sep"] = _parse_sep(args.sep)
    if args.names is not None:
        kwargs["names"] = _parse_names(args.names)
        if "dtypes" in kwargs:
            kwargs["dtypes"] = {k: v for k, v in kwargs["dtypes"].items() if k in kwargs["names"]}
    if args.header:
        kwargs["header"] = True
    if args.dtypes is not None:
        kwargs["dtypes"] = {**kwargs.get("dtypes", {}), **_parse_dtypes(args.dtypes)}
    if "names" not in kwargs and not kwargs.get("header"):
        _check_header_line(path, args.engine, kwargs.get("sep"), hasattr(args, "criteo_tsv"))
    return kwargs


def _given_raw_options(args: argparse.Namespace) -> bool:
    return args.header or any(v is not None for v in (args.sep, args.names, args.dtypes))


def _dataset(path: str, engine: str | None, part_size: str | None, read_kwargs: dict[str, Any]):
    from tabstream import Dataset

    return Dataset(path, engine=engine, part_size=part_size, **read_kwargs)


def _refuse_existing(path: str | None, overwrite: bool, what: str) -> None:
    """Before any work: refuse an output the export would refuse at its end, by the
    export's own rule (a folder of other files takes an export; one holding an
    export needs --overwrite)."""
    import fsspec

    from tabstream.pipeline.export_folder import check_target

    if path is None or overwrite:
        return
    fs, _, (root,) = fsspec.get_fs_token_paths(path)
    try:
        check_target(fs, root.rstrip("/"), path, overwrite)
    except FileExistsError as exc:
        raise FileExistsError(f"{what} {exc}; nothing was fitted or written") from None


def _refuse_input_as_output(ds: Any, path: str | None, what: str) -> None:
    """Before any work: the output must not be an input file or a folder holding
    one (the export's own rule, asked before the fit; ``--overwrite`` does not lift it)."""
    import fsspec

    from tabstream.pipeline.export_folder import refuse_input_overlap

    if path is None:
        return
    fs, _, (root,) = fsspec.get_fs_token_paths(path)
    try:
        refuse_input_overlap(fs, root.rstrip("/"), path, ds.fs, ds.files)
    except FileExistsError as exc:
        error = FileExistsError(f"{what} {exc}; nothing was fitted or written")
        error.hint = f"pass an {what} path outside the input"  # type: ignore[attr-defined]
        raise error from None


def _refuse_workflow_dir(path: str | None) -> None:
    """Before any work: refuse a ``--workflow-dir`` that :meth:`Workflow.save` would
    refuse at its end, by the save's own rule: a new or empty folder, or one holding
    an earlier save (replaced whole, with or without ``--overwrite``); a local folder
    holding anything else is refused. On an object store the save writes in place
    and refuses nothing."""
    import fsspec

    from tabstream.pipeline.stores import is_local
    from tabstream.pipeline.workflow import check_save_target  # the save's own check

    if path is None:
        return
    fs, _, (root,) = fsspec.get_fs_token_paths(path)
    if not is_local(fs):
        return
    try:
        check_save_target(os.path.abspath(root).rstrip(os.sep))
    except FileExistsError as exc:
        error = FileExistsError(f"--workflow-dir {path}: {exc}; nothing was fitted or written")
        error.hint = ("--workflow-dir takes a new or empty folder, or one of an earlier save "  # type: ignore[attr-defined]
                      "(replaced whole); --overwrite applies to --output only")
        raise error from None


def _check_saveable(wf: Any, unnamed: str | None) -> list[str]:
    """Before fitting with ``--workflow-dir``: every op's parameters can be written
    as :meth:`Workflow.save` writes them (a user function must have an importable
    name), so a failing save ends the command before the fit, not after it.
    ``unnamed``: why functions of the workflow file have no module name, if so.
    Returns the modules the saved functions come from."""
    from tabstream.ops.functions import FunctionResolutionError

    modules = []
    for node in wf.output_node.walk():
        if node.kind != "op":
            continue
        f = getattr(node.op, "f", None)
        try:
            node.op.to_config()
        except FunctionResolutionError as exc:
            if unnamed is not None and getattr(f, "__module__", None) == _UNNAMED_MODULE:
                raise FunctionResolutionError(
                    f"--workflow-dir: cannot save {type(node.op).__name__}'s function "
                    f"{getattr(f, '__qualname__', f)!r}: {unnamed}; nothing was fitted",
                    hint="rename the workflow file to a Python module name of its own, "
                         "e.g. my_workflow.py") from exc
            raise FunctionResolutionError(f"--workflow-dir: the workflow cannot be saved: {exc}; "
                                          "nothing was fitted", hint=exc.hint) from exc
        module = getattr(f, "__module__", None)
        if callable(f) and isinstance(module, str) and module not in modules:
            modules.append(module)
    return modules


@contextmanager
def _phase(timings: dict[str, float], name: str):
    start = time.perf_counter()
    yield
    timings[name] = time.perf_counter() - start


#: the module name of a workflow file whose file name cannot be one (not in sys.modules)
_UNNAMED_MODULE = "tabstream_user_workflow"
#: module names this process gave to workflow files (a later file may take the name again)
_WORKFLOW_MODULES: set[str] = set()


def _load_workflow_file(path: str) -> tuple[Any, dict[str, Any], str | None]:
    """A user's Python file defining ``workflow`` (or ``build_workflow()``) and,
    optionally, ``dataset_kwargs`` for reading the raw data.

    The file is imported as Python imports a module: ``dir/my_wf.py`` becomes module
    ``my_wf`` in ``sys.modules``, with ``dir`` first on ``sys.path`` (as for a script,
    so it may import its neighbours), and a ``LambdaOp`` of a function defined in it
    is saved as ``"my_wf:double"``; ``tabstream transform ... --allow-module my_wf``
    loads it where ``my_wf`` is importable (``PYTHONPATH=dir``). The third value
    says why the file could not be given its own name (not an identifier, or the name
    of a module already imported), else None."""
    from tabstream import Workflow

    if os.path.isdir(path):
        raise ValueError(f"workflow file {path!r} is a folder; --workflow-file takes a Python file "
                         "defining `workflow` (a saved workflow folder is applied with `tabstream transform`)")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"workflow file {path!r} does not exist")
    if not path.endswith(".py"):
        raise ValueError(f"workflow file {path!r} is not a Python file (.py) defining `workflow`")
    folder, stem = os.path.split(os.path.abspath(path))
    stem = stem[:-len(".py")]
    unnamed = None
    if not stem.isidentifier() or keyword.iskeyword(stem):
        unnamed = f"its file name {stem!r} is not a Python module name"
    elif stem in sys.modules and stem not in _WORKFLOW_MODULES:
        unnamed = f"its file name {stem!r} is the name of module {stem!r}, which is already imported"
    name = _UNNAMED_MODULE if unnamed else stem
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot load workflow file {path!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    if unnamed is None:
        # registered, so its functions have an importable name (Workflow.save needs one)
        sys.modules[name] = module
        _WORKFLOW_MODULES.add(name)
        if folder not in sys.path:
            sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if unnamed is None:
            sys.modules.pop(name, None)
        raise
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
    return wf, dict(read_kwargs), unnamed


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
    # Refuse before fitting: an hour of fit must not end in "already exists".
    _refuse_existing(args.output, args.overwrite, "output folder")
    _refuse_workflow_dir(args.workflow_dir)
    unnamed = None
    if args.workflow_file:
        wf, read_kwargs, unnamed = _load_workflow_file(args.workflow_file)
        if _given_raw_options(args) or not read_kwargs:  # the options extend the file's settings
            read_kwargs = _read_kwargs(args, args.input, read_kwargs)
    else:
        from tabstream.recipes import RECIPES

        wf = RECIPES[args.recipe](freq_threshold=args.freq_threshold)
        # the recipe reads Criteo-shaped logs unless the options say otherwise
        read_kwargs = _criteo_read_kwargs(args.input, args.engine)
        if _given_raw_options(args):  # extending the Criteo settings (raw text)
            read_kwargs = _read_kwargs(args, args.input, read_kwargs)
    modules = _check_saveable(wf, unnamed) if args.workflow_dir else []
    ds = _dataset(args.input, args.engine, args.part_size, read_kwargs)
    _refuse_input_as_output(ds, args.output, "--output")
    timings: dict[str, float] = {}
    with _phase(timings, "fit"):
        wf.fit(ds, progress=not args.quiet)
    if args.workflow_dir:
        wf.save(args.workflow_dir)
        print(f"saved workflow to {args.workflow_dir}")
        own = [m for m in modules if m in _WORKFLOW_MODULES]
        if own and args.workflow_file:
            folder = os.path.dirname(os.path.abspath(args.workflow_file))
            print(f"its functions come from {args.workflow_file} (module {own[0]}): apply it with "
                  f"PYTHONPATH={folder} tabstream transform {args.workflow_dir} ... --allow-module {own[0]}")
    if args.output:
        with _phase(timings, "export"):
            wf.transform(ds).to_parquet(args.output, out_files_per_proc=args.out_files_per_proc,
                                        shuffle=args.shuffle, overwrite=args.overwrite,
                                        progress=not args.quiet)
        print(f"exported to {args.output}")
    from tabstream.reporting import print_timings, schema_summary

    print(schema_summary(wf.output_schema))
    print_timings(timings)


def cmd_transform(args: argparse.Namespace) -> None:
    from tabstream import Workflow

    _refuse_existing(args.output, args.overwrite, "output folder")
    wf = Workflow.load(args.workflow_dir, allowed_modules=args.allow_module or None)
    ds = _dataset(args.input, args.engine, args.part_size, _read_kwargs(args, args.input))
    _refuse_input_as_output(ds, args.output, "output")
    result = wf.transform(ds).to_parquet(args.output, out_files_per_proc=args.out_files_per_proc,
                                         num_files=args.num_files, shuffle=args.shuffle,
                                         overwrite=args.overwrite, progress=not args.quiet)
    print(f"wrote {result.num_rows:,} rows to {len(result.files)} files in {args.output}")


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def cmd_inspect(args: argparse.Namespace) -> None:
    from tabstream.pipeline.inspect import inspect_dataset, write_plots

    if args.plots:
        from tabstream.pipeline.inspect import import_pyplot

        import_pyplot()  # a missing matplotlib fails now, not after the pass over the data
    ds = _dataset(args.path, args.engine, args.part_size, _read_kwargs(args, args.path))
    report = inspect_dataset(ds, progress=False if args.quiet else None, top=args.top,
                             histograms=bool(args.plots))
    if args.plots:
        written = write_plots(report, args.plots)
        print(f"wrote {len(written)} pictures to {args.plots} (overview.png first)",
              file=sys.stderr if args.json else sys.stdout)
    for col in report["columns"]:
        col.pop("_summary", None)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"{args.path}: {report['num_rows']:,} rows in {report['num_files']} files, "
          f"{report['npartitions']} partitions")
    print(f"{'column':<14} {'dtype':<8} {'tags':<30} {'null %':>7} {'distinct':>10} {'cardinality':>11}"
          f" {'min':>9} {'median':>9} {'max':>9} {'mean':>9} {'std':>9}")
    for col in report["columns"]:
        card = "" if col["cardinality"] is None else f"{col['cardinality']:,}"
        distinct = ("" if col["distinct_exact"] else "~") + f"{col['distinct']:,}"
        median = col.get("quantiles", {}).get("0.5")
        print(f"{col['name']:<14} {col['dtype']:<8} {','.join(col['tags']):<30} "
              f"{100 * col['null_rate']:>6.2f}% {distinct:>10} {card:>11} "
              + " ".join(f"{_fmt(v):>9}" for v in (col.get("min"), median, col.get("max"),
                                                   col.get("mean"), col.get("std"))))
    print("\ntop values (count)" + ("" if all(c.get("top_exact", True) for c in report["columns"])
                                     else "; ~: approximate"))
    for col in report["columns"]:
        if col.get("top"):
            mark = "" if col["top_exact"] else "~"
            shown = ", ".join(f"{str(t['value'])[:20]} ({mark}{t['count']:,})" for t in col["top"])
            print(f"  {col['name']:<14} {shown}")
    lists = [c for c in report["columns"] if "list_length" in c]
    if lists:
        print("\nlist lengths        min      max     mean")
        for col in lists:
            ln = col["list_length"]
            print(f"  {col['name']:<14} {_fmt(ln['min']):>8} {_fmt(ln['max']):>8} {_fmt(ln['mean']):>8}")


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


def _plan_arg(text: str | None) -> str | dict[str, str] | None:
    """``--plan``: a strategy name, or ``TABLE=TYPE,TABLE=TYPE`` overrides of "auto"."""
    if text is None or "=" not in text:
        return text
    pairs = [item.split("=", 1) for item in text.split(",") if item.strip()]
    return {name.strip(): kind.strip() for name, kind in pairs}


def _is_keras_checkpoint(directory: str) -> bool:
    """Whether ``directory`` holds a Keras HybridParallel checkpoint, from its own
    metadata: a ``worker-<r>-of-<W>/step-*/index.json`` of the Keras whole-table layout
    (a torch one has ``checkpoint.dcp.json``). Read as JSON: no framework imported."""
    import json
    from pathlib import Path

    root = Path(directory)
    if (root / "checkpoint.dcp.json").exists():
        return False
    for index in sorted(root.glob("worker-*-of-*/step-*/index.json"))[:1]:
        try:
            doc = json.loads(index.read_text())
        except (OSError, ValueError):
            return False
        return isinstance(doc, dict) and str(doc.get("format", "")).startswith(
            "tabstream.keras-whole-tables/")
    return False


def cmd_reshard(args: argparse.Namespace) -> None:
    if _is_keras_checkpoint(args.checkpoint):
        from tabstream.train.tensorflow.distributed import reshard
        workers = "workers"
    else:
        from tabstream.train.torch.distributed import reshard  # type: ignore[assignment]
        workers = "ranks"

    written = reshard(args.checkpoint, args.output, args.world_size, plan=_plan_arg(args.plan))
    what = ("a single-process checkpoint" if args.world_size == 1
            else f"a checkpoint for {args.world_size} {workers}")
    print(f"wrote {what}: {written}")


def cmd_demo(args: argparse.Namespace) -> None:
    from tabstream.demo import run_demo

    run_demo(rows=args.rows, output=args.output, days=args.days, seed=args.seed,
             train=not args.no_train, progress=not args.quiet)


# -- parser -------------------------------------------------------------------
class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows every option's default (in words where the help says ``default: ...``
    itself); keeps the examples in descriptions as written."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default:" in text else super()._get_help_string(action)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tabstream")
    except PackageNotFoundError:  # run from a source tree that is not installed
        from tabstream import __version__

        return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tabstream", formatter_class=_Formatter,
        description="Raw recommender logs to training-ready parquet, and batches into models.",
        epilog="Run `tabstream COMMAND --help` for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"tabstream {_version()}",
                        help="print the version and exit")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description or help, formatter_class=_Formatter)

    def data_opts(p: argparse.ArgumentParser, criteo_flag: bool = True) -> None:
        from tabstream.pipeline.dataset import DEFAULT_PART_SIZE

        g = p.add_argument_group("reading the input")
        g.add_argument("--engine", choices=["parquet", "csv"], default=None,
                       help="input format (default: from the file extension: .parquet, .csv, .tsv, .gz)")
        g.add_argument("--part-size", default=None,
                       help=f"partition size in memory, e.g. 32MB (default: {DEFAULT_PART_SIZE >> 20}MB)")
        if criteo_flag:
            g.add_argument("--criteo-tsv", action="store_true",
                           help="raw text is headerless Criteo TSV (label, I1..I13, C1..C26)")
        g.add_argument("--sep", default=None,
                       help="field separator of raw text: one character, or tab/comma/space/pipe/"
                            "semicolon (default: tab for .tsv, comma otherwise)")
        g.add_argument("--names", default=None,
                       help="comma-separated column names of headerless raw text, e.g. label,I1,C1 "
                            "(default: line 1 holds the names)")
        g.add_argument("--header", action="store_true",
                       help="line 1 of raw text holds column names (skipped when --names is given)")
        g.add_argument("--dtypes", default=None,
                       help="column types of raw text, e.g. label=int8,I1=float32 (default: "
                            "undeclared columns are inferred from the first block: int64, "
                            "float64, bool or string)")
        g.add_argument("--quiet", action="store_true", help="no progress bars")

    def export_opts(p: argparse.ArgumentParser) -> None:
        g = p.add_argument_group("writing the export")
        g.add_argument("--out-files-per-proc", type=int, default=None,
                       help="data files per worker (a thread of the local scheduler, or a dask "
                       "worker) that has a partition to read; the rows are split equally over all "
                       "files, which differ by at most one row (default: 1)")
        g.add_argument("--shuffle", choices=["per_partition", "per_worker", "full"], default=None,
                       help="shuffle rows while writing (default: keep the input order)")
        g.add_argument("--overwrite", action="store_true",
                       help="replace an existing output folder (refused otherwise, before any work)")

    p = add("synth", "write synthetic Criteo-like or e-commerce logs")
    p.add_argument("name", choices=["criteo", "e-commerce"], help="which data set to imitate")
    p.add_argument("output", help="output folder: new, empty or one of an earlier synth run, whose "
                                  "part_* files (and probabilities/) are replaced; a folder holding "
                                  "other files is refused")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows in all")
    p.add_argument("--files", type=int, default=1, help="number of files the rows are split into")
    p.add_argument("--format", choices=["tsv", "parquet"], default="parquet",
                   help="tsv: headerless raw logs; parquet: typed columns")
    p.add_argument("--seed", type=int, default=0, help="random seed; same seed, same data")
    p.add_argument("--probabilities", action="store_true",
                   help="also write the true click probabilities (probabilities/*.parquet)")
    p.set_defaults(func=cmd_synth)

    p = add("fit", "fit a workflow (built-in recipe or a Python file) and export",
            "Fit a workflow on raw data, save it, and export the transformed data.\n\n"
            "  tabstream fit raw/ --recipe criteo --workflow-dir wf/ --output out/train\n"
            "  tabstream fit logs/ --workflow-file my_wf.py --sep tab --names label,I1,C1 "
            "--dtypes I1=float32 --output out/")
    p.add_argument("input", help="raw data: parquet, CSV or TSV files, a folder or a quoted glob")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--recipe", choices=["criteo"], default="criteo",
                     help="built-in workflow; reads headerless Criteo TSV unless --names/--sep/"
                          "--header/--dtypes say otherwise")
    src.add_argument("--workflow-file", default=None,
                     help="Python file defining `workflow` (and optionally `dataset_kwargs`, which "
                          "--names/--sep/--header/--dtypes extend) (default: use --recipe)")
    p.add_argument("--freq-threshold", type=int, default=15,
                   help="recipe: Categorify keeps values seen at least this often")
    p.add_argument("--workflow-dir", default=None,
                   help="save the fitted workflow here: a new or empty folder, or one of an earlier "
                        "save, which is replaced; a folder holding other files is refused before "
                        "the fit (--overwrite applies to --output only) (default: not saved)")
    p.add_argument("--output", default=None,
                   help="also export the transformed data here (default: no export)")
    export_opts(p)
    data_opts(p, criteo_flag=False)
    p.set_defaults(func=cmd_fit)

    p = add("transform", "apply a saved workflow to new data")
    p.add_argument("workflow_dir", help="folder written by `tabstream fit --workflow-dir` or Workflow.save")
    p.add_argument("input", help="data to transform: parquet, CSV or TSV files, a folder or a quoted glob")
    p.add_argument("output", help="export folder to write")
    p.add_argument("--num-files", type=int, default=None,
                   help="total number of data files (default: from --out-files-per-proc)")
    p.add_argument("--allow-module", action="append", default=[], metavar="MODULE",
                   help="a module of your own the workflow's functions may be imported from "
                   "(repeatable; Workflow.load's allowed_modules): only for code you trust; "
                   "found on PYTHONPATH or in the current directory (a `fit --workflow-file "
                   "dir/my_wf.py` saves its functions as module my_wf)")
    export_opts(p)
    data_opts(p)
    p.set_defaults(func=cmd_transform)

    p = add("inspect", "per-column statistics of raw logs, parquet or an export",
            "Per column: type, null rate, approximate distinct count; min/max/mean/std and "
            "quantiles of numbers, top values of categories, lengths of lists.\n\n"
            "  tabstream inspect out/train\n"
            "  tabstream inspect raw/day_0.tsv --criteo-tsv --plots plots/")
    p.add_argument("path", help="parquet, CSV or TSV files, a folder (an export) or a quoted glob")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plots", default=None, metavar="DIR",
                   help="write PNG histograms / top-value charts and overview.png here; needs "
                        "matplotlib: pip install 'tabstream[plots]' (default: no pictures)")
    p.add_argument("--top", type=_positive_int, default=10,
                   help="top values listed per categorical column, in the text report and --json")
    data_opts(p)
    p.set_defaults(func=cmd_inspect)

    p = add("train", "train a bundled PyTorch model (DLRM, DCN, Wide&Deep) on an export")
    p.add_argument("train", help="export folder to train on (tabstream fit/transform output)")
    p.add_argument("--valid", default=None,
                   help="export folder to validate on: AUC, log-loss (default: no validation)")
    p.add_argument("--model", choices=["dlrm", "dcn", "wide_and_deep"], default="dlrm",
                   help="which bundled model to train")
    p.add_argument("--epochs", type=_positive_int, default=1, help="passes over the training export")
    p.add_argument("--batch-size", type=_positive_int, default=2048, help="rows per batch")
    p.add_argument("--lr", type=float, default=3e-3, help="learning rate")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's initial weights and the shuffle")
    p.add_argument("--checkpoint-dir", default=None,
                   help="save a checkpoint here after every epoch; a rerun resumes from it "
                        "(model, optimizer, epoch, shuffle) and trains only the epochs left "
                        "(default: no checkpoints)")
    p.add_argument("--no-resume", action="store_true",
                   help="with --checkpoint-dir: ignore the checkpoint there, train from scratch "
                        "and overwrite it")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_train)

    p = add("reshard", "convert a sharded training checkpoint for another number of ranks",
            "Convert the sharded checkpoint a HybridParallel run wrote (its checkpoint_dir; torch "
            "or Keras, told by the checkpoint's own metadata) for another number of ranks and "
            "plan, optimizer state and training position included.\n\nexamples:\n  tabstream reshard ck/ ck3/ --world-size 3\n"
            "  tabstream reshard ck/ one/ --world-size 1      # a checkpoint.pt for one process\n"
            "  tabstream reshard ck/ ck4/ --world-size 4 --plan C1=row_wise,C2=column_wise")
    p.add_argument("checkpoint", help="the checkpoint_dir holding checkpoint.dcp.json (torch) "
                   "or worker-<r>-of-<W>/ folders (Keras)")
    p.add_argument("output", help="a new or empty folder for the converted checkpoint")
    p.add_argument("--world-size", type=int, required=True,
                   help="ranks of the run that will resume from it; 1 writes a plain "
                        "checkpoint (torch: checkpoint.pt; Keras: checkpoint.json and "
                        "checkpoint.arrays/) that single-process fit(resume=True) of the "
                        "unwrapped model loads (default: none, it must be given)")
    p.add_argument("--plan", default=None,
                   help="the new run's plan: auto, table_wise, row_wise, column_wise, "
                        "data_parallel, or TABLE=TYPE,... overriding auto (default: auto)")
    p.set_defaults(func=cmd_reshard)

    p = add("demo", "synthetic raw TSV logs -> fit -> train/valid export (-> training)")
    p.add_argument("--rows", type=int, default=1_000_000, help="raw rows written in all")
    p.add_argument("--days", type=int, default=4, help="raw files; the last one is the validation day")
    p.add_argument("--output", default="demo_out",
                   help="folder for the raw logs, workflow and exports: new, empty or one of an "
                        "earlier demo run, whose raw/, train/, valid/, workflow/ are replaced; a "
                        "folder holding anything else is refused")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the shuffle and the model")
    p.add_argument("--no-train", action="store_true", help="stop after the export")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not at the exit's flush
    except BrokenPipeError:
        # The reader closed the pipe (`tabstream inspect out/ | head -1`): stop quietly,
        # as `seq 1 100000 | head -1` does; 141 (128 + SIGPIPE) is the status a shell
        # reports for such a tool. stdout goes to devnull so the flush at exit raises
        # nothing (Python's docs, signal module: "Note on SIGPIPE").
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # one clear line instead of a traceback
        if args.debug:
            raise
        print(_error_line(args.command, exc), file=sys.stderr)
        return 1
    return 0


def _silence_stdout() -> None:
    """Point stdout's file descriptor at devnull (a closed pipe: see ``main``); output
    captured without a descriptor has nothing to flush."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":
    sys.exit(main())


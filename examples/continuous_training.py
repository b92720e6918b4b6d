"""Continuous training with the embedding cache: file lists, keysets, passes,
incremental exports and a resume after a crash.

    python examples/continuous_training.py                       # 6 x 50,000 rows
    python examples/continuous_training.py --rows 6000 --lists 3 --passes 1
    python examples/continuous_training.py --framework tensorflow   # the same flow in Keras
    python examples/continuous_training.py --living-vocabulary   # fixed vs living vocabulary,
                                                                 # drifting ids (living_vocabulary.py)

Steps:

1. Criteo-like logs, one file per "file list" (a day of logs, say) plus one held
   out for validation. The Criteo recipe is fitted once on the training lists
   and every list is exported on its own with ``write_keysets=True``: beside the
   data, ``_keysets/*.parquet`` holds the distinct ids of each categorical column.
2. A :class:`ParameterServer` on disk holds every embedding table (16 wide) and
   its Adagrad state; a :class:`CachedEmbeddings` keeps the hot rows in memory
   and a ``DLRM`` reads its embeddings through it. The MLPs train with Adam.
3. The training job is one function run on every start, a restart after a
   crash included: ``ParameterServer.open_or_create`` reopens the server (as
   committed at the last checkpoint), and ``fit_lists`` trains the lists in
   order, ``--passes`` times, staging each list's rows by its keysets first and
   exporting its delta (the rows it changed) to ``deltas/<position>`` after it.
   Lists already trained are skipped, the list cut short resumes inside itself,
   each delta is written once: no glue code decides what is left to do.
4. The first start crashes in the second pass half way through a list: with
   torch the loader raises; with ``--framework tensorflow`` the job runs in a
   child process that is killed there with ``kill -9`` (SIGKILL: no cleanup, the
   server's updates since its last commit are rolled back when it is reopened).
   The second start finishes the job.

With ``--framework tensorflow`` the model is the Keras ``DLRM`` over
``tabstream.train.tensorflow.CachedEmbeddings`` (the same ``ParameterServer``),
read by the TensorFlow loader and trained by ``tabstream.train.tensorflow.fit_lists``.

Prints one line per list, for example::

    pass 1 list 1: loss 0.5214  val_auc 0.7012  delta 21,345 rows  hit rate 0.41
    ...
    pass 2 list 3: crashed after 6 batches; restarting the job
    pass 2 list 3: loss 0.4732  val_auc 0.7611  delta 18,112 rows  hit rate 0.66 (resumed)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from typing import Any

import pyarrow.parquet as pq


class CrashingLoader:
    """Wraps a loader and raises after ``after`` batches of its ``on_pass``-th
    iteration: a stand-in for a crash."""

    def __init__(self, loader: Any, after: int, on_pass: int, kill: bool = False) -> None:
        from tabstream.train.loop import data_identity

        self.loader, self.after, self.on_pass, self.passes = loader, after, on_pass, 0
        self.kill = kill  # a real crash: this process gets SIGKILL (kill -9)
        self.data_id = data_identity(loader)  # the same file list as the loader it wraps

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        self.passes += 1
        for i, batch in enumerate(self.loader):
            if self.passes == self.on_pass and i == self.after:
                if self.kill:
                    print(f"killing this process (kill -9) after {i} batches", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError(f"simulated crash after {i} batches")
            yield batch


def build_exports(workdir: str, rows: int, lists: int, seed: int) -> tuple[list[str], str]:
    """Raw Criteo-like files -> one export (with keysets) per list, and a valid export."""
    import tabstream as ts
    from tabstream.datasets.synthetic import write_data
    from tabstream.recipes import criteo_workflow

    raw = write_data("criteo", os.path.join(workdir, "raw"), rows * (lists + 1),
                     num_files=lists + 1, seed=seed)
    workflow = criteo_workflow(freq_threshold=2)
    workflow.fit(ts.Dataset(raw[:-1]))
    list_dirs = []
    for i, path in enumerate(raw[:-1]):
        out = os.path.join(workdir, "lists", f"list_{i:02d}")
        workflow.transform(ts.Dataset(path)).to_parquet(out, shuffle="per_partition", seed=seed,
                                                       write_keysets=True)
        list_dirs.append(out)
    valid = os.path.join(workdir, "valid")
    workflow.transform(ts.Dataset(raw[-1])).to_parquet(valid)
    return list_dirs, valid


def build_model(ps: Any, schema: Any, cache_rows: int, seed: int,
                framework: str) -> tuple[Any, Any, Any]:
    """(model, optimizer of its dense part, its CachedEmbeddings)."""
    if framework == "tensorflow":
        import keras

        from tabstream.train.tensorflow import DLRM as KerasDLRM
        from tabstream.train.tensorflow import CachedEmbeddings as KerasCachedEmbeddings

        emb = KerasCachedEmbeddings(ps, cache_rows=cache_rows)
        model = KerasDLRM(schema, embedding_dim=16, embeddings=emb, seed=seed)
        return model, keras.optimizers.Adam(1e-3), emb
    import torch

    from tabstream.train.torch import DLRM, CachedEmbeddings

    torch.manual_seed(seed)
    model = DLRM(schema, embedding_dim=16, embeddings=CachedEmbeddings(ps, cache_rows=cache_rows))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3), model.inputs.embeddings


def job(workdir: str, list_dirs: list[str], valid_dir: str, args: Any,
        crash_at: tuple[int, int] | None = None) -> None:
    """What the training job runs on every start."""
    import tabstream as ts
    from tabstream.train import ParameterServer, table_configs_from_schema

    if args.framework == "tensorflow":
        from tabstream.loaders.tensorflow import Loader
        from tabstream.train.tensorflow import fit_lists
        from tabstream.train.tensorflow.continuous import lists_done
    else:
        from tabstream.loaders.torch import Loader  # type: ignore[assignment]
        from tabstream.train.torch import fit_lists, lists_done  # type: ignore[assignment]

    schema = ts.Dataset(list_dirs[0]).schema
    features = schema.without(schema.select_by_tag("target").column_names)
    ck_dir = os.path.join(workdir, "checkpoint")
    ps = ParameterServer.open_or_create(os.path.join(workdir, "ps"),
                                        table_configs_from_schema(features, dim=16),
                                        storage="disk", seed=args.seed, optimizer="adagrad", lr=0.05)
    model, optimizer, emb = build_model(ps, schema, args.cache_rows, args.seed, args.framework)
    loaders: list[Any] = [Loader(d, batch_size=args.batch_size, shuffle=True, seed=args.seed)
                          for d in list_dirs]
    if crash_at is not None:
        p, i = crash_at
        loaders[i] = CrashingLoader(loaders[i], max(len(loaders[i]) // 2, 1), on_pass=p + 1,
                                    kill=args.framework == "tensorflow")
    resumed = [len(lists_done(ck_dir)) if os.path.isdir(ck_dir) else 0]

    def report(position: int, loader: Any, history: dict) -> None:
        p, i = divmod(position, len(list_dirs))
        delta = os.path.join(workdir, "deltas", f"{position:05d}")
        rows = sum(len(pq.read_table(os.path.join(delta, t, "part_00000.parquet")))
                   for t in os.listdir(delta) if not t.startswith("_"))
        note = " (resumed)" if crash_at is None and position == resumed[0] else ""
        print(f"pass {p + 1} list {i + 1}: loss {history['loss'][-1]:.4f}  "
              f"val_auc {history['val_auc'][-1]:.4f}  delta {rows:,} rows  "
              f"hit rate {emb.hit_rate:.2f}{note}", flush=True)

    try:
        fit_lists(model, loaders, optimizer, checkpoint_dir=ck_dir, passes=args.passes,
                  delta_dir=os.path.join(workdir, "deltas"), on_list_end=report,
                  valid_loader=Loader(valid_dir, batch_size=65536, shuffle=False),
                  checkpoint_every=max(len(loaders[0]) // 4, 1), progress=False)
    finally:
        ps.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--rows", type=int, default=50_000, help="rows per file list")
    parser.add_argument("--lists", type=int, default=6)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--cache-rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary folder")
    # the first start of the Keras job, in a child process killed with SIGKILL
    parser.add_argument("--crashing-job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--living-vocabulary", action="store_true",
                        help="compare a fixed and a living vocabulary over --lists drifting days "
                             "(see examples/living_vocabulary.py)")
    args = parser.parse_args(argv)

    if args.framework == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
        import tensorflow as tf

        tf.config.threading.set_inter_op_parallelism_threads(1)
    else:
        import torch

        torch.set_num_threads(1)
    if args.crashing_job:
        list_dirs = sorted(os.path.join(args.workdir, "lists", d)
                           for d in os.listdir(os.path.join(args.workdir, "lists")))
        job(args.workdir, list_dirs, os.path.join(args.workdir, "valid"), args,
            crash_at=(1, args.lists // 2))
        return
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or tmp
        if args.living_vocabulary:
            from living_vocabulary import compare  # beside this script

            compare(workdir, rows=args.rows, days=args.lists, seed=args.seed,
                    batch_size=args.batch_size, cache_rows=args.cache_rows)
            return
        list_dirs, valid_dir = build_exports(workdir, args.rows, args.lists, args.seed)
        if args.passes > 1 and args.framework == "tensorflow":
            child = subprocess.run([sys.executable, os.path.abspath(__file__), "--crashing-job",
                                    "--workdir", workdir, *(argv if argv is not None else sys.argv[1:])])
            if child.returncode != -signal.SIGKILL:
                raise SystemExit(f"the first start ended with code {child.returncode}, not killed")
            print(f"pass 2 list {args.lists // 2 + 1}: killed with kill -9; restarting the job",
                  flush=True)
        elif args.passes > 1:
            crash_at = (1, args.lists // 2)
            try:
                job(workdir, list_dirs, valid_dir, args, crash_at=crash_at)
            except RuntimeError as exc:
                if "simulated crash" not in str(exc):
                    raise
                print(f"pass {crash_at[0] + 1} list {crash_at[1] + 1}: crashed after "
                      f"{str(exc).split()[-2]} batches; restarting the job", flush=True)
        job(workdir, list_dirs, valid_dir, args)


if __name__ == "__main__":
    main()

"""Multi-hot click data, one parquet part per worker, data-parallel DLRM training.

    python examples/multihot_data_parallel.py                          # torch DDP, 2 ranks
    python examples/multihot_data_parallel.py --framework tensorflow   # Keras, MultiWorkerMirroredStrategy
    python examples/multihot_data_parallel.py --rows 4000 --fields 20 --workers 3

Steps:

1. Raw data made with numpy/pyarrow: ``--fields`` list columns (``f0`` ...) of
   ``--ids-per-field`` raw 64-bit ids each, and a ``label`` drawn from a hidden
   logistic model of a few fields, written as ``--workers`` raw parquet files.
2. A workflow: every field ``>> Categorify()`` (list columns keep their lists),
   ``label`` tagged TARGET; fit, then ``to_parquet(num_files=workers)``: one part
   per worker. The export's ``_manifest.json`` lists every part with its rows.
3. ``--workers`` processes on 127.0.0.1, each training DLRM (one pooled embedding
   per field) on **its own part** (``Loader(part, global_size=1, global_rank=0)``):
   torch: gloo process group + ``DistributedDataParallel`` and
   ``tabstream.train.torch.fit``; Keras: ``TF_CONFIG`` +
   ``MultiWorkerMirroredStrategy`` and ``tabstream.train.tensorflow.fit``
   (Keras' own ``model.fit`` does not run under that strategy). Gradients are
   summed over the workers every step, so every rank must take the same number of
   steps: each rank reads the parts' row counts from the manifest and takes the
   smallest part's number of batches (and says how many of its rows that leaves
   out per epoch, when the parts differ).

Each rank prints one line; the replicas' weights are equal at the end::

    rank 0/2: part part_0.parquet, 1,000 rows, 4 steps/epoch, loss 0.6912, weights checksum 1234.5678
    rank 1/2: part part_1.parquet, 1,000 rows, 4 steps/epoch, loss 0.6921, weights checksum 1234.5678
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
from itertools import islice
from typing import Any


def make_raw(raw_dir: str, rows: int, fields: int, ids_per_field: int, vocab: int,
             files: int, seed: int) -> None:
    """``files`` parquet files of multi-hot rows: ``f0..f{fields-1}`` list<int64> of
    ``ids_per_field`` raw ids (hashed-looking 64-bit values, ``vocab`` per field),
    ``label`` int64 0/1 from ``logit = sum over the first 4 fields of w[id] / sqrt(k)``."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    offsets = pa.array(np.arange(0, rows * ids_per_field + 1, ids_per_field, dtype=np.int32))
    columns, logit = {}, np.zeros(rows)
    for f in range(fields):
        raw_values = rng.integers(1 << 40, 1 << 62, vocab, dtype=np.int64)  # the field's ids
        picks = rng.zipf(1.3, (rows, ids_per_field)) % vocab             # popular ids repeat
        if f < 4:
            logit += rng.normal(0.0, 1.0, vocab)[picks].sum(axis=1) / math.sqrt(ids_per_field)
        columns[f"f{f}"] = pa.ListArray.from_arrays(offsets, pa.array(raw_values[picks].ravel()))
    label = (rng.random(rows) < 1.0 / (1.0 + np.exp(-(logit - logit.mean())))).astype(np.int64)
    table = pa.table({**columns, "label": pa.array(label)})
    os.makedirs(raw_dir, exist_ok=True)
    bounds = np.linspace(0, rows, files + 1).astype(int)
    for i in range(files):
        pq.write_table(table.slice(bounds[i], bounds[i + 1] - bounds[i]),
                       os.path.join(raw_dir, f"raw_{i}.parquet"))


def build_export(workdir: str, args: argparse.Namespace) -> str:
    """Raw files -> Categorify every field -> ``workdir/export``, one part per worker."""
    import tabstream as ts
    from tabstream import Tags, ops

    raw_dir = os.path.join(workdir, "raw")
    make_raw(raw_dir, args.rows, args.fields, args.ids_per_field, args.vocab, args.workers,
             args.seed)
    fields = [f"f{f}" for f in range(args.fields)]
    categorical = fields >> ops.Categorify()
    label = ["label"] >> ops.AddTags([Tags.TARGET, Tags.BINARY_CLASSIFICATION])
    workflow = ts.Workflow(categorical + label)
    raw = ts.Dataset(raw_dir)
    workflow.fit(raw)
    export = os.path.join(workdir, "export")
    workflow.transform(raw).to_parquet(export, num_files=args.workers)
    return export


def parts(export: str) -> list[tuple[str, int]]:
    """(file name, rows) of each data file of the export, from its manifest."""
    with open(os.path.join(export, "_manifest.json")) as fh:
        manifest = json.load(fh)
    files = manifest["files"]
    entries = files.items() if isinstance(files, dict) else (
        (f.get("path") or f.get("name"), f.get("num_rows", f.get("rows"))) for f in files)
    out = sorted((os.path.basename(str(name)), int(rows)) for name, rows in entries)
    return out


class FirstSteps:
    """The first ``steps`` batches of each epoch of ``loader`` (so that every rank
    takes the same number of steps)."""

    def __init__(self, loader: Any, steps: int) -> None:
        self.loader, self.steps = loader, steps

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self) -> Any:
        return islice(iter(self.loader), self.steps)


def _my_part(export: str, rank: int, world: int, batch_size: int) -> tuple[str, int, int, int]:
    """(path of this rank's part, its rows, steps per epoch for every rank, rows left out)."""
    found = parts(export)
    if len(found) != world:
        raise SystemExit(f"{export} has {len(found)} parts for {world} workers; export with "
                         f"num_files={world}")
    name, rows = found[rank]
    steps = min(math.ceil(r / batch_size) for _, r in found)
    left_out = max(0, rows - steps * batch_size)
    return os.path.join(export, name), rows, steps, left_out


def _report(rank: int, world: int, path: str, rows: int, steps: int, left_out: int,
            loss: float, checksum: float) -> None:
    note = f" ({left_out:,} rows left out per epoch: parts differ)" if left_out else ""
    # one write per line: the ranks share stdout
    sys.stdout.write(f"rank {rank}/{world}: part {os.path.basename(path)}, {rows:,} rows, "
                     f"{steps} steps/epoch{note}, loss {loss:.4f}, weights checksum "
                     f"{checksum:.4f}\n")
    sys.stdout.flush()


def run_torch(rank: int, world: int, port: int, export: str, args: argparse.Namespace) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import DLRM, fit

    torch.set_num_threads(1)  # the processes share the cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        path, rows, steps, left_out = _my_part(export, rank, world, args.batch_size)
        torch.manual_seed(args.seed)  # DDP broadcasts rank 0's weights anyway
        dataset = ts.Dataset(export)
        model = DistributedDataParallel(DLRM(dataset.schema, embedding_dim=8, sparse=False))
        loader = Loader(ts.Dataset(path), batch_size=args.batch_size, shuffle=True,
                        seed=args.seed + rank, global_size=1, global_rank=0)
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        history = fit(model, FirstSteps(loader, steps), optimizer, epochs=args.epochs,
                      progress=False)
        checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
        _report(rank, world, path, rows, steps, left_out, history["loss"][-1], checksum)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_tensorflow(rank: int, world: int, export: str, args: argparse.Namespace) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    import tabstream as ts
    from tabstream.loaders.tensorflow import Loader
    from tabstream.train.tensorflow import DLRM, LazyAdam, fit

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    path, rows, steps, left_out = _my_part(export, rank, world, args.batch_size)
    with strategy.scope():
        model = DLRM(ts.Dataset(export).schema, embedding_dim=8, seed=args.seed)
        model(model.example_batch())  # mirrored variables, the chief's initial values
        optimizer = LazyAdam(args.lr)
        # this rank's own part: not sharded again by the strategy
        loader = Loader(ts.Dataset(path), batch_size=args.batch_size, shuffle=True,
                        seed=args.seed + rank, global_size=1, global_rank=0)
    history = fit(model, FirstSteps(loader, steps), optimizer, epochs=args.epochs,
                  progress=False, strategy=strategy)
    checksum = float(sum(np.asarray(w, np.float64).sum() for w in model.get_weights()))
    _report(rank, world, path, rows, steps, left_out, history["loss"][-1], checksum)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=["torch", "tensorflow"], default="torch")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--fields", type=int, default=100)
    parser.add_argument("--ids-per-field", type=int, default=10)
    parser.add_argument("--vocab", type=int, default=1_000, help="distinct raw ids per field")
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    # internal: set for the worker processes this script starts
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--export", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.workers < 1 or args.fields < 2 or args.ids_per_field < 1:
        parser.error("need --workers >= 1, --fields >= 2 (DLRM interacts pairs) and "
                     "--ids-per-field >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.rank is not None:  # a worker process
        if args.framework == "torch":
            run_torch(args.rank, args.workers, args.port, args.export, args)
        else:
            run_tensorflow(args.rank, args.workers, args.export, args)
        return
    with tempfile.TemporaryDirectory(prefix="tabstream-multihot-") as tmp:
        export = build_export(tmp, args)
        sizes = ", ".join(f"{name} {rows:,}" for name, rows in parts(export))
        print(f"export: {args.rows:,} rows x {args.fields} fields x {args.ids_per_field} ids "
              f"-> {sizes}", flush=True)
        ports = _free_ports(args.workers)
        forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
        procs = []
        for rank in range(args.workers):
            env = dict(os.environ)
            if args.framework == "tensorflow":
                env["TF_CONFIG"] = json.dumps({
                    "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                    "task": {"type": "worker", "index": rank},
                })
            cmd = [sys.executable, os.path.abspath(__file__), *forwarded, "--rank", str(rank),
                   "--export", export, "--port", str(ports[0])]
            procs.append(subprocess.Popen(cmd, env=env))
        codes = [p.wait() for p in procs]
        if any(codes):
            raise SystemExit(f"worker exit codes {codes}")


if __name__ == "__main__":
    main()

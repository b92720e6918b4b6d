"""Sparse-feature training at small scale: multi-hot ids, one parquet part per
worker, two data-parallel ranks (torch DDP or Keras), per-id embeddings.

    python examples/multi_hot_ddp.py                       # 2 torch ranks, 8 slots x 4 ids
    python examples/multi_hot_ddp.py --framework tensorflow  # 2 Keras workers
    python examples/multi_hot_ddp.py --rows 200000 --slots 100 --nnz 10 --vocabulary 8192

1. ``write_data("multi-hot", ...)`` writes the rows as parquet, one part per worker:
   a ``multi_hot`` column of ``slots`` x ``nnz`` ids (fixed-size lists) and a label.
2. ``--world-size`` processes start; rank ``r`` loads ``part_r`` alone
   (``Loader(part, global_size=1, global_rank=0)``: the split is the files'), which
   delivers ``multi_hot`` as a dense ``(B, slots, nnz)`` block plus its mask.
3. The model looks every id up on its own (``combiner=None``: ``(B, slots, nnz, dim)``
   and the mask), weighs the ids of a slot by learned per-position weights, and
   feeds the slots to an MLP. torch: gloo + DDP averages the gradients. Keras:
   ``TF_CONFIG`` + ``MultiWorkerMirroredStrategy`` and
   ``tabstream.train.tensorflow.fit`` sum them over the workers.

The parts may differ by a row, so the ranks agree on the number of steps (the
smallest rank's batch count: an all-reduce MIN in torch, the parts' row counts in
Keras) before training: a data-parallel step hangs if one rank takes it and the
others do not. Each rank prints one machine-readable line::

    result rank=0 steps=12 first_loss=0.6931 last_loss=0.6420 checksum=12.345678

(``checksum``: the sum of the model's parameters, equal on every rank after
training, since every step applies the same summed gradients everywhere.)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from datetime import timedelta
from itertools import islice


def write_parts(out_dir: str, rows: int, world_size: int, slots: int, nnz: int,
                vocabulary: int) -> list[str]:
    """The multi-hot rows as ``world_size`` parquet parts, one per worker."""
    from tabstream.datasets import write_data

    return write_data("multi-hot", out_dir, rows, num_files=world_size,
                      row_group_size=max(1, rows // (4 * world_size)), slots=slots, nnz=nnz,
                      vocabulary=vocabulary)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(slots: int, nnz: int, vocabulary: int, dim: int):
    import torch
    from torch import nn

    from tabstream.train.tables import TableConfig
    from tabstream.train.torch import EmbeddingTables

    class MultiHotModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # one vector per id: (B, slots, nnz, dim) plus the mask
            self.embeddings = EmbeddingTables(
                [TableConfig("ids", vocabulary, dim, ("multi_hot",), is_list=True,
                             combiner=None)], sparse=False)
            self.position = nn.Parameter(torch.ones(slots, nnz))
            self.mlp = nn.Sequential(nn.Linear(slots * dim, 64), nn.ReLU(), nn.Linear(64, 1))

        def forward(self, features: dict) -> torch.Tensor:
            vectors, mask = self.embeddings(features)["multi_hot"]
            weights = self.position * mask                      # padding weighs nothing
            pooled = (vectors * weights[..., None]).sum(dim=2)  # (B, slots, dim)
            return self.mlp(pooled.flatten(1)).squeeze(1)

    return MultiHotModel()


def run_rank(rank: int, world_size: int, port: int, parts: list[str], args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tabstream.loaders.torch import Loader

    torch.set_num_threads(1)  # processes share the cores; more threads collapse throughput
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    try:
        torch.manual_seed(0)  # the same initial model on every rank
        model = DistributedDataParallel(build_model(args.slots, args.nnz, args.vocabulary,
                                                    args.dim))
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
        loss_fn = torch.nn.BCEWithLogitsLoss()
        loader = Loader(parts[rank], batch_size=args.batch_size, seed=rank, global_size=1,
                        global_rank=0, labels=["label"], drop_last=True)
        steps = torch.tensor([len(loader)])
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        steps_per_epoch = int(steps)
        losses = []
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            batches = iter(loader)
            for _ in range(steps_per_epoch):
                features, labels = next(batches)
                optimizer.zero_grad()
                loss = loss_fn(model(features), labels.float())
                loss.backward()
                optimizer.step()
                losses.append(float(loss.detach()))
            batches.close()
        checksum = sum(float(p.detach().double().sum()) for p in model.parameters())
        _report(rank, len(losses), losses[0], losses[-1], checksum)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _report(rank: int, steps: int, first: float, last: float, checksum: float) -> None:
    # one write per line: the ranks share stdout
    sys.stdout.write(f"result rank={rank} steps={steps} first_loss={first:.4f} "
                     f"last_loss={last:.4f} checksum={checksum:.6f}\n")
    sys.stdout.flush()


def build_keras_model(slots: int, nnz: int, vocabulary: int, dim: int, seed: int):
    import keras
    import tensorflow as tf

    from tabstream.train.tables import TableConfig
    from tabstream.train.tensorflow import EmbeddingTables

    class MultiHotModel(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            # one vector per id: (B, slots, nnz, dim) plus the mask
            self.embeddings = EmbeddingTables(
                [TableConfig("ids", vocabulary, dim, ("multi_hot",), is_list=True,
                             combiner=None)], seed=seed)
            self.position = self.add_weight(shape=(slots, nnz), initializer="ones",
                                            name="position")
            self.hidden = keras.layers.Dense(
                64, activation="relu", kernel_initializer=keras.initializers.GlorotUniform(seed))
            self.out = keras.layers.Dense(
                1, kernel_initializer=keras.initializers.GlorotUniform(seed + 1))

        def call(self, features):
            vectors, mask = self.embeddings(features)["multi_hot"]
            weights = self.position * tf.cast(mask, vectors.dtype)   # padding weighs nothing
            pooled = tf.reduce_sum(vectors * weights[..., None], axis=2)  # (B, slots, dim)
            flat = tf.reshape(pooled, [-1, slots * pooled.shape[-1]])
            return tf.squeeze(self.out(self.hidden(flat)), axis=1)

    return MultiHotModel()


class FirstSteps:
    """The first ``steps`` batches of each epoch of ``loader``: every worker takes the
    same number of steps."""

    def __init__(self, loader, steps: int) -> None:
        self.loader, self.steps = loader, steps

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return self.steps

    def __iter__(self):
        return islice(iter(self.loader), self.steps)


def run_keras_worker(rank: int, world_size: int, parts: list[str],
                     args: argparse.Namespace) -> None:
    """One Keras worker (``TF_CONFIG`` is set by the launcher) on its own part."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import pyarrow.parquet as pq
    import tensorflow as tf

    from tabstream.loaders.tensorflow import Loader
    from tabstream.train.tensorflow import fit

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    # full batches only (drop_last): the smallest part decides every worker's steps
    steps = min(pq.ParquetFile(p).metadata.num_rows for p in parts) // args.batch_size
    with strategy.scope():
        model = build_keras_model(args.slots, args.nnz, args.vocabulary, args.dim, seed=0)
        loader = Loader(parts[rank], batch_size=args.batch_size, seed=rank, global_size=1,
                        global_rank=0, labels=["label"], drop_last=True, shuffle=True)
        model(next(iter(loader))[0])  # build the mirrored variables (same seed everywhere)
        optimizer = tf.keras.optimizers.Adam(args.lr)
    history = fit(model, FirstSteps(loader, steps), optimizer, epochs=args.epochs,
                  progress=False, strategy=strategy)
    checksum = float(sum(np.asarray(w, np.float64).sum() for w in model.get_weights()))
    _report(rank, steps * args.epochs, history["loss"][0], history["loss"][-1], checksum)


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_keras(parts: list[str], args: argparse.Namespace, argv: list[str]) -> None:
    """Start one process per worker with its ``TF_CONFIG``; fail if any fails."""
    ports = _free_ports(args.world_size)
    procs = []
    for rank in range(args.world_size):
        env = dict(os.environ, TF_CONFIG=json.dumps({
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": rank}}))
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--rank", str(rank),
               "--parts", json.dumps(parts)]
        procs.append(subprocess.Popen(cmd, env=env))
    codes = [p.wait() for p in procs]
    if any(codes):
        raise SystemExit(f"Keras worker exit codes {codes}")


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", choices=["torch", "tensorflow"], default="torch")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12_000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--nnz", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    # internal: set by the launcher for each Keras worker process
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--parts", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.rank is not None:
        run_keras_worker(args.rank, args.world_size, json.loads(args.parts), args)
        return

    with tempfile.TemporaryDirectory(prefix="tabstream-multihot-") as tmp:
        parts = write_parts(os.path.join(tmp, "parts"), args.rows, args.world_size, args.slots,
                            args.nnz, args.vocabulary)
        if args.framework == "tensorflow":
            launch_keras(parts, args, argv)
            return
        import torch.multiprocessing as mp

        mp.spawn(run_rank, nprocs=args.world_size, join=True,
                 args=(args.world_size, _free_port(), parts, args))


if __name__ == "__main__":
    main()

"""Sparse-feature training at small scale: multi-hot ids, one parquet part per
worker, two torch DDP ranks, per-id embeddings.

    python examples/multi_hot_ddp.py                       # 2 ranks, 8 slots x 4 ids
    python examples/multi_hot_ddp.py --rows 200000 --slots 100 --nnz 10 --vocabulary 8192

1. ``write_data("multi-hot", ...)`` writes the rows as parquet, one part per worker:
   a ``multi_hot`` column of ``slots`` x ``nnz`` ids (fixed-size lists) and a label.
2. ``--world-size`` gloo processes start; rank ``r`` loads ``part_r`` alone
   (``Loader(part, global_size=1, global_rank=0)``: the split is the files'), which
   delivers ``multi_hot`` as a dense ``(B, slots, nnz)`` block plus its mask.
3. The model looks every id up on its own (``combiner=None``: ``(B, slots, nnz, dim)``
   and the mask), weighs the ids of a slot by learned per-position weights, and
   feeds the slots to an MLP; DDP averages the gradients.

The parts may differ by a row, so the ranks agree on the number of steps (the
smallest rank's batch count, an all-reduce MIN) before training: DDP hangs if one
rank takes a step the others do not. Each rank prints one machine-readable line::

    result rank=0 steps=12 first_loss=0.6931 last_loss=0.6420 checksum=12.345678

(``checksum``: the sum of the model's parameters, equal on every rank after DDP.)
The Keras variant waits for the data-parallel loop of
``tabstream.train.tensorflow.fit`` (the distributed-training issue).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from datetime import timedelta


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
        sys.stdout.write(f"result rank={rank} steps={len(losses)} first_loss={losses[0]:.4f} "
                         f"last_loss={losses[-1]:.4f} checksum={checksum:.6f}\n")
        sys.stdout.flush()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--rows", type=int, default=12_000)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--nnz", type=int, default=4)
    parser.add_argument("--vocabulary", type=int, default=200)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tabstream-multihot-") as tmp:
        parts = write_parts(os.path.join(tmp, "parts"), args.rows, args.world_size, args.slots,
                            args.nnz, args.vocabulary)
        mp.spawn(run_rank, nprocs=args.world_size, join=True,
                 args=(args.world_size, _free_port(), parts, args))


if __name__ == "__main__":
    main()

"""Two torch.distributed processes reading one export: each rank's share.

    python examples/distributed_loader.py                  # builds a small Criteo-like export
    python examples/distributed_loader.py out/train        # or reads yours
    python examples/distributed_loader.py --world-size 3 --batch-size 512 --epochs 2

Without an export folder it runs the Criteo recipe on a small synthetic log
(``build_export``): fit, then ``to_parquet(out_files_per_proc=2)``. Then it starts
``--world-size`` gloo processes on localhost; each iterates
``tabstream.loaders.torch.Loader`` (rank and world size come from the process
group) and all-reduces a counter every batch, as a DDP step would, which would hang
if the ranks' batch counts differed. Each rank prints its share of each epoch::

    rank 1/2 epoch 0: 10000 rows in 5 batches (len(loader) = 5, total 20000)
    share rank=1 epoch=0 rows=10000 batches=5 total=20000
    rank 0/2 epoch 0: 10000 rows in 5 batches (len(loader) = 5, total 20000)
    share rank=0 epoch=0 rows=10000 batches=5 total=20000

The ``share`` lines are for machines (the smoke test sums them).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from datetime import timedelta


def build_export(out_dir: str, rows: int = 20_000) -> str:
    """Fit the Criteo recipe on a synthetic log and export it split per worker.

    This is the only place that knows how the data is made; the rest of the
    example reads any export folder."""
    import tabstream as ts
    from tabstream import Tags, ops
    from tabstream.datasets import (
        CRITEO_CATEGORICAL,
        CRITEO_CONTINUOUS,
        CRITEO_LABEL,
        write_data,
    )

    raw_dir = os.path.join(out_dir, "raw")
    write_data("criteo", raw_dir, rows, num_files=2, row_group_size=2_500)
    raw = ts.Dataset(raw_dir)
    cats = CRITEO_CATEGORICAL >> ops.Categorify(freq_threshold=2)
    conts = (CRITEO_CONTINUOUS >> ops.FillMissing(0) >> ops.Clip(min_value=0) >> ops.LogOp()
             >> ops.Normalize())
    label = [CRITEO_LABEL] >> ops.AddTags([Tags.TARGET, Tags.BINARY_CLASSIFICATION])
    workflow = ts.Workflow(cats + conts + label)
    workflow.fit(raw)
    export_dir = os.path.join(out_dir, "train")
    workflow.transform(raw).to_parquet(export_dir, out_files_per_proc=2)
    return export_dir


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, world_size: int, port: int, export_dir: str, batch_size: int,
             epochs: int) -> None:
    import torch
    import torch.distributed as dist

    from tabstream.loaders.torch import Loader

    torch.set_num_threads(1)  # processes share the cores; more threads collapse throughput
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=60))
    try:
        loader = Loader(export_dir, batch_size=batch_size, seed=42, shuffle=True)
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            rows = batches = 0
            for _features, labels in loader:
                step = torch.ones(1)
                dist.all_reduce(step)  # every rank must take part in every step
                rows += len(labels)
                batches += 1
            # one write per report: the ranks share stdout, and a pipe keeps a write of
            # under 4 KiB whole, while print() writes the text and the newline apart
            sys.stdout.write(
                f"rank {rank}/{world_size} epoch {epoch}: {rows} rows in {batches} batches "
                f"(len(loader) = {len(loader)}, total {loader.num_rows})\n"
                f"share rank={rank} epoch={epoch} rows={rows} batches={batches} "
                f"total={loader.num_rows}\n")
            sys.stdout.flush()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", nargs="?", help="export folder (default: build one)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the built export")
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tabstream-example-") as tmp:
        export_dir = args.export_dir or build_export(tmp, args.rows)
        mp.spawn(run_rank, nprocs=args.world_size, join=True,
                 args=(args.world_size, _free_port(), export_dir, args.batch_size, args.epochs))


if __name__ == "__main__":
    main()

"""Hybrid-parallel DLRM on a Criteo-like export: sharded tables against pure DDP.

    python examples/hybrid_dlrm.py                     # builds a small Criteo-like export
    python examples/hybrid_dlrm.py out/train           # or reads yours (a DLRM-ready schema)
    python examples/hybrid_dlrm.py --world-size 2 --batch-size 1024 --rows 50000

It starts ``--world-size`` gloo processes on 127.0.0.1. Each builds the same DLRM
from the export's schema (same seed), then trains one epoch twice:

* **hybrid**: ``HybridParallel`` with a mixed plan (the largest table ``row_wise``,
  the second ``column_wise``, the third ``table_wise``, the rest chosen by
  ``plan_sharding``: small tables replicated);
* **data-parallel**: the plain model in ``DistributedDataParallel``, every table on
  every rank.

Rank 0 prints the plan (bytes per rank), then each rank reports what it holds and
how long a step took::

    ShardingPlan for 2 ranks (bytes = weights + 2 optimizer slots, float32)
      C3        5,112 x 16   row_wise      rows 0:2556, 2556:5112
      ...
    rank 0 hybrid: 1,234,560 parameter bytes, 41.2 ms/step, loss 0.5123
    rank 0 data-parallel: 2,101,776 parameter bytes, 55.0 ms/step, loss 0.5123

and one ``result`` line per rank and mode for machines (the smoke test reads them).
Both modes train the same model on the same batches: their losses agree.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import tempfile
from datetime import timedelta


def build_export(out_dir: str, rows: int) -> str:
    """The Criteo recipe on a synthetic log, exported for the loader."""
    import tabstream as ts
    from tabstream import Tags, ops
    from tabstream.datasets import (
        CRITEO_CATEGORICAL,
        CRITEO_CONTINUOUS,
        CRITEO_LABEL,
        write_data,
    )

    raw_dir = os.path.join(out_dir, "raw")
    write_data("criteo", raw_dir, rows, num_files=2, row_group_size=max(rows // 8, 1))
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


def mixed_plan(model, world_size: int):
    """Largest table row-wise, second column-wise, third table-wise, the rest auto."""
    from tabstream.train.torch.distributed import plan_sharding

    tables = sorted(plan_sharding(model, world_size).configs.values(),
                    key=lambda c: -c.cardinality)
    overrides = dict(zip([t.name for t in tables[:3]], ["row_wise", "column_wise", "table_wise"]))
    return plan_sharding(model, world_size, overrides=overrides, data_parallel_bytes=64 << 10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _say(text: str) -> None:
    # one write per report: the ranks share stdout
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def run_rank(rank: int, world_size: int, port: int, export_dir: str, batch_size: int) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import DLRM, LazyAdam, fit
    from tabstream.train.torch.distributed import HybridParallel

    torch.set_num_threads(1)  # the processes share the cores
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    try:
        schema = ts.Dataset(export_dir).schema

        def fresh_model():
            torch.manual_seed(0)  # the same initial model on every rank and in both modes
            return DLRM(schema, embedding_dim=16, sparse=True)

        for mode in ("hybrid", "data-parallel"):
            model = fresh_model()
            if mode == "hybrid":
                plan = mixed_plan(model, world_size)
                if rank == 0:
                    _say(str(plan))
                model = HybridParallel(model, plan=plan)
            else:
                model = DistributedDataParallel(model)
            held = sum(p.numel() * p.element_size() for p in model.parameters())
            loader = Loader(export_dir, batch_size=batch_size, seed=1, shuffle=True)
            history = fit(model, loader, LazyAdam(model.parameters(), lr=1e-3), epochs=1,
                          progress=False)
            step_ms = history["time_s"][-1] / max(len(loader), 1) * 1000
            loss = history["loss"][-1]
            _say(f"rank {rank} {mode}: {held:,} parameter bytes, {step_ms:.1f} ms/step, "
                 f"loss {loss:.4f}\n"
                 f"result rank={rank} mode={mode} bytes={held} step_ms={step_ms:.3f} "
                 f"loss={loss:.6f} steps={len(loader)}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export_dir", nargs="?", help="export folder (default: build one)")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=20_000, help="rows of the built export")
    args = parser.parse_args(argv)

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="tabstream-example-") as tmp:
        export_dir = args.export_dir or build_export(tmp, args.rows)
        mp.spawn(run_rank, nprocs=args.world_size, join=True,
                 args=(args.world_size, _free_port(), export_dir, args.batch_size))


if __name__ == "__main__":
    main()

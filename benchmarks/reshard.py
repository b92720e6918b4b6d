"""Resharding a 26-table DLRM checkpoint: 2 ranks -> 3 and -> 1, time and bytes read.

Two gloo ranks on 127.0.0.1 train DLRM (the 26 Criteo Kaggle cardinalities capped at
``--max-rows``, dim 16, LazyAdam: weights plus two Adam slots per table) for two
steps under ``HybridParallel`` with the auto plan, and ``fit`` writes a sharded
checkpoint. Then, each timed:

    offline 2 -> 3     reshard(ck, out, 3): one process reads every tensor once and
                       writes the 3-rank checkpoint
    offline 2 -> 1     reshard(ck, out, 1): a checkpoint.pt for one process
    online  2 -> 3     3 fresh ranks restore() from the 2-rank checkpoint (what
                       fit(resume=True) does): each reads the stored chunks its regions
                       overlap
    online  3 -> 3     3 fresh ranks restore() from the offline 3-rank checkpoint:
                       each reads exactly its own chunks

Bytes read are what DCP's reader read from the files (the serialized chunks), per
rank for the online cases.

    python benchmarks/reshard.py                       # --max-rows 200000
    python benchmarks/reshard.py --max-rows 20000 --plan column_wise
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import machine_note  # noqa: E402
from distributed import _schema  # noqa: E402


def _model(max_rows: int):
    import torch

    from tabstream.train.torch import DLRM

    torch.manual_seed(0)
    return DLRM(_schema(max_rows), embedding_dim=16)


def _batch(rows: int, max_rows: int, seed: int):
    import numpy as np
    import torch
    from distributed import _cardinalities

    rng = np.random.default_rng(seed)
    features = {f"C{i + 1}": torch.as_tensor(rng.integers(0, c, rows))
                for i, c in enumerate(_cardinalities(max_rows))}
    for i in range(13):
        features[f"I{i + 1}"] = torch.as_tensor(rng.normal(size=rows), dtype=torch.float32)
    return features, torch.as_tensor(rng.integers(0, 2, rows), dtype=torch.float32)


def rank_main(task: str, ck: str, max_rows: int, plan: str) -> None:
    import torch
    import torch.distributed as dist

    from tabstream.train.torch import LazyAdam, fit
    from tabstream.train.torch.distributed import HybridParallel
    from tabstream.train.torch.reshard import restore

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        hp = HybridParallel(_model(max_rows), plan=plan)
        opt = LazyAdam(hp.parameters(), lr=1e-3)
        if task == "train":
            fit(hp, [_batch(256, max_rows, rank + 10 * s) for s in range(2)], opt,
                checkpoint_dir=ck, progress=False)
            return
        dist.barrier()
        start = time.perf_counter()
        restored = restore(hp, opt, ck)
        seconds = time.perf_counter() - start
        assert restored is not None
        print(json.dumps({"rank": rank, "seconds": seconds, "bytes": restored.bytes_read}))
    finally:
        dist.destroy_process_group()


def _launch(world: int, task: str, ck: Path, max_rows: int, plan: str) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    argv = [sys.executable, __file__, "--rank-task", task, "--ck", str(ck),
            "--max-rows", str(max_rows), "--plan", plan]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        if p.returncode:
            raise SystemExit(f"a rank failed:\n{stderr[-3000:]}")
        out += [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return out


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--plan", default="auto",
                        help="the plan of both runs: auto, table_wise, row_wise, column_wise")
    parser.add_argument("--rank-task", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--ck", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_task:
        rank_main(args.rank_task, args.ck, args.max_rows, args.plan)
        return
    from tabstream.train.torch.distributed import reshard

    work = Path(tempfile.mkdtemp(prefix="reshard-bench-"))
    try:
        ck = work / "ck2"
        _launch(2, "train", ck, args.max_rows, args.plan)
        stored = _size(ck)
        rows = []
        start = time.perf_counter()
        reshard(ck, work / "ck3", 3, plan=args.plan)
        rows.append(("offline 2 -> 3", time.perf_counter() - start, f"{stored:,} (all)"))
        start = time.perf_counter()
        reshard(ck, work / "ck1", 1)
        rows.append(("offline 2 -> 1", time.perf_counter() - start, f"{stored:,} (all)"))
        for name, source in (("online 2 -> 3", ck), ("online 3 -> 3", work / "ck3")):
            ranks = sorted(_launch(3, "restore", source, args.max_rows, args.plan),
                           key=lambda r: r["rank"])
            rows.append((name, max(r["seconds"] for r in ranks),
                         ", ".join(f"{r['bytes']:,}" for r in ranks)))
        print(f"26-table DLRM, tables capped at {args.max_rows:,} rows, dim 16, LazyAdam, plan "
              f"{args.plan!r}; checkpoint of 2 ranks: {stored:,} bytes on disk")
        print("| case | seconds (slowest rank) | bytes read per rank (offline: the whole "
              "checkpoint on disk) |")
        print("|---|---:|---|")
        for name, seconds, nbytes in rows:
            print(f"| {name} | {seconds:.2f} | {nbytes} |")
        print(machine_note())
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Hybrid-parallel vs data-parallel DLRM, 26 Criteo-like tables, W ranks on loopback.

For each world size (``--world-sizes 1 2``) and mode, ``W`` gloo processes on
127.0.0.1 train the same DLRM (embedding_dim 16, LazyAdam; tables of 100,000 rows or more
have sparse gradients, the others dense: the models' default) on
pre-generated random batches of ``--batch`` rows per rank:

    data-parallel   DistributedDataParallel(model): every table on every rank
    hybrid          HybridParallel(model, plan_sharding(model, W)): big tables
                    row-/table-wise over the ranks, small ones replicated

Each rank reports steps/s over ``--steps`` timed steps (after 3 warm-up steps) and
its own peak RSS (``ru_maxrss``); the table shows the slowest rank's steps/s and
the largest peak, medians of ``--repeats`` runs in which the two modes alternate. Table sizes are the Criteo Kaggle (1 TB day) cardinalities, capped
at ``--max-rows`` so that the run fits a small machine.

Each rank also reports its CPU seconds per timed step (``time.process_time``: on a
loaded machine, a steadier figure than wall time) and, for hybrid, the bytes its
embedding exchange sent per step (``HybridParallel.comm_stats()``). Then short hybrid
runs at ``--bytes-world-sizes`` (default 2 3 4) print the bytes per step of every
rank, by exchange (sizes, ids, vectors, gradients), beside what the all-gather of
every id to every rank (the exchange before issue 34) sent. ``--compare-with
CHECKOUT`` times a third mode, ``hybrid-before``: the same script run against
another tabstream checkout, alternating with the other two.

Last, it prints, from the same table sizes, the bytes each rank sends per step in
either mode at 8 and 64 ranks (the paper estimate in docs/distributed-training.md).

``--framework tensorflow``: the Keras DLRM (the same tables, LazyAdam) under
``tf.distribute.MultiWorkerMirroredStrategy``, ``W`` worker processes on 127.0.0.1
(``TF_CONFIG``), trained by ``tabstream.train.tensorflow.fit`` in both modes:

    data-parallel       the plain model built in strategy.scope(): every table mirrored
    hybrid              HybridParallel(model, plan="auto"): big tables sharded, small
                        ones mirrored; each id only to its owners (TensorFlow's
                        collective all-to-all, exchange="all_to_all")
    hybrid-all-gather   the same with exchange="all_gather": every id to every
                        worker, vectors by all-reduce (the path before issue 34)

Steps/s are over ``--steps`` batches of one ``fit`` call, after a first ``fit`` of 3
batches (tracing); CPU ms per step and the bytes the embedding exchange sent per
step (``HybridParallel.comm_stats()``, padding included) as for torch; the byte
estimate is not printed again.

    python benchmarks/distributed.py                          # W = 1, 2
    python benchmarks/distributed.py --max-rows 20000 --steps 10 --batch 512
    git worktree add /tmp/before <commit>; python benchmarks/distributed.py \
        --world-sizes 2 --compare-with /tmp/before
    python benchmarks/distributed.py --framework tensorflow --steps 20
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import format_table, machine_note, median  # noqa: E402

#: the 26 categorical cardinalities of the Criteo Kaggle data set (C1..C26)
CRITEO_CARDINALITIES = [
    1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
    14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572,
]
DIM = 16
N_CONT = 13


def _cardinalities(max_rows: int) -> list[int]:
    return [min(c, max_rows) for c in CRITEO_CARDINALITIES]


def _schema(max_rows: int):
    from tabstream.core.schema import ColumnSchema, Schema, Tags

    cats = [ColumnSchema(f"C{i + 1}", "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": c - 1}})
            for i, c in enumerate(_cardinalities(max_rows))]
    conts = [ColumnSchema(f"I{i + 1}", "float32", tags=[Tags.CONTINUOUS]) for i in range(N_CONT)]
    return Schema([*cats, *conts, ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def rank_main(mode: str, max_rows: int, batch: int, steps: int) -> None:
    """One rank (RANK/WORLD_SIZE/MASTER_* in the environment)."""
    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    from tabstream.train.torch import DLRM, LazyAdam
    from tabstream.train.torch.distributed import HybridParallel, plan_sharding

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DLRM(_schema(max_rows), embedding_dim=DIM)
    plan = plan_sharding(model, world)
    if mode == "hybrid":
        model = HybridParallel(model, plan=plan)
    else:
        model = DistributedDataParallel(model)
    optimizer = LazyAdam(model.parameters(), lr=1e-3)
    rng = np.random.default_rng(rank)
    cards = _cardinalities(max_rows)
    batches = []
    for _ in range(min(steps + 3, 8)):  # a few batches, cycled: generation is not measured
        f = {f"C{i + 1}": torch.as_tensor(rng.integers(0, c, batch)) for i, c in enumerate(cards)}
        f.update({f"I{i + 1}": torch.as_tensor(rng.normal(size=batch), dtype=torch.float32)
                  for i in range(N_CONT)})
        batches.append((f, torch.as_tensor(rng.integers(0, 2, batch), dtype=torch.float32)))

    def step(i: int) -> None:
        features, labels = batches[i % len(batches)]
        loss = F.binary_cross_entropy_with_logits(model(features), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for i in range(3):
        step(i)
    dist.barrier()
    counted = mode == "hybrid" and hasattr(model, "comm_stats")  # not in --compare-with's
    before = model.comm_stats()["total"] if counted else {}
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(i)
    cpu = time.process_time() - cpu
    dist.barrier()
    elapsed = time.perf_counter() - start
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    result = {"rank": rank, "steps_per_s": steps / elapsed, "cpu_s_per_step": cpu / steps,
              "param_bytes": held,
              "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "plan_rank_bytes": plan.rank_bytes()[rank] + plan.replicated_bytes()}
    if counted:
        # bytes this rank's embedding exchange moved per timed step (HybridParallel's
        # own count), and what the all-gather of every id to every rank (the exchange
        # before issue 34) would have sent for the same batches
        after = model.comm_stats()["total"]
        result["comm_per_step"] = {k: (after[k] - before[k]) / steps for k in after}
        sharded = [f"C{i + 1}" for i, c in enumerate(cards) if plan[f"C{i + 1}"] != "data_parallel"]
        result["all_gather_ids_per_step"] = (world - 1) * batch * len(sharded) * 16
    print(json.dumps(result))
    dist.destroy_process_group()


def tf_worker_main(mode: str, max_rows: int, batch: int, steps: int) -> None:
    """One Keras worker (TF_CONFIG in the environment)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf

    from tabstream.train.tensorflow import DLRM, LazyAdam, fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    with strategy.scope():
        model = DLRM(_schema(max_rows), embedding_dim=DIM, seed=0)
        optimizer = LazyAdam(1e-3)
        exchange = "all_gather" if mode == "hybrid-all-gather" else "all_to_all"
        trained = (HybridParallel(model, plan="auto", exchange=exchange)
                   if mode.startswith("hybrid") else model)
    rng = np.random.default_rng(rank)
    cards = _cardinalities(max_rows)
    batches = []
    for _ in range(min(steps, 8)):  # a few batches, cycled: generation is not measured
        f = {f"C{i + 1}": tf.constant(rng.integers(0, c, batch)) for i, c in enumerate(cards)}
        f.update({f"I{i + 1}": tf.constant(rng.normal(size=batch).astype(np.float32))
                  for i in range(N_CONT)})
        batches.append((f, tf.constant(rng.integers(0, 2, batch).astype(np.float32))))
    timed = [batches[i % len(batches)] for i in range(steps)]
    fit(trained, batches[:3], optimizer, strategy=strategy, progress=False)  # traces
    hybrid = mode.startswith("hybrid")
    before = trained.comm_stats()["total"] if hybrid else None
    start, cpu = time.perf_counter(), time.process_time()
    fit(trained, timed, optimizer, strategy=strategy, progress=False)  # ends on a collective
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    extra: dict = {"cpu_s_per_step": cpu / steps}
    if hybrid:
        after = trained.comm_stats()["total"]
        extra["comm_per_step"] = {k: (after[k] - before[k]) / steps for k in after}
    if hybrid:
        held = sum(int(np.prod(v.shape)) * 4 for v in
                   trained.trainable_variables + trained.shard_variables)
        plan_bytes = trained.plan.rank_bytes()[rank] + trained.plan.replicated_bytes()
    else:
        held = sum(int(np.prod(v.shape)) * 4 for v in model.trainable_variables)
        plan_bytes = sum(c * DIM * 12 for c in cards)
    print(json.dumps({"rank": rank, "steps_per_s": steps / elapsed, "param_bytes": held,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "plan_rank_bytes": plan_bytes, **extra}))


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_tf(world: int, mode: str, args: argparse.Namespace) -> list[dict]:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(world)]}
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env.update(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="3")
    argv = [sys.executable, __file__, "--framework", "tensorflow", "--rank-main", mode,
            "--max-rows", str(args.max_rows), "--batch", str(args.batch), "--steps",
            str(args.steps)]
    procs = [subprocess.Popen(argv, env=dict(env, TF_CONFIG=json.dumps(
        {"cluster": cluster, "task": {"type": "worker", "index": r}})),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"tensorflow {mode} W={world} failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(world: int, mode: str, args: argparse.Namespace, steps: int | None = None) -> list[dict]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if mode == "hybrid-before":  # the same script on another tabstream checkout
        mode = "hybrid"
        env["PYTHONPATH"] = os.pathsep.join([args.compare_with, env.get("PYTHONPATH", "")])
    argv = [sys.executable, __file__, "--rank-main", mode, "--max-rows", str(args.max_rows),
            "--batch", str(args.batch), "--steps", str(steps or args.steps)]
    procs = [subprocess.Popen(argv, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(world)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=1200)
        if p.returncode != 0:
            raise SystemExit(f"{mode} W={world} failed:\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def bytes_per_step(world: int, batch: int, cards: list[int], mode: str,
                   sparse_threshold: int = 100_000) -> dict[str, float]:
    """Bytes one rank sends per training step, by kind (int64 ids, float32 vectors).
    Gradients of replicated tables: a sparse one (``sparse_threshold`` rows or more)
    is all-gathered by DDP (each rank's ``B`` rows of index + DIM floats to the
    W-1 others), a dense one is ring-all-reduced (2 (W-1)/W of the table). Dense MLP
    weights are left out: the same in both modes."""
    if world == 1:
        return {"total": 0.0, "max_rank_table_bytes": float(sum(c * DIM * 12 for c in cards))}

    def replicated_cost(rows: int) -> float:
        if rows >= sparse_threshold:
            return (world - 1) * batch * (8 + 4 * DIM)
        return 2 * (world - 1) / world * rows * DIM * 4

    if mode == "data-parallel":
        grads = sum(replicated_cost(c) for c in cards)
        return {"table_grads": float(grads), "total": float(grads),
                "max_rank_table_bytes": float(sum(c * DIM * 4 * 3 for c in cards))}
    from tabstream.train import TableConfig
    from tabstream.train.torch.distributed import plan_sharding

    configs = [TableConfig(f"C{i}", c, DIM, (f"C{i}",)) for i, c in enumerate(cards)]
    plan = plan_sharding(configs, world)
    # "hybrid-rows" / "hybrid-columns": every table auto splits over all ranks is split
    # by rows / by columns instead (repeated: with those taken out of the balance,
    # auto may split further tables)
    split = {"hybrid-rows": "row_wise", "hybrid-columns": "column_wise"}.get(mode)
    overrides: dict[str, str] = {}
    while split and any(plan[n] in ("row_wise", "column_wise") and n not in overrides
                        for n in plan):
        overrides.update({n: split for n in plan if plan[n] in ("row_wise", "column_wise")})
        plan = plan_sharding(configs, world, overrides=overrides)
    sharded = [name for name in plan if plan[name] != "data_parallel"]
    # single-hot ids, uniform over the rows: each id goes to the ranks owning it
    # (issue 34; before, every id went to all W - 1 others with its list length:
    # (W - 1) x B x 16 bytes per sharded feature). Forward vectors and backward
    # gradients: the same volume each way. A rank's own share is a local copy.
    ids = vectors = sizes = 0.0
    for s in sharded:
        place = plan.placements[s]
        owners = len(place.pieces())
        if place.kind == "column_wise":  # all ids to every other column owner
            ids += (owners - owners / world) * batch * 8
            vectors += batch * DIM * 4 * (world - 1) / world
        else:  # table-wise: one owner; row-wise: each id to the owner of its row
            ids += (world - 1) / world * batch * 8
            vectors += batch * DIM * 4 * (world - 1) / world
        sizes += 16 * (owners - owners / world)  # (ids, lengths) per piece and rank
    sizes += (world - 1) * 8  # the batch size
    vectors *= 2
    small = sum(replicated_cost(plan.configs[n].cardinality) for n in plan
                if plan[n] == "data_parallel")
    return {"ids": ids, "vectors": vectors, "sizes": sizes, "replicated_grads": float(small),
            "total": float(ids + vectors + sizes + small),
            "max_rank_table_bytes": float(max(plan.rank_bytes()) + plan.replicated_bytes())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--max-rows", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="runs per mode (median)")
    parser.add_argument("--bytes-world-sizes", type=int, nargs="*", default=[2, 3, 4],
                        help="torch: world sizes of the short hybrid runs that measure the "
                             "bytes each rank's embedding exchange sends per step")
    parser.add_argument("--compare-with", metavar="CHECKOUT",
                        help="torch: also time mode 'hybrid-before', HybridParallel of the "
                             "tabstream checkout at this path (e.g. a `git worktree` of an "
                             "older commit), alternating with the others")
    parser.add_argument("--framework", choices=["torch", "tensorflow"], default="torch")
    parser.add_argument("--rank-main", choices=["hybrid", "data-parallel", "hybrid-all-gather"])
    args = parser.parse_args()
    if args.rank_main:
        main_of = tf_worker_main if args.framework == "tensorflow" else rank_main
        main_of(args.rank_main, args.max_rows, args.batch, args.steps)
        return

    print(f"# {machine_note()}")
    print(f"# {args.framework}: 26 tables capped at {args.max_rows:,} rows x {DIM}, batch "
          f"{args.batch}/rank, {args.steps} timed steps")
    print(f"# load average before: {os.getloadavg()[0]:.1f}")
    launch = run_tf if args.framework == "tensorflow" else run
    rows = []
    for world in args.world_sizes:
        runs: dict[str, list[list[dict]]] = {"data-parallel": [], "hybrid": []}
        if args.compare_with and args.framework == "torch":
            runs["hybrid-before"] = []
        if args.framework == "tensorflow":
            runs["hybrid-all-gather"] = []
        for _ in range(args.repeats):  # the modes alternate, so load changes hit both
            for mode in runs:
                runs[mode].append(launch(world, mode, args))
        base = base_cpu = None
        for mode, reps in runs.items():
            sps = median([min(r["steps_per_s"] for r in res) for res in reps])
            base = base or sps
            row = [world, mode, f"{sps:.1f}", f"{sps / base:.2f}x"]
            cpu = median([max(r["cpu_s_per_step"] for r in res) for res in reps])
            base_cpu = base_cpu or cpu
            counted = [res for res in reps if all("comm_per_step" in r for r in res)]
            sent = (f"{median([max(r['comm_per_step']['sent'] for r in res) for res in counted]) / 1024:,.0f}"
                    if counted else "-")  # data-parallel, or a checkout without comm_stats
            row += [f"{cpu * 1000:.0f}", f"{cpu / base_cpu:.2f}x", sent]
            rows.append(row + [
                f"{median([max(r['peak_rss_mb'] for r in res) for res in reps]):,.0f}",
                f"{max(r['param_bytes'] for r in reps[0]) / 2**20:,.1f}"])
    cpu_heads = ["CPU ms/step (max rank)", "CPU vs data-parallel",
                 "exchange KiB sent/step (max rank)"]
    print(format_table(["W", "mode", "steps/s (slowest rank)", "vs data-parallel", *cpu_heads,
                        "peak RSS MB (max rank)", "param MB (max rank)"], rows, markdown=True))
    print(f"# load average after: {os.getloadavg()[0]:.1f}")
    if args.framework == "tensorflow":
        return
    if args.bytes_world_sizes:
        print(f"\n# bytes each rank's embedding exchange moved per step (HybridParallel."
              f"comm_stats()), {args.max_rows:,}-row cap, batch {args.batch}/rank, "
              "auto plan; 'all-gather ids' = what the previous all-gather of ids sent")
        measured = []
        for world in args.bytes_world_sizes:
            for r in sorted(run(world, "hybrid", args, steps=3), key=lambda r: r["rank"]):
                c = r["comm_per_step"]
                measured.append([world, r["rank"], *(f"{c[f'{k}_sent'] / 1024:,.1f}" for k in
                                                     ("sizes", "ids", "vectors", "gradients")),
                                 f"{c['sent'] / 1024:,.1f}", f"{c['received'] / 1024:,.1f}",
                                 f"{r['all_gather_ids_per_step'] / 1024:,.1f}"])
        print(format_table(["W", "rank", "sizes KiB", "ids KiB", "vectors KiB",
                            "gradients KiB", "sent KiB", "received KiB",
                            "all-gather ids KiB (before)"], measured, markdown=True))
    print("\n# bytes sent per rank per step, full Criteo cardinalities, batch 2048/rank")
    est = []
    for world in (8, 64):
        for mode in ("data-parallel", "hybrid", "hybrid-rows", "hybrid-columns"):
            b = bytes_per_step(world, 2048, CRITEO_CARDINALITIES, mode)
            memory = b.pop("max_rank_table_bytes")
            est.append([world, mode, f"{b.pop('total') / 2**20:,.1f}",
                        ", ".join(f"{k} {v / 2**20:,.1f}" for k, v in b.items()),
                        f"{memory / 2**30:.2f}"])
    print(format_table(["W", "mode", "MiB/step", "of which", "table GiB (max rank)"], est,
                       markdown=True))


if __name__ == "__main__":
    main()

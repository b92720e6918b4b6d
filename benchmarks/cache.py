"""A table larger than memory trained from the on-disk parameter server (issue 13).

A DLRM over one ``rows x 16`` table (``item_id``, Zipf-distributed ids), one
1,000-row table and 4 continuous features, batch 4096, trained for ``--steps``
steps in each of these setups, each in a fresh child process:

    disk + cache    ParameterServer(storage="disk", optimizer="adagrad") +
                    CachedEmbeddings(cache_rows=--cache-rows); MLPs with Adam
    memory + cache  the same with storage="memory"
    in memory       DLRM(sparse=True): nn.EmbeddingBag tables + torch Adagrad on
                    them, Adam on the MLPs (the speed reference)

    continuous      (``--setups continuous``) the continuous-training flow of
                    issue 28: ``--lists`` file lists of ``--steps`` batches
                    each through ``fit_lists`` over ParameterServer.open_or_create
                    (disk, Adam state), ``export_delta`` after each list, under
                    an ``RLIMIT_DATA`` of ``--data-limit-gb``; it reports the
                    peak RSS of each list (VmHWM, reset between lists) and the
                    delta's rows

Each child reports steps/s (after 5 warm-up steps), CPU ms per step and page
faults per step (``getrusage`` over the timed steps: on a machine loaded by
others these compare better than wall time), the cache hit rate, its peak RSS
(``ru_maxrss``) and, for the disk server, the bytes its files really occupy
(``st_blocks``) against their apparent size. The cached setups call
``CachedEmbeddings.prefetch`` with the next batch after each step's forward
(``--prefetch 0``: off). ``--repeats N`` alternates the setups N times and
prints medians, the ratios and the load average before each run; ``--profile 1``
prints each child's cProfile of the timed steps (where the time goes).

``--framework tensorflow`` runs the cached setups with the Keras DLRM over
``tabstream.train.tensorflow.CachedEmbeddings`` (the same server), trained by
``tabstream.train.tensorflow.fit`` (5 warm-up batches, which compile the step,
then the timed batches in chunks of ``--flush-every``, the server committed
after each); its ``in memory`` reference is the Keras DLRM's EmbeddingTables
with LazyAdam on the tables (Keras' Adagrad would update every row of the table
each step) and Adam on the MLPs. The ids of every step are drawn
fresh: ``zipf(a) - 1`` scattered over the table by a multiplicative hash, so hot
rows are not neighbours on disk.

Usage::

    python benchmarks/cache.py                          # 50M x 16, batch 4096, 200 steps
    python benchmarks/cache.py --rows 50000000 --steps 100 --repeats 3
    python benchmarks/cache.py --rows 5000000 --steps 100 --skip-memory
    python benchmarks/cache.py --setups continuous --rows 40000000 --lists 5 --steps 50
    python benchmarks/cache.py --framework tensorflow --rows 50000000 --steps 100 --skip-memory
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time


def _schema(rows: int):
    from tabstream.core.schema import ColumnSchema, Schema, Tags

    def cat(name: str, n: int) -> ColumnSchema:
        return ColumnSchema(name, "int64", tags=frozenset({Tags.CATEGORICAL}),
                            properties={"domain": {"min": 0, "max": n - 1}})

    conts = [ColumnSchema(f"x{i}", "float32", tags=frozenset({Tags.CONTINUOUS})) for i in range(4)]
    label = ColumnSchema("click", "float32", tags=frozenset({Tags.TARGET}))
    return Schema([cat("item_id", rows), cat("category", 1000), *conts, label])


def _numpy_batch(rng, rows: int, batch: int, zipf_a: float):
    import numpy as np

    z = rng.zipf(zipf_a, batch).astype(np.uint64) - np.uint64(1)
    ids = (z * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(11)) % np.uint64(rows)
    features = {"item_id": ids.astype(np.int64), "category": rng.integers(0, 1000, batch)}
    for i in range(4):
        features[f"x{i}"] = rng.normal(size=batch).astype(np.float32)
    return features, rng.integers(0, 2, batch).astype(np.float32)


def _batch(rng, rows: int, batch: int, zipf_a: float):
    import torch

    features, labels = _numpy_batch(rng, rows, batch, zipf_a)
    return {k: torch.as_tensor(v) for k, v in features.items()}, torch.as_tensor(labels)


def keras_child(setup: str, args: argparse.Namespace, workdir: str) -> dict:
    """One setup with Keras: the bundled DLRM trained by tabstream's Keras fit."""
    import keras
    import numpy as np
    import tensorflow as tf

    from tabstream.train import table_configs_from_schema
    from tabstream.train.tensorflow import (
        DLRM,
        CachedEmbeddings,
        LazyAdam,
        MultiOptimizer,
        ParameterServer,
        fit,
    )

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    schema = _schema(args.rows)
    rng = np.random.default_rng(0)

    def batches(n: int) -> list:
        out = []
        for _ in range(n):
            features, labels = _numpy_batch(rng, args.rows, args.batch, args.zipf)
            out.append(({k: tf.constant(v) for k, v in features.items()}, tf.constant(labels)))
        return out

    out: dict = {"setup": setup, "framework": "tensorflow"}
    emb = None
    if setup == "in memory":
        model = DLRM(schema, embedding_dim=16, seed=0)
        optimizer = MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(0.05), model.embeddings)])
    else:
        storage = "disk" if setup.startswith("disk") else "memory"
        configs = table_configs_from_schema(schema.without(["click"]), dim=16)
        ps = ParameterServer(os.path.join(workdir, "ps"), configs, storage=storage,
                             optimizer="adagrad", lr=0.05)
        emb = CachedEmbeddings(ps, cache_rows=args.cache_rows)
        model = DLRM(schema, embedding_dim=16, embeddings=emb, seed=0)
        optimizer = keras.optimizers.Adam()
    fit(model, batches(5), optimizer, progress=False)  # warm-up: traces and compiles the step
    elapsed, done = 0.0, 0
    while done < args.steps:
        chunk = batches(min(args.flush_every, args.steps - done))  # drawn outside the timing
        start = time.perf_counter()
        fit(model, chunk, optimizer, progress=False)
        if emb is not None:
            emb.ps.flush()
        elapsed += time.perf_counter() - start
        done += len(chunk)
    out["steps_per_s"] = args.steps / elapsed
    out["hit_rate"] = emb.hit_rate if emb is not None else None
    if setup.startswith("disk"):
        files = [os.path.join(workdir, "ps", f) for f in os.listdir(os.path.join(workdir, "ps"))
                 if f.startswith("item_id.")]
        out["disk_apparent_gb"] = sum(os.stat(f).st_size for f in files) / 1e9
        out["disk_used_gb"] = sum(os.stat(f).st_blocks * 512 for f in files) / 1e9
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return out


class _List:
    """One file list of synthetic batches, drawn when iterated (as a loader reads
    its files) and named as a loader's files would name it."""

    def __init__(self, args: argparse.Namespace, index: int) -> None:
        self.args, self.index, self.data_id = args, index, f"list{index}"

    def __len__(self) -> int:
        return self.args.steps

    def __iter__(self):
        import numpy as np

        rng = np.random.default_rng(self.index)
        for _ in range(self.args.steps):
            yield _batch(rng, self.args.rows, self.args.batch, self.args.zipf)


def _hwm_mb() -> float:
    with open("/proc/self/status") as f:
        line = next(x for x in f if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def continuous(args: argparse.Namespace, workdir: str) -> dict:
    import torch

    from tabstream.train import table_configs_from_schema
    from tabstream.train.torch import DLRM, CachedEmbeddings, ParameterServer, fit_lists

    limit = int(args.data_limit_gb * (1 << 30))
    resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    torch.set_num_threads(1)
    schema = _schema(args.rows)
    configs = table_configs_from_schema(schema.without(["click"]), dim=16)
    ps = ParameterServer.open_or_create(os.path.join(workdir, "ps"), configs, storage="disk",
                                        optimizer="adam", lr=0.01)
    torch.manual_seed(0)
    model = DLRM(schema, embedding_dim=16, embeddings=CachedEmbeddings(ps, args.cache_rows))
    opt = torch.optim.Adam(model.parameters())
    per_list: list[dict] = []

    def list_end(position: int, loader: object, history: object) -> None:
        delta = os.path.join(workdir, "delta", f"{position:05d}", "item_id", "part_00000.parquet")
        import pyarrow.parquet as pq

        per_list.append({"list": position, "peak_rss_mb": round(_hwm_mb(), 1),
                         "delta_rows": pq.ParquetFile(delta).metadata.num_rows,
                         "seconds": round(time.perf_counter() - started[0], 2)})
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM: the next list's peak is its own
        started[0] = time.perf_counter()

    lists = [_List(args, i) for i in range(args.lists)]
    for i in range(args.lists):  # a new list arrives each "day"; the job reruns over all
        started = [time.perf_counter()]
        fit_lists(model, lists[:i + 1], opt, checkpoint_dir=os.path.join(workdir, "ck"),
                  delta_dir=os.path.join(workdir, "delta"), progress=False, on_list_end=list_end)
    ps.close()
    return {"setup": "continuous", "lists": per_list,
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def child(setup: str, args: argparse.Namespace, workdir: str) -> dict:
    if args.framework == "tensorflow":
        if setup == "continuous":
            raise SystemExit("--setups continuous is torch's; for Keras run "
                             "examples/continuous_training.py --framework tensorflow")
        return keras_child(setup, args, workdir)
    if setup == "continuous":
        return continuous(args, workdir)
    import numpy as np
    import torch
    import torch.nn.functional as F

    from tabstream.train import table_configs_from_schema
    from tabstream.train.torch import DLRM, CachedEmbeddings, ParameterServer

    torch.set_num_threads(1)
    schema = _schema(args.rows)
    torch.manual_seed(0)
    out: dict = {"setup": setup}
    if setup == "in memory":
        model = DLRM(schema, embedding_dim=16, sparse=True)
        tables = [m.weight for m in model.modules() if isinstance(m, torch.nn.EmbeddingBag)]
        table_ids = {id(t) for t in tables}
        optimizers = [torch.optim.Adagrad(tables, lr=0.05),
                      torch.optim.Adam([p for p in model.parameters() if id(p) not in table_ids])]
        emb = None
    else:
        storage = "disk" if setup.startswith("disk") else "memory"
        configs = table_configs_from_schema(schema.without(["click"]), dim=16)
        ps = ParameterServer(os.path.join(workdir, "ps"), configs, storage=storage,
                             optimizer="adagrad", lr=0.05)
        emb = CachedEmbeddings(ps, cache_rows=args.cache_rows)
        model = DLRM(schema, embedding_dim=16, embeddings=emb)
        optimizers = [torch.optim.Adam(model.parameters())]
    rng = np.random.default_rng(0)
    elapsed = 0.0
    batch = _batch(rng, args.rows, args.batch, args.zipf)
    usage = None
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    for step in range(args.steps + 5):
        # the next batch is drawn outside the timing (as a loader would have it ready)
        nxt = _batch(rng, args.rows, args.batch, args.zipf) if step + 1 < args.steps + 5 else None
        if step == 5:
            usage = resource.getrusage(resource.RUSAGE_SELF)
            if profiler is not None:
                profiler.enable()
        start = time.perf_counter()
        features, labels = batch
        for o in optimizers:
            o.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(features), labels)
        if emb is not None and nxt is not None and args.prefetch:
            # after this step's lookups (a read ahead serves the table's next lookup:
            # given before the forward, this step's own lookup would take it), as
            # fit does: the next batch's misses are read during backward and the update
            emb.prefetch(nxt[0])
        loss.backward()
        with torch.sparse.check_sparse_tensor_invariants(enable=False):
            for o in optimizers:
                o.step()
        if emb is not None and (step + 1) % args.flush_every == 0:
            emb.ps.flush()
        if step >= 5:
            elapsed += time.perf_counter() - start
        batch = nxt
    end = resource.getrusage(resource.RUSAGE_SELF)
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(12)
        out["profile"] = text.getvalue()
    out["cpu_s"] = (end.ru_utime - usage.ru_utime) + (end.ru_stime - usage.ru_stime)
    out["sys_s"] = end.ru_stime - usage.ru_stime
    out["minflt"] = end.ru_minflt - usage.ru_minflt
    out["majflt"] = end.ru_majflt - usage.ru_majflt
    out["steps_per_s"] = args.steps / elapsed
    out["hit_rate"] = emb.hit_rate if emb is not None else None
    if setup.startswith("disk"):
        emb.ps.flush()
        files = [os.path.join(workdir, "ps", f) for f in os.listdir(os.path.join(workdir, "ps"))
                 if f.startswith("item_id.")]
        out["disk_apparent_gb"] = sum(os.stat(f).st_size for f in files) / 1e9
        out["disk_used_gb"] = sum(os.stat(f).st_blocks * 512 for f in files) / 1e9
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--framework", choices=("torch", "tensorflow"), default="torch")
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--cache-rows", type=int, default=500_000)
    parser.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent a (> 1)")
    parser.add_argument("--flush-every", type=int, default=100, help="commit the server every N steps")
    parser.add_argument("--skip-memory", action="store_true", help="skip the in-memory reference")
    parser.add_argument("--prefetch", type=int, default=1,
                        help="1: CachedEmbeddings.prefetch(next batch) during each step; 0: off")
    parser.add_argument("--profile", type=int, default=0,
                        help="1: cProfile the timed steps of each child, print the top functions")
    parser.add_argument("--repeats", type=int, default=1,
                        help="run the setups this many times, alternating; medians are reported")
    parser.add_argument("--setups", default="disk + cache,memory + cache,in memory")
    parser.add_argument("--lists", type=int, default=5, help="continuous: file lists")
    parser.add_argument("--data-limit-gb", type=float, default=3.0, help="continuous: RLIMIT_DATA")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args, args.workdir)), flush=True)
        return
    setups = [s.strip() for s in args.setups.split(",")]
    if args.skip_memory:
        setups = [s for s in setups if s != "in memory"]
    print(f"{args.framework}: table {args.rows:,} x 16 (weights {args.rows * 64 / 1e9:.2f} GB), "
          f"batch {args.batch}, "
          f"{args.steps} steps, zipf a={args.zipf}, cache_rows {args.cache_rows:,}", flush=True)
    results: dict[str, list[dict]] = {}
    for _repeat in range(args.repeats):
        for setup in setups:
            workdir = tempfile.mkdtemp(prefix="tabstream-cache-bench-")
            load = os.getloadavg()[0]
            try:
                argv = [sys.executable, __file__, "--child", setup, "--workdir", workdir]
                for k in ("framework", "rows", "batch", "steps", "cache_rows", "zipf", "flush_every",
                          "lists", "data_limit_gb", "prefetch", "profile"):
                    argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
                proc = subprocess.run(argv, capture_output=True, text=True)
                if proc.returncode != 0:
                    print(f"{setup}: failed\n{proc.stderr[-2000:]}", flush=True)
                    continue
                r = json.loads(proc.stdout.strip().splitlines()[-1])
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
            r["load"] = load
            results.setdefault(setup, []).append(r)
            if setup == "continuous":
                for x in r["lists"]:
                    print(f"list {x['list'] + 1}: peak RSS {x['peak_rss_mb']:,.0f} MB  delta "
                          f"{x['delta_rows']:,} rows  {x['seconds']:.1f} s", flush=True)
                peaks = [x["peak_rss_mb"] for x in r["lists"]]
                print(f"continuous: peak RSS {max(peaks) / 1024:.2f} GB over {len(peaks)} lists, "
                      f"last / first list {peaks[-1] / peaks[0]:.2f}x (limit {args.data_limit_gb} GB "
                      "RLIMIT_DATA)", flush=True)
                continue
            line = (f"{setup:15s} {r['steps_per_s']:8.2f} steps/s  peak RSS {r['peak_rss_gb']:.2f} GB"
                    f"  load {load:.1f}")
            if "cpu_s" in r:
                line += (f"  CPU {r['cpu_s'] / args.steps * 1000:.1f} ms/step (sys "
                         f"{r['sys_s'] / args.steps * 1000:.1f})  faults/step "
                         f"{r['minflt'] / args.steps:,.0f} minor {r['majflt'] / args.steps:,.0f} major")
            if r.get("hit_rate") is not None:
                line += f"  hit rate {r['hit_rate']:.3f}"
            if "disk_used_gb" in r:
                line += f"  disk {r['disk_used_gb']:.2f} GB used of {r['disk_apparent_gb']:.2f} GB"
            print(line, flush=True)
            if r.get("profile"):
                print(r["profile"], flush=True)

    def median(setup: str, key: str) -> float:
        values = sorted(r[key] for r in results.get(setup, []) if key in r)
        return values[len(values) // 2] if len(values) % 2 else sum(values[len(values) // 2 - 1:
                                                                        len(values) // 2 + 1]) / 2

    timed = [s for s in setups if s != "continuous" and results.get(s)]
    if args.repeats > 1:
        print(f"medians of {args.repeats} alternating runs:")
        for s in timed:
            print(f"{s:15s} {median(s, 'steps_per_s'):8.2f} steps/s  CPU "
                  f"{median(s, 'cpu_s') / args.steps * 1000:.1f} ms/step  peak RSS "
                  f"{max(r['peak_rss_gb'] for r in results[s]):.2f} GB")
    for num, den in (("disk + cache", "memory + cache"), ("disk + cache", "in memory"),
                     ("memory + cache", "in memory")):
        if num in timed and den in timed:
            print(f"{num} / {den}: steps/s {median(num, 'steps_per_s') / median(den, 'steps_per_s'):.2f}x"
                  f", CPU per step {median(den, 'cpu_s') / median(num, 'cpu_s'):.2f}x (den / num)")

if __name__ == "__main__":
    main()

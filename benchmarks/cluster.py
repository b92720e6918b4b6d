"""The Criteo recipe threaded vs on a 2-worker dask cluster of processes (issue 10).

Writes ``--rows`` synthetic Criteo rows as 8 parquet files, then runs
``fit`` + ``to_parquet(out_files_per_proc=2)`` ``--repeats`` times per case (cases
alternating), each in a fresh child process:

    threaded   Workflow(graph): dask's threaded scheduler in the child
    cluster    Workflow(graph, client=Client(LocalCluster(n_workers=2,
               threads_per_worker=1, processes=True)))

Reported (medians): wall time (fit + export; on the cluster also the workers' import
of tabstream, which a user pays on the first task; not the cluster's start), total
CPU seconds (user + sys over that window of the child and, on the cluster, of every
process: the child runs the client, the scheduler and the nannies; the two workers
are processes of their own), and peak RSS (``VmHWM``) of the child and of each
worker. The exports are compared (ids exact, floats equal) in every repeat.

Where the cluster's extra CPU goes is measured, not guessed:

- per thread of the child: the main thread (building graphs, the client's side of
  fit/finalize and the export's metadata) vs dask's event-loop threads (scheduler,
  client and nanny messages) and the rest;
- per worker: CPU spent importing tabstream, and the thread CPU of running tasks
  per task prefix from the workers' own fine-grained metrics
  (``Scheduler.cumulative_worker_metrics``); the remainder of the worker processes'
  CPU is spent outside tasks (event loop, messages, (de)serialization). The same
  worker CPU is also split by thread (the main thread runs a worker's event loop,
  "Dask-Worker-Threads" run tasks, Arrow's own pools are not Python threads). The
  workers' wall-clock metrics for (de)serializing and moving data are printed too.

Usage::

    python benchmarks/cluster.py --rows 2000000 --repeats 3 --data-dir /tmp/perfbench/cluster
    python benchmarks/cluster.py --rows 200000   # what a shared machine allows
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time


def _usage() -> dict:
    return {"pid": os.getpid(), "peak_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    """This process's own peak RSS: ``VmHWM``, which starts afresh at exec. (Not
    ``ru_maxrss``: Linux carries it across fork + exec, so a child's would include
    its parent's resident size at the fork, e.g. the driver's generated data.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _import_tabstream() -> float:
    """Import what the tasks need; returns the CPU seconds it took in this process."""
    start = time.process_time()
    import tabstream.pipeline  # noqa: F401
    import tabstream.recipes  # noqa: F401

    return time.process_time() - start


def _proc_cpu(procs) -> dict[int, float]:
    return {p.pid: sum(p.cpu_times()[:2]) for p in procs}


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of the live threads of this process, by thread name (numbers
    dropped; threads Python did not start, such as Arrow's pools, are "not Python")."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    main = threading.main_thread().native_id
    out: dict[str, float] = {}
    for th in psutil.Process().threads():
        name = "main" if th.id == main else re.sub(r"[-_ ']*\d+", "", names.get(th.id, "not Python")).strip("-_ '")
        out[name] = out.get(name, 0.0) + th.user_time + th.system_time
    return out


async def _heartbeat(dask_worker) -> None:
    await dask_worker.heartbeat()  # sends the worker's metrics to the scheduler


def _worker_metrics(client, cluster) -> dict:
    client.run(_heartbeat)
    return {k: v for k, v in cluster.scheduler.cumulative_worker_metrics.items()
            if isinstance(k, tuple) and k[-1] == "seconds"}


def child(case: str, raw: str, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # benchmarks/distributed.py would shadow the ``distributed`` package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import psutil

    import tabstream as ts
    from tabstream.recipes import criteo_graph

    client = cluster = None
    if case == "cluster":
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        metrics0 = _worker_metrics(client, cluster)
        wthreads0 = client.run(_thread_cpu)
    procs = [psutil.Process()] + psutil.Process().children(recursive=True)
    cpu0, threads0 = _proc_cpu(procs), _thread_cpu()
    t0 = time.perf_counter()
    imports = sorted(client.run(_import_tabstream).values()) if client is not None else []
    t1 = time.perf_counter()
    wf = ts.Workflow(criteo_graph(), client=client).fit(ts.Dataset(raw))
    t2 = time.perf_counter()
    wf.transform(ts.Dataset(raw)).to_parquet(out, out_files_per_proc=2)
    t3 = time.perf_counter()
    cpu1, threads1 = _proc_cpu(procs), _thread_cpu()
    me = os.getpid()
    result = {"case": case, "import_s": t1 - t0, "fit_s": t2 - t1, "export_s": t3 - t2,
              "cpu_s": sum(cpu1[p] - cpu0[p] for p in cpu1), "child_cpu_s": cpu1[me] - cpu0[me],
              "threads": {k: v - threads0.get(k, 0.0) for k, v in threads1.items()},
              "peak_mb": _usage()["peak_mb"], "workers": [], "worker_import_cpu_s": imports}
    if client is not None:
        for u in sorted(client.run(_usage).values(), key=lambda u: u["pid"]):
            result["workers"].append({"peak_mb": u["peak_mb"], "cpu_s": cpu1[u["pid"]] - cpu0[u["pid"]]})
        wthreads1 = client.run(_thread_cpu)
        result["worker_threads"] = {}
        for addr, th in wthreads1.items():
            for k, v in th.items():
                d = v - wthreads0[addr].get(k, 0.0)
                result["worker_threads"][k] = result["worker_threads"].get(k, 0.0) + d
        metrics = _worker_metrics(client, cluster)
        result["metrics"] = [[list(k), v - metrics0.get(k, 0.0)] for k, v in metrics.items()
                             if v - metrics0.get(k, 0.0) > 0]
        client.close()
        cluster.close()
    print("RESULT " + json.dumps(result), flush=True)


def _read(out: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = json.load(open(os.path.join(out, "_manifest.json")))
    return pa.concat_tables([pq.read_table(os.path.join(out, f["path"])) for f in manifest["files"]])


def _med(values) -> float:
    return statistics.median(values)


def _breakdown(runs: list[dict]) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """Medians over the cluster runs: CPU seconds by where they were spent, and the
    workers' wall-clock metrics outside tasks ((de)serialization, transfers)."""
    def per_run(r: dict) -> tuple[dict[str, float], dict[str, float]]:
        cpu: dict[str, float] = {}
        th = r["threads"]
        cpu["child: main thread (client: graphs, finalize, export metadata)"] = th.get("main", 0.0)
        loop = sum(v for k, v in th.items() if k != "main")
        cpu["child: other threads (scheduler, client + nanny event loops, offload)"] = loop
        cpu["child: threads gone by the end"] = r["child_cpu_s"] - th.get("main", 0.0) - loop
        cpu["workers: importing tabstream"] = sum(r["worker_import_cpu_s"])
        tasks = 0.0
        wall: dict[str, float] = {}
        for key, value in r["metrics"]:
            context, activity = key[0], key[-2]
            if context == "execute" and activity == "thread-cpu":  # a CPU clock
                name = f"workers: tasks '{key[1]}' (thread CPU)"
                cpu[name] = cpu.get(name, 0.0) + value
                tasks += value
            elif context != "execute" or activity not in ("thread-noncpu", "executor", "other"):
                name = f"{context} {activity}"  # wall clocks (perf_counter)
                wall[name] = wall.get(name, 0.0) + value
        workers = sum(w["cpu_s"] for w in r["workers"])
        cpu["workers: outside tasks (event loop, messages, (de)serialization)"] = (
            workers - sum(r["worker_import_cpu_s"]) - tasks)
        for k, v in r["worker_threads"].items():  # the same CPU, by thread of the workers
            cpu[f"  of the workers' CPU: thread '{k}'"] = v
        wt = sum(r["worker_threads"].values())
        cpu["  of the workers' CPU: threads gone by the end"] = workers - wt
        return cpu, wall

    parts = [per_run(r) for r in runs]

    def medians(dicts: list[dict[str, float]]) -> list[tuple[str, float]]:
        names = list(dict.fromkeys(n for d in dicts for n in d))
        return [(n, _med([d.get(n, 0.0) for d in dicts])) for n in names]

    return medians([p[0] for p in parts]), medians([p[1] for p in parts])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data-dir", default=None,
                        help="keep the raw data here between invocations (default: a temporary folder)")
    parser.add_argument("--child", nargs=3, metavar=("CASE", "RAW", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from tabstream.datasets.synthetic import write_data
    from tabstream.testing import assert_tables_equal

    tmp = tempfile.mkdtemp(prefix="tabstream-bench-cluster-")
    try:
        raw = os.path.join(args.data_dir or tmp, f"raw-{args.rows}")
        if not os.path.exists(raw):
            write_data("criteo", raw + ".tmp", args.rows, num_files=8, seed=0)
            os.rename(raw + ".tmp", raw)
        results: dict[str, list[dict]] = {"threaded": [], "cluster": []}
        for rep in range(args.repeats):
            for case in results:
                out = os.path.join(tmp, case)
                shutil.rmtree(out, ignore_errors=True)
                proc = subprocess.run([sys.executable, __file__, "--child", case, raw, out],
                                      capture_output=True, text=True, check=False)
                line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
                if proc.returncode != 0 or line is None:
                    sys.exit(f"{case} failed:\n{proc.stderr[-3000:]}")
                r = json.loads(line[len("RESULT "):])
                results[case].append(r)
                print(f"run {rep + 1} {case}: total {r['import_s'] + r['fit_s'] + r['export_s']:.2f} s, "
                      f"CPU {r['cpu_s']:.2f} s, load {os.getloadavg()[0]:.2f}", flush=True)
            assert_tables_equal(_read(os.path.join(tmp, "cluster")), _read(os.path.join(tmp, "threaded")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.rows:,} rows, Criteo recipe, fit + export, medians of {args.repeats}; "
          f"outputs equal in every repeat: PASS")
    print(f"{'case':10} {'import s':>8} {'fit s':>7} {'export s':>9} {'total s':>8} {'CPU s':>7} "
          f"{'peak MB':>8}  workers' peak MB")
    for case, rs in results.items():
        total = _med([r["import_s"] + r["fit_s"] + r["export_s"] for r in rs])
        nw = len(rs[0]["workers"])
        workers = ", ".join(f"{_med([r['workers'][i]['peak_mb'] for r in rs]):.0f}" for i in range(nw)) or "-"
        print(f"{case:10} {_med([r['import_s'] for r in rs]):8.2f} {_med([r['fit_s'] for r in rs]):7.2f} "
              f"{_med([r['export_s'] for r in rs]):9.2f} {total:8.2f} {_med([r['cpu_s'] for r in rs]):7.2f} "
              f"{_med([r['peak_mb'] for r in rs]):8.0f}  {workers}")
    t, c = results["threaded"], results["cluster"]
    wall = (_med([r["import_s"] + r["fit_s"] + r["export_s"] for r in c])
            / _med([r["import_s"] + r["fit_s"] + r["export_s"] for r in t]))
    cpu = _med([r["cpu_s"] for r in c]) / _med([r["cpu_s"] for r in t])
    print(f"cluster / threaded: wall {wall:.2f}x, CPU {cpu:.2f}x "
          f"(bound <= 1.5x CPU: {'met' if cpu <= 1.5 else 'MISSED'})")
    print(f"threaded CPU s: {_med([r['cpu_s'] for r in t]):.2f}; cluster CPU s by where it went (medians):")
    cpu_parts, wall_parts = _breakdown(c)
    for name, value in cpu_parts:
        print(f"  {value:7.2f}  {name}")
    print("workers' wall seconds outside tasks, from their own metrics (medians; not CPU):")
    for name, value in wall_parts:
        print(f"  {value:7.2f}  {name}")


if __name__ == "__main__":
    main()

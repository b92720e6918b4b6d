"""The Criteo recipe threaded vs on a 2-worker dask cluster of processes (issue 10).

Writes ``--rows`` synthetic Criteo rows as 8 parquet files, then runs
``fit`` + ``to_parquet(out_files_per_proc=2)`` twice, each in a fresh child process:

    threaded   Workflow(graph): dask's threaded scheduler in the child
    cluster    Workflow(graph, client=Client(LocalCluster(n_workers=2,
               threads_per_worker=1, processes=True)))

and reports wall time (fit + export, without imports and cluster start), total CPU
seconds (user + sys of the child and, for the cluster, of every process under it:
scheduler thread, nannies, workers, measured before shutdown), and peak RSS of the
child and of each worker (``ru_maxrss``). The two exports are compared (ids exact,
floats equal) in the same run.

Usage::

    python benchmarks/cluster.py                 # 2M rows
    python benchmarks/cluster.py --rows 200000   # what the shared machine allows
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time


def _cpu_seconds(include_children: bool) -> float:
    import psutil

    procs = [psutil.Process()]
    if include_children:
        procs += psutil.Process().children(recursive=True)
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def _worker_peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(case: str, raw: str, out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # benchmarks/distributed.py would shadow the ``distributed`` package
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    import tabstream as ts
    from tabstream.recipes import criteo_graph

    client = cluster = None
    if case == "cluster":
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address="127.0.0.1:0")
        client = distributed.Client(cluster)
    cpu0 = _cpu_seconds(case == "cluster")
    t0 = time.perf_counter()
    wf = ts.Workflow(criteo_graph(), client=client).fit(ts.Dataset(raw))
    t1 = time.perf_counter()
    wf.transform(ts.Dataset(raw)).to_parquet(out, out_files_per_proc=2)
    t2 = time.perf_counter()
    cpu = _cpu_seconds(case == "cluster") - cpu0
    workers = sorted(client.run(_worker_peak_mb).values()) if client is not None else []
    result = {"case": case, "fit_s": t1 - t0, "export_s": t2 - t1, "cpu_s": cpu,
              "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
              "worker_peak_mb": workers}
    if client is not None:
        client.close()
        cluster.close()
    print("RESULT " + json.dumps(result), flush=True)


def _read(out: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    manifest = json.load(open(os.path.join(out, "_manifest.json")))
    return pa.concat_tables([pq.read_table(os.path.join(out, f["path"])) for f in manifest["files"]])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--child", nargs=3, metavar=("CASE", "RAW", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from tabstream.datasets.synthetic import write_data
    from tabstream.testing import assert_tables_equal

    with tempfile.TemporaryDirectory(prefix="tabstream-bench-cluster-") as tmp:
        raw = os.path.join(tmp, "raw")
        write_data("criteo", raw, args.rows, num_files=8, seed=0)
        results = {}
        for case in ("threaded", "cluster"):
            out = os.path.join(tmp, case)
            proc = subprocess.run([sys.executable, __file__, "--child", case, raw, out],
                                  capture_output=True, text=True, check=False)
            line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
            if proc.returncode != 0 or line is None:
                sys.exit(f"{case} failed:\n{proc.stderr[-3000:]}")
            results[case] = json.loads(line[len("RESULT "):])
        assert_tables_equal(_read(os.path.join(tmp, "cluster")), _read(os.path.join(tmp, "threaded")))
    print(f"{args.rows:,} rows, Criteo recipe, fit + export; outputs equal: PASS")
    print(f"{'case':10} {'fit s':>7} {'export s':>9} {'total s':>8} {'CPU s':>7} {'peak MB':>8}  workers' peak MB")
    for r in results.values():
        total = r["fit_s"] + r["export_s"]
        workers = ", ".join(f"{m:.0f}" for m in r["worker_peak_mb"]) or "-"
        print(f"{r['case']:10} {r['fit_s']:7.2f} {r['export_s']:9.2f} {total:8.2f} {r['cpu_s']:7.2f} "
              f"{r['peak_mb']:8.0f}  {workers}")
    t, c = results["threaded"], results["cluster"]
    print(f"cluster / threaded: wall {(c['fit_s'] + c['export_s']) / (t['fit_s'] + t['export_s']):.2f}x, "
          f"CPU {c['cpu_s'] / t['cpu_s']:.2f}x")


if __name__ == "__main__":
    main()

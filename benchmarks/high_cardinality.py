"""Categorify on a column with ~20 million distinct values, in bounded memory,
threaded and on a 2-worker dask cluster of processes (issue 3 item 2, issue 10 item 2).

    python benchmarks/high_cardinality.py --distinct 20000000 --rows 30000000
    python benchmarks/high_cardinality.py --distinct 20000000 --rows 20000000 \\
        --cases threaded,cluster --data-dir /tmp/perfbench/highcard

Writes (once) a parquet dataset: an ``id`` column with exactly --distinct distinct
values (every value once, plus Zipf-like repeats when --rows > --distinct) next to
--fillers float64 columns that make the dataset wide (they set the partition count,
``part_size="128MB"`` of in-memory data; the fit reads only ``id``). Each case fits
``Categorify(spill_dir=<data-dir>/spill)`` on ``id`` in a fresh process:

    threaded   dask's threaded scheduler in the child
    cluster    Workflow(..., client=Client(LocalCluster(n_workers=2,
               threads_per_worker=1, processes=True))) in the child

and reports fit seconds, CPU seconds (user + sys, of every process of the case,
measured over the fit) and the kernel's peak RSS (``VmHWM``) of each process:
the child (client; on the cluster it also runs the scheduler), each worker and each
nanny process (LocalCluster runs its nannies, like its scheduler, in the child:
none is listed then). The vocabulary is then checked in full against counts computed a second way
(``np.bincount`` of the generated ids): every one of --distinct values, exact counts.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
from common import emit_result, format_table, machine_note, median, run_child  # noqa: E402

# benchmarks/distributed.py would shadow the ``distributed`` package (here and in the
# worker processes, which re-run this file as their ``__mp_main__``)
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

FILLERS = 8  # default number of float64 columns that make the dataset wide


def generated_ids(rows: int, distinct: int, seed: int = 0):
    """The ``id`` integers of the dataset, in file order (``id-<n>`` as strings)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    # every id once (shuffled), then repeats skewed toward small ids
    ids = np.concatenate([rng.permutation(distinct), rng.zipf(1.3, rows - distinct) % distinct])
    rng.shuffle(ids)
    return ids


def generate(path: str, rows: int, distinct: int, fillers: int = FILLERS, seed: int = 0,
             chunk: int = 2_000_000) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if rows < distinct:
        raise SystemExit("--rows must be >= --distinct")
    os.makedirs(path + ".tmp", exist_ok=True)
    ids = generated_ids(rows, distinct, seed)
    rng = np.random.default_rng(seed + 1)
    for i, start in enumerate(range(0, rows, chunk)):
        part = ids[start:start + chunk]
        cols = {"id": pc.binary_join_element_wise("id-", pc.cast(pa.array(part), pa.string()), "")}
        for f in range(fillers):
            cols[f"x{f}"] = pa.array(rng.random(len(part)))
        pq.write_table(pa.table(cols), os.path.join(path + ".tmp", f"part_{i:04d}.parquet"),
                       row_group_size=250_000)
    os.rename(path + ".tmp", path)


def _self_usage() -> dict:
    u = resource.getrusage(resource.RUSAGE_SELF)
    return {"pid": os.getpid(), "peak_mb": _peak_rss_mb(), "cpu_s": u.ru_utime + u.ru_stime}


def _peak_rss_mb() -> float:
    """This process's own peak RSS: ``VmHWM``, which starts afresh at exec. (Not
    ``ru_maxrss``: Linux carries it across fork + exec, so a child's would include
    its parent's resident size at the fork, e.g. the driver's generated data.)"""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def check_vocabulary(table, rows: int, distinct: int) -> str:
    """'' when ``table`` (values ``id-<n>``, counts) is exactly the vocabulary of the
    generated ids, else what differs."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if table.num_rows != distinct:
        return f"{table.num_rows:,} values, expected {distinct:,}"
    nums = pc.cast(pc.utf8_slice_codeunits(table["values"], 3), pa.int64()).to_numpy()
    counts = table["counts"].to_numpy()
    expected = np.bincount(generated_ids(rows, distinct), minlength=distinct)
    if len(np.unique(nums)) != distinct or nums.min() < 0 or nums.max() >= distinct:
        return "the values are not id-0 ... id-<distinct - 1>, each once"
    bad = np.flatnonzero(expected[nums] != counts)
    if len(bad):
        i = bad[0]
        return f"{len(bad):,} counts differ, e.g. id-{nums[i]}: {counts[i]} != {expected[nums[i]]}"
    return ""


def child(case: str, path: str, spill_dir: str, rows: int, distinct: int) -> None:
    import psutil

    import tabstream as ts
    from tabstream import ops

    client = cluster = None
    if case == "cluster":
        import distributed

        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=None)
        client = distributed.Client(cluster)
        client.run(lambda: __import__("tabstream.ops"))  # imports out of the timed fit
    procs = [psutil.Process()] + psutil.Process().children(recursive=True)
    cpu0 = {p.pid: sum(p.cpu_times()[:2]) for p in procs}
    ds = ts.Dataset(path, part_size="128MB")
    op = ops.Categorify(spill_dir=spill_dir)
    start = time.perf_counter()
    ts.Workflow(["id"] >> op, client=client).fit(ds, progress=False)
    fit_s = time.perf_counter() - start
    cpu = {p.pid: sum(p.cpu_times()[:2]) - cpu0[p.pid] for p in procs}
    me = _self_usage()
    result = {"case": case, "fit_s": fit_s, "partitions": ds.npartitions,
              "client_peak_mb": me["peak_mb"], "client_cpu_s": cpu[me["pid"]],
              "workers": [], "nannies": []}
    if client is not None:
        for role, nanny in (("workers", False), ("nannies", True)):
            for u in sorted(client.run(_self_usage, nanny=nanny).values(), key=lambda u: u["pid"]):
                if u["pid"] != me["pid"]:  # LocalCluster's nannies live in the client process
                    result[role].append({"peak_mb": u["peak_mb"], "cpu_s": cpu.get(u["pid"], float("nan"))})
        client.close()
        cluster.close()
    result["cpu_s"] = sum(cpu.values())
    result["in_memory_gb"] = ds.read_piece(ds.pieces[0]).nbytes * ds.npartitions / 2**30
    # checked after every peak was taken: the check holds the ids and the vocabulary
    result["vocabulary"] = op.tables["id"].num_rows
    result["vocabulary_error"] = check_vocabulary(op.tables["id"], rows, distinct)
    emit_result(result)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--distinct", type=int, default=20_000_000)
    parser.add_argument("--fillers", type=int, default=FILLERS)
    parser.add_argument("--cases", default="threaded", help="comma-separated: threaded, cluster")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--data-dir", default="bench_data")
    parser.add_argument("--budget-gb", type=float, default=2.0)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        case, path, spill, rows, distinct = args.child
        child(case, path, spill, int(rows), int(distinct))
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases or set(cases) - {"threaded", "cluster"}:
        raise SystemExit(f"--cases: expected threaded and/or cluster, got {args.cases!r}")
    name = f"highcard_{args.rows}_{args.distinct}" + (f"_f{args.fillers}" if args.fillers != FILLERS else "")
    path = os.path.join(args.data_dir, name)
    if not os.path.exists(path):
        start = time.perf_counter()
        generate(path, args.rows, args.distinct, args.fillers)
        print(f"generated {path} in {time.perf_counter() - start:.0f} s")
    spill = os.path.join(args.data_dir, "spill")
    os.makedirs(spill, exist_ok=True)
    runs: dict[str, list[dict]] = {c: [] for c in cases}
    failed = False
    for rep in range(args.repeats):
        for case in cases:
            print(f"run {rep + 1}/{args.repeats} {case}: load {os.getloadavg()[0]:.2f}", flush=True)
            res = run_child([sys.executable, os.path.abspath(__file__), "--child", case, path, spill,
                             str(args.rows), str(args.distinct)])
            if not res.ok:
                print(res.output)
                raise SystemExit(f"{case} child failed")
            r = res.result
            if r["vocabulary_error"]:
                print(f"{case}: vocabulary WRONG: {r['vocabulary_error']}")
                failed = True
            runs[case].append(r)
            print(f"  fit {r['fit_s']:.1f} s, CPU {r['cpu_s']:.1f} s, client peak {r['client_peak_mb']:.0f} MB, "
                  f"workers {[round(w['peak_mb']) for w in r['workers']]} MB", flush=True)
    print(machine_note())
    first = next(iter(runs.values()))[0]
    print(f"{args.rows:,} rows, {args.distinct:,} distinct ids, {first['partitions']} partitions "
          f"({first['in_memory_gb']:.2f} GB in memory), medians of {args.repeats}; "
          f"vocabulary exact (all {args.distinct:,} values, counts = np.bincount): {'FAIL' if failed else 'PASS'}")
    rows = []
    for case, rs in runs.items():
        nw = len(rs[0]["workers"])
        workers = "; ".join(
            f"{median([r['workers'][i]['peak_mb'] for r in rs]):.0f} MB / {median([r['workers'][i]['cpu_s'] for r in rs]):.1f} s"
            for i in range(nw)) or "-"
        nannies = ", ".join(f"{median([r['nannies'][i]['peak_mb'] for r in rs]):.0f}"
                            for i in range(len(rs[0]["nannies"]))) or "-"
        rows.append([case, f"{median([r['fit_s'] for r in rs]):.1f}", f"{median([r['cpu_s'] for r in rs]):.1f}",
                     f"{median([r['client_peak_mb'] for r in rs]):.0f}",
                     f"{median([r['client_cpu_s'] for r in rs]):.1f}", workers, nannies])
    print(format_table(["case", "fit s", "CPU s", "client peak MB", "client CPU s",
                        "each worker: peak MB / CPU s", "nannies peak MB"], rows))
    if len(runs) == 2:
        t, c = runs["threaded"], runs["cluster"]
        print(f"cluster / threaded: wall {median([r['fit_s'] for r in c]) / median([r['fit_s'] for r in t]):.2f}x, "
              f"CPU {median([r['cpu_s'] for r in c]) / median([r['cpu_s'] for r in t]):.2f}x, "
              f"largest worker peak / threaded peak "
              f"{median([max(w['peak_mb'] for w in r['workers']) for r in c]) / median([r['client_peak_mb'] for r in t]):.2f}x")
    peaks = [r["client_peak_mb"] for rs in runs.values() for r in rs]
    peaks += [w["peak_mb"] for rs in runs.values() for r in rs for w in r["workers"]]
    ok_rss = max(peaks) < args.budget_gb * 1024
    print(f"every process below the {args.budget_gb:g} GB budget: {'PASS' if ok_rss else 'FAIL'} "
          f"(largest {max(peaks):.0f} MB)")
    if failed or not ok_rss:
        raise SystemExit(1)


if __name__ == "__main__":
    main()

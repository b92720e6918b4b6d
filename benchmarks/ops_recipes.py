"""A feature-engineering recipe beyond the basic Criteo one, on synthetic Criteo logs:

    C1..C26        >> Categorify(freq_threshold=15)
    C1, C2, C3     >> HashBucket(100_000)                      -> renamed *_hb
    [C1,C2],[C5,C6]>> HashedCross(1_000_000)                   -> C1_X_C2, C5_X_C6
    C7, C8, label  >> TargetEncoding("label", kfold=3)          -> TE_C7_label, TE_C8_label
    I1..I13        >> FillMissing(0) >> Clip(0) >> LogOp() >> Normalize()

    python benchmarks/ops_recipes.py --rows 2000000

Fit + export from parquet in a fresh child process; prints seconds, rows/s and
peak RSS (kernel ru_maxrss of the child), with the basic Criteo recipe measured
in the same run as the baseline.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_result, format_table, machine_note, median, run_child  # noqa: E402


def build(recipe: str):
    import tabstream as ts
    from tabstream import ops
    from tabstream.recipes import criteo_graph

    base = criteo_graph(freq_threshold=15)
    if recipe == "basic":
        return ts.Workflow(base)
    hashed = ["C1", "C2", "C3"] >> ops.Rename(postfix="_hb") >> ops.HashBucket(100_000)
    crosses = [["C1", "C2"], ["C5", "C6"]] >> ops.HashedCross(1_000_000)
    te = ["C7", "C8", "label"] >> ops.TargetEncoding("label", kfold=3)
    return ts.Workflow(base + hashed + crosses + te)


def child(recipe: str, data: str, out: str) -> None:
    import tabstream as ts

    ds = ts.Dataset(data)
    wf = build(recipe)
    t0 = time.perf_counter()
    wf.fit(ds, progress=False)
    t1 = time.perf_counter()
    res = wf.transform(ds).to_parquet(out, out_files_per_proc=2, overwrite=True, progress=False)
    t2 = time.perf_counter()
    emit_result({"fit_s": t1 - t0, "export_s": t2 - t1, "rows": res.num_rows,
                 "columns": len(wf.output_schema)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data-dir", default="bench_data")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    data = os.path.join(args.data_dir, f"criteo-{args.rows}", "parquet")
    if not os.path.exists(os.path.join(data, ".complete")):
        from tabstream.datasets.synthetic import write_data

        write_data("criteo", data, args.rows, num_files=8, fmt="parquet")
        open(os.path.join(data, ".complete"), "w").close()
    runs: dict[str, list] = {"basic": [], "extended": []}
    for _ in range(args.repeats):
        for recipe in runs:
            out = os.path.join(args.data_dir, f"ops-{recipe}-out")
            r = run_child([sys.executable, os.path.abspath(__file__), "--child", recipe, data, out])
            if not r.ok:
                print(r.output)
                raise SystemExit(f"{recipe} failed")
            runs[recipe].append((r.result["fit_s"] + r.result["export_s"], r.result["fit_s"],
                                 r.result["export_s"], r.peak_rss_mb, r.result["columns"]))
    print(machine_note())
    rows = []
    for recipe, values in runs.items():
        total = median([v[0] for v in values])
        rows.append([recipe, values[0][4], f"{median([v[1] for v in values]):.2f}",
                     f"{median([v[2] for v in values]):.2f}", f"{total:.2f}",
                     f"{args.rows / total:,.0f}", f"{median([v[3] for v in values]):.0f}"])
    print(format_table(["recipe", "out cols", "fit s", "export s", "total s", "rows/s", "peak RSS MB"], rows))
    ratio = median([v[0] for v in runs["extended"]]) / median([v[0] for v in runs["basic"]])
    print(f"extended / basic total time: {ratio:.2f}x")


if __name__ == "__main__":
    main()

"""Categorify on a column with ~20 million distinct values, in bounded memory.

    python benchmarks/high_cardinality.py --distinct 20000000 --rows 30000000

Writes (once) a parquet dataset whose in-memory size exceeds the memory budget
(--budget-gb, default 2): an ``id`` column with exactly --distinct distinct
values (every value once, plus Zipf-like repeats) next to wide filler columns.
Fits ``Categorify`` on ``id`` in a fresh process and reports seconds, peak RSS
(kernel ``ru_maxrss`` of the child) and the vocabulary size, which must equal
--distinct. The target is peak RSS under the budget.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_result, format_table, machine_note, run_child  # noqa: E402

FILLERS = 8  # float64 columns that make the dataset wide


def generate(path: str, rows: int, distinct: int, seed: int = 0, chunk: int = 2_000_000) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if rows < distinct:
        raise SystemExit("--rows must be >= --distinct")
    os.makedirs(path + ".tmp", exist_ok=True)
    rng = np.random.default_rng(seed)
    # every id once (shuffled), then repeats skewed toward small ids
    ids = np.concatenate([rng.permutation(distinct), rng.zipf(1.3, rows - distinct) % distinct])
    rng.shuffle(ids)
    for i, start in enumerate(range(0, rows, chunk)):
        part = ids[start:start + chunk]
        cols = {"id": pc.binary_join_element_wise("id-", pc.cast(pa.array(part), pa.string()), "")}
        for f in range(FILLERS):
            cols[f"x{f}"] = pa.array(rng.random(len(part)))
        pq.write_table(pa.table(cols), os.path.join(path + ".tmp", f"part_{i:04d}.parquet"),
                       row_group_size=250_000)
    os.rename(path + ".tmp", path)


def child(path: str, spill_dir: str) -> None:
    import tabstream as ts
    from tabstream import ops

    ds = ts.Dataset(path, part_size="128MB")
    op = ops.Categorify(spill_dir=spill_dir)
    start = time.perf_counter()
    ts.Workflow(["id"] >> op).fit(ds, progress=False)
    fit_s = time.perf_counter() - start
    emit_result({"fit_s": fit_s, "vocabulary": op.tables["id"].num_rows,
                 "in_memory_gb": sum(ds.read_piece(p).nbytes for p in ds.pieces[:1]) * ds.npartitions / 2**30,
                 "partitions": ds.npartitions})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=30_000_000)
    parser.add_argument("--distinct", type=int, default=20_000_000)
    parser.add_argument("--data-dir", default="bench_data")
    parser.add_argument("--budget-gb", type=float, default=2.0)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    path = os.path.join(args.data_dir, f"highcard_{args.rows}_{args.distinct}")
    if not os.path.exists(path):
        start = time.perf_counter()
        generate(path, args.rows, args.distinct)
        print(f"generated {path} in {time.perf_counter() - start:.0f} s")
    spill = os.path.join(args.data_dir, "spill")
    os.makedirs(spill, exist_ok=True)
    res = run_child([sys.executable, os.path.abspath(__file__), "--child", path, spill])
    if not res.ok:
        print(res.output)
        raise SystemExit("child failed")
    r = res.result
    ok_vocab = r["vocabulary"] == args.distinct
    ok_rss = res.peak_rss_mb < args.budget_gb * 1024
    print(machine_note())
    print(format_table(
        ["rows", "distinct", "data in memory GB", "partitions", "fit s", "peak RSS MB", "vocabulary ok", "RSS < budget"],
        [[f"{args.rows:,}", f"{args.distinct:,}", f"{r['in_memory_gb']:.2f}", r["partitions"],
          f"{r['fit_s']:.1f}", f"{res.peak_rss_mb:.0f}", ok_vocab, ok_rss]]))
    if not (ok_vocab and ok_rss):
        raise SystemExit(1)


if __name__ == "__main__":
    main()

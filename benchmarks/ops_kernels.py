"""The ops moved behind backend kernels (issue 9), timed one by one on in-memory
Arrow tables of ``--rows`` rows on the arrow backend.

    python benchmarks/ops_kernels.py --rows 1000000 --repeat 3

Each op is timed ``--repeat`` times and the median printed, with the process's
peak RSS at the end. To compare with the code before the kernels, run the same
script with ``PYTHONPATH`` pointing at a checkout of that commit (``git archive``
of it into a folder), alternating the two within one session on the same machine,
and divide (see benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import numpy as np
import pyarrow as pa


def _median_seconds(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cases(n: int) -> dict:
    from tabstream.ops.bucketize import Bucketize
    from tabstream.ops.cardinality import DropLowCardinality
    from tabstream.ops.datastats import DataStats
    from tabstream.ops.groupby import Groupby
    from tabstream.ops.join_groupby import JoinGroupby
    from tabstream.ops.joins import JoinExternal
    from tabstream.ops.lists import ListSlice, SplitList, ValueCount
    from tabstream.ops.reduce_dtype import ReduceDtypeSize

    rng = np.random.default_rng(0)
    x = rng.normal(size=n)
    x[::97] = np.nan
    t_x = pa.table({"x": x})
    keys = pa.table({"k": rng.integers(0, max(n // 5, 1), n)})
    side_rows = max(n // 4, 2)
    side = pa.table({"k": np.repeat(np.arange(side_rows // 2 + 1), 2)[:side_rows], "w": np.arange(side_rows)})
    join = JoinExternal(side, on="k").fit_table(keys)
    sessions = pa.table({"s": rng.integers(0, max(n // 10, 1), n), "ts": rng.integers(0, 10**6, n),
                         "item": rng.integers(0, 5000, n), "price": x})
    groupby = Groupby("s", sort_cols="ts", aggs={"item": ["list", "count", "first", "last"],
                                                 "price": ["mean", "std", "sum"]})
    lengths = rng.integers(0, 8, n)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    lists = pa.table({"l": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 1000, offsets[-1])))})
    strings = pa.table({"g": pa.array(["|".join(map(str, rng.integers(0, 100, 3))) for _ in range(min(n, 200_000))])})
    items = pa.table({"item": rng.integers(0, max(n // 20, 1), n), "price": x})
    stats_table = pa.table({"price": x, "item": rng.integers(0, max(n // 2, 1), n),
                            "s": pa.array(rng.integers(0, max(n // 5, 1), n).astype(str))})
    reduce = ReduceDtypeSize().fit_table(items)
    low = DropLowCardinality()
    distinct_values = pa.array(rng.integers(0, max(n // 2, 1), n))
    return {
        "Bucketize.transform": lambda: Bucketize([-1.0, 0.0, 0.5, 1.0, 2.0]).transform(t_x),
        "JoinExternal.transform (1-2 matches)": lambda: join.transform(keys),
        "Groupby.transform": lambda: groupby.transform(sessions),
        "ListSlice(-3).transform": lambda: ListSlice(-3).transform(lists),
        "ListSlice(0,4,pad).transform": lambda: ListSlice(0, 4, pad=True).transform(lists),
        "ValueCount.fit_partition": lambda: ValueCount().fit_partition(lists),
        "SplitList.transform (<=200k rows)": lambda: SplitList("|", dtype="int64").transform(strings),
        "JoinGroupby.fit_partition": lambda: JoinGroupby(cont_cols=["price"], stats=["count", "mean", "std", "min",
                                                                                     "max"],
                                                         cat_groups=["item"]).fit_partition(items),
        "DataStats.fit_partition": lambda: DataStats(max_exact_distinct=1000).fit_partition(stats_table),
        "ReduceDtypeSize.fit_partition": lambda: reduce.fit_partition(items),
        "ReduceDtypeSize.transform": lambda: reduce.transform(items),
        "DropLowCardinality smallest distinct": lambda: low._smallest(distinct_values),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--label", default="this checkout")
    args = parser.parse_args()
    for name, fn in cases(args.rows).items():
        print(f"{args.label}\t{name}\t{_median_seconds(fn, args.repeat):.4f}", flush=True)
    print(f"{args.label}\tpeak RSS MiB\t{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}")


if __name__ == "__main__":
    main()

"""Categorify's id lookup with the arrow backend's vocabulary index (a hash table
built once per vocabulary) against ``index_in`` (which builds the vocabulary's set
on every call), on synthetic 8-character ids.

    python benchmarks/vocabulary_index.py                      # vocabularies of 4k to 512k values
    python benchmarks/vocabulary_index.py --vocab 145000 --rows 100000 --repeat 9

For each vocabulary size, ``--partitions`` partitions of ``--rows`` rows (ids drawn
from twice the vocabulary, so about half are out of vocabulary; 10% null) are
encoded by ``ArrowBackend.encode_ids`` with and without the index, alternating,
``--repeat`` times; the table shows the medians of process CPU time per million rows
and their ratio, the index's one-off build time, and a two-thread run of each (wall
time: the lookups release the GIL). The ids are checked equal. Then JoinGroupby and
TargetEncoding transform one partition against ``--ops-keys`` fitted keys with the
index and without it (outputs checked equal).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import numpy as np
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import format_table, machine_note, median, own_peak_rss_bytes  # noqa: E402


def _ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` distinct 8-character lower-case hex ids."""
    codes = np.unique(rng.integers(0, 16**8, size=n + n // 4 + 16))
    rng.shuffle(codes)
    return np.array([format(int(c), "08x") for c in codes[:n]], dtype=object)


def run(vocab_size: int, rows: int, partitions: int, repeat: int) -> list:
    from tabstream.backends.arrow import ArrowBackend

    kernels = ArrowBackend()
    rng = np.random.default_rng(vocab_size)
    pool = _ids(rng, 2 * vocab_size)
    vocabulary = pa.array(pool[:vocab_size], pa.string())
    parts = []
    for _ in range(partitions):
        values = pool[rng.integers(0, len(pool), rows)]
        parts.append(pa.array(values, pa.string(), mask=rng.random(rows) < 0.1))

    start = time.process_time()
    index = kernels.vocabulary_index(vocabulary)
    build = time.process_time() - start
    if index is None:
        return [vocab_size, "-", "-", "-", "-", "-", "no index (vocabulary under the size that gets one)"]

    def encode(with_index: bool) -> list[pa.Array]:
        return [kernels.encode_ids(p, vocabulary, 3, 1, 2, index if with_index else None) for p in parts]

    same = all(a.equals(b) for a, b in zip(encode(True), encode(False), strict=True))
    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(repeat):
        for with_index in (False, True):
            start = time.process_time()
            encode(with_index)
            times[with_index].append(time.process_time() - start)
    per_m = 1e6 / (rows * partitions)
    plain, indexed = median(times[False]) * per_m, median(times[True]) * per_m

    def two_threads(with_index: bool) -> float:
        workers = [threading.Thread(target=encode, args=(with_index,)) for _ in range(2)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return time.perf_counter() - start

    walls = {w: median([two_threads(w) for _ in range(3)]) for w in (False, True)}
    return [vocab_size, f"{plain:.3f}", f"{indexed:.3f}", f"{plain / indexed:.2f}x", f"{build * 1000:.1f}",
            f"{walls[False] * 1000:.0f} / {walls[True] * 1000:.0f}", "equal" if same else "DIFFERENT"]


def run_ops(keys: int, rows: int, repeat: int) -> list:
    """JoinGroupby and TargetEncoding transforms of one ``rows``-row partition after a
    fit on ``2 * keys`` rows of about ``keys`` distinct keys, with the index (the
    arrow backend's default) and without (every call codes the fitted keys with the
    given ones): CPU ms per call, medians of ``repeat`` after a first call."""
    import pandas as pd

    import tabstream as ts
    import tabstream.backends.arrow as arrow
    from tabstream import ops

    rng = np.random.default_rng(keys)
    pool = _ids(rng, keys)
    n = 2 * keys
    frame = pd.DataFrame({"s": pool[rng.integers(0, keys, n)], "i": rng.integers(0, keys, n),
                          "y": rng.integers(0, 2, n)})
    part = frame.iloc[:rows]
    cases = [("TargetEncoding, string keys", lambda: ["s", "y"] >> ops.TargetEncoding("y", kfold=1)),
             ("TargetEncoding, int keys", lambda: ["i", "y"] >> ops.TargetEncoding("y", kfold=1)),
             ("JoinGroupby, int keys", lambda: ["i", "y"] >> ops.JoinGroupby(cont_cols=["y"], stats=["count"]))]
    out, floor = [], arrow._INDEX_MIN
    for name, node in cases:
        ms = {}
        for with_index in (False, True):
            arrow._INDEX_MIN = floor if with_index else 1 << 62
            wf = ts.Workflow(node()).fit(ts.Dataset(frame))
            start = time.process_time()
            first = wf.transform(part)
            first_ms = (time.process_time() - start) * 1000
            times = []
            for _ in range(repeat):
                start = time.process_time()
                again = wf.transform(part)
                times.append(time.process_time() - start)
            ms[with_index] = (first_ms, median(times) * 1000, first.equals(again), first)
        arrow._INDEX_MIN = floor
        same = ms[True][3].equals(ms[False][3]) and ms[True][2] and ms[False][2]
        out.append([name, f"{ms[False][0]:.1f} / {ms[False][1]:.1f}", f"{ms[True][0]:.1f} / {ms[True][1]:.1f}",
                    f"{ms[False][1] / ms[True][1]:.1f}x", "equal" if same else "DIFFERENT"])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", default="4096,32768,145000,512000",
                   help="comma-separated vocabulary sizes")
    p.add_argument("--rows", type=int, default=100_000, help="rows per partition")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--ops-keys", type=int, default=1_000_000,
                   help="distinct keys of the JoinGroupby/TargetEncoding cases (0: skip them)")
    args = p.parse_args(argv)
    print(machine_note())
    rows = [run(int(v), args.rows, args.partitions, args.repeat) for v in args.vocab.split(",")]
    print(format_table(["vocabulary", "index_in s CPU/M rows", "index s CPU/M rows", "speed-up",
                        "index build ms", "2 threads wall ms (index_in / index)", "ids"], rows))
    if args.ops_keys:
        print(f"\nops: one {args.rows:,}-row partition against about {args.ops_keys:,} fitted keys "
              "(CPU ms: first call / median of the next)")
        op_rows = run_ops(args.ops_keys, args.rows, args.repeat)
        print(format_table(["op", "coded lookup ms", "index ms", "speed-up", "output"], op_rows))
        rows += op_rows
    peak = own_peak_rss_bytes()
    if peak:
        print(f"peak RSS {peak / 2**20:.0f} MB")
    if any(r[-1] == "DIFFERENT" for r in rows):
        raise SystemExit("the index gave other ids than index_in")


if __name__ == "__main__":
    main()

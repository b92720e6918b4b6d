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
time: the lookups release the GIL). The ids are checked equal.
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab", default="4096,32768,145000,512000",
                   help="comma-separated vocabulary sizes")
    p.add_argument("--rows", type=int, default=100_000, help="rows per partition")
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    print(machine_note())
    rows = [run(int(v), args.rows, args.partitions, args.repeat) for v in args.vocab.split(",")]
    print(format_table(["vocabulary", "index_in s CPU/M rows", "index s CPU/M rows", "speed-up",
                        "index build ms", "2 threads wall ms (index_in / index)", "ids"], rows))
    peak = own_peak_rss_bytes()
    if peak:
        print(f"peak RSS {peak / 2**20:.0f} MB")
    if any(r[-1] == "DIFFERENT" for r in rows):
        raise SystemExit("the index gave other ids than index_in")


if __name__ == "__main__":
    main()

"""Where the Criteo recipe's memory goes: one fit and one export in this process, with
a thread reading the process's resident memory every few milliseconds.

Prints, for the fit and for the export, the highest resident set seen and what it was
made of at that moment: anonymous pages (the heap: Arrow's allocator, numpy, Python),
file pages (mapped files: the partition cache, spilled candidates, the libraries) and
the bytes Arrow held live. The gap between anonymous pages and Arrow's live bytes is
memory the allocators keep for reuse (or numpy's and Python's own). After each pass it
prints the same figures at rest, and ``--release`` shows what handing the allocators'
kept pages back would leave.

    python benchmarks/etl_memory.py --rows 16000000 --format tsv --data-dir /tmp/s18etl
    python benchmarks/etl_memory.py --rows 1000000 --format parquet --data-dir /tmp/s18etl --timeline 2

The data is the one ``benchmarks/etl.py`` generates (the same folders). Memory only:
the times printed are for orientation, not a measurement (see etl.py for those).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from etl import FREQ_THRESHOLD, data_files  # noqa: E402


def memory_now() -> dict[str, int]:
    """Resident anonymous and file-backed pages of this process, in MB (Linux)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssFile:")):
                key, value = line.split(":")
                out[key[3:].lower()] = int(value.split()[0]) >> 10
    return out


class Sampler:
    """Samples resident memory and Arrow's live bytes until stopped; keeps every
    sample with the pass it belongs to."""

    def __init__(self, interval: float) -> None:
        import pyarrow as pa

        self.pa = pa
        self.interval = interval
        self.phase = "start"
        self.samples: list[tuple[float, str, int, int, int]] = []  # t, phase, anon, file, arrow
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            m = memory_now()
            self.samples.append((time.perf_counter(), self.phase, m["anon"], m["file"],
                                 self.pa.total_allocated_bytes() >> 20))
            self._stop.wait(self.interval)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, phase: str) -> tuple[float, str, int, int, int] | None:
        mine = [s for s in self.samples if s[1] == phase]
        return max(mine, key=lambda s: s[2] + s[3]) if mine else None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--format", choices=["parquet", "tsv"], default="parquet")
    p.add_argument("--data-dir", default="bench_data")
    p.add_argument("--interval", type=float, default=0.005, help="seconds between samples")
    p.add_argument("--timeline", type=float, default=0.0,
                   help="also print one sample every this many seconds")
    p.add_argument("--release", action="store_true",
                   help="at the end, hand the allocators' kept pages back and print what is left")
    args = p.parse_args(argv)

    files = data_files(args.data_dir, args.rows, args.format)
    import tabstream
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES
    from tabstream.recipes import criteo_workflow

    out = os.path.join(args.data_dir, "out", f"etl-memory-{args.rows}-{args.format}")
    rest = {"before": memory_now()}
    with Sampler(args.interval) as sampler:
        if args.format == "tsv":
            ds = tabstream.Dataset(files, names=CRITEO_COLUMNS, dtypes=CRITEO_DTYPES, sep="\t")
        else:
            ds = tabstream.Dataset(files)
        wf = criteo_workflow(freq_threshold=FREQ_THRESHOLD)
        start = time.perf_counter()
        sampler.phase = "fit"
        wf.fit(ds, progress=False)
        sampler.phase = "rest"
        rest["after fit"] = memory_now()
        fitted = time.perf_counter()
        sampler.phase = "export"
        wf.transform(ds).to_parquet(out, out_files_per_proc=2, shuffle=None, overwrite=True, progress=False)
        sampler.phase = "end"
        ended = time.perf_counter()
    rest["after export"] = memory_now()

    print(f"{args.rows:,} rows from {args.format}: {ds.npartitions} partitions, "
          f"fit {fitted - start:.1f} s, export {ended - fitted:.1f} s (orientation only)")
    for phase, t0 in (("fit", start), ("export", fitted)):
        top = sampler.peak(phase)
        if top is not None:
            _, _, anon, file_, arrow = top
            print(f"{phase:6s} peak {anon + file_:5d} MB: anonymous {anon} (Arrow live {arrow}, "
                  f"other {anon - arrow}), file-backed {file_}, at {top[0] - t0:.1f} s")
    for name, m in rest.items():
        print(f"{name:12s} anonymous {m['anon']:5d} MB, file-backed {m['file']:5d} MB")
    if args.release:
        import ctypes

        from tabstream.core.threads import release_freed_memory

        release_freed_memory()
        print(f"{'released':12s} anonymous {memory_now()['anon']:5d} MB (Arrow's kept pages, every thread)")
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            print(f"{'malloc_trim':12s} anonymous {memory_now()['anon']:5d} MB (the C heap's too)")
        except OSError:
            pass  # not glibc: nothing more to hand back this way
    if args.timeline > 0:
        last = -1.0
        for t, phase, anon, file_, arrow in sampler.samples:
            if t - start >= last + args.timeline:
                last = t - start
                print(f"  t={last:6.1f} s {phase:6s} anonymous {anon:5d}  file {file_:5d}  Arrow {arrow:5d} MB")


if __name__ == "__main__":
    main()

"""Shared helpers for the benchmark scripts: run a case in a fresh process and
measure its peak RSS, time phases, take medians, print tables.

Each measured case runs in its own child process so that its peak resident set
size is its own (imports, caches and arena growth of an earlier case do not leak
into the next one). The peak comes from the kernel, which no polling interval can
miss: the child's ``VmHWM`` (read from ``/proc/self/status`` when it hands back its
result), else its ``ru_maxrss`` from ``os.wait4``. ``VmHWM`` comes first because
Linux carries ``ru_maxrss`` across fork + exec: a child of a large parent would
report at least the parent's peak.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ChildResult",
    "Timer",
    "format_table",
    "machine_note",
    "median",
    "run_child",
]

RESULT_MARKER = "@@BENCH_RESULT@@ "


@dataclass
class ChildResult:
    """What a child process reported, with its exit status, wall time and peak RSS."""

    returncode: int
    wall_s: float
    peak_rss_bytes: int
    result: dict[str, Any] = field(default_factory=dict)
    output: str = ""

    @property
    def peak_rss_mb(self) -> float:
        return self.peak_rss_bytes / 2**20

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and bool(self.result)


def run_child(argv: Sequence[str], env: dict[str, str] | None = None,
              cwd: str | None = None, timeout: float | None = None) -> ChildResult:
    """Run ``argv`` in a fresh process; return its exit status, wall time, peak RSS
    and the JSON it printed on a line starting with :data:`RESULT_MARKER`
    (see :func:`emit_result`). stdout and stderr are kept in ``output``."""
    with tempfile.TemporaryFile(mode="w+b") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        deadline = None if timeout is None else start + timeout
        while True:
            # wait4 reaps the child and hands back its own rusage (ru_maxrss: KiB).
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG if deadline else 0)
            if pid:
                break
            if deadline and time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        log.seek(0)
        output = log.read().decode(errors="replace")
    result: dict[str, Any] = {}
    for line in output.splitlines():
        if line.startswith(RESULT_MARKER):
            result = json.loads(line[len(RESULT_MARKER):])
    peak = result.pop(_PEAK_KEY, None) or int(usage.ru_maxrss) * 1024
    return ChildResult(proc.returncode, wall, int(peak), result, output)


_PEAK_KEY = "_vmhwm_bytes"


def own_peak_rss_bytes() -> int | None:
    """This process's own peak RSS (``VmHWM``, which starts afresh at exec), or None
    where ``/proc`` has no such line."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def emit_result(result: dict[str, Any]) -> None:
    """Called in the child: hand ``result`` (JSON-serialisable) and the child's own
    peak RSS so far to :func:`run_child`."""
    sys.stdout.write(RESULT_MARKER + json.dumps({**result, _PEAK_KEY: own_peak_rss_bytes()}) + "\n")
    sys.stdout.flush()


class Timer:
    """Named phase timings: ``with timer("fit"): ...``; ``timer.seconds["fit"]``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None]
    return float(statistics.median(values)) if values else float("nan")


def machine_note() -> str:
    """One line: CPU model, cores, memory, Python (for RESULTS.md)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        import psutil

        mem = f", {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"
    except ImportError:
        pass
    return (f"{cpu}, {os.cpu_count()} logical cores{mem}, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], markdown: bool = False) -> str:
    """A plain-text (or markdown) table; floats are printed as given (format first)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    if markdown:
        lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
        return "\n".join(lines)
    lines = ["  ".join(c.ljust(w) for c, w in zip(cells[0], widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in cells[1:]]
    return "\n".join(lines)

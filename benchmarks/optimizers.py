"""Dense Adam vs sparse updates (LazyAdam / MultiOptimizer) on a large embedding
table, in PyTorch and in Keras 3, each framework in a fresh process.

    python benchmarks/optimizers.py                          # 10M x 16 table, batch 8192
    python benchmarks/optimizers.py --rows 1000000 --sparse-steps 30
    python benchmarks/optimizers.py --frameworks torch --markdown

Runs ``benchmarks/optimizers_torch.py``'s ``run`` and ``benchmarks/optimizers_tf.py``'s
``run`` (see their docstrings for the models and setups), each in its own child
process so that its peak RSS (from the kernel's ``ru_maxrss``) is its own and one
framework's memory does not weigh on the other. Prints one table::

    framework   dense setup  dense steps/s  sparse setup  sparse steps/s  ratio  target >= 10x  peak RSS MB

*dense* is the fastest dense-Adam setup of the framework (so the ratio is the
smallest honest one); there is one row per sparse setup: the MultiOptimizer
(LazyAdam for the table, Adam for the rest) and LazyAdam alone. The target of
issue 5 is a ratio of at least 10x in both frameworks.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_result, format_table, machine_note, run_child  # noqa: E402

TARGET = 10.0
FRAMEWORKS = ("torch", "tf")
# Setups as named by each framework's benchmark. Dense: Adam over the whole table.
DENSE_SETUPS = {
    "torch": ("dense Adam", "dense Adam (fused)"),
    "tf": ("keras.Embedding + Adam", "EmbeddingTable + Adam"),
}
# Sparse: name -> short label for the table.
SPARSE_SETUPS = {
    "torch": {"LazyAdam + Adam": "MultiOptimizer(LazyAdam, Adam)", "LazyAdam (alone)": "LazyAdam"},
    "tf": {"EmbeddingTable + MultiOptimizer": "MultiOptimizer(LazyAdam, Adam)",
           "EmbeddingTable + LazyAdam": "LazyAdam"},
}


# -- children ---------------------------------------------------------------------------
def child_torch(args: argparse.Namespace) -> dict[str, float]:
    """``{setup: steps/s}`` from ``optimizers_torch.run``."""
    import optimizers_torch

    return optimizers_torch.run(rows=args.rows, dim=args.dim, batch=args.batch,
                                steps=args.sparse_steps, dense_steps=args.dense_steps,
                                threads=args.threads)


def child_tf(args: argparse.Namespace) -> dict[str, float]:
    """``{variant: steps/s}`` from ``optimizers_tf.run``."""
    import optimizers_tf

    return optimizers_tf.run(rows=args.rows, dim=args.dim, batch=args.batch,
                             steps=(args.dense_steps, args.sparse_steps))


CHILDREN = {"torch": child_torch, "tf": child_tf}


# -- driver -----------------------------------------------------------------------------
def run_framework(framework: str, args: argparse.Namespace) -> tuple[dict[str, float], float]:
    """Run one framework's benchmark in a fresh process: ({setup: steps/s}, peak RSS MB)."""
    argv = [sys.executable, os.path.abspath(__file__), "--child", framework,
            "--rows", str(args.rows), "--dim", str(args.dim), "--batch", str(args.batch),
            "--dense-steps", str(args.dense_steps), "--sparse-steps", str(args.sparse_steps),
            "--threads", str(args.threads)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = run_child(argv, env=env)
    if not child.ok:
        raise SystemExit(f"{framework} benchmark failed (exit {child.returncode}):\n"
                         f"{child.output[-3000:]}")
    return child.result, child.peak_rss_mb


def table_rows(framework: str, steps: dict[str, float], rss_mb: float) -> list[list[str]]:
    """One row per sparse setup against the framework's fastest dense setup."""
    dense = {name: steps[name] for name in DENSE_SETUPS[framework] if name in steps}
    if not dense:
        raise SystemExit(f"{framework}: no dense setup among the results {sorted(steps)}")
    dense_name = max(dense, key=dense.__getitem__)
    rows = []
    for name, label in SPARSE_SETUPS[framework].items():
        if name not in steps:
            continue
        ratio = steps[name] / dense[dense_name]
        rows.append([framework, dense_name, f"{dense[dense_name]:.2f}", label, f"{steps[name]:.2f}",
                     f"{ratio:.1f}x", "yes" if ratio >= TARGET else "NO", f"{rss_mb:.0f}"])
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="rows of the large table")
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--dense-steps", type=int, default=5, help="timed steps of dense setups")
    parser.add_argument("--sparse-steps", type=int, default=50, help="timed steps of sparse setups")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--frameworks", nargs="+", choices=FRAMEWORKS, default=list(FRAMEWORKS))
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        emit_result(CHILDREN[args.child](args))
        return
    print(machine_note())
    print(f"table {args.rows:,} x {args.dim}, batch {args.batch:,}; {args.dense_steps} timed dense "
          f"steps, {args.sparse_steps} sparse; load average {os.getloadavg()[0]:.2f}", flush=True)
    headers = ["framework", "dense setup", "dense steps/s", "sparse setup", "sparse steps/s",
               "ratio", f"target >= {TARGET:.0f}x", "peak RSS MB"]
    rows = []
    for framework in args.frameworks:
        steps, rss_mb = run_framework(framework, args)
        print(f"  {framework}: " + ", ".join(f"{k} {v:.2f}" for k, v in steps.items())
              + f" steps/s; peak RSS {rss_mb:.0f} MB", flush=True)
        rows += table_rows(framework, steps, rss_mb)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print()
    print(format_table(headers, rows, markdown=args.markdown))


if __name__ == "__main__":
    main()

"""The cost of checking every id against its table's cardinality (issue 27, item 7).

A batch of ``rows`` single-hot ids for ``features`` tables (Criteo's 26 by default,
cardinalities 1,000 .. 1,000,000, dim 16). Times, per framework, the lookup of all
features with the check (what ``EmbeddingTables`` does) and without it, forward
only and forward + backward, the median of ``repeats`` runs:

    torch   check_ids + F.embedding per feature     vs   F.embedding per feature
    keras   check_ids + tf.gather per feature in a tf.function   vs   tf.gather per feature

Usage::

    python benchmarks/embedding_id_check.py                    # 65,536 rows, 26 features
    python benchmarks/embedding_id_check.py --framework torch --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _configs(features: int):  # type: ignore[no-untyped-def]
    from tabstream.train.tables import TableConfig

    cards = np.geomspace(1_000, 1_000_000, features).astype(int)
    return [TableConfig(f"C{i + 1}", int(c), 16, (f"C{i + 1}",)) for i, c in enumerate(cards)]


def _time(fn, repeats: int, sync=lambda: None) -> float:  # type: ignore[no-untyped-def]
    return _pair(fn, fn, repeats, sync)[0]


def _pair(first, second, repeats: int, sync=lambda: None) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Median ms of ``first`` and ``second``, run alternately (a busy machine's noise
    falls on both)."""
    times: tuple[list[float], list[float]] = ([], [])
    for fn in (first, second):
        fn()
        sync()
    for _ in range(repeats):
        for fn, out in zip((first, second), times):
            start = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - start)
    return statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3


def bench_torch(rows: int, features: int, repeats: int, device: str) -> None:
    import torch
    import torch.nn.functional as F

    from tabstream.train.torch.embeddings import EmbeddingTables, check_ids

    torch.manual_seed(0)
    tables = EmbeddingTables(_configs(features), sparse=True).to(device)
    rng = np.random.default_rng(0)
    batch = {c.name: torch.from_numpy(rng.integers(0, c.cardinality, rows)).to(device)
             for c in tables.configs}
    parsed = [(c.name, c, batch[c.name]) for c in tables.configs]
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def plain(backward: bool) -> None:
        out = [F.embedding(batch[c.name], tables[c.name].weight, sparse=True) for c in tables.configs]
        if backward:
            sum(o.sum() for o in out).backward()

    def checked(backward: bool) -> None:
        check_ids(parsed)
        plain(backward)

    with torch.no_grad():
        check = _time(lambda: check_ids(parsed), repeats, sync)
        fwd, fwd_checked = _pair(lambda: plain(False), lambda: checked(False), repeats, sync)
    step, step_checked = _pair(lambda: plain(True), lambda: checked(True), repeats, sync)
    print(f"torch {device}, {rows:,} rows x {features} features, threads {torch.get_num_threads()}")
    print(f"  check_ids alone            {check:8.2f} ms")
    print(f"  forward     {fwd:8.2f} ms, with the check {fwd_checked:8.2f} ms ({fwd_checked / fwd - 1:+.1%})")
    print(f"  fwd + bwd   {step:8.2f} ms, with the check {step_checked:8.2f} ms ({step_checked / step - 1:+.1%})")


def bench_keras(rows: int, features: int, repeats: int) -> None:
    import tensorflow as tf

    from tabstream.train.tensorflow.embeddings import EmbeddingTables, check_ids

    tables = EmbeddingTables(_configs(features), seed=0)
    rng = np.random.default_rng(0)
    batch = {c.name: tf.constant(rng.integers(0, c.cardinality, rows)) for c in tables.configs}
    by_name = tables.tables
    variables = tables.trainable_variables

    def make(check: bool):  # type: ignore[no-untyped-def]
        @tf.function
        def step(features):  # type: ignore[no-untyped-def]
            with tf.GradientTape() as tape:
                out = []
                for name, table in by_name.items():
                    ids = features[name]
                    if check:
                        ids = check_ids(ids, table.config, name)
                    out.append(tf.gather(table.embeddings.value, ids))
                loss = tf.add_n([tf.reduce_sum(v) for v in out])
            return tape.gradient(loss, variables)
        return step

    plain, checked = make(False), make(True)
    step, step_checked = _pair(lambda: plain(batch), lambda: checked(batch), repeats)
    print(f"keras (tf {tf.__version__}), {rows:,} rows x {features} features, tf.function")
    print(f"  fwd + bwd   {step:8.2f} ms, with the check {step_checked:8.2f} ms ({step_checked / step - 1:+.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=65_536)
    parser.add_argument("--features", type=int, default=26)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--framework", choices=["torch", "keras", "both"], default="both")
    parser.add_argument("--device", default="cpu", help="torch device")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.framework in ("torch", "both"):
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        bench_torch(args.rows, args.features, args.repeats, args.device)
    if args.framework in ("keras", "both"):
        bench_keras(args.rows, args.features, args.repeats)


if __name__ == "__main__":
    main()

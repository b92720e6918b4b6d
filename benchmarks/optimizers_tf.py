"""Steps/s of a model with one large embedding table (Keras 3, TensorFlow backend):
dense Keras Adam vs LazyAdam / MultiOptimizer, all in one run.

Model: ``ids_per_row`` ids per sample looked up in a ``rows x dim`` table and summed,
then Dense(32, relu) -> Dense(1); binary cross-entropy on random labels; a custom
``tf.function`` train step. Variants:

* ``keras.Embedding + Adam``: what a Keras user writes by default (the layer reads
  the whole table each step, Adam updates every row)
* ``EmbeddingTable + Adam``: tabstream's sparse lookup, Keras Adam (still dense update)
* ``EmbeddingTable + LazyAdam``: only the batch's rows are read and updated
* ``EmbeddingTable + MultiOptimizer``: LazyAdam for the table, Adam for the MLP

Run: ``python benchmarks/optimizers_tf.py [--rows 10000000 --dim 16 --batch 8192]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _build(variant: str, rows: int, dim: int, seed: int):
    import keras

    from tabstream.train.tables import TableConfig
    from tabstream.train.tensorflow import EmbeddingTable, LazyAdam, MultiOptimizer

    init = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
    if variant.startswith("keras.Embedding"):
        table = keras.layers.Embedding(rows, dim, embeddings_initializer=init)
    else:
        table = EmbeddingTable(TableConfig("ids", rows, dim, ("ids",)), initializer=init)
    hidden = keras.layers.Dense(32, activation="relu")
    head = keras.layers.Dense(1)
    if variant.endswith("+ Adam"):
        optimizer = keras.optimizers.Adam(1e-3)
    elif variant.endswith("+ LazyAdam"):
        optimizer = LazyAdam(1e-3)
    else:
        optimizer = MultiOptimizer(keras.optimizers.Adam(1e-3), [(LazyAdam(1e-3), table)])
    return table, hidden, head, optimizer


def _time_variant(variant, rows, dim, batch, ids_per_row, steps, warmup, seed):
    import keras
    import numpy as np
    import tensorflow as tf

    table, hidden, head, optimizer = _build(variant, rows, dim, seed)
    rng = np.random.default_rng(seed)
    batches = [
        (
            tf.constant(rng.integers(0, rows, (batch, ids_per_row)), tf.int64),
            tf.constant(rng.integers(0, 2, (batch, 1)), tf.float32),
        )
        for _ in range(4)
    ]
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)
    hidden.build((None, dim))
    head.build((None, 32))
    table(tf.reshape(batches[0][0], [-1]))
    variables = [*table.trainable_variables, *hidden.trainable_variables, *head.trainable_variables]
    optimizer.build(variables)

    @tf.function
    def step(ids, labels):
        with tf.GradientTape() as tape:
            looked_up = tf.reshape(table(tf.reshape(ids, [-1])), [-1, ids_per_row, dim])
            pooled = tf.reduce_sum(looked_up, axis=1)
            loss = loss_fn(labels, head(hidden(pooled)))
        optimizer.apply(tape.gradient(loss, variables), variables)
        return loss

    times = []
    for i in range(warmup + steps):
        ids, labels = batches[i % len(batches)]
        start = time.perf_counter()
        step(ids, labels).numpy()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _release_memory() -> None:
    import keras

    keras.backend.clear_session()
    gc.collect()


VARIANTS = (
    "keras.Embedding + Adam",
    "EmbeddingTable + Adam",
    "EmbeddingTable + LazyAdam",
    "EmbeddingTable + MultiOptimizer",
)


def run(
    rows: int = 10_000_000,
    dim: int = 16,
    batch: int = 8192,
    steps: tuple[int, int] = (5, 50),
    ids_per_row: int = 1,
    warmup: int = 2,
    seed: int = 0,
    variants: tuple[str, ...] = VARIANTS,
) -> dict[str, float]:
    """Median steps/s per variant; ``steps`` = (timed steps for the dense-Adam variants,
    timed steps for the sparse ones), each after ``warmup`` untimed steps. Prints a table
    and the speed-up of each sparse variant over each dense one."""
    with warnings.catch_warnings():
        # Keras Adam densifies the IndexedSlices gradient; TF warns about its size.
        warnings.filterwarnings("ignore", message="Converting sparse IndexedSlices")
        results = {}
        for variant in variants:
            n = steps[0] if variant.endswith("+ Adam") else steps[1]
            seconds = _time_variant(variant, rows, dim, batch, ids_per_row, n, warmup, seed)
            _release_memory()
            results[variant] = 1.0 / seconds
            print(f"{variant:34s} {results[variant]:9.2f} steps/s  ({seconds * 1e3:8.1f} ms/step, median of {n})", flush=True)
    dense = [v for v in results if v.endswith("+ Adam")]
    sparse = [v for v in results if not v.endswith("+ Adam")]
    print(f"table {rows:,} x {dim}, batch {batch}, {ids_per_row} id(s) per row")
    for s in sparse:
        ratios = ", ".join(f"{results[s] / results[d]:.1f}x {d}" for d in dense)
        print(f"{s}: {ratios}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--ids-per-row", type=int, default=1)
    parser.add_argument("--dense-steps", type=int, default=5)
    parser.add_argument("--sparse-steps", type=int, default=50)
    args = parser.parse_args()
    run(rows=args.rows, dim=args.dim, batch=args.batch, ids_per_row=args.ids_per_row,
        steps=(args.dense_steps, args.sparse_steps))


if __name__ == "__main__":
    main()

"""Training steps/s with a large embedding table: dense Adam vs sparse gradients
with LazyAdam (alone and in a MultiOptimizer), PyTorch side of issue 5.

The model is a DLRM over one ``rows x dim`` table (``item_id``), one 1,000-row
table and 4 continuous features, batch ``batch``. Every setup trains in the same
process, one after the other, on the same pre-generated batches:

    dense Adam            nn.EmbeddingBag(sparse=False) + torch.optim.Adam
    dense Adam (fused)    the same with Adam(fused=True)
    SparseAdam + Adam     sparse table + MultiOptimizer(Adam, [(torch SparseAdam, table)])
    LazyAdam + Adam       sparse table + MultiOptimizer(Adam, [(LazyAdam, table)])
    LazyAdam (alone)      sparse table + LazyAdam(model.parameters())

Usage::

    python benchmarks/optimizers_torch.py                 # 10M x 16, batch 8192
    python benchmarks/optimizers_torch.py --rows 1000000 --steps 100
"""

from __future__ import annotations

import argparse
import gc
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train.torch import DLRM, LazyAdam, MultiOptimizer, split_embeddings_on_size


def _schema(rows: int) -> Schema:
    def cat(name: str, n: int) -> ColumnSchema:
        return ColumnSchema(name, "int64", tags=frozenset({Tags.CATEGORICAL}),
                            properties={"domain": {"min": 0, "max": n - 1}})

    conts = [ColumnSchema(f"x{i}", "float32", tags=frozenset({Tags.CONTINUOUS})) for i in range(4)]
    label = ColumnSchema("click", "float32", tags=frozenset({Tags.TARGET}))
    return Schema([cat("item_id", rows), cat("category", 1000), *conts, label])


def _batches(rows: int, batch: int, n: int, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        features = {"item_id": torch.as_tensor(rng.integers(0, rows, batch)),
                    "category": torch.as_tensor(rng.integers(0, 1000, batch))}
        for i in range(4):
            features[f"x{i}"] = torch.as_tensor(rng.normal(size=batch), dtype=torch.float32)
        out.append((features, torch.as_tensor(rng.random(batch) < 0.25, dtype=torch.float32)))
    return out


def _setups(lr: float) -> dict[str, tuple[bool, Callable]]:
    """name -> (sparse table?, model -> optimizer)."""
    def multi(sparse_opt: Callable) -> Callable:
        def make(model: torch.nn.Module):
            large, _ = split_embeddings_on_size(model, threshold=100_000)
            return MultiOptimizer(partial(torch.optim.Adam, lr=lr), [(sparse_opt, large)],
                                  model=model)
        return make

    return {
        "dense Adam": (False, lambda m: torch.optim.Adam(m.parameters(), lr=lr)),
        "dense Adam (fused)": (False, lambda m: torch.optim.Adam(m.parameters(), lr=lr, fused=True)),
        "SparseAdam + Adam": (True, multi(partial(torch.optim.SparseAdam, lr=lr))),
        "LazyAdam + Adam": (True, multi(partial(LazyAdam, lr=lr))),
        "LazyAdam (alone)": (True, lambda m: LazyAdam(m.parameters(), lr=lr)),
    }


def _time_steps(model: torch.nn.Module, optimizer, batches: list, steps: int, warmup: int) -> float:
    def one(i: int) -> None:
        features, labels = batches[i % len(batches)]
        loss = F.binary_cross_entropy_with_logits(model(features), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for i in range(warmup):
        one(i)
    start = time.perf_counter()
    for i in range(steps):
        one(warmup + i)
    return steps / (time.perf_counter() - start)


def run(rows: int = 10_000_000, dim: int = 16, batch: int = 8192, steps: int = 50,
        dense_steps: int = 5, threads: int = 1, lr: float = 1e-3,
        only: list[str] | None = None) -> dict[str, float]:
    """Return ``{setup: steps/s}`` and print a table with each setup's speed-up
    over the fastest dense one. Dense setups run ``dense_steps`` timed steps (they
    are slow), sparse ones ``steps``; each after 2 warm-up steps."""
    torch.set_num_threads(threads)  # FACTS.md: 2 threads per process collapse on 2 shared cores
    schema = _schema(rows)
    batches = _batches(rows, batch, n=8)
    results: dict[str, float] = {}
    print(f"torch {torch.__version__}, {threads} thread(s); table {rows:,} x {dim}, batch {batch:,}")
    for name, (sparse, make_optimizer) in _setups(lr).items():
        if only and name not in only:
            continue
        torch.manual_seed(0)
        # sparse: tables of >= 100,000 rows (item_id) get sparse gradients, category stays dense
        model = DLRM(schema, embedding_dim=dim, bottom_mlp=(32,), top_mlp=(64, 32),
                     sparse=None if sparse else False)
        optimizer = make_optimizer(model)
        n = steps if sparse else dense_steps
        results[name] = _time_steps(model, optimizer, batches, n, warmup=2)
        print(f"  {name:<20} {results[name]:9.2f} steps/s  ({n} steps)", flush=True)
        del model, optimizer
        gc.collect()
    dense = max((v for k, v in results.items() if k.startswith("dense")), default=None)
    if dense:
        for name, value in results.items():
            if not name.startswith("dense"):
                print(f"  {name:<20} {value / dense:9.1f}x the fastest dense Adam")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--dense-steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    run(rows=args.rows, dim=args.dim, batch=args.batch, steps=args.steps,
        dense_steps=args.dense_steps, threads=args.threads)


if __name__ == "__main__":
    main()

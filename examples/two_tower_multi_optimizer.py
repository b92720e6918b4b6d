"""Two-tower retrieval on e-commerce logs: dense Adam vs MultiOptimizer(LazyAdam).

    python examples/two_tower_multi_optimizer.py                        # 1M rows, PyTorch
    python examples/two_tower_multi_optimizer.py --framework tensorflow  # Keras 3
    python examples/two_tower_multi_optimizer.py --rows 20000 --threshold 1000

This mirrors Merlin Models' multi-optimizer example. The user and item id tables
hold hundreds of thousands of rows; dense Adam updates every row of them (and
their moments) at every step, although a batch touches a few thousand. A
MultiOptimizer gives the tables with at least ``--threshold`` rows to LazyAdam,
which updates only the rows in the batch, and keeps Adam for the rest.

Steps:

1. ``generate_data("e-commerce", rows)``: one row per (user, item) impression with
   a click label; the first 90% of the rows go to ``raw/train.parquet``, the rest
   to ``raw/valid.parquet`` (rows are independent draws, so this is a random split).
2. A workflow built from ``ECOMMERCE_TAGS``: categorical columns ``>> Categorify()``,
   continuous ones ``>> LogOp() >> Normalize()``, each group ``>> AddTags(its tags)``
   (USER / USER_ID / ITEM / ITEM_ID / CONTEXT; ``click`` is the target). Fit on
   train, export train (shuffled) and valid.
3. ``TwoTower`` (query tower over USER columns, item tower over ITEM columns,
   in-batch negatives), trained twice from the same seed:
   ``adam``: Adam everywhere (in PyTorch: tables with ``sparse=False``);
   ``multi-optimizer``: LazyAdam with sparse updates for the large tables, Adam for
   the rest.
4. recall@10 on valid for both, next to two trivial baselines.

Prints, for example (the defaults, on a loaded 2-core machine; numbers vary)::

    export: 900,000 train rows, 100,000 valid rows (5.6 s)
    tables: user_id 399,372 x 56, item_id 227,543 x 48, user_age_bucket 10 x 8, ...; large (>= 100,000 rows): user_id, item_id
    adam             epoch  192.70 s   recall@10 0.0091
    multi-optimizer  epoch   16.73 s   recall@10 0.0118
    baselines: random recall@10 0.0009, most popular items recall@10 0.1103 (11,543 candidates)
    adam / multi-optimizer epoch time: 11.5x

(The recall figures above predate the log-Q correction; with it, TwoTower
trained with LazyAdam reaches about 0.112 on this data, see RESULTS.md.)

Recall ranks every distinct item of the validation clicks for each clicked row
(in both frameworks). Random ranking gets ``10 / candidates``; ranking by
training clicks does far better here, because impressions follow item
popularity. A plain softmax over in-batch negatives penalizes popular items as
often as they appear and learns affinity without popularity (recall@10 about
0.01 at 1M rows); TwoTower's log-Q correction (on by default) subtracts each
negative's log sampling frequency, so the scores keep popularity and recall
beats the most-popular baseline (see ``benchmarks/RESULTS.md``). With few rows
(``--rows 20000``) most validation users and items are unseen in training and
share the out-of-vocabulary id, so recall there says little.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

DEFAULT_THRESHOLD = 100_000  # the training modules' DEFAULT_SPARSE_THRESHOLD
VALID_FRACTION = 0.1
K = 10


@dataclass
class Result:
    """One training run: mean seconds per epoch (training only) and recall@K on valid."""

    setup: str
    epoch_s: float
    recall: float


# --------------------------------------------------------------------------- data


def write_raw(raw_dir: str, rows: int, seed: int) -> tuple[str, str]:
    """Synthetic interactions -> ``raw_dir/train.parquet`` and ``raw_dir/valid.parquet``.

    Columns as in ``ECOMMERCE_COLUMNS`` (user_id, item_id, user_age_bucket, ...,
    click); valid holds the last ``VALID_FRACTION`` of the rows.
    """
    from tabstream.datasets.synthetic import generate_data

    df = generate_data("e-commerce", rows, seed=seed)
    n_valid = max(1, int(rows * VALID_FRACTION))
    os.makedirs(raw_dir, exist_ok=True)
    train_path = os.path.join(raw_dir, "train.parquet")
    valid_path = os.path.join(raw_dir, "valid.parquet")
    df.iloc[:-n_valid].to_parquet(train_path, index=False)
    df.iloc[-n_valid:].to_parquet(valid_path, index=False)
    return train_path, valid_path


def ecommerce_workflow() -> Any:
    """Categorify + tag every column group of ``ECOMMERCE_TAGS``.

    Columns sharing a tag list form one group, so ``user_age_bucket`` and
    ``user_country`` (both ``["user", "categorical"]``) go through one Categorify.
    """
    import tabstream as ts
    from tabstream import ops
    from tabstream.datasets.synthetic import ECOMMERCE_TAGS

    groups: dict[tuple[str, ...], list[str]] = {}
    for column, tags in ECOMMERCE_TAGS.items():
        groups.setdefault(tuple(tags), []).append(column)
    nodes = []
    for tags, columns in groups.items():
        if "categorical" in tags:
            node = columns >> ops.Categorify()
        elif "continuous" in tags:
            # activity and price are positive and heavy tailed
            node = columns >> ops.LogOp() >> ops.Normalize()
        else:
            node = columns
        nodes.append(node >> ops.AddTags(list(tags)))
    graph = nodes[0]
    for node in nodes[1:]:
        graph = graph + node
    return ts.Workflow(graph)


def build_export(workdir: str, rows: int, seed: int) -> tuple[str, str]:
    """Raw logs -> fitted workflow -> ``workdir/train`` (shuffled) and ``workdir/valid``.

    Exports already in ``workdir`` (from an earlier run with ``--workdir``) are reused.
    """
    import tabstream as ts

    train_dir, valid_dir = os.path.join(workdir, "train"), os.path.join(workdir, "valid")
    if os.path.exists(train_dir) and os.path.exists(valid_dir):
        return train_dir, valid_dir  # exports appear complete or not at all: reuse them
    train_raw, valid_raw = write_raw(os.path.join(workdir, "raw"), rows, seed)
    workflow = ecommerce_workflow()
    workflow.fit(ts.Dataset(train_raw))
    workflow.transform(ts.Dataset(train_raw)).to_parquet(
        train_dir, out_files_per_proc=2, shuffle="per_worker", seed=seed
    )
    workflow.transform(ts.Dataset(valid_raw)).to_parquet(valid_dir)
    return train_dir, valid_dir


def describe_tables(schema: Any, threshold: int) -> str:
    """``"user_id 14,155 x 24, ...; large (>= 1,000 rows): user_id, item_id"``."""
    from tabstream.train import table_configs_from_schema

    feature_schema = schema.without(schema.select_by_tag("target").column_names)
    configs = table_configs_from_schema(feature_schema)
    sizes = ", ".join(f"{c.name} {c.cardinality:,} x {c.dim}" for c in configs)
    large = [c.name for c in configs if c.cardinality >= threshold]
    if not large:
        raise SystemExit(
            f"no embedding table has >= {threshold:,} rows (largest: "
            f"{max(c.cardinality for c in configs):,}); lower --threshold or raise --rows"
        )
    return f"{sizes}; large (>= {threshold:,} rows): {', '.join(large)}"


def read_columns(export_dir: str, columns: list[str]) -> Any:
    """The given columns of an export folder as one pandas DataFrame."""
    import pandas as pd

    import tabstream as ts

    return pd.concat(ts.Dataset(export_dir).to_iter(columns=columns), ignore_index=True)


def baselines(train_dir: str, valid_dir: str, positive_candidates: bool) -> tuple[float, float, int]:
    """(random recall@K, most-popular recall@K, number of candidates) on valid.

    Candidates are the distinct items of valid's clicked rows (``positive_candidates``,
    as PyTorch's ``recall_at_k`` ranks) or of all its rows (as Keras ``TwoTower``'s).
    Popularity ranks the candidates by their clicks in train.
    """
    train = read_columns(train_dir, ["item_id", "click"])
    valid = read_columns(valid_dir, ["item_id", "click"])
    positives = valid.loc[valid["click"] > 0, "item_id"]
    candidates = positives.unique() if positive_candidates else valid["item_id"].unique()
    clicks = train.loc[train["click"] > 0, "item_id"].value_counts()
    popular = clicks.reindex(candidates, fill_value=0).sort_values(ascending=False, kind="stable")
    top = set(popular.index[:K])
    return min(1.0, K / len(candidates)), float(positives.isin(top).mean()), len(candidates)


# ----------------------------------------------------------------------- training


def train_torch(setup: str, train_dir: str, valid_dir: str, args: argparse.Namespace) -> Result:
    """Train ``TwoTower`` with ``setup`` ("adam" or "multi-optimizer") in PyTorch."""
    from functools import partial

    import torch

    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import (
        LazyAdam,
        MultiOptimizer,
        TwoTower,
        fit,
        recall_at_k,
        split_embeddings_on_size,
    )

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train = Loader(train_dir, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    valid = Loader(valid_dir, batch_size=65536, shuffle=False)
    if setup == "adam":
        # dense gradients everywhere: Adam's step walks over every row of every table
        model = TwoTower(train.schema, sparse=False)
        optimizer: Any = torch.optim.Adam(model.parameters(), lr=args.lr)
    else:
        # tables with >= threshold rows get sparse gradients, LazyAdam updates their batch rows
        model = TwoTower(train.schema, sparse_threshold=args.threshold)
        large, _small = split_embeddings_on_size(model, args.threshold)
        optimizer = MultiOptimizer(
            partial(torch.optim.Adam, lr=args.lr), [(partial(LazyAdam, lr=args.lr), large)],
            model=model,
        )
    history = fit(model, train, optimizer, epochs=args.epochs, progress=sys.stderr.isatty())
    epoch_s = sum(history["time_s"]) / len(history["time_s"])
    return Result(setup, epoch_s, recall_at_k(model, valid, k=K))


def train_tensorflow(setup: str, train_dir: str, valid_dir: str, args: argparse.Namespace) -> Result:
    """Train Keras ``TwoTower`` with ``setup`` ("adam" or "multi-optimizer")."""
    import keras

    from tabstream.loaders.tensorflow import Loader
    from tabstream.train.tensorflow import (
        LazyAdam,
        MultiOptimizer,
        ThroughputCallback,
        TwoTower,
        split_embeddings_on_size,
    )

    keras.utils.set_random_seed(args.seed)
    train = Loader(train_dir, batch_size=args.batch_size, shuffle=True, seed=args.seed)
    valid = Loader(valid_dir, batch_size=65536, shuffle=False)
    model = TwoTower(train.core.schema, seed=args.seed)
    if setup == "adam":
        # Keras Adam turns the tables' IndexedSlices gradients into whole-table updates
        optimizer: Any = keras.optimizers.Adam(args.lr)
    else:
        tables = [*model.user_embeddings.tables.values(), *model.item_embeddings.tables.values()]
        large, _small = split_embeddings_on_size(tables, args.threshold)
        optimizer = MultiOptimizer(keras.optimizers.Adam(args.lr), [(LazyAdam(args.lr), large)])
    model.compile(optimizer=optimizer)  # TwoTower brings its in-batch softmax loss
    speed = ThroughputCallback(num_samples=train.core.num_rows, verbose=0)
    model.fit(train, epochs=args.epochs, shuffle=False, verbose=0, callbacks=[speed])
    # each epoch's time is its rows / its rate; the first epoch includes tracing
    epoch_s = sum(train.core.num_rows / rate for rate in speed.samples_per_sec) / args.epochs
    return Result(setup, epoch_s, model.recall_at_k(valid, k=K))


TRAINERS = {"torch": train_torch, "tensorflow": train_tensorflow}


# --------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="synthetic rows (train + valid)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--framework", choices=sorted(TRAINERS), default="torch")
    parser.add_argument("--threshold", type=int, default=DEFAULT_THRESHOLD,
                        help="tables with at least this many rows get LazyAdam")
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    # half the cores: the loader reads and shuffles in background threads meanwhile
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="torch intra-op threads (PyTorch only)")
    parser.add_argument("--workdir", help="where raw data and exports go (default: a temporary folder)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[Result]:
    args = parse_args(argv)
    if args.framework == "tensorflow":
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="tabstream-two-tower-") as tmp:
        workdir = args.workdir or tmp
        started = time.perf_counter()
        train_dir, valid_dir = build_export(workdir, args.rows, args.seed)
        import tabstream as ts

        train_rows, valid_rows = ts.Dataset(train_dir).num_rows, ts.Dataset(valid_dir).num_rows
        print(f"export: {train_rows:,} train rows, {valid_rows:,} valid rows "
              f"({time.perf_counter() - started:.1f} s)")
        print(f"tables: {describe_tables(ts.Dataset(train_dir).schema, args.threshold)}", flush=True)

        results = []
        for setup in ("adam", "multi-optimizer"):
            result = TRAINERS[args.framework](setup, train_dir, valid_dir, args)
            print(f"{setup:<16} epoch {result.epoch_s:7.2f} s   recall@{K} {result.recall:.4f}",
                  flush=True)
            results.append(result)

        # both frameworks rank the distinct items of the validation clicks
        random_recall, popular_recall, n = baselines(train_dir, valid_dir, positive_candidates=True)
    print(f"baselines: random recall@{K} {random_recall:.4f}, most popular items recall@{K} "
          f"{popular_recall:.4f} ({n:,} candidates)")
    adam, multi = results
    print(f"adam / multi-optimizer epoch time: {adam.epoch_s / multi.epoch_s:.1f}x")
    return results


if __name__ == "__main__":
    main()

"""One worker of the Keras HybridParallel tests (run as a script).

argv: out_dir. With TF_CONFIG (MultiWorkerMirroredStrategy over 127.0.0.1) every
case trains a ``HybridParallel`` DLRM on this worker's contiguous slice of each
global batch; without it, one process trains the plain DLRM on the whole global
batches (the reference). Each case writes ``<case>_<rank>.npz``: the loss of every
step (``loss__<step>``) and every weight (whole tables) after the last step.
"""

from __future__ import annotations

import functools
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    LazyAdam,
    MultiOptimizer,
    models,  # noqa: E402
    split_embeddings_on_size,
)

GLOBAL_BATCHES = (24, 24, 17)  # the last one splits 9/8 (W=2) and 6/6/5 (W=3)
CARDS = {"cat_0": 30, "cat_1": 100, "cat_2": 300, "tags": 50}
MIXED = {"cat_0": "table_wise", "cat_1": "row_wise", "cat_2": "column_wise", "tags": "row_wise"}
# case -> (plan, optimizer); the reference of "mixed_resume" is "mixed"
CASES = {
    "table_wise": ("table_wise", "lazy_adam"),
    "row_wise": ("row_wise", "multi"),
    "column_wise": ("column_wise", "lazy_adam"),
    "data_parallel": ("data_parallel", "multi"),
    "mixed": (MIXED, "multi"),
    "mixed_resume": (MIXED, "multi"),
    # the loss_fn returns each worker's batch mean (a scalar), not one loss per row
    "mixed_mean_loss": (MIXED, "multi"),
}


def schema() -> Schema:
    cols = [ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=name == "tags",
                         properties={"domain": {"min": 0, "max": card - 1}})
            for name, card in CARDS.items()]
    cols += [ColumnSchema(f"cont_{k}", "float32", tags=[Tags.CONTINUOUS]) for k in range(2)]
    cols.append(ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]))
    return Schema(cols)


def global_batches() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    rng = np.random.default_rng(7)
    out = []
    for size in GLOBAL_BATCHES:
        feats = {name: rng.integers(0, card, size).astype(np.int64)
                 for name, card in CARDS.items() if name != "tags"}
        lengths = rng.integers(0, 4, size)  # empty lists too
        padded = rng.integers(0, CARDS["tags"], (size, 3)).astype(np.int64)
        mask = np.arange(3)[None, :] < lengths[:, None]
        feats["tags"] = padded
        feats["tags__mask"] = mask
        for k in range(2):
            feats[f"cont_{k}"] = rng.normal(size=size).astype(np.float32)
        out.append((feats, rng.integers(0, 2, size).astype(np.float32)))
    return out


def as_tf(feats: dict[str, np.ndarray]) -> dict[str, object]:
    out: dict[str, object] = {k: tf.constant(v) for k, v in feats.items()
                              if k not in ("tags", "tags__mask")}
    out["tags"] = (tf.constant(feats["tags"]), tf.constant(feats["tags__mask"]))
    return out


def make_model(seed: int) -> DLRM:
    # "mean" lists: the row-wise partial sums must be divided by the whole list length
    # (the bundled DLRM takes the default "sum"; its table factory is given "mean" here)
    original = models.embedding_tables_from_schema
    models.embedding_tables_from_schema = functools.partial(original, combiner="mean")
    try:
        model = DLRM(schema(), embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=seed)
    finally:
        models.embedding_tables_from_schema = original
    assert {c.combiner for c in model.embeddings.configs} == {"mean"}
    return model


def make_optimizer(kind: str, model: DLRM) -> keras.optimizers.Optimizer:
    if kind == "lazy_adam":
        return LazyAdam(0.05)
    large, _ = split_embeddings_on_size(model.embeddings, threshold=100)
    return MultiOptimizer(keras.optimizers.Adam(0.01), [(LazyAdam(0.05), large)])


def bce(labels, logits):
    return tf.nn.sigmoid_cross_entropy_with_logits(labels, logits)


def mean_bce(labels, logits):
    return tf.reduce_mean(bce(labels, logits))


def reference(case: str, out_dir: str) -> None:
    plan, opt_kind = CASES[case]
    model = make_model(0)
    optimizer = make_optimizer(opt_kind, model)
    result = {}
    if case == "mixed":  # the starting point, to show that training moved every weight
        model(as_tf(global_batches()[0][0]))
        np.savez(os.path.join(out_dir, "initial.npz"),
                 **{v.path: np.asarray(v.numpy()) for v in model.weights})
    for step, (feats, labels) in enumerate(global_batches()):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(bce(tf.constant(labels), model(as_tf(feats), training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
        result[f"loss__{step}"] = np.float64(loss.numpy())
    for v in model.weights:
        result[v.path] = np.asarray(v.numpy())
    np.savez(os.path.join(out_dir, f"{case}_0.npz"), **result)


def distributed(case: str, out_dir: str, strategy, rank: int, world: int) -> None:
    from tabstream.train.tensorflow.distributed import HybridParallel

    plan, opt_kind = CASES[case]
    with strategy.scope():
        model = make_model(0)
        optimizer = make_optimizer(opt_kind, model)
        hp = HybridParallel(model, plan=plan)
    assert dict(hp.plan) == (MIXED if isinstance(plan, dict) else dict.fromkeys(CARDS, plan))
    loss_fn = mean_bce if case == "mixed_mean_loss" else bce
    step = hp.train_step(optimizer, loss_fn=loss_fn)
    result = {}
    mine = [(({k: v[np.array_split(np.arange(len(y)), world)[rank]] for k, v in f.items()}),
             y[np.array_split(np.arange(len(y)), world)[rank]]) for f, y in global_batches()]
    for i, (feats, labels) in enumerate(mine):
        if case == "mixed_resume" and i == 1:
            hp.save_checkpoint(os.path.join(out_dir, "ck"), optimizer)
            with strategy.scope():  # a new process would start here: other initial weights
                model = make_model(5)
                optimizer = make_optimizer(opt_kind, model)
                hp = HybridParallel(model, plan=plan)
            hp.restore_checkpoint(os.path.join(out_dir, "ck"), optimizer)
            step = hp.train_step(optimizer, loss_fn=loss_fn)
        result[f"loss__{i}"] = np.float64(step(as_tf(feats), tf.constant(labels)).numpy())
    result.update(hp.full_weights())
    np.savez(os.path.join(out_dir, f"{case}_{rank}.npz"), **result)


def per_id(out_dir: str, strategy, rank: int, world: int) -> None:
    """Per-id lookups (combiner=None) of a list feature, ragged and padded, and a
    single-hot feature, under every sharding type: this worker's rows against the
    unsharded tables' lookup of the same rows."""
    from tabstream.train.sharding import plan_sharding
    from tabstream.train.tensorflow import EmbeddingTables, TableConfig
    from tabstream.train.tensorflow.distributed import ShardedEmbeddingTables

    configs = [TableConfig("seq", 40, 6, ("seq", "seq_padded"), is_list=True, combiner=None),
               TableConfig("item", 25, 6, ("item",))]
    rng = np.random.default_rng(11)
    lengths = rng.integers(0, 5, 10)
    values = rng.integers(0, 40, int(lengths.sum()))
    splits = np.concatenate([[0], np.cumsum(lengths)])
    padded = np.zeros((10, 4), np.int64)
    mask = np.arange(4)[None, :] < lengths[:, None]
    padded[mask] = values
    rows = np.array_split(np.arange(10), world)[rank] if world > 1 else np.arange(10)
    lo, hi = int(rows[0]), int(rows[-1]) + 1
    feats = {"seq": tf.RaggedTensor.from_row_splits(values[splits[lo]:splits[hi]],
                                                    splits[lo:hi + 1] - splits[lo]),
             "seq_padded": (tf.constant(padded[lo:hi]), tf.constant(mask[lo:hi])),
             "item": tf.constant(rng.integers(0, 25, 10)[lo:hi])}
    result = {}
    for kind in ("table_wise", "row_wise", "column_wise", "data_parallel"):
        with strategy.scope():
            tables = EmbeddingTables(configs, list_features=["seq", "seq_padded"], seed=3)
            expected = tables(feats)
            sharded = ShardedEmbeddingTables(tables, plan_sharding(tables, world, strategy=kind),
                                             rank)

        @tf.function(autograph=False)
        def look(x, layer=sharded):
            out = strategy.run(layer, args=(x,))
            return strategy.experimental_local_results(out)[0]

        got = look(feats)
        for name in ("seq", "seq_padded"):
            for i, part in enumerate(("vectors", "mask")):
                result[f"{kind}__{name}__{part}__got"] = np.asarray(got[name][i])
                result[f"{kind}__{name}__{part}__expected"] = np.asarray(expected[name][i])
        result[f"{kind}__item__vectors__got"] = np.asarray(got["item"])
        result[f"{kind}__item__vectors__expected"] = np.asarray(expected["item"])
    np.savez(os.path.join(out_dir, f"per_id_{rank}.npz"), **result)


def comm(out_dir: str, strategy, rank: int, world: int) -> None:
    """Two training steps of the mixed plan under each exchange; writes
    ``comm_<exchange>_<rank>.json``: ``comm_stats()`` after each step and the plan's
    pieces (what the test's own count of the bytes starts from)."""
    from tabstream.train.tensorflow.distributed import HybridParallel

    batches = global_batches()
    for exchange in ("all_to_all", "all_gather"):
        with strategy.scope():
            model = make_model(0)
            optimizer = make_optimizer("multi", model)
            hp = HybridParallel(model, plan=MIXED, exchange=exchange)
        step = hp.train_step(optimizer, loss_fn=bce)
        stats = []
        for feats, labels in (batches[0], batches[2]):
            part = np.array_split(np.arange(len(labels)), world)[rank]
            step(as_tf({k: v[part] for k, v in feats.items()}), tf.constant(labels[part]))
            stats.append(hp.comm_stats())
        pieces = {name: [kind, hp.plan.placements[name].pieces()] for name, kind in hp.plan.items()}
        with open(os.path.join(out_dir, f"comm_{exchange}_{rank}.json"), "w") as fh:
            json.dump({"stats": stats, "pieces": pieces}, fh)


def main() -> None:
    out_dir = sys.argv[1]
    cases = sys.argv[2].split(",") if len(sys.argv) > 2 else list(CASES)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if "TF_CONFIG" not in os.environ:
        for case in cases:
            if case not in ("mixed_resume", "mixed_mean_loss"):
                reference(case, out_dir)
        return
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    for case in cases:
        if case == "per_id":
            per_id(out_dir, strategy, rank, strategy.num_replicas_in_sync)
        elif case == "comm":
            comm(out_dir, strategy, rank, strategy.num_replicas_in_sync)
        else:
            distributed(case, out_dir, strategy, rank, strategy.num_replicas_in_sync)


if __name__ == "__main__":
    main()

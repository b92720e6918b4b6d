"""One worker of the 2-worker ``MultiWorkerMirroredStrategy`` test (run as a script).

argv: data.npz valid_dir out_dir [checkpoint_dir]. TF_CONFIG comes from the
environment; with none, it trains alone under the default strategy on the whole
global batches. Each worker trains on its contiguous slice of every global batch,
so W workers and one process see the same global batches; it writes its final
weights and history to out_dir.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tabstream.core.schema import Schema  # noqa: E402
from tabstream.loaders.tensorflow import Loader  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    LazyAdam,
    MultiOptimizer,
    fit,
    split_embeddings_on_size,
)

GLOBAL_BATCHES = (64, 64, 37)  # the last one splits 19 / 18 between two workers


def main() -> None:
    data_path, valid_dir, out_dir = sys.argv[1:4]
    checkpoint_dir = sys.argv[4] if len(sys.argv) > 4 else None
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    if "TF_CONFIG" in os.environ:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        rank, world = int(task["index"]), strategy.num_replicas_in_sync
    else:
        strategy, rank, world = tf.distribute.get_strategy(), 0, 1
    with np.load(data_path, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files}
    schema = Schema.from_dict(json.loads(str(arrays.pop("schema"))))
    labels = arrays.pop("click")
    batches, start = [], 0
    for size in GLOBAL_BATCHES:
        mine = np.array_split(np.arange(start, start + size), world)[rank]
        start += size
        batches.append(({k: tf.constant(v[mine]) for k, v in arrays.items()},
                        tf.constant(labels[mine])))
    with strategy.scope():
        model = DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=0)
        model(model.example_batch())
        large, _ = split_embeddings_on_size(model.embeddings, threshold=50)
        optimizer = MultiOptimizer(keras.optimizers.Adam(0.01), [(LazyAdam(0.02), large)])
        valid = Loader(valid_dir, batch_size=50, shuffle=False)
    history = fit(model, batches, optimizer, epochs=1, valid_loader=valid,
                  checkpoint_dir=checkpoint_dir, progress=rank == 0, strategy=strategy)
    weights = {v.path.replace("/", "."): np.asarray(v.numpy()) for v in model.weights}
    np.savez(os.path.join(out_dir, f"weights_{rank}.npz"), **weights)
    with open(os.path.join(out_dir, f"history_{rank}.json"), "w") as fh:
        json.dump(history, fh)


if __name__ == "__main__":
    main()

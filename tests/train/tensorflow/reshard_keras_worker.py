"""One worker of the Keras resharding tests (run as a script, TF_CONFIG naming a
MultiWorkerMirroredStrategy cluster on 127.0.0.1).

argv: ``out_dir phase``. Every case trains a ``HybridParallel`` DLRM through ``fit``
for 3 epochs of EPOCH_STEPS global batches of ROWS rows (this worker's contiguous
slice of each), each phase on its own number of workers and each stopped as an
epoch starts (the stop is at an epoch's end: inside an epoch only a tabstream
loader knows which rows are left on another number of workers, and these batches
are given by hand):

- ``a`` (2 workers): epoch 1, stopped as epoch 2 starts;
- ``b`` (1 worker): resumes (2 -> 1), trains epoch 2, stopped as epoch 3 starts;
- ``c`` (2 workers): resumes (1 -> 2), trains epoch 3.

After each phase worker 0 writes ``<phase>-<case>.npz``: every weight of the
unwrapped model (tables whole, ``full_weights``). Phase ``b`` first tries two
refusals (another model, an optimizer of another kind) and records their messages.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from hybrid_worker import CARDS, MIXED, as_tf, make_model, schema  # noqa: E402
from hybrid_worker import make_optimizer as hybrid_optimizer  # noqa: E402

#: global batches of ROWS rows (split 12 / 6+6 / 4+4+4), EPOCH_STEPS of them an epoch
ROWS, EPOCH_STEPS, EPOCHS = 12, 2, 3
CASES = ["table_wise:lazy_adam", "row_wise:multi", "column_wise:lazy_adam",
         "data_parallel:multi", "mixed:multi", "mixed:adagrad"]
#: phase -> (workers, the epoch whose start stops it, or None)
PHASES = {"a": (2, 1), "b": (1, 2), "c": (2, None)}


def global_batches() -> list[tuple[dict[str, np.ndarray], np.ndarray]]:
    rng = np.random.default_rng(23)
    out = []
    for _ in range(EPOCH_STEPS * EPOCHS):
        feats = {name: rng.integers(0, card, ROWS).astype(np.int64)
                 for name, card in CARDS.items() if name != "tags"}
        lengths = rng.integers(0, 4, ROWS)
        feats["tags"] = rng.integers(0, CARDS["tags"], (ROWS, 3)).astype(np.int64)
        feats["tags__mask"] = np.arange(3)[None, :] < lengths[:, None]
        for k in range(2):
            feats[f"cont_{k}"] = rng.normal(size=ROWS).astype(np.float32)
        out.append((feats, rng.integers(0, 2, ROWS).astype(np.float32)))
    return out


def rows_of(batch: tuple[dict[str, np.ndarray], np.ndarray], rank: int, world: int):
    feats, labels = batch
    rows = np.array_split(np.arange(len(labels)), world)[rank]
    return as_tf({k: v[rows] for k, v in feats.items()}), tf.constant(labels[rows])


def plan_of(kind: str):
    return MIXED if kind == "mixed" else kind


def make_optimizer(kind: str, model):
    if kind == "adagrad":
        return keras.optimizers.Adagrad(0.1)
    return hybrid_optimizer(kind, model)


class Epochs:
    """This worker's batches, epoch ``e`` being global batches ``[e * EPOCH_STEPS, ...)``;
    fetching the first batch of epoch ``stop`` interrupts the run (after the
    checkpoint of the epoch before)."""

    def __init__(self, batches: list, stop: int | None) -> None:
        self.batches, self.stop, self.epoch = batches, stop, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return EPOCH_STEPS

    def __iter__(self):
        if self.epoch == self.stop:
            raise KeyboardInterrupt("stopped on purpose")
        yield from self.batches[self.epoch * EPOCH_STEPS:(self.epoch + 1) * EPOCH_STEPS]


def main() -> None:
    from tabstream.core.errors import SchemaError
    from tabstream.train.tensorflow import DLRM, fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    out, phase = Path(sys.argv[1]), sys.argv[2]
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    world = strategy.num_replicas_in_sync
    assert world == PHASES[phase][0]
    mine = [rows_of(b, rank, world) for b in global_batches()]

    def build(case: str, seed: int, model=None):
        kind, opt = case.split(":")
        with strategy.scope():
            model = model if model is not None else make_model(seed)
            optimizer = make_optimizer(opt, model)
            return HybridParallel(model, plan=plan_of(kind)), optimizer

    if phase == "b":  # refusals first: the checkpoint is left as it was
        errors = {}
        case = "mixed:multi"
        attempts = {
            "model": lambda: build(case, 1, DLRM(schema(), embedding_dim=16, bottom_mlp=(16,),
                                                 top_mlp=(8,), seed=1)),
            "optimizer": lambda: build("mixed:lazy_adam", 1),
        }
        for what, make in attempts.items():
            wrapper, optimizer = make()
            try:
                fit(wrapper, Epochs(mine, None), optimizer, epochs=EPOCHS, progress=False,
                    checkpoint_dir=out / f"ck-{case.replace(':', '-')}", resume=True)
                errors[what] = "not refused"
            except SchemaError as exc:
                errors[what] = str(exc)
        if rank == 0:
            (out / "refusals.json").write_text(json.dumps(errors))
    for case in CASES:
        tag = case.replace(":", "-")
        wrapper, optimizer = build(case, 0 if phase == "a" else 7)  # 7: only the checkpoint counts
        try:
            fit(wrapper, Epochs(mine, PHASES[phase][1]), optimizer, epochs=EPOCHS,
                progress=False, checkpoint_dir=out / f"ck-{tag}", resume=True)
            assert PHASES[phase][1] is None, "the run was not stopped"
        except KeyboardInterrupt:
            pass
        weights = wrapper.full_weights()
        if rank == 0:
            np.savez(out / f"{phase}-{tag}.npz", **weights)
        sys.stdout.flush()


if __name__ == "__main__":
    main()

"""The shared training loop (tabstream.train.loop) and Keras list inputs: the same
bad settings get the same errors from torch's and Keras' fit."""

from __future__ import annotations

import numpy as np

from tabstream.core.errors import DataError
from tabstream.core.schema import ColumnSchema, Schema, Tags


def _schema() -> Schema:
    cats = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": 9}}) for n in ("C1", "C2")]
    return Schema([*cats, ColumnSchema("click", "float32", tags=[Tags.TARGET])])


class _Day(list):
    def __init__(self, name, batches, crash_after=None):
        super().__init__(batches)
        self.data_id, self.crash_after = name, crash_after

    def __iter__(self):
        for i, batch in enumerate(list.__iter__(self)):
            if i == self.crash_after:
                raise KeyboardInterrupt  # the job is killed mid-list
            yield batch


def _torch(seed):
    import torch

    from tabstream.train.torch import DLRM, fit

    torch.manual_seed(0)
    model = DLRM(_schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,))
    rng = np.random.default_rng(seed)
    batches = [({n: torch.as_tensor(rng.integers(0, 10, 4)) for n in ("C1", "C2")},
                torch.as_tensor(rng.integers(0, 2, 4).astype(np.float32))) for _ in range(4)]
    return fit, model, torch.optim.SGD(model.parameters(), lr=0.1), batches


def _keras(seed):
    import tensorflow as tf

    from tabstream.train.tensorflow import DLRM, LazyAdam, fit

    model = DLRM(_schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)
    rng = np.random.default_rng(seed)
    batches = [({n: tf.constant(rng.integers(0, 10, 4)) for n in ("C1", "C2")},
                tf.constant(rng.integers(0, 2, 4).astype(np.float32))) for _ in range(4)]
    return fit, model, LazyAdam(0.01), batches


def _other_list_while_unfinished(make):
    def run(tmp):
        fit, model, opt, batches = make(1)
        try:
            fit(model, _Day("day-1", batches, crash_after=2), opt, checkpoint_dir=tmp / "ck",
                checkpoint_every=1, progress=False)
        except KeyboardInterrupt:
            pass
        *_, other = make(2)
        fit(model, _Day("day-2", other), opt, checkpoint_dir=tmp / "ck", resume=True,
            progress=False)
    return run


def _every_without_a_folder(make):
    def run(tmp):
        fit, model, opt, batches = make(1)
        fit(model, batches, opt, checkpoint_every=10, progress=False)
    return run


def _every_zero(make):
    def run(tmp):
        fit, model, opt, batches = make(1)
        fit(model, batches, opt, checkpoint_every=0, checkpoint_dir=tmp / "ck", progress=False)
    return run


def _keras_lists_of_lists_without_a_mask(tmp):
    import tensorflow as tf

    from tabstream.train.tensorflow import EmbeddingTables, TableConfig

    tables = EmbeddingTables([TableConfig("tags", 10, 4, ("tags",), is_list=True)])
    tables({"tags": tf.zeros([2, 3, 4], tf.int64)})


CASES = []
for _name, _make in (("torch", _torch), ("keras", _keras)):
    CASES += [
        (f"{_name}: another file list while one is unfinished",
         _other_list_while_unfinished(_make), DataError,
         r"fit: checkpoint .* stopped inside another file list \(epoch 1, after 2 batches; "
         r"data day-1, this loader's data day-2\)"),
        (f"{_name}: checkpoint_every without a checkpoint_dir", _every_without_a_folder(_make),
         ValueError, r"fit: checkpoint_every needs a checkpoint_dir"),
        (f"{_name}: checkpoint_every=0", _every_zero(_make), ValueError,
         r"fit: checkpoint_every must be >= 1 step, got 0"),
    ]
CASES.append(
    ("keras: lists of lists [B, F, L] without a mask", _keras_lists_of_lists_without_a_mask,
     ValueError, r"list feature 'tags' arrived as a dense tensor of shape \(2, 3, 4\) without "
     r"a mask\. .*\(padded, mask\), both \[B, L\] .*both \[B, F, L\].*'tags__mask'"),
)

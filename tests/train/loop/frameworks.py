"""The same small DLRM problem in torch and in Keras, for the tests of the shared
training loop (tabstream.train.loop): build a model and optimizer from a seed, turn
numpy batches into framework batches, read every weight as numpy."""

from __future__ import annotations

import numpy as np

from tabstream.core.schema import ColumnSchema, Schema, Tags

CARDINALITIES = {"C1": 20, "C2": 7}


def schema() -> Schema:
    cols = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": c - 1}})
            for n, c in CARDINALITIES.items()]
    return Schema([*cols, ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])


def numpy_batches(seed: int, n: int, rows: int = 8) -> list[tuple[dict, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        f = {k: rng.integers(0, c, rows).astype(np.int64) for k, c in CARDINALITIES.items()}
        f["I1"] = rng.normal(size=rows).astype(np.float32)
        out.append((f, rng.integers(0, 2, rows).astype(np.float32)))
    return out


class Torch:
    name = "torch"

    def __init__(self) -> None:
        import torch

        from tabstream.train.torch import LazyAdam, fit, fit_lists
        from tabstream.train.torch.fit import checkpoint_position

        self.torch, self.LazyAdam = torch, LazyAdam
        self.fit, self.fit_lists, self.position = fit, fit_lists, checkpoint_position

    def build(self, seed: int = 0):
        from tabstream.train.torch import DLRM

        self.torch.manual_seed(seed)
        model = DLRM(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,))
        return model, self.LazyAdam(model.parameters(), lr=0.05)

    def batch(self, f: dict, y: np.ndarray):
        t = self.torch
        return {k: t.as_tensor(v) for k, v in f.items()}, t.as_tensor(y)

    def weights(self, model) -> dict[str, np.ndarray]:
        return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


class Keras:
    name = "tensorflow"

    def __init__(self) -> None:
        import tensorflow as tf

        from tabstream.train.tensorflow import LazyAdam, fit, fit_lists
        from tabstream.train.tensorflow.fit import checkpoint_position

        self.tf, self.LazyAdam = tf, LazyAdam
        self.fit, self.fit_lists, self.position = fit, fit_lists, checkpoint_position

    def build(self, seed: int = 0):
        from tabstream.train.tensorflow import DLRM

        model = DLRM(schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=seed)
        model(model.example_batch())
        return model, self.LazyAdam(0.05)

    def batch(self, f: dict, y: np.ndarray):
        tf = self.tf
        return {k: tf.constant(v) for k, v in f.items()}, tf.constant(y)

    def weights(self, model) -> dict[str, np.ndarray]:
        return {v.path: np.asarray(v.numpy()).copy() for v in model.weights}


FRAMEWORKS = {"torch": Torch, "tensorflow": Keras}

"""Small building blocks of the bundled models: MLP, DLRM's dot interaction, DCN-v2's
cross network, and the continuous-feature input."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.core.errors import SchemaError
from tabstream.train.tensorflow._autograph import no_autograph as _no_autograph

__all__ = ["ContinuousFeatures", "CrossNetV2", "CrossNetwork", "DotInteraction", "MLP"]


def kernel_initializer(seed: int | None, offset: int = 0) -> Any:
    """Glorot-uniform, seeded with ``seed + offset`` when a seed is given."""
    return keras.initializers.GlorotUniform(seed=None if seed is None else seed + offset)


@keras.saving.register_keras_serializable(package="tabstream")
class MLP(keras.layers.Layer):
    """Dense layers of ``units``, ReLU between them; the last layer is activated too
    unless ``activate_last=False``. ``[B, n] -> [B, units[-1]]``."""

    def __init__(
        self,
        units: Sequence[int],
        activation: str = "relu",
        activate_last: bool = True,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        units = [int(u) for u in units]
        if not units or any(u <= 0 for u in units):
            raise ValueError(f"MLP needs at least one positive layer width, got {units}")
        self.units = units
        self.activation = activation
        self.activate_last = activate_last
        self.seed = seed
        self._depth = len(units)
        for i, u in enumerate(units):
            last = i == len(units) - 1
            # Direct attributes (not a list): tf.train.Checkpoint follows only these.
            setattr(
                self,
                f"dense_{i}",
                keras.layers.Dense(
                    u,
                    activation=None if last and not activate_last else activation,
                    kernel_initializer=kernel_initializer(seed, i),
                    name=f"dense_{i}",
                ),
            )

    def build(self, input_shape: Any) -> None:
        shape = tuple(input_shape)
        for i in range(self._depth):
            layer = getattr(self, f"dense_{i}")
            layer.build(shape)
            shape = (*shape[:-1], self.units[i])
        self.built = True

    @_no_autograph
    def call(self, x: tf.Tensor) -> tf.Tensor:
        for i in range(self._depth):
            x = getattr(self, f"dense_{i}")(x)
        return x

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return (*tuple(input_shape)[:-1], self.units[-1])

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "units": self.units,
                "activation": self.activation,
                "activate_last": self.activate_last,
                "seed": self.seed,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="tabstream")
class DotInteraction(keras.layers.Layer):
    """DLRM's pairwise dot products: ``[B, F, D] -> [B, F * (F - 1) / 2]``, the entries
    ``<x_i, x_j>`` for ``i < j`` in row-major order."""

    @_no_autograph
    def call(self, x: tf.Tensor) -> tf.Tensor:
        num = x.shape[1]
        if num is None or num < 2:
            raise ValueError(f"DotInteraction needs a known number >= 2 of vectors, got {x.shape}")
        gram = tf.matmul(x, x, transpose_b=True)  # [B, F, F]
        rows, cols = np.triu_indices(num, k=1)
        flat = tf.reshape(gram, [-1, num * num])
        return tf.gather(flat, rows * num + cols, axis=1)


@keras.saving.register_keras_serializable(package="tabstream")
class CrossNetV2(keras.layers.Layer):
    """DCN-v2 cross network: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``, ``[B, d] -> [B, d]``.

    With ``low_rank=r``, ``W_l = U_l V_l`` with ``U_l: d x r`` and ``V_l: r x d``.
    """

    def __init__(
        self, num_layers: int = 3, low_rank: int | None = None, seed: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        if num_layers < 1:
            raise ValueError(f"CrossNetV2 needs num_layers >= 1, got {num_layers}")
        if low_rank is not None and (isinstance(low_rank, bool)
                                     or not isinstance(low_rank, numbers.Integral) or low_rank < 1):
            # as torch's CrossNetwork: 0 is no rank at all, not "full rank"
            raise ValueError(f"CrossNetwork (DCN's cross layers): low_rank must be None "
                             f"(full-rank layers) or an int >= 1, got {low_rank!r}")
        self.num_layers = num_layers
        self.low_rank = low_rank
        self.seed = seed

    def build(self, input_shape: Any) -> None:
        dim = int(input_shape[-1])
        # Weights as direct attributes (tf.train.Checkpoint does not follow lists).
        for i in range(self.num_layers):
            if self.low_rank:
                shapes = {f"u_{i}": (dim, self.low_rank), f"v_{i}": (self.low_rank, dim)}
            else:
                shapes = {f"kernel_{i}": (dim, dim)}
            for j, (wname, shape) in enumerate(shapes.items()):
                init = kernel_initializer(self.seed, 2 * i + j)
                setattr(self, wname, self.add_weight(shape=shape, name=wname, initializer=init))
            setattr(
                self, f"bias_{i}", self.add_weight(shape=(dim,), name=f"bias_{i}", initializer="zeros")
            )
        self.built = True

    @_no_autograph
    def call(self, x0: tf.Tensor) -> tf.Tensor:
        x = x0
        for i in range(self.num_layers):
            if self.low_rank:
                projected = tf.matmul(tf.matmul(x, getattr(self, f"u_{i}")), getattr(self, f"v_{i}"))
            else:
                projected = tf.matmul(x, getattr(self, f"kernel_{i}"))
            x = x0 * (projected + getattr(self, f"bias_{i}")) + x
        return x

    def compute_output_shape(self, input_shape: Any) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"num_layers": self.num_layers, "low_rank": self.low_rank, "seed": self.seed})
        return config


#: The name both frameworks use (``tabstream.train.torch.CrossNetwork``); ``CrossNetV2``
#: stays for code and saved models written before.
CrossNetwork = CrossNetV2


class ContinuousFeatures:
    """Concatenates scalar continuous features into ``[B, n]`` float32 (no weights)."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = list(names)

    def __bool__(self) -> bool:
        return bool(self.names)

    @_no_autograph
    def __call__(self, features: Mapping[str, Any]) -> tf.Tensor:
        missing = [n for n in self.names if n not in features]
        if missing:
            raise SchemaError(  # a KeyError, as torch's FeatureInputs raises
                f"continuous features {missing} are missing from the input; got {sorted(features)}"
            )
        cols = []
        for n in self.names:
            x = tf.cast(features[n], tf.float32)
            if x.shape.rank == 1:
                x = x[:, None]
            cols.append(x)
        return tf.concat(cols, axis=1)

"""Sparse-aware Keras 3 optimizers: :class:`LazyAdam` and :class:`MultiOptimizer`.

Keras 3's ``Adam`` turns an ``IndexedSlices`` gradient into a dense update of the
whole table (every row's moments decay, every row moves). :class:`LazyAdam` updates
only the rows present in the batch. :class:`MultiOptimizer` routes each variable to
one of several optimizers, e.g. LazyAdam for the large embedding tables and Adam
for the rest::

    large, small = split_embeddings_on_size(model.embeddings, threshold=100_000)
    opt = MultiOptimizer(keras.optimizers.Adam(1e-3), [(LazyAdam(1e-3), large)])
    model.compile(optimizer=opt, loss=...)      # or opt.apply(grads, vars) in a loop
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from tabstream.train.tables import TableConfig
from tabstream.train.tensorflow._autograph import no_autograph as _no_autograph
from tabstream.train.tensorflow.embeddings import sum_duplicate_rows

__all__ = ["LazyAdam", "MultiOptimizer", "sum_repeated_ids"]


@keras.saving.register_keras_serializable(package="tabstream")
class LazyAdam(keras.optimizers.Optimizer):
    """Adam that, for ``IndexedSlices`` gradients, updates only the rows in the batch.

    Dense gradients get the textbook Adam step (the same as ``keras.optimizers.Adam``).
    For a sparse gradient with row ids ``r`` (duplicates are summed first), at step
    ``t = iterations + 1`` and ``alpha = lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)``::

        m[r] = beta_1 * m[r] + (1 - beta_1) * g[r]
        v[r] = beta_2 * v[r] + (1 - beta_2) * g[r] ** 2
        w[r] -= alpha * m[r] / (sqrt(v[r]) + epsilon)

    Rows outside ``r`` keep their weights and moments. ``clipnorm``, ``clipvalue`` and
    ``global_clipnorm`` apply to the summed rows ``g[r]``, i.e. exactly as to the dense
    gradient, without densifying it. ``weight_decay`` is rejected (it would touch every
    row).
    """

    def __init__(
        self,
        learning_rate: Any = 0.001,
        beta_1: float = 0.9,
        beta_2: float = 0.999,
        epsilon: float = 1e-7,
        name: str = "lazy_adam",
        **kwargs: Any,
    ) -> None:
        if kwargs.get("weight_decay") is not None:
            raise ValueError(
                "LazyAdam does not support weight_decay: decaying the weights would update "
                "every row of a table; use keras.optimizers.AdamW for dense variables"
            )
        super().__init__(learning_rate=learning_rate, name=name, **kwargs)
        self.beta_1 = beta_1
        self.beta_2 = beta_2
        self.epsilon = epsilon

    def build(self, var_list: Sequence[Any]) -> None:
        if self.built:
            return
        super().build(var_list)
        self._momentums = []
        self._velocities = []
        for var in var_list:
            self._momentums.append(self.add_variable_from_reference(var, name="momentum"))
            self._velocities.append(self.add_variable_from_reference(var, name="velocity"))

    @_no_autograph
    def _clip_gradients(self, grads: list[Any]) -> list[Any]:
        if not (self.clipnorm or self.clipvalue or self.global_clipnorm):
            return grads
        # Clip what the dense gradient would hold: one summed row per id.
        grads = [sum_duplicate_rows(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if self.clipvalue:
            return [_map_values(g, lambda x: tf.clip_by_value(x, -self.clipvalue, self.clipvalue))
                    for g in grads]
        if self.clipnorm:
            return [g if g is None else tf.clip_by_norm(g, self.clipnorm) for g in grads]
        squares = [tf.reduce_sum(tf.square(_values(g))) for g in grads if g is not None]
        norm = tf.sqrt(tf.add_n(squares))
        scale = self.global_clipnorm / tf.maximum(norm, self.global_clipnorm)
        return [_map_values(g, lambda x: x * tf.cast(scale, x.dtype)) for g in grads]

    @_no_autograph
    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        dtype = variable.dtype
        lr = tf.cast(learning_rate, dtype)
        step = tf.cast(self.iterations + 1, dtype)
        beta_1 = tf.cast(self.beta_1, dtype)
        beta_2 = tf.cast(self.beta_2, dtype)
        alpha = lr * tf.sqrt(1.0 - tf.pow(beta_2, step)) / (1.0 - tf.pow(beta_1, step))

        if not isinstance(gradient, tf.IndexedSlices):
            g = tf.cast(gradient, dtype)
            self.assign_add(m, (g - m) * (1.0 - beta_1))
            self.assign_add(v, (tf.square(g) - v) * (1.0 - beta_2))
            self.assign_sub(variable, m * alpha / (tf.sqrt(v) + self.epsilon))
            return

        # Sum the gradient rows of repeated ids so each row gets one Adam step.
        summed = sum_duplicate_rows(gradient)
        rows = summed.indices
        g = tf.cast(summed.values, dtype)
        m_var = _tf_variable(m)
        v_var = _tf_variable(v)
        m_rows = beta_1 * tf.gather(m_var, rows) + (1.0 - beta_1) * g
        v_rows = beta_2 * tf.gather(v_var, rows) + (1.0 - beta_2) * tf.square(g)
        m_var.scatter_update(tf.IndexedSlices(m_rows, rows))
        v_var.scatter_update(tf.IndexedSlices(v_rows, rows))
        _tf_variable(variable).scatter_sub(
            tf.IndexedSlices(alpha * m_rows / (tf.sqrt(v_rows) + self.epsilon), rows)
        )

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update({"beta_1": self.beta_1, "beta_2": self.beta_2, "epsilon": self.epsilon})
        return config


def _values(grad: Any) -> tf.Tensor:
    return grad.values if isinstance(grad, tf.IndexedSlices) else grad


def _map_values(grad: Any, fn: Any) -> Any:
    if grad is None:
        return None
    if isinstance(grad, tf.IndexedSlices):
        return tf.IndexedSlices(fn(grad.values), grad.indices, grad.dense_shape)
    return fn(grad)


def _tf_variable(variable: Any) -> tf.Variable:
    """The ``tf.Variable`` behind a Keras variable (which has ``.value``)."""
    return variable.value if isinstance(variable, keras.Variable) else variable


def _path(variable: Any) -> str:
    return getattr(variable, "path", None) or variable.name


def _label(optimizer: keras.optimizers.Optimizer) -> str:
    return f"{type(optimizer).__name__}(name={optimizer.name!r})"


def _as_optimizer(value: Any, what: str) -> keras.optimizers.Optimizer:
    if isinstance(value, str):
        value = keras.optimizers.get(value)
    if not isinstance(value, keras.optimizers.Optimizer):
        raise TypeError(f"{what} must be a keras.optimizers.Optimizer or its name, got {value!r}")
    if isinstance(value, MultiOptimizer):
        raise TypeError(f"{what} cannot be a MultiOptimizer (nesting is not supported)")
    return value


@keras.saving.register_keras_serializable(package="tabstream")
class MultiOptimizer(keras.optimizers.Optimizer):
    """Route each trainable variable to one optimizer.

    ``optimizers_and_blocks`` is a list of ``(optimizer, claims)``; ``claims`` is one
    or a list of: Keras layers (all their trainable variables, e.g. the
    :class:`EmbeddingTable` layers from :func:`split_embeddings_on_size` or a whole
    :class:`EmbeddingTables`), variables, variable paths (``"C1/embeddings"``, or a
    layer path prefix such as ``"dlrm/top_mlp"``) or :class:`TableConfig` (the table
    variable ``"<name>/embeddings"``). Unclaimed variables go to ``default_optimizer``.
    A variable claimed by two different optimizers raises ``ValueError`` (at
    construction when the variables already exist, else when the optimizer is built).

    Works with ``model.compile(optimizer=...)``/``fit`` and custom loops
    (``opt.apply(grads, model.trainable_variables)``, inside ``tf.function`` too).
    State: ``opt.variables`` lists the own and every sub-optimizer's variables;
    ``tf.train.Checkpoint(optimizer=opt)`` and ``model.save_weights`` /
    ``model.save`` of a compiled model save and restore all of them (build the
    restored optimizer first: ``opt.build(model.trainable_variables)``).
    ``opt.learning_rate`` is the default optimizer's.
    """

    def __init__(
        self,
        default_optimizer: Any,
        optimizers_and_blocks: Sequence[tuple[Any, Any]] = (),
        name: str = "multi_optimizer",
        **kwargs: Any,
    ) -> None:
        unsupported = sorted(k for k, v in kwargs.items() if v is not None)
        if unsupported:
            raise ValueError(
                f"MultiOptimizer does not take {unsupported}: set them on the sub-optimizers"
            )
        super().__init__(learning_rate=0.0, name=name)
        default = _as_optimizer(default_optimizer, "default_optimizer")
        optimizers = [default]
        entries: list[tuple[int, Any]] = []
        for i, entry in enumerate(optimizers_and_blocks):
            if not isinstance(entry, (tuple, list)) or len(entry) != 2:
                raise TypeError(
                    f"optimizers_and_blocks[{i}] must be a pair (optimizer, tables_or_layers), "
                    f"got {entry!r}"
                )
            opt = _as_optimizer(entry[0], f"optimizers_and_blocks[{i}][0]")
            if not any(opt is o for o in optimizers):
                optimizers.append(opt)
            index = next(j for j, o in enumerate(optimizers) if o is opt)
            entries.append((index, entry[1]))
        # A plain list attribute: tracked by tf.train.Checkpoint and walked by Keras
        # saving (sub-optimizers are addressed by class name there, so fresh instances
        # in another process restore into the same slots).
        self._optimizers = optimizers
        for opt in optimizers:
            sum_repeated_ids(opt)
        # Bookkeeping lives in a plain object: Keras/TF tracking would otherwise follow
        # the claimed layers and variables from the optimizer.
        self._state = _RoutingState(entries)
        # Fail early on double claims among variables that already exist.
        self._resolve_claims(None)

    # -- routing --------------------------------------------------------------
    @property
    def optimizers(self) -> list[keras.optimizers.Optimizer]:
        """The default optimizer first, then the others in the order given."""
        return list(self._optimizers)

    @property
    def default_optimizer(self) -> keras.optimizers.Optimizer:
        return self._optimizers[0]

    def _claimed_variables(self, claim: Any, var_list: Sequence[Any] | None) -> list[Any]:
        if isinstance(claim, (keras.Variable, tf.Variable)):
            return [claim]
        if isinstance(claim, keras.layers.Layer):
            return list(claim.trainable_variables)
        if isinstance(claim, (str, TableConfig)):
            if var_list is None:
                return []  # resolved against the variables being optimized, at build
            if isinstance(claim, TableConfig):
                suffix = f"{claim.name}/embeddings"
                return [
                    v for v in var_list if _path(v) == suffix or _path(v).endswith("/" + suffix)
                ]
            return [v for v in var_list if _path(v) == claim or _path(v).startswith(claim + "/")]
        if isinstance(claim, Mapping):
            claim = list(claim.values())
        if isinstance(claim, Iterable):
            out = []
            for c in claim:
                out.extend(self._claimed_variables(c, var_list))
            return out
        raise TypeError(
            "MultiOptimizer claims must be Keras layers, variables, variable paths (str) or "
            f"TableConfig (or lists of them), got {type(claim).__name__}: {claim!r}"
        )

    def _resolve_claims(self, var_list: Sequence[Any] | None) -> dict[Any, int]:
        routing: dict[Any, int] = {}
        for entry_index, (opt_index, claims) in enumerate(self._state.entries):
            found = self._claimed_variables(claims, var_list)
            if var_list is not None:
                known = {self._var_key(v) for v in var_list}
                found = [v for v in found if self._var_key(v) in known]
                if not found:
                    raise ValueError(
                        f"MultiOptimizer entry {entry_index} ({_label(self._optimizers[opt_index])}) "
                        "claims none of the variables being optimized; check that its "
                        f"layers/tables belong to this model. Claims: {claims!r}"
                    )
            for var in found:
                key = self._var_key(var)
                previous = routing.get(key)
                if previous is not None and previous != opt_index:
                    raise ValueError(
                        f"variable {_path(var)!r} is claimed by two optimizers: "
                        f"{_label(self._optimizers[previous])} and "
                        f"{_label(self._optimizers[opt_index])}; give each table or layer "
                        "to one optimizer only"
                    )
                routing[key] = opt_index
        return routing

    @_no_autograph
    def build(self, var_list: Sequence[Any]) -> None:
        if self.built:
            return
        var_list = list(var_list)
        routing = self._resolve_claims(var_list)
        groups: list[list[Any]] = [[] for _ in self._optimizers]
        for var in var_list:
            groups[routing.get(self._var_key(var), 0)].append(var)
        for opt, group in zip(self._optimizers, groups, strict=True):
            if group:
                opt.build(group)
        self._state.routing = {self._var_key(v): routing.get(self._var_key(v), 0) for v in var_list}
        self._state.claimed_paths = [[_path(v) for v in group] for group in groups]
        super().build(var_list)

    def optimizer_for(self, variable: Any) -> keras.optimizers.Optimizer:
        """The optimizer that updates ``variable`` (after :meth:`build`)."""
        if not self.built:
            raise ValueError("MultiOptimizer is not built yet: call build(model.trainable_variables)")
        try:
            return self._optimizers[self._state.routing[self._var_key(variable)]]
        except KeyError:
            raise KeyError(f"variable {_path(variable)!r} is not optimized by {self.name!r}") from None

    # -- applying gradients ---------------------------------------------------
    @_no_autograph
    def apply(self, grads: Sequence[Any], trainable_variables: Sequence[Any] | None = None) -> None:
        grads = list(grads)
        if not grads:
            return
        if trainable_variables is None:
            if not self.built:
                raise ValueError(
                    "MultiOptimizer.apply(grads) without variables needs a built optimizer; "
                    "call build(model.trainable_variables) first"
                )
            trainable_variables = self._trainable_variables
        trainable_variables = list(trainable_variables)
        if len(grads) != len(trainable_variables):
            raise ValueError(
                f"got {len(grads)} gradients for {len(trainable_variables)} variables"
            )
        if not self.built:
            self.build(trainable_variables)
        groups: list[tuple[list[Any], list[Any]]] = [([], []) for _ in self._optimizers]
        for grad, var in zip(grads, trainable_variables, strict=True):
            key = self._var_key(var)
            if key not in self._state.routing:
                raise ValueError(
                    f"variable {_path(var)!r} was not among the variables this MultiOptimizer "
                    "was built with; create a new optimizer for a new set of variables"
                )
            groups[self._state.routing[key]][0].append(grad)
            groups[self._state.routing[key]][1].append(var)
        for opt, (g, v) in zip(self._optimizers, groups, strict=True):
            if any(x is not None for x in g):
                opt.apply(g, v)
        self._iterations.assign_add(1)

    @_no_autograph
    def finalize_variable_values(self, var_list: Sequence[Any]) -> None:
        if not self.built:
            return
        groups: list[list[Any]] = [[] for _ in self._optimizers]
        for var in var_list:
            index = self._state.routing.get(self._var_key(var))
            if index is not None:
                groups[index].append(var)
        for opt, group in zip(self._optimizers, groups, strict=True):
            if group:
                opt.finalize_variable_values(group)

    # -- state ----------------------------------------------------------------
    @property
    def variables(self) -> list[Any]:
        out = list(self._variables)
        for opt in self._optimizers:
            out.extend(opt.variables)
        return out

    # Keras saving stores the sub-optimizers on their own (it walks ``_optimizers``);
    # this object stores only its own counters, so nothing is written twice.
    def save_own_variables(self, store: Any) -> None:
        for i, var in enumerate(self._variables):
            store[str(i)] = var.numpy()

    def load_own_variables(self, store: Any) -> None:
        if len(store.keys()) != len(self._variables):
            raise ValueError(
                f"MultiOptimizer {self.name!r}: the saved state has {len(store.keys())} "
                f"variables, this optimizer {len(self._variables)}"
            )
        for i, var in enumerate(self._variables):
            var.assign(store[str(i)])

    @property
    def learning_rate(self) -> Any:
        return self._optimizers[0].learning_rate

    @learning_rate.setter
    def learning_rate(self, value: Any) -> None:
        self._optimizers[0].learning_rate = value

    def get_config(self) -> dict[str, Any]:
        """Sub-optimizers plus their claims as variable paths (known once built), so
        ``from_config`` routes the same variables of a rebuilt model."""
        if self._state.claimed_paths is not None:
            claims = self._state.claimed_paths[1:]
        else:
            claims = [[] for _ in self._optimizers[1:]]
            for opt_index, entry in self._state.entries:
                if opt_index > 0:  # claims of the default optimizer need no routing
                    claims[opt_index - 1].extend(_static_claim_paths(entry))
        return {
            "name": self.name,
            "default_optimizer": keras.optimizers.serialize(self._optimizers[0]),
            "optimizers_and_blocks": [
                [keras.optimizers.serialize(opt), paths]
                for opt, paths in zip(self._optimizers[1:], claims, strict=True)
            ],
        }

    @classmethod
    def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> MultiOptimizer:
        return cls(
            keras.optimizers.deserialize(config["default_optimizer"], custom_objects=custom_objects),
            [
                (keras.optimizers.deserialize(opt, custom_objects=custom_objects), list(paths))
                for opt, paths in config["optimizers_and_blocks"]
            ],
            name=config.get("name", "multi_optimizer"),
        )


class _RoutingState:
    """Claims as given, then variable key -> optimizer index and claimed paths."""

    def __init__(self, entries: list[tuple[int, Any]]) -> None:
        self.entries = entries
        self.routing: dict[Any, int] = {}
        self.claimed_paths: list[list[str]] | None = None


def _static_claim_paths(claims: Any) -> list[str]:
    """Variable paths of claims before building (layers' existing variables)."""
    if isinstance(claims, str):
        return [claims]
    if isinstance(claims, TableConfig):
        return [f"{claims.name}/embeddings"]
    if isinstance(claims, (keras.Variable, tf.Variable)):
        return [_path(claims)]
    if isinstance(claims, keras.layers.Layer):
        return [_path(v) for v in claims.trainable_variables]
    if isinstance(claims, Mapping):
        claims = list(claims.values())
    out: list[str] = []
    for c in claims:
        out.extend(_static_claim_paths(c))
    return out


def sum_repeated_ids(optimizer: Any) -> Any:
    """Make a Keras optimizer update an ``IndexedSlices`` gradient with one row per
    id (the sum of that id's rows) and return it. Keras' own optimizers (Adagrad,
    Adam, RMSprop, Ftrl, ...) take the rows as distinct ids, so a repeated id gets
    the squares of its parts, not the square of its gradient. The rows are summed in
    ``update_step``, after the replicas' gradients are added up (under a strategy
    the sum of ``IndexedSlices`` concatenates them: an id repeats across replicas
    even when each replica's lookups sent it once). :class:`LazyAdam` sums them
    itself; a :class:`MultiOptimizer` does this to each of its optimizers."""
    if isinstance(optimizer, MultiOptimizer):
        for opt in optimizer.optimizers:
            sum_repeated_ids(opt)
        return optimizer
    if isinstance(optimizer, LazyAdam) or getattr(optimizer, "_sums_repeated_ids", False):
        return optimizer
    step = optimizer.update_step

    def update_step(gradient: Any, variable: Any, learning_rate: Any) -> Any:
        if isinstance(gradient, tf.IndexedSlices):
            gradient = sum_duplicate_rows(gradient)
        return step(gradient, variable, learning_rate)

    # on the instance, past Keras/TF attribute tracking (a function is no state)
    object.__setattr__(optimizer, "update_step", update_step)
    object.__setattr__(optimizer, "_sums_repeated_ids", True)
    return optimizer

"""Embedding tables built from a schema, with lookups that keep gradients sparse.

Every table is an :class:`EmbeddingTable` layer holding one ``cardinality x dim``
variable (path ``"<table name>/embeddings"``). Its lookup gathers rows from the
variable itself (``tf.gather`` on the ``tf.Variable``), so the forward pass reads only
the rows of the batch and the gradient is a ``tf.IndexedSlices`` over those rows;
:class:`~tabstream.train.tensorflow.LazyAdam` then updates only them.
(``keras.layers.Embedding`` converts the whole table to a tensor every step.)

Accepted inputs for one feature, in ``features: dict[str, Tensor]``:

* single-hot: int ``[B]`` or ``[B, 1]`` -> ``[B, dim]``
* multi-hot (pooled with the table's ``combiner``, "sum" or "mean"), any of
    - ``tf.RaggedTensor`` ``[B, None]``
    - padded int ``[B, L]`` plus ``features[name + "__mask"]`` (bool or 0/1, ``[B, L]``)
    - ``features[name + "__values"]`` and ``features[name + "__offsets"]`` (row splits,
      ``B + 1`` entries starting at 0, as merlin-dataloader delivers), or the tuple
      ``(values, offsets)`` under ``name`` (as :class:`tabstream.loaders.tensorflow.Loader`
      delivers)
    - the tuple ``(padded, mask)`` under ``name``, both ``[B, L]`` (as the loader
      delivers with ``pad=True``): a tuple whose first element has rank 2 is read
      this way, one whose first element has rank 1 as ``(values, offsets)``
    - ``tf.SparseTensor`` ``[B, L]``

Padded lists of lists ``(ids [B, F, L], mask [B, F, L])`` pool each inner list:
``[B, F, dim]``. A table with ``combiner=None`` looks list features up per id
instead (for sequence models): ``(vectors [B, L, dim], mask [B, L])``, ``L`` the
longest list of the batch for ragged input, the padded length otherwise
(``[B, F, L, dim]`` for lists of lists), vectors zero where the mask is false;
single-hot features stay ``[B, dim]``.

Every id is a real row of its table, ``0`` included: a list position is padding
only where the mask is false (padded layouts) or where it does not exist (ragged
layouts), never because of its id. Pooling counts real positions only; an empty
list pools to zeros (``combiner="mean"`` too). A padded ``[B, L]`` list without a
mask is refused, since its padding cannot be told from its ids.

>>> tables = EmbeddingTables([TableConfig("genre", 10, 8, ("genres",), is_list=True)])
>>> out = tables({"genres": tf.ragged.constant([[1, 2], [3], []])})
>>> out["genres"].shape       # row 0 = E[1] + E[2], row 1 = E[3], row 2 = 0
TensorShape([3, 8])
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import keras
import tensorflow as tf

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import Schema
from tabstream.train.spec import check_threshold, feature_spec
from tabstream.train.tables import TableConfig
from tabstream.train.tensorflow._autograph import no_autograph as _no_autograph

__all__ = [
    "EmbeddingTable",
    "EmbeddingTables",
    "check_ids",
    "embedding_tables_from_schema",
    "split_embeddings_on_size",
    "sum_duplicate_rows",
]

MASK_SUFFIX = "__mask"
VALUES_SUFFIX = "__values"
OFFSETS_SUFFIX = "__offsets"


def _config_to_dict(config: TableConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "cardinality": config.cardinality,
        "dim": config.dim,
        "feature_names": list(config.feature_names),
        "is_list": config.is_list,
        "combiner": config.combiner,
        "list_features": None if config.list_features is None else list(config.list_features),
    }


def _config_from_dict(d: Mapping[str, Any]) -> TableConfig:
    lists = d.get("list_features")
    return TableConfig(**{**d, "feature_names": tuple(d["feature_names"]),
                          "list_features": None if lists is None else tuple(lists)})


@keras.saving.register_keras_serializable(package="tabstream")
class EmbeddingTable(keras.layers.Layer):
    """One embedding table, created eagerly from its :class:`TableConfig`.

    ``table(ids)`` looks up single-hot ids; ``table.pool(values, row_ids, nrows)``
    pools flat multi-hot ids. ``table.embeddings`` is the variable.
    """

    def __init__(
        self,
        config: TableConfig,
        initializer: Any = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(config, Mapping):  # from get_config
            config = _config_from_dict(config)
        if not isinstance(config, TableConfig):
            raise TypeError(f"EmbeddingTable needs a TableConfig, got {type(config).__name__}")
        kwargs.setdefault("name", config.name)
        super().__init__(**kwargs)
        self.config = config
        if initializer is None:
            initializer = keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.initializer = keras.initializers.get(initializer)
        # Created here (not in build) so that optimizers can claim the variable
        # before the model first runs.
        self.embeddings = self.add_weight(
            shape=(config.cardinality, config.dim),
            initializer=self.initializer,
            name="embeddings",
        )
        self.built = True

    def build(self, input_shape: Any = None) -> None:
        self.built = True

    @property
    def cardinality(self) -> int:
        return self.config.cardinality

    @property
    def dim(self) -> int:
        return self.config.dim

    def _gather(self, ids: tf.Tensor, feature: str | None = None) -> tf.Tensor:
        ids = check_ids(ids, self.config, feature or self.config.name)
        read = getattr(self, "_one_read", None)
        if read is not None:  # a table several features share (see EmbeddingTables.call)
            return tf.gather(read, ids)
        # Each distinct id read once, then spread over the batch: the gradient is an
        # IndexedSlices with one row per id, the sum of that id's rows. Keras' own
        # optimizers (Adagrad, Adam, RMSprop, Ftrl, ...) take IndexedSlices rows as
        # distinct: a repeated id's squares were summed instead of the square of its
        # summed gradient (measured: 0.04 off the dense update after one Adagrad
        # step). Gathering from the tf.Variable (not a tensor read of it) reads only
        # the requested rows.
        flat = tf.reshape(ids, [-1])
        distinct, where = tf.unique(flat)
        rows = tf.gather(tf.gather(self.embeddings.value, distinct), where)
        if ids.shape.rank == 1:
            return rows
        return tf.reshape(rows, tf.concat([tf.shape(ids), [self.config.dim]], axis=0))

    @_no_autograph
    def call(self, ids: tf.Tensor, feature: str | None = None) -> tf.Tensor:
        ids = tf.convert_to_tensor(ids)
        if ids.shape.rank == 2 and ids.shape[1] == 1:
            ids = tf.squeeze(ids, axis=1)
        if ids.shape.rank != 1:
            raise ValueError(
                f"table {self.config.name!r}: single-hot lookups take ids of shape [B] or "
                f"[B, 1], got {ids.shape}; pass list features through EmbeddingTables"
            )
        return self._gather(ids, feature)

    @_no_autograph
    def pool(self, values: tf.Tensor, row_ids: tf.Tensor, nrows: tf.Tensor,
             feature: str | None = None) -> tf.Tensor:
        """Pool flat ids ``values`` belonging to rows ``row_ids`` into ``[nrows, dim]``."""
        emb = self._gather(values, feature)
        row_ids = tf.cast(row_ids, tf.int32)
        nrows = tf.cast(nrows, tf.int32)
        pooled = tf.math.unsorted_segment_sum(emb, row_ids, nrows)
        if self.config.combiner == "mean":
            counts = tf.math.unsorted_segment_sum(tf.ones_like(row_ids, emb.dtype), row_ids, nrows)
            pooled = pooled / tf.maximum(counts, 1.0)[:, None]
        return pooled

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "config": _config_to_dict(self.config),
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


#: What the in-graph check's message starts with; ``fit`` turns the
#: ``InvalidArgumentError`` that carries it into a :class:`DataError`.
ID_CHECK_MARK = "is outside embedding table"


def check_ids(ids: tf.Tensor, config: TableConfig, feature: str) -> tf.Tensor:
    """``ids``, checked ``0 <= id < cardinality``: an id outside the table names the
    feature, the id and the cardinality (``tf.gather`` fails on CPU without naming
    them and returns zeros on GPU). Eagerly a :class:`DataError`; inside a
    ``tf.function`` a ``tf.debugging.Assert`` (an ``InvalidArgumentError`` with the
    same words, which :func:`tabstream.train.tensorflow.fit` raises as a DataError).
    Costs a min and a max per feature and batch (``benchmarks/embedding_id_check.py``).
    XLA (``jit_compile=True``) drops asserts: there the check does not run. Ids of
    a narrower or unsigned integer dtype (an export with ``ReduceDtypeSize``) come
    back as int64, which the lookups take."""
    ids = tf.convert_to_tensor(ids)
    if ids.dtype.is_integer and ids.dtype not in (tf.int32, tf.int64):
        ids = tf.cast(ids, tf.int64)
    card = config.cardinality
    if tf.executing_eagerly():
        if int(tf.size(ids)) == 0:
            return ids
        low, high = int(tf.reduce_min(ids)), int(tf.reduce_max(ids))
        if low < 0 or high >= card:
            raise DataError(id_error_text(feature, config.name, low if low < 0 else high, card))
        return ids
    low, high = tf.reduce_min(ids), tf.reduce_max(ids)  # empty: +max and -max, both pass
    ok = tf.logical_and(low >= 0, high < tf.cast(card, high.dtype))
    bad = tf.where(low < 0, low, high)
    head, tail = id_error_text(feature, config.name, -1, card).split(" -1 ", 1)
    check = tf.debugging.Assert(ok, [head, bad, tail])
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def id_error_text(feature: str, table: str, value: int, cardinality: int) -> str:
    return (f"categorical feature {feature!r}: id {value} {ID_CHECK_MARK} {table!r} of "
            f"cardinality {cardinality} (expected 0 <= id < {cardinality}). Was the data "
            "encoded by another workflow than the one whose schema built the model? Build "
            "the model from the export's schema, or re-export the data with that workflow")


def list_forms(name: str) -> str:
    """Every input form a list feature ``name`` is accepted in, for error messages."""
    return (
        f"A list feature is accepted as: (padded, mask), both [B, L] (the loader's pad=True "
        f"layout) or both [B, F, L] (lists of lists); padded ids [B, L] or [B, F, L] plus "
        f"the key {name + MASK_SUFFIX!r} (bool or 0/1, the same shape); (values, offsets) "
        f"(offsets [B + 1]); the keys {name + VALUES_SUFFIX!r} and {name + OFFSETS_SUFFIX!r}; "
        "a RaggedTensor [B, None]; or a SparseTensor"
    )


def _masked_ids(
    name: str, ids: tf.Tensor, mask: Any = None
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """(values, row_ids, nrows) of padded ids ``[B, L]``: the entries where ``mask``
    (bool or 0/1, ``[B, L]``) is set. Id 0 is a real id, so there is no default mask."""
    if mask is None:
        raise ValueError(
            f"list feature {name!r} arrived as padded ids of shape {ids.shape} without a "
            f"mask; id 0 is a real id, so padding cannot be told from the ids. "
            f"{list_forms(name)}"
        )
    # Pool only the real ids: padding rows then get no (zero) gradient entries,
    # so a lazy optimizer leaves the padding row alone.
    _, where = _real_positions(name, ids, mask)
    return tf.gather_nd(ids, where), where[:, 0], tf.shape(ids, out_type=tf.int64)[0]


def _real_positions(name: str, ids: tf.Tensor, mask: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """``(mask as bool, indices where it is set)`` of padded ``ids``, the mask
    checked against the ids' shape."""
    mask = tf.cast(mask, tf.bool)
    if not mask.shape.is_compatible_with(ids.shape):
        raise ValueError(
            f"list feature {name!r}: the mask has shape {mask.shape} but the padded ids "
            f"have shape {ids.shape}; they must match"
        )
    return mask, tf.where(mask)


def _padded_pair(name: str, features: Mapping[str, Any]) -> tuple[tf.Tensor, tf.Tensor] | None:
    """``(ids, mask)`` when the feature arrives padded (a tuple whose first element
    has rank 2 or more, or ids plus ``name__mask``), else None."""
    x = features.get(name)
    if isinstance(x, (tuple, list)) and len(x) == 2:
        first = tf.convert_to_tensor(x[0])
        second = tf.convert_to_tensor(x[1])
        if first.shape.rank is not None and first.shape.rank >= 2 and second.shape.rank != 1:
            return first, second
        return None
    if x is not None and not isinstance(x, (tf.RaggedTensor, tf.SparseTensor)) \
            and name + MASK_SUFFIX in features:
        ids = tf.convert_to_tensor(x)
        if ids.shape.rank is not None and ids.shape.rank >= 2:
            return ids, tf.convert_to_tensor(features[name + MASK_SUFFIX])
    return None


def _per_id_padded(table: EmbeddingTable, name: str, ids: tf.Tensor,
                   mask: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """``(vectors [*ids.shape, dim], mask)``: only the real positions are gathered
    (padding gets no gradient rows), zeros elsewhere."""
    mask, where = _real_positions(name, ids, mask)
    rows = table._gather(tf.gather_nd(ids, where), name)
    shape = tf.concat([tf.shape(ids, out_type=tf.int64), [table.dim]], axis=0)
    return tf.scatter_nd(where, rows, shape), mask


def _per_id_ragged(table: EmbeddingTable, values: tf.Tensor, row_ids: tf.Tensor,
                   nrows: tf.Tensor, feature: str | None = None) -> tuple[tf.Tensor, tf.Tensor]:
    """Flat ids of rows ``row_ids`` looked up per id: ``[B, L, dim]`` and ``[B, L]``,
    ``L`` the longest list of the batch."""
    ragged = tf.RaggedTensor.from_value_rowids(table._gather(values, feature),
                                               tf.cast(row_ids, tf.int64),
                                               nrows=tf.cast(nrows, tf.int64), validate=False)
    mask = tf.sequence_mask(ragged.row_lengths())
    return ragged.to_tensor(), mask


def _flat_list_ids(
    name: str, features: Mapping[str, Any]
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor] | None:
    """(values, row_ids, nrows) for a list feature in any accepted layout, or None
    when the feature is a plain dense tensor that the caller must interpret."""
    if name + VALUES_SUFFIX in features and name not in features:
        values = features[name + VALUES_SUFFIX]
        offsets = features.get(name + OFFSETS_SUFFIX)
        if offsets is None:
            raise KeyError(
                f"feature {name!r}: found {name + VALUES_SUFFIX!r} but no "
                f"{name + OFFSETS_SUFFIX!r}; pass both (row splits of length B + 1)"
            )
        x: Any = (values, offsets)
    else:
        x = features[name]
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise ValueError(
                f"feature {name!r}: a tuple input must be (values, offsets) or "
                f"(padded, mask), got {len(x)} items"
            )
        first, second = tf.convert_to_tensor(x[0]), tf.convert_to_tensor(x[1])
        if first.shape.rank == 2 and second.shape.rank != 1:
            # (padded [B, L], mask [B, L]), as the loaders deliver with pad=True
            return _masked_ids(name, first, second)
        values = tf.reshape(first, [-1])
        offsets = _checked_offsets(name, tf.reshape(tf.cast(second, tf.int64), [-1]),
                                   _known_rows(features))
        x = tf.RaggedTensor.from_row_splits(values, offsets, validate=False)
    if isinstance(x, tf.SparseTensor):
        x = tf.RaggedTensor.from_sparse(x)
    if isinstance(x, tf.RaggedTensor):
        if x.ragged_rank != 1:
            raise ValueError(f"feature {name!r}: expected a [B, None] ragged tensor, got {x.shape}")
        return x.flat_values, x.value_rowids(), x.nrows()
    return None


def _known_rows(features: Mapping[str, Any]) -> tuple[Any, str] | None:
    """``(rows, feature)``: the batch's row count (an int when the shape holds it,
    else a scalar tensor) as the first feature whose layout shows it (a single-hot
    or continuous tensor, padded list ids) gives it; None when every feature is a
    ragged list (whose offsets alone cannot say it)."""
    def rank(x: Any) -> int:
        shape = getattr(x, "shape", None)
        if shape is None or isinstance(x, (tf.RaggedTensor, tf.SparseTensor)):
            return 0
        return int(shape.rank or 0) if isinstance(shape, tf.TensorShape) else len(shape)

    for name, x in features.items():
        if name.endswith((VALUES_SUFFIX, OFFSETS_SUFFIX, MASK_SUFFIX)):
            continue
        if isinstance(x, (tuple, list)):  # padded (ids, mask) shows its rows; ragged not
            padded = len(x) == 2 and rank(x[0]) >= 2 and rank(x[1]) != 1
            x = x[0] if padded else None
        if rank(x) == 0:
            continue
        rows = x.shape[0]
        return (int(rows) if rows is not None else tf.shape(x, out_type=tf.int64)[0]), name
    return None


def _checked_offsets(name: str, offsets: tf.Tensor, rows: tuple[Any, str] | None) -> tf.Tensor:
    """``offsets`` (1-D), checked to hold ``B + 1`` entries when the batch tells ``B``
    (:func:`_known_rows`): offsets of ``B`` entries would read as ``B - 1`` rows and
    fail later, far from here. Refused at once when the shapes are known; inside a
    ``tf.function`` of open shapes, an assert (dropped by XLA, as the id check)."""
    if rows is None:
        return offsets
    b, shown_by = rows
    n = offsets.shape[0]
    if isinstance(b, int) and n is not None:
        if n != b + 1:
            raise ValueError(
                f"list feature {name!r}: offsets has {n} entries, but the batch has {b} rows "
                f"(feature {shown_by!r}); {_OFFSETS_RULE.replace('B + 1', f'B + 1 = {b + 1}')}")
        return offsets
    check = tf.debugging.assert_equal(
        tf.shape(offsets, out_type=tf.int64)[0], tf.cast(b, tf.int64) + 1,
        message=f"list feature {name!r}: the offsets' entries (x) differ from the batch's rows "
        f"plus one (y; rows of feature {shown_by!r}); {_OFFSETS_RULE}")
    with tf.control_dependencies([check]):
        return tf.identity(offsets)


_OFFSETS_RULE = ("ragged offsets need B + 1 entries (arrow style: first 0, then the end of each "
                 "row's values)")


def _fresh_slot_rows(optimizer: Any, var: Any, rows: int) -> dict[str, Any]:
    """``{slot name: initial value}`` of the slots ``optimizer`` keeps for ``var``
    shaped like it, for ``rows`` rows: what a fresh copy of the optimizer (same
    config) builds for a variable of that many rows (Ftrl's and Adagrad's
    ``initial_accumulator_value``, zeros for most)."""
    stand_in = keras.Variable(tf.zeros((rows, int(var.shape[1])), var.dtype), name="rows")
    fresh = type(optimizer).from_config(optimizer.get_config())
    fresh.build([stand_in])
    # Keras names a slot "<variable path, / as _>_<slot>" (add_variable_from_reference)
    prefix, real = stand_in.path.replace("/", "_") + "_", var.path.replace("/", "_") + "_"
    return {real + v.name[len(prefix):]: v.value for v in fresh.variables
            if v.name.startswith(prefix) and tuple(v.shape) == tuple(stand_in.shape)}


@keras.saving.register_keras_serializable(package="tabstream")
class EmbeddingTables(keras.layers.Layer):
    """Embedding tables for several features: ``features -> {feature: [B, dim]}``.

    ``configs`` is a list of :class:`TableConfig` (one table may serve several
    features). ``list_features`` names the multi-hot features; by default those
    each config marks as lists (:meth:`TableConfig.is_list_feature`).

    >>> configs = [TableConfig("C1", 100, 8, ("C1",)), TableConfig("tags", 50, 8, ("tags",), is_list=True)]
    >>> out = EmbeddingTables(configs)({"C1": tf.constant([3, 7]),
    ...                                 "tags": (tf.constant([[4, 9, 0], [2, 0, 0]]),
    ...                                          tf.constant([[1, 1, 0], [1, 0, 0]]))})
    >>> {k: v.shape for k, v in out.items()}     # tags row 0 = E[4] + E[9], row 1 = E[2]
    {'C1': TensorShape([2, 8]), 'tags': TensorShape([2, 8])}
    """

    def __init__(
        self,
        configs: Sequence[TableConfig],
        list_features: Iterable[str] | None = None,
        initializer: Any = None,
        seed: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        configs = [_config_from_dict(c) if isinstance(c, Mapping) else c for c in configs]
        if not configs:
            raise ValueError("EmbeddingTables needs at least one TableConfig")
        names = [c.name for c in configs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate table names {dupes}; each table needs a unique name")
        self.configs = tuple(configs)
        self._feature_to_table: dict[str, str] = {}
        for c in configs:
            for f in c.feature_names:
                if f in self._feature_to_table:
                    raise ValueError(
                        f"feature {f!r} is looked up by two tables: "
                        f"{self._feature_to_table[f]!r} and {c.name!r}"
                    )
                self._feature_to_table[f] = c.name
        if list_features is None:
            list_features = [f for c in configs for f in c.feature_names if c.is_list_feature(f)]
        self.list_features = frozenset(list_features)
        unknown = sorted(self.list_features - set(self._feature_to_table))
        if unknown:
            raise ValueError(f"list_features {unknown} have no table; known: {sorted(self._feature_to_table)}")
        self.initializer = initializer
        self.seed = seed
        self._table_names: list[str] = []
        for i, c in enumerate(configs):
            table = EmbeddingTable(
                c, initializer=initializer, seed=None if seed is None else seed + i
            )
            # One attribute per table: tf.train.Checkpoint does not follow Keras 3's
            # tracked dicts/lists of layers, only direct attributes.
            setattr(self, f"table_{i}", table)
            self._table_names.append(f"table_{i}")

    def build(self, input_shape: Any = None) -> None:
        # The tables are created with their variables; nothing depends on input shapes.
        self.built = True

    @property
    def tables(self) -> dict[str, EmbeddingTable]:
        """Table name -> :class:`EmbeddingTable`."""
        out = {}
        for attr in self._table_names:
            t = getattr(self, attr)
            out[t.config.name] = t
        return out

    @property
    def feature_names(self) -> list[str]:
        return list(self._feature_to_table)

    def table_for(self, feature: str) -> EmbeddingTable:
        try:
            return self.tables[self._feature_to_table[feature]]
        except KeyError:
            raise KeyError(
                f"no embedding table for feature {feature!r}; known: {self.feature_names}"
            ) from None

    def reset_rows(self, table: str, ids: Any, optimizer: Any = None) -> None:
        """Rows ``ids`` of ``table`` back to fresh values of the table's initializer,
        and those rows of every optimizer slot shaped like the table (Adam's moments,
        LazyAdam's, Adagrad's and Ftrl's accumulators, RMSprop's averages...) to the
        values a fresh copy of the optimizer starts from: for ids a vocabulary delta
        recycled. ``optimizer``: a Keras optimizer built with the table's variable
        (slots of other variables are left alone; the step count stays)."""
        import numpy as np

        tables = self.tables
        if table not in tables:
            raise KeyError(f"no embedding table {table!r}; the tables are {sorted(tables)}")
        layer = tables[table]
        var = layer.embeddings
        arr = np.asarray(ids)
        if arr.size and arr.dtype.kind not in "iu":
            raise TypeError(f"table {table!r}: ids must be integers, got dtype {arr.dtype}")
        arr = np.unique(arr.reshape(-1).astype(np.int64))
        if not len(arr):
            return
        rows = int(var.shape[0])
        if arr[0] < 0 or arr[-1] >= rows:
            bad = int(arr[0] if arr[0] < 0 else arr[-1])
            raise ValueError(f"table {table!r}: id {bad} is out of range; the table has {rows} rows "
                             f"(ids 0..{rows - 1}); a living vocabulary with max_size=N needs tables "
                             "of N rows")
        index = tf.constant(arr[:, None])
        fresh = layer.initializer(shape=(len(arr), int(var.shape[1])), dtype=var.dtype)
        var.value.scatter_nd_update(index, tf.cast(fresh, var.dtype))
        if optimizer is None:
            return
        # a MultiOptimizer's slots belong to its entries, each with its own initial values
        for owner in getattr(optimizer, "optimizers", None) or [optimizer]:
            slots = [v for v in owner.variables if tuple(v.shape) == tuple(var.shape)]
            if not slots:
                continue
            initial = _fresh_slot_rows(owner, var, len(arr))
            if getattr(owner, "use_ema", False):  # a fresh row's average is its weight
                initial[var.path.replace("/", "_") + "_average"] = tf.gather(var.value, arr)
            for slot in slots:
                if slot.name in initial:
                    slot.value.scatter_nd_update(index, tf.cast(initial[slot.name], slot.dtype))

    def apply_vocabulary_delta(self, delta: Any, optimizer: Any = None) -> dict[str, int]:
        """:meth:`reset_rows` for every id a vocabulary delta recycled (``delta``: a
        ``VocabularyDelta``, its folder, or ``{table or column: ids}``). Returns
        ``{table: rows reset}``."""
        from tabstream.train.cache_store import vocabulary_resets

        resets = vocabulary_resets(delta, {c.name: c.feature_names for c in self.configs})
        for table, ids in resets.items():
            self.reset_rows(table, ids, optimizer=optimizer)
        return {table: len(ids) for table, ids in resets.items()}

    @_no_autograph
    def lookup(self, name: str, features: Mapping[str, Any]) -> Any:
        """Embedding ``[B, dim]`` of one feature (pooled when multi-hot), or
        ``(vectors, mask)`` for a list feature of a ``combiner=None`` table."""
        table = self.table_for(name)
        per_id = table.config.combiner is None
        x = features.get(name)
        if isinstance(x, (tuple, list)) and len(x) == 3:
            raise ValueError(
                f"feature {name!r}: a tuple input must be (values, offsets) or (padded, "
                "mask), got 3 items; for a list of lists (values, outer_offsets, "
                "inner_offsets), load it padded instead: pad={"
                f"{name!r}: (F, L)}} (or fixed-size list types) to get (ids, mask) of "
                "shape [B, F, L]"
            )
        padded = _padded_pair(name, features)
        if padded is not None:
            ids, mask = padded
            if per_id:
                return _per_id_padded(table, name, ids, mask)
            if ids.shape.rank is not None and ids.shape.rank > 2:
                # lists of lists: pool each inner list -> [B, F, dim]
                lead = tf.shape(ids)[:-1]
                width = tf.shape(ids)[-1]
                flat = _masked_ids(name, tf.reshape(ids, [-1, width]),
                                   tf.reshape(tf.cast(mask, tf.bool), [-1, width]))
                pooled = table.pool(*flat, feature=name)
                return tf.reshape(pooled, tf.concat([lead, [table.dim]], axis=0))
        flat = _flat_list_ids(name, features)
        if flat is not None and per_id:
            return _per_id_ragged(table, *flat, feature=name)
        if flat is not None:
            return table.pool(*flat, feature=name)
        ids = tf.convert_to_tensor(features[name])
        if name not in self.list_features:
            if ids.shape.rank is not None and ids.shape.rank > 1 and ids.shape[-1] != 1:
                raise ValueError(
                    f"feature {name!r} is not a list feature but got ids of shape {ids.shape}; "
                    "mark the column is_list=True in the schema (or pass list_features=)"
                )
            return table(ids, feature=name)
        if ids.shape.rank != 2:
            raise ValueError(
                f"list feature {name!r} arrived as a dense tensor of shape {ids.shape} "
                f"without a mask. {list_forms(name)}"
            )
        return table.pool(*_masked_ids(name, ids, features.get(name + MASK_SUFFIX)), feature=name)

    @_no_autograph
    def call(self, features: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        missing = [
            f
            for f in self._feature_to_table
            if f not in features and f + VALUES_SUFFIX not in features
        ]
        if missing:
            raise SchemaError(  # a KeyError, as torch's EmbeddingTables raises
                f"EmbeddingTables: features {missing} are missing from the input; "
                f"got {sorted(features)}"
            )
        served: dict[str, int] = {}
        for f in self._feature_to_table:
            served[self._feature_to_table[f]] = served.get(self._feature_to_table[f], 0) + 1
        shared = [self.tables[t] for t, n in served.items() if n > 1]
        # A table several features share is read once for all of them, so that the
        # gradients of their lookups, added up, come out with one row per id.
        for table in shared:
            object.__setattr__(table, "_one_read",
                               _rows_summed_per_id(table.embeddings.value.read_value()))
        try:
            return {f: self.lookup(f, features) for f in self._feature_to_table}
        finally:
            for table in shared:
                object.__setattr__(table, "_one_read", None)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config.update(
            {
                "configs": [_config_to_dict(c) for c in self.configs],
                "list_features": sorted(self.list_features),
                "initializer": None
                if self.initializer is None
                else keras.initializers.serialize(keras.initializers.get(self.initializer)),
                "seed": self.seed,
            }
        )
        return config


def sum_duplicate_rows(grad: tf.IndexedSlices) -> tf.IndexedSlices:
    """One row per distinct index, holding the sum of that index's rows: what the
    dense gradient holds, as an ``IndexedSlices`` an optimizer may update row by row.

    >>> g = tf.IndexedSlices(tf.constant([[1.0], [2.0], [4.0]]), tf.constant([3, 0, 3]))
    >>> s = sum_duplicate_rows(g)
    >>> s.indices.numpy().tolist(), s.values.numpy().ravel().tolist()
    ([3, 0], [5.0, 2.0])
    """
    rows, position = tf.unique(grad.indices)
    values = tf.math.unsorted_segment_sum(grad.values, position, tf.shape(rows)[0])
    return tf.IndexedSlices(values, rows, grad.dense_shape)


@tf.custom_gradient
def _rows_summed_per_id(value: tf.Tensor) -> Any:
    """``value`` unchanged; its gradient, when an ``IndexedSlices`` (gathers of
    several features added up), with one row per id (:func:`sum_duplicate_rows`)."""
    def grad(upstream: Any) -> Any:
        return sum_duplicate_rows(upstream) if isinstance(upstream, tf.IndexedSlices) else upstream

    return tf.identity(value), grad


def embedding_tables_from_schema(
    schema: Schema,
    dim: int | dict[str, int] | None = None,
    infer_sizes: bool = True,
    multiplier: float = 2.0,
    combiner: str = "sum",
    initializer: Any = None,
    seed: int | None = None,
    name: str = "embedding_tables",
) -> EmbeddingTables:
    """An :class:`EmbeddingTables` layer with one table per categorical (non-target)
    column of ``schema``, or per shared vocabulary; sizes as in
    :func:`tabstream.train.table_configs_from_schema` (inferred dim =
    ``floor(cardinality ** 0.25 * multiplier)`` rounded up to a multiple of 8).
    """
    spec = feature_spec(schema, dim=dim, infer_sizes=infer_sizes, multiplier=multiplier,
                        combiner=combiner)
    if not spec.tables:
        raise ValueError(
            f"schema has no categorical feature columns to embed; columns: {schema.column_names}"
        )
    return EmbeddingTables(
        list(spec.tables), list_features=list(spec.lists), initializer=initializer, seed=seed,
        name=name,
    )


def _as_table_list(tables: Any) -> list[Any]:
    if isinstance(tables, EmbeddingTables):
        return list(tables.tables.values())
    if isinstance(tables, Mapping):
        return list(tables.values())
    if isinstance(tables, (EmbeddingTable, TableConfig)):
        return [tables]
    return list(tables)


def split_embeddings_on_size(tables: Any, threshold: int) -> tuple[list[Any], list[Any]]:
    """Split tables into ``(large, small)``: large ones have ``cardinality >= threshold``.

    ``tables`` is an :class:`EmbeddingTables` layer or an iterable (or dict) of
    :class:`EmbeddingTable` layers or :class:`TableConfig`; the two lists hold the
    same kind of object, in their original order. Typical use::

        large, small = split_embeddings_on_size(model.embeddings, threshold=100_000)
        optimizer = MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(), large)])
    """
    check_threshold(threshold)
    large: list[Any] = []
    small: list[Any] = []
    for t in _as_table_list(tables):
        if isinstance(t, EmbeddingTable):
            cardinality = t.config.cardinality
        elif isinstance(t, TableConfig):
            cardinality = t.cardinality
        else:
            raise TypeError(
                "split_embeddings_on_size takes EmbeddingTables, EmbeddingTable layers or "
                f"TableConfig objects, got {type(t).__name__}"
            )
        (large if cardinality >= threshold else small).append(t)
    return large, small


def with_dim(configs: Iterable[TableConfig], dim: int, prefix: str = "") -> list[TableConfig]:
    """Copies of ``configs`` with every table's dimension set to ``dim`` (and names
    prefixed), e.g. the 1-wide tables of a wide (linear) model."""
    return [replace(c, dim=dim, name=prefix + c.name) for c in configs]

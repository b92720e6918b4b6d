"""Recommender models built from a schema, as Keras 3 models.

Input is ``features: dict[str, Tensor]`` (int ids for categorical columns, floats for
continuous ones; list columns as in :mod:`.embeddings`). The ranking models
(:class:`DLRM`, :class:`DCN`, :class:`WideAndDeep`) return **logits** ``[B]`` (as the
torch models do):
compile them with ``keras.losses.BinaryCrossentropy(from_logits=True)`` and
:func:`~tabstream.train.tensorflow.binary_classification_metrics` (AUC and log-loss
with ``from_logits=True``); ``keras.ops.sigmoid(model(x))`` gives probabilities.

>>> import keras
>>> import tensorflow as tf
>>> from tabstream.core.schema import ColumnSchema, Schema, Tags
>>> def categorical(name, n):
...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
...                         properties={"domain": {"min": 0, "max": n - 1}})
>>> schema = Schema([categorical("C1", 200_000), categorical("C2", 50),
...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
...                  ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])
>>> features = {"C1": tf.constant([3, 199_999, 3, 42], tf.int64),
...             "C2": tf.constant([0, 7, 49, 7], tf.int64), "I1": tf.constant([0.5, -1.0, 2.0, 0.0])}
>>> labels = tf.constant([1.0, 0.0, 1.0, 0.0])
>>> train = tf.data.Dataset.from_tensors((features, labels)).repeat(4)   # or the tabstream loader
>>> keras.utils.set_random_seed(0)
>>> from tabstream.train.tensorflow import LazyAdam, binary_classification_metrics
>>> model = DLRM(schema, embedding_dim=16)
>>> model.compile(optimizer=LazyAdam(1e-3),
...               loss=keras.losses.BinaryCrossentropy(from_logits=True),
...               metrics=binary_classification_metrics())
>>> history = model.fit(train, validation_data=train, epochs=1, verbose=0, shuffle=False)
>>> sorted(history.history)
['auc', 'logloss', 'loss', 'val_auc', 'val_logloss', 'val_loss']
>>> keras.ops.sigmoid(model(features)).shape       # click probabilities
TensorShape([4])

:class:`TwoTower` returns ``{"query": [B, d], "candidate": [B, d]}`` and trains with
in-batch negatives; evaluate it with :meth:`TwoTower.recall_at_k`.

Every model also takes ``embeddings=``: ready-made tables serving the schema's
categorical features, such as a :class:`~tabstream.train.tensorflow.CachedEmbeddings`
for tables larger than memory (trained by :func:`~tabstream.train.tensorflow.fit`;
``TwoTower`` looks up each tower's features through ``embeddings.subset(names)``;
``WideAndDeep`` serves its wide part from the same server, whose tables
:meth:`WideAndDeep.table_configs` lists).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema, Tags
from tabstream.train.spec import check_positive, feature_spec
from tabstream.train.tables import TableConfig, wide_table_configs
from tabstream.train.tensorflow._autograph import no_autograph as _no_autograph
from tabstream.train.tensorflow.blocks import (
    MLP,
    ContinuousFeatures,
    CrossNetV2,
    DotInteraction,
    kernel_initializer,
)
from tabstream.train.tensorflow.embeddings import (
    EmbeddingTables,
    embedding_tables_from_schema,
    with_dim,
)

__all__ = ["DCN", "DLRM", "TwoTower", "WideAndDeep"]


def _as_schema(schema: Schema | Mapping[str, Any]) -> Schema:
    if isinstance(schema, Schema):
        return schema
    if isinstance(schema, Mapping):
        return Schema.from_dict(schema)
    raise TypeError(f"schema must be a tabstream Schema, got {type(schema).__name__}")


def _features(schema: Schema) -> tuple[Schema, list[str]]:
    """(categorical feature schema, continuous feature names), targets excluded; the
    shared rules of :func:`tabstream.train.spec.feature_spec`."""
    spec = feature_spec(schema)
    return schema.select_by_name(list(spec.categorical)), list(spec.continuous)


class _SchemaModel(keras.Model):
    """Shared plumbing: the schema, categorical embeddings and continuous inputs."""

    def __init__(self, schema: Schema | Mapping[str, Any], seed: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        self.schema = _as_schema(schema)
        self.seed = seed
        self._cat_schema, cont_names = _features(self.schema)
        self.continuous = ContinuousFeatures(cont_names)

    def _seed(self, offset: int) -> int | None:
        return None if self.seed is None else self.seed + 1000 * offset

    def _given_embeddings(self, embeddings: Any, schema: Schema, who: str) -> Any:
        """``embeddings=`` checked: it serves every categorical feature of ``schema``."""
        served = set(getattr(embeddings, "feature_names", ()))
        wanted = [f for t in feature_spec(schema).tables for f in t.feature_names]
        missing = [f for f in wanted if f not in served]
        if not callable(embeddings) or missing:
            raise SchemaError(
                f"{who}: embeddings= must serve the schema's categorical features {wanted}; "
                f"{type(embeddings).__name__} serves {sorted(served)}"
            )
        self._embeddings_given = embeddings  # saved in get_config: a clone rebuilds the same kind
        return embeddings

    def _resolve_auto_jit_compile(self) -> bool:
        """What Keras' ``compile(jit_compile="auto")`` (the default, and an
        uncompiled model's ``predict``) resolves to: ``False`` for a model with
        categorical features. Keras would turn XLA on whenever a GPU is visible, and
        XLA drops the tables' id check (a ``tf.debugging.Assert``), so an id outside
        its table would train silently (on GPU ``tf.gather`` reads zeros for it). An
        explicit ``compile(jit_compile=True)`` is still taken: faster, without the
        check (see docs/training.md)."""
        if len(self._cat_schema):
            return False
        return bool(super()._resolve_auto_jit_compile())

    def fit_replica_step(self, features: Any, labels: Any, loss_sum: Any, optimizer: Any) -> Any:
        """``tabstream.train.tensorflow.fit``'s step: tables served by a
        ``CachedEmbeddings`` send their gradients to its parameter server."""
        from tabstream.train.tensorflow.cache import replica_step

        return replica_step(self, optimizer, loss_sum, features, labels)

    def _embedding_list(self, tables: EmbeddingTables, features: Mapping[str, Any]) -> list[tf.Tensor]:
        looked_up = tables(features)
        return [looked_up[name] for name in tables.feature_names]

    def example_batch(self, batch_size: int = 2) -> dict[str, Any]:
        """Zeros shaped like this model's inputs (list columns as ``(padded, mask)``,
        both ``[B, 1]``, every position real)."""
        batch = {}
        targets = {c.name for c in self.schema.select_by_tag(Tags.TARGET)}
        for col in self.schema:
            if col.name in targets:
                continue
            if Tags.CATEGORICAL in col.tags:
                if col.is_list:
                    batch[col.name] = (tf.zeros([batch_size, 1], tf.int64),
                                       tf.ones([batch_size, 1], tf.bool))
                else:
                    batch[col.name] = tf.zeros([batch_size], tf.int64)
            elif Tags.CONTINUOUS in col.tags:
                batch[col.name] = tf.zeros([batch_size], tf.float32)
        return batch

    def get_config(self) -> dict[str, Any]:
        config = {"name": self.name, "schema": self.schema.to_dict(), "seed": self.seed}
        given = getattr(self, "_embeddings_given", None)
        if given is not None:
            if type(given).get_config is keras.layers.Layer.get_config or not hasattr(given, "get_config"):
                raise TypeError(
                    f"{type(self).__name__}.get_config: the embeddings= given, a "
                    f"{type(given).__name__}, cannot be saved with the model (it has no config of "
                    "its own, e.g. tables backed by a ParameterServer); save its weights with "
                    "the store's own checkpoint and rebuild the model with the same embeddings=")
            config["embeddings"] = keras.saving.serialize_keras_object(given)
        return config

    # Keras rebuilds a loaded model from this (its default needs one input shape).
    def get_build_config(self) -> dict[str, Any]:
        return {"example_batch_from_schema": True}

    def build_from_config(self, config: dict[str, Any]) -> None:
        self(self.example_batch())

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> _SchemaModel:
        config = dict(config)
        if isinstance(config.get("embeddings"), dict):
            config["embeddings"] = keras.saving.deserialize_keras_object(config["embeddings"])
        return cls(**config)

    def fit(self, x: Any = None, *args: Any, **kwargs: Any) -> Any:
        from tabstream.train.tensorflow.cache import refuse_keras_fit_cached
        from tabstream.train.tensorflow.fit import refuse_keras_fit

        refuse_keras_fit(self)  # under MultiWorkerMirroredStrategy: name the way that works
        refuse_keras_fit_cached(self)  # a cache's rows train in tabstream's fit only
        # remember what the loader feeds: export() serves exactly that
        spec = getattr(x, "element_spec", None)
        if spec is not None:
            self._loader_spec = spec[0] if isinstance(spec, tuple) else spec
        return super().fit(x, *args, **kwargs)

    def input_signature(self) -> dict[str, Any]:
        """This model's inputs as ``tf.TensorSpec``s of any batch size: the element
        spec of the loader it was last ``fit`` on; before any fit, the TF loader's
        default (ids int64 ``[None]``, continuous float32 ``[None]``, lists
        ``(padded, mask)`` ``[None, None]``)."""
        loader_spec = getattr(self, "_loader_spec", None)
        if loader_spec is not None:
            return dict(loader_spec)

        def spec(t: tf.Tensor, name: str) -> tf.TensorSpec:
            return tf.TensorSpec([None] * t.shape.rank, t.dtype, name=name)

        return {name: tuple(spec(t, f"{name}_{i}") for i, t in enumerate(value))
                if isinstance(value, tuple) else spec(value, name)
                for name, value in self.example_batch().items()}

    def export(self, filepath: str, format: str = "tf_saved_model", verbose: bool | None = None,
               input_signature: Any = None, **kwargs: Any) -> Any:
        """``keras.Model.export`` that needs no ``input_signature``: it defaults to
        :meth:`input_signature`, so a model trained on the loader serves its batches."""
        if input_signature is None and format == "tf_saved_model":
            input_signature = [self.input_signature()]
        return super().export(filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)


@keras.saving.register_keras_serializable(package="tabstream")
class DLRM(_SchemaModel):
    """DLRM: continuous features -> bottom MLP -> a ``embedding_dim`` vector; it and
    every categorical embedding (all ``embedding_dim`` wide) -> pairwise dot products
    -> concatenated with the bottom output -> top MLP -> logit ``[B]``.

    ``bottom_mlp`` lists the hidden widths; a final layer of ``embedding_dim`` is added.
    """

    def __init__(
        self,
        schema: Schema | Mapping[str, Any],
        embedding_dim: int = 16,
        bottom_mlp: Sequence[int] = (64,),
        top_mlp: Sequence[int] = (64, 32),
        seed: int | None = None,
        name: str = "dlrm",
        embeddings: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(schema, seed=seed, name=name, **kwargs)
        self.embedding_dim = int(embedding_dim)
        self.bottom_mlp_units = list(bottom_mlp)
        self.top_mlp_units = list(top_mlp)
        num_vectors = len(self._cat_schema) + (1 if self.continuous else 0)
        if num_vectors < 2:
            raise ValueError(
                "DLRM needs at least two interacting vectors (categorical columns plus one for "
                f"all continuous columns); schema has {self.schema.column_names}"
            )
        if embeddings is not None:
            self.embeddings = self._given_embeddings(embeddings, self._cat_schema, "DLRM")
            other = {f: d for f, d in getattr(embeddings, "output_dims", {}).items()
                     if d != self.embedding_dim}
            if other:
                raise ValueError(f"DLRM: every embedding must be embedding_dim="
                                 f"{self.embedding_dim} wide for the dot interaction; the given "
                                 f"embeddings have {other}")
        else:
            self.embeddings = embedding_tables_from_schema(
                self._cat_schema, dim=self.embedding_dim, seed=self._seed(1)
            )
        self.bottom_mlp = (
            MLP([*self.bottom_mlp_units, self.embedding_dim], seed=self._seed(2), name="bottom_mlp")
            if self.continuous
            else None
        )
        self.interaction = DotInteraction(name="interaction")
        self.top_mlp = MLP(self.top_mlp_units, seed=self._seed(3), name="top_mlp")
        self.head = keras.layers.Dense(1, kernel_initializer=kernel_initializer(self._seed(4)), name="head")

    @_no_autograph
    def call(self, features: Mapping[str, Any]) -> tf.Tensor:
        vectors = self._embedding_list(self.embeddings, features)
        parts = []
        if self.bottom_mlp is not None:
            dense = self.bottom_mlp(self.continuous(features))
            vectors = [dense, *vectors]
            parts.append(dense)
        parts.append(self.interaction(tf.stack(vectors, axis=1)))
        return tf.squeeze(self.head(self.top_mlp(tf.concat(parts, axis=1))), axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "embedding_dim": self.embedding_dim,
            "bottom_mlp": self.bottom_mlp_units,
            "top_mlp": self.top_mlp_units,
        }


@keras.saving.register_keras_serializable(package="tabstream")
class DCN(_SchemaModel):
    """DCN-v2: ``x0`` = concatenated embeddings and continuous features -> cross
    network (``cross_layers`` layers, optionally ``low_rank``) and a deep MLP,
    ``structure="stacked"`` (cross then deep) or ``"parallel"`` (both on ``x0``,
    concatenated) -> logit ``[B]``. ``embedding_dim=None`` infers each table's size.
    """

    def __init__(
        self,
        schema: Schema | Mapping[str, Any],
        embedding_dim: int | None = None,
        cross_layers: int = 3,
        deep: Sequence[int] = (64, 32),
        structure: str = "stacked",
        low_rank: int | None = None,
        seed: int | None = None,
        name: str = "dcn",
        embeddings: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(schema, seed=seed, name=name, **kwargs)
        if structure not in ("stacked", "parallel"):
            raise ValueError(f"DCN structure must be 'stacked' or 'parallel', got {structure!r}")
        self.embedding_dim = embedding_dim
        self.cross_layers = int(cross_layers)
        self.deep_units = list(deep)
        self.structure = structure
        self.low_rank = low_rank
        if embeddings is not None:
            self.embeddings = self._given_embeddings(embeddings, self._cat_schema, "DCN")
        else:
            self.embeddings = (
                embedding_tables_from_schema(self._cat_schema, dim=embedding_dim, seed=self._seed(1))
                if len(self._cat_schema)
                else None
            )
        if self.embeddings is None and not self.continuous:
            raise ValueError(f"DCN: schema has no feature columns: {self.schema.column_names}")
        self.cross = CrossNetV2(self.cross_layers, low_rank=low_rank, seed=self._seed(2), name="cross")
        self.deep = MLP(self.deep_units, seed=self._seed(3), name="deep")
        self.head = keras.layers.Dense(1, kernel_initializer=kernel_initializer(self._seed(4)), name="head")

    @_no_autograph
    def call(self, features: Mapping[str, Any]) -> tf.Tensor:
        parts = self._embedding_list(self.embeddings, features) if self.embeddings else []
        if self.continuous:
            parts.append(self.continuous(features))
        x0 = tf.concat(parts, axis=1)
        crossed = self.cross(x0)
        if self.structure == "stacked":
            out = self.deep(crossed)
        else:
            out = tf.concat([crossed, self.deep(x0)], axis=1)
        return tf.squeeze(self.head(out), axis=1)

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "embedding_dim": self.embedding_dim,
            "cross_layers": self.cross_layers,
            "deep": self.deep_units,
            "structure": self.structure,
            "low_rank": self.low_rank,
        }


@keras.saving.register_keras_serializable(package="tabstream")
class WideAndDeep(_SchemaModel):
    """Wide & Deep: logit = wide + deep. Wide is a linear model: one weight per
    categorical id (1-wide tables named ``wide_<table>``, zero-initialized, sparse
    gradients) plus a linear layer on the continuous features. Deep is embeddings and
    continuous features -> MLP -> 1. Output: logit ``[B]``.
    """

    def __init__(
        self,
        schema: Schema | Mapping[str, Any],
        embedding_dim: int | None = None,
        deep: Sequence[int] = (64, 32),
        seed: int | None = None,
        name: str = "wide_and_deep",
        embeddings: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(schema, seed=seed, name=name, **kwargs)
        if len(self._cat_schema) == 0:
            raise ValueError(
                f"WideAndDeep needs categorical columns; schema has {self.schema.column_names}"
            )
        self.embedding_dim = embedding_dim
        self.deep_units = list(deep)
        if embeddings is not None:
            self.embeddings = self._given_embeddings(embeddings, self._cat_schema, "WideAndDeep")
            self.wide_tables = _wide_from_server(embeddings, self._cat_schema)
        else:
            self.embeddings = embedding_tables_from_schema(
                self._cat_schema, dim=embedding_dim, seed=self._seed(1)
            )
            self.wide_tables = EmbeddingTables(
                with_dim(self.embeddings.configs, 1, prefix="wide_"),
                list_features=self.embeddings.list_features,
                initializer="zeros",
                name="wide_tables",
            )
        self.wide_continuous = keras.layers.Dense(
            1, use_bias=False, kernel_initializer="zeros", name="wide_continuous"
        )
        self.deep = MLP(self.deep_units, seed=self._seed(2), name="deep")
        self.head = keras.layers.Dense(1, kernel_initializer=kernel_initializer(self._seed(3)), name="head")

    @_no_autograph
    def call(self, features: Mapping[str, Any]) -> tf.Tensor:
        wide = tf.add_n(self._embedding_list(self.wide_tables, features))
        parts = self._embedding_list(self.embeddings, features)
        if self.continuous:
            dense = self.continuous(features)
            wide = wide + self.wide_continuous(dense)
            parts.append(dense)
        return tf.squeeze(wide + self.head(self.deep(tf.concat(parts, axis=1))), axis=1)

    @staticmethod
    def table_configs(schema: Schema | Mapping[str, Any], embedding_dim: int | None = None,
                      combiner: str = "sum") -> list[TableConfig]:
        """Every embedding table of this model over ``schema``, for a parameter
        server: the deep tables, then the 1-wide ``<table>_wide`` ones (the names
        torch's ``WideAndDeep.table_configs`` gives: one server serves both)."""
        cats, _ = _features(_as_schema(schema))
        deep = feature_spec(cats, dim=embedding_dim, combiner=combiner)
        return [*deep.tables, *wide_table_configs(cats, combiner=combiner)]

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "embedding_dim": self.embedding_dim, "deep": self.deep_units}


def _wide_from_server(embeddings: Any, cat_schema: Schema) -> Any:
    """The wide part's 1-wide tables from the deep part's parameter server."""
    ps = getattr(embeddings, "ps", None)
    if ps is None:
        raise TypeError(
            "WideAndDeep: embeddings= must be a CachedEmbeddings (its wide tables come from "
            f"the same parameter server); got {type(embeddings).__name__}"
        )
    from tabstream.train.tensorflow.cache import CachedEmbeddings

    wanted = [cfg.name for cfg in wide_table_configs(cat_schema)]
    missing = [name for name in wanted if name not in {cfg.name for cfg in ps.configs}]
    if missing:
        raise SchemaError(
            f"WideAndDeep: embeddings= serves the deep tables from parameter server {ps.path}, "
            f"which has no wide tables {missing}: the wide part would train in memory, outside "
            "the server and its export_delta. Create the server with "
            "WideAndDeep.table_configs(schema, embedding_dim) (deep and wide tables)"
        )
    return CachedEmbeddings(ps, embeddings.cache_rows, tables=wanted, name="wide_tables")


@keras.saving.register_keras_serializable(package="tabstream")
class TwoTower(_SchemaModel):
    """Two-tower retrieval: USER-tagged columns -> query tower, ITEM-tagged columns ->
    candidate tower (embeddings + continuous -> MLP ``tower``, L2-normalized).

    ``model(features)`` returns ``{"query": [B, d], "candidate": [B, d]}``. Training
    uses in-batch negatives: for positive row ``i`` the logits are ``<q_i, c_j> /
    temperature - log Q(item_j)`` over the batch's positive rows ``j``, the target is
    ``j = i`` (other rows with the same item id are masked out), and the softmax
    cross-entropy of a row is weighted by its label. Rows with label 0 take no part
    (all rows are positives without labels). ``Q(item)`` is the item's share of the
    positives seen in training so far (``item_counts``); the log-Q correction makes the
    scores estimate the softmax over all items, popularity included, rather than
    penalizing popular items for being frequent negatives (``logq_correction=False``
    turns it off). Compile without a loss: ``model.compile(optimizer=...)``.
    """

    def __init__(
        self,
        schema: Schema | Mapping[str, Any],
        tower: Sequence[int] = (64, 32),
        embedding_dim: int | None = None,
        temperature: float = 0.1,
        normalize: bool = True,
        seed: int | None = None,
        name: str = "two_tower",
        logq_correction: bool = True,
        embeddings: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(schema, seed=seed, name=name, **kwargs)
        self.tower_units = list(tower)
        self.embedding_dim = embedding_dim
        self.temperature = check_positive(temperature, "TwoTower: temperature")
        self.normalize = normalize
        targets = {c.name for c in self.schema.select_by_tag(Tags.TARGET)}
        user = self.schema.select_by_tag(Tags.USER).without(targets)
        item = self.schema.select_by_tag(Tags.ITEM).without(targets)
        for side, part in (("USER", user), ("ITEM", item)):
            if len(part.select_by_tag(Tags.CATEGORICAL)) == 0:
                raise ValueError(
                    f"TwoTower needs categorical columns tagged {side}; "
                    f"schema has {self.schema.column_names}"
                )
        item_ids = item.select_by_tag(Tags.ID).select_by_tag(Tags.CATEGORICAL)
        if len(item_ids) != 1:
            raise ValueError(
                "TwoTower needs exactly one categorical column tagged ITEM_ID (to mask "
                f"duplicate in-batch items and to rank candidates); found {item_ids.column_names}"
            )
        self.item_id = item_ids.column_names[0]
        self.logq_correction = bool(logq_correction)
        # Rows seen per item id in training: how often each item is drawn as an
        # in-batch negative, for the log-Q correction (saved with the weights).
        self.item_counts = self.add_weight(
            shape=(int(item_ids[self.item_id].cardinality),), initializer="zeros",
            trainable=False, name="item_counts", aggregation="only_first_replica",
        )
        user_cats, user_conts = _features(user)
        item_cats, item_conts = _features(item)
        self.user_continuous = ContinuousFeatures(user_conts)
        self.item_continuous = ContinuousFeatures(item_conts)
        self.item_feature_names = item.column_names
        if embeddings is not None:
            self.embeddings = self._given_embeddings(embeddings, self._cat_schema, "TwoTower")
            self.user_embeddings, self.item_embeddings = _tower_views(embeddings, user_cats,
                                                                      item_cats)
        else:
            self.user_embeddings = embedding_tables_from_schema(
                user_cats, dim=embedding_dim, seed=self._seed(1), name="user_embeddings"
            )
            self.item_embeddings = embedding_tables_from_schema(
                item_cats, dim=embedding_dim, seed=self._seed(2), name="item_embeddings"
            )
        self.query_tower = MLP(
            self.tower_units, activate_last=False, seed=self._seed(3), name="query_tower"
        )
        self.candidate_tower = MLP(
            self.tower_units, activate_last=False, seed=self._seed(4), name="candidate_tower"
        )

    def _encode(self, tables: EmbeddingTables, continuous: ContinuousFeatures, tower: MLP,
                features: Mapping[str, Any]) -> tf.Tensor:
        parts = self._embedding_list(tables, features)
        if continuous:
            parts.append(continuous(features))
        out = tower(tf.concat(parts, axis=1))
        return tf.math.l2_normalize(out, axis=1) if self.normalize else out

    @_no_autograph
    def query_embeddings(self, features: Mapping[str, Any]) -> tf.Tensor:
        """``[B, d]`` user (query) vectors from the USER columns of ``features``."""
        return self._encode(self.user_embeddings, self.user_continuous, self.query_tower, features)

    @_no_autograph
    def candidate_embeddings(self, features: Mapping[str, Any]) -> tf.Tensor:
        """``[B, d]`` item (candidate) vectors from the ITEM columns of ``features``."""
        return self._encode(
            self.item_embeddings, self.item_continuous, self.candidate_tower, features
        )

    @_no_autograph
    def call(self, features: Mapping[str, Any]) -> dict[str, tf.Tensor]:
        return {
            "query": self.query_embeddings(features),
            "candidate": self.candidate_embeddings(features),
        }

    @_no_autograph
    def row_logits(self, features: Mapping[str, Any]) -> tf.Tensor:
        """``[B]``: each row's own (user, item) score ``<q_i, c_i> / temperature``,
        what torch's ``TwoTower(features)`` returns; tabstream's ``fit`` and
        ``evaluate`` score validation rows with it (``val_auc``, ``val_log_loss``)."""
        out = self(features, training=False)
        return tf.reduce_sum(out["query"] * out["candidate"], axis=1) / self.temperature

    @_no_autograph
    def compute_loss(
        self,
        x: Any = None,
        y: Any = None,
        y_pred: Any = None,
        sample_weight: Any = None,
        training: bool = True,
    ) -> tf.Tensor:
        if y_pred is None:
            y_pred = self(x, training=training)
        query, candidate = y_pred["query"], y_pred["candidate"]
        item_id = None if x is None else tf.reshape(tf.convert_to_tensor(x[self.item_id]), [-1])
        if y is not None:
            # Only the positive rows take part, as queries and as negatives (as in
            # tabstream.train.torch.TwoTower); a row's loss is weighted by its label.
            positive = tf.reshape(y, [-1]) > 0
            query, candidate = tf.boolean_mask(query, positive), tf.boolean_mask(candidate, positive)
            if item_id is not None:
                item_id = tf.boolean_mask(item_id, positive)
            if sample_weight is not None:
                sample_weight = tf.boolean_mask(tf.reshape(sample_weight, [-1]), positive)
            y = tf.boolean_mask(tf.reshape(y, [-1]), positive)
        logits = tf.matmul(query, candidate, transpose_b=True)
        logits = logits / self.temperature
        batch = tf.shape(logits)[0]
        if item_id is not None:
            if self.logq_correction:
                # Popular items are in-batch negatives more often: subtract log Q(item)
                # so the scores estimate the softmax over all items, popularity included.
                logits = logits - self._log_q(item_id, training)[None, :]
            # Another row with the same item is not a negative: drop it from the softmax.
            duplicate = tf.logical_and(
                tf.equal(item_id[:, None], item_id[None, :]),
                tf.logical_not(tf.eye(batch, dtype=tf.bool)),
            )
            logits = tf.where(duplicate, tf.constant(-1e9, logits.dtype), logits)
        # One more column that no row picks, at -1e9: exp(-1e9 - max) is exactly 0,
        # so every row's softmax is unchanged, and a batch without positive rows has a
        # [0, 1] softmax (zero rows, a zero loss as torch's TwoTower gives) where
        # [0, 0] would fail ("must have at least one class").
        logits = tf.concat([logits, tf.fill([batch, 1], tf.constant(-1e9, logits.dtype))],
                           axis=1)
        per_row = tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=tf.range(batch), logits=logits
        )
        weights = tf.ones_like(per_row)
        if y is not None:
            weights = tf.cast(tf.reshape(y, [-1]), per_row.dtype)
        if sample_weight is not None:
            weights = weights * tf.cast(tf.reshape(sample_weight, [-1]), per_row.dtype)
        loss = tf.reduce_sum(per_row * weights) / tf.maximum(tf.reduce_sum(weights), 1.0)
        if self.losses:
            loss = loss + tf.add_n(self.losses)
        return loss

    def _log_q(self, item_id: tf.Tensor, training: bool) -> tf.Tensor:
        """log of each in-batch item's share of the rows seen so far (this batch
        included when training, so never log 0)."""
        counts = self.item_counts.value
        if training:
            counts.scatter_add(tf.IndexedSlices(tf.ones(tf.shape(item_id), counts.dtype),
                                                tf.cast(item_id, tf.int64)))
        share = tf.maximum(tf.gather(counts, item_id), 1.0) / tf.maximum(tf.reduce_sum(counts), 1.0)
        return tf.math.log(share)

    def recall_at_k(
        self,
        data: Iterable[Any],
        k: int = 10,
        candidates: Mapping[str, Any] | None = None,
        batch_size: int = 4096,
    ) -> float:
        """Share of positive rows of ``data`` whose item is among the ``k`` candidates
        scoring highest for the row's user.

        ``data`` yields ``(features, labels)`` (rows with label > 0 count) or
        ``features`` (every row counts). ``candidates`` maps the ITEM columns to arrays
        with one row per candidate item; by default, every distinct item id of the
        positive rows of ``data`` with its first such row's attributes (the candidates
        of ``tabstream.train.torch.recall_at_k``).
        """
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        batches = []
        for batch in data:
            features, labels = batch if isinstance(batch, tuple) else (batch, None)
            batches.append((features, labels))
        if candidates is None:
            candidates = self._candidates_from(batches)
        cand_ids = tf.reshape(tf.convert_to_tensor(candidates[self.item_id]), [-1])
        num = int(cand_ids.shape[0])
        cand_vectors = tf.concat(
            [
                self.candidate_embeddings(
                    {n: v[start : start + batch_size] for n, v in candidates.items()}
                )
                for start in range(0, num, batch_size)
            ],
            axis=0,
        )
        k = min(k, num)
        hits = 0.0
        total = 0.0
        for features, labels in batches:
            scores = tf.matmul(self.query_embeddings(features), cand_vectors, transpose_b=True)
            top = tf.gather(cand_ids, tf.math.top_k(scores, k=k).indices)
            true = tf.cast(tf.reshape(tf.convert_to_tensor(features[self.item_id]), [-1, 1]), top.dtype)
            hit = tf.cast(tf.reduce_any(tf.equal(top, true), axis=1), tf.float32)
            weight = tf.ones_like(hit)
            if labels is not None:
                weight = tf.cast(tf.reshape(labels, [-1]) > 0, tf.float32)
            hits += float(tf.reduce_sum(hit * weight))
            total += float(tf.reduce_sum(weight))
        if total == 0:
            raise ValueError("recall_at_k: data has no positive rows")
        return hits / total

    def _candidates_from(self, batches: list[tuple[Any, Any]]) -> dict[str, np.ndarray]:
        columns: dict[str, list[np.ndarray]] = {n: [] for n in self.item_feature_names}
        for features, labels in batches:
            # the items of the positive rows, as tabstream.train.torch.recall_at_k ranks
            keep = slice(None) if labels is None else np.asarray(labels).reshape(-1) > 0
            for n in self.item_feature_names:
                value = features[n]
                if isinstance(value, (tf.RaggedTensor, tf.SparseTensor, tuple, list)):
                    raise ValueError(
                        f"recall_at_k cannot collect candidates from list column {n!r}; "
                        "pass candidates= with one row per item"
                    )
                columns[n].append(np.asarray(value)[keep])
        merged = {n: np.concatenate(v) for n, v in columns.items()}
        _, first = np.unique(merged[self.item_id].reshape(-1), return_index=True)
        return {n: v[np.sort(first)] for n, v in merged.items()}

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "tower": self.tower_units,
            "embedding_dim": self.embedding_dim,
            "temperature": self.temperature,
            "normalize": self.normalize,
            "logq_correction": self.logq_correction,
        }


def _tower_views(embeddings: Any, user: Schema, item: Schema) -> tuple[Any, Any]:
    """``embeddings=`` of a TwoTower split into a view per tower."""
    if not hasattr(embeddings, "subset"):
        raise TypeError(
            f"TwoTower: embeddings= must offer subset(feature_names), one view per tower "
            f"(CachedEmbeddings does); got {type(embeddings).__name__}"
        )
    names = {key: [f for t in feature_spec(part).tables for f in t.feature_names]
             for key, part in (("user", user), ("item", item))}
    tables: dict[str, str] = getattr(embeddings, "feature_to_table", {})
    shared = sorted({tables[f] for f in names["user"] if f in tables}
                    & {tables[f] for f in names["item"] if f in tables})
    if shared:
        # two towers updating one table would apply two sparse steps where
        # in-memory training applies one
        raise ValueError(f"TwoTower: embeddings= tables {shared} serve both USER and ITEM "
                         "features; give each tower its own tables")
    return embeddings.subset(names["user"]), embeddings.subset(names["item"])

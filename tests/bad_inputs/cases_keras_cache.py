"""The Keras embedding cache (``tabstream.train.tensorflow.CachedEmbeddings``):
bad arguments, models it cannot serve, and the training loops it cannot run in.
TensorFlow is imported inside each case (the corpus loads without it)."""

from __future__ import annotations

from tabstream.core.errors import SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train.cache_store import ParameterServer
from tabstream.train.tables import TableConfig, table_configs_from_schema


def _cat(name: str, card: int, *tags: Tags, is_list: bool = False) -> ColumnSchema:
    return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL, *tags],
                        properties={"domain": {"min": 0, "max": card - 1}}, is_list=is_list)


def _schema() -> Schema:
    return Schema([_cat("C1", 50), _cat("C2", 20, is_list=True),
                   ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def _server(tmp, schema=None) -> ParameterServer:
    schema = schema or _schema()
    return ParameterServer(tmp / "ps", table_configs_from_schema(schema.without(["click"]), dim=8),
                           storage="memory")


def _layer(tmp, *args, **kwargs):
    from tabstream.train.tensorflow import CachedEmbeddings

    return CachedEmbeddings(*args, **kwargs)


def _ps_is_a_path(tmp):
    _layer(tmp, str(tmp / "ps"), 10)


def _cache_rows_bool(tmp):
    _layer(tmp, _server(tmp), True)


def _cache_rows_string(tmp):
    _layer(tmp, _server(tmp), "1000")


def _unknown_table(tmp):
    _layer(tmp, _server(tmp), 10, tables=["C1", "C7"])


def _unknown_list_feature(tmp):
    _layer(tmp, _server(tmp), 10, list_features=["C9"])


def _feature_in_two_served_tables(tmp):
    ps = ParameterServer(tmp / "ps", [TableConfig("a", 5, 4, ("x",)), TableConfig("b", 5, 4, ("x",))],
                         storage="memory")
    _layer(tmp, ps, 10, tables=["a", "b"])


def _dlrm_feature_not_served(tmp):
    from tabstream.train.tensorflow import DLRM

    ps = _server(tmp, Schema([_cat("C1", 50), ColumnSchema("click", "float32", tags=[Tags.TARGET])]))
    DLRM(_schema(), embedding_dim=8, embeddings=_layer(tmp, ps, 10))


def _dlrm_other_width(tmp):
    from tabstream.train.tensorflow import DLRM

    DLRM(_schema(), embedding_dim=4, embeddings=_layer(tmp, _server(tmp), 10))


def _wide_and_deep_without_wide_tables(tmp):
    from tabstream.train.tensorflow import WideAndDeep

    WideAndDeep(_schema(), embedding_dim=8, embeddings=_layer(tmp, _server(tmp), 10))


def _two_tower_table_in_both_towers(tmp):
    from tabstream.train.tensorflow import TwoTower

    schema = Schema([_cat("user", 30, Tags.USER_ID), _cat("item", 30, Tags.ITEM_ID),
                     ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    ps = ParameterServer(tmp / "ps", [TableConfig("ids", 30, 8, ("user", "item"))], storage="memory")
    TwoTower(schema, embedding_dim=8, embeddings=_layer(tmp, ps, 10))


def _keras_own_fit(tmp):
    import keras
    import tensorflow as tf

    from tabstream.train.tensorflow import DLRM

    model = DLRM(_schema(), embedding_dim=8, embeddings=_layer(tmp, _server(tmp), 10))
    model.compile(keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    features = {"C1": tf.constant([1, 2], tf.int64),
                "C2": (tf.constant([3], tf.int64), tf.constant([0, 1, 1], tf.int64)),
                "I1": tf.constant([0.5, 1.0])}
    model.fit(tf.data.Dataset.from_tensors((features, tf.constant([1.0, 0.0]))), verbose=0)


def _subset_of_unknown_features(tmp):
    _layer(tmp, _server(tmp), 10).subset(["C1", "C9"])


CASES = [
    ("ps_is_a_path", _ps_is_a_path, TypeError,
     r"CachedEmbeddings: ps must be a ParameterServer, got str"),
    ("cache_rows_bool", _cache_rows_bool, ValueError,
     r"CachedEmbeddings: cache_rows must be an int >= 1, got True"),
    ("cache_rows_string", _cache_rows_string, ValueError,
     r"CachedEmbeddings: cache_rows must be an int >= 1, got '1000'"),
    ("unknown_table", _unknown_table, SchemaError,
     r"parameter server .*ps has no tables \['C7'\]; it has \['C1', 'C2'\]"),
    ("unknown_list_feature", _unknown_list_feature, SchemaError,
     r"list_features \['C9'\] are in no table it serves; it serves \['C1', 'C2'\]"),
    ("feature_in_two_tables", _feature_in_two_served_tables, ValueError,
     r"feature 'x' is in tables 'a' and 'b'; serve them with two modules \(tables=...\)"),
    ("dlrm_feature_not_served", _dlrm_feature_not_served, SchemaError,
     r"DLRM: embeddings= must serve the schema's categorical features \['C1', 'C2'\]; "
     r"CachedEmbeddings serves \['C1'\]"),
    ("dlrm_other_width", _dlrm_other_width, ValueError,
     r"DLRM: every embedding must be embedding_dim=4 wide .* \{'C1': 8, 'C2': 8\}"),
    ("wide_and_deep_without_wide_tables", _wide_and_deep_without_wide_tables, SchemaError,
     r"no wide tables \['C1_wide', 'C2_wide'\].*WideAndDeep.table_configs\(schema, embedding_dim\)"),
    ("two_tower_table_in_both_towers", _two_tower_table_in_both_towers, ValueError,
     r"TwoTower: embeddings= tables \['ids'\] serve both USER and ITEM features; give each "
     r"tower its own tables"),
    ("keras_own_fit", _keras_own_fit, RuntimeError,
     r"DLRM.fit \(Keras' own training loop\) cannot train tables served by CachedEmbeddings.*"
     r"tabstream.train.tensorflow.fit\(model, loader, optimizer\)"),
    ("subset_of_unknown_features", _subset_of_unknown_features, SchemaError,
     r"CachedEmbeddings.subset: features \['C9'\] are not served; it serves \['C1', 'C2'\]"),
]

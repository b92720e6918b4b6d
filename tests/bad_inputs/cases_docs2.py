"""TorchRec interop of the torch loader and TwoTower's embeddings=: requests a user gets wrong."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tabstream.core.errors import SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags


def _export(tmp):
    """A four-row export: a categorical C1, a float I1 and a label."""
    path = tmp / "export"
    path.mkdir()
    pq.write_table(pa.table({"C1": pa.array([3, 1, 2, 0], pa.int64()),
                             "I1": pa.array(np.arange(4, dtype=np.float32)),
                             "label": pa.array([0, 1, 0, 1], pa.int64())}),
                   path / "part_00000.parquet")
    Schema([ColumnSchema("C1", "int64", tags=[Tags.CATEGORICAL]),
            ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
            ColumnSchema("label", "int64", tags=[Tags.TARGET])]).to_json(str(path / "schema.json"))
    (path / "_manifest.json").write_text(json.dumps(
        {"num_rows": 4, "files": [{"path": "part_00000.parquet", "num_rows": 4}]}))
    return path


def _keyed_jagged_unknown_column(tmp):
    from tabstream.loaders.torch import Loader
    Loader(_export(tmp), 2, keyed_jagged=["C7"])


def _keyed_jagged_a_string(tmp):
    from tabstream.loaders.torch import Loader
    Loader(_export(tmp), 2, keyed_jagged="C1")


def _keyed_jagged_no_categorical(tmp):
    from tabstream.loaders.torch import Loader
    Loader(_export(tmp), 2, keyed_jagged=True, features=["I1"])


def _two_tower_schema():
    return Schema([ColumnSchema("u", "int64", tags=[Tags.CATEGORICAL, Tags.USER_ID],
                                properties={"domain": {"min": 0, "max": 9}}),
                   ColumnSchema("i", "int64", tags=[Tags.CATEGORICAL, Tags.ITEM_ID],
                                properties={"domain": {"min": 0, "max": 9}})])


def _two_tower_plain_tables(tmp):
    from tabstream.train.torch import EmbeddingTables, TwoTower, table_configs_from_schema
    configs = table_configs_from_schema(_two_tower_schema(), dim=4)
    TwoTower(_two_tower_schema(), embedding_dim=4, embeddings=EmbeddingTables(configs))


def _two_tower_cache_missing_item(tmp):
    from tabstream.train.torch import (
        CachedEmbeddings,
        ParameterServer,
        TwoTower,
        table_configs_from_schema,
    )
    configs = table_configs_from_schema(_two_tower_schema().select_by_name(["u"]), dim=4)
    TwoTower(_two_tower_schema(), embedding_dim=4,
             embeddings=CachedEmbeddings(ParameterServer(tmp / "ps", configs), 8))


CASES = [
    ("torch loader keyed_jagged names an unknown column", _keyed_jagged_unknown_column,
     ValueError, r"keyed_jagged=\['C7'\]: \['C7'\] not among the loader's features \['C1', 'I1'\]"),
    ("torch loader keyed_jagged given a string", _keyed_jagged_a_string, TypeError,
     "keyed_jagged must be a bool or a list of feature names, got str"),
    ("torch loader keyed_jagged=True without categorical features", _keyed_jagged_no_categorical,
     ValueError, r"none of the features \['I1'\] is tagged CATEGORICAL"),
    ("TwoTower embeddings= without subset()", _two_tower_plain_tables, TypeError,
     r"embeddings= must offer subset\(feature_names\).*got EmbeddingTables"),
    ("TwoTower embeddings= missing the item features", _two_tower_cache_missing_item, SchemaError,
     r"features \['i'\] are not served; it serves \['u'\]"),
]

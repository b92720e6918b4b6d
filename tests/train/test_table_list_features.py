"""TableConfig.list_features: which features of a table are list columns, kept by a
ParameterServer folder (where the caches read their configs from)."""

from __future__ import annotations

import pytest

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import ParameterServer, table_configs_from_schema
from tabstream.train.tables import TableConfig


def shared_configs():
    def cat(name, is_list=False):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=is_list,
                            properties={"domain": {"min": 0, "max": 9, "name": "item"}})
    return table_configs_from_schema(Schema([cat("item_id"), cat("history_item_ids", is_list=True)]), dim=4)


def test_list_features_are_per_feature():
    (cfg,) = shared_configs()
    assert cfg.is_list and cfg.list_features == ("history_item_ids",)
    assert not cfg.is_list_feature("item_id") and cfg.is_list_feature("history_item_ids")
    legacy = TableConfig("item", 10, 4, ("item_id", "history_item_ids"), True)
    assert legacy.is_list_feature("item_id")  # no per-feature say: the table's flag
    with pytest.raises(ValueError, match="not among"):
        TableConfig("item", 10, 4, ("item_id",), True, "sum", ("other",))
    with pytest.raises(ValueError, match="disagrees"):
        TableConfig("item", 10, 4, ("item_id",), False, "sum", ("item_id",))


def test_server_folder_keeps_list_features(tmp_path):
    configs = shared_configs()
    ParameterServer(tmp_path / "ps", configs).close()
    ps = ParameterServer.open(tmp_path / "ps")
    assert ps.configs == tuple(configs)
    ps.close()


def test_open_or_create_takes_the_given_list_features(tmp_path):
    # a folder written without per-feature flags (an older version) is reused
    (cfg,) = shared_configs()
    legacy = TableConfig(cfg.name, cfg.cardinality, cfg.dim, cfg.feature_names, True)
    ParameterServer(tmp_path / "ps", [legacy]).close()
    ps = ParameterServer.open_or_create(tmp_path / "ps", [cfg])
    assert ps.configs == (cfg,)
    ps.close()

"""The one sharding planner both frameworks use (tabstream.train.sharding): the
plan= forms HybridParallel accepts, resolved without any framework."""

from __future__ import annotations

import pytest

from tabstream.train import TableConfig
from tabstream.train.sharding import (
    SHARDING_TYPES,
    ShardingPlan,
    plan_sharding,
    resolve_plan,
    table_configs_of,
)

CONFIGS = [TableConfig("big", 1_000_000, 16, ("big",)), TableConfig("mid", 50_000, 16, ("mid",)),
           TableConfig("tiny", 100, 8, ("tiny",))]


@pytest.mark.parametrize("kind", SHARDING_TYPES)
def test_a_strategy_name_gives_every_table_that_type(kind):
    plan = resolve_plan(kind, CONFIGS, 2)
    assert dict(plan) == {"big": kind, "mid": kind, "tiny": kind}
    assert plan == plan_sharding(CONFIGS, 2, strategy=kind)


def test_none_and_auto_are_the_auto_plan_and_a_dict_overrides_it():
    auto = plan_sharding(CONFIGS, 3)
    # by hand: 100 x 8 x 4 bytes x 3 (weights + 2 Adam slots) < 1 MiB: replicated; big holds
    # more than a third of the sharded bytes and 16 >= 3 columns: split by columns
    assert dict(auto) == {"big": "column_wise", "mid": "table_wise", "tiny": "data_parallel"}
    assert resolve_plan(None, CONFIGS, 3) == auto
    assert resolve_plan("auto", CONFIGS, 3) == auto
    assert dict(resolve_plan({"tiny": "row_wise"}, CONFIGS, 3)) == {**dict(auto), "tiny": "row_wise"}
    assert resolve_plan(auto, CONFIGS, 3) is auto


def test_plan_errors_name_the_fix():
    with pytest.raises(ValueError, match=r"plan='rows' is not a strategy; give one of \['auto', "
                       r"'table_wise', 'row_wise', 'column_wise', 'data_parallel'\]"):
        resolve_plan("rows", CONFIGS, 2)
    with pytest.raises(ValueError, match=r"the plan is for 3 ranks, but the process group has 2; "
                       r"plan with plan_sharding\(model, world_size=2\)"):
        resolve_plan(plan_sharding(CONFIGS, 3), CONFIGS, 2)
    with pytest.raises(TypeError, match="plan must be a ShardingPlan, a {table: type} dict, a "
                       "strategy name .* or None, got int"):
        resolve_plan(3, CONFIGS, 2)
    with pytest.raises(ValueError, match="the plan names table 'nope', which the model does not "
                       r"have; its tables are \['big', 'mid', 'tiny'\]"):
        resolve_plan({"nope": "row_wise"}, CONFIGS, 2)


def test_tables_are_found_by_what_a_layer_or_module_exposes():
    class Tables:  # an EmbeddingTables of either framework: a list of TableConfig
        configs = CONFIGS[:2]

    class Model:  # a Keras model: nested layers
        layers = [object(), Tables()]

    assert table_configs_of(Model()) == CONFIGS[:2]
    assert table_configs_of(Tables()) == CONFIGS[:2]
    assert isinstance(plan_sharding(Model(), 2), ShardingPlan)
    with pytest.raises(ValueError, match="Model has no EmbeddingTables module or layer"):
        table_configs_of(type("Model", (), {"layers": [object()]})())
    with pytest.raises(TypeError, match="takes a model, an EmbeddingTables or TableConfigs, "
                       "got str"):
        plan_sharding("big", 2)

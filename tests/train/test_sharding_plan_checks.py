"""A ready ShardingPlan is checked against the model's tables (names, sizes, the
ranges its placements cut), and two tables of one name are refused: a plan keys
tables by name. No framework needed: the tables are TableConfigs."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tabstream.train import TableConfig
from tabstream.train.sharding import (
    TablePlacement,
    plan_sharding,
    resolve_plan,
    table_configs_of,
)

MODEL = [TableConfig("T", 12, 4, ("a",)), TableConfig("U", 30, 8, ("b",))]


def _covers_once(ranges, total):
    """By hand: every row (or column) of 0..total-1 is in exactly one range."""
    hits = np.zeros(total, dtype=int)
    for a, b in ranges:
        hits[a:b] += 1
    return bool((hits == 1).all())


@pytest.mark.parametrize("kind", ["row_wise", "column_wise", "table_wise", "data_parallel"])
def test_a_plan_made_for_the_model_is_accepted(kind):
    plan = plan_sharding(MODEL, 2, strategy=kind)
    assert resolve_plan(plan, MODEL, 2) is plan
    for cfg in MODEL:
        place = plan.placements[cfg.name]
        if kind in ("row_wise", "column_wise"):
            total = cfg.cardinality if kind == "row_wise" else cfg.dim
            assert _covers_once(place.ranges, total)


@pytest.mark.parametrize("kind", ["row_wise", "column_wise", "table_wise"])
@pytest.mark.parametrize("rows, dim", [(8, 4), (12, 6), (16, 2)])
def test_a_plan_made_for_other_table_sizes_is_refused(kind, rows, dim):
    plan = plan_sharding([TableConfig("T", rows, dim, ("a",)), MODEL[1]], 2, strategy=kind)
    with pytest.raises(ValueError, match=rf"HybridParallel: table 'T' is {rows} x {dim} \(rows "
                       r"x dim\) in the plan but 12 x 4 in the model; plan with "
                       r"plan_sharding\(model, world_size=2\) for this model"):
        resolve_plan(plan, MODEL, 2)


def test_placements_that_do_not_cover_the_table_are_refused():
    plan = plan_sharding(MODEL, 2, strategy="row_wise")
    # rows 0:4 and 4:8 of a 12-row table: rows 8..11 on no rank
    short = dataclasses.replace(plan, placements={
        **plan.placements, "T": TablePlacement("row_wise", ranges=((0, 4), (4, 8)))})
    assert not _covers_once(((0, 4), (4, 8)), 12)
    with pytest.raises(ValueError, match=r"table 'T' is row_wise over rows 0:4, 4:8 in the plan, "
                       r"which do not cover the model's 12 rows \(0:12\) once over 2 ranks"):
        resolve_plan(short, MODEL, 2)
    overlap = dataclasses.replace(plan, placements={
        **plan.placements, "U": TablePlacement("column_wise", ranges=((0, 5), (3, 8)))})
    with pytest.raises(ValueError, match=r"table 'U' is column_wise over columns 0:5, 3:8 in "
                       r"the plan, which do not cover the model's 8 columns"):
        resolve_plan(overlap, MODEL, 2)
    elsewhere = dataclasses.replace(plan, placements={
        **plan.placements, "T": TablePlacement("table_wise", owner=2)})
    with pytest.raises(ValueError, match=r"table 'T' is placed on rank 2, not on one of the "
                       r"plan's 2 ranks"):
        resolve_plan(elsewhere, MODEL, 2)


def test_a_plan_missing_a_table_or_naming_another_is_refused():
    plan = plan_sharding(MODEL[:1], 2)
    with pytest.raises(ValueError, match=r"the plan has no placement for tables \['U'\] of the "
                       r"model \(it plans \['T'\]\)"):
        resolve_plan(plan, MODEL, 2)
    plan = plan_sharding([*MODEL, TableConfig("V", 5, 4, ("c",))], 2)
    with pytest.raises(ValueError, match=r"the plan names tables \['V'\] that the model does "
                       r"not have \(its tables are \['T', 'U'\]\)"):
        resolve_plan(plan, MODEL, 2)


def test_two_configs_of_one_name_are_refused():
    twice = [TableConfig("cat", 10, 4, ("a_cat",)), TableConfig("cat", 10, 6, ("b_cat",))]
    with pytest.raises(ValueError, match=r"plan_sharding: table 'cat' is twice in the configs "
                       r"given \(10 x 4 and 10 x 6\); a sharding plan keys tables by name"):
        plan_sharding(twice, 2)
    with pytest.raises(ValueError, match="HybridParallel: table 'cat' is twice in the configs"):
        resolve_plan({"cat": "column_wise"}, twice, 2)
    with pytest.raises(ValueError, match="table 'cat' is twice"):
        table_configs_of(twice)

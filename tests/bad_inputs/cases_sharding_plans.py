"""plan= of HybridParallel in either framework (tabstream.train.sharding.resolve_plan):
the accepted forms and the refused ones, without starting any worker."""

from __future__ import annotations

from tabstream.train.sharding import plan_sharding, resolve_plan
from tabstream.train.tables import TableConfig

TABLES = [TableConfig("C1", 100, 8, ("C1",)), TableConfig("C2", 3, 8, ("C2",))]


def _unknown_strategy(tmp):
    resolve_plan("rows", TABLES, 2)


def _plan_of_a_wrong_type(tmp):
    resolve_plan(["C1", "row_wise"], TABLES, 2)


def _a_name_is_every_table(tmp):
    # "auto" was once read as a dict of overrides ("dictionary update sequence element #0")
    assert resolve_plan("auto", TABLES, 2) == plan_sharding(TABLES, 2)
    assert dict(resolve_plan("column_wise", TABLES, 2)) == {"C1": "column_wise",
                                                            "C2": "column_wise"}


def _row_wise_name_on_a_tiny_table(tmp):
    resolve_plan("row_wise", TABLES, 4)


CASES = [
    ("plan names no strategy", _unknown_strategy, ValueError,
     r"plan='rows' is not a strategy; give one of \['auto', 'table_wise', 'row_wise', "
     r"'column_wise', 'data_parallel'\], a \{table: type\} dict or a ShardingPlan"),
    ("plan given as a list", _plan_of_a_wrong_type, TypeError,
     "plan must be a ShardingPlan, a {table: type} dict, a strategy name .* got list"),
    ("plan given as a strategy name", _a_name_is_every_table, None, None),
    ("row_wise strategy over a table with fewer rows than ranks",
     _row_wise_name_on_a_tiny_table, ValueError, "table 'C2' has 3 rows, fewer than 4 ranks"),
]

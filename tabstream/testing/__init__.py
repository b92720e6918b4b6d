"""Helpers for testing pipelines and ops: NaN- and list-aware table assertions
(:mod:`tabstream.testing.tables`) and the op contract that every op keeps, runnable
on an op of your own with :func:`check_op` (:mod:`tabstream.testing.op_contract`).
"""

from __future__ import annotations

from tabstream.testing.op_contract import (
    CHECKS,
    CONTRACT_EXAMPLES,
    NASTY_EXAMPLES,
    assert_same_state,
    check_op,
    contract_frame,
    nasty_frame,
    nasty_pandas,
    run_check,
)
from tabstream.testing.tables import (
    assert_tables_equal,
    huge_pages_enabled,
    map_float_values,
    nan_to_null,
    nasty_floats,
    negative_zero_to_zero,
)

__all__ = ["CHECKS", "CONTRACT_EXAMPLES", "NASTY_EXAMPLES", "assert_same_state", "assert_tables_equal", "check_op",
           "contract_frame", "huge_pages_enabled", "map_float_values", "nan_to_null", "nasty_floats", "nasty_frame",
           "nasty_pandas", "negative_zero_to_zero", "run_check"]

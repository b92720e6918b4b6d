"""One contract suite over every registered op (scikit-learn's check_estimator idea).

The checks and the examples live in :mod:`tabstream.testing.op_contract`, so users
run the same checks on their own ops with ``tabstream.testing.check_op``. Registering
an op = subclassing Operator; `test_every_op_has_an_example` fails until a new op of
the catalog has an entry in CONTRACT_EXAMPLES, and then every check runs over it.
"""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tabstream as ts
from tabstream.core.operators import ColumnOperator, Operator, registered_ops
from tabstream.testing import (
    CHECKS,
    CONTRACT_EXAMPLES,
    NASTY_EXAMPLES,
    assert_tables_equal,
    check_op,
    contract_frame,
    nasty_frame,
    run_check,
)

EXAMPLES = CONTRACT_EXAMPLES
CONTRACT_CHECKS = sorted(name for name, (_, frame) in CHECKS.items() if frame == "contract")
NASTY_CHECKS = sorted(name for name, (_, frame) in CHECKS.items() if frame == "nasty")


def run(op_factory, columns, table, part_size=None):
    wf = ts.Workflow(columns >> op_factory())
    wf.fit(ts.Dataset(table, part_size=part_size))
    return wf, wf.transform(table)


def test_every_op_has_an_example():
    import tabstream.ops  # noqa: F401

    catalog = {name for name, cls in registered_ops().items() if cls.__module__.startswith("tabstream.")}
    missing = sorted(catalog - set(EXAMPLES))
    assert not missing, f"add contract examples for {missing} to tabstream/testing/op_contract.py"


@pytest.mark.parametrize("check", CONTRACT_CHECKS)
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_contract(name, check):
    factory, columns = EXAMPLES[name]
    run_check(check, factory, columns)


@pytest.mark.parametrize("check", NASTY_CHECKS)
@pytest.mark.parametrize("name", [*sorted(EXAMPLES), *sorted(NASTY_EXAMPLES)])
def test_contract_on_nasty_values(name, check):
    factory, columns = NASTY_EXAMPLES[name] if name in NASTY_EXAMPLES else EXAMPLES[name]
    run_check(check, factory, columns)


# -- check_op on ops of one's own ------------------------------------------------------
class ScaleBy(ColumnOperator):
    """A user's op: multiplies its columns by ``factor`` (kept out of the catalog by
    its module, so the catalog test above does not ask for an example)."""

    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = factor

    def output_column(self, col):
        return col.with_dtype("float64")

    def transform_column(self, name, column):
        return pc.multiply(column.cast(pa.float64()), self.factor)


class LiesAboutRows(Operator):
    """A user's op that drops rows but does not declare ``changes_row_count``."""

    def transform(self, table):
        return table.slice(0, table.num_rows // 2)


class ForgetsItsParams(Operator):
    """A user's op whose parameter is not read back by ``get_params`` (stored under
    another attribute name)."""

    def __init__(self, factor: float = 2.0):
        super().__init__()
        self._factor = factor

    def transform(self, table):
        return table


def test_check_op_runs_every_check_on_a_users_op():
    assert check_op(ScaleBy(3.0), ["cont", "count"]) == list(CHECKS)
    wf = ts.Workflow(["cont"] >> ScaleBy(3.0)).fit(ts.Dataset(contract_frame()))
    out = wf.transform(contract_frame())
    expected = contract_frame().column("cont").to_numpy(zero_copy_only=False) * 3.0
    np.testing.assert_array_equal(out.column("cont").to_numpy(zero_copy_only=False), expected)


def test_check_op_names_the_broken_check():
    with pytest.raises(AssertionError, match="changes_row_count_is_declared.*600 rows in, 300 out"):
        check_op(LiesAboutRows, ["cont"], nasty_values=False)
    with pytest.raises(AssertionError, match="params_round_trip_through_json.*ForgetsItsParams.get_params"
                                             r"\(\) fails .*no attribute 'factor'"):
        check_op(ForgetsItsParams(5.0), ["cont"], nasty_values=False)


def test_check_op_defaults_to_the_catalog_example_and_refuses_unknown_columns():
    assert check_op(ts.ops.Clip, nasty_values=False) == CONTRACT_CHECKS_IN_ORDER
    with pytest.raises(ValueError, match="give the columns ScaleBy selects"):
        check_op(ScaleBy)
    with pytest.raises(ValueError, match=r"no columns \['price'\].*give frame="):
        check_op(ScaleBy, ["price"])


CONTRACT_CHECKS_IN_ORDER = [name for name, (_, frame) in CHECKS.items() if frame == "contract"]


# -- what an op declares for the workflow and the loaders ----------------------------
# (class attributes of Operator / StatOperator, read instead of class names or
# getattr probes: each must say what the op really does)
FRAMES = {**{name: contract_frame for name in EXAMPLES}, **{name: nasty_frame for name in NASTY_EXAMPLES}}


def _example(name):
    return {**EXAMPLES, **NASTY_EXAMPLES}[name]


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_changes_row_count_says_whether_transform_changes_the_row_count(name):
    """Every registered op (through its example) declares ``changes_row_count`` True
    exactly when its output holds another number of rows than its input."""
    factory, columns = _example(name)
    table = FRAMES[name]()
    _, out = run(factory, columns, table)
    assert type(factory()).changes_row_count == (out.num_rows != table.num_rows), (
        f"{name}: {table.num_rows} rows in, {out.num_rows} out, but changes_row_count is "
        f"{type(factory()).changes_row_count}")


def test_the_row_changing_ops_are_the_documented_ones():
    changing = sorted(n for n, cls in registered_ops().items() if cls.changes_row_count)
    assert changing == sorted(["Filter", "Dropna", "Groupby"])


def _dictionary_encoded(table):
    strings = [n for n in table.column_names if pa.types.is_string(table.schema.field(n).type)]
    assert strings, "the example selects no string column to hand over as a dictionary"
    return pa.table({n: pc.dictionary_encode(table.column(n)) if n in strings else table.column(n)
                     for n in table.column_names})


def _reads_strings(name):
    schema = FRAMES[name]().schema
    return any(pa.types.is_string(schema.field(c).type) for c in _example(name)[1])


# (the workflow hands over as dictionaries only plain string columns)
@pytest.mark.parametrize("name", sorted(n for n in FRAMES if type(_example(n)[0]()).accepts_dictionary
                                        and _reads_strings(n)))
def test_ops_accepting_dictionaries_give_the_same_from_dictionary_columns(name):
    """An op with ``accepts_dictionary`` fits and transforms string columns handed
    over as dictionary arrays (as the workflow reads them from parquet) exactly as
    the plain strings."""
    factory, columns = _example(name)
    table = FRAMES[name]().select(columns)
    encoded = _dictionary_encoded(table)
    plain, from_dictionary = factory(), factory()
    if plain.is_stat:
        plain.fit_table(table)
        from_dictionary.fit_table(encoded)
    expected = plain.transform(table)
    assert_tables_equal(from_dictionary.transform(encoded), expected)
    assert_tables_equal(plain.transform(encoded), expected)


def test_some_op_accepts_dictionaries():
    assert sorted(n for n, cls in registered_ops().items() if cls.accepts_dictionary) == ["Categorify"]


@pytest.mark.parametrize("name", sorted(n for n in FRAMES if getattr(type(_example(n)[0]()), "shards_root", False)))
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_root_merges_in_shares_as_in_one(name, shards):
    """An op with ``shards_root`` fitted through ``combine_root`` in ``shards``
    shares joined by ``join_root`` transforms as the same op fitted with
    ``combine`` alone (``fit_table``)."""
    factory, columns = _example(name)
    table = FRAMES[name]().select(columns)
    parts = [table.slice(start, 97) for start in range(0, table.num_rows, 97)]
    sharded = factory()
    partials = [sharded.fit_partition(part) for part in parts]
    sharded.finalize(sharded.join_root([sharded.combine_root(partials, s, shards) for s in range(shards)]))
    assert_tables_equal(sharded.transform(table), factory().fit_table(table).transform(table))


def test_some_op_shards_its_root():
    assert sorted(n for n, cls in registered_ops().items() if getattr(cls, "shards_root", False)) == ["Categorify"]

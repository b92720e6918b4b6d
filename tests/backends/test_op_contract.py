"""The backend contract: every op of the catalog, fitted and applied on each
available backend, gives the arrow backend's output (ids exactly, floats to 1e-6)
and the arrow backend's fitted state; a workflow fitted on the backend, saved and
loaded, transforms on the arrow backend to the same output.

The op examples are the op contract's (``tabstream.testing.CONTRACT_EXAMPLES``), so a
new op that joins that suite joins this one. A new backend passes this file and
``test_kernels.py`` (see docs/backends.md).
"""

import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.pipeline.regroup import GroupedTransformedDataset
from tabstream.testing import (
    CONTRACT_EXAMPLES,
    NASTY_EXAMPLES,
    assert_same_state,
    assert_tables_equal,
    contract_frame,
    nasty_frame,
)
from tabstream.testing.op_contract import contract_double, contract_keep_positive

CASES = {**{name: (*spec, contract_frame) for name, spec in CONTRACT_EXAMPLES.items()},
         **{name: (*spec, nasty_frame) for name, spec in NASTY_EXAMPLES.items()}}
FUNCTIONS = {"contract_double": contract_double, "contract_keep_positive": contract_keep_positive}


def _dataset(table, backend_name):
    ds = ts.Dataset(table, part_size=table.nbytes // 3)  # about three partitions
    ds.backend_name = backend_name  # what Dataset(cpu=...) chose, set directly for the suite
    return ds


def _collect(tds):
    pieces = range(tds.npartitions) if isinstance(tds, GroupedTransformedDataset) else tds.dataset.pieces
    return pa.concat_tables([tds.read_piece(p) for p in pieces])


def _fit_transform(factory, columns, table, backend_name):
    ds = _dataset(table, backend_name)
    wf = ts.Workflow(columns >> factory())
    wf.fit(ds)
    return wf, _collect(wf.transform(ds))


def assert_backend_output_equal(got, expected):
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        t = expected.schema.field(name).type
        floats = pa.types.is_floating(t) or (pa.types.is_list(t) and pa.types.is_floating(t.value_type))
        assert_tables_equal(got.select([name]), expected.select([name]), rtol=1e-6 if floats else 0.0)


def test_the_suite_covers_the_catalog():
    from tabstream.core.operators import registered_ops

    catalog = {name for name, cls in registered_ops().items() if cls.__module__.startswith("tabstream.")}
    assert catalog <= {name.split("[")[0] for name in CASES}


@pytest.mark.parametrize("case", sorted(CASES))
def test_op_on_backend_equals_arrow(case, backend_name, tmp_path):
    factory, columns, make_table = CASES[case]
    table = make_table()
    expected_wf, expected = _fit_transform(factory, columns, table, "arrow")
    wf, got = _fit_transform(factory, columns, table, backend_name)
    assert_backend_output_equal(got, expected)
    assert wf.output_schema == expected_wf.output_schema
    assert_same_state(wf, expected_wf, rtol=1e-6)
    # fitted on this backend, saved, loaded and applied on the arrow backend: same output
    wf.save(str(tmp_path / "wf"))
    loaded = ts.Workflow.load(str(tmp_path / "wf"), functions=FUNCTIONS)
    assert_backend_output_equal(_collect(loaded.transform(_dataset(table, "arrow"))), expected)

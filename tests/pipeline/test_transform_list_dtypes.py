"""Workflow.transform casts a list column's elements to the fitted dtype, as it casts
scalar columns (and as the serving artifact casts both): a list<int64> column fitted
then sent as list<double> hashes as the integers, a list<string> column sent as
integers looks up their text. The expected results are those of the same rows sent in
the fitted dtype, and plain Python for the lists' shapes."""

from __future__ import annotations

import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import SchemaError


def _transform(wf: ts.Workflow, table: pa.Table) -> dict:
    return wf.transform(table).to_pydict()


def _node():
    return (["l"] >> ops.Categorify()) + (["l"] >> ops.HashBucket(1000) >> ops.Rename(postfix="_h"))


@pytest.mark.parametrize(("fitted", "sent", "as_fitted"), [
    (pa.list_(pa.int64()), pa.list_(pa.float64()), None),
    (pa.list_(pa.int32()), pa.large_list(pa.int64()), None),
    (pa.list_(pa.string()), pa.list_(pa.int64()), [["1", "2"], ["3"], [], None]),
])
def test_list_elements_are_cast_to_the_fitted_dtype(fitted, sent, as_fitted):
    rows = [[1, 2], [3], [], None]
    fit_rows = [["1", "2"], ["3"], ["9"]]
    if not pa.types.is_string(fitted.value_type):
        fit_rows = [[int(v) for v in r] for r in fit_rows]
    wf = ts.Workflow(_node()).fit(ts.Dataset(pa.table({"l": pa.array(fit_rows, fitted)})))
    got = _transform(wf, pa.table({"l": pa.array(rows, sent)}))
    want = _transform(wf, pa.table({"l": pa.array(as_fitted or rows, fitted)}))
    assert got == want
    # the ids are the vocabulary's, not out-of-vocabulary: 1, 2 and 3 were all fitted
    flat = [v for r in got["l"] if r is not None for v in r]
    assert len(flat) == 3 and len(set(flat)) == 3


def test_list_elements_that_do_not_convert_are_a_schema_error():
    wf = ts.Workflow(_node()).fit(ts.Dataset(pa.table({"l": pa.array([[1, 2]], pa.list_(pa.int64()))})))
    with pytest.raises(SchemaError, match=r"input column 'l' is string, but the workflow was fitted on "
                                          r"int64 and the values do not convert"):
        _transform(wf, pa.table({"l": pa.array([["a"]], pa.list_(pa.string()))}))

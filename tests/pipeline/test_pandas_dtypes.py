"""pandas outputs hold numpy dtypes for numbers and booleans (issue 31 item 1), as
NVTabular's pandas frames do: ``to_ddf().compute()``, ``to_iter()``, ``compute()`` and
``Workflow.transform(pandas_df)``. Integers and booleans with nulls are pandas' masked
dtypes (exact), floats with nulls NaN, strings and lists may stay Arrow-backed."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops


def _table(n: int = 40) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table({
        "i64": pa.array(rng.integers(0, 9, n), pa.int64()),
        "i32": pa.array(rng.integers(0, 9, n), pa.int32()),
        "u8": pa.array(rng.integers(0, 9, n), pa.uint8()),
        "f32": pa.array(rng.random(n), pa.float32()),
        "f64_null": pa.array([None if i % 5 == 0 else float(i) for i in range(n)], pa.float64()),
        "i64_null": pa.array([None if i % 7 == 0 else i for i in range(n)], pa.int64()),
        "flag": pa.array(rng.integers(0, 2, n).astype(bool)),
        "flag_null": pa.array([None if i % 6 == 0 else bool(i % 2) for i in range(n)], pa.bool_()),
        "s": pa.array([f"v{i % 4}" for i in range(n)]),
        "lst": pa.array([[i, i + 1] for i in range(n)], pa.list_(pa.int64())),
    })


def _expected_dtype(column: pa.ChunkedArray):
    """What plain pandas/numpy would hold: numpy dtype without nulls; NaN floats;
    masked integers/booleans with nulls."""
    t = column.type
    if pa.types.is_floating(t):
        return np.dtype(t.to_pandas_dtype())
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        numpy = np.dtype(t.to_pandas_dtype())
        if column.null_count == 0:
            return numpy
        return pd.BooleanDtype() if numpy == np.bool_ else pd.api.types.pandas_dtype(
            numpy.name.replace("uint", "UInt").replace("int", "Int"))
    return None


def _check(frame: pd.DataFrame, table: pa.Table) -> None:
    for name in ("i64", "i32", "u8", "f32", "f64_null", "i64_null", "flag", "flag_null"):
        column = table.column(name)
        expected = _expected_dtype(column)
        assert frame[name].dtype == expected, (name, frame[name].dtype, expected)
    # numpy idioms NVTabular code relies on
    assert frame["i64"].dtype == np.int64 and isinstance(frame["i64"].values, np.ndarray)
    assert np.isnan(frame["f64_null"].to_numpy()).sum() == table.column("f64_null").null_count
    assert frame["i64_null"].isna().sum() == table.column("i64_null").null_count
    assert frame["i64_null"].dropna().astype(np.int64).tolist() == [
        v for v in table.column("i64_null").to_pylist() if v is not None]
    assert pa.array(frame["lst"]).to_pylist() == table.column("lst").to_pylist()
    assert frame["s"].tolist() == table.column("s").to_pylist()


@pytest.mark.parametrize("part_size", [None, 200])
def test_dataset_outputs_hold_numpy_dtypes(part_size):
    table = _table()
    ds = ts.Dataset(table, part_size=part_size)
    _check(ds.to_ddf().compute().reset_index(drop=True), table)
    parts = list(ds.to_iter())
    # each partition alone: masked only where that partition holds a null
    offset = 0
    for part in parts:
        _check(part, table.slice(offset, len(part)))
        offset += len(part)
    assert offset == table.num_rows


def test_transformed_outputs_hold_numpy_dtypes():
    table = _table()
    names = table.column_names
    wf = ts.Workflow(names)  # no statistics op: pass-through
    ds = ts.Dataset(table, part_size=200)
    wf.fit(ds)
    _check(wf.transform(ds).compute(), table)
    _check(wf.transform(ds).to_ddf().compute().reset_index(drop=True), table)
    out = wf.transform(table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get))
    _check(out, table)


def test_op_outputs_are_numpy_after_categorify_and_normalize():
    table = _table()
    wf = ts.Workflow((["s"] >> ops.Categorify()) + (["f32"] >> ops.Normalize()))
    out = wf.fit_transform(ts.Dataset(table)).compute()
    assert out["s"].dtype == np.int64 and out["f32"].dtype == np.float32
    values = table.column("f32").to_numpy().astype(np.float64)
    mean, std = values.mean(), values.std(ddof=1)  # NVTabular's sample std
    np.testing.assert_allclose(out["f32"].to_numpy(), (table.column("f32").to_numpy() - mean) / std,
                               rtol=1e-4, atol=1e-5)

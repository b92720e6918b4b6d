"""LogOp on integer columns: every integer dtype, values on both sides of the small
integers whose logarithms the arrow backend keeps in a table (0..65535), negatives,
the dtype's extremes, with and without nulls, one and several chunks; against numpy's
log1p in float64 rounded to float32 (LogOp's documented result)."""

import numpy as np
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops

DTYPES = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]


def _values(dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    rng = np.random.default_rng(7)
    edges = [info.min, info.max, 0, 1, 2, 255, 256, 65534, 65535, 65536, 65537, -1, -2, -65537]
    edges = [v for v in edges if info.min <= v <= info.max]
    spread = rng.integers(info.min, info.max, 3000, dtype=dtype, endpoint=True)
    small = rng.integers(max(info.min, -5), min(info.max, 70000), 3000, dtype=dtype, endpoint=True)
    return np.concatenate([np.array(edges, dtype=dtype), spread, small])


def _expected(values: np.ndarray, valid: np.ndarray) -> list:
    with np.errstate(divide="ignore", invalid="ignore"):
        logged = np.log1p(values, dtype=np.float64).astype(np.float32)
    return [float(v) if ok else None for v, ok in zip(logged, valid, strict=True)]


def _same(got: list, expected: list) -> bool:
    return all((g is None and e is None) or (g is not None and e is not None and
                                              (g == e or (np.isnan(g) and np.isnan(e))))
               for g, e in zip(got, expected, strict=True))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nulls", [False, True])
@pytest.mark.parametrize("chunks", [1, 3])
def test_logop_on_integers_equals_numpy(dtype, nulls, chunks):
    values = _values(dtype)
    valid = np.ones(len(values), dtype=bool)
    if nulls:
        valid[::7] = False
    array = pa.array(values, mask=~valid)
    bounds = np.linspace(0, len(values), chunks + 1).astype(int)
    column = pa.chunked_array([array.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)])
    out = ts.Workflow(["x"] >> ops.LogOp()).fit_transform(pa.table({"x": column}))
    got = out.column("x")
    assert got.type == pa.float32()
    assert _same(got.to_pylist(), _expected(values, valid))

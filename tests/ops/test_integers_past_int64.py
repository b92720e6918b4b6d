"""Fill values, Clip bounds and ListSlice pads of 2**63 and up on uint64 columns,
and FillMedian on integers past 2**53: each against plain Python on the values
(before, building the Arrow scalar overflowed int64, or the float cast refused)."""
import numpy as np
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops

BIG = [1, 2**63 + 5, None, 3, 2**64 - 1, 2**63 - 1, 2**63 + 100]


def run(node, table):
    wf = ts.Workflow(node).fit(ts.Dataset(table))
    return wf.transform(table).column(0).to_pylist(), wf.output_schema


def test_fill_missing_past_int64():
    got, schema = run(["u"] >> ops.FillMissing(2**63 + 1), pa.table({"u": pa.array(BIG, pa.uint64())}))
    assert got == [2**63 + 1 if v is None else v for v in BIG]
    assert schema["u"].dtype == "uint64"


@pytest.mark.parametrize("lo,hi", [(2, 2**63 + 50), (2**63, None), (None, 2**63 - 2), (2**63 + 6, 2**64 - 2)])
def test_clip_bounds_past_int64(lo, hi):
    got, schema = run(["u"] >> ops.Clip(min_value=lo, max_value=hi), pa.table({"u": pa.array(BIG, pa.uint64())}))
    def clip(v):
        v = v if lo is None else max(v, lo)
        return v if hi is None else min(v, hi)
    expected = [None if v is None else clip(v) for v in BIG]
    assert got == expected and schema["u"].dtype == "uint64"


@pytest.mark.parametrize("dtype,values", [
    ("uint64", BIG),
    ("int64", [2**60 + 1, None, -(2**55) - 3, 7, 2**62 + 11]),
])
def test_fill_median_of_integers_past_2_53(dtype, values):
    got, schema = run(["x"] >> ops.FillMedian(add_binary_cols=True),
                      pa.table({"x": pa.array(values, getattr(pa, dtype)())}))
    present = sorted(v for v in values if v is not None)
    mid = len(present) // 2
    median = float(present[mid]) if len(present) % 2 else (float(present[mid - 1]) + float(present[mid])) / 2
    # integers past 2**53 round to the nearest float64, as numpy's astype does
    expected = [median if v is None else float(np.array([v], dtype).astype(np.float64)[0]) for v in values]
    np.testing.assert_allclose(got, expected, rtol=1e-15)
    assert schema["x"].dtype == "float64"


def test_list_slice_pad_past_int64():
    lists = [[1, 2**63 + 7], [], None, [2**64 - 2]]
    table = pa.table({"l": pa.array(lists, pa.list_(pa.uint64()))})
    got, _ = run(["l"] >> ops.ListSlice(0, 3, pad=True, pad_value=2**63 + 9), table)
    assert got == [(row or [])[:3] + [2**63 + 9] * (3 - len((row or [])[:3])) for row in lists]

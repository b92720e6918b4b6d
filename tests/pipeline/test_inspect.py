"""``inspect_dataset``: every statistic against the same figure computed with
plain pandas/numpy, on several partitions, with nulls, NaN and lists."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.pipeline.inspect import (
    QUANTILES,
    HyperLogLog,
    QuantileSummary,
    chart_kind,
    inspect_dataset,
    write_plots,
)


def _frame(seed: int, n: int = 3000) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.lognormal(2.0, 1.0, n)
    x[rng.random(n) < 0.1] = np.nan
    cats = rng.choice([f"v{i}" for i in range(40)], n, p=np.arange(40, 0, -1) / 820)
    c = pd.Series(cats, dtype=object)
    c[rng.random(n) < 0.05] = None
    ints = pd.array(rng.integers(-5, 50, n), dtype="Int64")
    ints[rng.random(n) < 0.2] = pd.NA
    return pd.DataFrame({"x": x, "c": c, "i": ints})


def _by_name(report):
    return {c["name"]: c for c in report["columns"]}


@pytest.mark.parametrize("seed", [0, 1])
def test_statistics_equal_pandas_on_many_partitions(seed):
    df = _frame(seed)
    ds = ts.Dataset(df, part_size="8KB")
    assert ds.npartitions > 3
    report = inspect_dataset(ds, progress=False, top=5)
    cols = _by_name(report)
    assert report["num_rows"] == len(df)
    for name in ("x", "i"):
        values = df[name].dropna().astype("float64").to_numpy()
        col = cols[name]
        assert col["null_rate"] == pytest.approx(df[name].isna().mean())
        assert col["min"] == values.min() and col["max"] == values.max()
        assert col["mean"] == pytest.approx(values.mean(), rel=1e-12)
        assert col["std"] == pytest.approx(values.std(ddof=1), rel=1e-9)
        assert col["distinct"] == len(np.unique(values)) and col["distinct_exact"]
    # below 2,048 values the quantile summary is exact: numpy's inverted_cdf
    small = ts.Dataset(df.iloc[:1500], part_size="8KB")
    got = _by_name(inspect_dataset(small, progress=False))["i"]["quantiles"]
    vals = df["i"].iloc[:1500].dropna().astype("float64").to_numpy()
    for q in QUANTILES:
        assert got[str(q)] == np.quantile(vals, q, method="inverted_cdf"), q
    # top values: pandas value_counts, ties by value
    vc = df["c"].value_counts().reset_index()
    vc.columns = ["value", "count"]
    expected = vc.sort_values(["count", "value"], ascending=[False, True]).head(5)
    assert cols["c"]["top"] == expected.to_dict("records") and cols["c"]["top_exact"]
    assert "top" not in cols["x"] and "quantiles" not in cols["c"]


def test_quantiles_of_many_values_are_within_rank_error():
    rng = np.random.default_rng(7)
    values = rng.exponential(3.0, 60_000)
    ds = ts.Dataset(pd.DataFrame({"v": values}), part_size="32KB")
    assert ds.npartitions >= 8
    got = _by_name(inspect_dataset(ds, progress=False))["v"]["quantiles"]
    ordered = np.sort(values)
    for q in (0.01, 0.25, 0.5, 0.75, 0.99):
        rank = np.searchsorted(ordered, got[str(q)], side="right") / len(values)
        assert abs(rank - q) < 0.005, (q, rank)
    assert got["0.0"] == ordered[0] and got["1.0"] == ordered[-1]


def test_distinct_switches_to_hyperloglog_past_the_exact_limit():
    n = 40_000
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 30_000, n).astype(str)
    ds = ts.Dataset(pd.DataFrame({"k": keys}), part_size="64KB")
    exact = _by_name(inspect_dataset(ds, progress=False, exact_limit=50_000))["k"]
    assert exact["distinct"] == len(np.unique(keys)) and exact["distinct_exact"]
    approx = _by_name(inspect_dataset(ds, progress=False, exact_limit=1000))["k"]
    assert not approx["distinct_exact"] and not approx["top_exact"]
    assert approx["distinct"] == pytest.approx(len(np.unique(keys)), rel=0.03)


def test_hyperloglog_merge_equals_one_sketch_and_memory_is_fixed():
    values = pa.array([f"id{i}" for i in range(200_000)])
    whole = HyperLogLog()
    whole.add(values)
    a, b = HyperLogLog(), HyperLogLog()
    a.add(values[:120_000])
    b.add(values[80_000:])
    merged = a.merge(b)
    np.testing.assert_array_equal(merged.registers, whole.registers)
    assert merged.registers.nbytes == 1 << 14
    assert whole.estimate() == pytest.approx(200_000, rel=0.03)


def test_missing_values_and_signed_zero():
    df = pd.DataFrame({"f": [0.0, -0.0, np.nan, None, 1.5, 1.5]})
    col = _by_name(inspect_dataset(ts.Dataset(df), progress=False))["f"]
    assert col["nulls"] == 2 and col["distinct"] == 2  # {0.0, 1.5}


@pytest.mark.parametrize("part_size", [None, 600])
def test_infinite_values_are_counted_apart_and_the_report_is_strict_json(part_size):
    """±inf left the max null, the mean inf and the std NaN, and --json printed the bare
    tokens Infinity and NaN; now the statistics are over the finite values (as
    DataStats and Normalize take them) and the infinities are counted."""
    import json

    rng = np.random.default_rng(4)
    x = rng.normal(size=400)
    x[[3, 50, 51]] = [np.inf, -np.inf, np.inf]
    x[7] = np.nan
    col = _by_name(inspect_dataset(ts.Dataset(pd.DataFrame({"x": x}), part_size=part_size), progress=False))["x"]
    finite = x[np.isfinite(x)]
    assert col["infinite"] == 3 and col["nulls"] == 1
    assert col["min"] == finite.min() and col["max"] == finite.max()
    assert col["mean"] == pytest.approx(finite.mean()) and col["std"] == pytest.approx(finite.std(ddof=1))
    assert col["quantiles"]["1.0"] == finite.max()
    json.dumps(col, allow_nan=False)  # strict JSON: no Infinity or NaN anywhere


def test_list_columns_report_lengths_and_element_values():
    lists = [[1, 2, 2], [], None, [3], [2, 2, 2, 2], [None, 1]]
    table = pa.table({"l": pa.array(lists, pa.list_(pa.int64()))})
    col = _by_name(inspect_dataset(ts.Dataset(table, part_size="100B"), progress=False))["l"]
    lengths = pd.Series([len(v) for v in lists if v is not None])
    assert col["list_length"] == {"min": lengths.min(), "max": lengths.max(), "mean": lengths.mean()}
    flat = pd.Series([v for row in lists if row for v in row]).dropna()
    assert col["null_rate"] == pytest.approx(1 / len(lists))
    assert col["distinct"] == flat.nunique()
    assert col["top"][0] == {"value": 2, "count": int((flat == 2).sum())}
    assert col["mean"] == pytest.approx(flat.mean())


def test_quantile_summary_merge_is_exact_while_small():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=500), rng.normal(size=700)
    s = QuantileSummary.of(a).merge(QuantileSummary.of(b))
    both = np.concatenate([a, b])
    for q in (0.1, 0.5, 0.9):
        assert s.quantile(q) == np.quantile(both, q, method="inverted_cdf")


def test_other_types_and_empty_input_give_plain_json():
    import datetime
    import decimal
    import json

    table = pa.table({
        "b": pa.array([True, False, None, True]),
        "ts": pa.array([datetime.datetime(2024, 1, 1), None, datetime.datetime(2024, 1, 2),
                        datetime.datetime(2024, 1, 1)]),
        "dec": pa.array([decimal.Decimal("1.5"), None, decimal.Decimal("2.25"), decimal.Decimal("1.5")]),
        "bin": pa.array([b"\xff\x00", b"a", None, b"a"]),
        "nothing": pa.array([None] * 4, pa.float64()),
        "dict": pa.array(["a", "b", "a", None]).dictionary_encode(),
    })
    cols = _by_name(inspect_dataset(ts.Dataset(table), progress=False))
    assert cols["b"]["top"] == [{"value": True, "count": 2}, {"value": False, "count": 1}]
    assert cols["ts"]["top"][0] == {"value": "2024-01-01T00:00:00", "count": 2}
    assert cols["dec"]["top"][0] == {"value": "1.50", "count": 2}
    assert cols["dec"]["mean"] == pytest.approx((1.5 + 2.25 + 1.5) / 3)
    assert cols["bin"]["distinct"] == 2 and cols["dict"]["distinct"] == 2
    assert cols["nothing"]["null_rate"] == 1.0 and cols["nothing"]["mean"] is None
    empty = inspect_dataset(ts.Dataset(table.slice(0, 0)), progress=False)
    assert empty["num_rows"] == 0
    for report in (cols, _by_name(empty)):
        json.dumps(report, allow_nan=False)  # plain JSON: no NaN, no Python objects


@pytest.mark.parametrize("bad, match", [(0, "top must be a positive int"),
                                        ("3", "top must be a positive int")])
def test_bad_top(bad, match):
    with pytest.raises(ValueError, match=match):
        inspect_dataset(ts.Dataset(pd.DataFrame({"a": [1]})), top=bad)


def test_bad_exact_limit():
    with pytest.raises(ValueError, match=r"exact_limit must be an int >= top \(10\), got 5"):
        inspect_dataset(ts.Dataset(pd.DataFrame({"a": [1]})), exact_limit=5)


def test_categorical_ids_are_charted_by_their_top_values():
    from tabstream import ops

    df = _frame(1, 300)
    wf = ts.Workflow(["c"] >> ops.Categorify())
    encoded = wf.fit_transform(ts.Dataset(df)).compute()
    ds = ts.Dataset(encoded, schema=wf.output_schema)
    col = _by_name(inspect_dataset(ds, progress=False, histograms=True))["c"]
    assert col["tags"] == ["categorical"] and "_summary" in col
    assert chart_kind(col) == "top"
    counts = encoded["c"].value_counts()
    assert col["top"][0] == {"value": int(counts.index[0]), "count": int(counts.iloc[0])}


def test_plots_are_png_files_one_per_column_and_an_overview(tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread

    df = _frame(0, 500)
    df["c c"] = df["c"]  # a name that is not a file name
    report = inspect_dataset(ts.Dataset(df), progress=False, histograms=True)
    written = write_plots(report, str(tmp_path / "plots"))
    names = sorted(p.name for p in (tmp_path / "plots").iterdir())
    assert names == sorted(["x.png", "c.png", "i.png", "c_c.png", "overview.png"])
    assert sorted(written) == sorted(str(tmp_path / "plots" / n) for n in names)
    kinds = {c["name"]: chart_kind(c) for c in report["columns"]}
    assert kinds == {"x": "histogram", "i": "histogram", "c": "top", "c c": "top"}
    for name in names:
        image = imread(tmp_path / "plots" / name)
        assert image.ndim == 3 and image.shape[0] > 100 and image.std() > 0  # not blank

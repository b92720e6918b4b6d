"""Groupby against a plain pandas reference (stable sort by sort_cols, then
``groupby(dropna=False)``), in memory, over many partitions, through export and
save/load."""

import math
import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.dtypes import arrow_type_to_dtype
from tabstream.core.errors import SchemaError

AGGS = {
    "item": ["list", "count", "first", "last", "min", "max"],
    "price": ["sum", "mean", "std", "var", "count", "first", "last", "list", "min", "max"],
    "name": ["list", "count", "first", "last", "min", "max"],
    "qty": ["sum", "mean", "list"],
}


def sessions(n=1500, seed=0, keys=40):
    """Interactions: int session key, float key with NaN/null/-0.0, values with gaps."""
    rng = np.random.default_rng(seed)
    fkey = rng.integers(-3, 4, n).astype(float) / 2
    fkey[rng.random(n) < 0.1] = np.nan
    fkey[(fkey == 0) & (rng.random(n) < 0.5)] = -0.0
    fkey_nulls = rng.random(n) < 0.05
    price = rng.normal(10, 3, n).round(2)
    price[rng.random(n) < 0.1] = np.nan
    name = np.array(["x", "y", "z", "w"], dtype=object)[rng.integers(0, 4, n)]
    name[rng.random(n) < 0.1] = None
    ts_ = rng.integers(0, n // 3, n)  # ties on purpose: a stable sort must keep input order
    return pa.table({
        "session": pa.array(rng.integers(0, keys, n)),
        "fkey": pa.array(np.where(fkey_nulls, None, fkey), pa.float64()),
        "ts": pa.array(ts_),
        "item": pa.array(rng.integers(0, 1000, n)),
        "price": pa.array(price),  # NaN, no nulls: pandas cannot tell them apart
        "name": pa.array(name, pa.string()),
        "qty": pa.array(rng.integers(1, 5, n), pa.int32()),
    })


def reference(table, keys, sort_cols, aggs, ascending=True, sep="-"):
    """Plain pandas: stable sort, groupby with the missing key as a group, sorted keys;
    ``first``/``last`` are the sorted group's first/last value, its last/first when
    ``ascending=False`` (NVTabular: the earliest row by ``sort_cols`` either way)."""
    df = table.to_pandas()
    for k in keys:
        if df[k].dtype.kind == "f":
            df[k] = df[k] + 0.0  # -0.0 and 0.0 are one key
    if sort_cols:
        df = df.sort_values(sort_cols, ascending=ascending, kind="stable", na_position="last")
    grouped = df.groupby(keys, dropna=False, sort=True)
    out = {}
    for col, fns in aggs.items():
        for fn in fns:
            g = grouped[col]
            if fn == "list":
                s = g.agg(list)
            elif fn == "first":
                s = g.agg(lambda v: v.iloc[0 if ascending else -1])
            elif fn == "last":
                s = g.agg(lambda v: v.iloc[-1 if ascending else 0])
            else:
                s = getattr(g, fn)()
            out[f"{col}{sep}{fn}"] = s
    result = pd.DataFrame(out).reset_index()
    return result[[*keys, *out]]


def _same(a, b):
    if isinstance(a, (list, np.ndarray)) and isinstance(b, (list, np.ndarray)):
        return len(a) == len(b) and all(_same(x, y) for x in zip(a, b) for x, y in [x])
    missing_a = a is None or a is pd.NA or (isinstance(a, float) and math.isnan(a))
    missing_b = b is None or b is pd.NA or (isinstance(b, float) and math.isnan(b))
    if missing_a or missing_b:
        return missing_a and missing_b
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def assert_matches(result, expected):
    """``result`` (Arrow table) equals the pandas reference, row by row (missing == missing)."""
    assert result.column_names == list(expected.columns)
    assert result.num_rows == len(expected)
    for name in result.column_names:
        got = result.column(name).to_pylist()
        want = [v.tolist() if isinstance(v, np.ndarray) else v for v in expected[name].tolist()]
        for i, (a, b) in enumerate(zip(got, want)):
            assert _same(a, b), f"column {name!r}, row {i}: {a!r} != {b!r}"


def sort_by_keys(table, keys):
    """Export order is by bucket; put rows in key order (missing key last) to compare."""
    return table.take(pa.compute.sort_indices(table, sort_keys=[(k, "ascending", "at_end") for k in keys]))


def read_export(path):
    return ts.Dataset(str(path)).to_ddf().compute()


# -- in memory ------------------------------------------------------------------


@pytest.mark.parametrize("ascending", [True, False])
@pytest.mark.parametrize("keys", [["session"], ["fkey"], ["session", "fkey"]])
def test_matches_pandas_in_memory(keys, ascending):
    table = sessions()
    op = ops.Groupby(keys, sort_cols=["ts"], aggs=AGGS, ascending=ascending)
    result = op.transform(table)
    assert_matches(result, reference(table, keys, ["ts"], AGGS, ascending))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("ascending", [True, False])
def test_first_is_the_earliest_row_by_sort_cols_in_either_direction(seed, ascending):
    """NVTabular's rule, checked on the values themselves: ``list`` follows the sort
    direction, ``first`` is the smallest ``ts`` of the group and ``last`` the largest."""
    rng = np.random.default_rng(seed)
    n = 200
    df = pd.DataFrame({"s": rng.integers(0, 12, n), "ts": rng.permutation(n).astype(np.int64),
                       "x": rng.permutation(n).astype(np.int64)})
    op = ops.Groupby("s", sort_cols="ts", aggs={"ts": ["list", "first", "last"], "x": ["first", "last"]},
                     ascending=ascending)
    out = op.transform(pa.Table.from_pandas(df, preserve_index=False)).to_pandas()
    by_ts = df.sort_values("ts").groupby("s")
    assert out["ts-first"].tolist() == by_ts["ts"].min().tolist()
    assert out["ts-last"].tolist() == by_ts["ts"].max().tolist()
    assert out["x-first"].tolist() == by_ts["x"].first().tolist()
    assert out["x-last"].tolist() == by_ts["x"].last().tolist()
    lists = by_ts["ts"].agg(list).tolist()
    assert [list(v) for v in out["ts-list"]] == (lists if ascending else [v[::-1] for v in lists])


def test_list_aggs_apply_to_every_non_key_column_and_follow_sort_order():
    table = sessions().select(["session", "ts", "item", "name"])
    op = ops.Groupby("session", sort_cols=["ts", "item"], aggs=["list", "count"], name_sep="_")
    result = op.transform(table)
    aggs = {c: ["list", "count"] for c in ("ts", "item", "name")}
    assert_matches(result, reference(table, ["session"], ["ts", "item"], aggs, sep="_"))


def test_without_sort_cols_input_order_is_kept():
    table = sessions()
    result = ops.Groupby("session", aggs={"item": ["list", "first", "last"]}).transform(table)
    assert_matches(result, reference(table, ["session"], [], {"item": ["list", "first", "last"]}))


def test_missing_keys_form_one_group_and_negative_zero_is_zero():
    keys = pa.array([0.0, -0.0, None, float("nan"), 1.5, None, -0.0], pa.float64())
    table = pa.table({"k": keys, "v": pa.array(np.arange(len(keys)))})
    result = ops.Groupby("k", aggs=["list"]).transform(table)
    py = keys.to_pylist()
    zeros = [i for i, k in enumerate(py) if k is not None and k == 0]
    missing = [i for i, k in enumerate(py) if k is None or math.isnan(k)]
    ones = [i for i, k in enumerate(py) if k == 1.5]
    assert result.column("k").to_pylist() == [0.0, 1.5, None]
    assert math.copysign(1, result.column("k")[0].as_py()) == 1  # the zero key is +0.0
    assert result.column("v-list").to_pylist() == [zeros, ones, missing]


def test_missing_values_skipped_by_stats_kept_by_list_first_last():
    v = [None, 1.0, float("nan"), 4.0, None]
    table = pa.table({"k": [1, 1, 1, 1, 2], "v": pa.array(v, pa.float64())})
    result = ops.Groupby("k", aggs=["count", "sum", "mean", "min", "max", "list", "first", "last"]).transform(table)
    present = [x for x in v[:4] if x is not None and not math.isnan(x)]
    row = result.to_pylist()[0]
    assert row["v-count"] == len(present)
    assert row["v-sum"] == sum(present) and row["v-mean"] == np.mean(present)
    assert (row["v-min"], row["v-max"]) == (min(present), max(present))
    assert row["v-first"] is None and row["v-last"] == v[3]
    lst = row["v-list"]
    assert lst[0] is None and lst[1] == v[1] and math.isnan(lst[2]) and lst[3] == v[3]
    other = result.to_pylist()[1]  # only a null: count 0, sum 0 (pandas), others null
    assert other["v-count"] == 0 and other["v-sum"] == 0
    assert other["v-mean"] is None and other["v-min"] is None and other["v-list"] == [None]


def test_list_columns_concatenate_in_sort_order():
    rng = np.random.default_rng(3)
    n = 200
    lists = [None if rng.random() < 0.1 else list(rng.integers(0, 9, rng.integers(0, 4))) for _ in range(n)]
    table = pa.table({"k": rng.integers(0, 12, n), "ts": rng.permutation(n), "l": pa.array(lists, pa.list_(pa.int64()))})
    result = ops.Groupby("k", sort_cols="ts", aggs=["list", "first", "last", "count"]).transform(table)
    df = table.to_pandas().sort_values("ts", kind="stable")
    for row in result.to_pylist():
        rows = [None if x is None else list(x) for x in df.loc[df["k"] == row["k"], "l"]]
        assert row["l-list"] == [v for x in rows if x is not None for v in x]
        assert row["l-first"] == rows[0] and row["l-last"] == rows[-1]
        assert row["l-count"] == sum(x is not None for x in rows)


def test_output_schema_names_and_dtypes():
    table = sessions()
    wf = ts.Workflow(["session", "ts", "item", "price", "name", "qty"] >> ops.Groupby(
        "session", sort_cols="ts", aggs={"item": ["list", "count"], "price": ["mean", "sum", "first"],
                                         "qty": ["sum", "max"], "name": ["last", "list"]}))
    wf.fit(ts.Dataset(table))
    schema = wf.output_schema
    expected = {
        "session": ("int64", False), "item-list": ("int64", True), "item-count": ("int64", False),
        "price-mean": ("float64", False), "price-sum": ("float64", False), "price-first": ("float64", False),
        "qty-sum": ("int64", False), "qty-max": ("int32", False),
        "name-last": ("string", False), "name-list": ("string", True),
    }
    assert {c.name: (c.dtype, c.is_list) for c in schema} == expected
    assert schema.column_names == list(expected)
    # NVTabular's tags: a list aggregation keeps the input column's tags, adds none
    assert schema["item-list"].is_ragged and schema["item-list"].tags == frozenset()
    out = wf.transform(table)
    assert [arrow_type_to_dtype(t) for t in out.schema.types] == list(expected.values())


def test_bool_float32_and_timestamp_columns_keep_declared_types():
    stamps = pd.to_datetime(["2020-01-03", None, "2020-01-01", "2020-01-02", "2020-01-05"])
    table = pa.table({"k": pa.array(["a", None, "a", "b", None]),
                      "b": pa.array([True, False, None, True, True]),
                      "f": pa.array([1.5, None, 2.5, float("nan"), 4.0], pa.float32()),
                      "t": pa.array(stamps)})
    aggs = {"b": ["sum", "mean", "count", "max"], "f": ["sum", "min", "list"], "t": ["min", "max", "last"]}
    wf = ts.Workflow(["k", "b", "f", "t"] >> ops.Groupby("k", aggs=aggs))
    wf.fit(ts.Dataset(table))
    out = wf.transform(table)  # the executor checks produced types against the declared schema
    assert out.schema.field("f-min").type == pa.float32() and out.schema.field("t-min").type == table["t"].type
    df = table.to_pandas()
    for row in out.to_pylist():
        rows = df[df["k"].isna()] if row["k"] is None else df[df["k"] == row["k"]]
        bools = [v for v in rows["b"] if v is not None]
        assert row["b-sum"] == sum(bools) and row["b-count"] == len(bools)
        floats = rows["f"].dropna()
        assert row["f-sum"] == pytest.approx(floats.sum())
        assert row["f-min"] == (floats.min() if len(floats) else None)
        assert row["t-min"] == rows["t"].min() and row["t-last"] == (None if pd.isna(rows["t"].iloc[-1])
                                                                     else rows["t"].iloc[-1])


def test_empty_input_gives_empty_output_with_declared_columns():
    table = sessions().slice(0, 0)
    result = ops.Groupby("session", sort_cols="ts", aggs=AGGS).transform(table)
    assert result.num_rows == 0
    assert result.column_names == list(reference(sessions(), ["session"], ["ts"], AGGS).columns)


# -- across partitions ------------------------------------------------------------


def _spread_over_partitions(table, part_size):
    ds = ts.Dataset(table, part_size=part_size)
    assert ds.npartitions > 3
    seen = {}
    for i, piece in enumerate(ds.pieces):
        for k in set(ds.read_piece(piece, ["session"]).column("session").to_pylist()):
            seen.setdefault(k, set()).add(i)
    assert any(len(v) > 1 for v in seen.values()), "the test needs keys that span partitions"
    return ds


def test_keys_spanning_partitions_are_grouped_once(tmp_path):
    table = sessions(n=3000)
    ds = _spread_over_partitions(table, part_size=8192)
    node = ["session", "ts", "item", "price", "name", "qty"] >> ops.Groupby("session", sort_cols="ts", aggs=AGGS)
    wf = ts.Workflow(node)
    wf.fit(ds)
    expected = reference(table, ["session"], ["ts"], AGGS)
    lazy = wf.transform(ds)
    assert 1 < lazy.npartitions <= ds.npartitions  # buckets sized by the bytes read

    computed = pa.Table.from_pandas(lazy.compute(), preserve_index=False)
    assert_matches(sort_by_keys(computed, ["session"]), expected)
    iterated = pa.concat_tables(pa.Table.from_pandas(df, preserve_index=False) for df in lazy.to_iter())
    assert_matches(sort_by_keys(iterated, ["session"]), expected)

    via_dask = pa.Table.from_pandas(lazy.to_ddf().compute(), preserve_index=False)
    assert_matches(sort_by_keys(via_dask, ["session"]), expected)

    result = lazy.to_parquet(str(tmp_path / "out"), out_files_per_proc=2)
    assert result.num_rows == len(expected)
    assert sorted(os.listdir(tmp_path)) == ["out"]  # the spill folder is gone
    exported = pa.Table.from_pandas(read_export(tmp_path / "out"), preserve_index=False)
    assert_matches(sort_by_keys(exported, ["session"]), expected)


def test_float_and_missing_keys_across_partitions(tmp_path):
    table = sessions(n=2000)
    ds = ts.Dataset(table, part_size=4096)
    wf = ts.Workflow(["fkey", "session", "ts", "item"] >> ops.Groupby(["fkey", "session"], sort_cols="ts",
                                                                     aggs={"item": ["list", "count"]}))
    wf.fit(ds)
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    exported = pa.Table.from_pandas(read_export(tmp_path / "out"), preserve_index=False)
    expected = reference(table, ["fkey", "session"], ["ts"], {"item": ["list", "count"]})
    assert_matches(sort_by_keys(exported, ["fkey", "session"]), expected)


def test_save_load_and_ops_before_and_after(tmp_path):
    table = sessions(n=2500)
    ds = _spread_over_partitions(table, part_size=8192)
    items = ["item"] >> ops.Categorify()
    grouped = (["session", "ts"] + items) >> ops.Groupby("session", sort_cols="ts", aggs={"item": "list"})
    wf = ts.Workflow((grouped - ["item-list"]) + ((grouped - ["session"]) >> ops.ListSlice(-3)))
    wf.fit(ds)
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    again.transform(ts.Dataset(table, part_size=8192)).to_parquet(str(tmp_path / "out"))
    exported = sort_by_keys(pa.Table.from_pandas(read_export(tmp_path / "out"), preserve_index=False),
                            ["session"])

    # reference: Categorify's ids fitted alone on all rows, pandas grouping, last three ids
    ids = ts.Workflow(["item"] >> ops.Categorify())
    ids.fit(ds)
    coded = table.set_column(table.schema.get_field_index("item"), "item", ids.transform(table).column("item"))
    expected = reference(coded, ["session"], ["ts"], {"item": ["list"]})
    expected["item-list"] = expected["item-list"].map(lambda v: v[-3:])
    assert_matches(exported, expected)
    assert again.output_schema == wf.output_schema


# -- errors -------------------------------------------------------------------------


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({}, ValueError, "groupby_cols is required"),
    ({"groupby_cols": 3}, TypeError, "groupby_cols must be a column name or a list"),
    ({"groupby_cols": ["s", "s"]}, ValueError, r"names a column twice: \['s', 's'\]"),
    ({"groupby_cols": "s", "aggs": "mode"}, ValueError, r"unknown aggregation 'mode'.*supported: \['count'"),
    ({"groupby_cols": "s", "aggs": {"v": ["sum", "avg"]}}, ValueError, r"unknown aggregation 'avg' in aggs\['v'\]"),
    ({"groupby_cols": "s", "aggs": {"s": "count"}}, ValueError, "aggs names the key column 's'"),
    ({"groupby_cols": "s", "aggs": {}}, ValueError, "aggs is an empty dict"),
    ({"groupby_cols": "s", "aggs": []}, TypeError, "non-empty list of names"),
    ({"groupby_cols": "s", "ascending": "yes"}, TypeError, "ascending must be True or False, got 'yes'"),
    ({"groupby_cols": "s", "name_sep": None}, TypeError, "name_sep must be a string"),
])
def test_bad_parameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        ops.Groupby(**kwargs)


def _fit(node, table):
    wf = ts.Workflow(node)
    wf.fit(ts.Dataset(table))
    return wf


@pytest.mark.parametrize(("node", "error", "match"), [
    (lambda: ["session", "item"] >> ops.Groupby("session", sort_cols="ts"), SchemaError,
     r"sort_cols \['ts'\] are not among"),
    (lambda: ["session", "item"] >> ops.Groupby("session", aggs={"price": "mean"}), SchemaError,
     r"aggs names columns \['price'\]"),
    (lambda: ["session", "name"] >> ops.Groupby("session", aggs={"name": "mean"}), TypeError,
     r"'mean' needs a numeric column, but 'name' is string"),
    (lambda: ["session", "lst"] >> ops.Groupby("session", aggs={"lst": "sum"}), TypeError,
     r"'sum' needs a numeric column, but 'lst' is a list of int64"),
    (lambda: ["session", "lst"] >> ops.Groupby("session", aggs={"lst": "max"}), TypeError,
     r"'max' does not apply to the list column 'lst'"),
    (lambda: ["lst", "item"] >> ops.Groupby("lst"), TypeError, "key column 'lst' is a list column"),
    (lambda: (["session", "item"] >> ops.Groupby("session")) + (["ts", "qty"] >> ops.Groupby("ts")),
     ValueError, "a workflow can hold one Groupby, this one has 2"),
    (lambda: ["session", "item"] >> ops.Groupby("session", aggs="count") >> ops.Normalize(), ValueError,
     r"Normalize\(.*\) comes after Groupby\(.*fitted on partitions that are not grouped"),
])
def test_bad_graphs(node, error, match):
    table = sessions(n=50).append_column("lst", pa.array([[1, 2]] * 50, pa.list_(pa.int64())))
    with pytest.raises(error, match=match):
        _fit(node(), table)


def test_branch_that_bypasses_the_groupby_is_refused_across_partitions(tmp_path):
    table = sessions(n=2000)
    node = (["session", "item"] >> ops.Groupby("session", aggs="count")) + ["ts"]
    wf = _fit(node, table)
    with pytest.raises(SchemaError, match="cannot put columns with different row counts side by side"):
        wf.transform(ts.Dataset(table, part_size=4096)).compute()


@pytest.mark.parametrize("source", ["dataframe", "parquet"])
def test_bucket_count_follows_the_bytes_of_the_columns_read(tmp_path, source):
    # Before: one bucket per input partition, so P * P spill files even when the
    # Groupby reads two small columns of wide rows.
    rng = np.random.default_rng(0)
    n = 4000
    df = pd.DataFrame({"k": rng.integers(0, 300, n), "v": rng.random(n),
                       "payload": [f"{'x' * 60}{i}" for i in range(n)]})
    if source == "parquet":
        ts.Dataset(df).to_parquet(str(tmp_path / "raw"), num_files=1, row_group_size=200)
        ds = ts.Dataset(str(tmp_path / "raw"), part_size=8192)
        md = pq.ParquetFile(next((tmp_path / "raw").glob("*.parquet"))).metadata
        sizes = [(md.row_group(i).column(j).path_in_schema, md.row_group(i).column(j).total_uncompressed_size)
                 for i in range(md.num_row_groups) for j in range(md.num_columns)]
        share = sum(sz for name, sz in sizes if name in ("k", "v")) / sum(sz for _, sz in sizes)
    else:
        table = pa.Table.from_pandas(df, preserve_index=False)
        ds = ts.Dataset(table, part_size=8192)
        share = table.select(["k", "v"]).nbytes / table.nbytes
    wf = ts.Workflow(["k", "v"] >> ops.Groupby("k", aggs={"v": ["sum", "count"]})).fit(ds)
    lazy = wf.transform(ds)
    assert ds.npartitions > 10
    assert lazy.npartitions == max(1, math.ceil(ds.npartitions * share)) < ds.npartitions
    got = lazy.compute().sort_values("k").reset_index(drop=True)
    expected = df.groupby("k").v.agg(["sum", "count"]).reset_index()
    np.testing.assert_array_equal(got["k"].to_numpy(), expected["k"].to_numpy())
    np.testing.assert_allclose(got["v-sum"].to_numpy(), expected["sum"].to_numpy())
    np.testing.assert_array_equal(got["v-count"].to_numpy(), expected["count"].to_numpy())


@pytest.mark.parametrize("seed", [0, 3])
def test_median_and_nunique_match_pandas(seed):
    """NVTabular's ``median`` and ``nunique`` aggregations: exact median of the
    non-missing values, distinct non-missing values, as pandas computes them."""
    table = sessions(n=600, seed=seed, keys=25)
    # a group whose every price is missing: median null, nunique 0
    table = pa.concat_tables([table, pa.table({
        "session": pa.array([999, 999]), "fkey": pa.array([None, None], pa.float64()),
        "ts": pa.array([1, 2]), "item": pa.array([1, 1]), "price": pa.array([np.nan, np.nan]),
        "name": pa.array([None, None], pa.string()), "qty": pa.array([1, 2], pa.int32())})])
    aggs = {"price": ["median", "nunique"], "name": ["nunique"], "qty": ["median", "nunique"]}
    out = ts.Workflow(["price", "name", "qty"] >> ops.Groupby("session", aggs=aggs)).transform(table)
    df = table.to_pandas()
    g = df.groupby("session")
    expected = pd.DataFrame({
        "session": sorted(df["session"].unique()),
        "price-median": g["price"].median().sort_index().to_numpy(),
        "price-nunique": g["price"].nunique().sort_index().to_numpy(),
        "name-nunique": g["name"].nunique().sort_index().to_numpy(),
        "qty-median": g["qty"].median().sort_index().to_numpy(),
        "qty-nunique": g["qty"].nunique().sort_index().to_numpy(),
    })
    got = out.to_pandas()
    assert got.columns.tolist() == expected.columns.tolist()
    assert got["session"].tolist() == expected["session"].tolist()
    np.testing.assert_allclose(got["price-median"].to_numpy(dtype=float), expected["price-median"], equal_nan=True)
    np.testing.assert_allclose(got["qty-median"].to_numpy(dtype=float), expected["qty-median"])
    for name in ("price-nunique", "name-nunique", "qty-nunique"):
        assert got[name].tolist() == expected[name].tolist(), name
    assert out.schema.field("price-median").type == pa.float64()
    assert out.schema.field("name-nunique").type == pa.int64()
    assert math.isnan(got["price-median"].iloc[-1]) and got["price-nunique"].iloc[-1] == 0


@pytest.mark.parametrize("source", ["dataframe", "parquet"])
def test_category_columns_as_keys_sort_columns_and_min_max(tmp_path, source):
    """pandas' category columns (Arrow dictionaries, also as parquet writes them back)
    as the key, a sort column and a min/max value: decoded first (they crashed in
    Arrow's group-by and sorts); the same as pandas on the plain strings."""
    rng = np.random.default_rng(2)
    n = 400
    df = pd.DataFrame({
        "s": pd.Categorical(rng.choice(["b", "a", "c", None], n)),
        "t": pd.Categorical(rng.choice(["x", "z", "y"], n)),
        "p": rng.normal(size=n).round(3),
    })
    if source == "parquet":
        df.to_parquet(tmp_path / "x.parquet")
        ds = ts.Dataset(str(tmp_path))
        assert pa.types.is_dictionary(ds.arrow_schema.field("s").type)
    else:
        ds = ts.Dataset(df)
    node = ["s", "t", "p"] >> ops.Groupby("s", sort_cols="t", aggs={"p": ["sum"], "t": ["min", "max", "first"]})
    out = ts.Workflow(node).fit(ds).transform(ds).compute()
    plain = df.astype({"s": object, "t": object})
    grouped = plain.sort_values("t", kind="stable").groupby("s", dropna=False, sort=True)
    expected = pd.DataFrame({"p-sum": grouped["p"].sum(), "t-min": grouped["t"].min(),
                             "t-max": grouped["t"].max(), "t-first": grouped["t"].first()})
    got = out.set_index("s")
    assert got.index.tolist()[:-1] == expected.index.tolist()[:-1] == ["a", "b", "c"]
    assert pd.isna(got.index[-1]) and pd.isna(expected.index[-1])
    np.testing.assert_allclose(got["p-sum"].to_numpy(), expected["p-sum"].to_numpy())
    for col in ("t-min", "t-max", "t-first"):
        assert got[col].tolist() == expected[col].tolist()

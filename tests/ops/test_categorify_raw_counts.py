"""Columns with nearly every value distinct skip the per-partition count: their values
go to the merges as they are (``Categorify._raw_counts``). The vocabulary must be the
one pandas counts, whatever the number of partitions, spilling, a threshold, and
partitions that take different paths."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabstream as ts
from tabstream import ops
from tabstream.ops import categorify


def reference_vocabulary(values, freq_threshold=0):
    counts = pd.Series([v for v in values if v is not None]).value_counts()
    kept = sorted(((v, int(c)) for v, c in counts.items() if c >= max(freq_threshold, 1)),
                  key=lambda kv: (-kv[1], kv[0]))
    return [v for v, _ in kept], [c for _, c in kept]


def high_cardinality(rng, n, spread, null_share=0.05):
    values = np.array([f"u{x:07d}" for x in rng.integers(0, spread, n)], dtype=object)
    values[rng.random(n) < null_share] = None
    return list(values)


@pytest.fixture
def raw_calls(monkeypatch):
    """How many partitions took the raw path, and how many were counted."""
    calls = {"raw": 0, "counted": 0}
    original = categorify.Categorify._raw_counts

    def spy(column):
        out = original(column)
        calls["raw" if out is not None else "counted"] += 1
        return out

    monkeypatch.setattr(categorify.Categorify, "_raw_counts", staticmethod(spy))
    return calls


def write_parts(tmp_path, parts):
    files = []
    for i, values in enumerate(parts):
        path = tmp_path / f"part{i}.parquet"
        # stored plain, as parquet writers store such columns once the dictionary
        # outgrows its page (a dictionary-encoded column is read as a dictionary)
        pq.write_table(pa.table({"hi": pa.array(values, pa.string())}), path, use_dictionary=False)
        files.append(str(path))
    return files


@pytest.mark.parametrize("n_parts", [1, 3])
@pytest.mark.parametrize("freq_threshold", [0, 2])
def test_vocabulary_of_a_nearly_distinct_column_matches_pandas(tmp_path, raw_calls, n_parts, freq_threshold):
    rng = np.random.default_rng(5)
    parts = [high_cardinality(rng, 40_000, 120_000) for _ in range(n_parts)]
    cat = ops.Categorify(freq_threshold=freq_threshold)
    ts.Workflow(["hi"] >> cat).fit(ts.Dataset(write_parts(tmp_path, parts)))
    assert raw_calls == {"raw": n_parts, "counted": 0}
    values, counts = reference_vocabulary([v for p in parts for v in p], freq_threshold)
    assert cat.tables["hi"]["values"].to_pylist() == values
    assert cat.tables["hi"]["counts"].to_pylist() == counts


def test_spilled_raw_partials_are_aggregated(tmp_path, raw_calls):
    rng = np.random.default_rng(6)
    parts = [high_cardinality(rng, 40_000, 60_000) for _ in range(4)]
    spill = tmp_path / "spill"
    spill.mkdir()
    cat = ops.Categorify(spill_rows=10_000, spill_buckets=5, spill_dir=str(spill))
    ts.Workflow(["hi"] >> cat).fit(ts.Dataset(write_parts(tmp_path, parts)))
    assert raw_calls["raw"] == 4
    values, counts = reference_vocabulary([v for p in parts for v in p])
    assert cat.tables["hi"]["values"].to_pylist() == values
    assert cat.tables["hi"]["counts"].to_pylist() == counts
    assert list(spill.iterdir()) == []


def test_partitions_taking_both_paths_merge_to_the_pandas_counts(tmp_path, raw_calls):
    """One partition starts with distinct values (raw), the other with a run of one
    value (counted); their values overlap."""
    rng = np.random.default_rng(7)
    first = high_cardinality(rng, 40_000, 50_000)
    second = ["u0000001"] * 3000 + high_cardinality(rng, 37_000, 50_000)
    cat = ops.Categorify()
    wf = ts.Workflow(["hi"] >> cat).fit(ts.Dataset(write_parts(tmp_path, [first, second])))
    assert raw_calls == {"raw": 1, "counted": 1}
    values, counts = reference_vocabulary(first + second)
    assert cat.tables["hi"]["values"].to_pylist() == values
    assert cat.tables["hi"]["counts"].to_pylist() == counts
    # and the ids follow the vocabulary's order (3 = the most frequent value)
    ids = wf.transform(pd.DataFrame({"hi": pd.array(["u0000001", None, "never"], dtype="str")}))["hi"]
    assert ids.tolist() == [3, 1, 2]


def test_small_or_repetitive_partitions_are_counted(raw_calls):
    rng = np.random.default_rng(8)
    small = pa.array(high_cardinality(rng, 1000, 10**6))
    repetitive = pa.array([f"v{x}" for x in rng.integers(0, 300, 50_000)])
    assert categorify.Categorify._raw_counts(small) is None
    assert categorify.Categorify._raw_counts(repetitive) is None
    assert raw_calls == {"raw": 0, "counted": 2}


@pytest.mark.parametrize("rows", [30, 60_000])  # one aggregation; bucket by bucket
def test_merging_raw_partials_aggregates_every_bucket(rows):
    """A bucket holding rows of a raw partial only, and a raw partial merged alone,
    are aggregated too (merging counted partials may pass a lone table through)."""
    cat = ops.Categorify(spill_buckets=8)
    values = ["a", "b", "a"] * (rows // 3)
    raw = categorify._Counts(pa.table({"values": pa.array(values)}))  # as _raw_counts makes them
    counted = categorify._Counts(pa.table({"values": pa.array(["b", "zz"]), "counts": pa.array([5, 1])}))
    for parts, expected in (([raw], {"a": 2 * rows // 3, "b": rows // 3}),
                            ([raw, counted], {"a": 2 * rows // 3, "b": rows // 3 + 5, "zz": 1})):
        merged = cat._merge_tables(parts)
        assert merged.distinct
        got = merged.table.to_pydict()
        assert dict(zip(got["values"], got["counts"])) == expected
        assert len(got["values"]) == len(expected)


@pytest.mark.parametrize("kind", ["int64", "float64"])
def test_nearly_distinct_numbers_match_pandas(tmp_path, raw_calls, kind):
    """Integer ids, and floats with NaN (missing) and -0.0 (counted as 0.0), take the
    same path."""
    rng = np.random.default_rng(9)
    parts = []
    for _ in range(2):
        x = rng.integers(-60_000, 60_000, 40_000)
        if kind == "int64":
            parts.append(pa.array(x, pa.int64()))
        else:
            f = x.astype(np.float64) / 7
            f[rng.random(len(f)) < 0.05] = np.nan
            f[rng.random(len(f)) < 0.01] = -0.0
            f[rng.random(len(f)) < 0.01] = 0.0
            parts.append(pa.array(f))
    files = []
    for i, arr in enumerate(parts):
        path = tmp_path / f"n{i}.parquet"
        pq.write_table(pa.table({"hi": arr}), path, use_dictionary=False)
        files.append(str(path))
    cat = ops.Categorify()
    ts.Workflow(["hi"] >> cat).fit(ts.Dataset(files))
    assert raw_calls["raw"] == 2
    values = [v for arr in parts for v in arr.to_pylist()]
    values = [None if v is None or v != v else (0.0 if v == 0 else v) for v in values]
    expected_values, expected_counts = reference_vocabulary(values)
    assert cat.tables["hi"]["values"].to_pylist() == expected_values
    assert cat.tables["hi"]["counts"].to_pylist() == expected_counts


def test_raw_partials_hold_their_values_alone():
    rng = np.random.default_rng(9)
    column = pa.array(high_cardinality(rng, 50_000, 10**7))
    raw = categorify.Categorify._raw_counts(column)
    assert raw.column_names == ["values"]  # one occurrence per row, no column of ones
    assert raw["values"].to_pylist() == [v for v in column.to_pylist() if v is not None]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.tuples(st.booleans(), st.lists(st.sampled_from("abcdefghij"), max_size=30)),
                      min_size=1, max_size=12),
       spill_rows=st.integers(1, 40), buckets=st.integers(1, 5), per_combination=st.integers(2, 4))
def test_raw_and_counted_partials_through_any_merge_and_spill(tmp_path, parts, spill_rows, buckets,
                                                               per_combination):
    """Partials of values alone (raw) and counted ones, combined in levels as a fit
    does, spilled as they are or merged (both kinds in one spill: the raw rows' counts
    are absent there), then finalized: every value's count is the plain count."""
    from collections import Counter

    op = ops.Categorify(spill_rows=spill_rows, spill_buckets=buckets, spill_dir=str(tmp_path))
    level = []
    for raw, values in parts:
        if raw:
            level.append({"c": categorify._Counts(pa.table({"values": pa.array(values, pa.string())}))})
        else:
            counted = Counter(values)
            level.append({"c": categorify._Counts(pa.table({
                "values": pa.array(list(counted), pa.string()),
                "counts": pa.array(list(counted.values()), pa.int64())}))})
    while len(level) > per_combination:
        level = [op.combine(level[i:i + per_combination]) for i in range(0, len(level), per_combination)]
    op.finalize(op.combine_root(level))
    expected = Counter(v for _, values in parts for v in values)
    got = op.tables["c"].to_pydict()
    assert dict(zip(got["values"], got["counts"])) == dict(expected)
    assert len(got["values"]) == len(expected)
    assert list(tmp_path.iterdir()) == []

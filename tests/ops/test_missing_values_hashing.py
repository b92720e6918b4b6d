"""Missing is missing in Categorify, HashBucket and HashedCross.

Every op sees frames holding NaN, null, -0.0, 0.0, empty strings and +-inf, read
from pandas (NaN becomes null), from an arrow table and from parquet (NaN stays
NaN), in one and in several partitions. Expected ids come from plain pandas/numpy:
a vocabulary from ``value_counts(dropna=True)`` after mapping -0.0 to 0.0, hashes
from ``murmur3_32`` of single values.
"""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.hashing import hash_combine, murmur3_32

SOURCES = ["pandas", "arrow", "parquet"]
PARTS = [1, 5]


# -- plain references -------------------------------------------------------


def is_missing(v):
    return v is None or (isinstance(v, float) and math.isnan(v))


def canon(v):
    """The value an op should see: None for null/NaN, 0.0 for -0.0."""
    if is_missing(v):
        return None
    if isinstance(v, float) and v == 0.0:
        return 0.0
    return v


def vocabulary_ref(values, freq_threshold=0, limit=None):
    """Vocabulary in id order: pandas value_counts, ties by value."""
    counts = pd.Series([canon(v) for v in values], dtype=object).value_counts(dropna=True)
    kept = sorted(((v, c) for v, c in counts.items() if c >= max(freq_threshold, 1)), key=lambda kv: (-kv[1], kv[0]))
    return [v for v, _ in kept][:limit]


def one_hash(v):
    if isinstance(v, float):
        return int(murmur3_32(np.array([v], dtype=np.float64))[0])
    return int(murmur3_32(pa.array([v]))[0])


def categorify_ref(train, apply, num_buckets=None, freq_threshold=0, limit=None):
    start = 2 + (num_buckets or 1)
    mapping = {v: start + i for i, v in enumerate(vocabulary_ref(train, freq_threshold, limit))}

    def one(v):
        v = canon(v)
        if v is None:
            return 1
        if v in mapping:
            return mapping[v]
        return 2 + one_hash(v) % num_buckets if num_buckets else 2

    return [one(v) for v in apply]


# -- data and running ---------------------------------------------------------

FLOATS = [0.0, -0.0, 1.5, -2.5, math.inf, -math.inf, math.nan, None, 7.0]
STRINGS = ["a", "", "bb", None, "", "ccc", "a"]


def float_values(n=240, seed=0):
    rng = np.random.default_rng(seed)
    # uneven weights, so the vocabulary order is by count, not by chance
    weights = np.array([6, 5, 4, 3, 3, 2, 4, 4, 1], dtype=float)
    idx = rng.choice(len(FLOATS), size=n, p=weights / weights.sum())
    return [FLOATS[i] for i in idx]


def string_values(n=240, seed=1):
    rng = np.random.default_rng(seed)
    return [STRINGS[i] for i in rng.integers(0, len(STRINGS), n)]


def float_array(values, type_=None):
    """An arrow float array keeping NaN as NaN and None as null."""
    return pa.array(values, type_ or pa.float64(), from_pandas=False)


def make_dataset(table, source, parts, tmp_path):
    rows = table.num_rows
    if source == "parquet":
        path = tmp_path / "data.parquet"
        pq.write_table(table, path, row_group_size=math.ceil(rows / parts))
        ds = ts.Dataset(str(path), part_size=1 if parts > 1 else None)
    else:
        data = table.to_pandas() if source == "pandas" else table
        ds = ts.Dataset(data, part_size=max(1, table.nbytes // parts) if parts > 1 else None)
    assert ds.npartitions >= parts
    return ds


def fit_transform(node, table, source, parts, tmp_path):
    ds = make_dataset(table, source, parts, tmp_path)
    wf = ts.Workflow(node).fit(ds)
    out = wf.transform(ds).compute()
    return wf, out


def pylist(column):
    """A pandas output column as Python ints / lists of ints / None."""
    return pa.array(column, from_pandas=True).to_pylist()


def test_sources_really_differ_in_nan(tmp_path):
    table = pa.table({"x": float_array([1.0, math.nan, None])})
    make_dataset(table, "parquet", 1, tmp_path)
    stored = pq.read_table(tmp_path / "data.parquet").column("x")
    assert stored.null_count == 1 and np.isnan(stored.to_numpy(zero_copy_only=False)).sum() == 2
    assert pa.Table.from_pandas(table.to_pandas()).column("x").null_count == 2


# -- Categorify ---------------------------------------------------------------


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("parts", PARTS)
@pytest.mark.parametrize("num_buckets", [None, 3])
def test_categorify_floats_strings(tmp_path, source, parts, num_buckets):
    xs, ss = float_values(), string_values()
    table = pa.table({"x": float_array(xs), "s": pa.array(ss, pa.string())})
    op = ops.Categorify(num_buckets=num_buckets, freq_threshold=2)
    wf, out = fit_transform(["x", "s"] >> op, table, source, parts, tmp_path)
    assert pylist(out["x"]) == categorify_ref(xs, xs, num_buckets, 2)
    assert pylist(out["s"]) == categorify_ref(ss, ss, num_buckets, 2)
    # one vocabulary entry for 0.0, none for NaN; "" and +-inf are values
    vocab = op.tables["x"]["values"].to_pylist()
    assert vocab == vocabulary_ref(xs, 2)
    assert sum(v == 0.0 for v in vocab) == 1 and not any(math.isnan(v) for v in vocab)
    assert {math.inf, -math.inf} <= set(vocab)
    assert "" in op.tables["s"]["values"].to_pylist()
    start = 2 + (num_buckets or 1)
    assert wf.output_schema["x"].cardinality == start + len(vocabulary_ref(xs, 2))


@pytest.mark.parametrize("type_", [pa.float32(), pa.float64()])
def test_categorify_transform_maps_nan_and_negative_zero(type_):
    op = ops.Categorify().fit_table(pa.table({"x": float_array([0.0, 0.0, 2.0, None], type_)}))
    apply = [-0.0, math.nan, None, 2.0, 0.0, math.inf]
    got = op.transform(pa.table({"x": float_array(apply, type_)}))["x"].to_pylist()
    assert got == categorify_ref([0.0, 0.0, 2.0, None], apply)
    assert got[:3] == [3, 1, 1]


@pytest.mark.parametrize("source", ["arrow", "parquet"])
@pytest.mark.parametrize("parts", PARTS)
def test_categorify_float_lists(tmp_path, source, parts):
    rng = np.random.default_rng(4)
    rows = []
    for i in range(120):
        rows.append(None if i % 17 == 3 else [FLOATS[j] for j in rng.integers(0, len(FLOATS), rng.integers(0, 4))])
    table = pa.table({"l": pa.array(rows, pa.list_(pa.float64()), from_pandas=False)})
    _, out = fit_transform(["l"] >> ops.Categorify(), table, source, parts, tmp_path)
    flat = [v for r in rows if r is not None for v in r]
    expected = [None if r is None else categorify_ref(flat, r) for r in rows]
    assert pylist(out["l"]) == expected


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("parts", PARTS)
def test_joint_group_counts_nan_as_null(tmp_path, source, parts):
    a, b = float_values(seed=2), float_values(seed=3)
    table = pa.table({"a": float_array(a), "b": float_array(b)})
    _, out = fit_transform([["a", "b"]] >> ops.Categorify(encode_type="joint"), table, source, parts, tmp_path)
    assert pylist(out["a"]) == categorify_ref(a + b, a)
    assert pylist(out["b"]) == categorify_ref(a + b, b)


def combo_key_ref(parts):
    parts = [canon(p) for p in parts]
    if all(p is None for p in parts):
        return None
    return tuple("<missing>" if p is None else p for p in parts)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("parts", PARTS)
def test_combo_nan_part_is_a_null_part(tmp_path, source, parts):
    xs, ss = float_values(seed=5), string_values(seed=6)
    table = pa.table({"s": pa.array(ss, pa.string()), "x": float_array(xs)})
    _, out = fit_transform([["s", "x"]] >> ops.Categorify(encode_type="combo"), table, source, parts, tmp_path)
    keys = [combo_key_ref(p) for p in zip(ss, xs)]
    counts = pd.Series(keys, dtype=object).value_counts(dropna=True)
    got = pylist(out["s_x"])
    assert [g == 1 for g in got] == [k is None for k in keys]
    by_key = {}
    for k, g in zip(keys, got):
        if k is not None:
            assert by_key.setdefault(k, g) == g  # one id per combination
    # distinct combinations get the ids 3, 4, ... in descending count (ties are
    # ordered by the op's stored key text, so only the counts are compared)
    assert sorted(by_key.values()) == list(range(3, 3 + len(counts)))
    assert [counts[k] for k in sorted(by_key, key=by_key.get)] == sorted(counts.to_list(), reverse=True)


def test_combo_nan_and_null_rows_share_ids():
    table = pa.table({"s": pa.array(["a", "a", None, None, "", ""]),
                      "x": float_array([math.nan, None, math.nan, None, -0.0, 0.0])})
    op = ops.Categorify(encode_type="combo", column_groups=[["s", "x"]])
    got = op.fit_table(table).transform(table)["s_x"].to_pylist()
    assert got[0] == got[1] and got[4] == got[5]
    assert got[2] == got[3] == 1
    assert len({got[0], got[4]}) == 2 and 1 not in (got[0], got[4])


@pytest.mark.parametrize("spill_rows", [3, 40])
def test_spilled_vocabulary_equals_in_memory_with_nan_and_zeros(tmp_path, spill_rows):
    rng = np.random.default_rng(8)
    values = list(rng.integers(0, 60, 3000).astype(float))
    for i in range(0, 3000, 7):
        values[i] = [math.nan, None, -0.0, 0.0][(i // 7) % 4]
    table = pa.table({"x": float_array(values)})
    in_memory = ops.Categorify()
    spilled = ops.Categorify(spill_rows=spill_rows, spill_buckets=5, spill_dir=str(tmp_path))
    ts.Workflow(["x"] >> in_memory).fit(ts.Dataset(table, part_size=4000))
    ts.Workflow(["x"] >> spilled).fit(ts.Dataset(table, part_size=4000))
    assert spilled.tables["x"].equals(in_memory.tables["x"])
    assert in_memory.tables["x"]["values"].to_pylist() == vocabulary_ref(values)
    assert list(tmp_path.iterdir()) == []


# -- max_size -------------------------------------------------------------------


@pytest.mark.parametrize("num_buckets", [None, 1, 4])
@pytest.mark.parametrize("max_size", [8, 11, 1000])
@pytest.mark.parametrize("parts", PARTS)
def test_max_size_bounds_the_table_rows(tmp_path, num_buckets, max_size, parts):
    ss = [f"v{int(x)}" for x in np.random.default_rng(9).zipf(1.5, 800) % 40] + [None] * 10
    reserved = 2 + (num_buckets or 1)
    table = pa.table({"s": pa.array(ss, pa.string())})
    op = ops.Categorify(max_size=max_size, num_buckets=num_buckets)
    wf, out = fit_transform(["s"] >> op, table, "arrow", parts, tmp_path)
    kept = vocabulary_ref(ss, limit=max_size - reserved)
    assert op.tables["s"]["values"].to_pylist() == kept
    assert pylist(out["s"]) == categorify_ref(ss, ss, num_buckets, limit=max_size - reserved)
    card = wf.output_schema["s"].cardinality
    assert card == min(max_size, reserved + len(vocabulary_ref(ss)))
    assert max(pylist(out["s"])) < card
    assert wf.output_schema["s"].properties["domain"]["max"] == card - 1


def test_max_size_per_column():
    table = pa.table({"a": ["x", "x", "y", "z"], "b": ["p", "q", "q", "r"]})
    op = ops.Categorify(max_size={"a": 4}).fit_table(table)
    assert op.tables["a"]["values"].to_pylist() == ["x"]
    assert op.tables["b"]["values"].to_pylist() == vocabulary_ref(table["b"].to_pylist())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"max_size": 3}, r"max_size=3 leaves no room.*reserves 3 rows.*max_size > 3"),
    ({"max_size": 1}, r"max_size=1 leaves no room"),
    ({"max_size": 6, "num_buckets": 4}, r"max_size=6 leaves no room.*reserves 6 rows.*num_buckets=4"),
    ({"max_size": {"c": 2}}, r"max_size=2 for 'c' leaves no room"),
])
def test_max_size_too_small_is_an_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ops.Categorify(**kwargs)


def test_given_vocabulary_checks():
    with pytest.raises(ValueError, match=r"vocabulary given for 'c' contains a missing value \(None or NaN\)"):
        ops.Categorify(vocabs={"c": [1.0, math.nan]}).fit_table(pa.table({"c": [1.0]}))
    with pytest.raises(ValueError, match=r"'c' has duplicate values \(-0.0 and 0.0 are one value\)"):
        ops.Categorify(vocabs={"c": [0.0, -0.0]}).fit_table(pa.table({"c": [1.0]}))
    with pytest.raises(ValueError, match=r"'c' has 3 values, but max_size=4 leaves room for 1"):
        ops.Categorify(vocabs={"c": ["a", "b", "c"]}, max_size=4).fit_table(pa.table({"c": ["a"]}))
    op = ops.Categorify(vocabs={"c": [-0.0, 2.0]}).fit_table(pa.table({"c": [1.0]}))
    got = op.transform(pa.table({"c": float_array([0.0, -0.0, math.nan, 2.0, 5.0])}))["c"].to_pylist()
    assert got == [3, 3, 1, 4, 2]


# -- HashBucket -----------------------------------------------------------------


def bucket_ref(values, n):
    return [n if canon(v) is None else one_hash(canon(v)) % n for v in values]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("parts", PARTS)
def test_hash_bucket_missing_gets_its_own_id(tmp_path, source, parts):
    xs, ss = float_values(seed=10), string_values(seed=11)
    table = pa.table({"x": float_array(xs), "s": pa.array(ss, pa.string())})
    wf, out = fit_transform(["x", "s"] >> ops.HashBucket({"x": 5, "s": 3}), table, source, parts, tmp_path)
    assert pylist(out["x"]) == bucket_ref(xs, 5)
    assert pylist(out["s"]) == bucket_ref(ss, 3)
    for name, n in (("x", 5), ("s", 3)):
        col = wf.output_schema[name]
        assert col.cardinality == n + 1
        assert col.properties["domain"] == {"min": 0, "max": n}  # unnamed: its table is the column's


def test_hash_bucket_no_value_takes_the_missing_id():
    # 2000 distinct values over 4 buckets: every bucket is hit, none reaches 4
    values = np.arange(2000, dtype=np.float64) - 1000.0
    got = ops.HashBucket(4).transform(pa.table({"x": values}))["x"].to_numpy()
    assert set(got.tolist()) == {0, 1, 2, 3}
    expected = murmur3_32(np.where(values == 0, 0.0, values)) % 4
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("type_", [pa.float16(), pa.float32(), pa.float64()])
def test_hash_bucket_float_widths_and_lists(type_):
    values = [math.nan, None, -0.0, 0.0, 1.5, math.inf]
    flat = ops.HashBucket(11).transform(pa.table({"x": float_array(values, type_)}))["x"].to_pylist()
    assert flat == bucket_ref(values, 11)
    rows = [[math.nan, -0.0], None, [], [1.5, None, math.inf]]
    lists = pa.array(rows, pa.list_(type_), from_pandas=False).slice(0)
    got = ops.HashBucket(11).transform(pa.table({"l": lists}))["l"].to_pylist()
    assert got == [None if r is None else bucket_ref(r, 11) for r in rows]
    sliced = pa.array(rows, pa.list_(type_), from_pandas=False).slice(1)
    got = ops.HashBucket(11).transform(pa.table({"l": sliced}))["l"].to_pylist()
    assert got == [None if r is None else bucket_ref(r, 11) for r in rows[1:]]


# -- HashedCross ----------------------------------------------------------------


def cross_ref(columns, n):
    out = []
    for parts in zip(*columns):
        parts = [canon(p) for p in parts]
        if all(p is None for p in parts):
            out.append(n)
            continue
        # a missing part folds the marker twice; a missing first part starts from
        # the marker and folds it once more at the end (HashedCross's docstring)
        marker = np.uint32(0x9E3779B9)
        h = marker if parts[0] is None else np.uint32(one_hash(parts[0]))
        for p in parts[1:]:
            if p is None:
                h = hash_combine(hash_combine(h, marker), marker)
            else:
                h = hash_combine(h, np.uint32(one_hash(p)))
        if parts[0] is None:
            h = hash_combine(h, marker)
        out.append(int(np.asarray(h).reshape(())) % n)
    return out


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("parts", PARTS)
def test_hashed_cross_missing_parts(tmp_path, source, parts):
    xs, ss = float_values(seed=12), string_values(seed=13)
    table = pa.table({"s": pa.array(ss, pa.string()), "x": float_array(xs)})
    wf, out = fit_transform(["s", "x"] >> ops.HashedCross(50), table, source, parts, tmp_path)
    got = pylist(out["s_X_x"])
    assert got == cross_ref([ss, xs], 50)
    assert 50 in got  # some rows have both parts missing
    col = wf.output_schema["s_X_x"]
    assert col.cardinality == 51 and col.properties["domain"]["max"] == 50


def test_hashed_cross_list_elements():
    rows = [[math.nan, -0.0, 2.0], None, [None, 0.0, 1.0]]
    other = ["a", "b", None]
    table = pa.table({"l": pa.array(rows, pa.list_(pa.float64()), from_pandas=False), "s": other})
    got = ops.HashedCross(20).transform(table)["l_X_s"].to_pylist()
    expected = [None if r is None else cross_ref([r, [s] * len(r)], 20) for r, s in zip(rows, other)]
    assert got == expected
    assert got[2][0] == 20  # NaN-or-null element crossed with a null scalar: all missing

"""Every kernel of the Backend interface on every available backend, against a
reference computed a second way (numpy, pandas or plain Python)."""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tabstream.core.hashing import murmur3_32

FLOATS = [1.5, None, float("nan"), -0.0, 0.0, float("inf"), -float("inf"), -3.0, 7.25]


def chunked(values, type_=None, split=4):
    arr = pa.array(values, type_, from_pandas=False)
    return pa.chunked_array([arr.slice(0, split), arr.slice(split)], arr.type)


def py(column):
    return (column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column).to_pylist()


def same_floats(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        elif math.isnan(e):
            assert g is not None and math.isnan(g)
        else:
            assert g == pytest.approx(e, rel=1e-6, abs=1e-6)


def test_normalize_missing(backend):
    got = py(backend.normalize_missing(chunked(FLOATS)))
    assert got[1] is None and got[2] is None                    # null and NaN: missing
    assert got[3] == 0.0 and math.copysign(1, got[3]) == 1.0    # -0.0 -> 0.0
    assert got[5] == math.inf and got[0] == 1.5
    assert py(backend.normalize_missing(pa.array([[float("nan"), -0.0], None]))) == [[None, 0.0], None]
    strings = pa.array(["", None, "a"])
    assert py(backend.normalize_missing(strings)) == ["", None, "a"]


def test_is_missing_and_fill_missing(backend):
    col = chunked(FLOATS)
    assert py(backend.is_missing(col)) == [v is None or (isinstance(v, float) and math.isnan(v)) for v in FLOATS]
    expected = pd.Series(FLOATS, dtype="float64").fillna(-1.0).tolist()
    same_floats(py(backend.fill_missing(col, -1.0)), expected)
    ints = chunked([1, None, 3, None, 5], pa.int32(), split=2)
    got = backend.fill_missing(ints, 9)
    assert py(got) == [1, 9, 3, 9, 5] and got.type == pa.int32()
    assert py(backend.is_missing(ints)) == [False, True, False, True, False]


def test_clip_keeps_nulls_and_nan(backend):
    col = chunked(FLOATS)
    expected = pd.Series(FLOATS, dtype="float64").clip(-1.0, 5.0)
    got = py(backend.clip(col, -1.0, 5.0))
    assert got[1] is None  # null stays null
    same_floats([v for i, v in enumerate(got) if i != 1], [v for i, v in enumerate(expected) if i != 1])
    ints = pa.array([-5, 0, None, 12], pa.int64())
    assert py(backend.clip(ints, 0, None)) == [0, 0, None, 12]
    assert py(backend.clip(ints, None, 3)) == [-5, 0, None, 3]


def test_log1p(backend):
    values = [0.0, 1.0, None, -1.0, -2.0, 1e6, 3.5]
    got = backend.log1p(chunked(values))
    assert got.type == pa.float32()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = [None if v is None else float(np.float32(np.log1p(v))) for v in values]
    same_floats(py(got), expected)
    assert py(backend.log1p(pa.array([True, None, False]))) == [pytest.approx(math.log(2)), None, 0.0]


def test_moments_use_finite_values_only(backend):
    n, mean, m2 = backend.moments(chunked(FLOATS))
    finite = np.array([v for v in FLOATS if v is not None and math.isfinite(v)])
    assert n == len(finite)
    assert mean == pytest.approx(finite.mean())
    assert m2 == pytest.approx(((finite - finite.mean()) ** 2).sum())
    assert backend.moments(pa.array([None, float("nan")], pa.float64())) == (0, 0.0, 0.0)


@pytest.mark.parametrize("dtype", ["int64", "float32", "float64"])
def test_log1p_of_many_chunks_without_nulls(backend, dtype):
    """The shape FillMissing leaves a parsed TSV block in: ~20 chunks, no nulls."""
    values = np.random.default_rng(9).integers(-1, 5000, 4000).astype(dtype)
    column = pa.chunked_array([pa.array(values[i:i + 300]) for i in range(0, len(values), 300)])
    got = backend.log1p(column)
    assert got.type == pa.float32()
    with np.errstate(divide="ignore", invalid="ignore"):
        expected = np.log1p(values, dtype=np.float64).astype(np.float32)
    got = np.asarray(py(got), dtype=np.float32)
    assert np.array_equal(got, expected, equal_nan=True)


@pytest.mark.parametrize("with_inf", [False, True])
def test_moments_of_float32_chunks_without_nulls(backend, with_inf):
    values = np.log1p(np.random.default_rng(5).integers(0, 1000, 3000)).astype(np.float32)
    if with_inf:
        values[::97] = np.inf
    column = pa.chunked_array([pa.array(values[i:i + 700]) for i in range(0, len(values), 700)])
    finite = values[np.isfinite(values)].astype(np.float64)
    n, mean, m2 = backend.moments(column)
    assert n == len(finite)
    assert mean == pytest.approx(finite.mean(), rel=1e-12)
    assert m2 == pytest.approx(((finite - finite.mean()) ** 2).sum(), rel=1e-12)


def test_standardize(backend):
    col = pa.array([1, 2, None, 4], pa.int64())
    got = backend.standardize(col, 2.0, 0.5)
    assert got.type == pa.float32()
    assert py(got) == [-2.0, 0.0, None, 4.0]
    assert py(backend.standardize(col, 2.0, 0.0)) == [-1.0, 0.0, None, 2.0]  # std 0: only centred


def test_value_counts(backend):
    values = ["b", "a", None, "b", "", "a", "b"]
    got = backend.value_counts(chunked(values, pa.string()))
    expected = pd.Series(values).dropna().value_counts()
    assert dict(zip(py(got["values"]), py(got["counts"]))) == expected.to_dict()
    assert got["counts"].type == pa.int64()
    floats = backend.value_counts(pa.array([-0.0, 0.0, float("nan"), None, 2.0]))
    assert dict(zip(py(floats["values"]), py(floats["counts"]))) == {0.0: 2, 2.0: 1}
    lists = backend.value_counts(pa.array([[1, 2], None, [2, 2], []]))
    assert dict(zip(py(lists["values"]), py(lists["counts"]))) == {1: 1, 2: 3}


def test_encode(backend):
    vocab = pa.array(["x", "y", "z"])
    got = backend.encode(chunked(["z", None, "q", "x", "y", "x"], pa.string()), vocab)
    position = {v: i for i, v in enumerate(vocab.to_pylist())}
    assert py(got) == [position.get(v) if v is not None else None for v in ["z", None, "q", "x", "y", "x"]]
    assert got.type == pa.int64()


def test_murmur3_is_the_reference_hash(backend):
    for col in (pa.array(["a", None, "", "bc"]), pa.array([0, -1, None, 2**40]), pa.array([1.5, None, 0.0])):
        hashes, is_null = backend.murmur3(col, 7)
        np.testing.assert_array_equal(hashes, murmur3_32(col, seed=7))
        np.testing.assert_array_equal(is_null, np.array([v is None for v in col.to_pylist()]))


def test_groupby_aggregate(backend):
    df = pd.DataFrame({"k": ["a", "b", None, "a", "b", "a"], "k2": [1, 1, 2, 1, 2, 1],
                       "v": [1.0, 2.0, 3.0, None, 5.0, 6.0]})
    table = pa.Table.from_pandas(df, preserve_index=False)
    got = backend.groupby_aggregate(table, ["k", "k2"], [("v", "sum", "s"), ("v", "count", "c"),
                                                         ("v", "size", "n"), ("v", "mean", "m"),
                                                         ("v", "min", "lo"), ("v", "max", "hi")])
    assert got.column_names == ["k", "k2", "s", "c", "n", "m", "lo", "hi"]
    expected = df.groupby(["k", "k2"], dropna=False).agg(
        s=("v", "sum"), c=("v", "count"), n=("v", "size"), m=("v", "mean"), lo=("v", "min"), hi=("v", "max"))
    rows = {(r["k"], r["k2"]): r for r in got.to_pylist()}
    assert len(rows) == len(expected)
    for (k, k2), exp in expected.iterrows():
        row = rows[(None if isinstance(k, float) else k, k2)]
        for name in ["s", "c", "n", "m", "lo", "hi"]:
            assert row[name] == pytest.approx(exp[name]), (k, k2, name)


def test_groupby_refuses_an_unknown_aggregation(backend):
    with pytest.raises(ValueError, match=r"unknown aggregation 'median'; expected one of \['sum'"):
        backend.groupby_aggregate(pa.table({"k": [1], "v": [1]}), ["k"], [("v", "median", "x")])


@pytest.mark.parametrize("how", ["left", "inner"])
def test_join_keeps_left_order(backend, how):
    left = pd.DataFrame({"k": [3, 1, None, 2, 1, 9], "x": list("abcdef")})
    right = pd.DataFrame({"k": [1, 2, 3], "y": [10.0, 20.0, 30.0]})
    got = backend.join(pa.Table.from_pandas(left, preserve_index=False).cast(
        pa.schema([("k", pa.int64()), ("x", pa.string())])),
        pa.Table.from_pandas(right, preserve_index=False), ["k"], how=how)
    lookup = dict(zip(right["k"], right["y"]))
    expected = [(None if pd.isna(k) else int(k), x, lookup.get(k)) for k, x in zip(left["k"], left["x"])]
    if how == "inner":
        expected = [e for e in expected if e[2] is not None]
    assert got.column_names == ["k", "x", "y"]
    assert list(zip(*[got[c].to_pylist() for c in got.column_names])) == expected
    with pytest.raises(ValueError, match="how must be 'left' or 'inner', got 'outer'"):
        backend.join(pa.table({"k": [1]}), pa.table({"k": [1]}), ["k"], how="outer")


def test_list_flatten_and_offsets(backend):
    col = pa.array([[1, 2], None, [], [3]]).slice(1)
    values, offsets = backend.list_flatten(col), backend.list_offsets(col)
    assert py(offsets)[0] == 0 and len(offsets) == len(col) + 1
    rebuilt = pa.ListArray.from_arrays(offsets, values, mask=col.is_null())
    assert rebuilt.to_pylist() == col.to_pylist()


def test_take_filter_concat(backend):
    table = pa.table({"a": [1, 2, 3, 4], "b": ["w", "x", None, "z"]})
    assert backend.take(table, np.array([3, 0, 0])).to_pylist() == [table.slice(i, 1).to_pylist()[0] for i in [3, 0, 0]]
    mask = pa.array([True, None, False, True])
    assert backend.filter(table, mask).to_pylist() == [table.to_pylist()[i] for i in (0, 3)]
    assert backend.filter(table, np.array([False, True, True, False])).column("a").to_pylist() == [2, 3]
    other = pa.table({"a": pa.array([5], pa.int32())})
    both = backend.concat([table, other])
    assert both.column("a").to_pylist() == [1, 2, 3, 4, 5] and both.column("b").to_pylist()[-1] is None


def test_frames_for_user_functions(backend):
    table = pa.table({"n": pa.array([1, None, 3], pa.int64()), "s": ["a", None, "c"]})
    frame = backend.to_frame(table)
    assert len(frame) == 3 and list(frame.columns) == ["n", "s"]
    assert int(frame["n"].isna().sum()) == 1  # the null stays missing, the ints stay ints
    assert backend.from_frame(frame).column("n").to_pylist() == [1, None, 3]
    assert backend.from_user_column(frame["n"] * 2).to_pylist() == [2, None, 6]


# -- kernels added for issue 9 ---------------------------------------------------------------
def test_digitize_is_numpy_digitize(backend):
    values = [-math.inf, -5.0, 0.0, -0.0, 2.0, 9.99, 10.0, 1e9, math.inf, None, math.nan]
    boundaries = [0.0, 2.0, 10.0]
    got = backend.digitize(chunked(values), boundaries)
    x = np.array([np.nan if v is None else v for v in values])
    expected = [None if np.isnan(v) else int(np.digitize(v, boundaries, right=False)) for v in x]
    assert got.type == pa.int64() and py(got) == expected
    ints = backend.digitize(pa.array([1, None, 3], pa.int32()), [2])
    assert py(ints) == [0, None, 1]


def _reference_join(left, right, key, how):
    """Nested loops over plain Python lists: the specification, slowly."""
    pairs = []
    for i, k in enumerate(left[key]):
        matches = [j for j, r in enumerate(right[key]) if k is not None and r == k]
        pairs += [(i, j) for j in matches] if matches else ([(i, None)] if how == "left" else [])
    return [p[0] for p in pairs], [p[1] for p in pairs]


@pytest.mark.parametrize("how", ["left", "inner"])
def test_join_indices_many_to_many_in_left_order(backend, how):
    rng = np.random.default_rng(0)
    left_keys = [None if v == 0 else int(v) for v in rng.integers(0, 6, 40)]
    right_keys = [None if v == 0 else int(v) for v in rng.integers(0, 5, 15)]
    left, right = pa.table({"k": pa.array(left_keys, pa.int64())}), pa.table({"k": pa.array(right_keys, pa.int64())})
    rows, side_rows = backend.join_indices(left, right, ["k"], how=how)
    assert rows.type == pa.int64() and side_rows.type == pa.int64()
    assert (py(rows), py(side_rows)) == _reference_join({"k": left_keys}, {"k": right_keys}, "k", how)


def test_join_indices_two_keys_and_empty_right(backend):
    left = pa.table({"a": [1, 1, 2], "b": ["x", "y", "x"]})
    right = pa.table({"a": [1, 2, 1], "b": ["y", "x", "y"]})
    rows, side_rows = backend.join_indices(left, right, ["a", "b"])
    assert (py(rows), py(side_rows)) == ([0, 1, 1, 2], [None, 0, 2, 1])
    rows, side_rows = backend.join_indices(left, right.slice(0, 0), ["a", "b"])
    assert (py(rows), py(side_rows)) == ([0, 1, 2], [None, None, None])
    with pytest.raises(ValueError, match="join_indices: how must be 'left' or 'inner', got 'outer'"):
        backend.join_indices(left, right, ["a"], how="outer")


def test_take_with_null_indices_gives_null_rows(backend):
    table = pa.table({"a": [1, 2], "l": pa.array([[1], [2, 3]])})
    got = backend.take(table, pa.array([1, None, 0], pa.int64()))
    assert got.to_pylist() == [{"a": 2, "l": [2, 3]}, {"a": None, "l": None}, {"a": 1, "l": [1]}]
    assert backend.take(table.slice(0, 0), pa.array([None], pa.int64())).to_pylist() == [{"a": None, "l": None}]


def test_groupby_aggregate_std_var_list_first_last_and_empty_sum(backend):
    df = pd.DataFrame({"k": [1, 2, 1, 3, 1, 2, 4], "v": [1.0, None, 4.0, 2.0, None, None, 3.5]})
    table = pa.Table.from_pandas(df, preserve_index=False)
    got = backend.groupby_aggregate(table, ["k"], [("v", "std", "sd"), ("v", "var", "va"), ("v", "list", "l"),
                                                   ("v", "first", "f"), ("v", "last", "la"), ("v", "sum", "s")])
    rows = {r["k"]: r for r in got.to_pylist()}
    for k, part in df.groupby("k")["v"]:
        values = part.tolist()
        present = part.dropna()
        row = rows[k]
        assert [None if math.isnan(v) else v for v in values] == row["l"], k  # row order, nulls kept
        assert row["s"] == pytest.approx(present.sum())                      # 0 for group 2 (no values)
        assert row["f"] == (present.iloc[0] if len(present) else None)
        assert row["la"] == (present.iloc[-1] if len(present) else None)
        if len(present) >= 2:
            assert row["sd"] == pytest.approx(present.std(ddof=1)) and row["va"] == pytest.approx(present.var(ddof=1))
        else:
            assert row["sd"] is None and row["va"] is None


def test_groupby_sum_keeps_nan_apart_from_a_group_without_values(backend):
    # null is "no value" (a group of nulls sums to 0); NaN is a value (NaN + x is NaN),
    # and so is inf + -inf; a list column's count counts its present rows
    values = [np.inf, -np.inf, np.nan, 1.0, None, None, 2.0, np.inf]
    keys = [1, 1, 2, 2, 3, 3, 4, 4]
    lists = [[1], None, [], [2, 3], None, None, [4], None]
    table = pa.table({"k": keys, "v": pa.array(values, pa.float64()), "l": pa.array(lists, pa.list_(pa.int64()))})
    got = backend.groupby_aggregate(table, ["k"], [("v", "sum", "s"), ("l", "count", "n")])
    rows = {r["k"]: r for r in got.to_pylist()}
    for k in set(keys):
        vals = np.array([v for kk, v in zip(keys, values) if kk == k and v is not None], dtype=np.float64)
        with np.errstate(invalid="ignore"):
            want = float(vals.sum()) if len(vals) else 0.0  # numpy: NaN and inf - inf give NaN
        assert (math.isnan(rows[k]["s"]) and math.isnan(want)) or rows[k]["s"] == want, k
        assert rows[k]["n"] == sum(1 for kk, x in zip(keys, lists) if kk == k and x is not None), k


def test_list_lengths(backend):
    rows = [[1, 2, 3], None, [], [4]]
    assert py(backend.list_lengths(pa.array(rows))) == [len(r or []) for r in rows]


LIST_ROWS = [[1, 2, 3, 4, 5], None, [], [6], [7, 8]]


@pytest.mark.parametrize("start,end", [(0, 2), (-2, None), (1, None), (1, -1), (-4, 2), (3, 1), (-9, 9)])
def test_list_slice_is_python_slicing(backend, start, end):
    got = backend.list_slice(pa.array(LIST_ROWS, pa.list_(pa.int64())), start, end)
    assert got.type == pa.list_(pa.int64())
    assert got.to_pylist() == [None if r is None else r[start:end] for r in LIST_ROWS]


@pytest.mark.parametrize("start,end,n", [(0, 3, 3), (-2, None, 2)])
def test_list_slice_pads(backend, start, end, n):
    col = pa.array([[str(v) for v in r] if r is not None else None for r in LIST_ROWS], pa.large_list(pa.string()))
    got = backend.list_slice(col, start, end, pad_length=n, pad_value="?")
    assert got.type == pa.large_list(pa.string())
    expected = [[str(v) for v in (r or [])[start:end]] for r in LIST_ROWS]
    assert got.to_pylist() == [r + ["?"] * (n - len(r)) for r in expected]


def test_hll_registers_are_the_reference_sketch(backend):
    values = pa.array([f"v{i}" for i in range(300)] + [None, "v7"])
    precision = 6
    expected = np.zeros(1 << precision, dtype=np.uint8)
    for value in values.to_pylist():
        if value is None:
            continue
        h = int(murmur3_32(pa.array([value]))[0])
        rest = h & ((1 << (32 - precision)) - 1)
        register, rank = h >> (32 - precision), (32 - precision) - rest.bit_length() + 1
        expected[register] = max(expected[register], rank)
    got = backend.hll_registers(values, precision)
    assert got.dtype == np.uint8 and got.tolist() == expected.tolist()
    assert backend.hll_registers(pa.array([], pa.string()), precision).tolist() == [0] * (1 << precision)


def test_distinct(backend):
    values = ["b", None, "a", "b", "", "a"]
    got = backend.distinct(chunked(values, pa.string(), split=3))
    assert sorted(got.to_pylist()) == sorted({v for v in values if v is not None})
    assert sorted(backend.distinct(pa.array([3, 1, 3, None], pa.int16())).to_pylist()) == [1, 3]


def test_min_max(backend):
    values = [5, None, -3, 12, 0]
    assert backend.min_max(chunked(values, pa.int32(), split=2)) == (min(v for v in values if v is not None),
                                                                    max(v for v in values if v is not None))
    rows = [[4, 9], None, [-1]]
    flat = [v for r in rows if r for v in r]
    assert backend.min_max(pa.array(rows)) == (min(flat), max(flat))
    assert backend.min_max(pa.array([None, None], pa.int64())) == (None, None)


def test_cast_refuses_what_does_not_fit(backend):
    got = backend.cast(chunked([1, None, -128, 127, 5], pa.int64(), split=2), pa.int8())
    assert got.type == pa.int8() and py(got) == [1, None, -128, 127, 5]
    with pytest.raises(pa.ArrowInvalid):
        backend.cast(pa.array([1, 300], pa.int64()), pa.int8())
    lists = backend.cast(pa.array([[1, 2], None], pa.list_(pa.int64())), pa.list_(pa.int16()))
    assert lists.type == pa.list_(pa.int16()) and lists.to_pylist() == [[1, 2], None]
    floats = backend.cast(pa.array([1.5, None, 1e300]), pa.float32())
    with np.errstate(over="ignore"):
        narrowed = float(np.float64(1e300).astype(np.float32))  # inf, as numpy narrows
    assert py(floats) == [1.5, None, narrowed]


def test_split_strings(backend):
    values = ["a|b|c", "", None, "a||b", "|", "x"]
    got = backend.split_strings(chunked(values, pa.string(), split=3), "|")
    assert got.type == pa.list_(pa.string())
    assert py(got) == [None if v is None else ([] if v == "" else v.split("|")) for v in values]
    assert py(backend.split_strings(pa.array(["1.5.2"], pa.large_string()), ".")) == [["1", "5", "2"]]


@pytest.mark.parametrize("order", ["ascending", "descending"])
def test_sort_indices_is_stable_with_nulls_last(backend, order):
    df = pd.DataFrame({"a": [2, None, 1, 2, None, 1, 2], "b": ["x", "y", "y", "x", "x", "x", "w"]})
    table = pa.Table.from_pandas(df, preserve_index=False)
    got = backend.sort_indices(table, [("a", order), ("b", "ascending")])
    expected = df.sort_values(["a", "b"], ascending=[order == "ascending", True], kind="stable",
                              na_position="last").index.tolist()
    assert got.type == pa.int64() and got.to_pylist() == expected
    with pytest.raises(ValueError, match="sort_indices: order must be 'ascending' or 'descending', got 'up'"):
        backend.sort_indices(table, [("a", "up")])

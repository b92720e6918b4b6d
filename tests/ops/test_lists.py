"""Multi-hot ops (SplitList, ListSlice, ValueCount) against plain Python references,
and list columns through Categorify and HashBucket."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, NotFittedError
from tabstream.core.hashing import murmur3_32
from tabstream.ops.lists import ListSlice, SplitList, ValueCount

RAW = ["a|b|c", "", None, "x||y", "solo", "b|a", "|", "c|c|c|c", None, "a"]


def pylist(col):
    """A transformed column (pandas Series or arrow) as Python lists with None for null."""
    return pa.array(col).to_pylist() if isinstance(col, pd.Series) else col.to_pylist()


def split_ref(s, sep="|"):
    return None if s is None else ([] if s == "" else s.split(sep))


def list_frame(rows, name="l", value_type=None):
    value_type = pa.int64() if value_type is None else value_type
    return pd.DataFrame({name: pd.Series(rows, dtype=pd.ArrowDtype(pa.list_(value_type)))})


INT_ROWS = [[1, 2, 3, 4, 5], [6], [], None, [7, 8], [9, 10, 11], [12, 13, 14, 15, 16, 17], [], [18, 19, 20]]


@pytest.mark.parametrize("part_size", [None, 64])
def test_split_list_matches_str_split(part_size):
    df = pd.DataFrame({"g": pd.array(RAW, dtype="str")})
    wf = ts.Workflow(["g"] >> SplitList("|"))
    wf.fit(ts.Dataset(df, part_size=part_size))
    out = wf.transform(ts.Dataset(df, part_size=part_size)).compute()
    assert pylist(out["g"]) == [split_ref(s) for s in RAW]
    col = wf.output_schema["g"]
    assert (col.dtype, col.is_list, col.is_ragged) == ("string", True, True)
    assert ts.Tags.LIST in col.tags


def test_split_list_multichar_separator_and_int_elements():
    raw = ["3, 17, 4", "", None, "-5"]
    df = pd.DataFrame({"g": pd.array(raw, dtype="str")})
    wf = ts.Workflow(["g"] >> SplitList(", ", dtype="int64")).fit(ts.Dataset(df))
    out = wf.transform(pa.Table.from_pandas(df))
    assert out["g"].type == pa.list_(pa.int64())
    assert out["g"].to_pylist() == [None if s is None else [int(v) for v in split_ref(s, ", ")] for s in raw]
    assert wf.output_schema["g"].dtype == "int64"


def test_split_list_errors():
    df = pd.DataFrame({"g": pd.array(["1|x"], dtype="str"), "n": [1]})
    wf = ts.Workflow(["g"] >> SplitList(dtype="int64")).fit(ts.Dataset(df))
    with pytest.raises(DataError, match="SplitList: column 'g'.*to int64.*'x'"):
        wf.transform(df)
    with pytest.raises(TypeError, match="SplitList splits string columns, but column 'n' is int64"):
        ts.Workflow(["n"] >> SplitList()).fit_schema(ts.Dataset(df).schema)
    with pytest.raises(ValueError, match="separator must be a non-empty string"):
        SplitList("")


SLICES = [(2, None), (-2, None), (1, 3), (-3, -1), (1, -1), (-4, 2), (0, None), (3, 1), (-1, None)]


def slice_ref(row, start, end):
    if end is None and start > 0:
        start, end = 0, start
    return None if row is None else row[start:end]


@pytest.mark.parametrize("start,end", SLICES)
def test_list_slice_matches_python_slicing(start, end):
    df = list_frame(INT_ROWS)
    wf = ts.Workflow(["l"] >> ListSlice(start, end))
    wf.fit(ts.Dataset(df, part_size=40))
    out = wf.transform(ts.Dataset(df, part_size=40)).compute()
    expected = [slice_ref(r, start, end) for r in INT_ROWS]
    assert pylist(out["l"]) == expected
    vc = wf.output_schema["l"].properties.get("value_count")
    lengths = [len(r) for r in expected if r is not None]
    if vc is not None and "max" in vc:  # a declared bound must hold
        assert vc["min"] <= min(lengths) and max(lengths) <= vc["max"]


@pytest.mark.parametrize("start,end,n", [(3, None, 3), (-2, None, 2), (1, 4, 3), (-4, -1, 3)])
def test_list_slice_pad_gives_fixed_length(start, end, n):
    df = list_frame(INT_ROWS)
    wf = ts.Workflow(["l"] >> ListSlice(start, end, pad=True, pad_value=-1))
    wf.fit(ts.Dataset(df, part_size=40))
    out = wf.transform(ts.Dataset(df, part_size=40)).compute()
    expected = [(s := slice_ref(r or [], start, end)) + [-1] * (n - len(s)) for r in INT_ROWS]
    assert pylist(out["l"]) == expected
    col = wf.output_schema["l"]
    assert col.properties["value_count"] == {"min": n, "max": n}
    assert col.is_list and not col.is_ragged


def test_list_slice_pads_strings_and_checks_pad_value():
    rows = [["a", "b", "c"], [], None, ["d"]]
    df = list_frame(rows, value_type=pa.string())
    wf = ts.Workflow(["l"] >> ListSlice(2, pad=True, pad_value="")).fit(ts.Dataset(df))
    assert pylist(wf.transform(df)["l"]) == [["a", "b"], ["", ""], ["", ""], ["d", ""]]
    with pytest.raises(TypeError, match="pad_value 0 does not fit column 'l', a list of string"):
        ts.Workflow(["l"] >> ListSlice(2, pad=True)).fit_schema(ts.Dataset(df).schema)


def test_list_slice_errors():
    with pytest.raises(ValueError, match=r"ListSlice\(0, None, pad=True\): padding needs a fixed"):
        ListSlice(0, pad=True)
    with pytest.raises(ValueError, match="padding needs a fixed slice length"):
        ListSlice(2, -1, pad=True)
    with pytest.raises(ValueError, match="padding needs a fixed slice length"):
        ListSlice(-3, 2, pad=True)
    with pytest.raises(TypeError, match="start must be an integer"):
        ListSlice(1.5)
    df = pd.DataFrame({"x": [1, 2]})
    with pytest.raises(TypeError, match="ListSlice needs list columns, but column 'x' is a scalar int64"):
        ts.Workflow(["x"] >> ListSlice(2)).fit_schema(ts.Dataset(df).schema)


def test_value_count_matches_lengths_on_one_and_many_partitions():
    df = list_frame(INT_ROWS)
    df["s"] = pd.Series([["a"] * (i % 4 + 1) for i in range(len(INT_ROWS))],
                        dtype=pd.ArrowDtype(pa.list_(pa.string())))
    lengths = {c: [0 if r is None else len(r) for r in pylist(df[c])] for c in ["l", "s"]}
    found = []
    for part_size in (None, 40):
        op = ValueCount()
        wf = ts.Workflow(["l", "s"] >> op).fit(ts.Dataset(df, part_size=part_size))
        assert (ts.Dataset(df, part_size=part_size).npartitions > 1) == (part_size is not None)
        found.append({c: wf.output_schema[c].properties["value_count"] for c in ["l", "s"]})
        out = wf.transform(df)
        assert pylist(out["l"]) == INT_ROWS  # data passes through
    assert found[0] == found[1] == {c: {"min": min(v), "max": max(v)} for c, v in lengths.items()}


def test_value_count_combines_partials_without_the_column():
    op = ValueCount()
    parts = [op.fit_partition(pa.table({"l": pa.array(rows, pa.list_(pa.int64()))}))
             for rows in ([[1, 2]], [], [None, [1, 2, 3, 4]], [[5]])]
    assert parts[1] == {"l": None}
    op.finalize(op.combine([op.combine(parts[:2]), op.combine(parts[2:])]))
    assert op.value_counts == {"l": {"min": 0, "max": 4}}


def test_value_count_errors_and_not_fitted():
    with pytest.raises(NotFittedError, match="ValueCount has not been fitted"):
        ValueCount().transform(pa.table({"l": [[1]]}))
    df = pd.DataFrame({"x": [1, 2]})
    with pytest.raises(TypeError, match="ValueCount needs list columns, but column 'x'"):
        ts.Workflow(["x"] >> ValueCount()).fit_schema(ts.Dataset(df).schema)


def test_value_count_bounds_flow_through_list_slice():
    df = list_frame([[1, 2, 3, 4], [5, 6], [7, 8, 9]])
    wf = ts.Workflow(["l"] >> ValueCount() >> ListSlice(1, 3)).fit(ts.Dataset(df))
    out = pylist(wf.transform(df)["l"])
    lengths = [len(r) for r in out]
    assert wf.output_schema["l"].properties["value_count"] == {"min": min(lengths), "max": max(lengths)}


def categorify_list_ref(rows_fit, rows_apply):
    flat = [v for r in rows_fit if r is not None for v in r if v is not None]
    counts = pd.Series(flat).value_counts()
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    mapping = {v: i + 3 for i, (v, _) in enumerate(order)}
    return [None if r is None else [1 if v is None else mapping.get(v, 2) for v in r] for r in rows_apply]


def hash_list_ref(rows, n):
    def one(v):
        return n if v is None else int(murmur3_32(pa.array([v]))[0] % n)  # missing: id n
    return [None if r is None else [one(v) for v in r] for r in rows]


@pytest.fixture
def list_parquet(tmp_path):
    rng = np.random.default_rng(3)
    n = 60
    words = np.array(["red", "green", "blue", "cyan", "teal"])
    ints, strs, raw = [], [], []
    for i in range(n):
        k = int(rng.integers(0, 5))
        ints.append(None if i % 11 == 5 else [int(v) for v in rng.integers(0, 50, k)])
        s = [str(v) for v in words[rng.integers(0, 5, k)]]
        if i % 7 == 3:
            s.append(None)
        strs.append(s)
        raw.append(None if i % 13 == 4 else "|".join(s[:k]))
    table = pa.table({
        "ints": pa.array(ints, pa.list_(pa.int64())),
        "strs": pa.array(strs, pa.list_(pa.string())),
        "raw": pa.array(raw, pa.string()),
    })
    path = tmp_path / "lists.parquet"
    pq.write_table(table, path, row_group_size=8)
    return path, table


def test_parquet_lists_through_split_slice_categorify_hash(list_parquet, tmp_path):
    path, table = list_parquet
    ds = ts.Dataset(str(path), part_size=1)  # one row group per partition
    assert ds.npartitions == 8
    assert ds.schema["ints"].is_list and ds.schema["strs"].dtype == "string"
    graph = (
        ["raw"] >> SplitList("|") >> ValueCount() >> ops.Categorify()
    ) + (
        ["ints"] >> ListSlice(0, 3, pad=True) >> ops.HashBucket(7)
    ) + (
        ["strs"] >> ListSlice(-2) >> ops.Categorify()
    )
    wf = ts.Workflow(graph).fit(ds)
    out = wf.transform(ds).compute()

    raw_lists = [split_ref(s) for s in table["raw"].to_pylist()]
    assert pylist(out["raw"]) == categorify_list_ref(raw_lists, raw_lists)
    sliced = [(r or [])[0:3] + [0] * (3 - len((r or [])[0:3])) for r in table["ints"].to_pylist()]
    assert pylist(out["ints"]) == hash_list_ref(sliced, 7)
    strs = [None if r is None else r[-2:] for r in table["strs"].to_pylist()]
    assert pylist(out["strs"]) == categorify_list_ref(strs, strs)

    schema = wf.output_schema
    lengths = [len(r) for r in raw_lists if r is not None] + [0]
    assert schema["raw"].properties["value_count"] == {"min": min(lengths), "max": max(lengths)}
    assert schema["raw"].is_list and ts.Tags.CATEGORICAL in schema["raw"].tags
    assert schema["ints"].properties["value_count"] == {"min": 3, "max": 3}
    assert not schema["ints"].is_ragged and schema["ints"].cardinality == 7 + 1

    wf.save(str(tmp_path / "wf"))
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    again = loaded.transform(ds).compute()
    pd.testing.assert_frame_equal(again, out)
    assert loaded.output_schema == schema

    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    exported = ts.Dataset(str(tmp_path / "out"))
    back = pa.concat_tables(exported.read_piece(p) for p in exported.pieces)
    for name in ["raw", "ints", "strs"]:
        assert back[name].to_pylist() == pylist(out[name])
    assert exported.schema["ints"].properties["value_count"] == {"min": 3, "max": 3}


def test_list_ops_params_round_trip():
    for op in [SplitList("; ", dtype="int32"), ListSlice(-3, -1, pad=True, pad_value=7), ValueCount()]:
        config = op.to_config()
        assert type(op).from_config(config).get_params() == op.get_params() == config["params"]


def test_padding_categorified_ids_with_an_id_outside_their_domain_is_refused(tmp_path):
    """Categorify() >> ListSlice(3, pad=True, pad_value=1000): the schema's domain and
    cardinality (which size the embedding tables) said 0..6 while the data held 1000.
    Refused by name once the vocabulary (the domain) is known: at transform and export.
    0, the padding id, pads as before."""
    df = pd.DataFrame({"tags": [["a", "b"], ["c"], [], ["a", "b", "c", "d"]]})
    for pad in (1000, -1):
        wf = ts.Workflow(["tags"] >> ops.Categorify() >> ops.ListSlice(3, pad=True, pad_value=pad)).fit(ts.Dataset(df))
        message = rf"pad_value {pad} is outside the ids of the categorical column 'tags' \(0\.\.\d+, its schema's domain\)"
        with pytest.raises(ValueError, match=message):
            wf.transform(df)
        with pytest.raises(ValueError, match=message):
            wf.transform(ts.Dataset(df)).to_parquet(str(tmp_path / f"out{pad}"))
    wf = ts.Workflow(["tags"] >> ops.Categorify() >> ops.ListSlice(3, pad=True)).fit(ts.Dataset(df))
    out = wf.transform(df)["tags"]
    domain = wf.output_schema["tags"].properties["domain"]
    assert all(domain["min"] <= v <= domain["max"] for row in out for v in row)
    assert [len(row) for row in out] == [3, 3, 3, 3] and list(out[1])[1:] == [0, 0]

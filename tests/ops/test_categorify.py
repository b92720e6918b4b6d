"""Categorify beyond the basics: groups, given vocabularies, lists, buckets, spilling."""

import os
import threading

import dask.config
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.hashing import murmur3_32


def encode_reference(train_values, apply_values, freq_threshold=0, num_buckets=None):
    """Ids the documented way, with plain Python."""
    counts = pd.Series([v for v in train_values if v is not None and not pd.isna(v)]).value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= max(freq_threshold, 1)), key=lambda kv: (-kv[1], kv[0]))
    start = 2 + (num_buckets or 1)
    mapping = {v: start + i for i, (v, _) in enumerate(kept)}

    def one(v):
        if v is None or (isinstance(v, float) and np.isnan(v)):
            return 1
        if v in mapping:
            return mapping[v]
        if num_buckets:
            return 2 + int(murmur3_32(pa.array([v]))[0]) % num_buckets
        return 2

    return [one(v) for v in apply_values]


def fit_apply(node, df, part_size=None):
    wf = ts.Workflow(node).fit(ts.Dataset(df, part_size=part_size))
    return wf, wf.transform(df)


@pytest.fixture
def pairs():
    rng = np.random.default_rng(3)
    n = 1500
    users = np.array([f"u{i}" for i in range(40)])
    return pd.DataFrame({
        "buyer": pd.array(users[rng.zipf(1.6, n) % 40], dtype="str"),
        "seller": pd.array(users[rng.zipf(1.3, n) % 40], dtype="str"),
        "item": rng.integers(0, 30, n),
    })


def test_joint_groups_share_one_vocabulary(pairs):
    wf, out = fit_apply([["buyer", "seller"], "item"] >> ops.Categorify(encode_type="joint"), pairs, 4000)
    both = list(pairs["buyer"]) + list(pairs["seller"])
    assert out["buyer"].tolist() == encode_reference(both, pairs["buyer"])
    assert out["seller"].tolist() == encode_reference(both, pairs["seller"])
    assert out["item"].tolist() == encode_reference(list(pairs["item"]), pairs["item"])
    s = wf.output_schema
    assert s["buyer"].properties["domain"] == s["seller"].properties["domain"]
    assert s["buyer"].properties["domain"]["name"] == "buyer_seller"
    from tabstream.train import table_configs_from_schema

    tables = {t.name: t.feature_names for t in table_configs_from_schema(s)}
    assert tables == {"buyer_seller": ("buyer", "seller"), "item": ("item",)}


def single_table_reference(df, columns, num_buckets=None):
    """NVTabular's single table, in plain Python: each column's own vocabulary
    (descending count, ties by value), the columns' id ranges one after the other
    from the first vocabulary id; missing 1, unseen 2 (or a bucket)."""
    start = 2 + (num_buckets or 1)
    out, total = {}, 0
    for c in columns:
        ids = encode_reference(list(df[c]), list(df[c]), num_buckets=num_buckets)
        out[c] = [i + total if i >= start else i for i in ids]
        total += df[c].dropna().nunique()
    return out, start + total


@pytest.mark.parametrize("num_buckets", [None, 3])
@pytest.mark.parametrize("part_size", [None, 3000])
def test_single_table_puts_each_vocabulary_at_its_own_offset(pairs, num_buckets, part_size):
    df = pairs.copy()
    df.loc[::11, "buyer"] = None
    cols = ["seller", "buyer", "item"]
    wf, out = fit_apply(cols >> ops.Categorify(single_table=True, num_buckets=num_buckets), df, part_size)
    expected, cardinality = single_table_reference(df, cols, num_buckets)
    for c in cols:
        assert out[c].tolist() == expected[c], c
    s = wf.output_schema
    assert {s[c].cardinality for c in cols} == {cardinality}
    assert {s[c].properties["domain"]["name"] for c in cols} == {"seller_buyer_item"}
    from tabstream.train import table_configs_from_schema

    [table] = table_configs_from_schema(s)
    assert table.cardinality == cardinality and table.feature_names == tuple(cols)


def test_single_table_ranges_do_not_overlap_and_survive_save(tmp_path, pairs):
    cols = ["buyer", "seller"]
    wf, out = fit_apply(cols >> ops.Categorify(single_table=True), pairs)
    start = 3
    assert out["buyer"].min() >= start and out["seller"].min() == out["buyer"].max() + 1
    assert out["buyer"].max() == start + pairs["buyer"].nunique() - 1
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert again.transform(pairs).equals(out)
    new = pd.DataFrame({"buyer": pd.array(["never", None], dtype="str"),
                        "seller": pd.array(["never", None], dtype="str")})
    assert again.transform(new)["seller"].tolist() == [2, 1]


def test_combo_encodes_the_combination(pairs):
    df = pairs.copy()
    df.loc[::7, "seller"] = None
    wf, out = fit_apply([["buyer", "seller"]] >> ops.Categorify(encode_type="combo", freq_threshold=2), df, 3000)
    assert list(out.columns) == ["buyer_seller"]
    keys = [None if b is None and s is None else (b, "<null>" if pd.isna(s) else s)
            for b, s in zip(df["buyer"], df["seller"])]
    assert out["buyer_seller"].tolist() == encode_reference(keys, keys, freq_threshold=2)
    assert wf.output_schema["buyer_seller"].cardinality == max(out["buyer_seller"]) + 1 or \
        wf.output_schema["buyer_seller"].cardinality > max(out["buyer_seller"])


def test_combo_groups_and_single_names_are_all_encoded(pairs):
    """``[["buyer", "seller"], "buyer", "seller"]``: the pair's combination and each
    column on its own, as NVTabular outputs them."""
    df = pairs.copy()
    df.loc[::5, "buyer"] = None
    wf, out = fit_apply([["buyer", "seller"], "buyer", "seller"] >> ops.Categorify(encode_type="combo"), df)
    assert list(out.columns) == ["buyer_seller", "buyer", "seller"]
    assert wf.output_schema.column_names == ["buyer_seller", "buyer", "seller"]
    keys = [(None if b is None or pd.isna(b) else b, s) for b, s in zip(df["buyer"], df["seller"])]
    keys = [(("<null>" if b is None else b), s) for b, s in keys]
    assert out["buyer_seller"].tolist() == encode_reference(keys, keys)
    assert out["buyer"].tolist() == encode_reference(list(df["buyer"]), df["buyer"])
    assert out["seller"].tolist() == encode_reference(list(df["seller"]), df["seller"])


def test_combo_keys_stay_distinct_when_values_hold_the_separator():
    """A combination's key joins its parts with "\\x1f" and writes a null part as
    "\\x00": values holding those characters (or the escape "\\x1b") must not make
    two combinations one. Each combination is repeated a different number of times,
    so its id follows from its count alone."""
    combos = [("x\x1fy", "z"), ("x", "y\x1fz"), (None, "k"), ("\x00", "k"), ("\x1bs", "k"),
              ("\x1f", "k"), ("a\x1bn", "b"), ("a\x00", "b"), ("plain", "b"), ("plain", None)]
    rows = [c for i, c in enumerate(combos) for _ in range(i + 1)]
    df = pd.DataFrame({"a": pd.array([a for a, _ in rows], dtype="str"),
                       "b": pd.array([b for _, b in rows], dtype="str")})
    op = ops.Categorify(encode_type="combo")
    wf, out = fit_apply([["a", "b"]] >> op, df)
    keys = [(a, b) for a, b in rows]
    expected = {c: 2 + len(combos) - i for i, c in enumerate(combos)}  # most frequent first, from 3
    assert out["a_b"].tolist() == [expected[k] for k in keys]
    assert len(set(out["a_b"])) == len(combos)
    # strings without those characters keep the key they always had (saved vocabularies)
    mapping = op.reverse_mapping("a_b").to_pydict()
    by_id = dict(zip(mapping["id"], mapping["value"]))
    assert by_id[expected[("plain", "b")]] == "plain\x1fb"
    assert by_id[expected[("plain", None)]] == "plain\x1f\x00"
    assert by_id[expected[("x\x1fy", "z")]] == "x\x1bsy\x1fz"


@pytest.mark.parametrize("encode_type", ["joint", "combo"])
def test_a_group_and_a_column_named_like_it_are_refused(encode_type):
    """The joint group ["a", "b"] and a column "a_b" would share the vocabulary "a_b":
    refused with the names, instead of encoding a and b with a_b's values."""
    df = pd.DataFrame({"a": ["x", "y"], "b": ["p", "q"], "a_b": ["m", "n"]})
    with pytest.raises(ValueError, match=r"\['a', 'b'\] and \['a_b'\] would share the vocabulary 'a_b'"):
        ts.Workflow([["a", "b"], "a_b"] >> ops.Categorify(encode_type=encode_type)).fit(ts.Dataset(df))
    # apart, each has its own vocabulary
    out = ts.Workflow([["a", "b"]] >> ops.Categorify(encode_type=encode_type)).fit(ts.Dataset(df)).transform(df)
    assert len(out.columns) == (2 if encode_type == "joint" else 1)


def test_string_view_columns_encode_as_strings():
    """string_view columns (and lists of them): pyarrow has no take, filter or index_in
    kernels for them; they are fitted and encoded as the same strings would be."""
    values = ["aaaaaaaa", "b", "aaaaaaaa", None, "ccc", "b", "aaaaaaaa"]
    lists = [["b", "aaaaaaaa"], None, [], ["ccc"], ["b"], ["b", None], ["z"]]
    view = pa.table({"c": pa.array(values, pa.string_view()),
                     "l": pa.array(lists, pa.list_(pa.string_view()))})
    plain = pa.table({"c": pa.array(values, pa.string()), "l": pa.array(lists, pa.list_(pa.string()))})
    op = ops.Categorify()
    wf = ts.Workflow(["c", "l"] >> op).fit(ts.Dataset(view))
    out = wf.transform(view)
    assert out["c"].to_pylist() == encode_reference(values, values)
    flat = [v for row in lists if row for v in row]
    assert out["l"].to_pylist() == [None if row is None else encode_reference(flat, row) for row in lists]
    # a vocabulary fitted on plain strings encodes the view column, and the reverse
    other = ts.Workflow(["c", "l"] >> ops.Categorify()).fit(ts.Dataset(plain))
    assert other.transform(view)["c"].to_pylist() == out["c"].to_pylist()
    assert wf.transform(plain)["l"].to_pylist() == out["l"].to_pylist()


def test_given_vocabulary_is_used_in_order(pairs):
    op = ops.Categorify(vocabs={"buyer": ["u3", "u1", "u2"]})
    _, out = fit_apply(["buyer"] >> op, pairs)
    expected = [{"u3": 3, "u1": 4, "u2": 5}.get(v, 2) for v in pairs["buyer"]]
    assert out["buyer"].tolist() == expected
    with pytest.raises(ValueError, match="duplicate values"):
        ops.Categorify(vocabs={"c": ["a", "a"]}).fit_table(pa.table({"c": ["a"]}))


@pytest.mark.parametrize("num_buckets", [1, 4, 10])
def test_num_buckets_hash_rare_and_unseen_values(pairs, num_buckets):
    wf, _ = fit_apply(["buyer"] >> ops.Categorify(freq_threshold=30, num_buckets=num_buckets), pairs)
    new = pd.DataFrame({"buyer": pd.array(["u0", "never-seen", "u39", None, "also-new"], dtype="str")})
    got = wf.transform(new)["buyer"].tolist()
    assert got == encode_reference(list(pairs["buyer"]), list(new["buyer"]), 30, num_buckets)
    assert wf.output_schema["buyer"].properties["num_buckets"] == num_buckets


def test_list_columns_from_parquet(tmp_path):
    table = pa.table({
        "tags": pa.array([["a", "b"], [], None, ["b", "b", "c"], ["z"]], pa.list_(pa.string())),
        "ids": pa.array([[1, 2], [2], [3, 3], None, []], pa.list_(pa.int64())),
    })
    pq.write_table(table, tmp_path / "lists.parquet")
    ds = ts.Dataset(str(tmp_path / "lists.parquet"))
    assert ds.schema["tags"].is_list
    wf = ts.Workflow(["tags", "ids"] >> ops.Categorify()).fit(ds)
    out = wf.transform(table)
    flat = [v for row in table.column("tags").to_pylist() if row for v in row]
    expected = [None if row is None else encode_reference(flat, row) for row in table.column("tags").to_pylist()]
    assert out.column("tags").to_pylist() == expected
    assert wf.output_schema["tags"].is_list and wf.output_schema["tags"].dtype == "int64"


@pytest.mark.parametrize("spill_rows", [5, 50])
def test_spilling_gives_the_same_vocabulary(tmp_path, spill_rows):
    rng = np.random.default_rng(11)
    df = pd.DataFrame({"c": pd.array([f"v{x}" for x in rng.zipf(1.2, 5000) % 900], dtype="str")})
    in_memory = ops.Categorify(freq_threshold=2)
    spilled = ops.Categorify(freq_threshold=2, spill_rows=spill_rows, spill_buckets=7, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> in_memory).fit(ts.Dataset(df, part_size=8000))
    ts.Workflow(["c"] >> spilled).fit(ts.Dataset(df, part_size=8000))
    assert spilled.tables["c"].equals(in_memory.tables["c"])
    assert list(tmp_path.iterdir()) == []  # spill files are cleaned up


def test_save_load_keeps_groups_and_vocabularies(pairs, tmp_path):
    node = ([["buyer", "seller"]] >> ops.Categorify(encode_type="joint")) + (
        [["buyer", "item"]] >> ops.Categorify(encode_type="combo"))
    wf, out = fit_apply(node, pairs)
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(again.transform(pairs), out)


def test_reverse_mapping_for_joint_group(pairs):
    op = ops.Categorify(encode_type="joint")
    _, out = fit_apply([["buyer", "seller"]] >> op, pairs)
    rev = op.reverse_mapping("seller").to_pandas()
    back = dict(zip(rev["id"], rev["value"]))
    assert [back[i] for i in out["seller"]] == list(pairs["seller"])


def test_max_size_of_a_joint_group_bounds_its_shared_table(pairs):
    # max_size is keyed by the vocabulary's name; the table keeps max_size rows:
    # 0 padding, 1 null, 2..4 hashed out-of-vocabulary ids, then 10 - 5 values
    op = ops.Categorify(encode_type="joint", num_buckets=3, max_size={"buyer_seller": 10})
    wf, out = fit_apply([["buyer", "seller"]] >> op, pairs)
    both = pd.Series(list(pairs["buyer"]) + list(pairs["seller"])).value_counts()
    kept = sorted(both.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    mapping = {v: 5 + i for i, (v, _) in enumerate(kept)}
    for col in ["buyer", "seller"]:
        expected = [mapping.get(v, 2 + int(murmur3_32(pa.array([v]))[0]) % 3) for v in pairs[col]]
        assert out[col].tolist() == expected
        assert wf.output_schema[col].cardinality == 10
    assert out.max().max() == 9


@pytest.mark.parametrize("dtype", ["int64", "int32"])
@pytest.mark.parametrize("index_type", [pa.int8(), pa.int16(), pa.int32()])
def test_dictionary_chunks_with_null_indices_encode_like_decoded_values(dtype, index_type):
    # a full int8 dictionary (128 entries): a null index must still get id 1
    rng = np.random.default_rng(3)
    entries = pa.array([f"w{i}" for i in range(128)])
    chunks = []
    for k in range(3):
        idx = [None if rng.random() < 0.2 else int(x) for x in rng.integers(0, 128 - k, 400)]
        chunks.append(pa.DictionaryArray.from_arrays(pa.array(idx, index_type), entries.slice(k)))
    column = pa.chunked_array(chunks)
    decoded = [v for ch in chunks for v in ch.cast(pa.string()).to_pylist()]
    op = ops.Categorify(freq_threshold=4, dtype=dtype).fit_table(pa.table({"c": decoded}))
    got = op.transform(pa.table({"c": column}))["c"]
    counts = pd.Series(decoded).dropna().value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 4), key=lambda kv: (-kv[1], kv[0]))
    ids = {v: 3 + i for i, (v, _) in enumerate(kept)}
    assert got.type == getattr(pa, dtype)()
    assert got.to_pylist() == [1 if v is None else ids.get(v, 2) for v in decoded]


def test_a_spill_is_one_file_read_back_by_bucket(tmp_path, monkeypatch):
    rng = np.random.default_rng(12)
    df = pd.DataFrame({"c": pd.array([f"v{x:04d}" for x in rng.zipf(1.2, 6000) % 2000], dtype="str")})
    op = ops.Categorify(freq_threshold=2, spill_rows=40, spill_buckets=6, spill_dir=str(tmp_path))
    spills, rows, seen = [], {}, []
    spill, merge = ops.Categorify._spill, ops.Categorify._merge_spilled

    def spy_spill(self, table, *args):
        written = spill(self, table, *args)
        spills.append(written)
        rows[written.path] = table.num_rows
        return written

    def spy_merge(self, name, counts):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        for s in counts.spilled:  # the buckets' byte ranges cover the file, and hold the rows
            assert os.path.getsize(s.path) == s.offsets[-1]
            assert sum(s.read(b).num_rows for b in range(6)) == rows[s.path]
        return merge(self, name, counts)

    monkeypatch.setattr(ops.Categorify, "_spill", spy_spill)
    monkeypatch.setattr(ops.Categorify, "_merge_spilled", spy_merge)
    ts.Workflow(["c"] >> op).fit(ts.Dataset(df, part_size=8000))
    assert len(spills) > 1
    # one file per spill, every one merged
    assert seen == [sorted(os.path.basename(s.path) for s in spills)]
    assert all(s.path.endswith(".arrow") and len(s.offsets) == 7 for s in spills)
    counts = df["c"].value_counts()
    counts = counts[counts >= 2]
    expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"]["values"].to_pylist() == [v for v, _ in expected]
    assert op.tables["c"]["counts"].to_pylist() == [c for _, c in expected]
    assert list(tmp_path.iterdir()) == []


def test_a_failing_spill_write_leaves_no_file(tmp_path, monkeypatch):
    op = ops.Categorify(spill_rows=1, spill_buckets=4, spill_dir=str(tmp_path))
    table = pa.table({"values": pa.array(["a", "b", "c", "d", "e"]), "counts": pa.array([1, 2, 3, 4, 5])})
    calls = []
    original = pa.ipc.new_stream

    def failing(sink, schema):
        calls.append(1)
        if len(calls) == 3:  # the third bucket
            raise OSError("disk full")
        return original(sink, schema)

    monkeypatch.setattr(pa.ipc, "new_stream", failing)
    with pytest.raises(OSError, match="disk full"):
        op._spill(table)
    assert list(tmp_path.iterdir()) == []


def test_a_local_spill_reads_back_each_bucket_and_refuses_a_cut_file(tmp_path):
    """A spill on a local path is read with plain file reads (not fsspec): each bucket
    holds exactly the rows whose bucket the backend computes, and a file cut short
    (a full disk, another process) is an error naming it, never fewer counts."""
    from tabstream.backends.arrow import ArrowBackend

    rng = np.random.default_rng(3)
    values = pa.array([f"{x:08x}" for x in rng.integers(0, 2**32, 3000)] + ["short", "longer-value"])
    table = pa.table({"values": values, "counts": pa.array(rng.integers(1, 9, len(values)))})
    op = ops.Categorify(spill_buckets=5, spill_dir=str(tmp_path))
    spill = op._spill(table)
    buckets = ArrowBackend().spill_buckets(values, 5)
    for b in range(5):
        expected = table.filter(pa.array(buckets == b))
        got = spill.read(b)
        assert sorted(zip(got["values"].to_pylist(), got["counts"].to_pylist())) == \
            sorted(zip(expected["values"].to_pylist(), expected["counts"].to_pylist()))
    with open(spill.path, "r+b") as f:
        f.truncate(spill.offsets[4] + 10)
    assert spill.read(3).num_rows == int((buckets == 3).sum())
    with pytest.raises(OSError, match="shorter than written") as err:
        spill.read(4)
    assert spill.path in str(err.value)
    spill.remove()
    assert list(tmp_path.iterdir()) == []


def test_vocabularies_merged_in_memory_are_finalized_side_by_side(monkeypatch):
    """finalize runs the in-memory vocabularies on two threads at once (a barrier of two
    that only passes when two run together), and each vocabulary and its candidates are
    what pandas counts."""
    monkeypatch.setitem(dask.config.config, "num_workers", 2)
    rng = np.random.default_rng(5)
    df = pd.DataFrame({f"c{i}": [f"v{x}" for x in rng.zipf(1.5, 3000) % (50 + 400 * i)] for i in range(4)})
    barrier = threading.Barrier(2, timeout=20)
    threads = set()
    original = ops.Categorify._finalize_one

    def spy(self, name, counts):
        threads.add(threading.get_ident())
        if len(threads) <= 2 and not barrier.broken:
            barrier.wait()  # raises BrokenBarrierError when the other never comes
        return original(self, name, counts)

    monkeypatch.setattr(ops.Categorify, "_finalize_one", spy)
    op = ops.Categorify(freq_threshold=3)
    ts.Workflow(list(df.columns) >> op).fit(ts.Dataset(df, part_size=20000), progress=False)
    assert len(threads) >= 2
    for col in df.columns:
        counts = df[col].value_counts()
        kept = sorted(((v, c) for v, c in counts.items() if c >= 3), key=lambda kv: (-kv[1], kv[0]))
        assert op.tables[col]["values"].to_pylist() == [v for v, _ in kept]
        assert op.tables[col]["counts"].to_pylist() == [c for _, c in kept]
        below = op.candidates[col].to_pandas() if col in op.candidates else pd.DataFrame({"values": [], "counts": []})
        assert dict(zip(below["values"], below["counts"])) == {v: c for v, c in counts.items() if c < 3}
    assert op.candidates  # some vocabulary has values below the threshold

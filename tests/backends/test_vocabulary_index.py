"""The arrow backend's vocabulary index (a hash table built once per vocabulary and
probed by every partition's ``encode_ids``): the ids it gives equal a plain dict
lookup, it is used where it applies and declined (falling back to ``index_in``)
where it does not, and Categorify builds it once per vocabulary and process."""

import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream.backends.arrow as arrow
from tabstream.backends.arrow import ArrowBackend
from tabstream.core.operators import _LOOKUP_INDEXES
from tabstream.ops import Categorify

BACKEND = ArrowBackend()


def hex_ids(rng, n, width=8):
    """``n`` distinct lower-case hex strings of ``width`` characters."""
    codes = rng.choice(16 ** min(width, 12), size=n * 2, replace=False)[:n] if width < 8 else \
        np.unique(rng.integers(0, 16 ** width, size=n * 2))[:n]
    out = np.array([format(int(c), f"0{width}x") for c in codes], dtype=object)
    rng.shuffle(out)
    return list(out)


def held(op):
    """(group, key) -> (source, index) of what ``op`` keeps."""
    return {(group, key): entry for group, kept in _LOOKUP_INDEXES.get(op, {}).items()
            for key, entry in kept.items()}


def reference_ids(values, vocab, start=3, missing=1, unknown=2):
    position = {v: i for i, v in enumerate(vocab)}
    return [missing if v is None else position[v] + start if v in position else unknown
            for v in values]


@pytest.fixture
def small_index_floor(monkeypatch):
    monkeypatch.setattr(arrow, "_INDEX_MIN", 2)


@pytest.fixture
def probes(monkeypatch):
    """How many lookups the index answered (positions() not None) and declined."""
    seen = {"answered": 0, "declined": 0}
    original = arrow._VocabularyIndex.positions

    def positions(self, column):
        out = original(self, column)
        seen["declined" if out is None else "answered"] += 1
        return out

    monkeypatch.setattr(arrow._VocabularyIndex, "positions", positions)
    return seen


def _string_cases():
    """(values, column, vocabulary values, vocabulary type) where the index applies."""
    rng = np.random.default_rng(3)
    pool = hex_ids(rng, 600)
    vocab = pool[::2] + ["zzzzzzzz"]  # half the values seen, and one never seen
    values = list(rng.choice(np.array(pool, dtype=object), 3000))
    for i in rng.choice(3000, 400, replace=False):
        values[i] = None
    yield "nulls", values, pa.array(values), vocab, pa.string()
    yield "two chunks", values, pa.chunked_array([pa.array(values[:999]), pa.array(values[999:])]), \
        vocab, pa.string()
    yield "large_string column", values, pa.array(values, pa.large_string()), vocab, pa.string()
    yield "large_string vocabulary", values, pa.array(values), vocab, pa.large_string()
    whole = pa.array([None, *values])
    yield "sliced", values, whole.slice(1), vocab, pa.string()
    no_nulls = [v for v in values if v is not None]
    yield "no nulls", no_nulls, pa.array(no_nulls), vocab, pa.string()
    as_bytes = [None if v is None else v.encode() for v in values]
    yield "binary", as_bytes, pa.array(as_bytes, pa.binary()), [v.encode() for v in vocab], pa.binary()


@pytest.mark.parametrize("case", list(_string_cases()), ids=lambda c: c[0])
def test_string_ids_through_the_index_match_a_dict_lookup(case, small_index_floor):
    _, values, column, vocab, vocab_type = case
    vocabulary = pa.array(vocab, vocab_type)
    index = BACKEND.vocabulary_index(vocabulary)
    assert index is not None
    assert index.positions(column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column)
    got = BACKEND.encode_ids(column, vocabulary, 3, 1, 2, index)
    assert got.type == pa.int64() and got.null_count == 0
    assert got.to_pylist() == reference_ids(values, vocab)
    assert got.to_pylist() == BACKEND.encode_ids(column, vocabulary, 3, 1, 2).to_pylist()


@pytest.mark.parametrize("type_", [pa.int64(), pa.int32(), pa.uint16(), pa.int8()])
def test_integer_ids_through_the_index_match_a_dict_lookup(type_, small_index_floor):
    rng = np.random.default_rng(5)
    values = [int(v) for v in rng.integers(0, 100, 2000)]
    for i in rng.choice(2000, 300, replace=False):
        values[i] = None
    vocab = [int(v) for v in rng.permutation(100)[:60]]
    whole = pa.array([7, *values], type_)  # sliced: the values start at offset 1
    column = whole.slice(1)
    vocabulary = pa.array(vocab, type_)
    index = BACKEND.vocabulary_index(vocabulary)
    assert index is not None and index.positions(column) is not None
    got = BACKEND.encode_ids(column, vocabulary, 3, 1, 2, index)
    assert got.to_pylist() == reference_ids(values, vocab)


def test_columns_of_other_widths_or_types_get_the_same_ids(small_index_floor):
    vocab = ["aaaaaaaa", "bbbbbbbb", "cccccccc"]
    index = BACKEND.vocabulary_index(pa.array(vocab))
    cases = [
        ["aaaaaaaa", "b", None, "cccccccc"],       # mixed widths: those of 8 bytes looked up
        ["aaaa", "bbbb", None],                    # another width: never in the vocabulary
    ]
    for values in cases:
        column = pa.array(values)
        assert index.positions(column) is not None
        assert BACKEND.encode_ids(column, pa.array(vocab), 3, 1, 2, index).to_pylist() == \
            reference_ids(values, vocab)
    # a dictionary column: each chunk's dictionary is looked up, the index unused
    values = ["cccccccc", None, "zzzzzzzz", "aaaaaaaa", "cccccccc"]
    column = pa.array(values).dictionary_encode()
    assert BACKEND.encode_ids(column, pa.array(vocab), 3, 1, 2, index).to_pylist() == \
        reference_ids(values, vocab)
    # integers of another type than the vocabulary's: index_in after all
    int_index = BACKEND.vocabulary_index(pa.array([4, 5, 6], pa.int64()))
    column = pa.array([6, None, 9, 4], pa.int32())
    assert int_index.positions(column) is None
    assert BACKEND.encode_ids(column, pa.array([4, 5, 6], pa.int32()), 3, 1, 2, int_index).to_pylist() == \
        [5, 1, 2, 3]


def test_vocabularies_without_an_index(small_index_floor):
    for vocabulary in (
        pa.array(["abc", "abd", "abc"]),          # repeated values
        pa.array(["abcd", None, "abce"]),         # a null
        pa.array(["abc", "abcd"]),                # mixed widths
        pa.array(["abc", "abd"]),                 # width 3: no integer view
        pa.array([1.5, 2.5]),                     # floats
    ):
        assert BACKEND.vocabulary_index(vocabulary) is None, vocabulary


def test_index_only_for_large_vocabularies():
    rng = np.random.default_rng(9)
    large = hex_ids(rng, arrow._INDEX_MIN)
    assert BACKEND.vocabulary_index(pa.array(large)) is not None
    assert BACKEND.vocabulary_index(pa.array(large[:-1])) is None
    values = list(rng.choice(np.array(large + hex_ids(rng, 500), dtype=object), 20000))
    index = BACKEND.vocabulary_index(pa.array(large))
    got = BACKEND.encode_ids(pa.array(values), pa.array(large), 3, 1, 2, index)
    assert got.to_pylist() == reference_ids(values, large)


def test_categorify_builds_one_index_per_vocabulary_and_matches_pandas(small_index_floor):
    rng = np.random.default_rng(13)
    pool = np.array(hex_ids(rng, 300), dtype=object)
    frame = pd.DataFrame({"a": rng.choice(pool, 5000), "b": rng.choice(pool[:40], 5000)})
    frame.loc[rng.choice(5000, 500, replace=False), "a"] = None
    table = pa.Table.from_pandas(frame, preserve_index=False)
    op = Categorify()
    op.finalize(op.combine_root([op.fit_partition(table.slice(0, 2500)), op.fit_partition(table.slice(2500))]))

    def expected(column):
        counts = frame[column].value_counts().reset_index()
        counts.columns = ["value", "count"]
        order = counts.sort_values(["count", "value"], ascending=[False, True])["value"]
        ids = {v: i + op.start_index for i, v in enumerate(order)}
        return [1 if pd.isna(v) else ids[v] for v in frame[column]]

    parts = [op.transform(table.slice(0, 1000)), op.transform(table.slice(1000))]
    built = held(op)
    assert {key[0] for key in built} == {"a", "b"}
    assert all(index is not None for _, index in built.values())
    op.transform(table.slice(0, 10))
    assert all(held(op)[k][1] is built[k][1] for k in built)  # not built again
    for column in ("a", "b"):
        got = pa.chunked_array([p[column] for p in parts]).to_pylist()
        assert got == expected(column)

    # replaced vocabularies get a new index; a pickled op carries none and encodes alike
    op.tables = {name: t.slice(0) for name, t in op.tables.items()}
    op.transform(table.slice(0, 10))
    assert all(held(op)[k][1] is not built[k][1] for k in built)
    copy = pickle.loads(pickle.dumps(op))
    assert copy not in _LOOKUP_INDEXES
    assert copy.transform(table).to_pydict() == op.transform(table).to_pydict()


@pytest.mark.parametrize("num_buckets", [1, 7])
def test_hashed_out_of_vocabulary_ids_through_the_index(small_index_floor, probes, num_buckets):
    from tabstream.core.hashing import murmur3_32

    rng = np.random.default_rng(17)
    pool = np.array(hex_ids(rng, 400), dtype=object)
    train = pd.DataFrame({"c": rng.choice(pool[:250], 4000)})
    apply = [*rng.choice(pool, 300), None, "zzzzzzzz", "short"]  # seen, unseen, null, other widths
    op = Categorify(num_buckets=num_buckets)
    op.finalize(op.combine_root([op.fit_partition(pa.Table.from_pandas(train, preserve_index=False))]))
    counts = train["c"].value_counts()
    order = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    ids = {v: i + 2 + num_buckets for i, (v, _) in enumerate(order)}

    def reference(v):
        if v is None:
            return 1
        return ids.get(v, 2 + int(murmur3_32(pa.array([v]))[0]) % num_buckets)

    got = op.transform(pa.table({"c": pa.array(apply, pa.string())}))["c"].to_pylist()
    assert got == [reference(v) for v in apply]
    fixed = [v for v in apply if v is None or len(v) == 8]
    got = op.transform(pa.table({"c": pa.array(fixed, pa.string())}))["c"].to_pylist()
    assert got == [reference(v) for v in fixed]
    assert probes == {"answered": 2, "declined": 0}  # both through the index, mixed widths too


def test_values_of_several_widths_are_looked_up_through_the_index(small_index_floor, probes):
    rng = np.random.default_rng(21)
    pool = hex_ids(rng, 500)
    vocab = pool[:300]
    values = [*rng.choice(np.array(pool, dtype=object), 400), "abc", "", "0123456789", None, "zz"]
    rng.shuffle(values)
    raw = pa.array(values, pa.large_string())
    for column in (raw, raw.slice(3), pa.chunked_array([raw.slice(0, 100), raw.slice(100)])):
        expected = reference_ids(column.to_pylist(), vocab)
        index = BACKEND.vocabulary_index(pa.array(vocab))
        assert BACKEND.encode_ids(column, pa.array(vocab), 3, 1, 2, index).to_pylist() == expected
    assert probes == {"answered": 3, "declined": 0}
    # a null whose slot holds bytes (no fixed-width view either)
    with_bytes = pa.Array.from_buffers(pa.string(), 3, [pa.py_buffer(bytes([0b101])),
                                                        pa.py_buffer(np.array([0, 8, 16, 24], np.int32)),
                                                        pa.py_buffer((vocab[0] + "zzzzzzzz" + vocab[1]).encode())])
    assert with_bytes.to_pylist() == [vocab[0], None, vocab[1]]
    index = BACKEND.vocabulary_index(pa.array(vocab))
    assert BACKEND.encode_ids(with_bytes, pa.array(vocab), 3, 1, 2, index).to_pylist() == [3, 1, 4]


def test_an_integer_column_without_a_data_buffer_falls_back(small_index_floor):
    index = BACKEND.vocabulary_index(pa.array([4, 5, 6], pa.int64()))
    empty = pa.Array.from_buffers(pa.int64(), 0, [None, None])
    assert index.positions(empty) is None
    assert BACKEND.encode_ids(empty, pa.array([4, 5, 6], pa.int64()), 3, 1, 2, index).to_pylist() == []


def test_categorify_indexes_the_vocabulary_as_the_column_takes_it(small_index_floor, probes):
    # a vocabulary given as int64, columns of int32: the index is over the cast values
    op = Categorify(vocabs={"c": list(range(0, 2000, 2))})
    op.finalize(op.combine_root([op.fit_partition(pa.table({"c": pa.array([0], pa.int64())}))]))
    values = [0, 3, 1998, None, 2000, 64]
    got = op.transform(pa.table({"c": pa.array(values, pa.int32())}))["c"].to_pylist()
    assert got == [1 if v is None else 3 + v // 2 if v % 2 == 0 and v < 2000 else 2 for v in values]
    assert probes == {"answered": 1, "declined": 0}


def test_a_refit_drops_the_indexes_of_the_old_vocabularies(small_index_floor):
    op = Categorify()
    op.finalize(op.combine_root([op.fit_partition(pa.table({"a": ["aaaaaaaa", "bbbbbbbb"]}))]))
    op.transform(pa.table({"a": ["aaaaaaaa"]}))
    assert [key[0] for key in held(op)] == ["a"]
    op.finalize(op.combine_root([op.fit_partition(pa.table({"b": ["cccccccc", "dddddddd"]}))]))
    assert op not in _LOOKUP_INDEXES
    op.set_state(*op.get_state())
    op.transform(pa.table({"b": ["dddddddd"]}))
    assert [key[0] for key in held(op)] == ["b"]


def _key_frame(rng, n, key_kind):
    pool = np.array(hex_ids(rng, 300), dtype=object) if key_kind == "string" else rng.permutation(10_000)[:300]
    keys = pool[rng.integers(0, 200, n)]  # the first 200 seen in training
    frame = pd.DataFrame({"k": pd.array(keys, dtype="str" if key_kind == "string" else "Int64"),
                          "price": rng.normal(size=n), "label": rng.integers(0, 2, n)})
    return frame, pool


@pytest.mark.parametrize("key_kind", ["string", "int"])
@pytest.mark.parametrize("op_kind", ["JoinGroupby", "TargetEncoding"])
def test_key_lookups_of_joins_through_the_index_match_the_coded_lookup(monkeypatch, probes, key_kind, op_kind):
    import tabstream as ts
    from tabstream.ops import JoinGroupby, TargetEncoding

    rng = np.random.default_rng(23)
    train, pool = _key_frame(rng, 3000, key_kind)
    apply, _ = _key_frame(rng, 500, key_kind)
    apply.loc[:40, "k"] = pool[250]  # keys never seen in training
    apply.loc[41:60, "k"] = None     # missing keys
    apply.loc[61, "k"] = pool[0][:5] if key_kind == "string" else pool[0]  # another width

    def run(index_floor):
        monkeypatch.setattr(arrow, "_INDEX_MIN", index_floor)
        node = (["k", "price"] >> JoinGroupby(cont_cols=["price"], stats=["count", "sum", "mean"])
                if op_kind == "JoinGroupby" else ["k", "label"] >> TargetEncoding("label", kfold=1, p_smooth=3))
        wf = ts.Workflow(node).fit(ts.Dataset(train, part_size=20_000))
        return wf.transform(apply), wf.transform(apply.iloc[100:]), wf

    coded, coded_tail, _ = run(1 << 40)
    assert probes == {"answered": 0, "declined": 0}
    indexed, indexed_tail, wf = run(2)
    assert probes["answered"] == 2 and probes["declined"] == 0
    pd.testing.assert_frame_equal(indexed, coded)
    pd.testing.assert_frame_equal(indexed_tail, coded_tail)
    # a pickled workflow (as dask ships it) carries no index and gives the same
    copy = pickle.loads(pickle.dumps(wf))
    assert all(node.op not in _LOOKUP_INDEXES for node in copy.output_node.walk()
               if getattr(node, "op", None) is not None)
    pd.testing.assert_frame_equal(copy.transform(apply), coded)


def test_join_groupby_counts_through_the_index_match_pandas(small_index_floor, probes):
    import tabstream as ts
    from tabstream.ops import JoinGroupby

    rng = np.random.default_rng(29)
    train, pool = _key_frame(rng, 2000, "string")
    wf = ts.Workflow(["k", "price"] >> JoinGroupby(cont_cols=["price"], stats=["count"])).fit(ts.Dataset(train))
    keys = [*pool[:250], None]
    out = wf.transform(pd.DataFrame({"k": pd.array(keys, dtype="str"), "price": 0.0}))
    counts = train["k"].value_counts()
    got = out[[c for c in out.columns if c.endswith("count")][0]].tolist()
    seen = [i for i, k in enumerate(keys[:250]) if k in counts]
    assert len(seen) == 200 and [got[i] for i in seen] == [counts[keys[i]] for i in seen]
    assert probes["answered"] == 1


def test_a_missing_key_among_the_fitted_keys_is_coded_not_indexed(small_index_floor, probes):
    import tabstream as ts
    from tabstream.ops import JoinGroupby

    train = pd.DataFrame({"k": pd.array(["aaaaaaaa", None, "bbbbbbbb", None, "aaaaaaaa"], dtype="str"),
                          "price": [1.0, 2.0, 3.0, 4.0, 5.0]})
    wf = ts.Workflow(["k", "price"] >> JoinGroupby(cont_cols=["price"], stats=["sum"])).fit(ts.Dataset(train))
    out = wf.transform(pd.DataFrame({"k": pd.array([None, "bbbbbbbb", "aaaaaaaa"], dtype="str"), "price": 0.0}))
    assert out[out.columns[-1]].tolist() == [6.0, 3.0, 6.0]  # the missing key is a key: its rows sum to 6
    assert probes == {"answered": 0, "declined": 0}


def test_target_encoding_drops_the_indexes_of_its_old_keys(small_index_floor):
    import tabstream as ts
    from tabstream.ops import TargetEncoding

    op = TargetEncoding("label", kfold=1, p_smooth=2)
    wf = ts.Workflow(["k", "label"] >> op)
    ints = pd.DataFrame({"k": [10, 11, 12, 10], "label": [1, 0, 1, 1]})
    wf.fit(ts.Dataset(ints))
    wf.transform(ints)
    assert [key for _, key in held(op)] == [(type(BACKEND), "k", pa.int64())]
    strings = pd.DataFrame({"k": pd.array(["aaaaaaaa", "bbbbbbbb", "aaaaaaaa"], dtype="str"), "label": [1, 0, 0]})
    wf.fit(ts.Dataset(strings))
    assert held(op) == {}
    out = wf.transform(strings)
    assert [key[2] for _, key in held(op)] == [pa.large_string()]
    # (sum + p_smooth * global mean) / (count + p_smooth), global mean 1/3
    aaa, bbb = (1 + 2 / 3) / (2 + 2), (0 + 2 / 3) / (1 + 2)
    assert out[out.columns[0]].tolist() == pytest.approx([aaa, bbb, aaa], rel=1e-6)


def test_a_key_that_does_not_fit_the_fitted_type_is_reported_as_before(small_index_floor):
    from tabstream.ops.keys import lookup

    stored = pa.table({"k": pa.array([1, 2, 3], pa.int64())})
    indexes = {}
    assert lookup(stored, pa.table({"k": pa.array([2, 9], pa.uint64())}), "JoinGroupby",
                  indexes=indexes, source=stored).tolist() == [1, -1]
    assert [entry[1] for entry in indexes.values()] != [None]  # the index answered that one
    with pytest.raises(TypeError, match="key column 'k' is uint64, but the fitted statistics' key 'k' is int64"):
        lookup(stored, pa.table({"k": pa.array([2, 2**63 + 5], pa.uint64())}), "JoinGroupby",
               indexes=indexes, source=stored)
    # a fitted key the common type cannot hold: the index is not built (nothing kept),
    # and the coded lookup reports the column rather than Arrow's cast error
    wide = pa.table({"k": pa.array([1, 2**63 + 5], pa.uint64())})
    wide_indexes = {}
    with pytest.raises(TypeError, match="key column 'k' is int64, but the fitted statistics' key 'k' is uint64"):
        lookup(wide, pa.table({"k": pa.array([1], pa.int64())}), "JoinGroupby",
               indexes=wide_indexes, source=wide)
    assert [entry[1] for entry in wide_indexes.values()] in ([], [None])


def test_no_index_when_the_address_space_limit_leaves_no_room_for_it():
    """pandas' hash table segfaults on a failed allocation: under RLIMIT_AS the index
    is built only when the limit leaves room for it, else ids come through Arrow."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    code = textwrap.dedent("""
        import resource
        import numpy as np, pyarrow as pa
        from tabstream.backends import arrow
        vocab = pa.chunked_array([pa.array(np.arange(2_000_000, dtype=np.int64) * 7)])
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), resource.RLIM_INFINITY))
        print(arrow._room_for(2_000_000 * arrow._INDEX_BYTES_PER_VALUE),
              arrow._vocabulary_index(vocab) is None)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print(arrow._vocabulary_index(vocab) is None)
    """)
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True", "False"]


def _two_threads_at_once(fn):
    """``fn()`` in two threads released together; their results."""
    import threading

    start, out = threading.Barrier(2), [None, None]

    def run(i):
        start.wait()
        out[i] = fn()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


@pytest.fixture
def slow_builds(monkeypatch):
    """Sizes of the vocabularies indexes were built for; each build slowed, so that
    a second thread arrives while the first builds."""
    import time

    builds = []
    original = ArrowBackend.vocabulary_index

    def slow_build(self, vocabulary):
        builds.append(len(vocabulary))
        time.sleep(0.3)
        return original(self, vocabulary)

    monkeypatch.setattr(ArrowBackend, "vocabulary_index", slow_build)
    return builds


def test_threads_transforming_at_once_build_each_index_once(small_index_floor, slow_builds):
    """The export's first partitions ask for the indexes together: the first thread
    builds each one while the other waits for it and uses it, instead of building a
    second copy; both threads' ids equal a dict lookup."""
    rng = np.random.default_rng(8)
    pool = np.array(hex_ids(rng, 400), dtype=object)
    frame = pd.DataFrame({"a": rng.choice(pool, 4000), "b": rng.choice(pool[:90], 4000)})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    op = Categorify()
    op.finalize(op.combine_root([op.fit_partition(table)]))
    slow_builds.clear()
    out = _two_threads_at_once(lambda: op.transform(table))
    assert sorted(slow_builds) == sorted(op.tables[name].num_rows for name in ("a", "b"))
    for column in ("a", "b"):
        expected = reference_ids(frame[column].tolist(), op.tables[column]["values"].to_pylist())
        assert out[0][column].to_pylist() == expected
        assert out[1][column].to_pylist() == expected


def test_key_lookups_at_once_build_each_index_once(small_index_floor, slow_builds):
    """The same for the key columns of JoinGroupby (TargetEncoding shares the lookup):
    one build, and both threads' counts equal pandas'."""
    import tabstream as ts
    from tabstream.ops import JoinGroupby

    rng = np.random.default_rng(31)
    train, pool = _key_frame(rng, 2000, "string")
    wf = ts.Workflow(["k", "price"] >> JoinGroupby(cont_cols=["price"], stats=["count"])).fit(ts.Dataset(train))
    probe = pd.DataFrame({"k": pd.array(list(pool[:250]), dtype="str"), "price": 0.0})
    slow_builds.clear()
    out = _two_threads_at_once(lambda: wf.transform(probe))
    assert len(slow_builds) == 1
    counts = train["k"].value_counts()
    expected = [counts.get(k, 0) for k in probe["k"]]
    for got in out:
        column = [c for c in got.columns if c.endswith("count")][0]
        assert got[column].fillna(0).astype(int).tolist() == expected

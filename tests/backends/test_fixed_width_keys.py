"""Counting and grouping string/binary columns whose values all have one byte width
(hashed as fixed-width keys, see ``_fixed_width_keys``), against pandas, with the
cases that must fall back to the variable-width path: mixed widths, empty strings,
a null slot holding bytes, sliced chunks, large offsets."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from tabstream.backends.arrow import ArrowBackend, _fixed_width_keys

BACKEND = ArrowBackend()


def ids(rng, n, width, distinct=50, null_share=0.2):
    pool = ["".join(rng.choice(list("0123456789abcdef"), width)) for _ in range(distinct)]
    values = rng.choice(pool, n).astype(object)
    values[rng.random(n) < null_share] = None
    return list(values)


def pandas_counts(values):
    s = pd.Series([v for v in values if v is not None], dtype=object)
    return {k: int(c) for k, c in s.value_counts().items()}


def as_dict(table):
    values, counts = table["values"].to_pylist(), table["counts"].to_pylist()
    assert len(set(values)) == len(values), "a value listed twice"
    return dict(zip(values, counts))


def values_of(column):
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    return [v for chunk in chunks for v in chunk.to_pylist()]


@pytest.mark.parametrize("type_", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary()])
@pytest.mark.parametrize("width", [1, 3, 8, 12])
def test_value_counts_of_one_width_match_pandas(type_, width):
    rng = np.random.default_rng(width)
    raw = ids(rng, 3000, width)
    if pa.types.is_binary(type_) or pa.types.is_large_binary(type_):
        raw = [None if v is None else v.encode() for v in raw]
    whole = pa.array(raw, type_)
    # chunks of several lengths, sliced out of one array (offsets not starting at 0),
    # an all-null chunk and an empty one
    column = pa.chunked_array([whole.slice(0, 1000), whole.slice(1000, 1),
                               pa.nulls(5, type_), whole.slice(1001, 0), whole.slice(1001)])
    assert _fixed_width_keys(column) is not None
    got = BACKEND.value_counts(column)
    assert got.schema.field("values").type == type_
    assert as_dict(got) == pandas_counts(values_of(column))


def test_group_by_sum_of_one_width_keys_matches_pandas():
    rng = np.random.default_rng(1)
    keys = [v for v in ids(rng, 5000, 8, distinct=700, null_share=0) if v is not None]
    counts = rng.integers(1, 100, len(keys))
    table = pa.table({"values": pa.chunked_array([pa.array(keys[:2000]), pa.array(keys[2000:])]),
                      "counts": pa.array(counts)})
    assert _fixed_width_keys(table["values"]) is not None
    got = BACKEND.groupby_aggregate(table, ["values"], [("counts", "sum", "counts")])
    want = pd.DataFrame({"values": keys, "counts": counts}).groupby("values")["counts"].sum()
    assert got.schema.field("values").type == pa.string()
    assert as_dict(got) == {k: int(v) for k, v in want.items()}


def test_group_by_with_a_null_key_keeps_the_null_group():
    table = pa.table({"values": pa.array(["aa", None, "bb", None, "aa"]), "counts": [1, 2, 3, 4, 5]})
    got = BACKEND.groupby_aggregate(table, ["values"], [("counts", "sum", "counts")])
    assert dict(zip(got["values"].to_pylist(), got["counts"].to_pylist())) == {"aa": 6, None: 6, "bb": 3}


def null_slot_with_bytes():
    """``["ab", null, "cd"]`` whose null slot spans two bytes ("xy"): valid Arrow
    (a null's bytes are undefined), so the widths cannot be read from the offsets."""
    offsets = np.array([0, 2, 4, 6], np.int32)
    validity = pa.array([True, False, True]).buffers()[1]
    return pa.Array.from_buffers(pa.string(), 3, [validity, pa.py_buffer(offsets), pa.py_buffer(b"abxycd")],
                                 null_count=1)


@pytest.mark.parametrize("column", [
    pa.array(["ab", "abc", "cd", None]),                                   # mixed widths
    pa.array(["ab", "", "cd", "ab"]),                                      # an empty string is a value
    pa.chunked_array([pa.array(["ab", "cd"]), pa.array(["abc", "abc"])]),  # chunks of two widths
    pa.array(["", "", None]),                                              # width 0
    null_slot_with_bytes(),
], ids=["mixed", "empty-value", "chunk-widths", "width-0", "null-with-bytes"])
def test_other_columns_fall_back_and_still_count_right(column):
    assert _fixed_width_keys(column) is None
    assert as_dict(BACKEND.value_counts(column)) == pandas_counts(values_of(column))


def test_only_variable_width_types_are_viewed():
    assert _fixed_width_keys(pa.array([1, 2, 3])) is None
    assert _fixed_width_keys(pa.array(["ab", "cd"], pa.string_view())) is None
    assert _fixed_width_keys(pa.nulls(3, pa.string())) is None


def test_view_holds_the_values_in_order():
    column = pa.chunked_array([pa.array(["abc", None, "cde"]), pa.array([None, "efg", "abc"]).slice(1)])
    keys = _fixed_width_keys(column)
    assert keys.type == pa.binary(3)
    assert values_of(keys) == [b"abc", b"cde", b"efg", b"abc"]


@pytest.mark.parametrize("width", [1, 2, 4, 8])
def test_widths_of_an_integer_are_viewed_as_unsigned_integers(width):
    values = ["".join(chr(97 + (i + j) % 26) for j in range(width)) for i in range(5)]
    keys = _fixed_width_keys(pa.array(values + [None]))
    assert keys.type == pa.type_for_alias(f"uint{8 * width}")
    assert keys.to_numpy().tobytes() == "".join(values).encode()


@pytest.mark.parametrize("width", [3, 8, 12])
def test_group_by_of_zero_padded_ids_matches_pandas(width):
    """Ids sharing a prefix (zero-padded): the keys Arrow's grouper hashes badly as
    fixed_size_binary; the result must match pandas whatever the path."""
    rng = np.random.default_rng(width)
    keys = [f"{x:0{width}d}" for x in rng.integers(0, 500, 3000)]
    counts = rng.integers(1, 9, len(keys))
    got = BACKEND.groupby_aggregate(pa.table({"values": keys, "counts": counts}), ["values"],
                                    [("counts", "sum", "counts")])
    want = pd.DataFrame({"values": keys, "counts": counts}).groupby("values")["counts"].sum()
    assert as_dict(got) == {k: int(v) for k, v in want.items()}


def grouped(table, key="k", value="v"):
    got = BACKEND.groupby_aggregate(table, [key], [(value, "sum", value)])
    out = dict(zip(got[key].to_pylist(), got[value].to_pylist()))
    assert len(out) == got.num_rows, "a key listed twice"
    return got, out


def pandas_sums(keys, values):
    frame = pd.DataFrame({"k": keys, "v": values}).astype({"v": object})
    return {k: sum(int(x) for x in g if x is not None) for k, g in frame.groupby("k", dropna=False)["v"]}


@pytest.mark.parametrize("keys", [
    [f"{x:06d}" for x in np.random.default_rng(0).integers(0, 300, 2000)],   # one width, shared prefix
    [f"k{x}" for x in np.random.default_rng(1).integers(0, 300, 2000)],      # mixed widths
    list(np.random.default_rng(2).integers(-50, 50, 2000)),                  # integer keys
], ids=["padded", "mixed", "int"])
def test_sums_by_key_match_pandas(keys):
    values = np.random.default_rng(3).integers(-5, 1000, len(keys))
    got, out = grouped(pa.table({"k": keys, "v": values}))
    assert got.schema.field("v").type == pa.int64()
    assert out == pandas_sums(keys, values)


def test_sums_past_float_precision_stay_exact():
    keys, values = ["a", "b", "a"], [2**62, 1, 3]
    _, out = grouped(pa.table({"k": keys, "v": pa.array(values, pa.int64())}))
    assert out == {"a": 2**62 + 3, "b": 1}


def test_sums_with_null_values_or_keys_skip_nulls_as_arrow_does():
    _, out = grouped(pa.table({"k": ["a", "b", "a", None], "v": pa.array([1, None, 5, 7], pa.int64())}))
    assert out == {"a": 6, "b": 0, None: 7}


def test_unsigned_sums_keep_arrow_type():
    got, out = grouped(pa.table({"k": ["a", "b", "a"], "v": pa.array([1, 2, 3], pa.uint32())}))
    assert got.schema.field("v").type == pa.uint64() and out == {"a": 4, "b": 2}


@pytest.fixture
def small_lookup_floor(monkeypatch):
    import tabstream.backends.arrow as arrow

    monkeypatch.setattr(arrow, "_FIXED_WIDTH_LOOKUP_MIN", 2)


@pytest.mark.parametrize("vocab_width", [8, 6, None])  # None: a vocabulary of mixed widths
def test_encode_matches_index_in_on_strings(vocab_width, small_lookup_floor):
    rng = np.random.default_rng(7)
    values = ids(rng, 3000, 8, distinct=400, null_share=0.15)
    present = sorted({v for v in values if v is not None})
    vocab = present[::2] + ["zzzzzzzz"]  # half the values, and one never seen
    if vocab_width == 6:
        vocab = [v[:6] for v in vocab]
    elif vocab_width is None:
        vocab = vocab + ["short"]
    column = pa.chunked_array([pa.array(values[:1000]), pa.array(values[1000:])])
    vocabulary = pa.array(vocab)
    got = BACKEND.encode(column, vocabulary)
    position = {v: i for i, v in enumerate(vocab)}
    assert got.type == pa.int64()
    assert got.to_pylist() == [position.get(v) if v is not None else None for v in values]


def test_encode_without_nulls_matches_positions(small_lookup_floor):
    vocab = ["aa", "bb", "cc"]
    got = BACKEND.encode(pa.array(["cc", "dd", "aa", "cc"]), pa.array(vocab))
    assert got.to_pylist() == [2, None, 0, 2]


def reference_ids(values, vocab, start, missing, unknown):
    position = {v: i for i, v in enumerate(vocab)}
    return [missing if v is None else position[v] + start if v in position else unknown
            for v in values]


def _columns():
    """(values, column, vocabulary) cases: one width with nulls over two chunks (the
    fixed-width path), mixed widths, integers, a vocabulary of another width, no
    nulls, all nulls, nothing, a dictionary column."""
    rng = np.random.default_rng(11)
    fixed = ids(rng, 2000, 8, distinct=300, null_share=0.15)
    present = sorted({v for v in fixed if v is not None})
    vocab = present[::3] + ["zzzzzzzz"]
    mixed = ["a", None, "bbb", "cc", "a", "dddd", None]
    ints = [5, None, 7, 9, 5, 1]
    yield fixed, pa.chunked_array([pa.array(fixed[:700]), pa.array(fixed[700:])]), vocab
    yield fixed, pa.array(fixed), [v[:6] for v in vocab]
    yield mixed, pa.array(mixed), ["cc", "a", "dddd", "e"]
    yield ints, pa.array(ints, pa.int64()), [9, 5, 3]
    no_nulls = [v for v in fixed if v is not None]
    yield no_nulls, pa.array(no_nulls), vocab
    yield [None, None], pa.array([None, None], pa.string()), vocab
    yield [], pa.array([], pa.string()), vocab
    yield mixed, pa.array(mixed).dictionary_encode(), ["cc", "a", "dddd", "e"]


@pytest.mark.parametrize("case", list(range(8)))
def test_encode_ids_match_positions_and_the_base_rules(case):
    values, column, vocab = list(_columns())[case]
    vocabulary = pa.array(vocab, column.type.value_type if pa.types.is_dictionary(column.type)
                          else column.type)
    expected = reference_ids(values, vocab, start=3, missing=1, unknown=2)
    got = BACKEND.encode_ids(column, vocabulary, 3, 1, 2)
    assert got.type == pa.int64() and got.null_count == 0
    assert got.to_pylist() == expected
    # the Backend default (encode, then the three rules in Arrow) gives the same ids
    default = super(ArrowBackend, BACKEND).encode_ids(column, vocabulary, 3, 1, 2)
    assert _combined_list(default) == expected


def _combined_list(column):
    return values_of(column) if isinstance(column, pa.ChunkedArray) else column.to_pylist()

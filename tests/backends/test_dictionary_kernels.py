"""value_counts and encode on dictionary columns (parquet's dictionary-encoded pages
read with ``read_dictionary``), on every available backend, against the same
kernels on the decoded column computed with plain pyarrow/pandas."""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest


def dict_chunk(indices, dictionary, index_type=None):
    return pa.DictionaryArray.from_arrays(pa.array(indices, index_type or pa.int32()), dictionary)


def decoded(column):
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    return [v for chunk in chunks for v in chunk.cast(chunk.type.value_type).to_pylist()]


def reference_counts(values):
    """Counts by pandas: null and NaN dropped, -0.0 is 0.0."""
    kept = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    kept = [0.0 if isinstance(v, float) and v == 0 else v for v in kept]
    return {k: int(c) for k, c in pd.Series(kept, dtype=object).value_counts().items()} if kept else {}


def as_dict(table):
    out = {}
    for v, c in zip(table["values"].to_pylist(), table["counts"].to_pylist()):
        assert v not in out, f"value {v!r} listed twice"
        out[v] = c
    return out


STRING_CHUNKS = [
    # chunks with different dictionaries, unused and null entries, null indices
    dict_chunk([0, 1, None, 1, 3, 0], pa.array(["b", "a", "unused", None])),
    dict_chunk([2, 2, 0, None], pa.array(["a", "c", "b"])),
    dict_chunk([None, None], pa.array([], pa.string())),          # empty dictionary, all null
    dict_chunk([0, 0, 0], pa.array(["", "z"])),                     # empty string is a value
    dict_chunk([0, 1], pa.array(["b", "b"])),                       # a repeated entry
]


def test_value_counts_of_string_dictionaries(backend):
    column = pa.chunked_array(STRING_CHUNKS)
    got = backend.value_counts(column)
    assert got.schema.field("values").type == pa.string()
    assert got.schema.field("counts").type == pa.int64()
    assert as_dict(got) == reference_counts(decoded(column))


def test_value_counts_of_float_dictionaries_normalizes_missing(backend):
    chunks = [dict_chunk([0, 1, 2, 3, None, 2], pa.array([1.5, float("nan"), -0.0, 0.0])),
              dict_chunk([1, 0, 0], pa.array([0.0, float("inf")]))]
    column = pa.chunked_array(chunks)
    got = backend.value_counts(column)
    assert as_dict(got) == reference_counts(decoded(column))
    assert got.schema.field("values").type == pa.float64()


@pytest.mark.parametrize("chunk", [dict_chunk([None, None, None], pa.array(["a"])),
                                   dict_chunk([], pa.array([], pa.string())),
                                   dict_chunk([None], pa.array([], pa.string()))])
def test_value_counts_of_all_null_or_empty_dictionary_columns(backend, chunk):
    got = backend.value_counts(pa.chunked_array([chunk]))
    assert got.num_rows == 0 and got.schema.field("values").type == pa.string()


def test_value_counts_of_a_plain_dictionary_array_equals_the_decoded_column(backend):
    rng = np.random.default_rng(2)
    words = np.array([f"w{i}" for i in range(50)], dtype=object)
    values = [None if x == 0 else words[x] for x in rng.integers(0, 50, 2000)]
    encoded = pa.array(values).dictionary_encode()
    assert as_dict(backend.value_counts(encoded)) == as_dict(backend.value_counts(pa.array(values)))


def test_encode_dictionary_chunks_equals_encoding_the_decoded_values(backend):
    vocabulary = pa.array(["c", "a", ""])
    column = pa.chunked_array(STRING_CHUNKS)
    got = backend.encode(column, vocabulary)
    lookup = {v: i for i, v in enumerate(vocabulary.to_pylist())}
    expected = [None if v is None else lookup.get(v) for v in decoded(column)]
    got = got.combine_chunks() if isinstance(got, pa.ChunkedArray) else got
    assert got.type == pa.int64()
    assert got.to_pylist() == expected


def test_encode_sliced_dictionary_chunk(backend):
    chunk = dict_chunk([0, 1, 2, 0, 1], pa.array(["x", "y", "z"])).slice(1, 3)  # y z x
    got = backend.encode(chunk, pa.array(["z", "x"]))
    assert (got.combine_chunks() if isinstance(got, pa.ChunkedArray) else got).to_pylist() == [None, 0, 1]


@pytest.mark.parametrize("dictionary", [pa.array(["b", "a", "b", None, "a"]),
                                        pa.array([0.0, float("nan"), -0.0, None, float("nan"), 2.5])])
def test_value_counts_of_one_chunk_whose_dictionary_repeats_entries(backend, dictionary):
    # one chunk: nothing to unify across chunks, the repeats must still be summed
    chunk = dict_chunk([0, 1, 2, 2, 3, None, 4, 5 % len(dictionary), 1], dictionary)
    got = backend.value_counts(chunk)
    assert as_dict(got) == reference_counts(decoded(chunk))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_value_counts_of_many_random_dictionary_chunks(backend, seed):
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(300)], dtype=object)
    chunks = []
    for _ in range(int(rng.integers(1, 6))):
        entries = list(words[rng.integers(0, 300, int(rng.integers(1, 80)))])  # may repeat
        if rng.random() < 0.5:
            entries[0] = None
        indices = [None if rng.random() < 0.1 else int(i) for i in rng.integers(0, len(entries), 500)]
        chunks.append(dict_chunk(indices, pa.array(entries, pa.string())))
    column = pa.chunked_array(chunks)
    assert as_dict(backend.value_counts(column)) == reference_counts(decoded(column))

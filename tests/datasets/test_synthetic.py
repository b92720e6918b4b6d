"""Tests of the synthetic criteo-like and e-commerce-like generators.

Expected values are recomputed a second, simpler way (plain pandas/numpy, the
generator's own parameter tables, closed-form distribution formulas), never
copied from a previous run.
"""

from __future__ import annotations

import math
import os
import zlib
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

import tabstream.datasets as datasets
from tabstream.datasets import (
    CRITEO_CATEGORICAL,
    CRITEO_COLUMNS,
    CRITEO_CONTINUOUS,
    CRITEO_DTYPES,
    CRITEO_LABEL,
    ECOMMERCE_COLUMNS,
    ECOMMERCE_DTYPES,
    ECOMMERCE_LABEL,
    ECOMMERCE_TAGS,
    generate_data,
    synthetic,
    write_data,
)

ROWS = 40_000  # large enough for rates within a few percent, small enough to be quick
SEEDS = [0, 11]


@pytest.fixture(scope="module", params=SEEDS)
def criteo(request):
    seed = request.param
    frame, prob = generate_data("criteo", ROWS, seed=seed, return_probability=True)
    return seed, frame, prob


@pytest.fixture(scope="module", params=SEEDS)
def ecommerce(request):
    seed = request.param
    frame, prob = generate_data("e-commerce", ROWS, seed=seed, return_probability=True)
    return seed, frame, prob


def rank_auc(score: np.ndarray, label: np.ndarray) -> float:
    """ROC AUC as the Mann-Whitney statistic, ties getting their average rank."""
    _, inverse, counts = np.unique(score, return_inverse=True, return_counts=True)
    average_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based ranks
    ranks = average_rank[inverse]
    positives = int(label.sum())
    negatives = len(label) - positives
    return (ranks[label == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives)


def read_parquet_frame(paths: list[str], label: str) -> pd.DataFrame:
    """Parquet files read back the way generate_data builds its frame."""
    table = pa.concat_tables([pq.read_table(p) for p in paths])
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    frame[label] = table.column(label).to_numpy().astype(np.int64)
    return frame


def read_tsv_frame(paths: list[str], columns: list[str], dtypes: dict, label: str) -> pd.DataFrame:
    """Headerless TSV files read with pyarrow.csv and the declared dtypes."""
    tables = [
        pacsv.read_csv(
            p,
            read_options=pacsv.ReadOptions(column_names=columns),
            parse_options=pacsv.ParseOptions(delimiter="\t"),
            convert_options=pacsv.ConvertOptions(
                column_types={c: pa.type_for_alias(t) for c, t in dtypes.items()},
                strings_can_be_null=True,  # an empty field is a null, strings included
            ),
        )
        for p in paths
    ]
    table = pa.concat_tables(tables)
    frame = table.to_pandas(types_mapper=pd.ArrowDtype)
    frame[label] = table.column(label).to_numpy().astype(np.int64)
    return frame


# ------------------------------------------------------------------ public surface


def test_exported_names():
    assert sorted(datasets.__all__) == sorted(
        [
            "CRITEO_CATEGORICAL",
            "CRITEO_COLUMNS",
            "CRITEO_CONTINUOUS",
            "CRITEO_DTYPES",
            "CRITEO_LABEL",
            "DATASET_NAMES",
            "ECOMMERCE_COLUMNS",
            "ECOMMERCE_DTYPES",
            "ECOMMERCE_LABEL",
            "ECOMMERCE_TAGS",
            "generate_data",
            "write_data",
        ]
    )
    for name in datasets.__all__:
        assert getattr(datasets, name) is getattr(synthetic, name)


def test_criteo_constants():
    assert CRITEO_LABEL == "label"
    assert CRITEO_CONTINUOUS == ["I" + str(i) for i in range(1, 14)]
    assert CRITEO_CATEGORICAL == ["C" + str(i) for i in range(1, 27)]
    assert CRITEO_COLUMNS == ["label"] + CRITEO_CONTINUOUS + CRITEO_CATEGORICAL
    assert list(CRITEO_DTYPES) == CRITEO_COLUMNS
    assert {c for c, t in CRITEO_DTYPES.items() if t == "string"} == set(CRITEO_CATEGORICAL)
    assert {c for c, t in CRITEO_DTYPES.items() if t == "int64"} == {"label", *CRITEO_CONTINUOUS}


def test_ecommerce_constants():
    assert list(ECOMMERCE_DTYPES) == ECOMMERCE_COLUMNS
    assert ECOMMERCE_COLUMNS[-1] == ECOMMERCE_LABEL == "click"
    assert list(ECOMMERCE_TAGS) == ECOMMERCE_COLUMNS
    allowed = {
        "user",
        "user_id",
        "categorical",
        "item",
        "item_id",
        "context",
        "continuous",
        "target",
        "binary_classification",
    }
    assert set().union(*ECOMMERCE_TAGS.values()) <= allowed
    assert "user_id" in ECOMMERCE_TAGS["user_id"] and "item_id" in ECOMMERCE_TAGS["item_id"]
    assert ECOMMERCE_TAGS["click"] == ["target", "binary_classification"]
    # every feature is exactly one of categorical / continuous
    for column, tags in ECOMMERCE_TAGS.items():
        if column != "click":
            assert ("categorical" in tags) != ("continuous" in tags), column


def test_criteo_frame_shape_and_dtypes(criteo):
    _, frame, prob = criteo
    assert list(frame.columns) == CRITEO_COLUMNS
    assert len(frame) == ROWS and prob.shape == (ROWS,) and prob.dtype == np.float64
    assert frame[CRITEO_LABEL].dtype == np.dtype("int64")
    for column in CRITEO_CONTINUOUS:
        assert frame[column].dtype == pd.ArrowDtype(pa.int64()), column
    for column in CRITEO_CATEGORICAL:
        assert frame[column].dtype == pd.ArrowDtype(pa.string()), column
    assert set(np.unique(frame[CRITEO_LABEL])) == {0, 1}


def test_ecommerce_frame_shape_and_dtypes(ecommerce):
    _, frame, prob = ecommerce
    assert list(frame.columns) == ECOMMERCE_COLUMNS
    assert len(frame) == ROWS and prob.shape == (ROWS,)
    arrow_types = {"int64": pa.int64(), "float64": pa.float64(), "string": pa.string()}
    for column, dtype in ECOMMERCE_DTYPES.items():
        if column == ECOMMERCE_LABEL:
            assert frame[column].dtype == np.dtype("int64")
        else:
            assert frame[column].dtype == pd.ArrowDtype(arrow_types[dtype]), column


@pytest.mark.parametrize("name", ["criteo", "e-commerce"])
def test_zero_rows_keeps_columns_and_dtypes(name):
    empty, prob = generate_data(name, 0, return_probability=True)
    some = generate_data(name, 5)
    assert len(empty) == 0 and len(prob) == 0
    assert list(empty.dtypes) == list(some.dtypes)


def test_name_aliases():
    expected = generate_data("e-commerce", 300, seed=3)
    pd.testing.assert_frame_equal(generate_data("ecommerce", 300, seed=3), expected)
    pd.testing.assert_frame_equal(generate_data("E-Commerce", 300, seed=3), expected)


def test_unknown_name_lists_valid_names(tmp_path):
    with pytest.raises(
        ValueError, match=r"unknown synthetic dataset 'movielens'.*'criteo', 'e-commerce'"
    ):
        generate_data("movielens", 10)
    with pytest.raises(ValueError, match="valid names"):
        write_data("movielens", tmp_path, 10)
    with pytest.raises(TypeError, match="dataset name must be a str"):
        generate_data(3, 10)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="num_rows must be >= 0, got -1"):
        generate_data("criteo", -1)
    with pytest.raises(ValueError, match="seed must be >= 0"):
        generate_data("criteo", 10, seed=-5)
    with pytest.raises(TypeError, match="num_rows must be an int, got float"):
        generate_data("criteo", 10.5)
    with pytest.raises(ValueError, match="unknown fmt 'csv'; expected one of: parquet, tsv"):
        write_data("criteo", tmp_path, 10, fmt="csv")
    with pytest.raises(ValueError, match="num_files=5 is more than num_rows=3"):
        write_data("criteo", tmp_path, 3, num_files=5)
    with pytest.raises(ValueError, match="row_group_size must be >= 1"):
        write_data("criteo", tmp_path, 10, row_group_size=0)
    assert os.listdir(tmp_path) == []  # validation happens before anything is written


# ---------------------------------------------------------------------- determinism


@pytest.mark.parametrize("name", ["criteo", "e-commerce"])
def test_same_seed_same_data_other_seed_other_data(name):
    first, first_prob = generate_data(name, 2000, seed=5, return_probability=True)
    again, again_prob = generate_data(name, 2000, seed=5, return_probability=True)
    pd.testing.assert_frame_equal(first, again)
    np.testing.assert_array_equal(first_prob, again_prob)

    other, other_prob = generate_data(name, 2000, seed=6, return_probability=True)
    assert (first_prob != other_prob).mean() > 0.99
    column = "C3" if name == "criteo" else "user_id"  # high-cardinality: rarely equal by chance
    assert (first[column] != other[column]).fillna(True).mean() > 0.9


@pytest.mark.parametrize("name", ["criteo", "e-commerce"])
def test_rows_do_not_depend_on_where_a_request_starts(name, monkeypatch):
    # small blocks so that the pieces below start and stop inside blocks
    monkeypatch.setattr(synthetic, "BLOCK_ROWS", 256)
    whole, whole_prob = generate_data(name, 3000, seed=2, return_probability=True)
    pieces = [(0, 700), (700, 701), (701, 3000)]
    parts = [
        generate_data(name, hi - lo, seed=2, return_probability=True, start_row=lo)
        for lo, hi in pieces
    ]
    joined = pd.concat([frame for frame, _ in parts], ignore_index=True)
    pd.testing.assert_frame_equal(joined, whole)
    np.testing.assert_array_equal(np.concatenate([p for _, p in parts]), whole_prob)


def test_default_block_boundary_is_seamless():
    start = synthetic.BLOCK_ROWS - 50  # the 100 rows straddle blocks 0 and 1
    tail = generate_data("criteo", 100, seed=1, start_row=start)
    whole = generate_data("criteo", start + 100, seed=1)
    pd.testing.assert_frame_equal(tail, whole.iloc[start:].reset_index(drop=True))


def test_in_memory_chunking_is_invisible(monkeypatch):
    expected = generate_data("criteo", 2500, seed=4)
    monkeypatch.setattr(synthetic, "DEFAULT_CHUNK_ROWS", 700)
    pd.testing.assert_frame_equal(generate_data("criteo", 2500, seed=4), expected)


# --------------------------------------------------------------------------- writing


@pytest.mark.parametrize("name", ["criteo", "e-commerce"])
def test_parquet_files_hold_contiguous_rows(name, tmp_path, monkeypatch):
    monkeypatch.setattr(synthetic, "BLOCK_ROWS", 512)
    label = CRITEO_LABEL if name == "criteo" else ECOMMERCE_LABEL
    num_rows = 2000
    expected = generate_data(name, num_rows, seed=9)

    one = write_data(name, tmp_path / "one", num_rows, num_files=1, seed=9)
    three = write_data(
        name, tmp_path / "three", num_rows, num_files=3, seed=9, chunk_rows=300, row_group_size=100
    )
    assert [os.path.basename(p) for p in one] == ["part_00000.parquet"]
    assert [os.path.basename(p) for p in three] == [f"part_{i:05d}.parquet" for i in range(3)]

    pd.testing.assert_frame_equal(read_parquet_frame(one, label), expected)
    pd.testing.assert_frame_equal(read_parquet_frame(three, label), expected)
    sizes = [pq.ParquetFile(p).metadata.num_rows for p in three]
    assert sizes == [(k + 1) * num_rows // 3 - k * num_rows // 3 for k in range(3)]


@pytest.mark.parametrize("name", ["criteo", "e-commerce"])
def test_tsv_round_trips_and_is_cut_anywhere(name, tmp_path):
    label = CRITEO_LABEL if name == "criteo" else ECOMMERCE_LABEL
    columns = CRITEO_COLUMNS if name == "criteo" else ECOMMERCE_COLUMNS
    dtypes = CRITEO_DTYPES if name == "criteo" else ECOMMERCE_DTYPES
    num_rows = 1500
    expected = generate_data(name, num_rows, seed=8)

    one = write_data(name, tmp_path / "one", num_rows, fmt="tsv", seed=8)
    three = write_data(
        name, tmp_path / "three", num_rows, num_files=3, fmt="tsv", seed=8, chunk_rows=200
    )
    assert [os.path.basename(p) for p in three] == [f"part_{i:05d}.tsv" for i in range(3)]
    joined = b"".join(Path(p).read_bytes() for p in three)
    assert joined == Path(one[0]).read_bytes()

    pd.testing.assert_frame_equal(read_tsv_frame(three, columns, dtypes, label), expected)


def test_tsv_looks_like_criteo_raw_logs(tmp_path):
    (path,) = write_data("criteo", tmp_path, 300, fmt="tsv", seed=1)
    expected = generate_data("criteo", 300, seed=1)
    lines = Path(path).read_text().split("\n")
    assert lines[-1] == "" and len(lines) == 301  # newline-terminated, no header line
    for line, (_, row) in zip(lines, expected.iterrows(), strict=False):
        fields = line.split("\t")
        assert len(fields) == 40
        want = ["" if pd.isna(v) else str(v) for v in row]
        assert fields == want


def test_probability_files_align_with_data(tmp_path):
    _, prob = generate_data("criteo", 1000, seed=3, return_probability=True)
    paths = write_data("criteo", tmp_path, 1000, num_files=2, seed=3, return_probability=True)
    prob_paths = [os.path.join(tmp_path, "probabilities", os.path.basename(p)) for p in paths]
    tables = [pq.read_table(p) for p in prob_paths]
    assert all(t.column_names == ["probability"] for t in tables)
    assert [t.num_rows for t in tables] == [pq.ParquetFile(p).metadata.num_rows for p in paths]
    written = np.concatenate([t.column("probability").to_numpy() for t in tables])
    np.testing.assert_array_equal(written, prob)


def test_huge_vocabularies_skip_the_parquet_dictionary(tmp_path):
    (path,) = write_data("criteo", tmp_path, 2000, seed=0)
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(40)}
    for column, spec in synthetic._CRITEO_CAT_SPECS.items():
        dictionary = any("DICTIONARY" in e for e in encodings[column])
        assert dictionary == (spec.vocab <= synthetic._TABLE_MAX_VOCAB), column


def test_no_probability_folder_unless_asked(tmp_path):
    write_data("criteo", tmp_path, 100, seed=0)
    assert sorted(os.listdir(tmp_path)) == ["part_00000.parquet"]


def test_writing_holds_one_chunk_at_a_time(tmp_path, monkeypatch):
    made = []
    original = synthetic._generate_table

    def recording(name, start, stop, seed):
        made.append((start, stop))
        return original(name, start, stop, seed)

    monkeypatch.setattr(synthetic, "_generate_table", recording)
    paths = write_data(
        "criteo", tmp_path / "a", 5000, num_files=2, seed=1, chunk_rows=1000, row_group_size=300
    )
    # chunks are whole row groups (900 rows), never more than chunk_rows, and cover the
    # rows once, in order
    assert max(stop - start for start, stop in made) <= 1000
    assert all((stop - start) % 300 == 0 or stop in (2500, 5000) for start, stop in made)
    assert [start for start, _ in made][1:] == [stop for _, stop in made][:-1]
    assert made[0][0] == 0 and made[-1][1] == 5000

    # the row-group layout is that of the data, not of the chunking
    other = write_data(
        "criteo", tmp_path / "b", 5000, num_files=2, seed=1, chunk_rows=100_000, row_group_size=300
    )
    for a, b in zip(paths, other, strict=True):
        groups_a = [g.num_rows for g in _row_groups(a)]
        assert groups_a == [g.num_rows for g in _row_groups(b)]
        assert max(groups_a) == 300


def _row_groups(path):
    meta = pq.ParquetFile(path).metadata
    return [meta.row_group(i) for i in range(meta.num_row_groups)]


def test_failed_write_leaves_no_file(tmp_path, monkeypatch):
    calls = []
    original = synthetic._generate_table

    def failing(name, start, stop, seed):
        calls.append(start)
        if len(calls) == 2:
            raise RuntimeError("disk full")
        return original(name, start, stop, seed)

    monkeypatch.setattr(synthetic, "_generate_table", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        write_data("criteo", tmp_path, 500, chunk_rows=200, row_group_size=100)
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------- criteo features


def test_missing_rates_follow_the_column_specs(criteo):
    _, frame, _ = criteo
    specs = {**synthetic._CRITEO_CONT_SPECS, **synthetic._CRITEO_CAT_SPECS}
    for column, spec in specs.items():
        observed = frame[column].isna().mean()
        tolerance = 5 * math.sqrt(spec.missing * (1 - spec.missing) / ROWS) + 1e-9
        assert abs(observed - spec.missing) <= tolerance, (column, observed, spec.missing)
    rates = frame[CRITEO_CONTINUOUS + CRITEO_CATEGORICAL].isna().mean()
    assert (rates == 0).any() and rates.max() > 0.3  # Criteo-like: some full, some sparse
    assert frame[CRITEO_LABEL].notna().all()


def test_counts_are_heavy_tailed_with_a_few_negatives(criteo):
    _, frame, _ = criteo
    for column in CRITEO_CONTINUOUS:
        values = frame[column].dropna().to_numpy(dtype=np.int64)
        spec = synthetic._CRITEO_CONT_SPECS[column]
        if spec.negative:
            assert values.min() == -3 and set(values[values < 0]) == {-1, -2, -3}
            assert abs((values < 0).mean() - spec.negative) < 5 * math.sqrt(spec.negative / ROWS)
        else:
            assert values.min() >= 0
        positive = values[values > 0]
        # heavy tail: the maximum is far beyond the typical value
        assert positive.max() > 20 * np.median(positive), column


def test_categoricals_are_8_char_lowercase_hex(criteo):
    _, frame, _ = criteo
    for column in CRITEO_CATEGORICAL:
        values = frame[column].dropna()
        assert values.str.fullmatch(r"[0-9a-f]{8}").all(), column


@pytest.mark.parametrize("column", ["C1", "C3"])  # a table-spelled and a directly spelled column
def test_hex_spelling_matches_python_formatting(column):
    vocab = synthetic._CRITEO_CAT_SPECS[column].vocab
    ranks = np.random.default_rng(0).integers(0, vocab, 500)
    codes = synthetic._hex_codes(column, ranks)
    words = synthetic._hex_words(column, ranks, vocab)
    strings = synthetic._strings_from_words(words).to_pylist()
    assert strings == [f"{int(code):08x}" for code in codes]


def _unhash(column: str, codes: np.ndarray) -> np.ndarray:
    """Undo the per-column code mixing step by step (Python ints, mod 2**32)."""
    mask = 2**32 - 1
    key = zlib.crc32(column.encode())
    out = []
    for x in codes.tolist():
        x ^= x >> 16  # a 16-bit xorshift of 32 bits is its own inverse
        x = (x * pow(0xC2B2AE35, -1, 2**32)) & mask
        x ^= (x >> 13) ^ (x >> 26)  # inverse of x ^= x >> 13
        x = (x * pow(0x85EBCA6B, -1, 2**32)) & mask
        x ^= x >> 16
        out.append((x - key) & mask)
    return np.array(out, dtype=np.uint64)


@pytest.mark.parametrize("column", ["C1", "C3"])
def test_hex_codes_are_a_bijection_per_column(column):
    # every 32-bit input comes back from its code, so no two values can share a code
    values = np.random.default_rng(0).integers(0, 2**32, 2000, dtype=np.uint64)
    values[:3] = [0, 1, 2**32 - 1]
    codes = synthetic._hex_codes(column, values)
    np.testing.assert_array_equal(_unhash(column, codes), values)
    # and over a whole vocabulary directly
    assert len(np.unique(synthetic._hex_codes(column, np.arange(1 << 16)))) == 1 << 16


def test_hex_codes_differ_between_columns():
    ranks = np.arange(1 << 16)
    assert (synthetic._hex_codes("C1", ranks) != synthetic._hex_codes("C2", ranks)).mean() > 0.99


def test_string_nulls_are_real_nulls():
    words = synthetic._hex_words("C1", np.arange(5), 1460)
    valid = np.array([True, False, True, True, False])
    array = synthetic._strings_from_words(words, valid)
    array.validate(full=True)
    full = synthetic._strings_from_words(words).to_pylist()
    assert array.to_pylist() == [v if ok else None for v, ok in zip(full, valid, strict=True)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(
    ("size", "exponent"), [(1460, 1.05), (10_000_000, 0.8), (24, 1.2), (500, 1.0)]
)
def test_powerlaw_ranks_follow_the_bounded_zipf_cdf(size, exponent, dtype):
    u = np.random.default_rng(1).random(200_000).astype(dtype)
    ranks = synthetic._powerlaw_ranks(u, size, exponent)
    assert ranks.min() >= 0 and ranks.max() < size

    def cdf(x):  # P(rank < x) for the density (t + 1) ** -exponent on [0, size]
        if exponent == 1.0:
            return math.log1p(x) / math.log1p(size)
        a = 1 - exponent
        return ((x + 1) ** a - 1) / ((size + 1) ** a - 1)

    for k in [1, 3, 10, 100, 1000]:
        if k < size:
            expected = cdf(k)
            se = math.sqrt(expected * (1 - expected) / len(u))
            assert abs((ranks < k).mean() - expected) <= 5 * se + 1e-4, k


def test_categoricals_are_zipf_skewed(criteo):
    _, frame, _ = criteo
    counts = frame["C1"].value_counts()
    assert counts.iloc[0] > 20 * counts.median()
    # the most frequent value has the frequency of rank 0 under the column's law
    spec = synthetic._CRITEO_CAT_SPECS["C1"]
    a = 1 - spec.exponent
    p0 = (2**a - 1) / ((spec.vocab + 1) ** a - 1)
    assert abs(counts.iloc[0] / ROWS - p0) < 5 * math.sqrt(p0 / ROWS)
    # huge vocabularies are mostly values seen once at this size
    big = frame["C3"].dropna()
    assert big.nunique() > 0.5 * len(big)
    # tiny vocabularies are used in full
    assert frame["C9"].nunique() == synthetic._CRITEO_CAT_SPECS["C9"].vocab


# ------------------------------------------------------------------ criteo labels


def test_criteo_labels_follow_their_probabilities(criteo):
    _, frame, prob = criteo
    label = frame[CRITEO_LABEL].to_numpy()
    assert 0.15 < label.mean() < 0.4
    assert abs(label.mean() - prob.mean()) < 5 * math.sqrt(prob.mean() / ROWS)
    # calibrated: in each probability decile the click rate is the mean probability
    deciles = np.quantile(prob, np.linspace(0, 1, 11))
    bucket = np.clip(np.searchsorted(deciles, prob, side="right") - 1, 0, 9)
    for b in range(10):
        in_bucket = bucket == b
        p = prob[in_bucket].mean()
        assert abs(label[in_bucket].mean() - p) < 5 * math.sqrt(p * (1 - p) / in_bucket.sum())


def test_criteo_oracle_auc(criteo):
    _, frame, prob = criteo
    assert rank_auc(prob, frame[CRITEO_LABEL].to_numpy()) > 0.7


def test_rank_auc_helper():
    y = np.array([0, 0, 1, 1])
    assert rank_auc(np.array([0.1, 0.2, 0.3, 0.4]), y) == 1.0
    assert rank_auc(np.array([0.4, 0.3, 0.2, 0.1]), y) == 0.0
    assert rank_auc(np.zeros(4), y) == 0.5
    assert rank_auc(np.array([0.1, 0.3, 0.3, 0.4]), y) == 0.875  # 3.5 of 4 pairs


def test_counts_carry_the_signs_of_their_hidden_weights(criteo):
    _, frame, _ = criteo
    label = frame[CRITEO_LABEL].to_numpy()
    for column, spec in synthetic._CRITEO_CONT_SPECS.items():
        # the standard recipe: FillMissing(0) >> Clip(0) >> LogOp
        feature = np.log1p(frame[column].fillna(0).clip(lower=0).to_numpy(dtype=np.float64))
        auc = rank_auc(feature, label)
        if abs(spec.weight) >= 0.2:
            assert (auc - 0.5) * np.sign(spec.weight) > 0.02, (column, auc)
        elif spec.weight == 0:
            assert abs(auc - 0.5) < 0.02, (column, auc)


def test_categorical_signal_is_learnable_from_frequent_values(criteo):
    # naive-Bayes target encoding fitted on one half predicts the other half
    _, frame, _ = criteo
    half = ROWS // 2
    train, test = frame.iloc[:half], frame.iloc[half:]
    prior = train[CRITEO_LABEL].mean()
    score = np.zeros(len(test))
    for column in CRITEO_CATEGORICAL:
        keys_train = train[column].fillna("<null>")
        keys_test = test[column].fillna("<null>")
        stats = train[CRITEO_LABEL].groupby(keys_train).agg(["sum", "count"])
        rate = (stats["sum"] + 20 * prior) / (stats["count"] + 20)  # shrunk to the prior
        encoded = keys_test.map(rate).fillna(prior).to_numpy(dtype=np.float64)
        score += np.log(encoded / (1 - encoded))
    assert rank_auc(score, test[CRITEO_LABEL].to_numpy()) > 0.65


# ------------------------------------------------------------------------ e-commerce


def test_item_and_user_attributes_are_consistent(ecommerce):
    _, frame, _ = ecommerce
    per_item = frame.groupby("item_id")[["item_category", "item_brand", "item_price"]].nunique()
    assert (per_item == 1).all().all()
    per_user = frame.groupby("user_id")[["user_country", "user_activity"]].nunique()
    assert (per_user == 1).all().all()
    ages = frame.groupby("user_id")["user_age_bucket"].nunique(dropna=False)
    assert (ages == 1).all()
    # a brand belongs to one category
    assert (frame.groupby("item_brand")["item_category"].nunique() == 1).all()


def test_ecommerce_ids_are_skewed_and_many(ecommerce):
    _, frame, _ = ecommerce
    for column in ["user_id", "item_id"]:
        counts = frame[column].value_counts()
        assert counts.iloc[0] > 20 * counts.median(), column
        assert counts.size > 0.2 * ROWS, column  # hundreds of thousands at a million rows
        assert frame[column].min() >= 0
    assert frame["user_id"].max() < synthetic._NUM_USERS
    assert frame["item_id"].max() < synthetic._NUM_ITEMS


def test_ecommerce_small_categoricals_and_continuous(ecommerce):
    _, frame, _ = ecommerce
    assert set(frame["device"].unique()) == set(synthetic._DEVICES)
    assert set(frame["user_country"].unique()) <= set(synthetic._COUNTRIES)
    ages = frame["user_age_bucket"].dropna()
    assert ages.min() >= 0 and ages.max() < len(synthetic._AGE_WEIGHTS)
    # age is unknown for a fixed share of users
    unknown = frame.groupby("user_id")["user_age_bucket"].first().isna().mean()
    assert abs(unknown - synthetic._AGE_MISSING) < 0.03
    assert (frame["item_price"] > 0).all() and (frame["user_activity"] >= 0).all()
    assert frame.drop(columns="user_age_bucket").notna().all().all()


def test_ecommerce_labels(ecommerce):
    _, frame, prob = ecommerce
    label = frame[ECOMMERCE_LABEL].to_numpy()
    assert 0.1 < label.mean() < 0.4
    assert abs(label.mean() - prob.mean()) < 5 * math.sqrt(prob.mean() / ROWS)
    assert rank_auc(prob, label) > 0.7


def test_ecommerce_click_model_has_user_item_affinity(ecommerce):
    # logit(u1, i1) + logit(u2, i2) - logit(u1, i2) - logit(u2, i1) is 0 for any model that
    # adds a user part and an item part; the hidden model has a user-item interaction
    seed, _, _ = ecommerce
    rng = np.random.default_rng(seed)
    u1, u2 = rng.integers(0, 1000, (2, 300))
    i1, i2 = rng.integers(0, 1000, (2, 300))
    device = np.zeros(300, dtype=np.int64)

    def logit(users, items):
        return synthetic._ecommerce_logit(
            seed, synthetic._users(seed, users), synthetic._items(seed, items), device
        )

    interaction = logit(u1, i1) + logit(u2, i2) - logit(u1, i2) - logit(u2, i1)
    assert np.mean(np.abs(interaction)) > 0.3

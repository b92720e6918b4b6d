"""What merlin-dataloader's users rely on, each behaviour checked against plain
numpy/pandas: shuffled batches shuffled within, ``shuffle=False`` by default, a
loader over an in-memory ``Dataset(pandas_df)``, stepping by hand (``next``,
``peek``, ``stop``, ``with``, a ``batch_size`` setter, ``map``) and list columns
in the ``name__values``/``name__offsets`` layout."""

from __future__ import annotations

import gc
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.loaders import Loader, LoaderOptions


def frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 4, n)
    return pd.DataFrame({
        "a": np.arange(n, dtype=np.int64),
        "x": rng.random(n).astype(np.float32),
        "tags": [list(range(i, i + k)) for i, k in enumerate(lengths)],
        "label": (np.arange(n) % 2).astype(np.int64),
    })


def ids(loader: Any) -> list[np.ndarray]:
    return [np.asarray(features["a"]) for features, *_ in loader]


# -- shuffled batches are shuffled within -------------------------------------------
@pytest.mark.parametrize("seed", [0, 7, 123])
def test_one_shuffled_batch_of_every_row_is_a_permutation_not_the_storage_order(seed: int) -> None:
    n = 5000
    loader = Loader(ts.Dataset(frame(n)), batch_size=n, shuffle=True, seed=seed, labels=["label"])
    (batch,) = ids(loader)
    assert not np.array_equal(batch, np.arange(n))
    np.testing.assert_array_equal(np.sort(batch), np.arange(n))


@pytest.mark.parametrize(("w", "batch_size", "seed"), [(1, 64, 0), (2, 50, 3), (3, 97, 11)])
def test_within_batch_shuffle_keeps_exactly_once_and_is_reproducible(w: int, batch_size: int,
                                                                     seed: int) -> None:
    n = 1003
    df = frame(n)
    rows, runs = [], []
    for rank in range(w):
        def make(rank: int = rank) -> Loader:
            return Loader(ts.Dataset(df), batch_size, shuffle=True, seed=seed, global_size=w,
                          global_rank=rank, labels=["label"])
        first, again = make(), make()
        epoch0 = ids(first)
        assert all(len(b) <= batch_size for b in epoch0)
        assert len(epoch0) == len(first)
        for a, b in zip(epoch0, ids(again), strict=True):  # same (seed, epoch, rank)
            np.testing.assert_array_equal(a, b)
        epoch1 = ids(first)                                  # the next epoch differs
        assert not all(np.array_equal(a, b) for a, b in zip(epoch0, epoch1, strict=False))
        rows.append(np.concatenate(epoch0))
        runs.append(len(epoch0))
        # some batch's rows are not in increasing (storage) order
        assert any(np.any(np.diff(b) < 0) for b in epoch0)
    assert len(set(runs)) == 1
    np.testing.assert_array_equal(np.sort(np.concatenate(rows)), np.arange(n))


def test_within_batch_shuffle_moves_every_column_with_its_row() -> None:
    n = 700
    df = frame(n, seed=4)
    for features, labels in Loader(ts.Dataset(df), 128, shuffle=True, seed=2, labels=["label"]):
        want = df.iloc[features["a"]]
        np.testing.assert_array_equal(features["x"], want["x"].to_numpy())
        np.testing.assert_array_equal(labels, want["label"].to_numpy())
        values, offsets = features["tags"]
        got = [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
        assert got == [list(t) for t in want["tags"]]


# -- shuffle=False by default -----------------------------------------------------------
def test_shuffle_defaults_to_false_and_rows_come_in_storage_order() -> None:
    assert LoaderOptions("data", 8).shuffle is False
    df = frame(100)
    loader = Loader(ts.Dataset(df), 16, labels=["label"])
    assert loader.shuffle is False
    for _ in range(2):  # every epoch
        np.testing.assert_array_equal(np.concatenate(ids(loader)), df["a"].to_numpy())


# -- a loader over an in-memory Dataset -------------------------------------------------
def test_loader_over_a_pandas_dataset_delivers_its_rows_and_types() -> None:
    df = frame(250, seed=1)
    schema = Schema([ColumnSchema("a", "int64"), ColumnSchema("x", "float32"),
                     ColumnSchema("tags", "int64", is_list=True, is_ragged=True),
                     ColumnSchema("label", "int64", tags=[Tags.TARGET])])
    loader = Loader(ts.Dataset(df, schema=schema), batch_size=64)
    assert loader.label_names == ["label"] and loader.feature_names == ["a", "x", "tags"]
    got_ids, got_x, got_labels, got_tags = [], [], [], []
    for features, labels in loader:
        assert features["a"].dtype == np.int64 and features["x"].dtype == np.float32
        got_ids.append(features["a"])
        got_x.append(features["x"])
        got_labels.append(labels)
        values, offsets = features["tags"]
        got_tags += [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]
    np.testing.assert_array_equal(np.concatenate(got_ids), df["a"].to_numpy())
    np.testing.assert_array_equal(np.concatenate(got_x), df["x"].to_numpy())
    np.testing.assert_array_equal(np.concatenate(got_labels), df["label"].to_numpy())
    assert got_tags == [list(t) for t in df["tags"]]


def test_a_dataframe_or_table_given_directly_is_an_in_memory_dataset() -> None:
    df = frame(40)
    for data in (df, pa.Table.from_pandas(df, preserve_index=False)):
        loader = Loader(data, 16, labels=["label"])
        np.testing.assert_array_equal(np.concatenate(ids(loader)), df["a"].to_numpy())


@pytest.mark.parametrize("seed", [0, 5])
def test_a_split_in_memory_dataset_yields_only_its_own_rows(seed: int) -> None:
    df = frame(600)
    train, valid = ts.Dataset(df, part_size="4KB").split([0.7, 0.3], seed=seed)
    assert ts.Dataset(df, part_size="4KB").npartitions > 1
    want_train = np.sort(np.concatenate([p["a"].to_numpy() for p in train.to_iter()]))
    want_valid = np.sort(np.concatenate([p["a"].to_numpy() for p in valid.to_iter()]))
    got_train = np.sort(np.concatenate(ids(Loader(train, 50, shuffle=True, labels=["label"]))))
    got_valid = np.sort(np.concatenate(ids(Loader(valid, 50, labels=["label"]))))
    np.testing.assert_array_equal(got_train, want_train)
    np.testing.assert_array_equal(got_valid, want_valid)
    assert len(got_train) + len(got_valid) == len(df)


def test_the_in_memory_copy_goes_away_with_the_loader() -> None:
    memory = fsspec.filesystem("memory")
    before = set(memory.store)
    loader = Loader(ts.Dataset(frame(30)), 8)
    held = set(memory.store) - before
    assert len(held) == 1 and next(iter(held)).endswith(".parquet")
    del loader
    gc.collect()
    assert set(memory.store) - before == set()


def test_a_loader_refused_after_the_copy_leaves_no_copy_behind() -> None:
    from tabstream.core.errors import SchemaError

    memory = fsspec.filesystem("memory")
    before = set(memory.store)
    with pytest.raises(SchemaError, match="features column 'nope' is not in the dataset schema"):
        Loader(ts.Dataset(frame(30)), 8, features=["nope"])
    gc.collect()
    assert set(memory.store) - before == set()


def test_an_empty_in_memory_dataset_is_refused() -> None:
    from tabstream.core.errors import DataError

    with pytest.raises(DataError, match="the dataset is empty: the in-memory Dataset holds no rows"):
        Loader(ts.Dataset(frame(0)), 8)


# -- stepping by hand ---------------------------------------------------------------
def test_next_peek_and_iter_share_the_epoch_under_way() -> None:
    df = frame(10)
    loader = Loader(ts.Dataset(df), 3, labels=["label"])
    first = loader.peek()
    np.testing.assert_array_equal(loader.peek()[0]["a"], first[0]["a"])  # still there
    np.testing.assert_array_equal(next(loader)[0]["a"], [0, 1, 2])        # peek took nothing
    np.testing.assert_array_equal(next(loader)[0]["a"], [3, 4, 5])
    # iter() continues the epoch next() started
    assert [b.tolist() for b in ids(loader)] == [[6, 7, 8], [9]]
    assert loader.epoch == 1
    # then a new epoch: peeked, then listed whole
    peeked = loader.peek()
    batches = list(loader)
    assert len(batches) == 4 and batches[0][0]["a"].tolist() == peeked[0]["a"].tolist()
    # next() at the end of an epoch stops; the call after starts the next epoch
    for _ in range(4):
        next(loader)
    with pytest.raises(StopIteration):
        next(loader)
    assert next(loader)[0]["a"].tolist() == [0, 1, 2] and loader.epoch == 4
    loader.stop()  # the epoch under way ends (its reading thread with it)
    assert loader.peek()[0]["a"].tolist() == [0, 1, 2]  # a stopped loader starts afresh
    loader.stop()


def test_stop_ends_the_epochs_under_way_and_the_next_iteration_is_whole() -> None:
    df = frame(100)
    loader = Loader(ts.Dataset(df), 10, labels=["label"])
    it = iter(loader)
    for _ in range(2):
        next(it)
    next(loader)
    loader.stop()
    with pytest.raises(StopIteration):
        next(it)
    np.testing.assert_array_equal(np.concatenate(ids(loader)), df["a"].to_numpy())
    with Loader(ts.Dataset(df), 10, labels=["label"]) as managed:
        started = iter(managed)
        next(started)
    with pytest.raises(StopIteration):
        next(started)


def test_batch_size_setter_applies_from_the_next_epoch() -> None:
    df = frame(100)
    loader = Loader(ts.Dataset(df), 10, labels=["label"])
    running = iter(loader)
    loader.batch_size = 32
    assert loader.batch_size == 32 and len(loader) == 4
    assert [len(b) for b in ids(running)] == [10] * 10   # the epoch already started
    got = ids(loader)
    assert [len(b) for b in got] == [32, 32, 32, 4]
    np.testing.assert_array_equal(np.concatenate(got), df["a"].to_numpy())
    with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0$"):
        loader.batch_size = 0
    assert loader.batch_size == 32


def test_map_applies_each_function_to_every_batch_in_order() -> None:
    df = frame(50)
    df["weight"] = np.linspace(0, 1, 50).astype(np.float32)

    def add_weight(features: dict, labels: Any) -> tuple:
        return features, labels, features.pop("weight")

    def double(features: dict, labels: Any, weight: Any) -> tuple:
        return features, labels, weight * 2

    loader = Loader(ts.Dataset(df), 16, labels=["label"]).map(add_weight).map(double)
    got = list(loader)
    assert all(len(b) == 3 and "weight" not in b[0] for b in got)
    np.testing.assert_allclose(np.concatenate([w for _, _, w in got]), df["weight"] * 2)
    np.testing.assert_array_equal(np.concatenate([y for _, y, _ in got]), df["label"])
    with pytest.raises(TypeError, match="map takes a function of \\(features, labels\\), got int 3"):
        loader.map(3)


@pytest.mark.torch
def test_torch_loader_steps_and_maps_as_merlins() -> None:
    torch = pytest.importorskip("torch")
    from tabstream.loaders.torch import Loader as TorchLoader

    df = frame(60)
    with TorchLoader(ts.Dataset(df), 16, labels=["label"]) as loader:
        first = loader.peek()
        assert isinstance(first[0]["a"], torch.Tensor)
        assert next(loader)[0]["a"].tolist() == list(range(16))
        rest = [f["a"] for f, _ in loader]
        assert torch.cat(rest).tolist() == list(range(16, 60))
        loader.batch_size = 30
        assert len(loader) == 2
        mapped = loader.map(lambda x, y: (x, y, y.float() + 1))
        for _features, labels, plus in mapped:
            assert torch.equal(plus, labels.float() + 1)
            assert len(labels) == 30
    assert not loader.shuffle


@pytest.mark.tensorflow
def test_tensorflow_loader_steps_as_merlins() -> None:
    pytest.importorskip("tensorflow")
    from tabstream.loaders.tensorflow import Loader as TFLoader

    df = frame(9)
    with TFLoader(ts.Dataset(df), 3, labels=["label"]) as loader:
        first = loader.peek()
        assert next(loader)[0]["a"].numpy().tolist() == first[0]["a"].numpy().tolist() == [0, 1, 2]
        assert next(loader)[0]["a"].numpy().tolist() == [3, 4, 5]
        # iter() continues the epoch next() started, as the torch loader's
        assert [f["a"].numpy().tolist() for f, _ in loader] == [[6, 7, 8]]
        assert [f["a"].numpy().tolist() for f, _ in loader] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        loader.batch_size = 5
        assert len(loader) == 2 == int(loader.cardinality())
        mapped = loader.map(lambda x, y: (x, y, x["a"] * 10))
        assert mapped is loader
        assert [w.numpy().tolist() for _, _, w in loader] == [[0, 10, 20, 30, 40], [50, 60, 70, 80]]


# -- list columns in merlin's name__values / name__offsets layout -----------------------
def _rows(values: np.ndarray, offsets: np.ndarray) -> list[list[int]]:
    return [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(offsets) - 1)]


@pytest.mark.parametrize("shuffle", [False, True])
def test_flat_list_layout_gives_values_and_offsets_entries(shuffle: bool) -> None:
    df = frame(300, seed=3)
    loader = Loader(ts.Dataset(df), 64, shuffle=shuffle, labels=["label"], list_layout="flat")
    seen = 0
    for features, labels in loader:
        assert list(features) == ["a", "x", "tags__values", "tags__offsets"]
        want = df.iloc[features["a"]]
        assert _rows(features["tags__values"], features["tags__offsets"]) == \
            [list(t) for t in want["tags"]]
        assert features["tags__offsets"][0] == 0 and features["tags__offsets"].dtype == np.int64
        np.testing.assert_array_equal(labels, want["label"].to_numpy())
        seen += len(labels)
    assert seen == len(df)


def test_flat_layout_leaves_padded_lists_as_dense_and_mask() -> None:
    df = frame(20)
    features, _ = next(iter(Loader(ts.Dataset(df), 20, labels=["label"], list_layout="flat",
                                   pad={"tags": 3})))
    assert "tags__values" not in features
    padded, mask = features["tags"]
    want = [(list(t) + [0, 0, 0])[:3] for t in df["tags"]]
    assert padded.tolist() == want
    assert mask.sum(axis=1).tolist() == [min(len(t), 3) for t in df["tags"]]


def test_an_unknown_list_layout_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^list_layout must be one of \['tuple', 'flat'\], "
                                         r"got 'merlin'$"):
        Loader(ts.Dataset(frame(5)), 2, list_layout="merlin")


@pytest.mark.torch
def test_torch_flat_layout_and_its_refusal_with_keyed_jagged() -> None:
    torch = pytest.importorskip("torch")
    from tabstream.loaders.torch import Loader as TorchLoader

    df = frame(40)
    features, _ = next(iter(TorchLoader(ts.Dataset(df), 40, labels=["label"], list_layout="flat")))
    assert isinstance(features["tags__values"], torch.Tensor)
    assert _rows(features["tags__values"].numpy(), features["tags__offsets"].numpy()) == \
        [list(t) for t in df["tags"]]
    with pytest.raises(ValueError, match="use it with list_layout='tuple', not 'flat'"):
        TorchLoader(ts.Dataset(df), 8, labels=["label"], list_layout="flat", keyed_jagged=["a"])


@pytest.mark.tensorflow
def test_tensorflow_flat_layout_matches_the_data() -> None:
    pytest.importorskip("tensorflow")
    from tabstream.loaders.tensorflow import Loader as TFLoader

    df = frame(50)
    loader = TFLoader(ts.Dataset(df), 20, labels=["label"], list_layout="flat")
    assert set(loader.element_spec[0]) == {"a", "x", "tags__values", "tags__offsets"}
    got: list[list[int]] = []
    for features, _ in loader:
        got += _rows(features["tags__values"].numpy(), features["tags__offsets"].numpy())
    assert got == [list(t) for t in df["tags"]]

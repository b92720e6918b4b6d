"""The TensorFlow loader as merlin-dataloader's users step it (``next``, ``peek``,
``iter`` continuing the epoch under way, ``stop``, ``with``, ``batch_size =``,
``map``), its position delegates, and an epoch resumed on another number of
ranks (issue 32): rows checked by id against plain numpy."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import tabstream as ts

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tabstream.loaders.tensorflow import Loader, ResumedEpochWarning  # noqa: E402

pytestmark = pytest.mark.tensorflow


def frame(n: int) -> pd.DataFrame:
    return pd.DataFrame({"a": np.arange(n, dtype=np.int64),
                         "w": np.linspace(0, 1, n).astype(np.float32),
                         "label": (np.arange(n) % 2).astype(np.int64)})


def ids(batches: Any) -> list[list[int]]:
    return [batch[0]["a"].numpy().tolist() for batch in batches]


# -- stepping --------------------------------------------------------------------------
def test_iter_continues_the_epoch_next_and_peek_started() -> None:
    loader = Loader(ts.Dataset(frame(10)), 3, labels=["label"])
    first = loader.peek()
    assert loader.peek()[0]["a"].numpy().tolist() == first[0]["a"].numpy().tolist() == [0, 1, 2]
    assert next(loader)[0]["a"].numpy().tolist() == [0, 1, 2]   # peek took nothing
    assert next(loader)[0]["a"].numpy().tolist() == [3, 4, 5]
    assert ids(loader) == [[6, 7, 8], [9]]                       # the same epoch, continued
    assert loader.epoch == 1
    peeked = loader.peek()                                       # a new epoch: peeked ...
    batches = ids(loader)                                        # ... then listed whole
    assert batches == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert batches[0] == peeked[0]["a"].numpy().tolist()
    for _ in range(4):
        next(loader)
    with pytest.raises(StopIteration):
        next(loader)
    assert next(loader)[0]["a"].numpy().tolist() == [0, 1, 2] and loader.epoch == 4
    loader.stop()
    assert ids(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]  # stopped: whole again


def test_stop_and_with_end_the_iterators_handed_out() -> None:
    df = frame(100)
    loader = Loader(ts.Dataset(df), 10, labels=["label"])
    it = iter(loader)
    next(it)
    next(loader)                      # a second epoch under way, by next()
    loader.stop()
    with pytest.raises(StopIteration):
        next(it)
    assert np.concatenate(ids(loader)).tolist() == df["a"].tolist()
    with Loader(ts.Dataset(df), 10, labels=["label"]) as managed:
        started = iter(managed)
        next(started)
    with pytest.raises(StopIteration):
        next(started)


def test_stop_ends_the_reading_threads_of_iterators_still_held() -> None:
    import threading
    import time

    def running() -> int:
        return sum(t.name == "tabstream-loader" and t.is_alive() for t in threading.enumerate())

    before = running()
    loader = Loader(ts.Dataset(frame(200)), 10, labels=["label"])
    held = iter(loader)
    next(held)
    derived = iter(tf.data.Dataset.map(loader, lambda x, y: x["a"]))
    next(derived)
    assert running() == before + 2
    loader.stop()
    deadline = time.monotonic() + 5
    while running() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == before
    with pytest.raises(StopIteration):
        next(held)
    assert sum(ids(loader), []) == list(range(200))


def test_a_peeked_batch_is_not_skipped_by_a_tf_function() -> None:
    loader = Loader(ts.Dataset(frame(12)), 4, labels=["label"])

    @tf.function
    def first_ids(iterator: Any) -> Any:
        return next(iterator)[0]["a"]

    loader.peek()
    with pytest.raises(ValueError, match=r"holds the batch loader.peek\(\) returned, which a "
                                         r"tf.function .* would skip: take it with next\(loader\)"):
        first_ids(iter(loader))
    assert next(loader)[0]["a"].numpy().tolist() == [0, 1, 2, 3]   # nothing lost
    assert first_ids(iter(loader)).numpy().tolist() == [4, 5, 6, 7]  # no batch held: accepted


def test_batch_size_setter_applies_from_the_next_epoch() -> None:
    df = frame(100)
    loader = Loader(ts.Dataset(df), 10, labels=["label"])
    running = iter(loader)
    next(running)
    loader.batch_size = 32
    assert loader.batch_size == 32 and len(loader) == 4 == int(loader.cardinality())
    assert [len(b) for b in ids(running)] == [10] * 9             # the epoch under way
    got = ids(loader)
    assert [len(b) for b in got] == [32, 32, 32, 4]
    assert sum(got, []) == df["a"].tolist()
    with pytest.raises(ValueError, match="^batch_size must be >= 1, got 0$"):
        loader.batch_size = 0
    assert loader.batch_size == 32


# -- map ------------------------------------------------------------------------------
def add_weight(features: dict, labels: Any) -> tuple:
    return features, labels, features.pop("w")


def test_map_as_merlin_changes_the_loader_and_chains() -> None:
    df = frame(50)
    loader = Loader(ts.Dataset(df), 16, labels=["label"])
    same = loader.map(add_weight).map(lambda x, y, w: (x, y, w * 2))
    assert same is loader
    peeked = loader.peek()
    assert "w" not in peeked[0]
    np.testing.assert_allclose(peeked[2].numpy(), df["w"][:16] * 2)
    stepped = next(loader)
    np.testing.assert_array_equal(stepped[0]["a"].numpy(), np.arange(16))
    rest = list(loader)                                  # the epoch, continued
    batches = [stepped, *rest]
    np.testing.assert_allclose(np.concatenate([w.numpy() for _, _, w in batches]), df["w"] * 2)
    np.testing.assert_array_equal(np.concatenate([y.numpy() for _, y, _ in batches]), df["label"])
    assert len(loader.element_spec) == 3


def test_map_runs_before_prefetching_to_a_device() -> None:
    df = frame(20)
    loader = Loader(ts.Dataset(df), 8, labels=["label"], device="/CPU:0").map(add_weight)
    np.testing.assert_allclose(np.concatenate([w.numpy() for _, _, w in loader]), df["w"])


def test_map_the_tf_data_way() -> None:
    df = frame(40)
    loader = Loader(ts.Dataset(df), 16, labels=["label"])
    # tf.data's own map, called on the class: a new dataset, the loader unchanged
    doubled = tf.data.Dataset.map(loader, lambda x, y: (x["a"] * 2, y))
    assert np.concatenate([a.numpy() for a, _ in doubled]).tolist() == (df["a"] * 2).tolist()
    assert ids(loader) == [list(range(0, 16)), list(range(16, 32)), list(range(32, 40))]
    # the method with tf.data's arguments: the mapped dataset (the loader, changed)
    mapped = loader.map(lambda x, y: (x["a"] + 1, y), num_parallel_calls=tf.data.AUTOTUNE,
                        deterministic=True, name="plus_one")
    assert isinstance(mapped, tf.data.Dataset)
    assert np.concatenate([a.numpy() for a, _ in mapped]).tolist() == (df["a"] + 1).tolist()

    @tf.function
    def total(dataset: tf.data.Dataset) -> Any:
        s = tf.constant(0, tf.int64)
        for a, _ in dataset:
            s += tf.reduce_sum(a)
        return s

    assert int(total(loader)) == int((df["a"] + 1).sum())


def test_map_refuses_what_it_cannot_apply_and_keeps_the_loader() -> None:
    loader = Loader(ts.Dataset(frame(10)), 4, labels=["label"])
    with pytest.raises(TypeError, match=r"^map takes a function of \(features, labels\), got int 3$"):
        loader.map(3)
    with pytest.raises(KeyError, match="nope"):
        loader.map(lambda x, y: (x["nope"], y))      # traced at once: refused here
    assert ids(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_keras_fit_trains_on_the_mapped_batches() -> None:
    df = frame(64)
    df["w"] = np.float32(0.0)   # every sample weight 0: the weighted loss is 0

    def model() -> Any:
        m = keras.Sequential([keras.layers.Dense(1, activation="sigmoid")])
        m.compile(optimizer="sgd", loss="binary_crossentropy")
        return m

    def as_inputs(x: dict, y: Any, *w: Any) -> tuple:
        return (tf.cast(tf.expand_dims(x["a"], -1), tf.float32), tf.cast(y, tf.float32), *w)

    weighted = Loader(ts.Dataset(df), 16, labels=["label"]).map(add_weight).map(as_inputs)
    plain = Loader(ts.Dataset(df), 16, labels=["label"], features=["a"]).map(as_inputs)
    assert model().fit(weighted, epochs=1, verbose=0, shuffle=False).history["loss"] == [0.0]
    assert model().fit(plain, epochs=1, verbose=0, shuffle=False).history["loss"][0] > 0


# -- position delegates and an epoch resumed on another number of ranks -------------------
FILES, GROUPS = (300, 1, 170, 90), (40, 1, 60, 25)   # 561 rows in 14 row groups


def _loaders(export: Path, w: int, b: int, shuffle: bool = True) -> list[Loader]:
    return [Loader(str(export), b, shuffle=shuffle, seed=5, global_size=w, global_rank=r,
                   features=["row_id"], labels=["label"]) for r in range(w)]


def _epoch(loaders: list[Loader], steps: int | None = None) -> list[int]:
    """Row ids of each rank's next iteration (its first ``steps`` batches), checked:
    equal batch counts, as many as len() and the cardinality said, labels by row."""
    rows, counts = [], set()
    for loader in loaders:
        expected = len(loader)
        assert int(tf.data.experimental.cardinality(loader)) == expected
        n = 0
        for features, labels in loader:
            np.testing.assert_array_equal(labels.numpy(), features["row_id"].numpy() % 2)
            rows += features["row_id"].numpy().tolist()
            n += 1
            if n == steps:
                break
        assert steps is not None or n == expected
        counts.add(n)
    assert len(counts) == 1, f"ranks yielded {counts} batches"
    return rows


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("w", "w2"), [(2, 1), (1, 2), (2, 3), (3, 2)])
def test_an_epoch_resumed_on_another_world_size_then_a_whole_one(testdata: Any, tmp_path: Path,
                                                                 w: int, w2: int,
                                                                 shuffle: bool) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    before = _loaders(export, w, 24 // w, shuffle)
    steps = len(before[0]) // 2 + 1
    seen = _epoch(before, steps)
    state = before[0].position(0, steps)
    assert state == before[0].core.position(0, steps) == before[-1].position(0, steps)
    for loader in before:
        loader.stop()
    after = _loaders(export, w2, 24 // w2, shuffle)
    for loader in after:
        loader.set_position(state)
    left = 561 - len(seen)
    assert {len(loader) for loader in after} == {-(-left // 24)}
    with pytest.warns(ResumedEpochWarning, match=rf"the next epoch \(0, resumed by "
                      rf"set_position\) has {-(-left // 24)} batches, the epochs after it "
                      rf"{-(-561 // 24)}\. Keras's fit takes"):
        assert int(after[0].cardinality()) == -(-left // 24)
    rest = _epoch(after)           # ends without TensorFlow's cardinality error
    assert len(rest) == left and sorted(seen + rest) == list(range(561))
    # the next epoch is whole, the usual one on w2 ranks
    assert {len(loader) for loader in after} == {-(-561 // 24)}
    fresh = _loaders(export, w2, 24 // w2, shuffle)
    for loader in fresh:
        loader.set_epoch(1)
    assert _epoch(after) == _epoch(fresh)


def test_a_resumed_epoch_in_keras_fit_and_a_tf_function(testdata: Any, tmp_path: Path) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    (first,) = _loaders(export, 1, 32)
    seen = _epoch([first], 7)
    state = first.position(0, 7)
    left = 561 - len(seen)

    class Steps(keras.callbacks.Callback):
        def on_train_begin(self, logs: Any = None) -> None:
            self.expected, self.batches = self.params["steps"], 0

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.batches += 1

    model = keras.Sequential([keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    (loader,) = _loaders(export, 1, 16)
    loader.set_position(state)
    loader.map(lambda x, y: (tf.cast(tf.expand_dims(x["row_id"], -1), tf.float32),
                             tf.cast(y, tf.float32)))
    # Keras's progress bar length and its steps: the resumed epoch's, then a whole one's
    steps = Steps()
    with pytest.warns(ResumedEpochWarning, match="fit the resumed epoch in a call of its own"):
        model.fit(loader, epochs=1, verbose=0, shuffle=False, callbacks=[steps])
    assert steps.expected == steps.batches == -(-left // 16)
    steps = Steps()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumedEpochWarning)   # a whole epoch: no warning
        model.fit(loader, epochs=1, verbose=0, shuffle=False, callbacks=[steps])
    assert steps.expected == steps.batches == -(-561 // 16)

    @tf.function
    def rows(dataset: tf.data.Dataset) -> Any:
        out = tf.TensorArray(tf.int64, size=0, dynamic_size=True)
        for features, _ in dataset:
            out = out.write(out.size(), features["row_id"])
        return out.concat()

    (again,) = _loaders(export, 1, 16)
    again.set_position(state)
    rest = rows(again).numpy().tolist()
    assert sorted(seen + rest) == list(range(561))
    assert sorted(rows(again).numpy().tolist()) == list(range(561))   # epoch 1, whole


def test_the_from_generator_fallback_resumes_too(testdata: Any, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import tabstream.loaders.tensorflow as tf_loader

    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    seen = _epoch(_loaders(export, 2, 12), 9)
    state = _loaders(export, 2, 12)[0].position(0, 9)
    monkeypatch.setattr(tf_loader, "_GeneratorDataset", None)
    after = _loaders(export, 3, 8)
    for loader in after:
        loader.set_position(state)
    assert sorted(seen + _epoch(after)) == list(range(561))
    assert sorted(_epoch(after)) == list(range(561))


def test_a_rebuild_leaves_the_running_iterator_alone() -> None:
    import gc

    df = frame(100)
    first = Loader(ts.Dataset(df), 10, labels=["label"])
    taken = sum(ids(next(first) for _ in range(3)), [])
    state = first.position(0, 3)
    first.stop()
    loader = Loader(ts.Dataset(df), 10, labels=["label"])
    loader.set_position(state)
    it = iter(loader)
    got = next(it)[0]["a"].numpy().tolist()
    # the epoch under way was claimed: the next one is whole, then batches of 7
    assert int(loader.cardinality()) == 10
    loader.batch_size = 7
    assert int(loader.cardinality()) == 15 == len(loader)
    gc.collect()
    got += sum(ids(it), [])
    assert sorted(taken + got) == df["a"].tolist()
    assert [len(b) for b in ids(loader)] == [7] * 14 + [2]


def test_exported_names() -> None:
    import tabstream.loaders.stepping
    import tabstream.loaders.tensorflow

    assert tabstream.loaders.tensorflow.__all__ == ["Loader", "ResumedEpochWarning"]
    assert tabstream.loaders.stepping.__all__ == ["Peekable", "Stepper", "Stepping"]
    assert issubclass(ResumedEpochWarning, UserWarning)

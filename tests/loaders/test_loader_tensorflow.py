"""The TensorFlow / Keras 3 adapter: a tf.data.Dataset that Keras fits on directly."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tabstream.loaders.tensorflow import Loader  # noqa: E402

pytestmark = pytest.mark.tensorflow


class Tiny(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = keras.layers.Embedding(100, 4)
        self.out = keras.layers.Dense(1, activation="sigmoid")

    def call(self, features: dict[str, Any]) -> Any:
        x = keras.ops.concatenate(
            [self.embedding(features["C1"]), keras.ops.expand_dims(features["I1"], -1)], axis=-1)
        return self.out(x)[:, 0]


def test_element_spec_and_dtypes(shared_export: Path, testdata: Any) -> None:
    loader = Loader(shared_export, 100, shuffle=True)
    features, labels = loader.element_spec
    assert features["C1"] == tf.TensorSpec([None], tf.int64, name="C1")
    assert features["I1"].dtype == tf.float32
    assert features["tags"][0].dtype == tf.int64 and features["tags"][1].dtype == tf.int64
    assert features["weights"][0].dtype == tf.float32
    assert labels.dtype == tf.int64
    assert len(loader) == -(-testdata.N // 100) == int(loader.cardinality())
    padded = Loader(shared_export, 100, pad=True, shuffle=True).element_spec[0]["tags"]
    assert padded[0].shape.as_list() == [None, testdata.MAX_TAGS]
    assert padded[1].dtype == tf.bool


def test_eager_iteration_matches_pyarrow(shared_export: Path, testdata: Any) -> None:
    expected = testdata.read_all(shared_export)
    ids = []
    for rank in range(2):
        for features, labels in Loader(shared_export, 256, global_size=2, global_rank=rank,
                                       shuffle=True):
            row_ids = features["row_id"].numpy()
            want = expected.take(row_ids)
            np.testing.assert_array_equal(features["I1"].numpy(), want["I1"].to_numpy())
            np.testing.assert_array_equal(labels.numpy(), want["label"].to_numpy())
            values, offsets = features["tags"]
            offsets = offsets.numpy()
            assert [values.numpy()[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:],
                                                                  strict=True)] == \
                want["tags"].to_pylist()
            ids.append(row_ids)
    assert np.array_equal(np.sort(np.concatenate(ids)), np.arange(testdata.N))


def test_keras_fit_with_validation_data(shared_export: Path) -> None:
    train = Loader(shared_export, 256, features=["C1", "I1"], shuffle=True)
    valid = Loader(shared_export, 512, shuffle=False, features=["C1", "I1"])
    model = Tiny()
    model.compile(optimizer="adam", loss="binary_crossentropy")
    history = model.fit(train, validation_data=valid, epochs=2, shuffle=False, verbose=0)
    assert len(history.history["loss"]) == 2 and len(history.history["val_loss"]) == 2
    assert all(np.isfinite(history.history["val_loss"]))
    assert train.epoch == 2, "each Keras epoch is a new loader epoch"
    assert valid.epoch == 2
    assert np.isfinite(model.evaluate(valid, verbose=0))


def test_keras_fit_with_its_defaults(shared_export: Path) -> None:
    # fit's default shuffle=True draws Keras' "ignored for tf.data" warning; the
    # loader shuffles by itself, and training runs.
    train = Loader(shared_export, 512, features=["C1", "I1"], shuffle=True)
    model = Tiny()
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`shuffle=True` was passed")
        history = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


def test_custom_tf_function_loop(shared_export: Path, testdata: Any) -> None:
    loader = Loader(shared_export, 300, features=["C1", "I1"], shuffle=True)
    model = Tiny()
    optimizer = keras.optimizers.SGD(0.01)
    loss_fn = keras.losses.BinaryCrossentropy()

    @tf.function
    def train_epoch(dataset: tf.data.Dataset) -> tuple[tf.Tensor, tf.Tensor]:
        total = tf.constant(0, tf.int64)
        rows = tf.constant(0, tf.int64)
        for features, labels in dataset:
            with tf.GradientTape() as tape:
                loss = loss_fn(tf.cast(labels, tf.float32), model(features))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            total += tf.reduce_sum(labels)
            rows += tf.shape(labels, out_type=tf.int64)[0]
        return total, rows

    total, rows = train_epoch(loader)
    expected = testdata.read_all(shared_export)["label"].to_numpy()
    assert int(rows) == testdata.N and int(total) == int(expected.sum())
    total2, _ = train_epoch(loader)
    assert loader.epoch == 2 and int(total2) == int(expected.sum())


def test_no_labels_yields_features_only(shared_export: Path) -> None:
    loader = Loader(shared_export, 100, labels=[], shuffle=True)
    assert isinstance(loader.element_spec, dict)
    assert set(next(iter(loader))) == {"row_id", "C1", "I1", "tags", "weights", "label"}


def test_set_epoch_replays(shared_export: Path) -> None:
    loader = Loader(shared_export, 500, features=["row_id"], shuffle=True)
    first = np.concatenate([f["row_id"].numpy() for f, _ in loader])
    loader.set_epoch(0)
    again = np.concatenate([f["row_id"].numpy() for f, _ in loader])
    np.testing.assert_array_equal(first, again)


def test_single_worker_strategy_keeps_size_one(shared_export: Path) -> None:
    with tf.distribute.OneDeviceStrategy("/cpu:0").scope():
        loader = Loader(shared_export, 100, shuffle=True)
    assert (loader.core.global_size, loader.core.global_rank) == (1, 0)


def test_fixed_and_nested_lists_as_tf_tensors(tmp_path: Path) -> None:
    rows = [[[1, 2], [0]], [], [[5]]]
    t = pa.table({
        "fx": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(6, dtype=np.int64)), 2),
        "n": pa.array(rows, pa.list_(pa.list_(pa.int64()))),
    })
    pq.write_table(t, tmp_path / "x.parquet")
    loader = Loader(tmp_path / "x.parquet", 3, shuffle=False)
    assert loader.element_spec["fx"][0].shape.as_list() == [None, 2]
    features = next(iter(loader))
    dense, mask = features["fx"]
    assert np.array_equal(dense.numpy(), np.arange(6).reshape(3, 2)) and bool(tf.reduce_all(mask))
    values, outer, inner = features["n"]
    ragged = tf.RaggedTensor.from_nested_row_splits(values, [outer, inner])
    assert ragged.to_list() == rows


def test_device_prefetch_keeps_batches_and_order(shared_export: Path) -> None:
    plain = [b[0]["row_id"].numpy() for b in Loader(shared_export, 300, seed=4, shuffle=True)]
    placed = Loader(shared_export, 300, seed=4, device="/cpu:0", shuffle=True)
    got = [b[0]["row_id"] for b in placed]
    assert all("CPU:0" in t.device for t in got)
    assert len(got) == len(plain)
    for a, b in zip(got, plain, strict=True):
        assert np.array_equal(a.numpy(), b)


def test_bad_devices_are_refused(shared_export: Path) -> None:
    with pytest.raises(ValueError, match=r"device '/GPU:7': TensorFlow has no such device here; "
                                         r"available: \["):
        Loader(shared_export, 10, device="/GPU:7", shuffle=True)
    with pytest.raises(TypeError, match=r"device must be a device name such as '/GPU:0', got int"):
        Loader(shared_export, 10, device=0, shuffle=True)


@pytest.mark.gpu
@pytest.mark.skipif(not tf.config.list_logical_devices("GPU"), reason="no TensorFlow GPU")
def test_gpu_device_delivers_gpu_tensors_in_the_cpu_order(shared_export: Path) -> None:
    plain = [b[0]["row_id"].numpy() for b in Loader(shared_export, 300, seed=4, shuffle=True)]
    got = [b[0]["row_id"]
           for b in Loader(shared_export, 300, seed=4, device="/GPU:0", shuffle=True)]
    assert all("GPU:0" in t.device for t in got)
    for a, b in zip(got, plain, strict=True):
        assert np.array_equal(a.numpy(), b)


def test_batch_arrays_become_tensors_without_a_copy() -> None:
    """Fresh, aligned, writable batch arrays are handed to TensorFlow through DLPack
    (the tensor is the array's memory); anything else is copied, as
    ``tf.convert_to_tensor`` does."""
    from tabstream.loaders.memory import empty
    from tabstream.loaders.tensorflow import _tensor

    fresh = empty(1000, np.dtype(np.int64))
    fresh[:] = np.arange(1000)
    t = _tensor(fresh)
    assert t.dtype == tf.int64 and t.shape == (1000,)
    fresh[3] = -1
    assert int(t[3]) == -1, "the tensor shares the batch's memory"

    block = empty(12, np.dtype(np.float32)).reshape(3, 4)
    block[:] = np.arange(12, dtype=np.float32).reshape(3, 4)
    mask = empty(6, np.dtype(bool)).reshape(3, 2)
    mask[:] = [[True, False], [False, True], [True, True]]
    for a in (block, mask):
        np.testing.assert_array_equal(_tensor(a).numpy(), a)

    unaligned = empty(17, np.dtype(np.int64))[1:]   # 8 bytes into a 64-byte aligned buffer
    unaligned[:] = 7
    read_only = np.arange(5)
    read_only.flags.writeable = False
    strided = np.arange(10)[::2]
    for a in (unaligned, read_only, strided):
        np.testing.assert_array_equal(_tensor(a).numpy(), a)
    copied = _tensor(unaligned)
    unaligned[0] = 0
    assert int(copied[0]) == 7, "an unaligned array is copied, not shared"


def test_held_tensors_keep_their_values(shared_export: Path, testdata: Any) -> None:
    """Batches share memory with their tensors, so no buffer may be reused while a
    tensor of an earlier batch is still held: keep a whole epoch, then check it."""
    expected = testdata.read_all(shared_export)
    held = list(Loader(shared_export, 128, seed=2, shuffle=True))
    ids = np.concatenate([f["row_id"].numpy() for f, _ in held])
    assert np.array_equal(np.sort(ids), np.arange(testdata.N))
    for features, labels in held:
        want = expected.take(features["row_id"].numpy())
        np.testing.assert_array_equal(features["C1"].numpy(), want["C1"].to_numpy())
        np.testing.assert_array_equal(features["I1"].numpy(), want["I1"].to_numpy())
        np.testing.assert_array_equal(labels.numpy(), want["label"].to_numpy())
        values, offsets = features["weights"]
        offsets = offsets.numpy()
        assert [values.numpy()[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:],
                                                              strict=True)] == \
            want["weights"].to_pylist()


def test_abandoned_iteration_stops_its_threads(shared_export: Path) -> None:
    import gc
    import threading
    import time

    def running() -> int:
        return sum(t.name == "tabstream-loader" and t.is_alive() for t in threading.enumerate())

    loader = Loader(shared_export, 100, shuffle=True)
    before = running()
    it = iter(loader)
    next(it)
    assert running() == before + 1
    del it
    gc.collect()
    deadline = time.monotonic() + 5
    while running() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running() == before and loader._epochs == {}
    assert len(list(loader.take(3))) == 3 and loader.epoch == 2
    assert sum(1 for _ in loader) == len(loader)
    assert loader._epochs == {}  # a finished epoch is closed too


def test_an_iterator_never_iterated_opens_no_epoch(shared_export: Path) -> None:
    import gc
    import threading

    loader = Loader(shared_export, 100, shuffle=True)
    before = sum(t.name == "tabstream-loader" for t in threading.enumerate())
    it = iter(loader)
    assert loader.epoch == 0 and loader._epochs == {}
    assert sum(t.name == "tabstream-loader" for t in threading.enumerate()) == before
    del it
    gc.collect()
    assert loader.epoch == 0  # the next iteration still runs epoch 0


def _row_ids(batches: Any) -> list[list[int]]:
    return [features["row_id"].numpy().tolist() for features, _ in batches]


def test_repeat_runs_the_following_epochs(shared_export: Path) -> None:
    # each repetition is a new iteration of the loader, so the next epoch, as with
    # Keras's epochs; take() drops the second one after two batches
    loader = Loader(shared_export, 500, features=["row_id"], shuffle=True)
    got = _row_ids(loader.repeat(2).take(len(loader) + 2))
    reference = Loader(shared_export, 500, features=["row_id"], shuffle=True)
    epoch0 = _row_ids(reference)
    epoch1 = _row_ids(reference)
    assert epoch0 != epoch1  # shuffled differently
    assert got == epoch0 + epoch1[:2]
    assert loader.epoch == 2 and loader._epochs == {}


def test_the_from_generator_fallback_gives_the_same_batches(shared_export: Path, monkeypatch) -> None:
    # Where TensorFlow no longer has the generator dataset's class, the loader builds
    # its epochs with from_generator: same batches, epochs closed the same way.
    import tabstream.loaders.tensorflow as tf_loader

    expected = _row_ids(Loader(shared_export, 500, features=["row_id"], shuffle=True))
    monkeypatch.setattr(tf_loader, "_GeneratorDataset", None)
    loader = Loader(shared_export, 500, features=["row_id"], shuffle=True)
    assert _row_ids(loader) == expected and loader._epochs == {}
    assert len(list(loader.take(2))) == 2 and loader.epoch == 2
    assert loader._epochs == {}


def test_held_tensors_keep_their_values_while_buffers_are_reused(
        shared_export: Path, testdata: Any) -> None:
    """Batch columns are handed to TensorFlow without a copy (DLPack) from pooled
    buffers; a tensor still held keeps its buffer out of the pool, so the values of
    every held batch are those it had when delivered, and the rows those pyarrow
    reads."""
    expected = testdata.read_all(shared_export)
    held, copies = [], []
    for k, (features, labels) in enumerate(Loader(shared_export, 100, seed=3, shuffle=True)):
        if k % 2:
            continue   # dropped: its buffers can be reused
        held.append((features["row_id"], features["I1"], labels))
        copies.append(tuple(np.array(t.numpy(), copy=True) for t in held[-1]))
        del features, labels
    for tensors, arrays in zip(held, copies, strict=True):
        for t, a in zip(tensors, arrays, strict=True):
            np.testing.assert_array_equal(t.numpy(), a)
        rows = arrays[0]
        np.testing.assert_array_equal(arrays[1], expected["I1"].to_numpy()[rows])
        np.testing.assert_array_equal(arrays[2], expected["label"].to_numpy()[rows])


def test_autotuning_is_off(shared_export: Path) -> None:
    """The loader's pipeline has nothing to tune, and with tf.data's autotuning on the
    end of an epoch waited for the tuner's next tick (see the Loader's options)."""
    loader = Loader(shared_export, 100, shuffle=True)
    assert loader.options().autotune.enabled is False
    assert loader.options().experimental_distribute.auto_shard_policy == \
        tf.data.experimental.AutoShardPolicy.OFF



STOP_EARLY = """
import sys
from tabstream.loaders.tensorflow import Loader

it = iter(Loader(sys.argv[1], int(sys.argv[2]), shuffle=True))
features, labels = next(it)
print("rows", int(labels.shape[0]), flush=True)
"""


@pytest.mark.slow  # three fresh Python processes importing TensorFlow
def test_a_script_that_stops_mid_epoch_exits(tmp_path: Path, testdata: Any) -> None:
    """A process that drops its iterator mid-epoch exits. Before, tf.data's prefetch
    thread, still calling into the loader when the interpreter shut down, hung the
    process forever at exit: in 7 of 8 runs of this script over a Criteo-like export
    of this layout (many row groups in ten files, large batches), and this test
    failed on its first run; see tensorflow._close_at_exit."""
    import os
    import subprocess
    import sys

    export = testdata.write_export(tmp_path / "export", file_rows=[50_000] * 10,
                                   row_groups=[5_000] * 10, with_lists=False)
    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "stop_early.py"
    script.write_text(STOP_EARLY)
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               TF_CPP_MIN_LOG_LEVEL="3")
    # the 30 s run from the script's last batch, not from its start: importing
    # TensorFlow alone took 30-47 s on the 2-core machine under load
    for _ in range(3):
        proc = subprocess.Popen([sys.executable, str(script), str(export), "65536"], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            first = proc.stdout.readline()  # blocks until the batch is printed (or exit)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pytest.fail("the process did not exit within 30 s of its last batch")
            out, err = proc.communicate()
        finally:
            proc.kill()
            proc.communicate()
        assert proc.returncode == 0, err[-2000:]
        assert (first + out).split() == ["rows", "65536"]


def test_scalar_columns_cross_into_tensorflow_as_one_tensor_per_dtype(shared_export: Path) -> None:
    """The int64 scalar columns (C1, row_id, label) pass through ``tf.py_function``
    as one (3, batch) tensor over the batch's own buffer; I1, the only float32
    scalar, and the list arrays one by one. A batch whose columns are separate
    arrays is stacked into the same tensor."""
    loader = Loader(shared_export, 100, shuffle=True)
    flat_spec = tf.nest.flatten(loader.element_spec)
    assert [[flat_spec[i].name for i in g] for g in loader._block_positions] == [["C1", "row_id", "label"]]
    epoch = loader.core.iter_epoch(0)
    features, labels = next(epoch)
    epoch.close()
    out = loader._to_tensors((features, labels))
    assert len(out) == 1 + len(flat_spec) - 3
    block = out[0]
    np.testing.assert_array_equal(block.numpy(), np.stack([features["C1"], features["row_id"], labels]))
    features["C1"][0] = -5
    assert int(block[0, 0]) == -5, "the block tensor is the batch's buffer"
    copies = ({n: (tuple(np.array(x) for x in a) if isinstance(a, tuple) else np.array(a))
               for n, a in features.items()}, np.array(labels))
    again = loader._to_tensors(copies)
    assert len(again) == len(out)
    for a, b in zip(again, out, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_eager_iteration_equals_tf_datas_own_iterator(shared_export: Path) -> None:
    """``for ... in loader`` runs the loader's eager iterator (no Python check per
    tensor); tf.data's own iterator over the same epoch gives the same elements."""
    from tensorflow.python.data.ops import iterator_ops

    loader = Loader(shared_export, 300, seed=6, shuffle=True)
    it = iter(loader)
    assert type(it).__name__ == "_EagerIterator"
    ours = list(it)
    loader.set_epoch(0)
    theirs = list(iterator_ops.OwnedIterator(loader))
    assert len(ours) == len(theirs) == len(loader)
    for a, b in zip(ours, theirs, strict=True):
        assert tf.nest.map_structure(lambda s: s.dtype, a) == tf.nest.map_structure(lambda s: s.dtype, b)
        for x, y in zip(tf.nest.flatten(a), tf.nest.flatten(b), strict=True):
            np.testing.assert_array_equal(x.numpy(), y.numpy())


def test_a_scalar_column_named_like_a_list_columns_tensor(tmp_path: Path) -> None:
    """Scalar columns are told from a list column's tensors by the element's
    structure, not by name: a scalar column "x__offsets" beside a list column "x"
    (whose offsets tensor has that name) is one more int64 scalar."""
    x = [[1], [2, 3], [], [4]]
    pq.write_table(pa.table({"x": pa.array(x, pa.list_(pa.int64())),
                             "x__offsets": pa.array([0, 1, 2, 3], pa.int64()),
                             "a": pa.array([0, 2, 4, 6], pa.int64())}), tmp_path / "part.parquet")
    loader = Loader(str(tmp_path / "part.parquet"), 4, shuffle=False)
    (features,) = list(loader)
    np.testing.assert_array_equal(features["x__offsets"].numpy(), [0, 1, 2, 3])
    np.testing.assert_array_equal(features["a"].numpy(), [0, 2, 4, 6])
    values, offsets = features["x"]
    np.testing.assert_array_equal(values.numpy(), [1, 2, 3, 4])
    np.testing.assert_array_equal(offsets.numpy(), [0, 1, 3, 3, 4])

"""Training inputs the Keras fit loop refuses clearly (issue 27, item 7, and the
checkpoint folder of item 3): non-finite labels (named by column, file and row), ids
outside their table (inside the compiled step too), and a checkpoint folder that
cannot be written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.core.errors import DataError  # noqa: E402
from tabstream.core.schema import ColumnSchema, Schema, Tags  # noqa: E402
from tabstream.train.tensorflow import DLRM, fit  # noqa: E402
from tabstream.train.tensorflow.fit import CheckpointError  # noqa: E402

pytestmark = pytest.mark.tensorflow

ROWS = 200


def export(tmp_path, bad_label=None):
    """A real export of two files (100 rows each, in input order); ``bad_label`` is
    put in the label of input row 150, which lands in the second file."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"C1": rng.integers(0, 20, ROWS), "C2": rng.integers(0, 7, ROWS),
                       "I1": rng.normal(size=ROWS).astype("float32"),
                       "click": (rng.random(ROWS) < 0.3).astype("float32")})
    if bad_label is not None:
        df.loc[150, "click"] = bad_label
    raw = tmp_path / "raw"
    raw.mkdir()
    df.iloc[:100].to_parquet(raw / "a.parquet")
    df.iloc[100:].to_parquet(raw / "b.parquet")
    wf = ts.Workflow((["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.Normalize())
                     + (["click"] >> ops.AddTags(["target", "binary_classification"])))
    out = tmp_path / "out"
    wf.fit_transform(ts.Dataset(str(raw))).to_parquet(str(out))
    return out


def data_files(folder):
    return sorted(str(p) for p in folder.glob("*.parquet"))


def schema(c1=20):
    def cat(name, n):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
                            properties={"domain": {"min": 0, "max": n - 1}})
    return Schema([cat("C1", c1), cat("C2", 7), ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])


def model_for(s):
    return DLRM(s, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,), seed=0)


def weights(model):
    return [np.array(w) for w in model.get_weights()]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_non_finite_label_names_the_column_the_file_and_the_row(tmp_path, bad):
    from tabstream.loaders.tensorflow import Loader

    folder = export(tmp_path, bad_label=bad)
    path = data_files(folder)[1]
    labels = pd.read_parquet(path)["click"].to_numpy()
    row = int(np.flatnonzero(~np.isfinite(labels))[0])  # by hand, with pandas
    ds = ts.Dataset(str(folder))
    model = model_for(ds.schema)
    model(model.example_batch())
    before = weights(model)
    shown = re.escape(str(float(bad)))
    stored = "null, read as nan" if np.isnan(bad) else shown  # pandas writes NaN as null
    with pytest.raises(DataError, match=(
            rf"label column 'click' holds {shown} at epoch 1/1, step 1: labels must be finite "
            rf"numbers; the first is row {row} \(counting from 0\) of {re.escape(path)} "
            rf"\({stored}\)")):
        fit(model, Loader(ds, batch_size=ROWS, shuffle=True, seed=3),
            keras.optimizers.SGD(0.1), progress=False)
    for got, want in zip(weights(model), before, strict=True):  # the step was not applied
        np.testing.assert_array_equal(got, want)


def test_an_id_outside_its_table_in_the_compiled_step_names_feature_id_and_cardinality():
    model = model_for(schema(c1=20))
    features = {"C1": tf.constant([3, 20, 5]), "C2": tf.constant([0, 1, 2]),
                "I1": tf.constant([0.1, 0.2, 0.3])}
    with pytest.raises(DataError, match=r"categorical feature 'C1': id 20 is outside embedding "
                                        r"table 'C1' of cardinality 20 \(expected 0 <= id < 20\)"):
        fit(model, [(features, tf.constant([1.0, 0.0, 1.0]))], keras.optimizers.SGD(0.1),
            progress=False)
    negative = {**features, "C1": tf.constant([3, 4, 5]), "C2": tf.constant([0, -3, 2])}
    with pytest.raises(DataError, match=r"categorical feature 'C2': id -3 is outside embedding "
                                        r"table 'C2' of cardinality 7"):
        fit(model, [(negative, tf.constant([1.0, 0.0, 1.0]))], keras.optimizers.SGD(0.1),
            progress=False)


def test_ids_at_the_edges_train_and_match_a_plain_gather():
    model = model_for(schema(c1=20))
    table = model.embeddings.table_for("C1")
    ids = tf.constant([0, 19])
    np.testing.assert_array_equal(np.asarray(table(ids)),
                                  np.asarray(table.embeddings)[[0, 19]])


def test_a_checkpoint_dir_below_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    model = model_for(schema())
    model(model.example_batch())
    before = weights(model)
    read = []

    def batches():
        read.append(1)
        yield model.example_batch(), tf.constant([1.0] * 2)

    with pytest.raises(CheckpointError, match=(
            rf"checkpoint_dir {re.escape(str(tmp_path / 'file' / 'ck'))} cannot be created: "
            r"Not a directory\. Pass another checkpoint_dir")):
        fit(model, batches(), keras.optimizers.SGD(0.1), checkpoint_dir=tmp_path / "file" / "ck",
            progress=False)
    assert read == []
    for got, want in zip(weights(model), before, strict=True):
        np.testing.assert_array_equal(got, want)


# A child process: RLIMIT_FSIZE caps any file it writes (root's too); with SIGXFSZ
# ignored a write past it fails with EFBIG, as on a full disk.
CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
    import numpy as np, keras, tensorflow as tf
    sys.path.insert(0, {tests!r})
    from test_tf_training_inputs import model_for, schema
    from tabstream.train.tensorflow import fit
    out = {{}}
    model = model_for(schema(c1=20_000))        # 20,000 x 8 floats: 640 kB
    batch = model.example_batch()
    rows = int(tf.shape(next(iter(batch.values())))[0])
    train = [(batch, tf.ones([rows]))] * 2
    state = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    opt = keras.optimizers.Adam(0.01)
    ck = {ck!r}
    fit(model, train, opt, epochs=1, checkpoint_dir=ck, progress=False)
    files = sorted(os.listdir(ck))
    read = lambda: {{f: open(os.path.join(ck, f), "rb").read() for f in files}}
    before = read()
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    def attempt(limit, folder, epochs):
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
        try:
            fit(model, train, opt, epochs=epochs, checkpoint_dir=folder, resume=True, progress=False)
            return None
        except Exception as exc:
            return [type(exc).__name__, str(exc)]
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    out["full"] = attempt(state / 2, {full!r}, 1)
    out["midway"] = attempt(2 * state, ck, 2)
    out["files"] = sorted(os.listdir(ck))
    out["same"] = read() == before
    out["state"] = json.load(open(os.path.join(ck, "checkpoint.json")))["epoch"]
    out["full_listing"] = sorted(os.listdir({full!r}))
    print(json.dumps(out))
""")


def test_a_full_checkpoint_dir_fails_before_training_and_midway_keeps_the_previous(tmp_path):
    ck, full = tmp_path / "ck", tmp_path / "full"
    code = CHILD.format(tests=os.path.dirname(__file__), ck=str(ck), full=str(full))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["full"][0] == "CheckpointError"
    assert re.match(rf"checkpoint_dir {re.escape(str(full))} is not writable: File too large "
                    r"\(the disk, a quota or a file size limit is full\)", out["full"][1]), out
    assert out["full_listing"] == []
    assert out["midway"][0] == "CheckpointError"
    assert re.match(rf"checkpoint_dir {re.escape(str(ck))} could not take a checkpoint; the "
                    r"previous one is kept: File too large", out["midway"][1]), out
    assert out["same"] and out["state"] == 1  # the first epoch's checkpoint, whole
    assert out["files"] == ["checkpoint.json", "checkpoint.optimizer.npz",
                            "checkpoint.weights.h5"]  # no temporary file


def test_a_non_finite_validation_label_is_named_too(tmp_path):
    from tabstream.loaders.tensorflow import Loader
    from tabstream.train.tensorflow import evaluate

    folder = export(tmp_path, bad_label=np.inf)
    path = data_files(folder)[1]
    row = int(np.flatnonzero(~np.isfinite(pd.read_parquet(path)["click"].to_numpy()))[0])
    ds = ts.Dataset(str(folder))
    with pytest.raises(DataError, match=(
            rf"label column 'click' holds inf in the evaluated data: labels must be finite "
            rf"numbers; the first is row {row} \(counting from 0\) of {re.escape(path)} \(inf\)")):
        evaluate(model_for(ds.schema), Loader(ds, batch_size=64, shuffle=False))


# -- data rewritten in place under a mid-epoch checkpoint (the loop is shared) -----------


class Crashing:
    """The loader's batches, then a crash before batch ``at`` (the first epoch only)."""

    def __init__(self, loader, at):
        self.loader, self.core, self.at = loader, loader.core, at

    def set_epoch(self, epoch):
        self.loader.set_epoch(epoch)

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if i == self.at:
                raise KeyboardInterrupt("crash")
            yield batch


def train_keras(folder, checkpoint_dir, crash_at=None, resume=False):
    from tabstream.loaders.tensorflow import Loader

    ds = ts.Dataset(str(folder))
    model = model_for(ds.schema)
    loader = Loader(ds, batch_size=16, shuffle=True, seed=5)
    if crash_at is not None:
        loader = Crashing(loader, crash_at)
    fit(model, loader, keras.optimizers.Adam(0.01), epochs=1, checkpoint_dir=str(checkpoint_dir),
        checkpoint_every=2, resume=resume, progress=False)
    return model


def test_keras_resume_refuses_a_file_rewritten_in_place_since_the_checkpoint(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tabstream.train.tensorflow.fit import checkpoint_position

    folder = export(tmp_path)
    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        train_keras(folder, ck, crash_at=5)
    assert checkpoint_position(ck) == (0, 4)
    changed = data_files(folder)[1]
    stat = os.stat(changed)
    table = pq.read_table(changed)  # same rows, other values, the old modification time
    i = table.schema.get_field_index("I1")
    pq.write_table(table.set_column(i, "I1", pa.array((table["I1"].to_numpy() * 2 + 1).astype("float32"))),
                   changed)
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(DataError, match=(
            rf"checkpoint {re.escape(str(ck))}\S* stopped inside epoch 1 \(after 4 batches\) of data "
            rf"that has changed since: {re.escape(changed)} was rewritten in place")):
        train_keras(folder, ck, resume=True)

"""Training inputs the torch fit loop refuses clearly (issue 27, item 7, and the
checkpoint folder of item 3): non-finite labels (named by column, file and row), ids
outside their table, data rewritten in place under a mid-epoch checkpoint, and a
checkpoint folder that cannot be written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip("torch")

from torch_data import Crashing  # noqa: E402

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.core.errors import DataError  # noqa: E402
from tabstream.loaders.torch import Loader  # noqa: E402
from tabstream.train.tables import TableConfig  # noqa: E402
from tabstream.train.torch import DLRM, EmbeddingTables, fit  # noqa: E402
from tabstream.train.torch.fit import CheckpointError, checkpoint_position  # noqa: E402

ROWS = 200


def export(tmp_path, bad_label=None, name="out"):
    """A real export of two files (100 rows each, in input order); ``bad_label`` is
    put in the label of input row 150, which lands in the second file."""
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"C1": rng.integers(0, 20, ROWS), "C2": rng.integers(0, 7, ROWS),
                       "I1": rng.normal(size=ROWS).astype("float32"),
                       "click": (rng.random(ROWS) < 0.3).astype("float32")})
    if bad_label is not None:
        df.loc[150, "click"] = bad_label
    raw = tmp_path / f"{name}-raw"
    raw.mkdir()
    df.iloc[:100].to_parquet(raw / "a.parquet")
    df.iloc[100:].to_parquet(raw / "b.parquet")
    wf = ts.Workflow((["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.Normalize())
                     + (["click"] >> ops.AddTags(["target", "binary_classification"])))
    out = tmp_path / name
    wf.fit_transform(ts.Dataset(str(raw))).to_parquet(str(out))
    return out


def data_files(folder):
    return sorted(str(p) for p in folder.glob("*.parquet"))


def first_bad_label(folder):
    """(file, row) of the first non-finite label, read with pandas."""
    for path in data_files(folder):
        labels = pd.read_parquet(path)["click"].to_numpy()
        bad = np.flatnonzero(~np.isfinite(labels))
        if bad.size:
            return path, int(bad[0])
    return None


def parameters(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- labels -----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_label_names_the_column_the_file_and_the_row(tmp_path, bad):
    folder = export(tmp_path, bad_label=bad)
    path, row = first_bad_label(folder)
    assert path == data_files(folder)[1]  # the second file
    ds = ts.Dataset(str(folder))
    torch.manual_seed(0)
    model = DLRM(ds.schema, embedding_dim=8)
    before = parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shown = re.escape(str(float(bad)))
    stored = "null, read as nan" if np.isnan(bad) else shown  # pandas writes NaN as null
    with pytest.raises(DataError, match=(
            rf"label column 'click' holds {shown} at epoch 1/1, step 1: labels must be finite "
            rf"numbers; the first is row {row} \(counting from 0\) of {re.escape(path)} "
            rf"\({stored}\)")):
        # one batch of every row: the bad row is in the first step whatever the shuffle
        fit(model, Loader(ds, batch_size=ROWS, shuffle=True, seed=3), optimizer, progress=False)
    for k, v in parameters(model).items():  # the bad step was not applied
        torch.testing.assert_close(v, before[k])


def test_labels_of_a_plain_iterable_are_named_without_a_file():
    features = {"C1": torch.tensor([0, 1]), "C2": torch.tensor([1, 2]), "I1": torch.tensor([0.5, 1.0])}
    schema = export_schema()
    model = DLRM(schema, embedding_dim=8)
    batches = [(features, torch.tensor([1.0, 0.0])), (features, torch.tensor([float("nan"), 1.0]))]
    with pytest.raises(DataError, match=r"label column \(the labels\) holds nan at epoch 1/1, "
                                        r"step 2: labels must be finite numbers\. Drop"):
        fit(model, batches, torch.optim.SGD(model.parameters(), lr=0.1), progress=False)
    named = [(features, {"y": torch.tensor([float("inf"), 1.0])})]
    with pytest.raises(DataError, match=r"label column 'y' holds inf at epoch 1/1, step 1"):
        fit(model, named, torch.optim.SGD(model.parameters(), lr=0.1), progress=False)


def export_schema(c1=20):
    """The export's schema, by hand (``c1``: the C1 table's rows)."""
    from tabstream.core.schema import ColumnSchema, Schema, Tags

    def cat(name, n):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
                            properties={"domain": {"min": 0, "max": n - 1}})
    return Schema([cat("C1", c1), cat("C2", 7), ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])


# -- ids outside their table ------------------------------------------------------


def tables():
    return EmbeddingTables([TableConfig("C1", 20, 4, ("C1",)),
                            TableConfig("tags", 10, 4, ("tags",), is_list=True)])


@pytest.mark.parametrize(("feature", "batch", "value", "table", "cardinality"), [
    ("C1", {"C1": [3, 20], "tags": ([1, 2], [0, 1, 2])}, 20, "C1", 20),
    ("C1", {"C1": [-1, 5], "tags": ([1, 2], [0, 1, 2])}, -1, "C1", 20),
    ("tags", {"C1": [3, 4], "tags": ([1, 10], [0, 1, 2])}, 10, "tags", 10),
    ("tags", {"C1": [3, 4], "tags": ([-5, 3], [0, 1, 2])}, -5, "tags", 10),
    ("tags", {"C1": [3, 4], "tags": ([[1, 99], [2, 0]], [[1, 1], [1, 0]])}, 99, "tags", 10),
])
def test_an_id_outside_its_table_names_feature_id_and_cardinality(feature, batch, value, table,
                                                                   cardinality):
    features = {k: tuple(torch.tensor(p) for p in v) if isinstance(v, tuple) else torch.tensor(v)
                for k, v in batch.items()}
    with pytest.raises(DataError, match=(
            rf"categorical feature '{feature}': id {value} is outside embedding table "
            rf"'{table}' of cardinality {cardinality} \(expected 0 <= id < {cardinality}\)")):
        tables()(features)


def test_padding_is_not_checked_and_ids_at_the_edges_pass():
    t = tables()
    out = t({"C1": torch.tensor([0, 19]),
             "tags": (torch.tensor([[9, -7], [0, 123]]), torch.tensor([[1, 0], [1, 0]]))})
    weight_c1, weight_tags = t["C1"].weight.detach(), t["tags"].weight.detach()
    torch.testing.assert_close(out["C1"].detach(), weight_c1[[0, 19]])
    torch.testing.assert_close(out["tags"].detach(), weight_tags[[9, 0]])


def test_fit_on_data_encoded_with_more_ids_than_the_model_names_the_feature(tmp_path):
    folder = export(tmp_path)
    ds = ts.Dataset(str(folder))
    most = int(pd.concat(pd.read_parquet(p) for p in data_files(folder))["C1"].max())
    model = DLRM(export_schema(c1=most), embedding_dim=8)  # one row short of the data's ids
    with pytest.raises(DataError, match=rf"categorical feature 'C1': id {most} is outside "
                                        rf"embedding table 'C1' of cardinality {most} "):
        fit(model, Loader(ds, batch_size=ROWS, shuffle=True),
            torch.optim.SGD(model.parameters(), lr=0.1), progress=False)


# -- data rewritten in place under a mid-epoch checkpoint -----------------------------


def train(folder, checkpoint_dir, crash_at=None, resume=False):
    torch.manual_seed(0)
    ds = ts.Dataset(str(folder))
    model = DLRM(ds.schema, embedding_dim=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loader = Loader(ds, batch_size=16, shuffle=True, seed=5)
    if crash_at is not None:
        loader = Crashing(loader, crash_at)
    fit(model, loader, optimizer, epochs=1, checkpoint_dir=checkpoint_dir, checkpoint_every=2,
        resume=resume, progress=False)
    return model


def rewrite_in_place(path, keep_mtime=False):
    """Same rows, other values: the continuous column scaled; with ``keep_mtime``
    the old modification time is put back (as ``cp -p`` or ``rsync -t`` would)."""
    stat = os.stat(path)
    table = pq.read_table(path)
    i = table.schema.get_field_index("I1")
    scaled = pa.array((table["I1"].to_numpy() * 2 + 1).astype("float32"))
    pq.write_table(table.set_column(i, "I1", scaled), path)
    assert pq.read_metadata(path).num_rows == 100
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == stat.st_mtime_ns


@pytest.mark.parametrize("keep_mtime", [False, True])
def test_resume_refuses_a_file_rewritten_in_place_since_the_checkpoint(tmp_path, keep_mtime):
    folder = export(tmp_path)
    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        train(folder, ck, crash_at=5)
    assert checkpoint_position(ck) == (0, 4)
    changed = data_files(folder)[1]
    rewrite_in_place(changed, keep_mtime)
    with pytest.raises(DataError, match=(
            rf"checkpoint {re.escape(str(ck))}/checkpoint\.pt stopped inside epoch 1 \(after 4 "
            rf"batches\) of data that has changed since: {re.escape(changed)} was rewritten in "
            r"place")):
        train(folder, ck, resume=True)


def test_resume_on_unchanged_data_ends_like_a_run_that_never_stopped(tmp_path):
    folder = export(tmp_path)
    reference = parameters(train(folder, tmp_path / "ref"))
    ck = tmp_path / "ck"
    with pytest.raises(KeyboardInterrupt):
        train(folder, ck, crash_at=5)
    resumed = parameters(train(folder, ck, resume=True))  # a new Dataset and Loader
    for k, v in reference.items():
        torch.testing.assert_close(resumed[k], v)


# -- the checkpoint folder --------------------------------------------------------


class Counting:
    def __init__(self, batches):
        self.batches, self.read = batches, 0

    def __iter__(self):
        for batch in self.batches:
            self.read += 1
            yield batch


def small_run():
    schema = export_schema()
    torch.manual_seed(0)
    model = DLRM(schema, embedding_dim=8)
    features = {"C1": torch.tensor([0, 1]), "C2": torch.tensor([1, 2]), "I1": torch.tensor([0.5, 1.0])}
    return model, Counting([(features, torch.tensor([1.0, 0.0]))] * 3)


def test_a_checkpoint_dir_below_a_file_is_refused_before_training(tmp_path):
    (tmp_path / "file").write_text("x")
    model, loader = small_run()
    before = parameters(model)
    with pytest.raises(CheckpointError, match=(
            rf"checkpoint_dir {re.escape(str(tmp_path / 'file' / 'ck'))} cannot be created: "
            r"Not a directory\. Pass another checkpoint_dir")):
        fit(model, loader, torch.optim.SGD(model.parameters(), lr=0.1),
            checkpoint_dir=tmp_path / "file" / "ck", progress=False)
    assert loader.read == 0
    for k, v in parameters(model).items():
        torch.testing.assert_close(v, before[k])


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod; see the RLIMIT tests")
def test_a_read_only_checkpoint_dir_is_refused_before_training(tmp_path):
    ck = tmp_path / "ck"
    ck.mkdir()
    ck.chmod(0o500)
    model, loader = small_run()
    try:
        with pytest.raises(CheckpointError, match=rf"checkpoint_dir {re.escape(str(ck))} is not "
                                                  r"writable: Permission denied"):
            fit(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=ck,
                progress=False)
    finally:
        ck.chmod(0o700)
    assert loader.read == 0 and os.listdir(ck) == []


# Run in a child process: RLIMIT_FSIZE caps the size of any file it writes (root's
# too), and with SIGXFSZ ignored a write past it fails with EFBIG, as on a full disk.
CHILD = textwrap.dedent("""
    import json, os, resource, signal, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_torch_training_inputs import export_schema, small_run
    from tabstream.train.torch import fit
    from tabstream.train.torch.fit import checkpoint_position
    ck = {ck!r}
    model, loader = small_run()
    state = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    if {first_epoch}:
        fit(model, loader, opt, epochs=1, checkpoint_dir=ck, progress=False)
    size = os.path.getsize(os.path.join(ck, "checkpoint.pt")) if {first_epoch} else 0
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = {limit_factor} * state
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(limit), resource.RLIM_INFINITY))
    read_before = loader.read
    path = os.path.join(ck, "checkpoint.pt")
    digest = lambda: open(path, "rb").read().hex() if os.path.exists(path) else None
    before = digest()
    try:
        fit(model, loader, opt, epochs=2, checkpoint_dir=ck, resume=True, progress=False)
        error = None
    except Exception as exc:
        error = [type(exc).__name__, str(exc)]
    print(json.dumps({{"error": error, "state": state, "size": size, "limit": limit,
                      "read": loader.read - read_before, "same": before == digest(),
                      "position": checkpoint_position(ck) if {first_epoch} else None}}))
""")


def run_child(tmp_path, ck, first_epoch, limit_factor):
    code = CHILD.format(tests=os.path.dirname(__file__), ck=str(ck), first_epoch=first_epoch,
                        limit_factor=limit_factor)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_full_checkpoint_dir_is_refused_before_training(tmp_path):
    ck = tmp_path / "ck"
    out = run_child(tmp_path, ck, first_epoch=False, limit_factor=0.5)
    assert out["error"][0] == "CheckpointError"
    assert re.match(rf"checkpoint_dir {re.escape(str(ck))} is not writable: File too large "
                    r"\(the disk, a quota or a file size limit is full\)\. Pass another "
                    r"checkpoint_dir", out["error"][1]), out["error"][1]
    assert out["read"] == 0 and os.listdir(ck) == []


def test_a_checkpoint_write_failing_midway_keeps_the_previous_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    # the model's state fits under the limit (the check passes), a checkpoint with
    # Adam's two moments does not: the write fails midway
    out = run_child(tmp_path, ck, first_epoch=True, limit_factor=2)
    assert out["size"] > out["limit"] > out["state"]
    assert out["error"][0] == "CheckpointError"
    assert re.match(rf"checkpoint_dir {re.escape(str(ck))} could not take a checkpoint; the "
                    r"previous one is kept: File too large", out["error"][1]), out["error"][1]
    assert out["position"] == [1, 0]  # the first epoch's checkpoint, whole
    assert sorted(os.listdir(ck)) == ["checkpoint.pt"]  # no temporary file
    assert out["same"] and os.path.getsize(ck / "checkpoint.pt") == out["size"]


@pytest.mark.slow
def test_a_sharded_checkpoint_write_failing_midway_fails_on_every_rank(tmp_path, monkeypatch):
    sys.path.insert(0, os.path.dirname(__file__))
    import dist_helpers

    data = tmp_path / "data"
    dist_helpers.write_parquet(data, [30, 11], seed=1)
    outputs = dist_helpers.launch(2, "unused", tmp_path, str(data),
                                  worker=dist_helpers.WORKER.with_name("checkpoint_full_worker.py"))
    for stdout, _ in outputs:  # every rank raised, none hung, the checkpoint is as it was
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["error"][0] == "CheckpointError", out
        assert re.search(rf"checkpoint_dir {re.escape(str(tmp_path / 'ck'))}", out["error"][1]), out
        # the pointer still names the previous checkpoint folder, which is there
        assert out["pointer_same"], out
        pointed = [f for f in out["before"] if f.endswith(".dcp")]
        assert set(pointed) <= set(out["listing"]), out
    from tabstream.train.torch.fit import checkpoint_position as position

    assert position(tmp_path / "ck") == (1, 0)


def test_a_non_finite_validation_label_is_named_too(tmp_path):
    from tabstream.train.torch import evaluate

    folder = export(tmp_path, bad_label=np.nan)
    path, row = first_bad_label(folder)
    ds = ts.Dataset(str(folder))
    model = DLRM(ds.schema, embedding_dim=8)
    with pytest.raises(DataError, match=(
            rf"label column 'click' holds nan in the evaluated data: labels must be finite "
            rf"numbers; the first is row {row} \(counting from 0\) of {re.escape(path)}")):
        evaluate(model, Loader(ds, batch_size=64, shuffle=False))

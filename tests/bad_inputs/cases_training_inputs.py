"""Training inputs (issue 27, items 3 and 7): non-finite labels, ids outside their
table, data rewritten in place under a mid-epoch checkpoint, checkpoint folders that
cannot be written; torch, Keras and the ``tabstream train`` command."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from _corpus import CliFailed, cli

from tabstream.core.errors import DataError
from tabstream.train.checks import CheckpointError

ROWS = 200


def _export(tmp, bad_label=None, bad_row=150):
    """A real two-file export (100 rows each, input order kept); ``bad_label`` goes to
    input row ``bad_row``."""
    import tabstream as ts
    from tabstream import ops

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"C1": rng.integers(0, 20, ROWS), "C2": rng.integers(0, 7, ROWS),
                       "I1": rng.normal(size=ROWS).astype("float32"),
                       "click": (rng.random(ROWS) < 0.3).astype("float32")})
    if bad_label is not None:
        df.loc[bad_row, "click"] = bad_label
    raw = tmp / "raw"
    raw.mkdir()
    df.iloc[:100].to_parquet(raw / "a.parquet")
    df.iloc[100:].to_parquet(raw / "b.parquet")
    wf = ts.Workflow((["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.Normalize())
                     + (["click"] >> ops.AddTags(["target", "binary_classification"])))
    out = tmp / "out"
    wf.fit_transform(ts.Dataset(str(raw))).to_parquet(str(out))
    return out


def _files(folder):
    return sorted(str(p) for p in folder.glob("*.parquet"))


def _where_bad(folder):
    """(file, row) of the first non-finite label, read with pandas."""
    for path in _files(folder):
        bad = np.flatnonzero(~np.isfinite(pd.read_parquet(path)["click"].to_numpy()))
        if bad.size:
            return path, int(bad[0])
    raise AssertionError("no bad label")


def _expect_named(exc, folder):
    path, row = _where_bad(folder)
    assert re.search(rf"row {row} \(counting from 0\) of {re.escape(path)}", str(exc)), str(exc)


def _torch_label(bad, bad_row=150):
    def run(tmp):
        import torch

        import tabstream as ts
        from tabstream.loaders.torch import Loader
        from tabstream.train.torch import DLRM, fit

        folder = _export(tmp, bad, bad_row)
        ds = ts.Dataset(str(folder))
        model = DLRM(ds.schema, embedding_dim=8)
        try:
            fit(model, Loader(ds, batch_size=64, seed=1), torch.optim.SGD(model.parameters(), lr=0.1),
                progress=False)
        except DataError as exc:
            _expect_named(exc, folder)
            raise
    return run


def _keras_label(bad):
    def run(tmp):
        import keras

        import tabstream as ts
        from tabstream.loaders.tensorflow import Loader
        from tabstream.train.tensorflow import DLRM, fit

        folder = _export(tmp, bad)
        ds = ts.Dataset(str(folder))
        model = DLRM(ds.schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,))
        try:
            fit(model, Loader(ds, batch_size=64, seed=1), keras.optimizers.SGD(0.1), progress=False)
        except DataError as exc:
            _expect_named(exc, folder)
            raise
    return run


def _validation_label(framework):
    def run(tmp):
        import tabstream as ts

        folder = _export(tmp, np.nan)
        ds = ts.Dataset(str(folder))
        try:
            if framework == "torch":
                from tabstream.loaders.torch import Loader
                from tabstream.train.torch import DLRM, evaluate

                evaluate(DLRM(ds.schema, embedding_dim=8), Loader(ds, batch_size=64, shuffle=False))
            else:
                from tabstream.loaders.tensorflow import Loader
                from tabstream.train.tensorflow import DLRM, evaluate

                evaluate(DLRM(ds.schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,)),
                         Loader(ds, batch_size=64, shuffle=False))
        except DataError as exc:
            _expect_named(exc, folder)
            raise
    return run


def _cli_label(tmp):
    folder = _export(tmp, np.nan, bad_row=20)  # the first file this time
    try:
        cli("train", folder, "--quiet", "--batch-size", "64")
    except CliFailed as exc:
        _expect_named(exc, folder)
        raise


def _schema(c1, c2=7):
    from tabstream.core.schema import ColumnSchema, Schema, Tags

    def cat(name, n):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
                            properties={"domain": {"min": 0, "max": n - 1}})
    return Schema([cat("C1", c1), cat("C2", c2), ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])


def _torch_ids(c1, c2):
    def run(tmp):
        import torch

        from tabstream.train.torch import DLRM

        DLRM(_schema(20), embedding_dim=8)({"C1": torch.tensor(c1), "C2": torch.tensor(c2),
                                            "I1": torch.tensor([0.5] * len(c1))})
    return run


def _torch_list_ids(tmp):
    import torch

    from tabstream.train.tables import TableConfig
    from tabstream.train.torch import EmbeddingTables

    tables = EmbeddingTables([TableConfig("tags", 10, 4, ("tags",), is_list=True)])
    tables({"tags": (torch.tensor([1, 2, 12]), torch.tensor([0, 2, 3]))})


def _torch_fit_small_table(tmp):
    """An export whose C1 ids go past the table of the model built from another schema."""
    import torch

    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import DLRM, fit

    folder = _export(tmp)
    ds = ts.Dataset(str(folder))
    most = int(pd.concat(pd.read_parquet(p) for p in _files(folder))["C1"].max())
    model = DLRM(_schema(most), embedding_dim=8)
    fit(model, Loader(ds, batch_size=ROWS), torch.optim.SGD(model.parameters(), lr=0.1),
        progress=False)


def _keras_ids(c1, c2, compiled):
    def run(tmp):
        import keras
        import tensorflow as tf

        from tabstream.train.tensorflow import DLRM, fit

        model = DLRM(_schema(20), embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,))
        features = {"C1": tf.constant(c1), "C2": tf.constant(c2), "I1": tf.constant([0.5] * len(c1))}
        if not compiled:
            model(features)
            return
        fit(model, [(features, tf.ones([len(c1)]))], keras.optimizers.SGD(0.1), progress=False)
    return run


def _torch_resume(change):
    def run(tmp):
        import torch

        import tabstream as ts
        from tabstream.loaders.torch import Loader
        from tabstream.train.torch import DLRM, fit

        folder = _export(tmp)

        class Crashing:
            def __init__(self, loader):
                self.loader, self.core = loader, loader.core

            def set_epoch(self, epoch):
                self.loader.set_epoch(epoch)

            def __iter__(self):
                for i, batch in enumerate(self.loader):
                    if i == 3:
                        raise KeyboardInterrupt
                    yield batch

        def train(crash=False, resume=False):
            torch.manual_seed(0)
            ds = ts.Dataset(str(folder))
            model = DLRM(ds.schema, embedding_dim=8)
            loader = Loader(ds, batch_size=32, seed=2)
            fit(model, Crashing(loader) if crash else loader,
                torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp / "ck",
                checkpoint_every=1, resume=resume, progress=False)
            return model

        try:
            train(crash=True)
            raise AssertionError("the crash did not happen")
        except KeyboardInterrupt:
            pass
        if change:
            path = _files(folder)[0]
            table = pq.read_table(path)
            i = table.schema.get_field_index("I1")
            pq.write_table(table.set_column(i, "I1", pa.array(
                (table["I1"].to_numpy() + 1).astype("float32"))), path)
        resumed = train(resume=True)
        # unchanged data: the resumed run ends where one that never stopped ends
        torch.manual_seed(0)
        ds = ts.Dataset(str(folder))
        plain = DLRM(ds.schema, embedding_dim=8)
        fit(plain, Loader(ds, batch_size=32, seed=2), torch.optim.SGD(plain.parameters(), lr=0.1),
            progress=False)
        for k, v in plain.state_dict().items():
            torch.testing.assert_close(resumed.state_dict()[k], v)
    return run


def _checkpoint_dir(kind, framework):
    def run(tmp):
        (tmp / "file").write_text("x")
        folder = tmp / "file" / "ck" if kind == "below a file" else tmp / "file"
        if framework == "torch":
            import torch

            from tabstream.train.torch import DLRM, fit

            model = DLRM(_schema(20), embedding_dim=8)
            batch = ({"C1": torch.tensor([1]), "C2": torch.tensor([1]), "I1": torch.tensor([0.5])},
                     torch.tensor([1.0]))
            fit(model, [batch], torch.optim.SGD(model.parameters(), lr=0.1),
                checkpoint_dir=folder, progress=False)
        else:
            import keras
            import tensorflow as tf

            from tabstream.train.tensorflow import DLRM, fit

            model = DLRM(_schema(20), embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,))
            batch = ({"C1": tf.constant([1]), "C2": tf.constant([1]), "I1": tf.constant([0.5])},
                     tf.constant([1.0]))
            fit(model, [batch], keras.optimizers.SGD(0.1), checkpoint_dir=folder, progress=False)
    return run


def _cli_checkpoint_below_a_file(tmp):
    folder = _export(tmp)
    (tmp / "file").write_text("x")
    cli("train", folder, "--quiet", "--checkpoint-dir", tmp / "file" / "ck")


_LABEL = r"label column 'click' holds {} at epoch 1/1, step \d+: labels must be finite numbers; "
_ID = (r"categorical feature '{}': id {} is outside embedding table '{}' of cardinality {} "
       r"\(expected 0 <= id < {}\)")

CASES = [
    ("torch: NaN label in the second file", _torch_label(np.nan), DataError,
     _LABEL.format("nan") + r"the first is row 50 \(counting from 0\) of .*part_00001\.parquet "
     r"\(null, read as nan\)"),
    ("torch: inf label", _torch_label(np.inf), DataError,
     _LABEL.format("inf") + r"the first is row 50 .*part_00001\.parquet \(inf\)"),
    ("torch: -inf label in the first file", _torch_label(-np.inf, bad_row=7), DataError,
     _LABEL.format("-inf") + r"the first is row 7 .*part_00000\.parquet \(-inf\)"),
    ("keras: NaN label in the second file", _keras_label(np.nan), DataError,
     _LABEL.format("nan") + r"the first is row 50 .*part_00001\.parquet"),
    ("keras: inf label", _keras_label(np.inf), DataError,
     _LABEL.format("inf") + r"the first is row 50 .*part_00001\.parquet \(inf\)"),
    ("torch: NaN validation label", _validation_label("torch"), DataError,
     r"label column 'click' holds nan in the evaluated data: .*row 50 .*part_00001\.parquet"),
    ("keras: NaN validation label", _validation_label("keras"), DataError,
     r"label column 'click' holds nan in the evaluated data: .*row 50 .*part_00001\.parquet"),
    ("cli: NaN label", _cli_label, CliFailed,
     r"DataError: label column 'click' holds nan .*row 20 \(counting from 0\) of "
     r".*part_00000\.parquet"),
    ("torch: id = cardinality", _torch_ids([1, 20], [0, 0]), DataError,
     _ID.format("C1", 20, "C1", 20, 20)),
    ("torch: negative id", _torch_ids([1, 2], [0, -1]), DataError,
     _ID.format("C2", -1, "C2", 7, 7)),
    ("torch: list id past the table", _torch_list_ids, DataError,
     _ID.format("tags", 12, "tags", 10, 10)),
    ("torch: fit on ids of a bigger vocabulary", _torch_fit_small_table, DataError,
     r"categorical feature 'C1': id (\d+) is outside embedding table 'C1' of cardinality \1 "),
    ("keras: id = cardinality, eager", _keras_ids([1, 20], [0, 0], False), DataError,
     _ID.format("C1", 20, "C1", 20, 20)),
    ("keras: negative id, compiled step", _keras_ids([1, 2], [0, -4], True), DataError,
     _ID.format("C2", -4, "C2", 7, 7)),
    ("torch: resume on a file rewritten in place", _torch_resume(True), DataError,
     r"checkpoint .*ck/checkpoint\.pt stopped inside epoch 1 \(after 3 batches\) of data that "
     r"has changed since: .*part_00000\.parquet was rewritten in place"),
    ("torch: resume on unchanged data", _torch_resume(False), None, None),
    ("torch: checkpoint_dir below a file", _checkpoint_dir("below a file", "torch"),
     CheckpointError, r"checkpoint_dir .*file/ck cannot be created: Not a directory\. Pass "
     r"another checkpoint_dir"),
    ("torch: checkpoint_dir is a file", _checkpoint_dir("a file", "torch"), CheckpointError,
     r"checkpoint_dir .*/file cannot be created: File exists\. Pass another checkpoint_dir"),
    ("keras: checkpoint_dir below a file", _checkpoint_dir("below a file", "keras"),
     CheckpointError, r"checkpoint_dir .*file/ck cannot be created: Not a directory"),
    ("cli: checkpoint dir below a file", _cli_checkpoint_below_a_file, CliFailed,
     r"checkpoint_dir .*file/ck cannot be created: Not a directory"),
]

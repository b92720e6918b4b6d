"""Training: list batches without a mask, checkpoints that do not belong to the model."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _corpus import CliFailed, cli

from tabstream.core.errors import DataError
from tabstream.core.schema import ColumnSchema, Schema, Tags


def _categorical(name: str, cardinality: int, is_list: bool = False) -> ColumnSchema:
    return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=is_list,
                        properties={"domain": {"min": 0, "max": cardinality - 1}})


def _schema() -> Schema:
    return Schema([
        _categorical("item", 20),
        _categorical("tags", 10, is_list=True),
        ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
        ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION]),
    ])


def _export(tmp, rows: int = 200):
    """A tiny export folder (one parquet file and its schema); ids include 0."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 4, rows)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    table = pa.table({
        "item": pa.array(rng.integers(0, 20, rows)),
        "tags": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 10, offsets[-1]))),
        "x": pa.array(rng.normal(size=rows).astype(np.float32)),
        "click": pa.array((rng.random(rows) < 0.3).astype(np.float32)),
    })
    path = tmp / "export"
    path.mkdir()
    pq.write_table(table, path / "part_0.parquet")
    _schema().to_json(str(path / "schema.json"))
    return path


def _torch_padded_without_mask(tmp):
    import torch

    from tabstream.train.torch import embedding_tables_from_schema

    tables = embedding_tables_from_schema(_schema(), dim=8)
    tables({"item": torch.tensor([0, 1]), "tags": torch.tensor([[3, 0], [0, 0]])})


def _torch_mask_of_another_shape(tmp):
    import torch

    from tabstream.train.torch import embedding_tables_from_schema

    tables = embedding_tables_from_schema(_schema(), dim=8)
    tables({"item": torch.tensor([0, 1]),
            "tags": (torch.tensor([[3, 0], [0, 0]]), torch.ones(2, 3, dtype=torch.bool))})


def _keras_padded_without_mask(tmp):
    import tensorflow as tf

    from tabstream.train.tensorflow import embedding_tables_from_schema

    tables = embedding_tables_from_schema(_schema(), dim=8)
    tables({"item": tf.constant([0, 1]), "tags": tf.constant([[3, 0], [0, 0]])})


def _cli_checkpoint_of_another_model(tmp):
    export = _export(tmp)
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet", "--batch-size", "64")
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet", "--model", "wide_and_deep")


def _cli_checkpoint_of_another_schema(tmp):
    export = _export(tmp)
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet", "--batch-size", "64")
    bigger = _schema().replace(_categorical("item", 50))
    bigger.to_json(str(export / "schema.json"))
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet")


def _cli_unreadable_checkpoint(tmp):
    export = _export(tmp)
    (tmp / "ck").mkdir()
    (tmp / "ck" / "checkpoint.pt").write_text("half a file")
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet")


def _fit_on_a_foreign_checkpoint(tmp):
    import torch

    from tabstream.train.torch import DLRM, fit

    (tmp / "ck").mkdir()
    torch.save({"state": torch.zeros(3)}, tmp / "ck" / "checkpoint.pt")
    model = DLRM(_schema(), embedding_dim=8)
    batch = ({"item": torch.tensor([0]), "tags": (torch.tensor([0]), torch.tensor([0, 1])),
              "x": torch.tensor([0.5])}, torch.tensor([1.0]))
    fit(model, [batch], torch.optim.SGD(model.parameters(), lr=0.1), checkpoint_dir=tmp / "ck",
        resume=True, progress=False)


CASES = [
    ("torch: padded list without a mask", _torch_padded_without_mask, ValueError,
     r"list feature 'tags' arrived as padded ids of shape \(2, 2\) without a mask; id 0 is a "
     r"real id.*'tags__mask'"),
    ("torch: mask of another shape", _torch_mask_of_another_shape, ValueError,
     r"list feature 'tags': padded ids \(2, 2\) and mask \(2, 3\) differ in shape"),
    ("keras: padded list without a mask", _keras_padded_without_mask, ValueError,
     r"list feature 'tags' arrived as padded ids of shape \(2, 2\) without a mask; id 0 is a "
     r"real id.*'tags__mask'"),
    ("cli: checkpoint of another model", _cli_checkpoint_of_another_model, CliFailed,
     r"SchemaError: checkpoint .*ck/checkpoint\.pt was written for a DLRM model, not WideAndDeep.*--no-resume"),
    ("cli: checkpoint of another schema", _cli_checkpoint_of_another_schema, CliFailed,
     r"SchemaError: checkpoint .*ck/checkpoint\.pt does not match this DLRM .*'[\w.]*item[\w.]*' "
     r"has shape \(20, \d+\) in the checkpoint, \(50, \d+\) in the model.*--no-resume"),
    ("cli: unreadable checkpoint", _cli_unreadable_checkpoint, CliFailed,
     r"DataError: cannot read checkpoint .*ck/checkpoint\.pt"),
    ("fit: foreign checkpoint", _fit_on_a_foreign_checkpoint, DataError,
     r"ck/checkpoint\.pt is not a tabstream checkpoint \(format None, expected "
     r"'tabstream\.train\.torch\.checkpoint/1'\)"),
]

"""Multi-hot loading: nested and fixed-length lists, online transforms, devices and
the multi-hot generator, as a user gets them wrong."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema
from tabstream.datasets import generate_data
from tabstream.loaders import Loader


def _export(tmp, table, schema=None):
    pq.write_table(table, tmp / "part_0.parquet")
    if schema is not None:
        schema.to_json(str(tmp / "_schema.json"))
        (tmp / "_manifest.json").write_text(json.dumps(
            {"num_rows": table.num_rows, "files": [{"path": "part_0.parquet",
                                                    "num_rows": table.num_rows}]}))
    return tmp


def _nested_pad_without_shape(tmp):
    t = pa.table({"n": pa.array([[[1], [2, 3]]], pa.list_(pa.list_(pa.int64())))})
    Loader(_export(tmp, t), 1, pad=True)


def _nested_pad_not_a_pair(tmp):
    t = pa.table({"n": pa.array([[[1], [2, 3]]], pa.list_(pa.list_(pa.int64())))})
    Loader(_export(tmp, t), 1, pad={"n": 4})


def _fixed_length_broken(tmp):
    t = pa.table({"v": pa.array([[1, 2], [3]], pa.list_(pa.int64()))})
    schema = Schema([ColumnSchema("v", "int64", is_list=True,
                                  properties={"value_count": {"min": 2, "max": 2}})])
    list(Loader(_export(tmp, t, schema), 2))


def _shape_wrong_rank(tmp):
    t = pa.table({"v": pa.array([[1, 2], [3, 4]], pa.list_(pa.int64()))})
    schema = Schema([ColumnSchema("v", "int64", is_list=True, properties={"shape": [2, 2]})])
    Loader(_export(tmp, t, schema), 2)


def _three_levels(tmp):
    t = pa.table({"d": pa.array([[[[1]]]], pa.list_(pa.list_(pa.list_(pa.int64()))))})
    Loader(_export(tmp, t), 1)


def _unfitted_transforms(tmp):
    t = pa.table({"c": ["a", "b"]})
    Loader(_export(tmp, t), 1, transforms=ts.Workflow(["c"] >> ops.Categorify()))


def _row_changing_transforms(tmp):
    t = pa.table({"x": [1.0, None]})
    path = _export(tmp, t)
    wf = ts.Workflow(["x"] >> ops.Dropna()).fit(ts.Dataset(str(path / "part_0.parquet")))
    Loader(str(path / "part_0.parquet"), 1, transforms=wf)


def _transforms_not_a_workflow(tmp):
    t = pa.table({"x": [1.0]})
    Loader(_export(tmp, t), 1, transforms=lambda table: table)


def _torch_unsupported_device(tmp):
    from tabstream.loaders.torch import Loader as TorchLoader

    TorchLoader(_export(tmp, pa.table({"x": [1.0]})), 1, device="meta")


def _multihot_option_for_criteo(tmp):
    generate_data("criteo", 3, nnz=3)


def _multihot_bad_layout(tmp):
    generate_data("multi-hot", 3, layout="wide")


CASES = [
    ("nested list pad=True without shape", _nested_pad_without_shape, ValueError,
     r"list column 'n' has no fixed-size list type to pad to; pass pad=\{'n': "),
    ("nested list pad length not a pair", _nested_pad_not_a_pair, TypeError,
     r"pad for the list-of-lists column 'n' must be a pair"),
    ("value_count min == max but ragged data", _fixed_length_broken, DataError,
     r"column 'v': the schema says every list holds 2 values .* list 1 of row group 0 of "
     r"'.*part_0\.parquet' holds 1"),
    ("schema shape of the wrong rank", _shape_wrong_rank, SchemaError,
     r"column 'v': the schema's shape \[2, 2\] does not fit its type"),
    ("list of lists of lists", _three_levels, TypeError,
     r"column 'd' has type .*lists of lists of numbers"),
    ("unfitted workflow as transforms", _unfitted_transforms, NotFittedError,
     r"the workflow given to the loader is not fitted"),
    ("row-changing workflow as transforms", _row_changing_transforms, ValueError,
     r"holds \['Dropna'\], which change the number of rows"),
    ("transforms not a Workflow", _transforms_not_a_workflow, TypeError,
     r"transforms must be a fitted tabstream.Workflow, got function"),
    ("torch loader on an unsupported device", _torch_unsupported_device, ValueError,
     r"device 'meta': the loader delivers to 'cpu' or 'cuda' devices"),
    ("multi-hot option for criteo", _multihot_option_for_criteo, TypeError,
     r"dataset 'criteo' takes no options \['nnz'\]"),
    ("multi-hot layout unknown", _multihot_bad_layout, ValueError,
     r"layout must be 'nested' or 'columns', got 'wide'"),
]

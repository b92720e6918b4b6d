"""Struct and map columns (and lists of them) are refused when a loader is made, by
both framework adapters, with one message naming the column, its type and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts

RECORDS = {
    "s": pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}, None]),
    "m": pa.array([[("k", 1)], [], None], type=pa.map_(pa.string(), pa.int64())),
    "ls": pa.array([[{"a": 1}], [], [{"a": 3}]]),
    "lm": pa.array([[[("k", 1)]], [], None], type=pa.list_(pa.map_(pa.string(), pa.int64()))),
}
# the kind of each column and the fix the message names
EXPECTED = {
    "s": ("struct", r"one column per field \('s\.a', 's\.b'"),
    "m": ("map", r"two list columns, its keys and its values"),
    "ls": ("struct", r"one column per field \('ls\.a'"),
    "lm": ("map", r"two list columns"),
}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> ts.Dataset:
    folder: Path = tmp_path_factory.mktemp("records")
    pq.write_table(pa.table({"x": [1.0, 2.0, 3.0], "label": [0, 1, 0], **RECORDS}),
                   folder / "part_0.parquet")
    return ts.Dataset(str(folder))


def _loader(framework: str):
    if framework == "torch":
        pytest.importorskip("torch")
        from tabstream.loaders.torch import Loader
    else:
        pytest.importorskip("tensorflow")
        from tabstream.loaders.tensorflow import Loader
    return Loader


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
@pytest.mark.parametrize("column", sorted(RECORDS))
def test_record_columns_refused_at_construction(dataset, framework, column):
    Loader = _loader(framework)
    kind, fix = EXPECTED[column]
    stored = dataset.arrow_schema.field(column).type  # as parquet gives it back
    typ = re.escape(str(stored))
    with pytest.raises(TypeError, match=rf"column '{column}' is a {kind} column \(type {typ}\): the loaders "
                                        rf"deliver numbers.*{fix}.*or leave it out with features=/labels="):
        Loader(dataset, batch_size=2, features=["x", column], labels=["label"], shuffle=True)


@pytest.mark.parametrize("framework", ["torch", "tensorflow"])
def test_left_out_record_columns_load(dataset, framework):
    # the fix the message gives works: the other columns load, values as stored
    Loader = _loader(framework)
    batches = list(Loader(dataset, batch_size=2, features=["x"], labels=["label"], shuffle=True))
    xs = [float(v) for features, _ in batches for v in list(features["x"].numpy().reshape(-1))]
    labels = [int(v) for _, label in batches for v in list(label.numpy().reshape(-1))]
    assert xs == [1.0, 2.0, 3.0]
    assert labels == [0, 1, 0]

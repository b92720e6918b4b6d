"""Categorical ids of a narrower or unsigned integer dtype (an export with
``ReduceDtypeSize`` or ``to_parquet(dtypes={"c": "uint16"})``, delivered by the
loaders as stored) look up the same rows as int64 ids, in torch and Keras; the
bundled models failed on them (torch's embedding kernels take int32/int64 only)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import tabstream as ts
from tabstream import ops
from tabstream.train.tables import TableConfig

DTYPES = ["int8", "uint8", "int16", "uint16", "int32", "uint32"]


def _configs():
    return [TableConfig("c", 40, 4, ("c",)), TableConfig("l", 30, 4, ("l",), is_list=True, combiner="sum")]


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_tables_take_any_integer_ids(dtype):
    from tabstream.train.torch import EmbeddingTables

    torch.manual_seed(0)
    tables = EmbeddingTables(_configs())
    ids = np.array([0, 39, 7, 7])
    values, offsets = np.array([1, 29, 3, 0, 5]), np.array([0, 2, 2, 4, 5])
    wide = tables({"c": torch.tensor(ids), "l": (torch.tensor(values), torch.tensor(offsets))})
    narrow = tables({"c": torch.from_numpy(ids.astype(dtype)),
                     "l": (torch.from_numpy(values.astype(dtype)), torch.tensor(offsets))})
    for name in ("c", "l"):
        torch.testing.assert_close(narrow[name], wide[name], rtol=0, atol=0)
    # the rows are the tables' own: a plain index into the weight
    torch.testing.assert_close(narrow["c"], tables["c"].weight[torch.tensor(ids)], rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_keras_tables_take_any_integer_ids(dtype):
    tf = pytest.importorskip("tensorflow")
    from tabstream.train.tensorflow import EmbeddingTables

    tables = EmbeddingTables(_configs())
    ids = np.array([0, 39, 7, 7])
    values, offsets = np.array([1, 29, 3, 0, 5]), np.array([0, 2, 2, 4, 5])
    wide = tables({"c": tf.constant(ids), "l__values": tf.constant(values), "l__offsets": tf.constant(offsets)})
    narrow = tables({"c": tf.constant(ids.astype(dtype)), "l__values": tf.constant(values.astype(dtype)),
                     "l__offsets": tf.constant(offsets)})
    for name in ("c", "l"):
        np.testing.assert_array_equal(narrow[name].numpy(), wide[name].numpy())
    weight = tables.tables["c"].embeddings.numpy()
    np.testing.assert_array_equal(narrow["c"].numpy(), weight[ids])


def test_a_reduced_export_trains_the_bundled_dlrm(tmp_path):
    """The docs' path: Categorify >> ReduceDtypeSize, exported, loaded, into DLRM."""
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import DLRM

    rng = np.random.default_rng(0)
    df = pd.DataFrame({"c": rng.choice(list("abcdefgh"), 200), "x": rng.normal(size=200),
                       "label": rng.integers(0, 2, 200)})
    wf = ts.Workflow((["c"] >> ops.Categorify() >> ops.ReduceDtypeSize()) + (["x"] >> ops.Normalize())
                     + (["label"] >> ops.AddTags(["target", "binary_classification"])))
    wf.fit(ts.Dataset(df))
    wf.transform(ts.Dataset(df)).to_parquet(str(tmp_path / "out"))
    schema = ts.Dataset(str(tmp_path / "out")).schema
    assert schema["c"].dtype == "int8"
    features, _ = next(iter(Loader(ts.Dataset(str(tmp_path / "out")), batch_size=50)))
    assert features["c"].dtype == torch.int8
    torch.manual_seed(0)
    model = DLRM(schema)
    got = model(features)
    expected = model({**features, "c": features["c"].to(torch.int64)})
    torch.testing.assert_close(got, expected, rtol=0, atol=0)

"""Serving export of the bundled Keras models: ``model.export(path)`` with no
``input_signature`` after training on the tabstream loader, and the documented
raw-DataFrame-to-scores example of docs/serving.md."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.loaders.tensorflow import Loader  # noqa: E402
from tabstream.train.tensorflow import DCN, DLRM, LazyAdam, TwoTower, WideAndDeep  # noqa: E402

pytestmark = pytest.mark.tensorflow
DOC = Path(__file__).resolve().parents[3] / "docs" / "serving.md"


def _raw(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"c1": rng.choice(list("abcdef"), n), "c2": rng.choice(list("xyz"), n),
                         "x": rng.normal(size=n).round(3), "label": rng.integers(0, 2, n)})


def _export(tmp_path: Path, seed: int = 0) -> tuple[ts.Workflow, str]:
    raw = _raw(400, seed)
    wf = ts.Workflow((["c1", "c2"] >> ops.Categorify()) + (["x"] >> ops.Normalize())
                     + (["label"] >> ops.AddTags(["target", "binary_classification"])))
    wf.fit(ts.Dataset(raw))
    wf.save(str(tmp_path / "wf"))
    wf.transform(ts.Dataset(raw)).to_parquet(str(tmp_path / "train"))
    return wf, str(tmp_path / "train")


def _trained(cls, train: str, **kwargs):
    loader = Loader(train, batch_size=100, shuffle=True, seed=0)
    model = cls(ts.Dataset(train).schema, seed=0, **kwargs)
    model.compile(optimizer=LazyAdam(1e-2), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    model.fit(loader, epochs=1, verbose=0, shuffle=False)
    return model, loader


def _same_spec(a, b) -> bool:
    return (tf.nest.map_structure(lambda s: (tuple(s.shape.as_list()), s.dtype), a)
            == tf.nest.map_structure(lambda s: (tuple(s.shape.as_list()), s.dtype), b))


def test_dlrm_trained_on_the_loader_exports_with_no_arguments(tmp_path):
    _, train = _export(tmp_path)
    model, loader = _trained(DLRM, train, embedding_dim=8)
    assert _same_spec(model.input_signature(), loader.element_spec[0])
    model.export(str(tmp_path / "model"))
    served = tf.saved_model.load(str(tmp_path / "model"))
    assert _same_spec(served.serve.input_signature[0], loader.element_spec[0])
    features, _ = next(iter(Loader(train, batch_size=37, shuffle=False)))
    np.testing.assert_allclose(served.serve(features).numpy(), model(features).numpy(),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("cls", [DCN, WideAndDeep])
def test_other_ranking_models_export(tmp_path, cls):
    _, train = _export(tmp_path, seed=1)
    model, _ = _trained(cls, train, embedding_dim=8)
    model.export(str(tmp_path / "model"))
    served = tf.saved_model.load(str(tmp_path / "model"))
    features, _ = next(iter(Loader(train, batch_size=50, shuffle=False)))
    np.testing.assert_allclose(served.serve(features).numpy(), model(features).numpy(),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.slow
def test_untrained_model_exports_the_schema_signature(tmp_path):
    schema = ts.Schema([ts.ColumnSchema("u", "int64", ["categorical", "user_id"],
                                        {"domain": {"min": 0, "max": 9}}),
                        ts.ColumnSchema("i", "int64", ["categorical", "item_id"],
                                        {"domain": {"min": 0, "max": 19}})])
    model = TwoTower(schema, tower=(8,), seed=0)
    model(model.example_batch())
    assert _same_spec(model.input_signature(), {"u": tf.TensorSpec([None], tf.int64),
                                                "i": tf.TensorSpec([None], tf.int64)})
    model.export(str(tmp_path / "model"))
    served = tf.saved_model.load(str(tmp_path / "model"))
    batch = {"u": tf.constant([1, 2, 3], tf.int64), "i": tf.constant([4, 5, 6], tf.int64)}
    expected, got = model(batch), served.serve(batch)
    for key in expected:
        np.testing.assert_allclose(got[key].numpy(), expected[key].numpy(), rtol=1e-6, atol=1e-6)


def _doc_example() -> str:
    text = DOC.read_text()
    block = text.split("<!-- serving-example", 1)[1]
    return re.search(r"```python\n(.*?)```", block, re.S).group(1)


def test_documented_raw_rows_to_scores_example(tmp_path, monkeypatch):
    code = _doc_example()
    assert len([ln for ln in code.splitlines() if ln.strip()]) <= 10
    wf, train = _export(tmp_path)
    model, _ = _trained(DLRM, train, embedding_dim=8)
    model.export(str(tmp_path / "model"), verbose=False)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, str(DOC), "exec"), scope)  # the snippet as a user runs it
    raw = scope["raw"]
    # the same rows, a second way: the in-memory workflow and Keras model
    features = wf.transform(raw)
    inputs = {"c1": tf.constant(features["c1"].to_numpy(), tf.int64),
              "c2": tf.constant(features["c2"].to_numpy(), tf.int64),
              "x": tf.constant(features["x"].to_numpy(), tf.float32)}
    expected = tf.sigmoid(model(inputs)).numpy()
    np.testing.assert_allclose(scope["scores"], expected, rtol=1e-6, atol=1e-7)
    assert features["c1"].iloc[1] == 2  # "never-seen" gets the out-of-vocabulary id
    assert os.path.isdir(tmp_path / "wf")

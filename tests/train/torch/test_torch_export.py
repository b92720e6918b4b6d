"""``torch.export`` of the bundled models, with a dynamic batch dimension, as
docs/serving.md shows: the exported program scores any batch size exactly as the
eager model does, also after a save/load round trip."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")

import tabstream as ts  # noqa: E402
from tabstream import ops  # noqa: E402
from tabstream.loaders.torch import Loader  # noqa: E402
from tabstream.train.torch import DCN, DLRM, TwoTower, WideAndDeep  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    rng = np.random.default_rng(0)
    n = 300
    raw = pd.DataFrame({"user": rng.choice(list("abcdefg"), n), "item": rng.choice(list("pqrstuvw"), n),
                        "x": rng.normal(size=n), "label": rng.integers(0, 2, n)})
    wf = ts.Workflow((["user"] >> ops.Categorify() >> ops.AddTags(["user_id"]))
                     + (["item"] >> ops.Categorify() >> ops.AddTags(["item_id"]))
                     + (["x"] >> ops.Normalize())
                     + (["label"] >> ops.AddTags(["target", "binary_classification"])))
    out = tmp_path_factory.mktemp("export") / "train"
    wf.fit_transform(ts.Dataset(raw)).to_parquet(str(out))
    return str(out)


def _batches(path: str, sizes: tuple[int, ...]):
    loader = Loader(ts.Dataset(path), batch_size=max(sizes), shuffle=False)
    features, _ = next(iter(loader))
    return [{k: v[:size] for k, v in features.items()} for size in sizes]


@pytest.mark.parametrize("cls", [DLRM, DCN, WideAndDeep, TwoTower])
def test_torch_export_scores_any_batch_like_the_eager_model(export_dir, cls, tmp_path):
    from torch.export import Dim, export

    torch.manual_seed(0)
    schema = ts.Dataset(export_dir).schema
    model = cls(schema).eval()
    trace_batch, other_batch = _batches(export_dir, (64, 23))
    batch = Dim("batch")
    program = export(model, (trace_batch,),
                     dynamic_shapes=({name: {0: batch} for name in trace_batch},))
    torch.export.save(program, str(tmp_path / "model.pt2"))
    loaded = torch.export.load(str(tmp_path / "model.pt2")).module()
    with torch.no_grad():
        for features in (trace_batch, other_batch):
            expected = model(features)
            torch.testing.assert_close(program.module()(features), expected, rtol=0, atol=0)
            torch.testing.assert_close(loaded(features), expected, rtol=0, atol=0)
    assert other_batch["x"].shape[0] == 23

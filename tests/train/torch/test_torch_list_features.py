"""List-ness is a property of each feature: a single-hot column and a list column
sharing one table (one vocabulary) both parse; and CachedEmbeddings serves per-id
(``combiner=None``) tables. Expected values come from plain gathers on the weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import ParameterServer, table_configs_from_schema
from tabstream.train.tables import TableConfig
from tabstream.train.torch import DLRM, CachedEmbeddings, EmbeddingTables


def shared_schema():
    def cat(name, is_list=False):
        return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=is_list,
                            properties={"domain": {"min": 0, "max": 9, "name": "genre"}})
    return Schema([cat("genre"), cat("genres", is_list=True),
                   ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


LISTS = (torch.tensor([1, 2, 3]), torch.tensor([0, 2, 3]))  # rows [1, 2] and [3]


@pytest.mark.parametrize("where", ["memory", "cached"])
@pytest.mark.parametrize("shape", [(2,), (2, 1)])
def test_single_hot_and_list_feature_share_a_table(tmp_path, where, shape):
    configs = table_configs_from_schema(shared_schema().without(["click"]), dim=4)
    assert [(c.feature_names, c.list_features) for c in configs] == [(("genre", "genres"), ("genres",))]
    if where == "memory":
        module = EmbeddingTables(configs)
        weight = module["genre"].weight.detach().numpy()
    else:
        ps = ParameterServer(tmp_path / "ps", configs)
        module = CachedEmbeddings(ps, 4)
        weight = ps.lookup("genre", np.arange(10))
    out = module({"genre": torch.tensor([4, 5]).reshape(shape), "genres": LISTS})
    np.testing.assert_allclose(out["genre"].detach().numpy(), weight[[4, 5]], rtol=1e-6)
    np.testing.assert_allclose(out["genres"].detach().numpy(),
                               np.stack([weight[1] + weight[2], weight[3]]), rtol=1e-6)
    with pytest.raises(ValueError, match="not a list column"):
        module({"genre": torch.tensor([[4, 5], [5, 6]]), "genres": LISTS})


def test_dlrm_over_a_cache_of_a_shared_table(tmp_path):
    schema = shared_schema()
    ps = ParameterServer(tmp_path / "ps", table_configs_from_schema(schema.without(["click"]), dim=4))
    model = DLRM(schema, embedding_dim=4, embeddings=CachedEmbeddings(ps, 8))
    out = model({"genre": torch.tensor([4, 5]), "genres": LISTS, "I1": torch.tensor([0.1, 0.2])})
    assert out.shape == (2,)


def _per_id_batch(layout):
    # "S" single-hot, "L" lists [1, 2], [], [2, 5, 1] in the same table
    s = torch.tensor([2, 7, 1])
    if layout == "ragged":  # an arrow slice: ids 8 before and after are not in it
        lists = (torch.tensor([8, 1, 2, 2, 5, 1, 8]), torch.tensor([1, 3, 3, 6]))
    else:
        lists = (torch.tensor([[1, 2, 8], [8, 8, 8], [2, 5, 1]]),
                 torch.tensor([[1, 1, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool))
    return {"S": s, "L": lists}


@pytest.mark.parametrize("layout", ["ragged", "padded"])
def test_cached_per_id_table_gives_rows_per_id_and_trains_the_server(tmp_path, layout):
    cfg = TableConfig("T", 9, 2, ("S", "L"), True, None, ("L",))
    lr, eps = 0.1, 0.5
    ps = ParameterServer(tmp_path / "ps", [cfg], optimizer="adagrad", lr=lr, eps=eps)
    w = ps.lookup("T", np.arange(9))
    emb = CachedEmbeddings(ps, 3)  # fewer rows than the batch's distinct ids
    out = emb(_per_id_batch(layout))
    vectors, mask = out["L"]
    want_ids = [[1, 2, 0], [0, 0, 0], [2, 5, 1]]
    want_mask = np.array([[1, 1, 0], [0, 0, 0], [1, 1, 1]], bool)
    want = np.where(want_mask[..., None], w[want_ids], 0)
    assert mask.dtype == torch.bool and np.array_equal(mask.numpy(), want_mask)
    np.testing.assert_allclose(vectors.detach().numpy(), want, rtol=1e-6)
    np.testing.assert_allclose(out["S"].detach().numpy(), w[[2, 7, 1]], rtol=1e-6)

    # the same values as the in-memory tables with combiner=None
    mem = EmbeddingTables([cfg])
    with torch.no_grad():
        mem["T"].weight.copy_(torch.from_numpy(w))
    mv, mm = mem(_per_id_batch(layout))["L"]
    assert torch.equal(mm, mask) and torch.allclose(mv, vectors)

    # one step: the gradient of each row, summed by hand, goes through adagrad
    coef_l = np.array([[0.5, -1.0, 3.0], [2.0, 0.3, 1.0], [-0.7, 0.2, 1.5]],
                      np.float32)[:, :, None] * np.array([1.0, 2.0], np.float32)  # (B, L, dim)
    coef_s = np.array([[1.0, 0.5], [-2.0, 1.5], [0.25, -0.5]], np.float32)
    loss = (vectors * torch.from_numpy(coef_l)).sum() + (out["S"] * torch.from_numpy(coef_s)).sum()
    loss.backward()
    grad = np.zeros_like(w)
    for b, row in enumerate(want_ids):
        for j, i in enumerate(row):
            if want_mask[b, j]:
                grad[i] += coef_l[b, j]
    for b, i in enumerate([2, 7, 1]):
        grad[i] += coef_s[b]
    touched = sorted({1, 2, 5, 7})
    step = w - lr * grad / (np.sqrt(grad * grad) + eps)
    np.testing.assert_allclose(ps.lookup("T", touched), step[touched], rtol=1e-5, atol=1e-6)
    assert ps.touched("T").tolist() == touched  # ids outside the slice are not updated

"""HybridParallel(model, plan=<strategy name>) in PyTorch: plan="auto" once failed
with "dictionary update sequence element #0 has length 1" (the name was read as a
dict of overrides)."""

from __future__ import annotations

import pytest
import torch
from torch_data import categorical, continuous, target

from tabstream.core.schema import Schema
from tabstream.train.sharding import plan_sharding as shared_planner
from tabstream.train.torch import DLRM
from tabstream.train.torch.distributed import HybridParallel, plan_sharding


def _model():
    torch.manual_seed(0)
    return DLRM(Schema([categorical("a", 40), categorical("b", 9), continuous("x"), target()]),
                embedding_dim=8)


@pytest.mark.parametrize("name", ["auto", "table_wise", "row_wise", "column_wise",
                                  "data_parallel"])
def test_a_strategy_name_is_a_plan(one_rank, name):
    hp = HybridParallel(_model(), plan=name)
    assert dict(hp.plan) == dict(plan_sharding(_model(), 1, strategy=name))
    if name != "auto":
        assert dict(hp.plan) == {"a": name, "b": name}
    features = {"a": torch.tensor([1, 39, 7]), "b": torch.tensor([0, 8, 3]),
                "x": torch.tensor([0.5, -1.0, 2.0])}
    torch.testing.assert_close(hp(features), _model()(features), rtol=0, atol=1e-6)


def test_the_planner_is_shared(one_rank):
    assert plan_sharding is shared_planner
    with pytest.raises(ValueError, match="plan='by_rows' is not a strategy"):
        HybridParallel(_model(), plan="by_rows")

"""HybridParallel checks its plan against the model at construction: a ready
ShardingPlan made for other table sizes, and two embedding modules with one table
name (a plan keys tables by name), are refused with errors naming them, instead of
ranks failing or hanging in the exchange later. One process (a 1-rank gloo group)
and two ranks."""

from __future__ import annotations

import json
import re

import pytest
import torch
from dist_helpers import launch
from plan_checks_worker import TOWER_BATCH, WORKER_FILE, OneTable, TwoTowers

from tabstream.train.sharding import plan_sharding
from tabstream.train.tables import TableConfig
from tabstream.train.torch.distributed import HybridParallel

MISMATCH = (r"HybridParallel: table 'T' is 8 x 4 \(rows x dim\) in the plan but 12 x 4 in the "
            r"model; plan with plan_sharding\(model, world_size={w}\) for this model")
TOWERS = (r"HybridParallel: table 'cat' is in two embedding modules, 'a' and 'b' \(10 x 4 and "
          r"10 x 6\); a sharding plan keys tables by name")




@pytest.mark.parametrize("kind", ["row_wise", "column_wise", "table_wise"])
def test_one_rank_refuses_a_plan_for_other_table_sizes(one_rank, kind):
    small = plan_sharding([TableConfig("T", 8, 4, ("a",))], 1, strategy=kind)
    with pytest.raises(ValueError, match=MISMATCH.format(w=1)):
        HybridParallel(OneTable(), plan=small)
    narrow = plan_sharding([TableConfig("T", 12, 2, ("a",))], 1, strategy=kind)
    with pytest.raises(ValueError, match=r"table 'T' is 12 x 2 \(rows x dim\) in the plan but "
                       r"12 x 4 in the model"):
        HybridParallel(OneTable(), plan=narrow)


@pytest.mark.parametrize("kind", ["row_wise", "column_wise", "table_wise"])
def test_one_rank_accepts_a_plan_made_for_the_model(one_rank, kind):
    plan = plan_sharding([TableConfig("T", 12, 4, ("a",))], 1, strategy=kind)
    hp = HybridParallel(OneTable(), plan=plan)
    ids = {"a": torch.tensor([0, 5, 11, 7])}
    torch.testing.assert_close(hp(ids), OneTable()(ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize("plan", [{"cat": "column_wise"}, {"cat": "row_wise"}, "table_wise",
                                  None, "ready"])
def test_one_rank_refuses_two_modules_with_one_table_name(one_rank, plan):
    if plan == "ready":
        plan = plan_sharding([TableConfig("cat", 10, 6, ("b_cat",))], 1)
    with pytest.raises(ValueError, match=TOWERS):
        HybridParallel(TwoTowers(), plan=plan)


def test_one_rank_two_modules_with_their_own_names_match_one_process(one_rank):
    names = ("cat_a", "cat_b")
    hp = HybridParallel(TwoTowers(names), plan={"cat_a": "column_wise", "cat_b": "row_wise"})
    torch.testing.assert_close(hp(TOWER_BATCH), TwoTowers(names)(TOWER_BATCH), rtol=0, atol=1e-6)
    state, plain = hp.full_state_dict(), TwoTowers(names).state_dict()
    assert {k: tuple(v.shape) for k, v in state.items()} == \
        {k: tuple(v.shape) for k, v in plain.items()}


@pytest.mark.slow
def test_two_ranks_refuse_at_construction_alike(tmp_path):
    outputs = launch(2, "plan_checks", tmp_path, worker=WORKER_FILE, timeout=180)
    for stdout, _ in outputs:
        out = json.loads(stdout.strip().splitlines()[-1])
        assert out["mismatch"][0] == "ValueError", out
        assert re.search(MISMATCH.format(w=2), out["mismatch"][1]), out
        for kind, error in out["towers"].items():
            assert error is not None and error[0] == "ValueError", (kind, out)
            assert re.search(TOWERS, error[1]), (kind, out)
        assert out["fits_diff"] < 1e-6 and out["renamed_diff"] < 1e-6, out

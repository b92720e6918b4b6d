"""plan_sharding (no processes needed) and HybridParallel in one process (a
1-rank gloo group): batch layouts, full_state_dict and clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch_data import categorical, continuous, target

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import Schema
from tabstream.train import TableConfig
from tabstream.train.torch import DLRM
from tabstream.train.torch.distributed import HybridParallel, plan_sharding


def _configs(sizes):
    return [TableConfig(name, rows, dim, (name,)) for name, (rows, dim) in sizes.items()]


SIZES = {"big": (1_000_000, 16), "mid1": (200_000, 16), "mid2": (150_000, 16),
         "mid3": (120_000, 8), "tiny": (100, 8), "tiny2": (500, 16)}


def _bytes(rows, dim, slots=2):
    return rows * dim * 4 * (1 + slots)


def _rank_bytes_by_hand(plan, world):
    """Per-rank bytes recomputed from the placements with numpy."""
    out = np.zeros(world, dtype=np.int64)
    for name, place in plan.placements.items():
        rows, dim = SIZES[name]
        if place.kind == "table_wise":
            out[place.owner] += _bytes(rows, dim)
        elif place.kind == "row_wise":
            out += np.array([_bytes(b - a, dim) for a, b in place.ranges])
        elif place.kind == "column_wise":
            out += np.array([_bytes(rows, b - a) for a, b in place.ranges])
    return out.tolist()


@pytest.mark.parametrize("world", [2, 3, 4, 17])
def test_auto_plan_replicates_small_splits_big_balances_rest(world):
    plan = plan_sharding(_configs(SIZES), world_size=world)
    total = sum(_bytes(*SIZES[n]) for n in SIZES if _bytes(*SIZES[n]) >= 1 << 20)
    for name, (rows, dim) in SIZES.items():
        b = _bytes(rows, dim)
        if b < 1 << 20:
            assert plan[name] == "data_parallel", name
        elif b > total / world:
            assert plan[name] == ("column_wise" if dim >= world else "row_wise"), name
        else:
            assert plan[name] == "table_wise", name
    assert plan.rank_bytes() == _rank_bytes_by_hand(plan, world)
    assert plan.replicated_bytes() == _bytes(100, 8) + _bytes(500, 16)
    # greedy largest-first placement: no rank exceeds another by more than one table
    whole = [_bytes(*SIZES[n]) for n in SIZES if plan[n] == "table_wise"]
    loads = plan.rank_bytes()
    assert max(loads) - min(loads) <= max(whole)
    # row (or column) ranges tile the table, sizes differing by one at most
    ranges = plan.placements["big"].ranges
    assert ranges[0][0] == 0 and ranges[-1][1] == (1_000_000 if world > 16 else 16)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1
    text = str(plan)
    for k, b in enumerate(loads):
        assert f"rank {k}: {b:,} bytes" in text
    assert plan["big"] in text and "replicated" in text


def test_strategy_and_overrides():
    plan = plan_sharding(_configs(SIZES), 3, strategy="column_wise", overrides={"tiny": "table_wise"})
    assert plan["tiny"] == "table_wise"
    for name in set(SIZES) - {"tiny"}:
        ranges = plan.placements[name].ranges
        assert plan[name] == "column_wise"
        assert [b - a for a, b in ranges] == [len(x) for x in np.array_split(np.arange(SIZES[name][1]), 3)]
    assert dict(plan) == {**{n: "column_wise" for n in SIZES}, "tiny": "table_wise"}
    assert plan.rank_bytes() == _rank_bytes_by_hand(plan, 3)


@pytest.mark.parametrize("kwargs, error, match", [
    ({"world_size": 0}, ValueError, "world_size must be >= 1, got 0"),
    ({"world_size": 2.0}, TypeError, "world_size must be an int, got 2.0"),
    ({"world_size": 2, "strategy": "diagonal"}, ValueError, "strategy must be one of .*'diagonal'"),
    ({"world_size": 2, "overrides": {"C9": "row_wise"}}, ValueError,
     "names table 'C9', which the model does not have; its tables are"),
    ({"world_size": 2, "overrides": {"tiny": "rows"}}, ValueError,
     "table 'tiny': sharding type must be one of .*got 'rows'"),
    ({"world_size": 200, "overrides": {"tiny": "row_wise"}}, ValueError,
     "table 'tiny' has 100 rows, fewer than 200 ranks: it cannot be row_wise"),
])
def test_plan_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        plan_sharding(_configs(SIZES), **kwargs)


def test_plan_refuses_other_things():
    with pytest.raises(TypeError, match="takes a model, an EmbeddingTables or TableConfigs, got int"):
        plan_sharding([1, 2], 2)
    with pytest.raises(ValueError, match="Linear has no EmbeddingTables module"):
        plan_sharding(torch.nn.Linear(2, 2), 2)


def test_hybrid_parallel_needs_a_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="needs torch.distributed: call .*init_process_group"):
        HybridParallel(torch.nn.Linear(2, 2))


# ---------------------------------------------------------------- one rank, in process




def _schema():
    return Schema([categorical("a", 40), categorical("b", 9), categorical("tags", 30, is_list=True),
                   continuous("x"), target()])


def _layouts():
    rng = np.random.default_rng(4)
    a = torch.as_tensor(rng.integers(0, 40, 6))
    b = torch.as_tensor(rng.integers(0, 9, 6))
    lengths = rng.integers(0, 4, 6)
    values = torch.as_tensor(rng.integers(0, 30, int(lengths.sum())))
    offsets = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]))
    padded = torch.zeros(6, 3, dtype=torch.long)
    mask = torch.arange(3)[None, :] < torch.as_tensor(lengths)[:, None]
    padded[mask] = values
    x = torch.as_tensor(rng.normal(size=6), dtype=torch.float32)
    return [
        {"a": a, "b": b, "tags": (values, offsets), "x": x},
        {"a": a[:, None], "b": b, "tags": (padded, mask), "x": x},
        {"a": a, "b": b[:, None], "tags": padded, "tags__mask": mask, "x": x},
        {"a": a, "b": b, "tags__values": values, "tags__offsets": offsets, "x": x},
    ]


@pytest.mark.parametrize("kind", ["table_wise", "row_wise", "column_wise", "data_parallel"])
def test_one_rank_matches_the_plain_model(one_rank, kind):
    torch.manual_seed(0)
    plain = DLRM(_schema(), embedding_dim=8, combiner="mean")
    torch.manual_seed(0)
    hp = HybridParallel(DLRM(_schema(), embedding_dim=8, combiner="mean"),
                        plan={t: kind for t in ("a", "b", "tags")})
    for features in _layouts():
        torch.testing.assert_close(hp(features), plain(features), rtol=0, atol=1e-6)
    state = hp.full_state_dict()
    assert list(state) == list(plain.state_dict())
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=0)


def test_one_rank_errors(one_rank):
    torch.manual_seed(0)
    hp = HybridParallel(DLRM(_schema(), embedding_dim=8), plan={"a": "row_wise"})
    features = _layouts()[0]
    with pytest.raises(DataError, match="feature 'a': id 40 is outside table 'a' "
                       r"\(expected 0 <= id < 40\)"):
        hp({**features, "a": torch.tensor([1, 40, 2, 3, 4, 5])})
    with pytest.raises(DataError, match="feature 'a': id -1 is outside"):
        hp({**features, "a": torch.tensor([1, -1, 2, 3, 4, 5])})
    with pytest.raises(SchemaError, match="categorical feature 'a' .* is missing from the batch"):
        hp({k: v for k, v in features.items() if k != "a"})
    # a (B, 2) batch of a single-hot column: refused as by the replicated tables
    with pytest.raises(ValueError, match=r"feature 'a' is not a list column in the schema but "
                       r"arrived with shape \(6, 2\); expected \(B,\) or \(B, 1\)"):
        torch.manual_seed(0)
        HybridParallel(DLRM(_schema(), embedding_dim=8), plan={"a": "row_wise"})(
            {**features, "a": torch.zeros(6, 2, dtype=torch.long)})
    with pytest.raises(TypeError, match="feature 'a': expected an int64 tensor or a"):
        hp({**features, "a": [1, 2]})
    with pytest.raises(ValueError, match="the plan is for 3 ranks, but the process group has 1"):
        HybridParallel(DLRM(_schema(), embedding_dim=8),
                       plan=plan_sharding(DLRM(_schema(), embedding_dim=8), 3))


def _batches(n_batches=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        features = _layouts()[0]
        features = {**features, "a": torch.as_tensor(rng.integers(0, 40, 6)),
                    "x": torch.as_tensor(rng.normal(size=6), dtype=torch.float32)}
        out.append((features, torch.as_tensor(rng.integers(0, 2, 6), dtype=torch.float32)))
    return out


def test_one_rank_fit_sharded_checkpoint_and_resume(one_rank, tmp_path):
    from tabstream.train.torch import LazyAdam, fit
    from tabstream.train.torch.fit import checkpoint_position

    def make(seed):
        torch.manual_seed(seed)
        hp = HybridParallel(DLRM(_schema(), embedding_dim=8, sparse=True),
                            plan={"a": "row_wise", "b": "column_wise", "tags": "table_wise"})
        return hp, LazyAdam(hp.parameters(), lr=0.05)

    data = _batches()
    hp, opt = make(0)
    straight = fit(hp, data, opt, epochs=2, progress=False)
    expected = hp.full_state_dict()
    hp, opt = make(0)
    fit(hp, data, opt, epochs=1, checkpoint_dir=tmp_path, progress=False)
    assert checkpoint_position(tmp_path) == (1, 0)
    assert (tmp_path / "checkpoint.dcp.json").exists() and not (tmp_path / "checkpoint.pt").exists()
    hp, opt = make(5)  # other weights: only the checkpoint makes the result match
    resumed = fit(hp, data, opt, epochs=2, checkpoint_dir=tmp_path, resume=True, progress=False)
    assert resumed["loss"] == pytest.approx(straight["loss"], abs=1e-6)
    for key, value in expected.items():
        torch.testing.assert_close(hp.full_state_dict()[key], value, rtol=0, atol=1e-6)


def test_one_rank_refuses_a_whole_model_checkpoint(one_rank, tmp_path):
    from tabstream.train.torch import LazyAdam, fit

    torch.manual_seed(0)
    plain = DLRM(_schema(), embedding_dim=8)
    fit(plain, _batches(1), LazyAdam(plain.parameters()), checkpoint_dir=tmp_path, progress=False)
    hp = HybridParallel(DLRM(_schema(), embedding_dim=8), plan={"a": "row_wise"})
    with pytest.raises(SchemaError, match="checkpoint.pt holds a whole-model checkpoint, but a "
                       "HybridParallel model resumes from a sharded one"):
        fit(hp, _batches(1), LazyAdam(hp.parameters()), checkpoint_dir=tmp_path, resume=True,
            progress=False)


def test_one_rank_two_tower_trains_its_own_objective(one_rank):
    """fit uses the wrapped model's compute_loss (in-batch softmax), through DDP."""
    from tabstream.core.schema import Tags
    from tabstream.train.torch import LazyAdam, TwoTower, fit

    schema = Schema([categorical("user", 30, tags=[Tags.USER, Tags.USER_ID]),
                     categorical("item", 25, tags=[Tags.ITEM, Tags.ITEM_ID]), target()])
    rng = np.random.default_rng(2)
    data = [({"user": torch.as_tensor(rng.integers(0, 30, 8)),
              "item": torch.as_tensor(rng.integers(0, 25, 8))},
             torch.as_tensor(rng.integers(0, 2, 8), dtype=torch.float32)) for _ in range(3)]

    def make():
        torch.manual_seed(0)
        return TwoTower(schema, query_tower=(8,), item_tower=(8,), output_dim=8)

    plain = make()
    expected = fit(plain, data, LazyAdam(plain.parameters(), lr=0.05), epochs=1, progress=False)
    hp = HybridParallel(make(), plan={"user": "row_wise", "item": "column_wise"})
    assert callable(hp.compute_loss)
    got = fit(hp, data, LazyAdam(hp.parameters(), lr=0.05), epochs=1, progress=False)
    assert got["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    state = hp.full_state_dict()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-6)
    # a model without compute_loss gets none: fit then scores logits with BCE
    assert not hasattr(HybridParallel(DLRM(_schema(), embedding_dim=8)), "compute_loss")

"""Optimizer state after an offline ``reshard`` to 1 rank, for an optimizer whose
parameters are not in ``named_parameters`` order (tables listed C2, C1, C4, C3:
C1/C2 have the same shape, C3/C4 not). The expected slots and weights come from
the same optimizer trained on the plain model in one process, without
HybridParallel or a checkpoint. In the "mixed" plan C3 is data-parallel, which
HybridParallel's own parameter order puts first."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_helpers import free_port

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train.torch import DLRM, LazyAdam, MultiOptimizer, fit
from tabstream.train.torch.distributed import HybridParallel, reshard

SIZES = {"C1": 8, "C2": 8, "C3": 5, "C4": 6}
TRAINED = ["C2", "C1", "C4", "C3"]      # the order of the tables in the training run
RESUMED = ["C4", "C3", "C2", "C1"]      # another order, in the run that resumes
PLANS = {"table_wise": dict.fromkeys(SIZES, "table_wise"),
         "mixed": {"C1": "row_wise", "C2": "column_wise", "C3": "data_parallel",
                   "C4": "table_wise"}}
STOP = 3


def _schema() -> Schema:
    cats = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                         properties={"domain": {"min": 0, "max": k - 1}})
            for n, k in SIZES.items()]
    return Schema([*cats, ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def _batches() -> list[tuple[dict, torch.Tensor]]:
    rng = np.random.default_rng(0)
    out = []
    for _ in range(STOP * 2):
        features = {n: torch.as_tensor(rng.integers(0, k, 6)) for n, k in SIZES.items()}
        features["I1"] = torch.as_tensor(rng.normal(size=6), dtype=torch.float32)
        out.append((features, torch.as_tensor(rng.integers(0, 2, 6), dtype=torch.float32)))
    return out


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return DLRM(_schema(), embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), sparse=True)


def _optimizer(kind: str, model: torch.nn.Module, order: list[str]):
    """LazyAdam with the tables (in ``order``) as group 0 and the rest as group 1,
    or a MultiOptimizer whose LazyAdam holds the tables in ``order``."""
    named = dict(model.named_parameters())
    tables = [next(p for n, p in named.items() if n.endswith(f".{t}.weight")) for t in order]
    if kind == "multi":
        return MultiOptimizer(partial(torch.optim.Adam, lr=0.01),
                              [(partial(LazyAdam, lr=0.05), tables)], model=model)
    rest = [p for p in named.values() if all(p is not t for t in tables)]
    return LazyAdam([{"params": tables}, {"params": rest}], lr=0.05)


def _slots(kind: str, opt, model: torch.nn.Module) -> dict[tuple[str, str], torch.Tensor]:
    """{(parameter name, slot): value} of the LazyAdam holding the tables."""
    lazy = opt.optimizers["0"] if kind == "multi" else opt
    return {(n, s): torch.as_tensor(v).clone() for n, p in model.named_parameters()
            for s, v in lazy.state.get(p, {}).items()}


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{(kind, plan): sharded checkpoint dir of a 1-rank HybridParallel run (tables
    in TRAINED order)}."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    out = {}
    try:
        for kind in ("lazyadam", "multi"):
            for plan, placements in PLANS.items():
                ck = tmp_path_factory.mktemp(f"ck-{kind}-{plan}")
                hp = HybridParallel(_model(), plan=placements)
                fit(hp, _batches()[:STOP], _optimizer(kind, hp, TRAINED), checkpoint_dir=ck,
                    progress=False)
                out[(kind, plan)] = ck
    finally:
        dist.destroy_process_group()
    return out


@pytest.mark.parametrize("plan", list(PLANS))
@pytest.mark.parametrize("kind", ["lazyadam", "multi"])
def test_reshard_to_one_rank_loads_each_slot_onto_its_parameter(sources, tmp_path, kind, plan):
    ref = _model()
    ref_opt = _optimizer(kind, ref, TRAINED)
    fit(ref, _batches()[:STOP], ref_opt, progress=False)
    want = _slots(kind, ref_opt, ref)
    assert not torch.equal(want[("inputs.embeddings.C1.weight", "exp_avg")],
                           want[("inputs.embeddings.C2.weight", "exp_avg")])
    saved = torch.load(reshard(sources[(kind, plan)], tmp_path / "one", 1), weights_only=True)
    plain = _model(seed=5)
    plain.load_state_dict(saved["model"])
    opt = _optimizer(kind, plain, TRAINED)      # built as the training run built it
    opt.load_state_dict(saved["optimizer"])
    got = _slots(kind, opt, plain)
    assert set(got) == set(want)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-6, msg=str(key))


@pytest.mark.parametrize("via", [1, 2])
@pytest.mark.parametrize("kind", ["lazyadam", "multi"])
def test_resume_after_reshard_matches_slots_by_name(sources, tmp_path, kind, via):
    """``fit(resume=True)`` with the tables listed in another order than in training
    and in the model still gives each parameter its own slots; ``via=2``: through a
    2-rank checkpoint whose ranks each hold two of the tables."""
    batches = _batches()
    ref = _model()
    ref_opt = _optimizer(kind, ref, TRAINED)
    fit(ref, batches[:STOP], ref_opt, progress=False)
    fit(ref, batches[STOP:], ref_opt, progress=False)
    src = sources[(kind, "table_wise")]
    if via == 2:
        reshard(src, tmp_path / "two", 2, plan="table_wise")
        src = tmp_path / "two"
    reshard(src, tmp_path / "one", 1)
    plain = _model(seed=5)                      # the checkpoint decides
    opt = _optimizer(kind, plain, RESUMED)
    fit(plain, batches[STOP:], opt, epochs=2, checkpoint_dir=tmp_path / "one", resume=True,
        progress=False)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[key], value, rtol=0, atol=1e-5, msg=key)
    got, want = _slots(kind, opt, plain), _slots(kind, ref_opt, ref)
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-5, msg=str(key))

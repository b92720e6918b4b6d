"""Resharding with real ranks (gloo on 127.0.0.1): each case trains STOP global batches
through ``fit`` on 2 ranks and is stopped, then resumes with ``fit(resume=True)`` on 3
ranks for the rest. The result equals one process training every global batch
without a stop (table-, row-, column-wise, data-parallel, a mixed plan with a
MultiOptimizer and with Adagrad, and a DDP model), and the real 2- and 3-rank
checkpoints convert offline (2 -> 1, 2 -> 3, 3 -> 2) with every row and optimizer
slot where the plan puts it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from dist_helpers import MIXED, launch
from reshard_worker import CASES, global_batches, make_model, make_optimizer
from test_reshard import _check_parts, _configs

from tabstream.train.torch import fit
from tabstream.train.torch.distributed import plan_sharding, reshard

WORKER = Path(__file__).with_name("reshard_worker.py")
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("reshard")
    launch(2, "train", out, worker=WORKER)
    stopped = out / "stopped"
    stopped.mkdir()
    for ck in out.glob("ck-*"):
        shutil.copytree(ck, stopped / ck.name)
    ranks = launch(3, "resume", out, worker=WORKER)
    return out, ranks


def _tag(case):
    return case.replace(":", "-")


def _model(out, name):
    data = np.load(out / f"{name}-model.npz", allow_pickle=False)
    return {k: torch.as_tensor(data[k]) for k in data.files}


def _slots(out, name, world, model):
    """Every rank's dumped slots put together into whole tensors with numpy."""
    whole: dict = {}
    for r in range(world):
        data = np.load(out / f"{name}-slots-rank{r}.npz", allow_pickle=False)
        for entry in data.files:
            leaf, key, slot, where = entry.split("::")
            if where == "scalar":
                whole[(leaf, key, slot)] = torch.as_tensor(data[entry])
                continue
            target = whole.setdefault((leaf, key, slot), np.zeros(model[key].shape, np.float32))
            piece = data[entry]
            offsets = [int(x) for x in where.split(",")]
            target[tuple(slice(o, o + n) for o, n in zip(offsets, piece.shape))] = piece
    return {k: torch.as_tensor(v) for k, v in whole.items()}


@pytest.mark.parametrize("case", CASES)
def test_resumed_on_3_ranks_equals_one_process_that_never_stopped(runs, case):
    out, ranks = runs
    kind, optimizer = case.split(":")
    plain = make_model(sparse=optimizer != "adagrad")
    fit(plain, global_batches(), make_optimizer(optimizer, plain), progress=False)
    got = _model(out, f"end-{_tag(case)}")
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(got[key], value, rtol=0, atol=1e-5, msg=f"{case} {key}")
    # one line on rank 0 says what happened, none on the others
    ck = out / f"ck-{_tag(case)}"
    said = [line for line in "".join(ranks[0]).splitlines() if f"checkpoint {ck}" in line]
    assert len(said) == 1
    assert "was written by 2 workers, this run has 3" in said[0]
    assert ("tables and optimizer state resharded" in said[0]) == (kind != "ddp")
    assert not any(f"checkpoint {ck}" in "".join(r) for r in ranks[1:])


def test_refusals_name_what_differs_and_the_fix(runs):
    out, _ = runs
    errors = json.loads((out / "refusals.json").read_text())
    assert "'inputs.embeddings.C1.weight' has shape (50, 6) in the checkpoint, (50, 8) in " \
        "the model" in errors["model"]
    assert "resume=False" in errors["model"]


@pytest.mark.parametrize("case", ["mixed:multi", "mixed:adagrad", "row_wise:lazyadam"])
def test_real_checkpoints_reshard_offline(runs, tmp_path, case):
    out, _ = runs
    tag = _tag(case)
    configs = _configs()
    # the 2-rank checkpoint, stopped: to 1 rank (checkpoint.pt) and to 3 ranks
    model = _model(out, f"stop-{tag}")
    slots = _slots(out, f"stop-{tag}", 2, model)
    path = reshard(out / "stopped" / f"ck-{tag}", tmp_path / "one", 1)
    saved = torch.load(path, weights_only=True)
    for key, value in model.items():
        torch.testing.assert_close(saved["model"][key], value, rtol=0, atol=1e-6)
    folder = reshard(out / "stopped" / f"ck-{tag}", tmp_path / "three", 3, plan=MIXED)
    _check_parts(folder, 3, plan_sharding(configs, 3, overrides=MIXED), model, slots)
    # the 3-rank checkpoint the resumed run ended with: to 2 ranks, column-wise
    model = _model(out, f"end-{tag}")
    slots = _slots(out, f"end-{tag}", 3, model)
    folder = reshard(out / f"ck-{tag}", tmp_path / "two", 2, plan="column_wise")
    _check_parts(folder, 2, plan_sharding(configs, 2, strategy="column_wise"), model, slots)

"""Offline resharding (``reshard``, ``tabstream reshard``) of sharded checkpoints, in
one process: the source is a real HybridParallel checkpoint of a 1-rank gloo group
(every table whole on that rank), converted to 2 ranks (mixed plan), 2 -> 3 (row
wise), 3 -> 2 (auto) and 2 -> 1 (a plain ``checkpoint.pt``). Each rank's regions of
every table and optimizer slot are compared with the source model's whole tables
cut by numpy at the ranges the planner gives, and the 1-rank result trains on in
single-process ``fit`` exactly as a plain run that never stopped."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist
from dist_helpers import MIXED, free_port
from reshard_worker import STOP, global_batches, make_model, make_optimizer

from tabstream.core.errors import DataError
from tabstream.train.torch import MultiOptimizer, fit
from tabstream.train.torch.distributed import HybridParallel, plan_sharding, reshard
from tabstream.train.torch.sharded_checkpoint import load_part

OPTIMIZERS = ["multi", "adagrad"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """For each optimizer: (checkpoint dir after STOP steps on one rank, the whole
    model then, {(leaf, param, slot): whole slot tensor}, the plain optimizer kind)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    out = {}
    try:
        for optimizer in OPTIMIZERS:
            ck = tmp_path_factory.mktemp(f"ck1-{optimizer}")
            hp = HybridParallel(make_model(sparse=optimizer != "adagrad"), plan=MIXED)
            opt = make_optimizer(optimizer, hp)
            fit(hp, global_batches()[:STOP], opt, checkpoint_dir=ck, progress=False)
            leaves = opt.optimizers if isinstance(opt, MultiOptimizer) else {"optimizer": opt}
            slots = {}
            for key, o in leaves.items():
                for name, p in hp.module.named_parameters():
                    for s, v in o.state.get(p, {}).items():
                        plain = name.replace(".shards.", ".").replace(".replicated.", ".")
                        slots[(key, plain, s)] = v.clone() if torch.is_tensor(v) else v
            out[optimizer] = (ck, {k: v.clone() for k, v in hp.full_state_dict().items()}, slots)
    finally:
        dist.destroy_process_group()
    return out


def _configs():
    model = make_model()
    return [c for m in model.modules() if hasattr(m, "configs") for c in m.configs]


def _region(kind, ranges, owner, rank, whole):
    """The part of ``whole`` a rank holds, cut with numpy from the plan's ranges."""
    w = np.asarray(whole)
    if kind == "data_parallel":
        return w
    if kind == "table_wise":
        return w if owner == rank else None
    a, b = ranges[rank]
    if b <= a:
        return None
    return w[a:b] if kind == "row_wise" else w[:, a:b]


def _check_parts(folder, world, plan, model, slots):
    """Every rank's part of the checkpoint in ``folder`` holds exactly its regions."""
    tables = {f"inputs.embeddings.{c.name}.weight": c.name for c in _configs()}
    for r in range(world):
        skeleton = json.loads((folder / f"rank{r}.json").read_text())
        part = load_part(folder, skeleton, no_dist=True)
        assert part["layout"]["world_size"] == world and part["layout"]["rank"] == r
        expected_keys = set()
        for key, whole in model.items():
            if key in tables:
                place = plan.placements[tables[key]]
                want = _region(place.kind, place.ranges, place.owner, r, whole)
            else:
                want = np.asarray(whole)
            if want is None:
                assert key not in part["model"]
                continue
            expected_keys.add(key)
            np.testing.assert_array_equal(part["model"][key].numpy(), want, err_msg=key)
        assert set(part["model"]) == expected_keys
        for (leaf, key, s), whole in slots.items():
            state = part["optimizer"]["leaves"][leaf]["state"]
            if key not in expected_keys:
                assert key not in state
                continue
            got = state[key][s]
            if torch.is_tensor(whole) and whole.dim():
                place = plan.placements[tables[key]] if key in tables else None
                want = (np.asarray(whole) if place is None else
                        _region(place.kind, place.ranges, place.owner, r, whole))
                np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{leaf} {key} {s}")
            else:
                assert float(got) == float(whole), (leaf, key, s)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_reshard_1_to_2_to_3_to_2_keeps_every_row_and_slot(sources, tmp_path, optimizer):
    ck, model, slots = sources[optimizer]
    configs = _configs()
    out2 = reshard(ck, tmp_path / "w2", 2, plan=MIXED)
    _check_parts(out2, 2, plan_sharding(configs, 2, overrides=MIXED), model, slots)
    out3 = reshard(tmp_path / "w2", tmp_path / "w3", 3, plan="row_wise")
    _check_parts(out3, 3, plan_sharding(configs, 3, strategy="row_wise"), model, slots)
    back = reshard(tmp_path / "w3", tmp_path / "w2b", 2)    # the auto plan
    _check_parts(back, 2, plan_sharding(configs, 2), model, slots)
    pointer = json.loads((tmp_path / "w3" / "checkpoint.dcp.json").read_text())
    assert pointer == {"format": "tabstream.sharded/2", "folder": out3.name, "world_size": 3}
    assert not list((tmp_path / "w3").rglob(".metadata"))   # DCP's pickled index: never


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_unsharded_checkpoint_resumes_in_single_process_fit(sources, tmp_path, optimizer):
    ck, model, slots = sources[optimizer]
    reshard(ck, tmp_path / "w2", 2, plan=MIXED)
    path = reshard(tmp_path / "w2", tmp_path / "one", 1)
    assert path == tmp_path / "one" / "checkpoint.pt"
    saved = torch.load(path, weights_only=True)       # tensors and plain values only
    assert saved["model_class"] == "DLRM" and (saved["epoch"], saved["step"]) == (1, 0)
    for key, value in model.items():
        torch.testing.assert_close(saved["model"][key], value, rtol=0, atol=0)
    # the optimizer state loads into the plain model's optimizer, slot by slot
    plain = make_model(sparse=optimizer != "adagrad")
    opt = make_optimizer(optimizer, plain)
    opt.load_state_dict(saved["optimizer"])
    leaves = opt.optimizers if isinstance(opt, MultiOptimizer) else {"optimizer": opt}
    seen = 0
    for key, o in leaves.items():
        for name, p in plain.named_parameters():
            for s, v in o.state.get(p, {}).items():
                want = slots[(key, name, s)]
                torch.testing.assert_close(torch.as_tensor(v), torch.as_tensor(want), rtol=0,
                                           atol=1e-6)
                seen += 1
    assert seen == len(slots)
    # trained on in one process, it ends where a run that never stopped ends
    rest = global_batches()[STOP:]
    plain = make_model(seed=5, sparse=optimizer != "adagrad")   # the checkpoint decides
    opt = make_optimizer(optimizer, plain)
    fit(plain, rest, opt, epochs=2, checkpoint_dir=tmp_path / "one", resume=True, progress=False)
    ref = make_model(sparse=optimizer != "adagrad")
    ref_opt = make_optimizer(optimizer, ref)
    fit(ref, global_batches()[:STOP], ref_opt, progress=False)
    fit(ref, rest, ref_opt, progress=False)
    for key, value in ref.state_dict().items():
        torch.testing.assert_close(plain.state_dict()[key], value, rtol=0, atol=1e-5)


def test_cli_reshard_prints_the_new_plan(sources, tmp_path):
    ck, _, _ = sources["multi"]
    from tabstream.cli import main

    code = main(["reshard", str(ck), str(tmp_path / "w3"), "--world-size", "3",
                 "--plan", "C1=column_wise"])
    assert code == 0
    pointer = json.loads((tmp_path / "w3" / "checkpoint.dcp.json").read_text())
    assert pointer["world_size"] == 3
    part = json.loads((tmp_path / "w3" / pointer["folder"] / "rank0.json").read_text())
    assert "column_wise" in json.dumps(part) and "C1" in json.dumps(part)


def test_a_checkpoint_of_the_older_per_rank_layout_still_resumes_on_its_world_size(tmp_path):
    """What fit wrote before the whole-table layout (every tensor under rank{r}/n, the
    wrapped model's own state_dict, pointer format /1) resumes as before."""
    from tabstream.train.torch.fit import _FORMAT
    from tabstream.train.torch.sharded_checkpoint import POINTER_FILE, save_sharded

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0,
                            world_size=1)
    try:
        batches = global_batches()
        hp = HybridParallel(make_model(), plan=MIXED)
        opt = make_optimizer("lazyadam", hp)
        fit(hp, batches[:STOP], opt, progress=False)
        save_sharded(tmp_path, {"format": _FORMAT, "model_class": "HybridParallel",
                                "model": hp.state_dict(), "optimizer": opt.state_dict(),
                                "rng": torch.random.get_rng_state(), "epoch": 1, "step": 0,
                                "global_step": STOP, "loss_sum": 0.0, "samples": 0,
                                "history": {}, "data_id": "", "data_pass": 0,
                                "data_files": {}}, tag="checkpoint-000000003")
        pointer = tmp_path / POINTER_FILE
        pointer.write_text(pointer.read_text().replace("tabstream.sharded/2",
                                                       "tabstream.sharded/1"))
        with pytest.raises(DataError, match="written by an older tabstream, whose sharded "
                           "checkpoints do not record the plan; resume it once on its 1 ranks"):
            reshard(tmp_path, tmp_path / "out", 2)
        fit(hp, batches[STOP:], opt, progress=False)
        expected = hp.full_state_dict()
        other = HybridParallel(make_model(seed=3), plan=MIXED)
        fit(other, batches[STOP:], make_optimizer("lazyadam", other), epochs=2,
            checkpoint_dir=tmp_path, resume=True, progress=False)
        for key, value in expected.items():
            torch.testing.assert_close(other.full_state_dict()[key], value, rtol=0, atol=1e-6)
        # its next checkpoint is in the whole-table layout: that one reshards
        assert reshard(tmp_path, tmp_path / "one", 1).name == "checkpoint.pt"
    finally:
        dist.destroy_process_group()

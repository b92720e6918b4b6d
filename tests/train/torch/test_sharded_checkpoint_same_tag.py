"""save_sharded never writes into, nor removes, the folder the pointer names before
the new save is complete: a second save of one tag (fit's mid-epoch and epoch-end
checkpoints at one global step) that fails, or is killed midway, leaves the
previous checkpoint readable. One process (a 1-rank gloo group) and two ranks."""

from __future__ import annotations

import errno
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dist_helpers import launch
from same_tag_worker import Model as _Model

import tabstream.train.torch.sharded_checkpoint as sc
from tabstream.train.checks import CheckpointError


def _pointed(directory) -> str:
    return json.loads((directory / sc.POINTER_FILE).read_text())["folder"]


def _payload(value: float) -> dict:
    return {"step": int(value), "w": torch.full((3, 2), value)}


def _full_disk(monkeypatch, on_call: int, check=None):
    """dcp.save fails with ENOSPC on its ``on_call``-th call (after ``check()``)."""
    real, calls = sc.dcp.save, [0]

    def save(*args, **kwargs):
        calls[0] += 1
        if calls[0] == on_call:
            if check is not None:
                check()
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(sc.dcp, "save", save)


def test_a_failed_save_of_the_pointed_tag_keeps_the_previous_checkpoint(one_rank, tmp_path,
                                                                          monkeypatch):
    sc.save_sharded(tmp_path, _payload(1.0), tag="checkpoint-000000004")
    before = _pointed(tmp_path)
    _full_disk(monkeypatch, on_call=1)
    with pytest.raises(CheckpointError, match="the previous one is kept"):
        sc.save_sharded(tmp_path, _payload(2.0), tag="checkpoint-000000004")
    assert _pointed(tmp_path) == before
    got = sc.load_sharded(tmp_path)
    assert got["step"] == 1
    torch.testing.assert_close(got["w"], torch.full((3, 2), 1.0), rtol=0, atol=0)
    # nothing of the failed save is left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([before, sc.POINTER_FILE])


def test_the_pointed_folder_stays_readable_while_its_tag_is_saved_again(one_rank, tmp_path,
                                                                          monkeypatch):
    sc.save_sharded(tmp_path, _payload(1.0), tag="t")
    seen = {}

    def check():  # what a reader would find if the process were killed right now
        seen["values"] = sc.read_plain_values(tmp_path)
        seen["w"] = sc.load_sharded(tmp_path)["w"].clone()

    _full_disk(monkeypatch, on_call=1, check=check)
    with pytest.raises(CheckpointError):
        sc.save_sharded(tmp_path, _payload(2.0), tag="t")
    assert seen["values"]["step"] == 1
    torch.testing.assert_close(seen["w"], torch.full((3, 2), 1.0), rtol=0, atol=0)


def test_saving_one_tag_again_switches_the_pointer_and_removes_the_old_folder(one_rank, tmp_path):
    for value in (1.0, 2.0, 3.0):
        folder = sc.save_sharded(tmp_path, _payload(value), tag="t")
        assert _pointed(tmp_path) == folder.name
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([folder.name, sc.POINTER_FILE])
        got = sc.load_sharded(tmp_path)
        assert got["step"] == int(value)
        torch.testing.assert_close(got["w"], torch.full((3, 2), value), rtol=0, atol=0)



def _batches() -> list[tuple[dict, torch.Tensor]]:
    rng = np.random.default_rng(3)
    return [({"a": torch.as_tensor(rng.integers(0, 10, 3))},
             torch.as_tensor(rng.integers(0, 2, 3), dtype=torch.float32)) for _ in range(4)]


def test_fit_epoch_end_save_failing_keeps_the_mid_epoch_checkpoint(one_rank, tmp_path,
                                                                    monkeypatch):
    from tabstream.train.torch import fit
    from tabstream.train.torch.distributed import HybridParallel
    from tabstream.train.torch.fit import checkpoint_position

    # the reference: the plain model, four SGD steps on the same batches
    plain = _Model()
    opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    for features, labels in _batches():
        loss = F.binary_cross_entropy_with_logits(plain(features), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()

    hp = HybridParallel(_Model(), plan={"T": "row_wise"})
    # 4 batches, a checkpoint every 2: saves at global steps 2, 4 and the epoch-end
    # one at step 4 again, which hits a full disk
    _full_disk(monkeypatch, on_call=3)
    with pytest.raises(CheckpointError, match="the previous one is kept"):
        fit(hp, _batches(), torch.optim.SGD(hp.parameters(), lr=0.1), epochs=1,
            checkpoint_dir=tmp_path, checkpoint_every=2, progress=False)
    monkeypatch.undo()
    assert (tmp_path / _pointed(tmp_path) / "rank0.json").exists()
    assert checkpoint_position(tmp_path) == (0, 4)
    # other initial weights: only the mid-epoch checkpoint can give the reference
    hp = HybridParallel(_Model(seed=5), plan={"T": "row_wise"})
    fit(hp, _batches(), torch.optim.SGD(hp.parameters(), lr=0.1), epochs=1,
        checkpoint_dir=tmp_path, resume=True, progress=False)
    state = hp.full_state_dict()
    for key, value in plain.state_dict().items():
        torch.testing.assert_close(state[key], value, rtol=0, atol=1e-6)
    assert checkpoint_position(tmp_path) == (1, 0)


@pytest.mark.slow
def test_two_ranks_failed_epoch_end_save_keeps_the_checkpoint(tmp_path):
    from same_tag_worker import WORKER_FILE, reference

    launch(2, "same_tag", tmp_path, worker=WORKER_FILE, timeout=300)
    failed = [json.loads((tmp_path / f"failed-rank{r}.json").read_text()) for r in range(2)]
    for out in failed:  # both ranks raised together; the pointed folder is whole
        assert out["error"][0] == "CheckpointError", out
        assert out["pointed_whole"], out
    got = np.load(tmp_path / "resumed.npz", allow_pickle=False)
    for key, value in reference().items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-6, err_msg=key)

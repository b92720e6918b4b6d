"""One rank of the multi-process torch tests (run by dist_helpers.launch)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import dist_helpers as h  # noqa: E402

from tabstream.train.torch.distributed import HybridParallel  # noqa: E402


def equivalence(out: Path, cases: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases.split(","):
        kind, optimizer, combiner = case.split(":")
        model, make_optimizer = h.build(kind, optimizer, combiner)
        hp = HybridParallel(model, plan=h.plan_for(kind))
        opt = make_optimizer(hp)
        losses = []
        for step in h.rank_batches(1, h.step_sizes(world)):
            features, labels = step[rank]
            loss = F.binary_cross_entropy_with_logits(hp(features), labels)
            opt.zero_grad()
            (loss * hp.loss_scale).backward()
            opt.step()
            losses.append(hp.global_mean(loss.detach()))
        state = hp.full_state_dict()
        if rank == 0:
            np.savez(out / f"{case.replace(':', '-')}.npz", losses=np.array(losses),
                     **{k: v.numpy() for k, v in state.items()})


def _loaders(data: Path, batch_size: int = 4):
    import tabstream as ts
    from tabstream.loaders.torch import Loader

    files = str(data / "*.parquet")
    train = Loader(ts.Dataset(files), batch_size=batch_size, labels=["click"], seed=3, shuffle=True)
    valid = Loader(ts.Dataset(files), batch_size=batch_size, labels=["click"], shuffle=False)
    return train, valid


def _history(out: Path, name: str, history: dict) -> None:
    (out / f"{name}-rank{dist.get_rank()}.json").write_text(json.dumps(history))


def fit_ddp(out: Path, data: str) -> None:
    """A DDP model through fit on files of unequal size; rank 0 alone checkpoints."""
    from torch.nn.parallel import DistributedDataParallel

    from tabstream.train.torch import LazyAdam, fit

    model, _ = h.build("data_parallel", "sgd", "sum")
    ddp = DistributedDataParallel(model)
    train, valid = _loaders(Path(data))
    history = fit(ddp, train, LazyAdam(ddp.parameters(), lr=0.05), epochs=2,
                  valid_loader=valid, checkpoint_dir=out / "ck", progress=True)
    _history(out, "ddp", history)


class _StopAfter:
    """The loader, interrupted (on every rank) after ``n`` batches of epoch ``epoch``."""

    def __init__(self, loader, epoch: int, n: int) -> None:
        self.loader, self.epoch, self.n, self.current = loader, epoch, n, 0

    def set_epoch(self, epoch: int) -> None:
        self.current = epoch
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        for i, batch in enumerate(self.loader):
            if self.current == self.epoch and i == self.n:
                raise KeyboardInterrupt("stopped on purpose")
            yield batch


def fit_hybrid(out: Path, data: str) -> None:
    """HybridParallel (mixed plan, sparse LazyAdam) through fit: an uninterrupted
    run, and a run stopped mid-epoch and resumed from its sharded checkpoint."""
    from tabstream.train.torch import LazyAdam, fit

    def make(seed=0):
        model, _ = h.build("mixed", "lazyadam", "mean", seed=seed)
        hp = HybridParallel(model, plan=h.plan_for("mixed"))
        return hp, LazyAdam(hp.parameters(), lr=0.05)

    train, valid = _loaders(Path(data))
    hp, opt = make()
    history = fit(hp, train, opt, epochs=2, valid_loader=valid, progress=False)
    _history(out, "hybrid", history)
    full = hp.full_state_dict()
    hp, opt = make()
    try:
        fit(hp, _StopAfter(train, 1, 3), opt, epochs=2, valid_loader=valid,
            checkpoint_dir=out / "ck", checkpoint_every=2, progress=False)
        raise AssertionError("the run was not interrupted")
    except KeyboardInterrupt:
        pass
    hp, opt = make(seed=7)  # other initial weights: only the checkpoint can make it match
    resumed = fit(hp, train, opt, epochs=2, valid_loader=valid, checkpoint_dir=out / "ck",
                  resume=True, progress=False)
    _history(out, "resumed", resumed)
    again = hp.full_state_dict()
    if dist.get_rank() == 0:
        np.savez(out / "hybrid.npz", **{k: v.numpy() for k, v in full.items()})
        np.savez(out / "resumed.npz", **{k: v.numpy() for k, v in again.items()})


def main() -> None:
    torch.set_num_threads(1)
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        {"equivalence": equivalence, "fit_ddp": fit_ddp, "fit_hybrid": fit_hybrid}[scenario](out, *sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

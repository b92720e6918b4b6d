"""One rank of the resharding tests (run by dist_helpers.launch(worker=...)).

``train OUT``: on W ranks, each case trains the first epoch (the first STOP global
batches) through ``fit`` and is stopped as the second starts; ``resume OUT``: on W'
ranks, each case resumes from that checkpoint and trains the second epoch (the other
global batches). The stop is at an epoch's end: inside an epoch, only a tabstream
loader knows which rows are left on another number of ranks (its position), and
these batches are given by hand. Both dump the
whole model (``full_state_dict``) and each rank's optimizer slots with their
offsets, computed from the plan here (not by the code under test)."""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import dist_helpers as h  # noqa: E402

from tabstream.core.errors import SchemaError  # noqa: E402
from tabstream.train.torch import (  # noqa: E402
    DLRM,
    LazyAdam,
    MultiOptimizer,
    fit,
    split_embeddings_on_size,  # noqa: E402
)
from tabstream.train.torch.distributed import HybridParallel  # noqa: E402

#: global batches of ROWS rows (divisible by 2 and 3), STOP trained before the stop
ROWS, STEPS, STOP = 12, 6, 3
CASES = ["row_wise:lazyadam", "column_wise:lazyadam", "table_wise:lazyadam",
         "data_parallel:lazyadam", "mixed:multi", "mixed:adagrad", "ddp:lazyadam"]


def global_batches() -> list[tuple[dict, torch.Tensor]]:
    return [step[0] for step in h.rank_batches(11, [[ROWS]] * STEPS)]


def split(batch: tuple[dict, torch.Tensor], parts: int) -> list[tuple[dict, torch.Tensor]]:
    """The rows of a global batch cut into ``parts`` consecutive slices (rank order)."""
    features, labels = batch
    n = labels.shape[0]
    bounds = np.linspace(0, n, parts + 1).astype(int)
    out = []
    for a, b in zip(bounds[:-1], bounds[1:]):
        f: dict = {}
        for name, value in features.items():
            if isinstance(value, tuple):
                values, offsets = value
                lo, hi = int(offsets[a]), int(offsets[b])
                f[name] = (values[lo:hi], offsets[a:b + 1] - lo)
            else:
                f[name] = value[a:b]
        out.append((f, labels[a:b]))
    return out


def make_model(seed: int = 0, dim: int = 6, sparse: bool = True) -> torch.nn.Module:
    torch.manual_seed(seed)
    return DLRM(h.schema(), embedding_dim=dim, bottom_mlp=(8,), top_mlp=(8,), sparse=sparse,
                combiner="mean")


def make_optimizer(optimizer: str, model: torch.nn.Module):
    if optimizer == "lazyadam":
        return LazyAdam(model.parameters(), lr=0.05)
    if optimizer == "adagrad":
        return torch.optim.Adagrad(model.parameters(), lr=0.1)
    large, _ = split_embeddings_on_size(model, threshold=1)
    return MultiOptimizer(partial(torch.optim.Adam, lr=0.02),
                          [(partial(LazyAdam, lr=0.05), large)], model=model)


def wrap(case: str, seed: int = 0, dim: int = 6):
    kind, optimizer = case.split(":")
    # torch's Adagrad warns on sparse gradients: its tables get dense ones
    model = make_model(seed, dim, sparse=optimizer != "adagrad")
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        wrapped = DistributedDataParallel(model)
    else:
        wrapped = HybridParallel(model, plan=h.plan_for(kind))
    return wrapped, make_optimizer(optimizer, wrapped)


class _Epochs:
    """Per-rank batches given by hand, epoch ``e`` being the global batches
    ``[e * STOP, (e + 1) * STOP)``; with ``stop``, the second epoch is interrupted as it
    starts (after the first epoch's checkpoint)."""

    def __init__(self, batches: list, stop: bool = False) -> None:
        self.batches, self.stop, self.epoch = batches, stop, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return STOP

    def __iter__(self):
        if self.stop and self.epoch == 1:
            raise KeyboardInterrupt("stopped on purpose")
        yield from self.batches[self.epoch * STOP:(self.epoch + 1) * STOP]


def _offsets(hp: HybridParallel, name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """Where a parameter of the wrapped model lies in the unwrapped one, from the plan."""
    parts = name.split(".")
    if "shards" in parts:
        table = parts[parts.index("shards") + 1]
        place = hp.plan.placements[table]
        start = {k: a for k, a, _ in place.pieces()}[hp.rank]
        return {"table_wise": (0, 0), "row_wise": (start, 0), "column_wise": (0, start)}[place.kind]
    return (0,) * len(shape)


def _unwrapped_name(name: str) -> str:
    return name.replace(".shards.", ".").replace(".replicated.", ".")


def dump(wrapped, optimizer, out: Path, tag: str) -> None:
    """Rank 0: the whole model; every rank: its optimizer slots with their offsets."""
    rank = dist.get_rank()
    if isinstance(wrapped, HybridParallel):
        full = wrapped.full_state_dict()
        named = list(wrapped.module.named_parameters())
    else:
        full = wrapped.module.state_dict()
        named = list(wrapped.module.named_parameters())
    if rank == 0:
        np.savez(out / f"{tag}-model.npz", **{k: v.numpy() for k, v in full.items()})
    leaves = optimizer.optimizers if isinstance(optimizer, MultiOptimizer) else {"optimizer": optimizer}
    slots = {}
    for key, opt in leaves.items():
        for name, p in named:
            if p not in opt.state:
                continue
            off = (_offsets(wrapped, name, tuple(p.shape)) if isinstance(wrapped, HybridParallel)
                   else (0,) * p.dim())
            for s, v in opt.state[p].items():
                where = ",".join(map(str, off)) if torch.is_tensor(v) and v.dim() else "scalar"
                slots[f"{key}::{_unwrapped_name(name)}::{s}::{where}"] = (
                    v.numpy() if torch.is_tensor(v) else np.asarray(v))
    np.savez(out / f"{tag}-slots-rank{rank}.npz", **slots)


def train(out: Path) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    batches = global_batches()
    for case in CASES:
        tag = case.replace(":", "-")
        wrapped, opt = wrap(case)
        loader = _Epochs([split(b, world)[rank] for b in batches], stop=True)
        try:
            fit(wrapped, loader, opt, epochs=2, checkpoint_dir=out / f"ck-{tag}", progress=False)
            raise AssertionError("the run was not stopped")
        except KeyboardInterrupt:
            pass
        dump(wrapped, opt, out, f"stop-{tag}")


def resume(out: Path) -> None:
    world, rank = dist.get_world_size(), dist.get_rank()
    batches = global_batches()
    mine = [split(b, world)[rank] for b in batches]
    errors = {}
    # a refusal first: another model (the checkpoint is kept); another global batch is
    # refused by the loop with a tabstream loader (tests/train/torch/test_elastic_resume.py)
    tag = "mixed-multi"
    other, opt = wrap("mixed:multi", dim=8)
    try:
        fit(other, _Epochs(mine), opt, epochs=2, checkpoint_dir=out / f"ck-{tag}", resume=True,
            progress=False)
    except SchemaError as exc:
        errors["model"] = str(exc)
    if rank == 0:
        (out / "refusals.json").write_text(json.dumps(errors))
    for case in CASES:
        tag = case.replace(":", "-")
        wrapped, opt = wrap(case, seed=7)  # other weights: only the checkpoint can make it match
        fit(wrapped, _Epochs(mine), opt, epochs=2, checkpoint_dir=out / f"ck-{tag}", resume=True,
            progress=False)
        dump(wrapped, opt, out, f"end-{tag}")


def main() -> None:
    torch.set_num_threads(1)
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        {"train": train, "resume": resume}[scenario](out)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

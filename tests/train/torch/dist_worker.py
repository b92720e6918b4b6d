"""One rank of the multi-process torch tests (run by dist_helpers.launch)."""

from __future__ import annotations

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


def main() -> None:
    torch.set_num_threads(1)
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        {"equivalence": equivalence}[scenario](out, *sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

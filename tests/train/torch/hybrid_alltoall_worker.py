"""One rank of tests/train/torch/test_hybrid_alltoall.py (run by dist_helpers.launch):
per plan, two forward + backward steps of a HybridParallel DLRM on this rank's
batches; writes HybridParallel.comm_stats() after each step, and the logits of the
first step beside those of the plain model on the same rows."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
import dist_helpers as h  # noqa: E402

from tabstream.train.torch.distributed import HybridParallel  # noqa: E402


def run(out: Path, kinds: str, sizes: str) -> None:
    rank = dist.get_rank()
    steps = json.loads(sizes)
    report: dict = {}
    for kind in kinds.split(","):
        plain, _ = h.build(kind, "sgd", "mean")
        model, _ = h.build(kind, "sgd", "mean")
        hp = HybridParallel(model, plan=h.plan_for(kind))
        lasts, logits = [], []
        for i, step in enumerate(h.rank_batches(7, steps)):
            features, labels = step[rank]
            got = hp(features)
            loss = F.binary_cross_entropy_with_logits(got, labels)
            hp.zero_grad()
            (loss * hp.loss_scale).backward()
            lasts.append(hp.comm_stats()["last"])
            if i == 0:
                with torch.no_grad():
                    logits = [got.detach().tolist(), plain(features).tolist()]
        report[kind] = {"lasts": lasts, "stats": hp.comm_stats(), "logits": logits}
    (out / f"rank{rank}.json").write_text(json.dumps(report))


def main() -> None:
    torch.set_num_threads(1)
    out = Path(sys.argv[2])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        run(out, *sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

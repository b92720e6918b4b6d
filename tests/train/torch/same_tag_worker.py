"""One rank of test_sharded_checkpoint_same_tag's two-rank test (run by
``dist_helpers.launch``): fit with a checkpoint every 2 of 4 batches, the epoch-end
save (the same global step as the last mid-epoch one) failing on a full disk; then
a model of other initial weights resumes from what is left. The test imports
:func:`reference` for the one-process result."""

from __future__ import annotations

import errno
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tabstream.train.tables import TableConfig
from tabstream.train.torch import EmbeddingTables

WORKER_FILE = Path(__file__)


class Model(nn.Module):
    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.emb = EmbeddingTables([TableConfig("T", 10, 4, ("a",))])
        self.head = nn.Linear(4, 1)

    def forward(self, features: dict) -> torch.Tensor:
        return self.head(self.emb(features)["a"]).reshape(-1)


def batches(rank: int) -> list[tuple[dict, torch.Tensor]]:
    rng = np.random.default_rng(10 + rank)
    return [({"a": torch.as_tensor(rng.integers(0, 10, 3))},
             torch.as_tensor(rng.integers(0, 2, 3), dtype=torch.float32)) for _ in range(4)]


def reference() -> dict[str, np.ndarray]:
    """One process, the plain model, four SGD steps on the global batches."""
    model = Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for parts in zip(batches(0), batches(1)):
        features = {"a": torch.cat([p[0]["a"] for p in parts])}
        labels = torch.cat([p[1] for p in parts])
        loss = F.binary_cross_entropy_with_logits(model(features), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


def run(out: Path) -> None:
    import torch.distributed as dist

    import tabstream.train.torch.sharded_checkpoint as sc
    from tabstream.train.torch import fit
    from tabstream.train.torch.distributed import HybridParallel

    rank, ck = dist.get_rank(), out / "ck"
    hp = HybridParallel(Model(), plan={"T": "row_wise"})
    real, calls = sc.dcp.save, [0]

    def full_disk(*args, **kwargs):  # the third save, the epoch-end one, fails
        calls[0] += 1
        if calls[0] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    sc.dcp.save = full_disk
    error = None
    try:
        fit(hp, batches(rank), torch.optim.SGD(hp.parameters(), lr=0.1), epochs=1,
            checkpoint_dir=ck, checkpoint_every=2, progress=False)
    except Exception as exc:
        error = [type(exc).__name__, str(exc)]
    sc.dcp.save = real
    dist.barrier()
    folder = ck / json.loads((ck / sc.POINTER_FILE).read_text())["folder"]
    whole = all((folder / n).exists() for n in (".metadata.json", "rank0.json", "rank1.json"))
    (out / f"failed-rank{rank}.json").write_text(json.dumps({"error": error,
                                                             "pointed_whole": whole}))
    hp = HybridParallel(Model(seed=5), plan={"T": "row_wise"})
    fit(hp, batches(rank), torch.optim.SGD(hp.parameters(), lr=0.1), epochs=1,
        checkpoint_dir=ck, resume=True, progress=False)
    state = hp.full_state_dict()
    if rank == 0:
        np.savez(out / "resumed.npz", **{k: v.numpy() for k, v in state.items()})


if __name__ == "__main__":
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        run(Path(sys.argv[2]))
    finally:
        dist.destroy_process_group()

"""Per-id lookups (``combiner=None``) under HybridParallel: the model, the batches
and one rank's run (launched by ``dist_helpers.launch``); the test imports the
model and batches to compute the one-process reference."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tabstream.train.tables import TableConfig
from tabstream.train.torch import EmbeddingTables, LazyAdam

WORKER_FILE = Path(__file__)
#: per-id list "hist", per-id single-hot "user", pooled list "tags"
CONFIGS = [TableConfig("H", 23, 4, ("hist",), is_list=True, combiner=None),
           TableConfig("U", 11, 4, ("user",), combiner=None),
           TableConfig("P", 13, 4, ("tags",), is_list=True, combiner="sum")]
KINDS = ["table_wise", "row_wise", "column_wise", "mixed"]
MIXED = {"H": "row_wise", "U": "column_wise", "P": "table_wise"}
#: rows of each rank's batch, per step: the last steps differ between ranks
STEPS = [[4, 4], [5, 3], [3, 2]]


class Seq(nn.Module):
    """A masked, content-weighted mean of the per-id vectors, with the user vector
    and the pooled tags: its output does not depend on the padded width L."""

    def __init__(self, sparse: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = EmbeddingTables(CONFIGS, sparse=sparse)
        self.head = nn.Linear(12, 1)

    def forward(self, features: dict) -> torch.Tensor:
        out = self.emb(features)
        vectors, mask = out["hist"]
        weight = mask.to(vectors.dtype)[..., None] * torch.sigmoid(vectors.sum(-1, keepdim=True))
        seq = (vectors * weight).sum(1) / weight.sum(1).clamp(min=1e-6)
        return self.head(torch.cat([seq, out["user"], out["tags"]], 1)).reshape(-1)


def plan(kind: str) -> dict[str, str]:
    return dict(MIXED) if kind == "mixed" else {c.name: kind for c in CONFIGS}


def optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    # dense SGD for the whole-table kinds, sparse LazyAdam for the others
    if kind in ("row_wise", "mixed"):
        return LazyAdam(model.parameters(), lr=0.05)
    return torch.optim.SGD(model.parameters(), lr=0.5)


def sparse(kind: str) -> bool:
    return kind in ("row_wise", "mixed")


def ragged(rng: np.random.Generator, rows: int, card: int) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = rng.integers(0, 5, rows)  # empty lists too
    values = rng.integers(0, card, int(lengths.sum()))
    return torch.as_tensor(values), torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]))


def batches(seed: int = 7) -> list[list[tuple[dict, torch.Tensor]]]:
    """``out[step][rank]`` = (features, labels), ragged lists."""
    rng = np.random.default_rng(seed)
    out = []
    for sizes in STEPS:
        step = []
        for b in sizes:
            f = {"hist": ragged(rng, b, 23), "tags": ragged(rng, b, 13),
                 "user": torch.as_tensor(rng.integers(0, 11, b))}
            step.append((f, torch.as_tensor(rng.integers(0, 2, b), dtype=torch.float32)))
        out.append(step)
    return out


def concat(parts: list[tuple[dict, torch.Tensor]]) -> tuple[dict, torch.Tensor]:
    """The global batch: every rank's rows, rank 0 first."""
    features: dict = {}
    for name, first in parts[0][0].items():
        if isinstance(first, tuple):
            values = torch.cat([p[0][name][0] for p in parts])
            lengths = torch.cat([torch.diff(p[0][name][1]) for p in parts])
            features[name] = (values, torch.cat([torch.zeros(1, dtype=torch.long),
                                                 lengths.cumsum(0)]))
        else:
            features[name] = torch.cat([p[0][name] for p in parts])
    return features, torch.cat([p[1] for p in parts])


def layouts(rank: int) -> dict[str, dict]:
    """The per-id feature in its other layouts: padded (B, L) with a mask, and a
    padded list of lists (B, F, L)."""
    rng = np.random.default_rng(100 + rank)
    b = 4 + rank
    mask = rng.random((b, 3)) < 0.6
    ids = np.where(mask, rng.integers(0, 23, (b, 3)), 22)  # padding holds a real id
    nested_mask = rng.random((b, 2, 3)) < 0.5
    nested = np.where(nested_mask, rng.integers(0, 23, (b, 2, 3)), 0)
    common = {"tags": ragged(rng, b, 13), "user": torch.as_tensor(rng.integers(0, 11, b))}
    return {
        "padded": {**common, "hist": (torch.as_tensor(ids), torch.as_tensor(mask))},
        "mask_key": {**common, "hist": torch.as_tensor(ids), "hist__mask": torch.as_tensor(mask)},
        "nested": {**common, "hist": (torch.as_tensor(nested), torch.as_tensor(nested_mask))},
        "ragged": {**common, "hist": ragged(rng, b, 23)},
    }


def run(out: Path) -> None:
    import torch.distributed as dist

    from tabstream.train.torch.distributed import HybridParallel

    rank = dist.get_rank()
    for kind in KINDS:
        hp = HybridParallel(Seq(sparse(kind)), plan=plan(kind))
        saved: dict[str, np.ndarray] = {}
        with torch.no_grad():  # the lookups themselves, each layout
            for name, features in layouts(rank).items():
                result = hp.module.emb(features)
                vectors, mask = result["hist"]
                saved[f"{name}/hist"] = vectors.numpy()
                saved[f"{name}/mask"] = mask.numpy()
                saved[f"{name}/user"] = result["user"].numpy()
                saved[f"{name}/tags"] = result["tags"].numpy()
        opt = optimizer(kind, hp)
        losses = []
        for step in batches():
            features, labels = step[rank]
            loss = F.binary_cross_entropy_with_logits(hp(features), labels)
            opt.zero_grad()
            (loss * hp.loss_scale).backward()
            opt.step()
            losses.append(hp.global_mean(loss.detach()))
        state = {f"state/{k}": v.numpy() for k, v in hp.full_state_dict().items()}
        np.savez(out / f"{kind}-rank{rank}.npz", losses=np.array(losses), **saved, **state)


if __name__ == "__main__":
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        run(Path(sys.argv[2]))
    finally:
        dist.destroy_process_group()

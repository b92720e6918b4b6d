"""Models for test_hybrid_plan_checks, and one rank of its two-rank test (run by
``dist_helpers.launch``): HybridParallel refuses, at construction and on every
rank alike, a ready plan made for other table sizes and two embedding modules with
one table name; a plan that fits gives the plain model's output. Prints JSON."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch import nn

from tabstream.train.tables import TableConfig
from tabstream.train.torch import EmbeddingTables

WORKER_FILE = Path(__file__)


class OneTable(nn.Module):
    def __init__(self, rows: int = 12, dim: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = EmbeddingTables([TableConfig("T", rows, dim, ("a",))])
        self.head = nn.Linear(dim, 1)

    def forward(self, features: dict) -> torch.Tensor:
        return self.head(self.emb(features)["a"]).reshape(-1)


class TwoTowers(nn.Module):
    """Two embedding modules; their tables are named ``names``."""

    def __init__(self, names: tuple[str, str] = ("cat", "cat")) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a = EmbeddingTables([TableConfig(names[0], 10, 4, ("a_cat",))])
        self.b = EmbeddingTables([TableConfig(names[1], 10, 6, ("b_cat",))])
        self.head = nn.Linear(10, 1)

    def forward(self, features: dict) -> torch.Tensor:
        return self.head(torch.cat([self.a(features)["a_cat"], self.b(features)["b_cat"]],
                                   1)).reshape(-1)


TOWER_BATCH = {"a_cat": torch.tensor([1, 2, 3, 9]), "b_cat": torch.tensor([4, 5, 9, 0])}


def _error(make) -> list[str] | None:
    try:
        make()
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return None


def run() -> None:
    import torch.distributed as dist

    from tabstream.train.sharding import plan_sharding
    from tabstream.train.torch.distributed import HybridParallel

    out: dict = {"rank": dist.get_rank()}
    small = plan_sharding([TableConfig("T", 8, 4, ("a",))], 2, strategy="row_wise")
    out["mismatch"] = _error(lambda: HybridParallel(OneTable(), plan=small))
    out["towers"] = {kind: _error(lambda kind=kind: HybridParallel(TwoTowers(), plan={"cat": kind}))
                     for kind in ("table_wise", "row_wise", "column_wise")}
    # what fits is accepted and gives the plain model's output
    fits = HybridParallel(OneTable(), plan=plan_sharding(OneTable(), 2, strategy="row_wise"))
    ids = {"a": torch.tensor([1, 5, 10, 11])}
    renamed = HybridParallel(TwoTowers(("cat_a", "cat_b")), plan="column_wise")
    with torch.no_grad():
        out["fits_diff"] = float((fits(ids) - OneTable()(ids)).abs().max())
        out["renamed_diff"] = float((renamed(TOWER_BATCH)
                                     - TwoTowers(("cat_a", "cat_b"))(TOWER_BATCH)).abs().max())
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        run()
    finally:
        dist.destroy_process_group()
    sys.exit(0)

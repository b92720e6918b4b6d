"""CachedEmbeddings under torch.distributed: the problem every rank and the
single-process reference build identically, and the rank side of the tests
(run by ``dist_helpers.launch(..., worker=CACHE_WORKER)``, gloo on 127.0.0.1)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
from dist_helpers import concat  # noqa: E402
from torch_data import categorical, continuous, target  # noqa: E402

from tabstream.core.schema import Schema  # noqa: E402

CACHE_WORKER = Path(__file__).resolve()
#: table -> cardinality; "L" is a multi-hot (ragged) list column
CARDINALITIES = {"C1": 40, "C2": 9, "L": 25}


def schema() -> Schema:
    return Schema([*(categorical(n, c, is_list=(n == "L")) for n, c in CARDINALITIES.items()),
                   continuous("I1"), target()])


def configs():
    from tabstream.train.torch import table_configs_from_schema

    return table_configs_from_schema(schema().without(["click"]), dim=4, combiner="mean")


def rank_batches(world: int, seed: int = 0) -> list[list[tuple[dict, torch.Tensor]]]:
    """``out[step][rank]``: three steps; at step 1 the last rank's lists are all
    empty (no ids of table L there), the last step's batches differ in size."""
    rng = np.random.default_rng(seed)
    sizes = [[5] * world, [4] * world, [3] + [2] * (world - 1)]
    out = []
    for step, step_sizes in enumerate(sizes):
        parts = []
        for rank, b in enumerate(step_sizes):
            lengths = rng.integers(0, 4, b)
            if step == 1 and rank == world - 1:
                lengths[:] = 0
            f: dict = {n: torch.as_tensor(rng.integers(0, c, b), dtype=torch.long)
                       for n, c in CARDINALITIES.items() if n != "L"}
            values = torch.as_tensor(rng.integers(0, CARDINALITIES["L"], int(lengths.sum())))
            f["L"] = (values, torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)])))
            f["I1"] = torch.as_tensor(rng.normal(size=b), dtype=torch.float32)
            parts.append((f, torch.as_tensor(rng.integers(0, 2, b), dtype=torch.float32)))
        out.append(parts)
    return out


def build(ps, cache_rows: int, **kw):
    """The model (same dense initial weights everywhere) and its dense optimizer."""
    from tabstream.train.torch import DLRM, CachedEmbeddings

    torch.manual_seed(0)
    model = DLRM(schema(), embedding_dim=4, bottom_mlp=(8,), top_mlp=(8,),
                 embeddings=CachedEmbeddings(ps, cache_rows, **kw))
    return model


def server(folder: Path, optimizer: str, storage: str, seed: int = 0):
    from tabstream.train.torch import ParameterServer

    return ParameterServer(folder, configs(), storage=storage, optimizer=optimizer, lr=0.1,
                           seed=seed)


def reference(folder: Path, world: int, optimizer: str, storage: str, cache_rows: int) -> dict:
    """One process trained on the concatenated global batches: what every rank's
    run must equal. Returns rows per table, the dense state, history, metrics."""
    from tabstream.train.torch import evaluate, fit

    steps = rank_batches(world)
    ps = server(folder, optimizer, storage)
    model = build(ps, cache_rows)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    history = fit(model, [concat(s) for s in steps], opt, epochs=2, progress=False)
    metrics = evaluate(model, [concat(s) for s in rank_batches(world, seed=5)])
    result = {
        "rows": {c.name: ps.lookup(c.name, np.arange(c.cardinality)) for c in ps.configs},
        "dense": {k: v.detach().clone() for k, v in model.state_dict().items()
                  if not k.endswith("ps_version")},
        "loss": history["loss"], "metrics": metrics, "table_steps": dict(ps.table_steps),
        "version": ps.version,
    }
    ps.close()
    return result


# -- the rank side ------------------------------------------------------------------


def fit_cases(out: Path, cases: str) -> None:
    """Per case ``optimizer:cache_rows:storage``: DDP + fit (a checkpoint per
    epoch), then evaluate; each rank saves the rows it owns, rank 0 the rest."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tabstream.train.torch import evaluate, fit

    rank, world = dist.get_rank(), dist.get_world_size()
    for case in cases.split(","):
        optimizer, cache_rows, storage = case.split(":")
        name = case.replace(":", "-")
        ps = server(out / name / f"ps{rank}", optimizer, storage)
        model = build(ps, int(cache_rows))
        ddp = DistributedDataParallel(model)
        opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
        mine = [s[rank] for s in rank_batches(world)]
        history = fit(ddp, mine, opt, epochs=2, checkpoint_dir=out / name / "ck", progress=False)
        metrics = evaluate(ddp, [s[rank] for s in rank_batches(world, seed=5)])
        _save(out / name, ps, model, history, metrics)
        ps.close()


def _save(folder: Path, ps, model, history: dict, metrics: dict) -> None:
    """The rows this rank owns, its server's counters, rank 0: the dense state."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    owned = {c.name: np.flatnonzero(np.arange(c.cardinality) % world == rank) for c in ps.configs}
    np.savez(folder / f"rows{rank}.npz",
             **{f"{t}.ids": ids for t, ids in owned.items()},
             **{f"{t}.rows": ps.lookup(t, ids) for t, ids in owned.items()},
             **{f"{t}.touched": ps.touched(t) for t in owned})
    (folder / f"rank{rank}.json").write_text(json.dumps({
        "loss": history["loss"], "metrics": metrics, "table_steps": ps.table_steps,
        "version": ps.version, "cached_rows": model.inputs.embeddings.cached_rows,
    }))
    if rank == 0:  # a state_dict on rank 0 alone (no collective in it: no hang)
        np.savez(folder / "dense.npz", **{k: v.numpy() for k, v in model.state_dict().items()})


class _StopAfter(list):
    """The rank's batches, interrupted (on every rank) at batch ``n`` of epoch 2."""

    def __init__(self, batches, n: int) -> None:
        super().__init__(batches)
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        for i, batch in enumerate(list.__iter__(self)):
            if self.epoch == 1 and i == self.n:
                raise KeyboardInterrupt("stopped on purpose")
            yield batch


def resume(out: Path, case: str) -> None:
    """fit stopped inside epoch 2 with updates after its last checkpoint; each
    rank reopens its own server (rolled back to its commit) and resumes."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from tabstream.train.torch import ParameterServer, evaluate, fit

    rank, world = dist.get_rank(), dist.get_world_size()
    optimizer, cache_rows, storage = case.split(":")
    folder = out / case.replace(":", "-")
    mine = [s[rank] for s in rank_batches(world)]
    ps = server(folder / f"ps{rank}", optimizer, storage)
    ddp = DistributedDataParallel(build(ps, int(cache_rows)))
    try:
        fit(ddp, _StopAfter(mine, 2), torch.optim.Adam(ddp.parameters(), lr=0.01), epochs=2,
            checkpoint_dir=folder / "ck", progress=False)
        raise AssertionError("the run was not interrupted")
    except KeyboardInterrupt:
        pass
    ps.close()  # two steps of epoch 2 were applied after the checkpoint: rolled back
    ps = ParameterServer.open(folder / f"ps{rank}")
    torch.manual_seed(rank + 7)  # other dense weights: only the checkpoint can make it match
    model = build(ps, int(cache_rows))
    ddp = DistributedDataParallel(model)
    history = fit(ddp, mine, torch.optim.Adam(ddp.parameters(), lr=0.01), epochs=2,
                  checkpoint_dir=folder / "ck", resume=True, progress=False)
    metrics = evaluate(ddp, [s[rank] for s in rank_batches(world, seed=5)])
    _save(folder, ps, model, history, metrics)
    ps.close()


def refusals(out: Path) -> None:
    """Servers that would not train as one process are refused on every rank."""
    import torch.distributed as dist

    from tabstream.core.errors import DataError

    rank = dist.get_rank()
    messages = []
    for case in ("seed", "version", "folder"):
        folder = out / case / f"ps{rank}"
        ps = server(folder, "adagrad", "memory", seed=rank if case == "seed" else 0)
        if case == "version" and rank == 1:
            ps.apply("C1", [1], np.ones((1, 4), np.float32))
        try:
            if case == "folder":  # rank 1 hands over another rank's folder path
                ps.path = out / case / "ps0"
            build(ps, 10)
            messages.append(None)
        except DataError as exc:
            messages.append(str(exc))
        ps.close()
    (out / f"refusals{rank}.json").write_text(json.dumps(messages))


def main() -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    scenario, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        {"fit_cases": fit_cases, "refusals": refusals, "resume": resume}[scenario](out, *sys.argv[3:])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

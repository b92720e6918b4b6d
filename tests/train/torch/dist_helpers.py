"""Helpers for the multi-process torch tests: free ports, launching ranks as
subprocesses (gloo on 127.0.0.1), and a small synthetic DLRM problem that the
ranks and the single-process reference build identically."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from tabstream.core.schema import Schema

sys.path.insert(0, str(Path(__file__).parent))
from torch_data import categorical, continuous, target  # noqa: E402

WORKER = Path(__file__).with_name("dist_worker.py")
REPO = Path(__file__).resolve().parents[3]

#: table -> cardinality; "L" is a multi-hot list column
CARDINALITIES = {"C1": 50, "C2": 30, "C3": 7, "C4": 11, "L": 20}
MIXED = {"C1": "row_wise", "C2": "column_wise", "C3": "table_wise", "C4": "data_parallel",
         "L": "row_wise"}


def free_port() -> int:
    """A port nothing listens on now (bind port 0 and let the OS choose)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch(world_size: int, scenario: str, out: Path, *args: str,
           timeout: float = 240, worker: Path = WORKER) -> list[tuple[str, str]]:
    """Run ``worker scenario`` (default ``dist_worker.py``) on ``world_size`` ranks;
    return each rank's (stdout, stderr); fail with every rank's stderr when one
    fails or time runs out."""
    port = free_port()
    # PYTHONFAULTHANDLER: a rank that dies of a signal prints its threads' stacks
    # (a rank 0 of the reshard tests exited -11 without a word, twice in about 25
    # runs on one machine, not reproduced since)
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               WORLD_SIZE=str(world_size), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONFAULTHANDLER="1",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, "-W", "error", str(worker), scenario, str(out), *args],
                              env=dict(env, RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
             for r in range(world_size)]
    outputs, failed = [], []
    for r, p in enumerate(procs):
        try:
            stdout, stderr = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            stdout, stderr = p.communicate()
            failed.append(f"rank {r} timed out (a hang?):\n{stderr[-3000:]}")
            continue
        outputs.append((stdout, stderr))
        if p.returncode != 0:
            failed.append(f"rank {r} exited {p.returncode}:\n{stderr[-3000:]}")
    if failed:
        raise AssertionError("\n\n".join(failed))
    return outputs


def schema() -> Schema:
    cols = [categorical(n, c, is_list=(n == "L")) for n, c in CARDINALITIES.items()]
    return Schema([*cols, continuous("I1"), continuous("I2"), target()])


def rank_batches(seed: int, sizes: list[list[int]]) -> list[list[tuple[dict, torch.Tensor]]]:
    """``out[step][rank]`` = (features, labels) with ``sizes[step][rank]`` rows."""
    rng = np.random.default_rng(seed)
    out = []
    for step_sizes in sizes:
        step = []
        for b in step_sizes:
            f: dict = {n: torch.as_tensor(rng.integers(0, c, b), dtype=torch.long)
                       for n, c in CARDINALITIES.items() if n != "L"}
            lengths = rng.integers(0, 4, b)  # empty lists too
            values = torch.as_tensor(rng.integers(0, CARDINALITIES["L"], int(lengths.sum())))
            f["L"] = (values, torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)])))
            f["I1"] = torch.as_tensor(rng.normal(size=b), dtype=torch.float32)
            f["I2"] = torch.as_tensor(rng.normal(size=b), dtype=torch.float32)
            labels = torch.as_tensor(rng.integers(0, 2, b), dtype=torch.float32)
            step.append((f, labels))
        out.append(step)
    return out


def concat(parts: list[tuple[dict, torch.Tensor]]) -> tuple[dict, torch.Tensor]:
    """The global batch: all ranks' rows, rank 0 first."""
    features: dict = {}
    for name in parts[0][0]:
        if isinstance(parts[0][0][name], tuple):
            values = torch.cat([p[0][name][0] for p in parts])
            ends = np.cumsum([0] + [int(p[0][name][1][-1]) for p in parts])
            offsets = torch.cat([parts[0][0][name][1][:1]] + [
                p[0][name][1][1:] + int(ends[i]) for i, p in enumerate(parts)])
            features[name] = (values, offsets)
        else:
            features[name] = torch.cat([p[0][name] for p in parts])
    return features, torch.cat([p[1] for p in parts])


def build(kind: str, optimizer: str, combiner: str, seed: int = 0):
    """The model and optimizer factory every rank and the reference use."""
    from functools import partial

    from tabstream.train.torch import DLRM, LazyAdam, MultiOptimizer, split_embeddings_on_size

    torch.manual_seed(seed)
    sparse = optimizer != "sgd"
    model = DLRM(schema(), embedding_dim=6, bottom_mlp=(8,), top_mlp=(8,), sparse=sparse,
                 combiner=combiner)

    def make_optimizer(m):
        if optimizer == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.5)
        if optimizer == "lazyadam":
            return LazyAdam(m.parameters(), lr=0.05)
        large, _ = split_embeddings_on_size(m, threshold=1)
        return MultiOptimizer(partial(torch.optim.Adam, lr=0.02),
                              [(partial(LazyAdam, lr=0.05), large)], model=m)

    return model, make_optimizer


def plan_for(kind: str) -> dict[str, str]:
    return dict(MIXED) if kind == "mixed" else {n: kind for n in CARDINALITIES}


def step_sizes(world_size: int) -> list[list[int]]:
    """Three steps; the last one's batches differ in size between ranks, as the
    loader's drop_last=False gives them."""
    last = [3] + [2] * (world_size - 1)
    return [[4] * world_size, [4] * world_size, last]


def write_parquet(folder: Path, sizes: list[int], seed: int = 0) -> None:
    """Parquet files of the problem's columns, one per size (rows of unequal count)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for i, n in enumerate(sizes):
        cols: dict = {k: rng.integers(0, c, n) for k, c in CARDINALITIES.items() if k != "L"}
        cols["L"] = [rng.integers(0, CARDINALITIES["L"], rng.integers(0, 4)).tolist()
                     for _ in range(n)]
        cols["I1"] = rng.normal(size=n).astype("float32")
        cols["I2"] = rng.normal(size=n).astype("float32")
        cols["click"] = rng.integers(0, 2, n).astype("float32")
        pq.write_table(pa.Table.from_pydict(cols), folder / f"part{i}.parquet")


def read_all(folder: Path) -> tuple[dict, torch.Tensor]:
    """Every row of the parquet files as one (features, labels) batch."""
    import pandas as pd

    df = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))],
                   ignore_index=True)
    features: dict = {k: torch.as_tensor(df[k].to_numpy().copy()) for k in CARDINALITIES if k != "L"}
    lengths = df["L"].map(len).to_numpy()
    values = np.concatenate([np.asarray(v, dtype=np.int64) for v in df["L"]])
    features["L"] = (torch.as_tensor(values), torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)])))
    for k in ("I1", "I2"):
        features[k] = torch.as_tensor(df[k].to_numpy().copy())
    return features, torch.as_tensor(df["click"].to_numpy().copy())

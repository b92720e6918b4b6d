"""fit and the loader's ranks: a resume at the epoch's short last batches on the
same ranks and batch size is taken (it was refused: the loader splits the last full
batch in two so every rank has one, which makes the last two global batches short),
and a loader sharing its rows among another number of ranks than fit runs on is
refused (each row was trained twice per epoch, silently)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch import nn

import tabstream as ts
from tabstream.loaders.torch import Loader
from tabstream.train.torch import fit

REPO = Path(__file__).resolve().parents[3]


def _data(folder: Path, rows: int) -> None:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pq.write_table(pa.table({"C1": pa.array(rng.integers(0, 13, rows), pa.int64()),
                             "I1": pa.array(rng.normal(size=rows).astype("float32")),
                             "click": pa.array(rng.integers(0, 2, rows).astype("float32"))}),
                   folder / "part.parquet")


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.Embedding(13, 4)
        self.lin = nn.Linear(5, 1)

    def forward(self, f):
        return self.lin(torch.cat([self.emb(f["C1"]), f["I1"].reshape(-1, 1)], 1)).reshape(-1)


def test_a_loader_for_other_ranks_is_refused(tmp_path):
    _data(tmp_path / "data", 10)
    model = Tiny()
    loader = Loader(ts.Dataset(str(tmp_path / "data")), batch_size=4, labels=["click"], features=["C1", "I1"],
                    global_size=2, global_rank=0)
    with pytest.raises(ValueError, match=r"shares its rows among 2 rank\(s\).*fit runs on 1 rank"):
        fit(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1, progress=False)
    loader = Loader(ts.Dataset(str(tmp_path / "data")), batch_size=4, labels=["click"], features=["C1", "I1"])
    history = fit(model, loader, torch.optim.SGD(model.parameters(), lr=0.1), epochs=1, progress=False)
    assert history["samples"] == [10]  # every row once


_WORKER = textwrap.dedent('''
    import sys, torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    import contextlib
    sys.path.insert(0, sys.argv[4])
    from test_fit_loader_ranks import Tiny
    from torch_data import Crashing
    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import fit

    phase, data, out = sys.argv[1], sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo")
    model = DistributedDataParallel(Tiny())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = Loader(ts.Dataset(data), batch_size=4, labels=["click"], features=["C1", "I1"])
    if phase == "stop":
        loader = Crashing(loader, 1)  # stopped, as by a kill, after one batch
    with contextlib.suppress(KeyboardInterrupt):
        fit(model, loader, opt, epochs=1, checkpoint_dir=out + "/ck", resume=True, progress=False,
            checkpoint_every=1)
    if dist.get_rank() == 0 and phase != "stop":
        torch.save(model.module.state_dict(), out + "/final.pt")
    dist.destroy_process_group()
''')


def _launch(script: Path, *args: str) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE="2",
               OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(script), *args], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        try:
            _, err = p.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        assert p.returncode == 0, err[-3000:]


@pytest.mark.slow
def test_resuming_at_the_short_last_batches_matches_a_run_that_never_stopped(tmp_path):
    # 17 rows, 2 ranks, batch 4: rank batches [4, 4, 1] and [4, 2, 2], global 8, 6, 3;
    # stopped after the first batch, the resume starts at a short global batch of 6
    _data(tmp_path / "data", 17)
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    here = str(Path(__file__).parent)
    _launch(script, "stop", str(tmp_path / "data"), str(tmp_path / "a"), here)
    _launch(script, "resume", str(tmp_path / "data"), str(tmp_path / "a"), here)
    _launch(script, "whole", str(tmp_path / "data"), str(tmp_path / "b"), here)
    resumed = torch.load(tmp_path / "a" / "final.pt")
    whole = torch.load(tmp_path / "b" / "final.pt")
    for name, value in whole.items():
        torch.testing.assert_close(resumed[name], value, rtol=0, atol=1e-7)

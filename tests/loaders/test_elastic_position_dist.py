"""A loader's position taken on W real torch.distributed (gloo) ranks, resumed on
W' ranks: the rows delivered before and after the change are every row of the
epoch exactly once, and every rank yields the same number of batches (each step
is an all_reduce, so unequal counts would hang until the timeout)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
FILES, GROUPS = (300, 1, 170, 90), (40, 1, 60, 25)   # 561 rows in 14 row groups
GLOBAL_BATCH = 24

RANK = textwrap.dedent('''
    import json, os, sys
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    export, out, phase, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    from tabstream.loaders.torch import Loader

    loader = Loader(export, batch_size=GLOBAL_BATCH // world, shuffle=True, seed=11, parts_per_chunk=2)
    loader.set_epoch(1)
    if phase == "after":
        with open(f"{out}/position.json") as f:
            loader.core.set_position(json.load(f))
    ids, batches, length = [], 0, len(loader)
    for features, labels in loader:
        if batches == steps:
            break
        step = torch.ones(1)
        dist.all_reduce(step)      # lockstep, as training is
        ids.append(features["row_id"].numpy())
        batches += 1
    np.save(f"{out}/{phase}-rank{rank}.npy", np.concatenate(ids) if ids else np.zeros(0, np.int64))
    info = {"batches": batches, "len": length, "world": loader.global_size}
    if phase == "before":
        info["position"] = loader.core.position(1, batches)
    with open(f"{out}/{phase}-rank{rank}.json", "w") as f:
        json.dump(info, f)
    dist.destroy_process_group()
''').replace("GLOBAL_BATCH", str(GLOBAL_BATCH))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(world: int, script: Path, *args: str) -> None:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
               WORLD_SIZE=str(world), OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo",
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(script), *args], env=dict(env, RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(world)]
    failed = []
    for r, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, err = p.communicate()
            failed.append(f"rank {r} timed out (a hang?):\n{err[-3000:]}")
            continue
        if p.returncode:
            failed.append(f"rank {r} exited {p.returncode}:\n{err[-3000:]}")
    assert not failed, "\n\n".join(failed)


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.parametrize(("w", "w2"), [(1, 2), (2, 1), (2, 3), (3, 2), (4, 3)])
def test_position_from_w_ranks_resumes_on_w2_ranks(testdata, tmp_path, w, w2) -> None:
    export = testdata.write_export(tmp_path / "export", FILES, GROUPS)
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    steps = 9   # of the 24 global batches of 24 rows: 216 rows delivered before the change
    _launch(w, script, str(export), str(tmp_path), "before", str(steps))
    before = [json.loads((tmp_path / f"before-rank{r}.json").read_text()) for r in range(w)]
    assert [b["batches"] for b in before] == [steps] * w and before[0]["world"] == w
    assert all(b["position"] == before[0]["position"] for b in before)
    (tmp_path / "position.json").write_text(json.dumps(before[0]["position"]))
    _launch(w2, script, str(export), str(tmp_path), "after", "-1")
    after = [json.loads((tmp_path / f"after-rank{r}.json").read_text()) for r in range(w2)]
    left = 561 - steps * GLOBAL_BATCH
    assert {(a["batches"], a["len"]) for a in after} == {(-(-left // GLOBAL_BATCH),) * 2}
    ids = np.concatenate([np.load(tmp_path / f"{phase}-rank{r}.npy")
                          for phase, n in (("before", w), ("after", w2)) for r in range(n)])
    assert np.array_equal(np.sort(ids), np.arange(561)), "every row of the epoch exactly once"

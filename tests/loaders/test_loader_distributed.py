"""Two real torch.distributed (gloo) processes share one export: the union of their
rows is the dataset, exactly once, and their batch counts are equal (each batch
is an all_reduce, so unequal counts would hang until the timeout)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("torch")

# Spawned processes import their target by module name, which a test module
# (imported with --import-mode=importlib) has not: the ranks run as a script.
SCRIPT = textwrap.dedent('''
    import json, socket, sys
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp


    def rank_main(rank, port, export, out):
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=2, timeout=timedelta(seconds=60))
        from tabstream.loaders.torch import Loader

        for drop_last in (0, 1):
            loader = Loader(export, batch_size=300, seed=7, drop_last=bool(drop_last), shuffle=True)
            ids, batches = [], 0
            for features, labels in loader:
                step = torch.ones(1)
                dist.all_reduce(step)
                ids.append(features["row_id"].numpy())
                batches += 1
            np.save(f"{out}/rank{rank}_{drop_last}.npy", np.concatenate(ids))
            with open(f"{out}/rank{rank}_{drop_last}.json", "w") as f:
                json.dump({"batches": batches, "len": len(loader),
                           "size": loader.global_size, "rank": loader.global_rank}, f)
        dist.destroy_process_group()


    if __name__ == "__main__":
        export, out = sys.argv[1], sys.argv[2]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(rank_main, nprocs=2, args=(port, export, out), join=True)
''')


@pytest.mark.slow
@pytest.mark.torch
def test_two_gloo_ranks_share_the_rows(shared_export: Path, testdata: Any, tmp_path: Path) -> None:
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(shared_export), str(tmp_path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for drop_last in (0, 1):
        info = [json.loads((tmp_path / f"rank{r}_{drop_last}.json").read_text()) for r in range(2)]
        assert [(i["size"], i["rank"]) for i in info] == [(2, 0), (2, 1)], "group defaults"
        assert info[0]["batches"] == info[1]["batches"] == info[0]["len"] == info[1]["len"]
        ids = np.concatenate([np.load(tmp_path / f"rank{r}_{drop_last}.npy") for r in range(2)])
        assert len(np.unique(ids)) == len(ids)
        if drop_last:
            assert len(ids) == testdata.N // 600 * 600
        else:
            assert np.array_equal(np.sort(ids), np.arange(testdata.N))

"""One rank of test_torch_training_inputs' sharded-checkpoint test (run by
dist_helpers.launch): a HybridParallel model trains an epoch with a sharded
checkpoint, then, every file capped by RLIMIT_FSIZE (SIGXFSZ ignored: a write past
the cap fails with EFBIG, as on a full disk), trains another; prints JSON."""

from __future__ import annotations

import json
import os
import resource
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).parent))
import dist_helpers as h  # noqa: E402

from tabstream.train.torch.distributed import HybridParallel  # noqa: E402


def main() -> None:
    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch import LazyAdam, fit

    torch.set_num_threads(1)
    out, data = Path(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    try:
        model, _ = h.build("mixed", "lazyadam", "mean")
        hp = HybridParallel(model, plan=h.plan_for("mixed"))
        opt = LazyAdam(hp.parameters(), lr=0.05)
        train = Loader(ts.Dataset(str(data / "*.parquet")), batch_size=4, labels=["click"], seed=3,
                       shuffle=True)
        ck = out / "ck"
        fit(hp, train, opt, epochs=1, checkpoint_dir=ck, progress=False)
        dist.barrier()
        before = sorted(os.listdir(ck)), (ck / "checkpoint.dcp.json").read_text()
        state = sum(t.numel() * t.element_size() for t in hp.state_dict().values()
                    if isinstance(t, torch.Tensor))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        # room for the write check (the state), not for the state with LazyAdam's moments
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(1.5 * state), resource.RLIM_INFINITY))
        try:
            fit(hp, train, opt, epochs=2, checkpoint_dir=ck, resume=True, progress=False)
            error = None
        except Exception as exc:
            error = [type(exc).__name__, str(exc)]
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        dist.barrier()
        after = sorted(os.listdir(ck)), (ck / "checkpoint.dcp.json").read_text()
        print(json.dumps({"error": error, "same": before == after, "pointer_same": before[1] == after[1],
                          "listing": after[0], "before": before[0]}))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

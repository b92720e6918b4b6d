"""One worker of the multi-worker NaN test (run as a script): ``framework out_dir``.

torch: a torch.distributed gloo rank (RANK, WORLD_SIZE, MASTER_ADDR/PORT from the
environment); tensorflow: a MultiWorkerMirroredStrategy worker (TF_CONFIG). Each
evaluates a validation set of 5 (worker 0) or 3 (worker 1) rows three times, then
trains 3 batches with a checkpoint after every step; worker 1's second batch holds
a NaN feature. Writes result_<rank>.json and valid_<rank>.npz to out_dir."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
sys.path.insert(0, str(Path(__file__).parent))

import numpy as np  # noqa: E402
from frameworks import numpy_batches  # noqa: E402


def main() -> None:
    framework, out = sys.argv[1], Path(sys.argv[2])
    rank = int(os.environ["RANK"])
    train = numpy_batches(10 + rank, 3, rows=4)
    if rank == 1:
        train[1][0]["I1"][2] = np.nan
    valid = numpy_batches(20 + rank, 1, rows=5 - 2 * rank)
    result: dict = {}
    if framework == "torch":
        import torch
        import torch.distributed as dist
        from frameworks import Torch

        dist.init_process_group("gloo")
        fw = Torch()
        from tabstream.train.torch import evaluate

        model, opt = fw.build(seed=0)
        v = [fw.batch(f, y) for f, y in valid]
        for _ in range(3):
            metrics = evaluate(model, v)
        with torch.no_grad():
            logits = model(v[0][0]).reshape(-1).numpy()
        run = lambda: fw.fit(model, [fw.batch(f, y) for f, y in train], opt,  # noqa: E731
                             checkpoint_dir=out / "ck", checkpoint_every=1, progress=False)
    else:
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        from frameworks import Keras

        from tabstream.train.tensorflow import evaluate

        fw = Keras()
        with strategy.scope():
            model, opt = fw.build(seed=0)
        v = [fw.batch(f, y) for f, y in valid]
        for _ in range(3):
            metrics = evaluate(model, v, strategy=strategy)
        logits = np.asarray(model(v[0][0])).reshape(-1)
        run = lambda: fw.fit(model, [fw.batch(f, y) for f, y in train], opt,  # noqa: E731
                             checkpoint_dir=out / "ck", checkpoint_every=1, progress=False,
                             strategy=strategy)
    np.savez(out / f"valid_{rank}.npz", logits=logits, labels=valid[0][1])
    result["val_log_loss"] = metrics["log_loss"]
    try:
        run()
        result["error"] = None
    except Exception as exc:  # the test reads what each worker raised
        result["error"], result["message"] = type(exc).__name__, str(exc)
    result["position"] = list(fw.position(out / "ck") or ())
    (out / f"result_{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()

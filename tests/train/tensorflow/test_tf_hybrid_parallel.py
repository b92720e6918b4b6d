"""Keras HybridParallel under MultiWorkerMirroredStrategy: W real worker processes
(TF_CONFIG on 127.0.0.1, hybrid_worker.py) train exactly as one process on the
concatenated global batch: the loss of every step and every weight (tables whole,
from full_weights on each worker) within 1e-5, for each sharding type, a mixed plan,
LazyAdam and MultiOptimizer, a last global batch the workers split unevenly, and a
resume from the per-worker checkpoint. Per-id lookups are checked against the
unsharded tables."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tensorflow]

WORKER = Path(__file__).with_name("hybrid_worker.py")
ROOT = Path(__file__).resolve().parents[3]
ATOL = 1e-5


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _env(tf_config: dict | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


def _run(world: int, out: Path, cases: list[str]) -> None:
    """``world`` workers (or, with 0, the one-process reference) run ``cases``."""
    out.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, str(WORKER), str(out), ",".join(cases)]
    if world == 0:
        subprocess.run(args, env=_env(None), check=True, timeout=600)
        return
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(world)]}
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env({"cluster": cluster, "task": {"type": "worker",
                                                                     "index": i}}))
             for i in range(world)]
    outputs = []
    try:
        for p in procs:  # a hang (workers out of step) ends here, not in CI's timeout
            outputs.append(p.communicate(timeout=900)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"worker {i} of {world} failed:\n{outputs[i][-4000:]}"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("one_process")
    _run(0, out, ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed"])
    return out


def _assert_like_one_process(reference: Path, out: Path, world: int, case: str) -> None:
    expected = np.load(reference / f"{case.replace('mixed_resume', 'mixed')}_0.npz")
    parts = [np.load(out / f"{case}_{rank}.npz") for rank in range(world)]
    losses = sorted(k for k in expected.files if k.startswith("loss__"))
    assert len(losses) == 3
    for rank, got in enumerate(parts):
        assert sorted(got.files) == sorted(expected.files), case
        for key in expected.files:
            np.testing.assert_allclose(got[key], expected[key], rtol=0, atol=ATOL,
                                       err_msg=f"{case}: worker {rank} of {world}: {key}")
        for key in expected.files:  # whole weights: the same on every worker, bit for bit
            np.testing.assert_array_equal(got[key], parts[0][key], err_msg=f"{case}: {key}")
    # the test can fail: training moved every weight by far more than the tolerance
    start = np.load(reference / "initial.npz")
    assert sorted(start.files) == sorted(k for k in expected.files if not k.startswith("loss__"))
    if case.startswith("mixed"):
        for key in start.files:  # the tables' rows of the batches and the dense weights
            assert float(np.abs(expected[key] - start[key]).max()) > 100 * ATOL, key


def _assert_per_id(out: Path, world: int) -> None:
    for rank in range(world):
        got = np.load(out / f"per_id_{rank}.npz")
        keys = [k[: -len("__got")] for k in got.files if k.endswith("__got")]
        assert len(keys) == 4 * 5  # 4 sharding types x (2 lists x (vectors, mask) + item)
        for key in keys:
            np.testing.assert_allclose(got[key + "__got"], got[key + "__expected"], rtol=0,
                                       atol=1e-7, err_msg=f"worker {rank}: {key}")
        # the ragged list's vectors are [B, longest list of the batch, dim]
        assert got["row_wise__seq__vectors__got"].ndim == 3


def test_two_workers_mixed_plan_multi_optimizer_like_one_process(reference, tmp_path):
    _run(2, tmp_path, ["mixed", "per_id"])
    _assert_like_one_process(reference, tmp_path, 2, "mixed")
    _assert_per_id(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_sharding_type_and_resume_like_one_process(reference, tmp_path, world):
    cases = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed_resume"]
    if world == 3:
        cases += ["per_id"]
    _run(world, tmp_path, cases)
    for case in cases:
        if case != "per_id":
            _assert_like_one_process(reference, tmp_path, world, case)
    if world == 3:
        _assert_per_id(tmp_path, world)
    assert sorted(os.listdir(tmp_path / "ck")) == [f"worker-{r}-of-{world}" for r in range(world)]


# ------------------------------------------------------------- one process, errors


def _dlrm():
    from hybrid_worker import make_model

    return make_model(0)


def test_errors_name_the_fix(tmp_path):
    import tensorflow as tf

    from tabstream.train.checks import CheckpointError
    from tabstream.train.tensorflow.distributed import HybridParallel

    with pytest.raises(TypeError, match="HybridParallel wraps a keras.Model, got list"):
        HybridParallel([])
    model = _dlrm()
    model(model.example_batch())
    with pytest.raises(ValueError, match="'dlrm' has been called already; wrap the model right "
                       "after constructing it"):
        HybridParallel(model)
    with pytest.raises(ValueError, match="plan='rows' is not a strategy; give one of"):
        HybridParallel(_dlrm(), plan="rows")
    with pytest.raises(ValueError, match="the plan names table 'nope', which the model does "
                       "not have"):
        HybridParallel(_dlrm(), plan={"nope": "row_wise"})
    hp = HybridParallel(_dlrm(), plan="row_wise")  # one worker: the default strategy
    assert dict(hp.plan) == {"cat_0": "row_wise", "cat_1": "row_wise", "cat_2": "row_wise",
                             "tags": "row_wise"}
    with pytest.raises(CheckpointError, match=r"has no part for worker 0 of 1 \(found \[\]\); "
                       "restore with the plan and number of workers it was saved with"):
        hp.restore_checkpoint(tmp_path)
    from hybrid_worker import as_tf, global_batches

    batch = as_tf(global_batches()[0][0])
    # one worker's exchange, through strategy.run: the plain model's logits
    np.testing.assert_allclose(hp.predict(batch), _dlrm()(batch).numpy(), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="looked up in the cross-replica context; call the "
                       "model inside strategy.run"):
        with tf.distribute.get_strategy().scope():
            tf.distribute.get_replica_context().merge_call(
                lambda _: hp(batch))

"""``tabstream.train.tensorflow.fit`` trains a Keras ``HybridParallel`` (mixed plan:
a table-wise, a row-wise, a column-wise table and a row-wise list table; a
MultiOptimizer) on two real MultiWorkerMirroredStrategy workers (TF_CONFIG on
127.0.0.1). Both workers die in the middle of the epoch (after two steps, each
checkpointed by every worker into its own part); two new processes, built from
other initial weights, resume from the parts and finish the epoch. The end is the
uninterrupted run of one process training the plain model on the concatenated
global batches (``hybrid_worker.reference``): every weight (tables whole) within
1e-5, the epoch's loss over all rows, and validation metrics over both workers'
rows.

Run as a script, this file is one worker: ``argv = out_dir phase`` (``train``: the
fit that dies; ``resume``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script: the helper modules beside it
    sys.path.insert(0, str(HERE))

DIED = 17  # the exit code of a worker that dies mid-epoch
DIE_BEFORE = 2  # the batch whose fetch kills the workers (two steps are done and saved)


# ------------------------------------------------------------------ the worker


def _worker(out: Path, phase: str) -> None:
    import json

    import tensorflow as tf
    from hybrid_worker import MIXED, as_tf, global_batches, make_model, make_optimizer

    from tabstream.train.tensorflow import fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank = int(json.loads(os.environ["TF_CONFIG"])["task"]["index"])
    world = strategy.num_replicas_in_sync

    def mine(feats, y):
        rows = np.array_split(np.arange(len(y)), world)[rank]
        return as_tf({k: v[rows] for k, v in feats.items()}), tf.constant(y[rows])

    batches = [mine(f, y) for f, y in global_batches()]
    valid = batches[:1]

    class Dies:
        """This worker's batches; fetching batch DIE_BEFORE kills the process."""

        def __iter__(self):
            for i, batch in enumerate(batches):
                if i == DIE_BEFORE:
                    sys.stdout.flush()
                    os._exit(DIED)
                yield batch

    def build(seed):
        with strategy.scope():
            model = make_model(seed)
            optimizer = make_optimizer("multi", model)
            wrapper = HybridParallel(model, plan=MIXED)
        return model, wrapper, optimizer

    def record(name, wrapper, history):
        result = {f"history__{k}": np.asarray(v, np.float64) for k, v in history.items()}
        result.update(wrapper.full_weights())
        result["valid_logits"] = wrapper.predict(valid[0][0])
        result["valid_labels"] = valid[0][1].numpy()
        np.savez(out / f"{name}_{rank}.npz", **result)

    if phase == "train":
        model, _, optimizer = build(0)
        # the wrapped model itself, as a user who kept only `model` would pass it
        fit(model, Dies(), optimizer, valid_loader=valid, progress=False,
            checkpoint_dir=out / "ck", checkpoint_every=1)
        raise AssertionError("the loader should have ended this process")
    # a new process, other initial weights: all that counts comes from the checkpoint
    _, wrapper, optimizer = build(5)
    history = fit(wrapper, batches, optimizer, valid_loader=valid, progress=False,
                  checkpoint_dir=out / "ck", checkpoint_every=1, resume=True)
    record("resumed", wrapper, history)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    _worker(Path(sys.argv[1]), sys.argv[2])
    sys.exit(0)


# ------------------------------------------------------------------ the test

pytest.importorskip("tensorflow")

from test_tf_hybrid_parallel import ATOL, _env, _free_ports  # noqa: E402

pytestmark = [pytest.mark.tensorflow]


def _launch(world: int, out: Path, phase: str, expect: int) -> None:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(world)]}
    procs = [subprocess.Popen([sys.executable, __file__, str(out), phase],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env({"cluster": cluster,
                                        "task": {"type": "worker", "index": i}}))
             for i in range(world)]
    outputs = []
    try:
        for p in procs:  # a hang (workers out of step) ends here, not in CI's timeout
            outputs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == expect, (f"{phase}: worker {i} of {world} exited "
                                        f"{p.returncode}, not {expect}:\n{outputs[i][-4000:]}")


def _auc(y: np.ndarray, s: np.ndarray) -> float:
    """The probability that a positive outscores a negative (ties half)."""
    pos, neg = s[y == 1], s[y == 0]
    return float(((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean())


@pytest.mark.slow  # two launches of two TensorFlow workers: minutes on a loaded machine
def test_fit_trains_hybrid_parallel_like_one_process_and_resumes_after_a_crash(tmp_path):
    from hybrid_worker import GLOBAL_BATCHES, reference

    ref_dir = tmp_path / "reference"
    ref_dir.mkdir()
    reference("mixed", str(ref_dir))  # one process, plain DLRM, the global batches
    expected = np.load(ref_dir / "mixed_0.npz")
    initial = np.load(ref_dir / "initial.npz")
    weights = sorted(initial.files)
    step_losses = np.array([float(expected[f"loss__{k}"]) for k in range(len(GLOBAL_BATCHES))])
    epoch_loss = float((step_losses * np.array(GLOBAL_BATCHES)).sum() / sum(GLOBAL_BATCHES))

    out = tmp_path / "run"
    out.mkdir()
    _launch(2, out, "train", expect=DIED)
    _launch(2, out, "resume", expect=0)

    parts = [np.load(out / f"resumed_{rank}.npz") for rank in range(2)]
    for rank, got in enumerate(parts):
        where = f"worker {rank} of 2"
        assert sorted(k for k in got.files if "__" not in k and not k.startswith("valid")) \
            == weights, where
        for key in weights:
            np.testing.assert_allclose(got[key], expected[key], rtol=0, atol=ATOL,
                                       err_msg=f"{where}: {key}")
            np.testing.assert_array_equal(got[key], parts[0][key], err_msg=f"{where}: {key}")
        # the epoch's loss over all rows: the steps before the crash come from the checkpoint
        np.testing.assert_allclose(got["history__loss"], [epoch_loss], rtol=0, atol=ATOL,
                                   err_msg=where)
        assert got["history__samples"].tolist() == [sum(GLOBAL_BATCHES)], where
        # validation over both workers' rows (worker 0's first), as numpy computes it
        logits = np.concatenate([p["valid_logits"] for p in parts]).astype(np.float64)
        labels = np.concatenate([p["valid_labels"] for p in parts]).astype(np.float64)
        assert len(labels) == GLOBAL_BATCHES[0]
        bce = np.mean(np.logaddexp(0.0, logits) - labels * logits)
        np.testing.assert_allclose(got["history__val_loss"], [bce], rtol=0, atol=1e-5,
                                   err_msg=where)
        np.testing.assert_allclose(got["history__val_auc"], [_auc(labels, logits)], rtol=0,
                                   atol=1e-6, err_msg=where)
    # the test can fail: training moved every weight by far more than the tolerance
    for key in weights:
        assert float(np.abs(expected[key] - initial[key]).max()) > 100 * ATOL, key
    # each worker wrote its own part; a part keeps its newest save and the one before
    assert sorted(os.listdir(out / "ck")) == ["worker-0-of-2", "worker-1-of-2"]
    for part in ("worker-0-of-2", "worker-1-of-2"):
        assert sorted(os.listdir(out / "ck" / part)) == ["step-3-0-3", "step-3-1-0"], part


@pytest.mark.slow  # a stopped fit, then two resumed ones
def test_one_worker_checkpoints_resume_mid_epoch_like_the_uninterrupted_run(tmp_path, capsys):
    """The per-worker checkpoint files on one worker (the default strategy): a fit
    that stops mid-epoch and a rebuilt model resuming it end where the plain model's
    uninterrupted fit does; a model of another plan resumes it too (resharded)."""
    import tensorflow as tf
    from hybrid_worker import MIXED, as_tf, global_batches, make_model, make_optimizer

    from tabstream.train.tensorflow import fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    batches = [(as_tf(f), tf.constant(y)) for f, y in global_batches()]

    class Stops:
        def __iter__(self):
            for i, batch in enumerate(batches):
                if i == DIE_BEFORE:
                    raise KeyboardInterrupt("stopped mid-epoch")
                yield batch

    plain = make_model(0)
    plain_optimizer = make_optimizer("multi", plain)
    expected = fit(plain, batches, plain_optimizer, progress=False)

    def build(seed, plan):  # the optimizer's claims name the tables before they are sharded
        model = make_model(seed)
        optimizer = make_optimizer("multi", model)
        return HybridParallel(model, plan=plan), optimizer

    wrapper, optimizer = build(0, MIXED)
    with pytest.raises(KeyboardInterrupt):
        fit(wrapper, Stops(), optimizer, progress=False, checkpoint_dir=tmp_path,
            checkpoint_every=1)
    assert sorted(os.listdir(tmp_path / "worker-0-of-1")) == ["step-1-0-1", "step-2-0-2"]
    wrapper, optimizer = build(5, MIXED)
    got = fit(wrapper, batches, optimizer, progress=False, checkpoint_dir=tmp_path,
              checkpoint_every=1, resume=True)
    np.testing.assert_allclose(got["loss"], expected["loss"], rtol=0, atol=1e-6)
    weights = wrapper.full_weights()
    assert sorted(weights) == sorted(v.path for v in plain.weights)
    for v in plain.weights:
        np.testing.assert_allclose(weights[v.path], v.numpy(), rtol=0, atol=1e-5, err_msg=v.path)
    assert sorted(os.listdir(tmp_path / "worker-0-of-1")) == ["step-3-0-3", "step-3-1-0"]
    # another plan on as many workers: the tables and their optimizer state are resharded,
    # and a second epoch trains on as the plain model's does
    capsys.readouterr()
    other, optimizer = build(3, "row_wise")
    fit(other, batches, optimizer, epochs=2, progress=False, checkpoint_dir=tmp_path,
        resume=True)
    fit(plain, batches, plain_optimizer, progress=False)
    said = [line for line in capsys.readouterr().out.splitlines() if "another plan" in line]
    assert len(said) == 1 and said[0].startswith(
        f"fit: checkpoint {tmp_path} was written with another plan; resuming on 1 worker(s) "
        "with this one: tables and optimizer state resharded"), said
    weights = other.full_weights()
    for v in plain.weights:
        np.testing.assert_allclose(weights[v.path], v.numpy(), rtol=0, atol=1e-5, err_msg=v.path)

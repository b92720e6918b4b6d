"""Keras resharding with real MultiWorkerMirroredStrategy workers (TF_CONFIG on
127.0.0.1, reshard_keras_worker.py): each case trains epoch 1 through ``fit`` on 2
workers and is stopped, resumes with ``fit(resume=True)`` on 1 worker for epoch 2
(2 -> 1) and is stopped, then on 2 workers for epoch 3 (1 -> 2). After every phase
the weights equal those of one process training the plain model on every global
batch without a stop (table-, row-, column-wise, data-parallel, a mixed plan with a
MultiOptimizer and with Adagrad), the resume says so in one line, a checkpoint of
another model or optimizer is refused naming what differs, and the real 2-worker
checkpoint converts offline (``tabstream reshard``) to 1 worker (the unwrapped
model's single-process fit resumes it) and to 3 (each worker's regions where the
new plan puts them)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from reshard_keras_worker import CASES, EPOCH_STEPS, EPOCHS, global_batches  # noqa: E402
from test_tf_hybrid_parallel import ATOL, _env, _free_ports  # noqa: E402

WORKER = Path(__file__).with_name("reshard_keras_worker.py")
pytestmark = [pytest.mark.tensorflow, pytest.mark.slow]  # three launches of TF workers


def _launch(world: int, out: Path, phase: str) -> list[str]:
    cluster = {"worker": [f"127.0.0.1:{p}" for p in _free_ports(world)]}
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(out), phase],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=_env({"cluster": cluster,
                                        "task": {"type": "worker", "index": i}}))
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
        assert p.returncode == 0, f"{phase}: worker {i} of {world} failed:\n{outputs[i][-4000:]}"
    return outputs


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("keras_reshard")
    said = {"a": _launch(2, out, "a")}
    stopped = out / "stopped"
    for ck in out.glob("ck-*"):  # the 2-worker checkpoints, for the offline tests
        shutil.copytree(ck, stopped / ck.name)
    said["b"] = _launch(1, out, "b")
    said["c"] = _launch(2, out, "c")
    return out, said


def _reference(case: str) -> list[dict[str, np.ndarray]]:
    """One process, the plain model, every global batch: the weights after each epoch."""
    import tensorflow as tf
    from hybrid_worker import as_tf, make_model
    from reshard_keras_worker import make_optimizer

    from tabstream.train.tensorflow import fit

    model = make_model(0)
    optimizer = make_optimizer(case.split(":")[1], model)
    batches = [(as_tf(f), tf.constant(y)) for f, y in global_batches()]
    out = []
    for e in range(EPOCHS):
        fit(model, batches[e * EPOCH_STEPS:(e + 1) * EPOCH_STEPS], optimizer, progress=False)
        out.append({v.path: np.asarray(v.numpy()) for v in model.weights})
    return out


@pytest.mark.parametrize("case", CASES)
def test_resumed_on_other_worker_counts_equals_one_process_that_never_stopped(runs, case):
    out, said = runs
    expected = _reference(case)
    tag = case.replace(":", "-")
    for epoch, phase in enumerate("abc"):
        got = np.load(out / f"{phase}-{tag}.npz")
        assert sorted(got.files) == sorted(expected[epoch]), phase
        for key, value in expected[epoch].items():
            np.testing.assert_allclose(got[key], value, rtol=0, atol=ATOL,
                                       err_msg=f"{case}: after phase {phase}: {key}")
    # the test can fail: each epoch moved every weight by far more than the tolerance
    for key in expected[0]:
        assert float(np.abs(expected[2][key] - expected[1][key]).max()) > 100 * ATOL, key
    # one line on worker 0 says what happened, none on the others
    ck = out / f"ck-{tag}"
    for phase, before, now, epoch in (("b", 2, 1, 2), ("c", 1, 2, 3)):
        lines = [line for line in said[phase][0].splitlines() if f"checkpoint {ck} " in line]
        assert len(lines) == 1, (phase, said[phase][0][-3000:])
        assert lines[0].startswith(
            f"fit: checkpoint {ck} was written by {before} workers, this run has {now}: "
            f"training continues at epoch {epoch}; tables and "
            "optimizer state resharded ("), lines[0]
        assert lines[0].endswith(" bytes read on worker 0)"), lines[0]
        assert not any(f"checkpoint {ck} " in text for text in said[phase][1:])


def test_refusals_name_what_differs_and_the_fix(runs):
    out, _ = runs
    errors = json.loads((out / "refusals.json").read_text())
    assert "'cat_0/embeddings' has shape (30, 8) in the checkpoint, (30, 16) in the model" \
        in errors["model"]
    assert "resume=False" in errors["model"]
    assert "its optimizer (multi: ['Adam', 'LazyAdam']) differs from this run's (single: " \
        "['LazyAdam']); build the optimizer as the checkpointed run did" in errors["optimizer"]


@pytest.mark.parametrize("case", ["mixed:multi", "mixed:adagrad", "row_wise:multi"])
def test_real_two_worker_checkpoint_reshards_offline(runs, tmp_path, case, capsys):
    import tensorflow as tf
    from hybrid_worker import MIXED, as_tf, make_model
    from reshard_keras_worker import Epochs, make_optimizer
    from test_keras_reshard import assert_parts_hold_their_regions

    from tabstream.cli import main
    from tabstream.train.tensorflow import fit

    out, _ = runs
    tag = case.replace(":", "-")
    src = out / "stopped" / f"ck-{tag}"
    # to one process: the unwrapped model's fit resumes it and trains epoch 2 as one
    # process that never stopped
    assert main(["reshard", str(src), str(tmp_path / "one"), "--world-size", "1"]) in (0, None)
    assert f"wrote a single-process checkpoint: {tmp_path / 'one'}" in capsys.readouterr().out
    model = make_model(3)
    optimizer = make_optimizer(case.split(":")[1], model)
    batches = [(as_tf(f), tf.constant(y)) for f, y in global_batches()]
    try:
        fit(model, Epochs(batches, stop=2), optimizer, epochs=EPOCHS, progress=False,
            checkpoint_dir=tmp_path / "one", resume=True)
    except KeyboardInterrupt:
        pass
    expected = _reference(case)[1]
    for v in model.weights:
        np.testing.assert_allclose(v.numpy(), expected[v.path], rtol=0, atol=ATOL, err_msg=v.path)
    # to three workers with the mixed plan: each part holds its regions, slots with them
    written = main(["reshard", str(src), str(tmp_path / "three"), "--world-size", "3",
                    "--plan", ",".join(f"{k}={v}" for k, v in MIXED.items())])
    assert written in (0, None)
    assert_parts_hold_their_regions(src, tmp_path / "three", 3, MIXED,
                                    np.load(out / f"a-{tag}.npz"))

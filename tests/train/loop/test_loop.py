"""One training loop for both frameworks (tabstream.train.loop): the same behaviour
asserted on torch's and Keras' ``fit``: a mid-epoch resume ends with the weights of
the run that never stopped, ``checkpoint_every`` checkpoints at those steps, a new
file list after a finished one is a new pass, another list while one is unfinished
is refused, and a NaN loss on one worker stops every worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from frameworks import FRAMEWORKS, numpy_batches

from tabstream.core.errors import DataError
from tabstream.train.loop import NonFiniteLossError, NothingToTrainWarning

ROOT = Path(__file__).resolve().parents[3]
WORKER = Path(__file__).with_name("loop_worker.py")


@pytest.fixture(params=["torch", "tensorflow"])
def fw(request):
    pytest.importorskip(request.param)
    return FRAMEWORKS[request.param]()


class Crash(RuntimeError):
    pass


class Day(list):
    """A file list: batches, a data identity (as a tabstream Loader's files give),
    and optionally a crash after ``crash_after`` batches of epoch ``crash_epoch``."""

    def __init__(self, name, batches, crash_after=None, crash_epoch=0):
        super().__init__(batches)
        self.data_id = name
        self.crash_after, self.crash_epoch, self.epoch = crash_after, crash_epoch, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i, batch in enumerate(list.__iter__(self)):
            if self.epoch == self.crash_epoch and i == self.crash_after:
                raise Crash(f"killed before batch {i + 1}")
            yield batch


def day(fw, name, seed, n=6, **kwargs):
    return Day(name, [fw.batch(f, y) for f, y in numpy_batches(seed, n)], **kwargs)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)


def test_mid_epoch_resume_equals_the_run_that_never_stopped(fw, tmp_path):
    model, opt = fw.build(seed=0)
    whole = fw.fit(model, day(fw, "mon", 1), opt, epochs=2, progress=False)
    expected = fw.weights(model)

    ck = tmp_path / "ck"
    model, opt = fw.build(seed=0)
    with pytest.raises(Crash):  # killed after 3 batches of epoch 2: checkpoint at 2
        fw.fit(model, day(fw, "mon", 1, crash_after=3, crash_epoch=1), opt, epochs=2,
               checkpoint_dir=ck, checkpoint_every=2, progress=False)
    assert fw.position(ck) == (1, 2)
    model, opt = fw.build(seed=5)  # another start: everything comes from the checkpoint
    resumed = fw.fit(model, day(fw, "mon", 1), opt, epochs=2, checkpoint_dir=ck, resume=True,
                     progress=False)
    assert_same_weights(fw.weights(model), expected)
    assert resumed["epoch"] == [1, 2]
    assert resumed["samples"] == whole["samples"] == [48, 48]
    np.testing.assert_allclose(resumed["loss"], whole["loss"], rtol=1e-6)
    assert fw.position(ck) == (2, 0)


@pytest.mark.parametrize("every", [1, 2, 4])
def test_checkpoint_every_writes_at_those_steps(fw, tmp_path, every):
    for crash_after in (1, 3, 5):
        ck = tmp_path / f"ck{crash_after}"
        model, opt = fw.build()
        with pytest.raises(Crash):
            fw.fit(model, day(fw, "mon", 1, crash_after=crash_after), opt,
                   checkpoint_dir=ck, checkpoint_every=every, progress=False)
        last = crash_after // every * every
        assert fw.position(ck) == ((0, last) if last else None), (every, crash_after)


def test_a_new_file_list_after_a_finished_one_is_a_new_pass(fw, tmp_path):
    mon, tue = day(fw, "mon", 1), day(fw, "tue", 2)
    model, opt = fw.build()
    fw.fit(model, mon, opt, progress=False)
    fw.fit(model, tue, opt, progress=False)
    expected = fw.weights(model)

    ck = tmp_path / "ck"
    model, opt = fw.build()
    fw.fit(model, mon, opt, checkpoint_dir=ck, resume=True, progress=False)
    model, opt = fw.build(seed=3)
    history = fw.fit(model, tue, opt, checkpoint_dir=ck, resume=True, progress=False)
    assert_same_weights(fw.weights(model), expected)
    assert history["epoch"] == [1, 1]  # mon's epoch, then tue's: a pass each
    # the same list again is not trained twice
    with pytest.warns(NothingToTrainWarning, match=r"already holds 1 trained epoch"):
        fw.fit(model, tue, opt, checkpoint_dir=ck, resume=True, progress=False)
    assert_same_weights(fw.weights(model), expected)


def test_fit_lists_trains_each_list_once_across_restarts(fw, tmp_path):
    days = [day(fw, "mon", 1), day(fw, "tue", 2), day(fw, "wed", 3)]
    model, opt = fw.build()
    for d in days:
        fw.fit(model, d, opt, progress=False)
    expected = fw.weights(model)

    ck = tmp_path / "ck"
    model, opt = fw.build()
    assert len(fw.fit_lists(model, days[:2], opt, checkpoint_dir=ck, progress=False)) == 2
    model, opt = fw.build(seed=9)  # the job restarts; wed arrived
    assert len(fw.fit_lists(model, days, opt, checkpoint_dir=ck, progress=False)) == 1
    assert_same_weights(fw.weights(model), expected)


def test_another_list_while_one_is_unfinished_is_refused(fw, tmp_path):
    ck = tmp_path / "ck"
    model, opt = fw.build()
    with pytest.raises(Crash):
        fw.fit(model, day(fw, "mon", 1, crash_after=3), opt, checkpoint_dir=ck,
               checkpoint_every=1, progress=False)
    with pytest.raises(DataError, match=r"stopped inside another file list \(epoch 1, after 3 "
                       r"batches; data mon, this loader's data tue\)"):
        fw.fit(model, day(fw, "tue", 2), opt, checkpoint_dir=ck, resume=True, progress=False)
    assert fw.position(ck) == (0, 3)


def test_checkpoint_every_is_checked(fw, tmp_path):
    model, opt = fw.build()
    with pytest.raises(ValueError, match=r"fit: checkpoint_every needs a checkpoint_dir"):
        fw.fit(model, day(fw, "mon", 1), opt, checkpoint_every=2, progress=False)
    with pytest.raises(ValueError, match=r"fit: checkpoint_every must be >= 1 step, got 0"):
        fw.fit(model, day(fw, "mon", 1), opt, checkpoint_every=0, checkpoint_dir=tmp_path,
               progress=False)


def test_one_error_class_for_both_frameworks(fw):
    import importlib

    package = importlib.import_module(f"tabstream.train.{fw.name}")
    fit_module = importlib.import_module(f"tabstream.train.{fw.name}.fit")
    assert package.NonFiniteLossError is fit_module.NonFiniteLossError is NonFiniteLossError
    assert package.NothingToTrainWarning is NothingToTrainWarning
    assert issubclass(NonFiniteLossError, FloatingPointError)


# -- several workers -------------------------------------------------------------------


def _free_ports(n):
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _launch(framework, world, out):
    """``loop_worker.py`` on ``world`` workers: torch.distributed (gloo) ranks or
    MultiWorkerMirroredStrategy workers, on 127.0.0.1."""
    ports = _free_ports(world)
    base = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    base.update(PYTHONPATH=os.pathsep.join([str(ROOT), base.get("PYTHONPATH", "")]),
                OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="1",
                MASTER_ADDR="127.0.0.1", MASTER_PORT=str(ports[0]), WORLD_SIZE=str(world),
                GLOO_SOCKET_IFNAME="lo")
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for r in range(world):
        env = dict(base, RANK=str(r))
        if framework == "tensorflow":
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": r}})
        procs.append(subprocess.Popen([sys.executable, str(WORKER), framework, str(out)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=240)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for r, p in enumerate(procs):
        assert p.returncode == 0, f"worker {r} failed:\n{outputs[r][-4000:]}"
    return outputs


# two MultiWorkerMirroredStrategy processes take about a minute on 2 busy cores
@pytest.mark.parametrize("framework", ["torch", pytest.param("tensorflow", marks=pytest.mark.slow)])
def test_a_nan_loss_on_one_worker_stops_every_worker(framework, tmp_path):
    pytest.importorskip(framework)
    outputs = _launch(framework, 2, tmp_path)
    for r, text in enumerate(outputs):
        result = json.loads((tmp_path / f"result_{r}.json").read_text())
        # NaN only in worker 1's second batch; both raise at step 2, the first step applied
        assert result["error"] == "NonFiniteLossError", text[-3000:]
        assert "at epoch 1/1, step 2 (global step 2)" in result["message"]
        assert result["position"] == [0, 1]
        # the validation gather (every worker's rows, 5 and 3 of them, three times)
        # traces once: no retracing warnings
        assert "retracing" not in text, text[-3000:]
    # validation is over both workers' rows, the same on each: numpy's log-loss of them
    parts = [np.load(tmp_path / f"valid_{r}.npz") for r in range(2)]
    y = np.concatenate([p["labels"] for p in parts])
    z = np.concatenate([p["logits"] for p in parts]).astype(np.float64)
    expected = float(np.mean(np.logaddexp(0.0, z) - y * z))
    for r in range(2):
        got = json.loads((tmp_path / f"result_{r}.json").read_text())["val_log_loss"]
        assert got == pytest.approx(expected, rel=1e-5)

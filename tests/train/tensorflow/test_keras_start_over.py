"""A Keras HybridParallel ``fit(resume=False)`` starts over: the saves of an earlier
run written by another number of workers (here: 2 workers' parts, converted offline
from a one-worker run) are not resumed later, even though their global step is
higher; ``fit(resume=True)`` continues the run that started over, and ends where one
process training the plain model without a break ends. One worker (the default
strategy), in process."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tensorflow]


@pytest.mark.slow  # four fits of a small DLRM
def test_resume_continues_the_run_that_started_over_not_an_older_one(tmp_path):
    import tensorflow as tf
    from hybrid_worker import MIXED, as_tf, global_batches, make_model, make_optimizer

    from tabstream.train.tensorflow import fit
    from tabstream.train.tensorflow.distributed import HybridParallel, reshard

    batches = [(as_tf(f), tf.constant(y)) for f, y in global_batches()]

    def wrapped(seed):  # the optimizer claims the tables before they are sharded
        model = make_model(seed)
        optimizer = make_optimizer("multi", model)
        return HybridParallel(model, plan=MIXED), optimizer

    # an older run: two epochs (global step 6), its parts those of 2 workers
    old, optimizer = wrapped(0)
    fit(old, batches, optimizer, epochs=2, progress=False, checkpoint_dir=tmp_path / "old")
    ck = tmp_path / "ck"
    reshard(tmp_path / "old", ck, 2)
    assert sorted(os.listdir(ck)) == ["worker-0-of-2", "worker-1-of-2"]
    # the user starts over on 1 worker with other weights: one epoch (global step 3)
    first, optimizer = wrapped(3)
    fit(first, batches, optimizer, epochs=1, progress=False, checkpoint_dir=ck, resume=False)
    listing = sorted(os.listdir(ck))
    # and resumes that run for a second epoch
    resumed, optimizer = wrapped(5)  # other weights: only its checkpoint can give the result
    history = fit(resumed, batches, optimizer, epochs=2, progress=False, checkpoint_dir=ck,
                  resume=True)
    assert history["epoch"] == [1, 2]
    # the reference: the plain model of the run that started over, two epochs unbroken
    plain = make_model(3)
    expected = fit(plain, batches, make_optimizer("multi", plain), epochs=2, progress=False)
    np.testing.assert_allclose(history["loss"], expected["loss"], rtol=0, atol=1e-5)
    got = resumed.full_weights()
    assert sorted(got) == sorted(v.path for v in plain.weights)
    for v in plain.weights:
        np.testing.assert_allclose(got[v.path], v.numpy(), rtol=0, atol=1e-5, err_msg=v.path)
    # how: the run that started over removed the older run's parts at its first save
    assert listing == ["worker-0-of-1"]

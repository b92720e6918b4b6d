"""fit_lists with passes > 1 (tabstream.train.lists over the shared loop): every pass
trains, one file list alone included; a job killed inside a pass resumes inside that
pass; each returned history holds its own list's epochs only. The expected weights
and histories come from plain ``fit`` calls, one per list and pass, without any
checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
from frameworks import FRAMEWORKS, numpy_batches


@pytest.fixture(params=["torch", "tensorflow"])
def fw(request):
    pytest.importorskip(request.param)
    return FRAMEWORKS[request.param]()


class Crash(RuntimeError):
    """The process killed inside a list (raised by :class:`Day`)."""


class Day(list):
    """A file list (batches and a data identity) that can be killed before batch
    ``crash_after`` of its ``crash_on``-th iteration (counting from 1)."""

    def __init__(self, name, batches, crash_on=None, crash_after=None):
        super().__init__(batches)
        self.data_id = name
        self.crash_on, self.crash_after, self.iterations = crash_on, crash_after, 0

    def set_epoch(self, epoch):
        """The loop's per-epoch hook: a list's batches are the same every epoch."""

    def __iter__(self):
        self.iterations += 1
        for i, batch in enumerate(list.__iter__(self)):
            if self.iterations == self.crash_on and i == self.crash_after:
                raise Crash(f"killed before batch {i + 1}")
            yield batch


def day(fw, name, seed, n=4, **kwargs):
    return Day(name, [fw.batch(f, y) for f, y in numpy_batches(seed, n)], **kwargs)


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=0, atol=1e-6, err_msg=k)


def plain_passes(fw, names, passes, epochs):
    """The simpler way: plain ``fit`` on each list of each pass, no checkpoint."""
    model, opt = fw.build()
    histories = [fw.fit(model, day(fw, name, seed), opt, epochs=epochs, progress=False)
                 for _ in range(passes) for name, seed in names]
    return fw.weights(model), histories


@pytest.mark.parametrize("names", [[("mon", 1)], [("mon", 1), ("tue", 2)]],
                         ids=["one-list", "two-lists"])
def test_every_pass_trains_and_each_history_is_its_lists(fw, tmp_path, names):
    expected, plain = plain_passes(fw, names, passes=2, epochs=2)
    model, opt = fw.build()
    histories = fw.fit_lists(model, [day(fw, n, s) for n, s in names], opt,
                             checkpoint_dir=tmp_path / "ck", passes=2, epochs=2, progress=False)
    assert_same_weights(fw.weights(model), expected)
    assert len(histories) == 2 * len(names)
    for got, want in zip(histories, plain, strict=True):
        assert got["epoch"] == want["epoch"] == [1, 2]
        assert got["samples"] == want["samples"]
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)


def test_a_job_killed_inside_the_second_pass_resumes_inside_it(fw, tmp_path):
    expected, plain = plain_passes(fw, [("mon", 1)], passes=2, epochs=1)
    ck = tmp_path / "ck"
    model, opt = fw.build()
    with pytest.raises(Crash):  # pass 1 whole, pass 2 killed before its batch 4
        fw.fit_lists(model, [day(fw, "mon", 1, crash_on=2, crash_after=3)], opt,
                     checkpoint_dir=ck, passes=2, checkpoint_every=1, progress=False)
    assert fw.position(ck) == (0, 3)
    model, opt = fw.build(seed=7)  # the job restarts: all comes from the checkpoint
    histories = fw.fit_lists(model, [day(fw, "mon", 1)], opt, checkpoint_dir=ck, passes=2,
                             checkpoint_every=1, progress=False)
    assert_same_weights(fw.weights(model), expected)
    assert len(histories) == 1  # pass 1 was recorded as done before the crash
    assert histories[0]["epoch"] == [1] and histories[0]["samples"] == plain[1]["samples"]
    np.testing.assert_allclose(histories[0]["loss"], plain[1]["loss"], rtol=1e-5)
    # run again: everything is done, nothing trains
    assert fw.fit_lists(model, [day(fw, "mon", 1)], opt, checkpoint_dir=ck, passes=2,
                        progress=False) == []
    assert_same_weights(fw.weights(model), expected)

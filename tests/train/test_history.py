"""The per-epoch history and summary line shared by the torch and Keras fit loops."""

from __future__ import annotations

import math

import pytest

from tabstream.train.history import history_keys, record_epoch


def test_keys():
    assert history_keys(validation=False) == ["epoch", "loss", "samples", "samples_per_sec",
                                              "time_s"]
    assert history_keys(validation=True)[5:] == ["val_loss", "val_log_loss", "val_auc"]


@pytest.mark.parametrize("validation", [False, True])
def test_record_epoch_appends_and_summarises(validation):
    history = {k: [] for k in history_keys(validation)}
    metrics = {"loss": 0.4, "log_loss": 0.41, "auc": 0.8} if validation else None
    # epoch resumed mid-way: 3,000 rows in all, 1,000 of them trained in 0.5 s
    line = record_epoch(history, epoch=1, epochs=3, loss_sum=1500.0, samples=3000.0,
                        run_samples=1000, elapsed=0.5, metrics=metrics)
    want = {"epoch": [2], "loss": [1500.0 / 3000], "samples": [3000],
            "samples_per_sec": [1000 / 0.5], "time_s": [0.5]}
    if validation:
        want.update(val_loss=[0.4], val_log_loss=[0.41], val_auc=[0.8])
    assert history == want
    assert type(history["samples"][0]) is int
    val = f"  val_loss {0.4:.4f}  val_auc {0.8:.4f}" if validation else ""
    assert line == f"epoch 2/3: loss {0.5:.4f}{val}  2,000 samples/s"


def test_empty_epoch_and_zero_time_are_nan():
    history = {k: [] for k in history_keys(False)}
    line = record_epoch(history, epoch=0, epochs=1, loss_sum=0.0, samples=0, run_samples=0,
                        elapsed=0.0)
    assert math.isnan(history["loss"][0]) and math.isnan(history["samples_per_sec"][0])
    assert line == "epoch 1/1: loss nan  nan samples/s"

"""fit under torch.distributed (2 gloo ranks on 127.0.0.1): one progress bar,
validation metrics over every rank's rows (the same on each rank, equal to one
process scoring all rows), one checkpoint writer, sharded checkpoints with resume,
and files of unequal size that do not hang the run."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from dist_helpers import build, launch, read_all, write_parquet
from torch_data import _auc

from tabstream.train.torch.fit import checkpoint_position


def _scores(state: dict, kind: str, optimizer: str, combiner: str, data) -> tuple[float, float]:
    """AUC (pairwise, brute force) and log-loss (numpy) of a model holding ``state``
    over every row of ``data``."""
    model, _ = build(kind, optimizer, combiner)
    model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state.items()})
    features, labels = read_all(data)
    with torch.no_grad():
        z = model(features).double().numpy()
    y = labels.double().numpy()
    p = 1.0 / (1.0 + np.exp(-z))
    log_loss = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
    return _auc(y, z), log_loss


def _histories(out, name, world=2):
    return [json.loads((out / f"{name}-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.slow
def test_fit_ddp_one_writer_one_bar_global_metrics_unequal_files(tmp_path):
    data = tmp_path / "data"
    write_parquet(data, [23, 8])          # 31 rows: the ranks' last batches differ
    ranks = launch(2, "fit_ddp", tmp_path, str(data))
    h0, h1 = _histories(tmp_path, "ddp")
    assert h0 == {**h1, "samples_per_sec": h0["samples_per_sec"], "time_s": h0["time_s"]}
    assert h0["samples"] == [31, 31]      # every row once per epoch, over both ranks
    # one progress bar and one summary line, on rank 0
    assert "epoch 2/2" in ranks[0][1] and "epoch 2/2: loss" in ranks[0][0]
    assert "epoch" not in ranks[1][0] + ranks[1][1]
    # rank 0 wrote one checkpoint of the plain (unwrapped) model
    ckpt = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    assert ckpt["model_class"] == "DLRM" and ckpt["epoch"] == 2
    auc, log_loss = _scores(ckpt["model"], "data_parallel", "sgd", "sum", data)
    assert h0["val_auc"][-1] == pytest.approx(auc, abs=1e-6)
    assert h0["val_log_loss"][-1] == pytest.approx(log_loss, abs=1e-5)


@pytest.mark.slow
def test_fit_hybrid_parallel_sharded_checkpoint_resume(tmp_path):
    data = tmp_path / "data"
    write_parquet(data, [30, 11], seed=1)
    launch(2, "fit_hybrid", tmp_path, str(data))
    full = np.load(tmp_path / "hybrid.npz", allow_pickle=False)
    resumed = np.load(tmp_path / "resumed.npz", allow_pickle=False)
    assert sorted(full.files) == sorted(resumed.files)
    for key in full.files:
        np.testing.assert_allclose(resumed[key], full[key], rtol=0, atol=1e-6, err_msg=key)
    h0, h1 = _histories(tmp_path, "hybrid")
    r0, _ = _histories(tmp_path, "resumed")
    assert h0["val_auc"] == h1["val_auc"] and h0["val_log_loss"] == h1["val_log_loss"]
    np.testing.assert_allclose(r0["loss"], h0["loss"], rtol=0, atol=1e-6)
    np.testing.assert_allclose(r0["val_auc"], h0["val_auc"], rtol=0, atol=1e-9)
    auc, log_loss = _scores({k: full[k] for k in full.files}, "mixed", "lazyadam", "mean", data)
    assert h0["val_auc"][-1] == pytest.approx(auc, abs=1e-6)
    assert h0["val_log_loss"][-1] == pytest.approx(log_loss, abs=1e-5)
    # the sharded checkpoint: one folder of DCP files with a JSON index, no pickle
    pointer = json.loads((tmp_path / "ck" / "checkpoint.dcp.json").read_text())
    folder = tmp_path / "ck" / pointer["folder"]
    assert pointer["world_size"] == 2 and (folder / ".metadata.json").exists()
    assert not (folder / ".metadata").exists()
    assert len(list((tmp_path / "ck").glob("*.dcp"))) == 1   # older ones removed
    batches = -(-41 // (2 * 4))          # 41 rows, 2 ranks, batches of 4: per rank and epoch
    assert checkpoint_position(tmp_path / "ck") == (2, 0)
    assert pointer["folder"] == f"checkpoint-{2 * batches:09d}.dcp"   # global step in the name

"""CachedEmbeddings under torch.distributed (gloo ranks on 127.0.0.1, real
processes): each rank's server holds the rows it owns (id % W), the dense part
trains under DDP through fit, and the whole run equals one process trained on
the concatenated global batch: every table's rows, the dense state, the servers'
step counters, the losses and the validation metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cache_dist import CACHE_WORKER, CARDINALITIES, reference
from dist_helpers import launch


def _check_against_one_process(out, tmp_path, world: int, case: str) -> None:
    optimizer, cache_rows, storage = case.split(":")
    ref = reference(tmp_path / f"ref-{world}-{case.replace(':', '-')}", world, optimizer,
                    storage, int(cache_rows))
    folder = out / case.replace(":", "-")
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(world)]
    rows = [np.load(folder / f"rows{r}.npz", allow_pickle=False) for r in range(world)]
    for table, n in CARDINALITIES.items():
        got = np.full((n, 4), np.nan, np.float32)
        for r in range(world):
            ids = rows[r][f"{table}.ids"]
            assert (ids % world == r).all()
            got[ids] = rows[r][f"{table}.rows"]
            # a rank's server holds (wrote) only rows it owns
            assert (rows[r][f"{table}.touched"] % world == r).all(), table
        np.testing.assert_allclose(got, ref["rows"][table], rtol=1e-5, atol=1e-6, err_msg=table)
        assert not np.array_equal(got, ref["rows"][table] * 0)  # trained, not zeros
    dense = np.load(folder / "dense.npz", allow_pickle=False)
    for key, value in ref["dense"].items():
        np.testing.assert_allclose(dense[key], value.numpy(), rtol=1e-5, atol=1e-6, err_msg=key)
    for r, rank in enumerate(ranks):
        # one update per table and step on every rank's server, as in one process
        # (Adam's bias correction counts them), ids of its own or not
        assert rank["table_steps"] == ref["table_steps"], r
        assert rank["version"] == ref["version"], r
        np.testing.assert_allclose(rank["loss"], ref["loss"], rtol=1e-5)
        for key in ("loss", "log_loss", "auc"):
            assert rank["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-5), key
        assert all(n <= int(cache_rows) for n in rank["cached_rows"].values())
    # rank 0's checkpoint records the version every rank's server committed
    ckpt = torch.load(folder / "ck" / "checkpoint.pt", weights_only=True)
    assert int(ckpt["model"]["inputs.embeddings.ps_version"]) == ref["version"]


@pytest.mark.parametrize("world,cases", [
    (2, "adam:3:disk,adagrad:1000:memory"),
    (3, "adagrad:3:memory,adam:1000:disk"),
])
def test_ranks_train_as_one_process_on_the_global_batch(tmp_path, world, cases):
    out = tmp_path / "run"
    out.mkdir()
    launch(world, "fit_cases", out, cases, worker=CACHE_WORKER, timeout=180)
    for case in cases.split(","):
        _check_against_one_process(out, tmp_path, world, case)


def test_servers_that_would_not_train_as_one_are_refused_on_every_rank(tmp_path):
    launch(2, "refusals", tmp_path, worker=CACHE_WORKER, timeout=120)
    for r in range(2):
        seed, version, folder = json.loads((tmp_path / f"refusals{r}.json").read_text())
        assert seed is not None and "rank 1 has server settings" in seed and "'seed': 1" in seed
        assert version is not None and "parameter servers are at versions [0, 1]" in version
        assert folder is not None and "ranks 0 and 1 use one parameter server folder" in folder


def test_a_batch_without_ids_of_a_table_is_one_step_of_it_in_one_process(tmp_path):
    """The case a rank meets under several ranks, in one process: every list of
    the batch is empty. The table takes its (empty) step and no row changes;
    before, the server refused gradients of no rows."""
    from cache_dist import build, server

    ps = server(tmp_path / "ps", "adam", "disk")
    model = build(ps, 3)
    batch = {"C1": torch.tensor([1, 2]), "C2": torch.tensor([0, 3]), "I1": torch.zeros(2),
             "L": (torch.zeros(0, dtype=torch.long), torch.tensor([0, 0, 0]))}
    before = ps.lookup("L", np.arange(CARDINALITIES["L"]))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch), torch.ones(2))
    loss.backward()
    assert ps.table_steps == {"C1": 1, "C2": 1, "L": 1}
    np.testing.assert_array_equal(ps.lookup("L", np.arange(CARDINALITIES["L"])), before)
    assert len(ps.touched("L")) == 0 and len(ps.touched("C1")) == 2


@pytest.mark.slow
def test_ranks_resume_from_a_checkpoint_as_if_never_stopped(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    launch(2, "resume", out, "adam:3:disk", worker=CACHE_WORKER, timeout=180)
    _check_against_one_process(out, tmp_path, 2, "adam:3:disk")

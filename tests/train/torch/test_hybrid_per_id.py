"""HybridParallel on 2 gloo ranks (127.0.0.1) looks a ``combiner=None`` table up
per id, as one process does: ``(vectors (B, L, dim), mask (B, L))`` equal to the
plain ``EmbeddingTables`` on the rank's own batch, in every input layout and under
table-, row- and column-wise plans; and it trains exactly as one process on the
concatenated global batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from dist_helpers import launch
from per_id_worker import KINDS, WORKER_FILE, Seq, batches, concat, layouts, optimizer, sparse


def reference(kind: str) -> tuple[list[float], dict[str, np.ndarray]]:
    """One process, the plain model, the global batch of each step."""
    model = Seq(sparse(kind))
    opt = optimizer(kind, model)
    losses = []
    for step in batches():
        features, labels = concat(step)
        loss = F.binary_cross_entropy_with_logits(model(features), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_per_id_tables_under_hybrid_parallel_match_one_process(tmp_path):
    launch(2, "per_id", tmp_path, worker=WORKER_FILE, timeout=300)
    plain = Seq(sparse=False).emb  # the same initial weights as every rank's model
    for kind in KINDS:
        for rank in range(2):
            got = np.load(tmp_path / f"{kind}-rank{rank}.npz", allow_pickle=False)
            with torch.no_grad():
                for name, features in layouts(rank).items():
                    want = plain(features)
                    vectors, mask = want["hist"]
                    where = f"{kind} rank {rank} {name}"
                    assert got[f"{name}/hist"].shape == tuple(vectors.shape), where
                    np.testing.assert_allclose(got[f"{name}/hist"], vectors.numpy(), rtol=0,
                                               atol=1e-6, err_msg=where)
                    np.testing.assert_array_equal(got[f"{name}/mask"], mask.numpy(), err_msg=where)
                    np.testing.assert_allclose(got[f"{name}/user"], want["user"].numpy(),
                                               rtol=0, atol=1e-6, err_msg=where)
                    np.testing.assert_allclose(got[f"{name}/tags"], want["tags"].numpy(),
                                               rtol=0, atol=1e-6, err_msg=where)
        losses, state = reference(kind)
        got = np.load(tmp_path / f"{kind}-rank0.npz", allow_pickle=False)
        np.testing.assert_allclose(got["losses"], losses, rtol=0, atol=1e-5, err_msg=kind)
        for key, value in state.items():
            np.testing.assert_allclose(got[f"state/{key}"], value, rtol=0, atol=1e-5,
                                       err_msg=f"{kind} {key}")
        # training moved the per-id table (equal frozen tables would prove nothing)
        assert not np.allclose(state["emb.H.weight"], plain["H"].weight.detach().numpy()), kind

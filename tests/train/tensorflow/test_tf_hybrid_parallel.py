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
    # the resumed run and the one whose loss_fn returns batch means train as "mixed"
    expected = np.load(reference / f"{case.replace('_resume', '').replace('_mean_loss', '')}_0.npz")
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


def _routes(feats: dict, name: str, kind: str, pieces: list, parts: list) -> tuple:
    """numpy: ``(C, K, single)``: ``C[r, d]`` the ids worker ``r`` (rows ``parts[r]``)
    sends worker ``d`` for feature ``name``, ``K[r, d]`` the bags (rows with ids there)."""
    world = len(parts)
    c, k = np.zeros((world, world), np.int64), np.zeros((world, world), np.int64)
    single = name != "tags"
    for r, rows in enumerate(parts):
        if single:
            ids, row = feats[name][rows], np.arange(len(rows))
        else:
            mask = feats["tags__mask"][rows]
            ids, row = feats["tags"][rows][mask], np.nonzero(mask)[0]
        for d, a, b in pieces:
            hit = (ids >= a) & (ids < b) if kind == "row_wise" else np.ones(len(ids), bool)
            c[r, d] = hit.sum()
            k[r, d] = c[r, d] if single else len(np.unique(row[hit]))
    return c, k, single


def _expected_bytes(feats: dict, pieces: dict, world: int, exchange: str,
                    train: bool) -> list[dict]:
    """numpy: each worker's counters for one step on the global batch ``feats`` (its
    forward, and its backward when ``train``), from the rows each worker holds and
    the plan's pieces. ``all_to_all``: one exchange for all sharded features, each
    all-to-all chunk padded to the largest of any pair of workers; ``all_gather``:
    one exchange per feature."""
    size = len(feats["cat_0"])
    parts = np.array_split(np.arange(size), world)
    kinds = ("sizes", "ids", "vectors", "gradients")
    out = [dict.fromkeys([f"{k}_{d}" for k in kinds for d in ("sent", "received")]
                         + ["ids_payload_sent", "vectors_payload_sent"], 0)
           for _ in range(world)]
    words = np.zeros((world, world), np.int64)    # int64 words worker r sends worker d
    floats = np.zeros((world, world), np.int64)   # float32 worker d sends back to worker r
    features = 0
    for name, (kind, table_pieces) in pieces.items():
        if kind == "data_parallel":
            continue
        features += 1
        c, k, single = _routes(feats, name, kind, table_pieces, parts)
        width = np.zeros(world, np.int64)
        for d, a, b in table_pieces:
            width[d] = b - a if kind == "column_wise" else 8
        words += c + (0 if single else k)
        floats += k * width[None, :]
        if exchange == "all_gather":
            # each worker's ids: split over the owners (row_wise) or sent to each
            each = c.sum(axis=1) if kind == "row_wise" else c[:, table_pieces[0][0]]
            ring = 2 * (world - 1) * size * 8 * 4 // world
            for r, o in enumerate(out):
                o["sizes_sent"] += (world - 1) * 16
                o["sizes_received"] += (world - 1) * 16
                o["ids_sent"] += (world - 1) * each[r] * 16
                o["ids_payload_sent"] += (world - 1) * each[r] * 16
                o["ids_received"] += (each.sum() - each[r]) * 16
                for key in ("vectors_sent", "vectors_received", "vectors_payload_sent") + (
                        ("gradients_sent", "gradients_received") if train else ()):
                    o[key] += ring
    if exchange == "all_to_all":
        ids_chunk, vec_chunk = 8 * max(words.max(), 1), 4 * max(floats.max(), 1)
        for r, o in enumerate(out):
            others = np.arange(world) != r
            o["sizes_sent"] = o["sizes_received"] = (world - 1) * world * features * 16
            o["ids_sent"] = o["ids_received"] = (world - 1) * ids_chunk
            o["ids_payload_sent"] = 8 * words[r, others].sum()
            o["vectors_sent"] = o["vectors_received"] = (world - 1) * vec_chunk
            o["vectors_payload_sent"] = 4 * floats[others, r].sum()
            if train:
                o["gradients_sent"] = o["gradients_received"] = (world - 1) * vec_chunk
    for o in out:
        o["sent"] = sum(o[f"{kind}_sent"] for kind in kinds)
        o["received"] = sum(o[f"{kind}_received"] for kind in kinds)
    return [{key: int(v) for key, v in o.items()} for o in out]


def _assert_comm(out: Path, world: int) -> None:
    from hybrid_worker import global_batches

    first, _, last = (f for f, _ in global_batches())
    sent = {}
    for exchange in ("all_to_all", "all_gather"):
        got = [json.loads((out / f"comm_{exchange}_{r}.json").read_text()) for r in range(world)]
        pieces = got[0]["pieces"]
        one = _expected_bytes(first, pieces, world, exchange, train=True)
        two = _expected_bytes(last, pieces, world, exchange, train=True)
        built = _expected_bytes(first, pieces, world, exchange, train=False)  # build's forward
        for r in range(world):
            step1, step2 = got[r]["stats"]
            assert (step1["steps"], step2["steps"]) == (1, 2)
            assert step1["last"] == one[r], (exchange, r)
            assert step2["last"] == two[r], (exchange, r)
            assert step2["total"] == {key: built[r][key] + one[r][key] + two[r][key]
                                      for key in one[r]}, (exchange, r)
        sent[exchange] = sum(g["stats"][1]["last"]["ids_payload_sent"] for g in got)
    # the point of the all-to-all: far fewer id bytes than sending every id everywhere
    assert 0 < sent["all_to_all"] < sent["all_gather"] / 2


@pytest.mark.slow  # two TF workers, a mixed plan
def test_two_workers_mixed_plan_multi_optimizer_like_one_process(reference, tmp_path):
    # the last global batch splits 9/8: a worker's mean loss must weigh its rows
    _run(2, tmp_path, ["mixed", "mixed_mean_loss", "per_id", "comm"])
    _assert_like_one_process(reference, tmp_path, 2, "mixed")
    _assert_like_one_process(reference, tmp_path, 2, "mixed_mean_loss")
    _assert_per_id(tmp_path, 2)
    _assert_comm(tmp_path, 2)


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_every_sharding_type_and_resume_like_one_process(reference, tmp_path, world):
    cases = ["table_wise", "row_wise", "column_wise", "data_parallel", "mixed_resume"]
    if world == 3:
        cases += ["per_id", "comm"]
    _run(world, tmp_path, cases)
    for case in cases:
        if case not in ("per_id", "comm"):
            _assert_like_one_process(reference, tmp_path, world, case)
    if world == 3:
        _assert_per_id(tmp_path, world)
        _assert_comm(tmp_path, world)
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
    with pytest.raises(ValueError, match=r"exchange='alltoall' is not one of "
                       r"\['all_to_all', 'all_gather'\]"):
        HybridParallel(_dlrm(), exchange="alltoall")
    from tabstream.train.tensorflow.exchange import Collectives

    # the all-to-all needs MultiWorkerMirroredStrategy's launcher; the default has none
    with pytest.raises(TypeError, match=r"exchange='all_to_all' launches TensorFlow's "
                       r"collective all-to-all through the collective launcher of "
                       r"MultiWorkerMirroredStrategy .*_DefaultDistributionStrategy.*build "
                       r"HybridParallel\(\.\.\., exchange='all_gather'\)"):
        Collectives(tf.distribute.get_strategy())
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

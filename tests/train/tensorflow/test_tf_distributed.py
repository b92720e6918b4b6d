"""``tabstream.train.tensorflow.fit`` under ``MultiWorkerMirroredStrategy`` with two
local worker processes (TF_CONFIG on 127.0.0.1), against one process under the
default strategy on the same global batches."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("tensorflow")

from tf_synthetic import ranking_data  # noqa: E402

from tabstream.train.metrics import log_loss, roc_auc  # noqa: E402

pytestmark = [pytest.mark.tensorflow]

WORKER = Path(__file__).with_name("mwms_worker.py")
ROOT = Path(__file__).resolve().parents[3]
ROWS = 165  # mwms_worker.GLOBAL_BATCHES


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


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("mwms")
    schema, features, labels, _ = ranking_data(3, rows=ROWS, list_cardinality=0)
    np.savez(root / "train.npz", schema=json.dumps(schema.to_dict()), click=labels, **features)
    v_schema, v_features, v_labels, _ = ranking_data(4, rows=301, list_cardinality=0)
    valid = root / "valid"
    valid.mkdir()
    table = pa.table({**{k: pa.array(v) for k, v in v_features.items()}, "click": pa.array(v_labels)})
    # 301 rows in files of 151 and 150: the workers' shares of rows differ
    pq.write_table(table.slice(0, 151), valid / "part_0.parquet")
    pq.write_table(table.slice(151), valid / "part_1.parquet")
    v_schema.to_json(str(valid / "schema.json"))
    return root, v_features, v_labels


def _run_single(root: Path, out: Path) -> None:
    out.mkdir()
    subprocess.run([sys.executable, str(WORKER), str(root / "train.npz"), str(root / "valid"),
                    str(out)], env=_env(None), check=True, timeout=300)


def _run_two_workers(root: Path, out: Path, checkpoint_dir: Path) -> None:
    out.mkdir()
    ports = _free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(root / "train.npz"), str(root / "valid"), str(out),
             str(checkpoint_dir)],
            env=_env({"cluster": cluster, "task": {"type": "worker", "index": i}}),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(2)
    ]
    outputs = []
    try:
        for p in procs:
            outputs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for i, p in enumerate(procs):
        assert p.returncode == 0, f"worker {i} failed:\n{outputs[i][-4000:]}"


def _checkpoint_logits(checkpoint_dir: Path, features: dict) -> np.ndarray:
    import tensorflow as tf

    from tabstream.core.schema import Schema
    from tabstream.train.tensorflow import DLRM

    schema, *_ = ranking_data(3, rows=10, list_cardinality=0)
    model = DLRM(Schema.from_dict(schema.to_dict()), embedding_dim=8, bottom_mlp=(8,),
                 top_mlp=(8,), seed=0)
    model(model.example_batch())
    model.load_weights(checkpoint_dir / "checkpoint.weights.h5")
    return np.asarray(model({k: tf.constant(v) for k, v in features.items()})).reshape(-1)


@pytest.mark.slow
def test_two_workers_train_like_one_process_on_the_global_batch(data, tmp_path):
    root, v_features, v_labels = data
    _run_single(root, tmp_path / "single")
    _run_two_workers(root, tmp_path / "two", tmp_path / "ck")
    single = dict(np.load(tmp_path / "single" / "weights_0.npz"))
    h_single = json.loads((tmp_path / "single" / "history_0.json").read_text())
    for rank in range(2):
        got = dict(np.load(tmp_path / "two" / f"weights_{rank}.npz"))
        assert got.keys() == single.keys()
        for name, value in single.items():
            # same updates as one process on the concatenated batch (LazyAdam on the
            # large tables, Adam on the rest, through MultiOptimizer)
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=2e-5, err_msg=name)
        history = json.loads((tmp_path / "two" / f"history_{rank}.json").read_text())
        assert history["samples"] == [ROWS]
        np.testing.assert_allclose(history["loss"], h_single["loss"], rtol=1e-5)
        # validation over both workers' rows: the same on each, equal to the metrics
        # of the single process's (equal) weights over all 301 rows
        np.testing.assert_allclose(history["val_auc"], h_single["val_auc"], rtol=1e-5)
        np.testing.assert_allclose(history["val_log_loss"], h_single["val_log_loss"], rtol=1e-5)
    # the validation numbers are the exact metrics over every row, recomputed here
    # from the checkpointed model
    logits = _checkpoint_logits(tmp_path / "ck", v_features)
    assert h_single["val_auc"][0] == pytest.approx(roc_auc(v_labels, logits), abs=1e-6)
    assert h_single["val_log_loss"][0] == pytest.approx(log_loss(v_labels, logits), abs=1e-5)
    # one checkpoint, written by the chief: its weights are the trained ones
    files = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert files == ["checkpoint.json", "checkpoint.optimizer.npz", "checkpoint.weights.h5"]
    assert json.loads((tmp_path / "ck" / "checkpoint.json").read_text())["epoch"] == 1

"""Keras HybridParallel checkpoints in whole-table coordinates, in one process (the
default strategy, one worker): a checkpoint of a mixed plan converts offline to 3
workers (each part holds the regions the new plan gives it, optimizer slots with
their rows) and to 1 (the unwrapped model's single-process ``fit(resume=True)``
trains on as the uninterrupted plain model does); a resume with another global
batch is refused naming both. The multi-worker runs are in
test_keras_reshard_dist.py."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tensorflow]


def _newest_saves(directory: Path) -> list[Path]:
    """Each worker's newest save of the one worker count in ``directory``."""
    parts = sorted(p for p in directory.iterdir() if p.name.startswith("worker-"))
    world = int(parts[0].name.rsplit("-", 1)[1])
    assert len(parts) == world, parts
    out = []
    for r in range(world):
        saves = sorted((directory / f"worker-{r}-of-{world}").glob("step-*"),
                       key=lambda p: tuple(int(x) for x in p.name.split("-")[1:]))
        out.append(saves[-1])
    return out


def _assembled(directory: Path) -> dict[str, np.ndarray]:
    """Every stored tensor of a checkpoint put together from its parts with numpy."""
    whole: dict[str, np.ndarray] = {}
    for save in _newest_saves(directory):
        index = json.loads((save / "index.json").read_text())
        for e in index["chunks"]:
            target = whole.setdefault(e["key"], np.full(e["size"], np.nan, np.float32))
            piece = np.load(save / e["file"], allow_pickle=False)
            region = tuple(slice(o, o + n) for o, n in zip(e["offsets"], piece.shape))
            target[region] = piece
    for key, value in whole.items():
        assert not np.isnan(value).any(), f"{directory}: {key} is not covered"
    return whole


def assert_parts_hold_their_regions(src: Path, dst: Path, world: int, plan: dict,
                                    weights) -> None:
    """``dst`` (``world`` workers, ``plan``): each part holds exactly its regions of each
    table (and of its optimizer slots) and every other tensor whole, with the values of
    ``src``; the tables' values are ``weights`` (whole, from the model)."""
    from hybrid_worker import CARDS

    from tabstream.train.sharding import plan_sharding
    from tabstream.train.tables import TableConfig

    configs = [TableConfig(n, c, 8, (n,)) for n, c in CARDS.items()]
    placements = plan_sharding(configs, world, overrides=plan).placements
    source = _assembled(src)
    tables = {f"{n}/embeddings": n for n in CARDS}
    saves = _newest_saves(dst)
    assert len(saves) == world
    for r, save in enumerate(saves):
        index = json.loads((save / "index.json").read_text())
        held = {e["key"]: e for e in index["chunks"]}
        expected_keys = set()
        for key in source:
            path = key[len("model/"):] if key.startswith("model/") else \
                key.split("/", 2)[2].rsplit("/", 1)[0]
            if path in tables:
                place = placements[tables[path]]
                mine = {k: (a, b) for k, a, b in place.pieces()}
                if place.kind != "data_parallel" and r not in mine:
                    continue
                rows, dim = source[key].shape
                a, b = mine.get(r, (0, 0))
                offsets, sizes = {"data_parallel": ((0, 0), (rows, dim)),
                                  "table_wise": ((0, 0), (rows, dim)),
                                  "row_wise": ((a, 0), (b - a, dim)),
                                  "column_wise": ((0, a), (rows, b - a))}[place.kind]
            else:
                offsets, sizes = (0,) * source[key].ndim, source[key].shape
            expected_keys.add(key)
            e = held[key]
            assert e["offsets"] == list(offsets) and e["shape"] == list(sizes), (r, key, e)
            piece = np.load(save / e["file"], allow_pickle=False)
            region = tuple(slice(o, o + n) for o, n in zip(offsets, sizes))
            np.testing.assert_array_equal(piece, source[key][region], err_msg=f"{r}: {key}")
            if key.startswith("model/"):
                np.testing.assert_array_equal(piece, np.asarray(weights[path])[region],
                                              err_msg=f"{r}: {key}")
        assert set(held) == expected_keys, r
        assert json.loads((save / "state.json").read_text())["epoch"] == \
            json.loads((_newest_saves(src)[0] / "state.json").read_text())["epoch"]
    slots = [k for k in source if k.startswith("opt/") and "cat_1/embeddings" in k]
    assert slots, sorted(source)  # the tables' optimizer slots were there to move


def _batches():
    import tensorflow as tf
    from hybrid_worker import as_tf
    from reshard_keras_worker import global_batches

    return [(as_tf(f), tf.constant(y)) for f, y in global_batches()]


@pytest.mark.slow  # a stopped fit, then resharded offline and resumed
def test_one_worker_checkpoint_reshards_offline_to_three_and_to_one(tmp_path, capsys):
    from hybrid_worker import MIXED, make_model
    from reshard_keras_worker import EPOCH_STEPS, EPOCHS, Epochs, make_optimizer

    from tabstream.train.tensorflow import fit
    from tabstream.train.tensorflow.distributed import HybridParallel, reshard

    batches = _batches()
    model = make_model(0)
    optimizer = make_optimizer("multi", model)
    wrapper = HybridParallel(model, plan=MIXED)
    with pytest.raises(KeyboardInterrupt):
        fit(wrapper, Epochs(batches, stop=1), optimizer, epochs=EPOCHS, progress=False,
            checkpoint_dir=tmp_path / "ck")
    weights = wrapper.full_weights()
    written = reshard(tmp_path / "ck", tmp_path / "three", 3, plan=MIXED)
    assert written == tmp_path / "three"
    assert_parts_hold_their_regions(tmp_path / "ck", tmp_path / "three", 3, MIXED, weights)
    # W' = 1: the plain (unwrapped) model resumes it in one process
    reshard(tmp_path / "ck", tmp_path / "one", 1)
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["checkpoint.arrays",
                                                                   "checkpoint.json"]
    plain = make_model(4)
    plain_optimizer = make_optimizer("multi", plain)
    capsys.readouterr()
    with pytest.raises(KeyboardInterrupt):
        fit(plain, Epochs(batches, stop=2), plain_optimizer, epochs=EPOCHS, progress=False,
            checkpoint_dir=tmp_path / "one", resume=True)
    line = [x for x in capsys.readouterr().out.splitlines() if "checkpoint" in x]
    assert line == [], line  # written by 1 worker, resumed by 1: nothing to say
    reference = make_model(0)
    reference_optimizer = make_optimizer("multi", reference)
    for e in range(2):
        fit(reference, batches[e * EPOCH_STEPS:(e + 1) * EPOCH_STEPS], reference_optimizer,
            progress=False)
    expected = {v.path: v.numpy() for v in reference.weights}
    got = {v.path: v.numpy() for v in plain.weights}
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=key)
    # and it keeps training there: its next checkpoint is an ordinary one
    assert (tmp_path / "one" / "checkpoint.weights.h5").exists()
    # parts converted for 2 workers (column-wise), resumed here on 1 with the mixed plan
    reshard(tmp_path / "ck", tmp_path / "two", 2, plan="column_wise")
    model = make_model(5)
    optimizer = make_optimizer("multi", model)  # claims the tables before they are sharded
    wrapper = HybridParallel(model, plan=MIXED)
    with pytest.raises(KeyboardInterrupt):
        fit(wrapper, Epochs(batches, stop=2), optimizer, epochs=EPOCHS, progress=False,
            checkpoint_dir=tmp_path / "two", resume=True)
    lines = [x for x in capsys.readouterr().out.splitlines() if "checkpoint" in x]
    assert len(lines) == 1 and lines[0].startswith(
        f"fit: checkpoint {tmp_path / 'two'} holds the parts of 2 workers; resuming on 1 "
        "worker(s): tables and optimizer state resharded ("), lines
    got = wrapper.full_weights()
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=0, atol=1e-5, err_msg=key)


def test_resume_with_another_global_batch_is_refused(tmp_path):
    """The loop's refusal, through the Keras fit of a HybridParallel with a tabstream
    loader: a mid-epoch checkpoint of batch 8 on 1 worker, resumed with batch 16."""
    import pandas as pd
    import tensorflow as tf

    import tabstream as ts
    from tabstream.core.errors import DataError
    from tabstream.core.schema import ColumnSchema, Schema, Tags
    from tabstream.loaders.tensorflow import Loader
    from tabstream.train.tensorflow import DLRM, LazyAdam, fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"C1": rng.integers(0, 40, 64), "C2": rng.integers(0, 7, 64),
                          "x": rng.normal(size=64).astype(np.float32),
                          "click": rng.integers(0, 2, 64).astype(np.float32)})
    (tmp_path / "data").mkdir()
    frame.to_parquet(tmp_path / "data" / "part.parquet")
    schema = Schema([
        *[ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                       properties={"domain": {"min": 0, "max": c - 1}})
          for n, c in (("C1", 40), ("C2", 7))],
        ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
        ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])

    def run(batch_size, stop):
        loader = Loader(ts.Dataset(str(tmp_path / "data" / "*.parquet")), batch_size=batch_size,
                        labels=["click"])

        class Stops:
            core = loader.core

            def set_epoch(self, epoch):
                loader.set_epoch(epoch)

            def __len__(self):
                return len(loader)

            def __iter__(self):
                for i, batch in enumerate(loader):
                    if i == stop:
                        raise KeyboardInterrupt("stopped mid-epoch")
                    yield batch

        wrapper = HybridParallel(DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,),
                                      seed=0), plan="row_wise")
        fit(wrapper, Stops(), LazyAdam(0.01), progress=False, checkpoint_dir=tmp_path / "ck",
            checkpoint_every=1, resume=True)

    with pytest.raises(KeyboardInterrupt):
        run(8, 3)
    assert tf.executing_eagerly()
    with pytest.raises(DataError, match=r"was trained with a global batch of 8 rows \(1 workers "
                       r"x batch_size=8\); this run makes 16 \(1 x batch_size=16\).*build the "
                       r"loader with batch_size=8"):
        run(16, None)

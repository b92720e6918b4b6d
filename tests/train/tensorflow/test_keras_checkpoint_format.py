"""A Keras checkpoint's ``checkpoint.json`` says its ``format``: one written by a
newer tabstream (or not a tabstream checkpoint state at all) is refused by
``fit(..., resume=True)`` and ``checkpoint_position``, as torch's checkpoint of
format ``.../2`` is, instead of resumed as if it were today's."""

import json
import shutil

import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import ranking_data  # noqa: E402

from tabstream.core.errors import DataError  # noqa: E402
from tabstream.train.tensorflow import DLRM, fit  # noqa: E402
from tabstream.train.tensorflow.fit import checkpoint_position  # noqa: E402

pytestmark = pytest.mark.tensorflow


def batches(rows: int = 64, size: int = 32):
    schema, features, labels, _ = ranking_data(0, rows=rows, list_cardinality=0)
    return schema, [({k: tf.constant(v[s:s + size]) for k, v in features.items()}, tf.constant(labels[s:s + size]))
                    for s in range(0, rows, size)]


def model_for(schema):
    return DLRM(schema, embedding_dim=4, bottom_mlp=(4,), top_mlp=(4,), seed=0)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    schema, train = batches()
    folder = tmp_path_factory.mktemp("keras_ck")
    model = model_for(schema)
    fit(model, train, keras.optimizers.SGD(0.01), epochs=1, checkpoint_dir=folder, progress=False)
    return schema, train, folder


def with_format(checkpoint, tmp_path, fmt):
    """A copy of the checkpoint whose checkpoint.json says ``format: fmt`` (removed for
    ``...``)."""
    _, _, folder = checkpoint
    copy = tmp_path / "ck"
    shutil.copytree(folder, copy)
    state = json.loads((copy / "checkpoint.json").read_text())
    if fmt is ...:
        state.pop("format")
    else:
        state["format"] = fmt
    (copy / "checkpoint.json").write_text(json.dumps(state))
    return copy


def test_todays_checkpoint_resumes(checkpoint, tmp_path):
    schema, train, _ = checkpoint
    copy = with_format(checkpoint, tmp_path, 1)
    state = json.loads((copy / "checkpoint.json").read_text())
    assert checkpoint_position(copy) == (state["epoch"], state.get("step", 0)) == (1, 0)
    history = fit(model_for(schema), train, keras.optimizers.SGD(0.01), epochs=2, checkpoint_dir=copy,
                  resume=True, progress=False)
    assert history["epoch"] == [1, 2]  # epoch 1's entry restored from the checkpoint
    assert checkpoint_position(copy) == (2, 0)


def test_checkpoint_of_a_newer_format_is_refused(checkpoint, tmp_path):
    schema, train, _ = checkpoint
    copy = with_format(checkpoint, tmp_path, 2)
    before = {p.name: p.read_bytes() for p in copy.iterdir()}
    said = (r"checkpoint\.json is a checkpoint of format 2, written by a newer tabstream; this "
            r"tabstream reads format 1: upgrade tabstream")
    with pytest.raises(DataError, match=said) as info:
        fit(model_for(schema), train, keras.optimizers.SGD(0.01), epochs=2, checkpoint_dir=copy,
            resume=True, progress=False)
    assert "upgrade tabstream" in info.value.hint
    assert {p.name: p.read_bytes() for p in copy.iterdir()} == before  # nothing written over it
    with pytest.raises(DataError, match=said):
        checkpoint_position(copy)


@pytest.mark.parametrize("fmt", ["tabstream.keras/1", None, True, ...], ids=["string", "null", "true", "absent"])
def test_checkpoint_state_of_another_format_is_refused(checkpoint, tmp_path, fmt):
    schema, train, _ = checkpoint
    copy = with_format(checkpoint, tmp_path, fmt)
    found = repr(None if fmt is ... else fmt)
    said = rf"checkpoint\.json is not a tabstream Keras checkpoint state \(format {found}, expected 1\)"
    with pytest.raises(DataError, match=said):
        checkpoint_position(copy)
    with pytest.raises(DataError, match=said):
        fit(model_for(schema), train, keras.optimizers.SGD(0.01), epochs=2, checkpoint_dir=copy,
            resume=True, progress=False)


def test_hybrid_parallel_part_of_a_newer_format_is_refused(tmp_path):
    """A HybridParallel worker's ``state.json`` says its format too: a newer one is
    refused by a resume and by the offline reshard, naming the file."""
    from tabstream.train.tensorflow.distributed import HybridParallel, reshard

    schema, train = batches()
    model = model_for(schema)
    wrapper = HybridParallel(model, plan="row_wise")
    fit(wrapper, train, keras.optimizers.SGD(0.01), epochs=1, checkpoint_dir=tmp_path / "ck",
        progress=False)
    states = sorted((tmp_path / "ck").rglob("state.json"))
    assert states
    for path in states:
        state = json.loads(path.read_text())
        assert state["format"] == 1
        path.write_text(json.dumps({**state, "format": 2}))
    again = HybridParallel(model_for(schema), plan="row_wise")
    with pytest.raises(DataError, match=r"state\.json is a checkpoint of format 2, written by a newer "
                                        r"tabstream"):
        fit(again, train, keras.optimizers.SGD(0.01), epochs=2, checkpoint_dir=tmp_path / "ck",
            resume=True, progress=False)
    with pytest.raises(DataError, match=r"state\.json is a checkpoint of format 2, written by a newer"):
        reshard(tmp_path / "ck", tmp_path / "three", 3)

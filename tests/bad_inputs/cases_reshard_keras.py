"""Resharding Keras HybridParallel checkpoints (``tabstream reshard`` and
``tabstream.train.tensorflow.distributed.reshard``), and single-process resumes of what
it writes: what a user gets wrong. A real checkpoint comes from one worker (the
default strategy); it is built once per process and copied into each case."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from _corpus import CliFailed, cli

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags

# tensorflow is imported inside the cases: the corpus also runs where it is not installed

_BUILT: dict[str, Path] = {}


def _schema() -> Schema:
    cat = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                        properties={"domain": {"min": 0, "max": c - 1}})
           for n, c in (("C1", 60), ("C2", 5))]
    return Schema([*cat, ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def _batches(n=2, rows=8):
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    return [({"C1": tf.constant(rng.integers(0, 60, rows)),
              "C2": tf.constant(rng.integers(0, 5, rows)),
              "x": tf.constant(rng.normal(size=rows).astype(np.float32))},
             tf.constant(rng.integers(0, 2, rows).astype(np.float32))) for _ in range(n)]


def _model(dim=8, seed=0):
    from tabstream.train.tensorflow import DLRM

    return DLRM(_schema(), embedding_dim=dim, bottom_mlp=(8,), top_mlp=(8,), seed=seed)


def _checkpoint(tmp: Path) -> Path:
    """A copy, in ``tmp/ck``, of a real 1-worker checkpoint (C1 row-wise, LazyAdam)."""
    if "ck" not in _BUILT:
        from tabstream.train.tensorflow import LazyAdam, fit
        from tabstream.train.tensorflow.distributed import HybridParallel

        where = Path(tempfile.mkdtemp(prefix="keras-reshard-corpus-")) / "ck"
        wrapper = HybridParallel(_model(), plan={"C1": "row_wise"})
        fit(wrapper, _batches(), LazyAdam(0.01), checkpoint_dir=where, progress=False)
        _BUILT["ck"] = where
    shutil.copytree(_BUILT["ck"], tmp / "ck")
    return tmp / "ck"


def _reshard(*args, **kwargs):
    from tabstream.train.tensorflow.distributed import reshard

    return reshard(*args, **kwargs)


def _no_checkpoint(tmp):
    (tmp / "empty").mkdir()
    _reshard(tmp / "empty", tmp / "out", 2)


def _world_size_zero(tmp):
    _reshard(_checkpoint(tmp), tmp / "out", 0)


def _world_size_float(tmp):
    _reshard(_checkpoint(tmp), tmp / "out", 2.0)


def _output_not_empty(tmp):
    ck = _checkpoint(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("mine")
    _reshard(ck, tmp / "out", 2)


def _output_is_the_source(tmp):
    ck = _checkpoint(tmp)
    _reshard(ck, ck, 2)


def _a_worker_part_missing(tmp):
    """Parts of a 2-worker run of which worker 1's folder is gone: no save is whole."""
    ck = _checkpoint(tmp)
    (ck / "worker-0-of-1").rename(ck / "worker-0-of-2")
    _reshard(ck, tmp / "out", 1)


def _an_array_file_missing(tmp):
    ck = _checkpoint(tmp)
    save = sorted((ck / "worker-0-of-1").glob("step-*"))[-1]
    (save / "00000.npy").unlink()
    _reshard(ck, tmp / "out", 2)


def _plan_names_unknown_table(tmp):
    _reshard(_checkpoint(tmp), tmp / "out", 2, plan={"C9": "row_wise"})


def _cli_output_not_empty(tmp):
    ck = _checkpoint(tmp)
    (tmp / "out").mkdir()
    (tmp / "out" / "notes.txt").write_text("mine")
    try:
        cli("reshard", ck, tmp / "out", "--world-size", "2")
    except CliFailed as exc:
        raise FileExistsError(str(exc)) from exc


def _unsharded_into_another_model(tmp):
    """W' = 1, then the unwrapped model's single-process resume with another dim."""
    from tabstream.train.tensorflow import LazyAdam, fit

    ck = _checkpoint(tmp)
    _reshard(ck, tmp / "one", 1)
    fit(_model(dim=16), _batches(), LazyAdam(0.01), epochs=2, checkpoint_dir=tmp / "one",
        resume=True, progress=False)


def _unsharded_into_another_optimizer(tmp):
    import keras

    from tabstream.train.tensorflow import MultiOptimizer, fit

    ck = _checkpoint(tmp)
    _reshard(ck, tmp / "one", 1)
    fit(_model(), _batches(), MultiOptimizer(keras.optimizers.Adam(0.01)), epochs=2,
        checkpoint_dir=tmp / "one", resume=True, progress=False)


def _unsharded_resumes(tmp):
    """Valid: the unwrapped model resumes the W' = 1 checkpoint with the checkpointed
    weights (compared with the wrapper's full_weights at the save)."""
    import warnings

    import numpy as np

    from tabstream.train.loop import NothingToTrainWarning
    from tabstream.train.tensorflow import LazyAdam, fit
    from tabstream.train.tensorflow.distributed import HybridParallel

    wrapper = HybridParallel(_model(), plan="column_wise")
    optimizer = LazyAdam(0.01)
    fit(wrapper, _batches(), optimizer, checkpoint_dir=tmp / "ck", progress=False)
    expected = wrapper.full_weights()
    _reshard(tmp / "ck", tmp / "one", 1)
    model = _model(seed=3)  # other initial weights: only the checkpoint counts
    with warnings.catch_warnings():  # nothing left to train: epoch 1 is done
        warnings.simplefilter("ignore", NothingToTrainWarning)
        fit(model, _batches(), LazyAdam(0.01), epochs=1, checkpoint_dir=tmp / "one",
            resume=True, progress=False)
    for v in model.weights:
        np.testing.assert_array_equal(v.numpy(), expected[v.path], err_msg=v.path)


CASES = [
    ("no_checkpoint", _no_checkpoint, DataError,
     r"reshard: .*empty holds no Keras HybridParallel save that all of its workers wrote "
     r"whole.*pass the checkpoint_dir that fit wrote"),
    ("world_size_zero", _world_size_zero, ValueError, r"reshard: world_size must be >= 1, got 0"),
    ("world_size_float", _world_size_float, TypeError,
     r"reshard: world_size must be an int, got 2\.0"),
    ("output_not_empty", _output_not_empty, FileExistsError,
     r"reshard: .*out is not empty; pass an empty or new output folder"),
    ("output_is_the_source", _output_is_the_source, ValueError,
     r"reshard: the output folder .*ck is the checkpoint's own folder; pass another one"),
    ("a_worker_part_missing", _a_worker_part_missing, DataError,
     r"holds no Keras HybridParallel save that all of its workers wrote whole"),
    ("an_array_file_missing", _an_array_file_missing, DataError,
     r"checkpoint .*ck: cannot read .*00000\.npy"),
    ("plan_names_unknown_table", _plan_names_unknown_table, ValueError,
     r"the plan names table 'C9', which the model does not have"),
    ("cli_output_not_empty", _cli_output_not_empty, FileExistsError,
     r"out is not empty; pass an empty or new output folder"),
    ("unsharded_into_another_model", _unsharded_into_another_model, SchemaError,
     r"'C1/embeddings' has shape \(60, 8\) in the checkpoint, \(60, 16\) in the model.*"
     r"resume=False"),
    ("unsharded_into_another_optimizer", _unsharded_into_another_optimizer, SchemaError,
     r"its optimizer \(single: \['LazyAdam'\]\) differs from this run's \(multi: \['Adam'\]\); "
     r"build the optimizer as the checkpointed run did"),
    ("unsharded_resumes", _unsharded_resumes, None, None),
]

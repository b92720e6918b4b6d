"""Resharding and resuming checkpoints on another world size: what a user gets wrong
(offline ``reshard`` / ``tabstream reshard``, and single-process resumes of what it
writes). A real sharded checkpoint comes from a 1-rank gloo group."""

from __future__ import annotations

import contextlib
import json
import socket

import pytest
from _corpus import CliFailed, cli

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags

# torch is imported inside the cases: the corpus also runs where torch is not installed


def _schema() -> Schema:
    cat = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                        properties={"domain": {"min": 0, "max": c - 1}})
           for n, c in (("C1", 100), ("C2", 5))]
    return Schema([*cat, ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def _batches(n=3, rows=8):
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    return [({"C1": torch.as_tensor(rng.integers(0, 100, rows)),
              "C2": torch.as_tensor(rng.integers(0, 5, rows)),
              "x": torch.as_tensor(rng.normal(size=rows), dtype=torch.float32)},
             torch.as_tensor(rng.integers(0, 2, rows), dtype=torch.float32)) for _ in range(n)]


@contextlib.contextmanager
def _one_rank():
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _sharded(tmp, dim=8):
    """A real sharded checkpoint of a HybridParallel DLRM (1 rank) in ``tmp/ck``."""
    import torch

    from tabstream.train.torch import DLRM, LazyAdam, fit
    from tabstream.train.torch.distributed import HybridParallel

    with _one_rank():
        torch.manual_seed(0)
        hp = HybridParallel(DLRM(_schema(), embedding_dim=dim), plan={"C1": "row_wise"})
        fit(hp, _batches(), LazyAdam(hp.parameters(), lr=0.01), checkpoint_dir=tmp / "ck",
            progress=False)
    return tmp / "ck"


def _reshard(*args, **kwargs):
    from tabstream.train.torch.distributed import reshard

    return reshard(*args, **kwargs)


def _no_checkpoint(tmp):
    _reshard(tmp, tmp / "out", 2)


def _whole_model_checkpoint(tmp):
    import torch

    from tabstream.train.torch import DLRM, LazyAdam, fit

    torch.manual_seed(0)
    model = DLRM(_schema(), embedding_dim=8)
    fit(model, _batches(1), LazyAdam(model.parameters()), checkpoint_dir=tmp, progress=False)
    _reshard(tmp, tmp / "out", 2)


def _older_layout(tmp):
    (tmp / "checkpoint-1.dcp").mkdir()
    (tmp / "checkpoint-1.dcp" / "rank0.json").write_text(json.dumps({"__dict__": [["epoch", 1]]}))
    (tmp / "checkpoint.dcp.json").write_text(json.dumps({"folder": "checkpoint-1.dcp",
                                                         "world_size": 1}))
    _reshard(tmp, tmp / "out", 2)


def _world_size_zero(tmp):
    _reshard(tmp, tmp / "out", 0)


def _world_size_string(tmp):
    _reshard(tmp, tmp / "out", "3")


def _output_is_the_source(tmp):
    ck = _sharded(tmp)
    _reshard(ck, ck, 2)


def _output_holds_a_checkpoint(tmp):
    ck = _sharded(tmp)
    _reshard(ck, tmp / "one", 1)
    _reshard(ck, tmp / "one", 1)


def _plan_names_unknown_table(tmp):
    ck = _sharded(tmp)
    _reshard(ck, tmp / "out", 2, plan={"C9": "row_wise"})


def _cli_no_checkpoint(tmp):
    try:
        cli("reshard", tmp / "nothing", tmp / "out", "--world-size", "2")
    except CliFailed as exc:
        raise DataError(str(exc)) from exc


def _unsharded_into_another_model(tmp):
    """W' = 1, then a single-process resume with another embedding size."""
    from tabstream.train.torch import DLRM, LazyAdam, fit

    ck = _sharded(tmp)
    _reshard(ck, tmp / "one", 1)
    model = DLRM(_schema(), embedding_dim=16)
    fit(model, _batches(), LazyAdam(model.parameters()), epochs=2, checkpoint_dir=tmp / "one",
        resume=True, progress=False)


class _Stop:
    """The batches, interrupted after ``n`` of them."""

    def __init__(self, batches, n, data_id=None):
        self.batches, self.n, self.data_id = batches, n, data_id

    def __len__(self):
        return len(self.batches)

    def __iter__(self):
        for i, b in enumerate(self.batches):
            if i == self.n:
                raise KeyboardInterrupt
            yield b


def _stopped_run(tmp, data_id=None):
    import torch

    from tabstream.train.torch import DLRM, LazyAdam, fit

    torch.manual_seed(0)
    model = DLRM(_schema(), embedding_dim=8)
    with pytest.raises(KeyboardInterrupt):
        fit(model, _Stop(_batches(4, rows=8), 2, data_id), LazyAdam(model.parameters()),
            checkpoint_dir=tmp, checkpoint_every=1, progress=False)
    return model


def _another_global_batch(tmp):
    from tabstream.train.torch import LazyAdam, fit

    model = _stopped_run(tmp)
    fit(model, _batches(8, rows=4), LazyAdam(model.parameters()), checkpoint_dir=tmp,
        resume=True, progress=False)


def _another_dataset(tmp):
    from tabstream.train.torch import LazyAdam, fit

    model = _stopped_run(tmp, data_id="day-1")
    fit(model, _Stop(_batches(4), 99, "day-2"), LazyAdam(model.parameters()),
        checkpoint_dir=tmp, resume=True, progress=False)


CASES = [
    ("reshard a folder without a checkpoint", _no_checkpoint, DataError,
     "holds no sharded checkpoint \\(no checkpoint.dcp.json\\); pass the checkpoint_dir"),
    ("reshard a whole-model checkpoint", _whole_model_checkpoint, DataError,
     "holds a whole-model checkpoint \\(checkpoint.pt\\), not a sharded one: it resumes on "
     "any number of ranks as it is"),
    ("reshard a sharded checkpoint of the older layout", _older_layout, DataError,
     "written by an older tabstream.*resume it once on its 1 ranks with this version"),
    ("reshard to 0 ranks", _world_size_zero, ValueError, "world_size must be >= 1, got 0"),
    ("reshard with world_size as a string", _world_size_string, TypeError,
     "world_size must be an int, got '3'"),
    ("reshard into the checkpoint's own folder", _output_is_the_source, ValueError,
     "is the checkpoint's own folder; pass another one"),
    ("reshard into a folder holding a checkpoint", _output_holds_a_checkpoint, FileExistsError,
     "already holds a checkpoint \\(checkpoint.pt\\); pass an empty or new output folder"),
    ("reshard with a plan naming an unknown table", _plan_names_unknown_table, ValueError,
     "names table 'C9', which the model does not have; its tables are \\['C1', 'C2'\\]"),
    ("tabstream reshard of a missing folder", _cli_no_checkpoint, DataError,
     "tabstream reshard: DataError: .*holds no sharded checkpoint[\\s\\S]*hint: pass the checkpoint_dir"),
    ("unsharded checkpoint resumed by another model", _unsharded_into_another_model, SchemaError,
     "does not match this DLRM .*'inputs.embeddings.C1.weight' has shape \\(100, 8\\) in the "
     "checkpoint, \\(100, 16\\) in the model"),
    ("mid-epoch resume with another global batch", _another_global_batch, SchemaError,
     "stopped after 2 batches of an epoch trained with global batches of 8 rows.*has 4 rows on "
     "1 rank\\(s\\).*resume with batch_size=8 on each of the 1 ranks"),
    ("mid-epoch resume on another dataset", _another_dataset, DataError,
     "stopped inside another file list .*data day-1, this loader's data day-2"),
]

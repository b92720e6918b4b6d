"""Distributed torch training: sharding plans, HybridParallel and sharded
checkpoints a user gets wrong (no process group needed, or a 1-rank one)."""

from __future__ import annotations

import contextlib
import json
import socket

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import TableConfig

# torch is imported inside the cases: the corpus also runs where torch is not installed


def DLRM(schema):  # noqa: N802 - stands for the model class
    from tabstream.train.torch import DLRM as model

    return model(schema)


def plan_sharding(*args, **kwargs):
    from tabstream.train.torch.distributed import plan_sharding as plan

    return plan(*args, **kwargs)


def HybridParallel(*args, **kwargs):  # noqa: N802
    from tabstream.train.torch.distributed import HybridParallel as wrapper

    return wrapper(*args, **kwargs)

TABLES = [TableConfig("C1", 1000, 16, ("C1",)), TableConfig("C2", 3, 8, ("C2",))]


def _schema() -> Schema:
    cat = [ColumnSchema(n, "int64", tags=[Tags.CATEGORICAL],
                        properties={"domain": {"min": 0, "max": c - 1}})
           for n, c in (("C1", 100), ("C2", 5))]
    return Schema([*cat, ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


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


def _unknown_table(tmp):
    plan_sharding(TABLES, 2, overrides={"C7": "row_wise"})


def _bad_sharding_type(tmp):
    plan_sharding(TABLES, 2, overrides={"C1": "by_row"})


def _row_wise_tiny_table(tmp):
    plan_sharding(TABLES, 4, overrides={"C2": "row_wise"})


def _world_size_string(tmp):
    plan_sharding(TABLES, "2")


def _no_process_group(tmp):
    HybridParallel(DLRM(_schema()))


def _plan_for_other_world(tmp):
    with _one_rank():
        HybridParallel(DLRM(_schema()), plan=plan_sharding(DLRM(_schema()), 2))


def _id_outside_table(tmp):
    import torch

    with _one_rank():
        model = HybridParallel(DLRM(_schema()), plan={"C1": "row_wise", "C2": "table_wise"})
        model({"C1": torch.tensor([3, 100]), "C2": torch.tensor([0, 1]),
               "x": torch.zeros(2)})


def _checkpoint_from_other_world(tmp):
    from tabstream.train.torch.sharded_checkpoint import POINTER_FILE, load_sharded

    (tmp / POINTER_FILE).write_text(json.dumps({"folder": "checkpoint-1.dcp", "world_size": 4}))
    with _one_rank():
        load_sharded(tmp)


def _damaged_pointer(tmp):
    from tabstream.train.torch.sharded_checkpoint import POINTER_FILE, load_sharded

    (tmp / POINTER_FILE).write_text("{not json")
    with _one_rank():
        load_sharded(tmp)


CASES = [
    ("plan names an unknown table", _unknown_table, ValueError,
     "names table 'C7', which the model does not have; its tables are \\['C1', 'C2'\\]"),
    ("plan with an unknown sharding type", _bad_sharding_type, ValueError,
     "table 'C1': sharding type must be one of .*got 'by_row'"),
    ("row_wise table with fewer rows than ranks", _row_wise_tiny_table, ValueError,
     "table 'C2' has 3 rows, fewer than 4 ranks"),
    ("world_size given as a string", _world_size_string, TypeError,
     "world_size must be an int, got '2'"),
    ("HybridParallel without a process group", _no_process_group, ValueError,
     "HybridParallel needs torch.distributed"),
    ("HybridParallel with a plan for another world size", _plan_for_other_world, ValueError,
     "the plan is for 2 ranks, but the process group has 1"),
    ("HybridParallel batch with an id outside its table", _id_outside_table, DataError,
     "feature 'C1': id 100 is outside table 'C1' \\(expected 0 <= id < 100\\)"),
    ("sharded checkpoint written by another world size", _checkpoint_from_other_world,
     SchemaError, "was written by 4 ranks, this run has 1"),
    ("damaged sharded checkpoint pointer", _damaged_pointer, DataError,
     "cannot read sharded checkpoint pointer .*checkpoint.dcp.json"),
]

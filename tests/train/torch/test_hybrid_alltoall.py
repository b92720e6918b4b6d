"""HybridParallel sends each id only to the ranks that own its table, rows or
columns: the bytes that ``comm_stats()`` reports on real gloo ranks (127.0.0.1)
equal what numpy computes, from the same batches and plan, that each rank must send
and receive; and the lookups still equal the plain model's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dist_helpers import CARDINALITIES, build, launch, plan_for, rank_batches

from tabstream.train.sharding import resolve_plan

WORKER = Path(__file__).with_name("hybrid_alltoall_worker.py")
KINDS = ["mixed", "row_wise", "column_wise", "table_wise", "data_parallel"]
DIM = 6  # build()'s embedding_dim
ID, FLOAT = 8, 4  # int64 ids and lengths, float32 vectors


def ids_and_lengths(features: dict, name: str) -> tuple[np.ndarray, np.ndarray]:
    x = features[name]
    if isinstance(x, tuple):
        values, offsets = (t.numpy() for t in x)
        return values, np.diff(offsets)
    return x.numpy(), np.ones(len(x), dtype=np.int64)


def whole(values: np.ndarray, lengths: np.ndarray) -> int:
    """Bytes of ids + lengths to the owner of a whole table or a column slice: every
    id, and every row's length unless each row holds exactly one id."""
    return ID * (len(values) + (0 if (lengths == 1).all() else len(lengths)))


def rows_in(values: np.ndarray, lengths: np.ndarray, start: int, stop: int
            ) -> tuple[int, int]:
    """(bytes of ids + lengths, pooled vectors returned) for the ids of one rank's
    batch that fall in rows [start, stop) of a row-wise table: lengths are sent only
    for the rows that have ids there, and only if one of those holds more than one."""
    row = np.repeat(np.arange(len(lengths)), lengths)
    inside = (values >= start) & (values < stop)
    per_row = np.bincount(row[inside], minlength=len(lengths))
    hit = per_row[per_row > 0]
    sent_lengths = 0 if (hit == 1).all() else len(hit)
    return ID * (int(inside.sum()) + sent_lengths), len(hit)


def expected(kind: str, batches: list[dict], world: int) -> list[dict[str, int]]:
    """What each rank sends and receives in one step, from numpy alone."""
    model, _ = build(kind, "sgd", "mean")
    plan = resolve_plan(plan_for(kind), model, world)
    # traffic[kind][s][d]: bytes rank s sends rank d
    traffic = {k: np.zeros((world, world), dtype=np.int64) for k in ("sizes", "ids", "vectors")}
    sharded = [n for n in CARDINALITIES if plan[n] != "data_parallel"]
    for s, features in enumerate(batches):
        batch = len(features["I1"])
        for d in range(world):
            pieces = 0
            for name in sharded:
                place = plan.placements[name]
                values, lengths = ids_and_lengths(features, name)
                if place.kind == "table_wise":
                    if place.owner != d:
                        continue
                    id_bytes, returned = whole(values, lengths), batch * DIM
                else:
                    start, stop = place.ranges[d]
                    if stop <= start:
                        continue
                    if place.kind == "column_wise":
                        id_bytes, returned = whole(values, lengths), batch * (stop - start)
                    else:
                        id_bytes, hit = rows_in(values, lengths, start, stop)
                        returned = hit * DIM
                pieces += 1
                traffic["ids"][s, d] += id_bytes
                traffic["vectors"][d, s] += returned * FLOAT
            traffic["sizes"][s, d] = ID * (1 + 2 * pieces)
    out = []
    for r in range(world):
        others = [k for k in range(world) if k != r]
        row = {}
        for k, t in traffic.items():
            row[f"{k}_sent"] = int(t[r, others].sum())
            row[f"{k}_received"] = int(t[others, r].sum())
        row["gradients_sent"] = row["vectors_received"]
        row["gradients_received"] = row["vectors_sent"]
        row["sent"] = sum(v for k, v in row.items() if k.endswith("_sent"))
        row["received"] = sum(v for k, v in row.items() if k.endswith("_received"))
        out.append(row)
    return out


def all_gather_id_bytes(kind: str, batches: list[dict], world: int, r: int) -> int:
    """What the all-gather of ids (the exchange before this one) sent per rank: every
    sharded feature's ids and lengths to each other rank."""
    model, _ = build(kind, "sgd", "mean")
    plan = resolve_plan(plan_for(kind), model, world)
    features = batches[r]
    total = 0
    for name in CARDINALITIES:
        if plan[name] != "data_parallel":
            values, lengths = ids_and_lengths(features, name)
            total += ID * (len(values) + len(lengths))
    return total * (world - 1)


def check(tmp_path, world: int, sizes: list[list[int]]) -> None:
    launch(world, "run", tmp_path, ",".join(KINDS), json.dumps(sizes),
           worker=WORKER)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world)]
    steps = rank_batches(7, sizes)
    for kind in KINDS:
        totals = [dict.fromkeys(reports[0][kind]["lasts"][0], 0) for _ in range(world)]
        for i, step in enumerate(steps):
            want = expected(kind, [f for f, _ in step], world)
            for r in range(world):
                got = reports[r][kind]["lasts"][i]
                assert got == want[r], (kind, i, r)
                for key in totals[r]:
                    totals[r][key] += want[r][key]
        for r in range(world):
            stats = reports[r][kind]["stats"]
            assert stats["steps"] == len(steps)
            assert stats["total"] == totals[r], (kind, r)
            hybrid, plain = (np.array(x) for x in reports[r][kind]["logits"])
            np.testing.assert_allclose(hybrid, plain, rtol=0, atol=1e-6, err_msg=kind)
        if kind == "data_parallel":  # nothing sharded: only the batch sizes travel
            assert all(reports[r][kind]["stats"]["total"]["sent"] == ID * (world - 1) * 2
                       for r in range(world))
        if kind in ("row_wise", "table_wise"):  # each id to one rank, not to all
            for r in range(world):
                got = reports[r][kind]["lasts"][0]["ids_sent"]
                assert got < all_gather_id_bytes(kind, [f for f, _ in steps[0]], world, r)


def test_two_ranks_send_what_numpy_says(tmp_path):
    check(tmp_path, 2, [[9, 6], [5, 2]])


@pytest.mark.slow
def test_three_ranks_send_what_numpy_says(tmp_path):
    check(tmp_path, 3, [[9, 6, 4], [2, 7, 5]])

"""Checkpoints of a :class:`~tabstream.train.torch.distributed.HybridParallel` model in
whole-table coordinates: written by ``fit`` on W ranks, read back on any number of
ranks with any plan (``fit(resume=True)``), or converted offline (:func:`reshard`,
``tabstream reshard CK OUT --world-size W``).

Each rank saves its tensors as regions of the *unwrapped* model's tensors (its
``state_dict`` keys), and each optimizer slot shaped like its parameter (Adam's
moments, Adagrad's sums) as the same region of a whole slot tensor::

    rank 1 of 2, C1 row_wise (rows 25:50 of 50 x 6), LazyAdam:
        "model/inputs.embeddings.C1.weight"                     chunk at (25, 0), 25 x 6
        "optim/optimizer/inputs.embeddings.C1.weight/exp_avg"   chunk at (25, 0), 25 x 6
        "optim/optimizer/inputs.embeddings.C1.weight/exp_avg_sq" ...
        step: 12 (JSON), the plan and the model's shapes (JSON, "layout")

A rank of another plan asks for its own regions; DCP reads the stored chunks that
overlap them (:func:`~tabstream.train.torch.sharded_checkpoint.load_pieces`). Since a
shard's rows and their optimizer slots move together and nothing is recomputed,
training on after a reshard is the training that would have happened without the
stop. Plain values (epoch, step, history, the data position) come from rank 0's
part (rank r's, for the ranks both runs have); torch's RNG state from rank r (rank
0's for new ranks).
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tabstream.core.errors import DataError, SchemaError, TabstreamError
from tabstream.train.sharding import ShardingPlan, resolve_plan
from tabstream.train.tables import TableConfig
from tabstream.train.torch.sharded_checkpoint import (
    FORMAT,
    POINTER_FILE,
    Chunk,
    Piece,
    Stored,
    load_pieces,
    read_parts,
    sharded_exists,
    write_parts,
)

__all__ = ["LAYOUT", "OPTIMIZER_PARAMS", "Restored", "checkpoint_state", "optimizer_state_by_name",
           "reshard", "restore"]

#: the version of the whole-table layout a part's "layout" describes
LAYOUT = "tabstream.whole-tables/1"
#: the key of a 1-rank ``checkpoint.pt`` (:func:`reshard`) that names the parameter of
#: each id of its torch optimizer state: ``names[id]``
OPTIMIZER_PARAMS = "optimizer_params"
_OWN = ("layout", "model", "optimizer")


# ----------------------------------------------------------------------- saving


def checkpoint_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """This rank's ``{"layout", "model", "optimizer"}`` for a checkpoint payload: the
    model's tensors and the optimizer's slots as :class:`Chunk` values of the
    unwrapped model's tensors."""
    pieces = model.state_pieces()
    state = model.module.state_dict()
    out_model = {pieces[k].key: Chunk("model/" + pieces[k].key, t, pieces[k].offsets,
                                      pieces[k].size) for k, t in state.items()}
    layout = {**model.layout(), "version": LAYOUT, "rank": model.rank}
    return {"layout": layout, "model": out_model,
            "optimizer": _optimizer_state(model, optimizer, pieces)}


def _leaves(optimizer: Any) -> tuple[str, dict[str, torch.optim.Optimizer]] | None:
    """``(kind, {leaf key: torch optimizer})``: a MultiOptimizer's optimizers, or the
    optimizer itself; None for other optimizer objects (not resharded)."""
    from tabstream.train.torch.optimizers import MultiOptimizer

    if isinstance(optimizer, MultiOptimizer):
        return "multi", optimizer.optimizers
    if isinstance(optimizer, torch.optim.Optimizer):
        return "torch", {"optimizer": optimizer}
    return None


def _optimizer_state(model: Any, optimizer: Any, pieces: Mapping[str, Any]) -> dict[str, Any]:
    found = _leaves(optimizer)
    if found is None:  # kept as this rank wrote it: loads on the same plan only
        return {"kind": "opaque", "class": type(optimizer).__name__,
                "state": optimizer.state_dict()}
    kind, leaves = found
    names = {id(p): n for n, p in model.module.named_parameters()}
    # each leaf's group_of lists its parameters in the optimizer's order; param_order
    # is this rank's module's own order, which reshard compares it with
    out: dict[str, Any] = {"kind": kind, "leaves": {},
                           "format": optimizer.state_dict().get("format") if kind == "multi"
                           else None,
                           "param_order": [pieces[n].key for n in names.values()]}
    for key, opt in leaves.items():
        sd = opt.state_dict()
        group_of: dict[str, int] = {}
        state: dict[str, Any] = {}
        i = 0
        for gi, group in enumerate(opt.param_groups):
            for p in group["params"]:
                if id(p) not in names:
                    raise ValueError(f"checkpoint: optimizer {key!r} holds a parameter of shape "
                                     f"{tuple(p.shape)} that is not in the model")
                piece = pieces[names[id(p)]]
                group_of[piece.key] = gi
                slots = sd["state"].get(i)
                if slots:
                    state[piece.key] = {
                        s: (Chunk(f"optim/{key}/{piece.key}/{s}", v, piece.offsets, piece.size)
                            if isinstance(v, torch.Tensor) and v.dim() > 0
                            and tuple(v.shape) == tuple(p.shape) else v)
                        for s, v in slots.items()}
                i += 1
        out["leaves"][key] = {"class": type(opt).__name__,
                              "groups": [{k: v for k, v in g.items() if k != "params"}
                                         for g in sd["param_groups"]],
                              "group_of": group_of, "state": state}
    return out


# ---------------------------------------------------------------------- reading


def _is_whole_table_layout(doc: Mapping[str, Any], parts: list[Any]) -> bool:
    return doc.get("format") == FORMAT and all(
        isinstance(p, dict) and isinstance(p.get("layout"), dict)
        and p["layout"].get("version") == LAYOUT for p in parts)


def _merge_leaves(parts: list[Any]) -> tuple[str, str | None, dict[str, dict[str, Any]]]:
    """Every rank's optimizer leaves as one: groups, each parameter's group (in the
    order of :func:`_merge_order`), each parameter's slots (from the first rank
    holding it)."""
    kinds = {p["optimizer"]["kind"] for p in parts}
    kind = parts[0]["optimizer"]["kind"]
    if len(kinds) > 1:
        raise _refuse(DataError, f"sharded checkpoint: its ranks hold optimizers of kinds {sorted(kinds)}")
    merged: dict[str, dict[str, Any]] = {}
    if kind == "opaque":
        return kind, None, merged
    before: dict[str, set[tuple[str, str]]] = {}
    for part in parts:
        own = part["optimizer"].get("param_order")
        for key, leaf in part["optimizer"]["leaves"].items():
            m = merged.setdefault(key, {"class": leaf["class"], "groups": leaf["groups"],
                                        "group_of": {}, "state": {}})
            m["group_of"].update(leaf["group_of"])
            before.setdefault(key, set()).update(_reordered(leaf["group_of"], own or []))
            for fqn, slots in leaf["state"].items():
                m["state"].setdefault(fqn, slots)
    named = list(parts[0]["layout"].get("params", []))
    for key, m in merged.items():
        m["group_of"] = {f: m["group_of"][f]
                         for f in _merge_order(list(m["group_of"]), before[key], named)}
    return kind, parts[0]["optimizer"].get("format"), merged


def _reordered(group_of: Mapping[str, int], own: list[str]) -> set[tuple[str, str]]:
    """The pairs ``(a, b)`` of one group that a rank's optimizer lists ``a`` first
    although its module (``own``) has ``b`` first: the order its user chose."""
    position = {f: i for i, f in enumerate(own)}
    order = [f for f in group_of if f in position]
    return {(a, b) for i, a in enumerate(order) for b in order[i + 1:]
            if group_of[a] == group_of[b] and position[a] > position[b]}


def _merge_order(params: list[str], before: set[tuple[str, str]],
                 named: list[str]) -> list[str]:
    """``params`` in the unwrapped model's ``named_parameters`` order (``named``),
    except that ``a`` comes before ``b`` for each pair of ``before`` (the orders the
    ranks' optimizers chose, see :func:`_reordered`; ignored where they conflict)."""
    position = {f: i for i, f in enumerate(named)}

    def rank(f: str) -> tuple[int, str]:
        return position.get(f, len(position)), f

    after: dict[str, list[str]] = {}
    waits = dict.fromkeys(params, 0)
    for a, b in before:
        if a in waits and b in waits:
            after.setdefault(a, []).append(b)
            waits[b] += 1
    ready = [rank(f) for f, n in waits.items() if n == 0]
    heapq.heapify(ready)
    out: list[str] = []
    while ready:
        f = heapq.heappop(ready)[1]
        out.append(f)
        for b in after.get(f, ()):
            waits[b] -= 1
            if waits[b] == 0:
                heapq.heappush(ready, rank(b))
    done = set(out)
    return out + sorted((f for f in params if f not in done), key=rank)


def _refuse(cls: type[TabstreamError], message: str, fix: str | None = None) -> TabstreamError:
    """``cls`` with ``message``, then what to do (also as the error's ``hint``)."""
    return cls(f"{message}; {fix}" if fix else message, hint=fix)


def _check_model(directory: Path, model: Any, layout: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another model class or other shapes, naming the first
    differences, before anything is read."""
    here = model.layout()
    hint = ("the checkpoint belongs to another training run: pass another checkpoint_dir "
            "(--checkpoint-dir), or resume=False (--no-resume) to train from scratch")
    if layout["model_class"] != here["model_class"]:
        raise _refuse(SchemaError, f"checkpoint {directory} was written for a {layout['model_class']} "
                          f"model, not {here['model_class']}", fix=hint)
    saved, now = layout["shapes"], here["shapes"]
    diffs = [f"{k!r} only in the checkpoint" for k in saved if k not in now]
    diffs += [f"{k!r} missing from the checkpoint" for k in now if k not in saved]
    diffs += [f"{k!r} has shape {tuple(saved[k])} in the checkpoint, {tuple(now[k])} in the "
              "model" for k in now if k in saved and list(saved[k]) != list(now[k])]
    if diffs:
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        raise _refuse(SchemaError, f"checkpoint {directory} does not match this {here['model_class']} "
                          f"(another schema or model settings?): {'; '.join(diffs[:5])}{more}",
                          fix=hint)


def _rest(part: Mapping[str, Any], requests: dict[str, Piece]) -> dict[str, Any]:
    """A part's plain values (loop state, RNG), its own tensors added to ``requests``."""

    def walk(obj: Any) -> None:
        if isinstance(obj, Stored):
            requests["r/" + obj.piece.key] = obj.piece
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    rest = {k: v for k, v in part.items() if k not in _OWN}
    walk(rest)
    return rest


def _fill(obj: Any, tensors: Mapping[str, torch.Tensor], prefix: str = "r/") -> Any:
    if isinstance(obj, Stored):
        return tensors[prefix + obj.piece.key]
    if isinstance(obj, dict):
        return {k: _fill(v, tensors, prefix) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(_fill(v, tensors, prefix) for v in obj)
    if isinstance(obj, list):
        return [_fill(v, tensors, prefix) for v in obj]
    return obj


def _table_of(layout: Mapping[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    return {t["key"]: (name, t) for name, t in layout["tables"].items()}


def _refuse_unsliceable(directory: Path, fqn: str, slot: str, value: Any,
                        layout: Mapping[str, Any], world: int) -> None:
    table = _table_of(layout).get(fqn)
    if isinstance(value, Stored) and not value.chunk and table and \
            table[1]["kind"] != "data_parallel":
        raise _refuse(DataError,
            f"checkpoint {directory}: optimizer slot {slot!r} of table {table[0]!r} has shape "
            f"{value.size}, not the table's: it cannot be cut by rows or columns",
            fix=f"resume on {world} ranks with the checkpoint's plan")


@dataclass
class Restored:
    """What :func:`restore` read: the checkpoint's plain values (loop state, RNG), the
    world size that wrote it, whether its plan differs from this run's, and the bytes
    this rank read."""

    values: dict[str, Any]
    written_by: int
    resharded: bool
    bytes_read: int

    def note(self, directory: Any, world_size: int, rank: int) -> str | None:
        """One line for the user when the checkpoint was resharded, else None: on
        another world size, what to append to the loop's line on the change of workers
        (which names both sizes); with another plan on the same size, a whole line."""
        if not self.resharded:
            return None
        what = f"tables and optimizer state resharded ({self.bytes_read:,} bytes read on rank {rank})"
        if self.written_by != world_size:
            return what
        return (f"fit: checkpoint {directory} was written with another plan; resuming on "
                f"{world_size} rank(s) with this one: {what}")


def restore(model: Any, optimizer: Any, directory: str | os.PathLike[str],
            group: Any = None) -> Restored | None:
    """Collective: load the sharded checkpoint in ``directory`` into ``model`` (a
    :class:`HybridParallel`, any world size and plan) and ``optimizer``; None for a
    checkpoint of the older per-rank layout (then load it as written)."""
    directory = Path(directory)
    doc, folder, parts = read_parts(directory)
    if not _is_whole_table_layout(doc, parts):
        return None
    layout = parts[0]["layout"]
    _check_model(directory, model, layout)
    world, rank = int(doc["world_size"]), model.rank
    src = parts[rank if rank < world else 0]
    requests: dict[str, Piece] = {}
    pieces = model.state_pieces()
    live = model.module.state_dict()
    for k, sp in pieces.items():
        requests["m/" + k] = Piece("model/" + sp.key, sp.offsets, tuple(live[k].shape),
                                   live[k].dtype)
    kind, _, merged = _merge_leaves(parts)
    found = _leaves(optimizer)
    fills: list[tuple[str, torch.optim.Optimizer, list[dict[str, Any]],
                      dict[int, dict[str, Any]], list[list[int]]]] = []
    if kind == "opaque" or found is None:
        if world != model.world_size or found is not None or kind != "opaque":
            raise _refuse(SchemaError,
                f"checkpoint {directory}: its optimizer ({_opt_name(parts[0])}) and this run's "
                f"({type(optimizer).__name__}) are not both torch optimizers or MultiOptimizers "
                "on the checkpoint's world size; only those are resharded",
                fix="resume with the optimizer the checkpoint was written with, on "
                     f"{world} ranks")
        state = _rest({"s": src["optimizer"]["state"]}, requests)["s"]
    else:
        live_kind, leaves = found
        if live_kind != kind or set(leaves) != set(merged):
            raise _refuse(SchemaError,
                f"checkpoint {directory}: its optimizer ({_opt_name(parts[0])}, optimizers "
                f"{sorted(merged)}) differs from this run's ({type(optimizer).__name__}, "
                f"optimizers {sorted(leaves)})",
                fix="build the optimizer as the checkpointed run did, or start over with "
                     "resume=False")
        names = {id(p): n for n, p in model.module.named_parameters()}
        for key, opt in leaves.items():
            saved = merged[key]
            if saved["class"] != type(opt).__name__ or len(saved["groups"]) != len(opt.param_groups):
                raise _refuse(SchemaError,
                    f"checkpoint {directory}: optimizer {key!r} was a {saved['class']} with "
                    f"{len(saved['groups'])} parameter group(s), now a {type(opt).__name__} "
                    f"with {len(opt.param_groups)}",
                    fix="build the optimizer as the checkpointed run did")
            slots_of: dict[int, dict[str, Any]] = {}
            members: list[list[int]] = []
            i = 0
            for gi, g in enumerate(opt.param_groups):
                members.append([])
                for p in g["params"]:
                    sp = pieces[names[id(p)]]
                    if saved["group_of"].get(sp.key) != gi:
                        raise _refuse(SchemaError,
                            f"checkpoint {directory}: parameter {sp.key!r} is in group "
                            f"{saved['group_of'].get(sp.key)} of optimizer {key!r} in the "
                            f"checkpoint, in group {gi} now",
                            fix="build the optimizer as the checkpointed run did")
                    members[-1].append(i)
                    for s, v in saved["state"].get(sp.key, {}).items():
                        _refuse_unsliceable(directory, sp.key, s, v, layout, world)
                        if isinstance(v, Stored) and v.chunk:
                            requests[f"o/{key}/{i}/{s}"] = Piece(v.piece.key, sp.offsets,
                                                                 tuple(p.shape), v.piece.dtype)
                        elif isinstance(v, Stored):
                            requests[f"o/{key}/{i}/{s}"] = v.piece
                        slots_of.setdefault(i, {})[s] = v
                    i += 1
            fills.append((key, opt, saved["groups"], slots_of, members))
    rest = _rest(src, requests)
    tensors, nbytes = load_pieces(folder, requests, group)
    model.module.load_state_dict({k: tensors["m/" + k] for k in pieces})
    if kind == "opaque":
        optimizer.load_state_dict(_fill(state, tensors))
    for key, opt, groups, slots_of, members in fills:
        opt.load_state_dict({
            "state": {i: {s: tensors[f"o/{key}/{i}/{s}"] if isinstance(v, Stored) else v
                          for s, v in slots.items()} for i, slots in slots_of.items()},
            "param_groups": [{**g, "params": m} for g, m in zip(groups, members)],
        })
    resharded = world != model.world_size or _placements(layout) != _placements(model.layout())
    return Restored(_fill(rest, tensors), world, resharded, nbytes)


def _opt_name(part: Mapping[str, Any]) -> str:
    opt = part["optimizer"]
    if opt["kind"] == "opaque":
        return str(opt["class"])
    if opt["kind"] == "multi":
        return "MultiOptimizer"
    return str(next(iter(opt["leaves"].values()))["class"])


def _placements(layout: Mapping[str, Any]) -> dict[str, Any]:
    return {n: (t["kind"], t["owner"], [list(r) for r in t["ranges"]])
            for n, t in layout["tables"].items()}


# ------------------------------------------------------------------ offline


def _region(t: torch.Tensor, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
    for dim, (o, n) in enumerate(zip(offsets, sizes)):
        t = t.narrow(dim, o, n)
    return t.clone()


def _describe(plan: ShardingPlan, layout: Mapping[str, Any]) -> dict[str, Any]:
    return {name: {**t, "kind": plan.placements[name].kind, "owner": plan.placements[name].owner,
                   "ranges": [list(r) for r in plan.placements[name].ranges]}
            for name, t in layout["tables"].items()}


def reshard(src: str | os.PathLike[str], dst: str | os.PathLike[str], world_size: int,
            plan: ShardingPlan | Mapping[str, str] | str | None = None) -> Path:
    """Convert the sharded checkpoint that ``fit`` wrote in ``src`` (a
    :class:`HybridParallel` model on W ranks) into a checkpoint for ``world_size``
    ranks in ``dst``; return the file or folder written.

    ``plan`` is the new plan as ``HybridParallel(plan=...)`` takes it (``None``: the
    ``"auto"`` plan for ``world_size`` ranks; pass the plan the new run will use).
    ``world_size=1`` writes ``dst/checkpoint.pt``, which single-process
    ``fit(model, ..., checkpoint_dir=dst, resume=True)`` of the *unwrapped* model
    accepts (tensors and plain values only: ``torch.load(weights_only=True)``); any
    other size writes a sharded checkpoint whose ranks each read their own regions
    only. Optimizer state (a torch optimizer or a :class:`MultiOptimizer` over the
    model's parameters) moves with its rows. In ``checkpoint.pt`` a torch
    optimizer's parameters are in the order the training run's optimizer listed them
    (where its ranks tell; else in ``named_parameters`` order) and named under
    :data:`OPTIMIZER_PARAMS`, by which ``fit(resume=True)`` matches them; a
    MultiOptimizer's state is keyed by name. One process reads every tensor of
    ``src`` once and holds them in memory while it writes. For example,
    ``reshard("ck/", "ck3/", world_size=3)`` returns the folder written, such as
    ``PosixPath('ck3/checkpoint-000000120.dcp')``.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"reshard: world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"reshard: world_size must be >= 1, got {world_size}")
    src, dst = Path(src), Path(dst)
    from tabstream.train.torch.fit import CHECKPOINT_FILE

    if not sharded_exists(src):
        if (src / CHECKPOINT_FILE).exists():
            raise _refuse(DataError, f"reshard: {src} holds a whole-model checkpoint ({CHECKPOINT_FILE}), "
                            "not a sharded one: it resumes on any number of ranks as it is",
                            fix="pass the checkpoint_dir of a HybridParallel run")
        raise _refuse(DataError, f"reshard: {src} holds no sharded checkpoint (no {POINTER_FILE})",
                        fix="pass the checkpoint_dir that fit wrote with a HybridParallel model")
    if dst.resolve() == src.resolve():
        raise ValueError(f"reshard: the output folder {dst} is the checkpoint's own folder; "
                         "pass another one")
    taken = [n for n in (POINTER_FILE, CHECKPOINT_FILE) if (dst / n).exists()]
    if taken:
        raise FileExistsError(f"reshard: {dst} already holds a checkpoint ({taken[0]}); "
                              "pass an empty or new output folder")
    doc, folder, parts = read_parts(src)
    if not _is_whole_table_layout(doc, parts):
        raise _refuse(DataError,
            f"reshard: checkpoint {src} was written by an older tabstream, whose sharded "
            "checkpoints do not record the plan",
            fix=f"resume it once on its {doc['world_size']} ranks with this version (its next "
                 "checkpoint records the plan), then reshard that")
    layout = parts[0]["layout"]
    kind, fmt, merged = _merge_leaves(parts)
    if kind == "opaque":
        raise _refuse(DataError, f"reshard: checkpoint {src} holds the state of a "
                        f"{parts[0]['optimizer']['class']}, which is not resharded",
                        fix="train with a torch optimizer or a MultiOptimizer")
    configs = [TableConfig(name, int(t["cardinality"]), int(t["dim"]), (name,))
               for name, t in layout["tables"].items()]
    target = resolve_plan(plan, configs, world_size, who="reshard")
    # every stored tensor, whole, read once
    requests: dict[str, Piece] = {}
    for part in parts:
        for stored in part["model"].values():
            requests[stored.piece.key] = Piece(stored.piece.key, (0,) * len(stored.size),
                                               stored.size, stored.piece.dtype)
        for leaf in part["optimizer"]["leaves"].values():
            for fqn, slots in leaf["state"].items():
                for s, v in slots.items():
                    _refuse_unsliceable(src, fqn, s, v, layout, int(doc["world_size"]))
                    if isinstance(v, Stored):
                        requests[v.piece.key] = Piece(v.piece.key, (0,) * len(v.size),
                                                      v.size, v.piece.dtype)
    rests = [_rest(p, requests) for p in parts]
    whole, _ = load_pieces(folder, requests, no_dist=True)
    rests = [_fill(r, whole) for r in rests]

    def value(v: Any, offsets: tuple[int, ...] | None = None,
              sizes: tuple[int, ...] | None = None) -> Any:
        if not isinstance(v, Stored):
            return v
        t = whole[v.piece.key]
        return t if offsets is None or not v.chunk else _region(t, offsets, sizes or ())

    dst.mkdir(parents=True, exist_ok=True)
    if world_size == 1:
        return _write_single(dst, layout, kind, fmt, merged, whole, rests[0], value)
    tables = _table_of(layout)
    out = []
    for r in range(world_size):
        regions: dict[str, tuple[tuple[int, ...], tuple[int, ...]] | None] = {}
        for fqn, shape in layout["shapes"].items():
            if fqn in tables:
                name, cfg = tables[fqn]
                regions[fqn] = target.placements[name].region(r, int(cfg["cardinality"]),
                                                              int(cfg["dim"]))
            else:
                regions[fqn] = ((0,) * len(shape), tuple(shape))
        model_part = {}
        for fqn, shape in layout["shapes"].items():
            region = regions[fqn]
            if region is not None:
                model_part[fqn] = Chunk("model/" + fqn, _region(whole["model/" + fqn], *region),
                                        region[0], tuple(shape))
        leaves = {}
        for key, leaf in merged.items():
            held = [f for f in leaf["group_of"] if regions.get(f) is not None]
            state = {}
            for fqn in held:
                if fqn not in leaf["state"]:
                    continue
                offsets, sizes = regions[fqn] or ((), ())
                state[fqn] = {
                    s: (Chunk(v.piece.key, value(v, offsets, sizes), offsets, v.size)
                        if isinstance(v, Stored) and v.chunk else value(v))
                    for s, v in leaf["state"][fqn].items()}
            leaves[key] = {"class": leaf["class"], "groups": leaf["groups"],
                           "group_of": {f: leaf["group_of"][f] for f in held}, "state": state}
        part_layout = {**layout, "world_size": world_size, "rank": r,
                       "tables": _describe(target, layout)}
        rest = rests[r] if r < len(rests) else rests[0]
        out.append({**rest, "layout": part_layout, "model": model_part,
                    "optimizer": {"kind": kind, "format": fmt, "leaves": leaves,
                                  "param_order": [f for f in layout["params"]
                                                  if regions.get(f) is not None]}})
    return write_parts(dst, out, tag=Path(doc["folder"]).stem)


def optimizer_state_by_name(state: Mapping[str, Any], names: list[str], model: torch.nn.Module,
                            optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """``state`` (a torch optimizer's ``state_dict`` whose id ``i`` stands for the
    parameter ``names[i]`` of ``model``) renumbered in ``optimizer``'s order, so that
    ``optimizer.load_state_dict`` puts each slot on the parameter of its name. Raises
    ValueError when a group holds other parameters than the saved one."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    saved_groups = state["param_groups"]
    if len(saved_groups) != len(optimizer.param_groups):
        raise ValueError(f"{len(saved_groups)} parameter group(s) saved, "
                         f"{len(optimizer.param_groups)} now")
    if sorted(i for g in saved_groups for i in g["params"]) != list(range(len(names))):
        raise ValueError(f"the saved ids are not the {len(names)} named ones")
    slots: dict[int, Any] = {}
    groups: list[dict[str, Any]] = []
    index = 0
    for gi, (saved, live) in enumerate(zip(saved_groups, optimizer.param_groups)):
        id_of = {names[i]: i for i in saved["params"]}
        here = [name_of.get(id(p), "") for p in live["params"]]
        if len(set(here)) != len(here) or set(here) != set(id_of):
            raise ValueError(f"parameter group {gi} holds other parameters than the saved "
                             f"one ({len(here)} now, {len(id_of)} saved)")
        ids = []
        for n in here:
            if id_of[n] in state["state"]:
                slots[index] = state["state"][id_of[n]]
            ids.append(index)
            index += 1
        groups.append({**saved, "params": ids})
    return {**state, "state": slots, "param_groups": groups}


def _write_single(dst: Path, layout: Mapping[str, Any], kind: str, fmt: str | None,
                  merged: Mapping[str, Any], whole: Mapping[str, torch.Tensor],
                  rest: Mapping[str, Any], value: Any) -> Path:
    from tabstream.train.torch.fit import CHECKPOINT_FILE

    model_state = {fqn: whole["model/" + fqn] for fqn in layout["shapes"]}
    extra: dict[str, Any] = {}
    if kind == "torch":
        # torch pairs saved ids with parameters by position: number them in the order
        # the training run's optimizer had (_merge_order), and name them for fit
        leaf = merged["optimizer"]
        state, groups, names = {}, [], []
        for gi, g in enumerate(leaf["groups"]):
            ids = []
            for fqn in (f for f, i in leaf["group_of"].items() if i == gi):
                if fqn in leaf["state"]:
                    state[len(names)] = {s: value(v) for s, v in leaf["state"][fqn].items()}
                ids.append(len(names))
                names.append(fqn)
            groups.append({**g, "params": ids})
        optimizer: dict[str, Any] = {"state": state, "param_groups": groups}
        extra[OPTIMIZER_PARAMS] = names
    else:
        optimizer = {"format": fmt, "optimizers": {
            key: {"class": leaf["class"],
                  "state": {f: {s: value(v) for s, v in slots.items()}
                            for f, slots in leaf["state"].items()},
                  "param_groups": [{**g, "params": [f for f, i in leaf["group_of"].items()
                                                    if i == gi]}
                                   for gi, g in enumerate(leaf["groups"])]}
            for key, leaf in merged.items()}}
    payload = {**rest, "model_class": layout["model_class"], "model": model_state,
               "optimizer": optimizer, **extra}
    path = dst / CHECKPOINT_FILE
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        torch.save(payload, f)
    os.replace(tmp, path)
    return path

"""Checkpoints of a Keras :class:`~tabstream.train.tensorflow.distributed.HybridParallel`
in whole-table coordinates: written by every worker of ``fit`` on W workers, read back
on any number of workers with any plan (``fit(resume=True)``), or converted offline
(:func:`reshard`, ``tabstream reshard CK OUT --world-size W``).

A worker's save is a folder of numpy ``.npy`` arrays (read with ``allow_pickle=False``)
and one JSON index. Each array is a region of one tensor of the *unwrapped* model,
named by its variable path, or of one optimizer slot shaped like its variable
(Adam's moments, Adagrad's accumulators), named by the optimizer it belongs to::

    worker 1 of 2, cat_1 row_wise (rows 50:100 of 100 x 8), LazyAdam as optimizer 1:
      "model/cat_1/embeddings"                  at (50, 0), 50 x 8 of 100 x 8
      "opt/1/cat_1/embeddings/momentum"         at (50, 0), 50 x 8 of 100 x 8
      "opt/1/cat_1/embeddings/velocity"         ...
      "model/dlrm/head/kernel"                  at (0, 0), the whole 8 x 1 (every worker)
    scalars: {"1/iteration": 12, "multi/iteration": 12, ...}   layout: the plan, the shapes

Optimizers are numbered as the user built them: ``0`` a plain optimizer or a
:class:`~tabstream.train.tensorflow.optimizers.MultiOptimizer`'s default, ``1, 2, ...``
its other optimizers in order (the wrapper splits a MultiOptimizer into a mirrored
and a shard part; both keep these numbers). A worker of another plan asks for its
own regions: the stored arrays that overlap them are memory-mapped and only the
overlap is copied, so a worker reads about the bytes it holds (counted, and said in
the resume line). Every worker also writes the mirrored (dense) weights, so that a
resume on as many workers reads its own folder only; a resume on another number of
workers reads the folders of the workers that wrote the checkpoint, which must be
on a filesystem every worker sees.

Since a shard's rows and their optimizer slots move together and nothing is
recomputed, training on after a reshard is the training that would have happened
without the stop.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tabstream.core.errors import DataError, SchemaError, TabstreamError
from tabstream.core.jsonfile import read_json_file
from tabstream.train.sharding import ShardingPlan, resolve_plan
from tabstream.train.tables import TableConfig

__all__ = ["INDEX", "LAYOUT", "Restored", "is_keras_checkpoint", "load_named", "reshard",
           "restore_wrapper", "write_wrapper"]

#: the version of the whole-table layout of a Keras save
LAYOUT = "tabstream.keras-whole-tables/1"
#: a save's index (JSON): its layout, its arrays and their regions, its scalars
INDEX = "index.json"
#: the single-process checkpoint :func:`reshard` writes for one worker (beside checkpoint.json)
NAMED_DIR = "checkpoint.arrays"
_PART = re.compile(r"worker-(\d+)-of-(\d+)")
_SAVE = re.compile(r"step-(\d+)-(\d+)-(\d+)")


def _refuse(cls: type[TabstreamError], message: str, fix: str) -> TabstreamError:
    return cls(f"{message}; {fix}", hint=fix)


# ------------------------------------------------------------------ regions of a table


def _region(array: np.ndarray, offsets: Iterable[int], sizes: Iterable[int]) -> np.ndarray:
    return np.ascontiguousarray(array[tuple(slice(o, o + n) for o, n in zip(offsets, sizes))])


# ------------------------------------------------------------------ optimizer state


def _leaves(optimizer: Any, numbering: list[int] | None) -> tuple[list[tuple[int, Any]], Any]:
    """``([(number, leaf optimizer)], the MultiOptimizer or None)``."""
    from tabstream.train.tensorflow.optimizers import MultiOptimizer

    if isinstance(optimizer, MultiOptimizer):
        subs = optimizer.optimizers
        numbers = numbering if numbering is not None else list(range(len(subs)))
        return list(zip(numbers, subs, strict=True)), optimizer
    return [(0, optimizer)], None


def optimizer_state(optimizer: Any, numbering: list[int] | None, variables: list[Any],
                    skip: Iterable[Any] = ()) -> tuple[list[tuple[int, Any, str, Any]],
                                                       dict[str, Any]]:
    """``([(optimizer number, variable, slot name, slot variable)], {scalar name:
    variable})`` of a built Keras ``optimizer`` over ``variables``. A slot is an
    optimizer variable made from its variable (Keras names it after the variable's
    path: ``<path with _>_<slot>``, the shape of the variable); the scalars are each
    optimizer's own (``"1/iteration"``, ``"multi/iteration"``). Slots of the variables
    in ``skip`` are left out."""
    leaves, multi = _leaves(optimizer, numbering)
    skipped = {id(v) for v in skip}
    by_leaf: dict[int, list[Any]] = {}
    for v in variables:
        leaf = multi.optimizer_for(v) if multi is not None else optimizer
        by_leaf.setdefault(id(leaf), []).append(v)
    slots: list[tuple[int, Any, str, Any]] = []
    scalars: dict[str, Any] = {}
    seen: set[int] = set()
    for number, leaf in leaves:
        params = sorted(((str(v.path).replace("/", "_") + "_", v)
                         for v in by_leaf.get(id(leaf), [])), key=lambda p: -len(p[0]))
        for sv in leaf.variables:
            seen.add(id(sv))
            name = str(sv.name)
            match = next(((prefix, v) for prefix, v in params
                          if name.startswith(prefix) and tuple(sv.shape) == tuple(v.shape)),
                         None)
            if match is not None:
                if id(match[1]) not in skipped:
                    slots.append((number, match[1], name[len(match[0]):], sv))
            elif len(sv.shape) == 0:
                scalars[f"{number}/{name}"] = sv
            else:
                raise _refuse(SchemaError,
                    f"checkpoint: optimizer variable {sv.path!r} of {type(leaf).__name__} has "
                    f"shape {tuple(sv.shape)} and belongs to no variable it updates, so it "
                    "cannot move with rows or columns",
                    "train with an optimizer whose state is per variable (Adam, LazyAdam, "
                    "Adagrad, SGD, or a MultiOptimizer of them)")
    if multi is not None:
        for sv in multi.variables:
            if id(sv) not in seen:
                scalars[f"multi/{sv.name}"] = sv
    return slots, scalars


def _merge_scalars(into: dict[str, Any], values: Mapping[str, Any]) -> None:
    """Step counters of one optimizer agree over workers; the largest wins."""
    for k, v in values.items():
        if k.endswith("/iteration") and k in into:
            into[k] = max(into[k], v)
        else:
            into.setdefault(k, v)


def _scalar_value(value: Any) -> Any:
    value = np.asarray(value)
    return int(value) if np.issubdtype(value.dtype, np.integer) else float(value)


# ------------------------------------------------------------------ what a wrapper holds


@dataclass
class _Target:
    """A variable of this worker and where it lies in a whole tensor ``key``."""

    key: str
    variable: Any
    offsets: tuple[int, ...]
    size: tuple[int, ...]


@dataclass
class _State:
    layout: dict[str, Any]
    targets: list[_Target] = field(default_factory=list)
    scalars: dict[str, Any] = field(default_factory=dict)


def _wrapper_state(wrapper: Any, optimizer: Any | None) -> _State:
    """This worker's variables in whole-table coordinates (see the module docstring)."""
    plan: ShardingPlan = wrapper.plan
    unwrapped: dict[int, str] = {}  # id(variable) -> its path in the unwrapped model
    tables: dict[str, dict[str, Any]] = {}
    regions: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
    shapes: dict[str, list[int]] = {}
    for s in wrapper.sharded.values():
        for cfg in s.configs:
            place = plan.placements[cfg.name]
            key = s.paths[cfg.name]
            tables[cfg.name] = {"key": key, "cardinality": cfg.cardinality, "dim": cfg.dim,
                                "kind": place.kind, "owner": place.owner,
                                "ranges": [list(r) for r in place.ranges]}
            shapes[key] = [cfg.cardinality, cfg.dim]
            if place.kind == "data_parallel":
                assert s.replicated is not None
                unwrapped[id(s.replicated.tables[cfg.name].embeddings)] = key
            elif cfg.name in s.shards:
                var = s.shards[cfg.name]
                unwrapped[id(var)] = key
                held = place.region(wrapper.rank, cfg.cardinality, cfg.dim)
                assert held is not None
                regions[id(var)] = held
    dense = list(wrapper.model.weights)
    for v in dense:
        if id(v) not in unwrapped:
            unwrapped[id(v)] = str(v.path)
            shapes[str(v.path)] = list(v.shape)

    def target(key: str, var: Any, param: Any) -> _Target:
        path = unwrapped[id(param)]
        offsets, _ = regions.get(id(param), ((0,) * len(var.shape), tuple(var.shape)))
        return _Target(key, var, tuple(offsets), tuple(shapes[path]))

    out = _State(layout={})
    shard_vars = [v for s in wrapper.sharded.values() for v in s.shards.values()]
    for v in dense + shard_vars:
        out.targets.append(target("model/" + unwrapped[id(v)], v, v))
    leaf_of: dict[str, int] = {}
    kind, classes = "none", []
    if optimizer is not None:
        mirrored, shard_opt = wrapper.optimizers(optimizer)
        numbers = wrapper.optimizer_numbers(optimizer)
        leaves, multi = _leaves(optimizer, None)
        kind = "multi" if multi is not None else "single"
        classes = [type(leaf).__name__ for _, leaf in leaves]
        anchors = [s.anchor for s in wrapper.sharded.values() if s.anchor is not None]
        parts = [(mirrored, numbers[0], list(wrapper.trainable_variables)),
                 (shard_opt, numbers[1], list(wrapper.shard_variables))]
        for opt, numbering, variables in parts:
            if not variables:
                continue
            slots, scalars = optimizer_state(opt, numbering, variables, skip=anchors)
            for number, param, slot, sv in slots:
                path = unwrapped[id(param)]
                leaf_of[path] = number
                out.targets.append(target(f"opt/{number}/{path}/{slot}", sv, param))
            for name, sv in scalars.items():
                out.scalars.setdefault(name, []).append(sv)
    out.layout = {"version": LAYOUT, "world_size": wrapper.world_size, "rank": wrapper.rank,
                  "model_class": type(wrapper.model).__qualname__, "tables": tables,
                  "shapes": shapes,
                  "optimizer": {"kind": kind, "classes": classes, "leaf_of": leaf_of}}
    return out


# ------------------------------------------------------------------ writing


def _write_arrays(folder: Path, layout: Mapping[str, Any],
                  chunks: list[tuple[str, np.ndarray, tuple[int, ...], tuple[int, ...]]],
                  scalars: Mapping[str, Any]) -> None:
    """``folder/<n>.npy`` per chunk and ``folder/index.json`` (written last)."""
    folder.mkdir(parents=True, exist_ok=True)
    entries = []
    for i, (key, array, offsets, size) in enumerate(chunks):
        name = f"{i:05d}.npy"
        np.save(folder / name, np.ascontiguousarray(array), allow_pickle=False)
        entries.append({"key": key, "file": name, "offsets": list(offsets),
                        "shape": list(array.shape), "size": list(size),
                        "dtype": str(array.dtype)})
    (folder / INDEX).write_text(json.dumps({"format": LAYOUT, "layout": layout,
                                            "chunks": entries, "scalars": dict(scalars)}))


def write_wrapper(wrapper: Any, optimizer: Any | None, folder: str | os.PathLike[str]) -> None:
    """This worker's save of ``wrapper`` (and ``optimizer``'s state) into ``folder``."""
    state = _wrapper_state(wrapper, optimizer)
    chunks = [(t.key, np.asarray(t.variable.numpy()), t.offsets, t.size) for t in state.targets]
    scalars = {}
    for name, svs in state.scalars.items():
        values = [_scalar_value(v.numpy()) for v in svs]
        scalars[name] = max(values) if name.endswith("/iteration") else values[0]
    _write_arrays(Path(folder), state.layout, chunks, scalars)


# ------------------------------------------------------------------ reading


def is_keras_checkpoint(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` holds a save in this layout (its ``index.json`` says so)."""
    path = Path(folder) / INDEX
    if not path.is_file():
        return False
    try:
        return read_json_file(path, "checkpoint index").get("format") == LAYOUT
    except (OSError, ValueError):
        return False


@dataclass
class _Chunk:
    file: Path
    offsets: tuple[int, ...]
    shape: tuple[int, ...]
    size: tuple[int, ...]


class _Source:
    """The saves of one checkpoint (one folder per worker that wrote it): regions of
    its whole tensors, read from the arrays that overlap them (memory-mapped: only
    the overlap is read). With ``prefer`` (this worker's own save, on as many workers)
    that save alone is opened first, and the others only for what it lacks: a resume
    on as many workers with the same plan reads its own folder only."""

    def __init__(self, folders: list[Path], where: str, prefer: int | None = None) -> None:
        self.where = where
        order = list(range(len(folders)))
        if prefer is not None and prefer < len(order):
            order.insert(0, order.pop(prefer))
        self._pending = [folders[i] for i in order]
        self.chunks: dict[str, list[_Chunk]] = {}
        self.scalars: dict[str, Any] = {}
        self.layout: dict[str, Any] = {}
        self.bytes_read = 0
        self._open: dict[Path, np.ndarray] = {}
        self._more(1 if prefer is not None else len(folders))

    def _more(self, count: int | None = None) -> bool:
        """Open the indexes of ``count`` (default: all) more saves; False when none is left."""
        if not self._pending:
            return False
        take = len(self._pending) if count is None else count
        for folder in self._pending[:take]:
            try:
                doc = read_json_file(folder / INDEX, "checkpoint index")
            except (OSError, ValueError) as exc:
                raise DataError(f"checkpoint {self.where}: cannot read {folder / INDEX} "
                                f"({exc}); the save is incomplete, or not on a filesystem this "
                                "worker sees: resume from another one, or start over with "
                                "resume=False") from exc
            if doc.get("format") != LAYOUT:
                raise DataError(f"checkpoint {self.where}: {folder / INDEX} has format "
                                f"{doc.get('format')!r}, not {LAYOUT!r}")
            self.layout = self.layout or doc["layout"]
            _merge_scalars(self.scalars, doc.get("scalars", {}))
            for e in doc["chunks"]:
                found = self.chunks.setdefault(e["key"], [])
                chunk = _Chunk(folder / e["file"], tuple(e["offsets"]), tuple(e["shape"]),
                               tuple(e["size"]))
                if not any(c.offsets == chunk.offsets and c.shape == chunk.shape for c in found):
                    found.append(chunk)
        del self._pending[:take]
        return True

    def has(self, key: str) -> bool:
        while key not in self.chunks and self._more():
            continue  # each call indexes one more worker part's arrays
        return key in self.chunks

    def size(self, key: str) -> tuple[int, ...]:
        return self.chunks[key][0].size

    def _array(self, path: Path) -> np.ndarray:
        if path not in self._open:
            try:
                self._open[path] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise DataError(f"checkpoint {self.where}: cannot read {path} ({exc})") from exc
        return self._open[path]

    def read(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> np.ndarray:
        """The region ``sizes`` at ``offsets`` of the whole tensor ``key``."""
        if not self.has(key):
            raise DataError(f"checkpoint {self.where} holds no {key!r}; is it complete?")
        while True:
            got = self._assemble(key, offsets, sizes)
            if got is not None:
                return got
            if not self._more():
                covered = self._covered(key, offsets, sizes)
                raise DataError(f"checkpoint {self.where}: its arrays of {key!r} cover "
                                f"{covered} of the {math.prod(sizes)} values at {offsets}; the "
                                "checkpoint is incomplete (a worker's save is missing)")

    def _overlaps(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]
                  ) -> list[tuple[_Chunk, list[int], list[int]]]:
        out = []
        for c in self.chunks[key]:
            lo = [max(o, co) for o, co in zip(offsets, c.offsets)]
            hi = [min(o + n, co + cn) for o, n, co, cn in zip(offsets, sizes, c.offsets, c.shape)]
            if all(h > low for low, h in zip(lo, hi)):
                out.append((c, lo, hi))
        return out

    def _covered(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> int:
        return sum(math.prod(h - low for low, h in zip(lo, hi))
                   for _, lo, hi in self._overlaps(key, offsets, sizes))

    def _assemble(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...]
                  ) -> np.ndarray | None:
        if math.prod(sizes) == 0:
            return np.zeros(sizes, np.float32)
        overlaps = self._overlaps(key, offsets, sizes)
        whole = next(((c, lo, hi) for c, lo, hi in overlaps
                      if [h - low for low, h in zip(lo, hi)] == list(sizes)), None)
        if whole is not None:
            overlaps = [whole]
        elif self._covered(key, offsets, sizes) != math.prod(sizes):
            return None
        out = np.zeros(sizes, np.float32)
        for c, lo, hi in overlaps:
            src = self._array(c.file)
            piece = np.asarray(src[tuple(slice(a - co, b - co)
                                         for a, b, co in zip(lo, hi, c.offsets))])
            self.bytes_read += piece.nbytes
            out[tuple(slice(a - o, b - o) for a, b, o in zip(lo, hi, offsets))] = piece
        return out


def _check_model(where: str, saved: Mapping[str, Any], here: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another model class or other shapes, naming the first
    differences, before anything is read."""
    fix = ("the checkpoint belongs to another training run: pass another checkpoint_dir, or "
           "resume=False to train from scratch")
    if saved["model_class"] != here["model_class"]:
        raise _refuse(SchemaError, f"checkpoint {where} was written for a "
                      f"{saved['model_class']} model, not {here['model_class']}", fix)
    a, b = saved["shapes"], here["shapes"]
    diffs = [f"{k!r} only in the checkpoint" for k in a if k not in b]
    diffs += [f"{k!r} missing from the checkpoint" for k in b if k not in a]
    diffs += [f"{k!r} has shape {tuple(a[k])} in the checkpoint, {tuple(b[k])} in the model"
              for k in b if k in a and list(a[k]) != list(b[k])]
    if diffs:
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        raise _refuse(SchemaError, f"checkpoint {where} does not match this "
                      f"{here['model_class']} (another schema or model settings?): "
                      f"{'; '.join(diffs[:5])}{more}", fix)


def _check_optimizer(where: str, saved: Mapping[str, Any], here: Mapping[str, Any]) -> None:
    fix = "build the optimizer as the checkpointed run did, or start over with resume=False"
    if here["kind"] == "none":
        return
    if saved["kind"] != here["kind"] or saved["classes"] != here["classes"]:
        raise _refuse(SchemaError, f"checkpoint {where}: its optimizer ({saved['kind']}: "
                      f"{saved['classes']}) differs from this run's ({here['kind']}: "
                      f"{here['classes']})", fix)
    moved = [f"{p!r} (optimizer {saved['leaf_of'][p]} in the checkpoint, {n} now)"
             for p, n in here["leaf_of"].items()
             if p in saved["leaf_of"] and saved["leaf_of"][p] != n]
    if moved:
        raise _refuse(SchemaError, f"checkpoint {where}: the optimizer routes variables "
                      f"elsewhere: {', '.join(moved[:3])}", fix)


def _assign(source: _Source, targets: list[_Target], scalars: Mapping[str, list[Any]],
            where: str) -> None:
    values = []
    for t in targets:
        if not source.has(t.key):
            if t.key.startswith("opt/"):
                raise _refuse(SchemaError, f"checkpoint {where} holds no optimizer slot "
                              f"{t.key!r} (the checkpointed optimizer had other state)",
                              "resume with the optimizer the checkpoint was written with, or "
                              "start over with resume=False")
            raise DataError(f"checkpoint {where} holds no {t.key!r}; is it complete?")
        if tuple(source.size(t.key)) != t.size:
            raise _refuse(SchemaError, f"checkpoint {where}: {t.key!r} has shape "
                          f"{source.size(t.key)} in the checkpoint, {t.size} here",
                          "resume with the model and optimizer the checkpoint was written with")
        values.append(source.read(t.key, t.offsets, tuple(t.variable.shape)))
    for t, value in zip(targets, values, strict=True):
        t.variable.assign(value.astype(np.dtype(t.variable.dtype)))
    for name, svs in scalars.items():
        if name in source.scalars:
            for sv in svs:
                sv.assign(source.scalars[name])


def _placements(layout: Mapping[str, Any]) -> dict[str, Any]:
    return {n: (t["kind"], t["owner"], [list(r) for r in t["ranges"]])
            for n, t in layout["tables"].items()}


@dataclass
class Restored:
    """What :func:`restore_wrapper` did: the world size that wrote the checkpoint,
    whether its plan differs from this run's, and the bytes this worker read."""

    written_by: int
    resharded: bool
    bytes_read: int

    def note(self, directory: Any, world_size: int, rank: int,
             trained_by: int | None = None) -> str | None:
        """What the loop's resume line says of the tables: the part it appends to its
        own line when ``trained_by`` (the workers that trained the checkpoint, from its
        loop state; default: those that wrote it) differs from ``world_size``, else a
        whole line (another plan, or parts converted offline for another number of
        workers), or None (nothing resharded)."""
        if not self.resharded:
            return None
        what = (f"tables and optimizer state resharded ({self.bytes_read:,} bytes read on "
                f"worker {rank})")
        if (trained_by if trained_by is not None else self.written_by) != world_size:
            return what
        if self.written_by != world_size:
            return (f"fit: checkpoint {directory} holds the parts of {self.written_by} "
                    f"workers; resuming on {world_size} worker(s): {what}")
        return (f"fit: checkpoint {directory} was written with another plan; resuming on "
                f"{world_size} worker(s) with this one: {what}")


def restore_wrapper(wrapper: Any, optimizer: Any | None, folders: list[Path],
                    where: str) -> Restored:
    """Load the saves ``folders`` (one per worker that wrote the checkpoint, in worker
    order) into ``wrapper`` (any number of workers, any plan) and ``optimizer``."""
    wrapper.build(None)
    state = _wrapper_state(wrapper, optimizer)
    written_by = len(folders)
    same = written_by == wrapper.world_size
    source = _Source(folders, where, prefer=wrapper.rank if same else None)
    if not source.layout:
        raise DataError(f"checkpoint {where}: no save to read")
    _check_model(where, source.layout, state.layout)
    if optimizer is not None:
        _check_optimizer(where, source.layout["optimizer"], state.layout["optimizer"])
    _assign(source, state.targets, state.scalars, where)
    resharded = not same or _placements(source.layout) != _placements(state.layout)
    return Restored(written_by, resharded, source.bytes_read)


# ------------------------------------------------------------------ single process


def load_named(directory: str | os.PathLike[str], model: Any, optimizer: Any) -> None:
    """Load the single-process checkpoint :func:`reshard` wrote for one worker
    (``checkpoint.arrays/``) into the unwrapped ``model`` and its ``optimizer``."""
    folder = Path(directory) / NAMED_DIR
    where = os.fspath(directory)
    source = _Source([folder], where)
    weights = list(model.weights)
    targets = [_Target("model/" + str(v.path), v, (0,) * len(v.shape), tuple(v.shape))
               for v in weights]
    shapes = {str(v.path): list(v.shape) for v in weights}
    slots, scalar_vars = optimizer_state(optimizer, None, list(model.trainable_variables))
    leaves, multi = _leaves(optimizer, None)
    leaf_of: dict[str, int] = {}
    for number, param, slot, sv in slots:
        leaf_of[str(param.path)] = number
        targets.append(_Target(f"opt/{number}/{param.path}/{slot}", sv, (0,) * len(sv.shape),
                               tuple(sv.shape)))
    here: dict[str, Any] = {
        "model_class": type(model).__qualname__, "shapes": shapes,
        "optimizer": {"kind": "multi" if multi is not None else "single",
                      "classes": [type(leaf).__name__ for _, leaf in leaves],
                      "leaf_of": leaf_of}}
    _check_model(where, source.layout, here)
    _check_optimizer(where, source.layout["optimizer"], here["optimizer"])
    _assign(source, targets, {k: [v] for k, v in scalar_vars.items()}, where)


# ------------------------------------------------------------------ checkpoint folders


def saves_of(part: Path) -> dict[tuple[int, int, int], Path]:
    """A worker's whole saves (``state.json`` written) by (global step, epoch, batch)."""
    out = {}
    if part.is_dir():
        for entry in part.iterdir():
            found = _SAVE.fullmatch(entry.name)
            if found and (entry / "state.json").is_file():
                out[(int(found[1]), int(found[2]), int(found[3]))] = entry
    return out


def complete_saves(directory: Path) -> dict[int, tuple[tuple[int, int, int], list[Path]]]:
    """``{world size: (newest key, [each worker's save folder])}``: for every number of
    workers that wrote parts into ``fit``'s ``directory``, its newest save that all of
    them hold whole (read from the filesystem)."""
    parts: dict[int, dict[int, Path]] = {}
    if directory.is_dir():
        for entry in directory.iterdir():
            found = _PART.fullmatch(entry.name)
            if found and entry.is_dir():
                parts.setdefault(int(found[2]), {})[int(found[1])] = entry
    out = {}
    for world, ranks in parts.items():
        if sorted(ranks) != list(range(world)):
            continue
        held = [saves_of(ranks[r]) for r in range(world)]
        common = set(held[0]).intersection(*map(set, held[1:]))
        if common:
            key = max(common)
            out[world] = (key, [held[r][key] for r in range(world)])
    return out


def reshard(src: str | os.PathLike[str], dst: str | os.PathLike[str], world_size: int,
            plan: ShardingPlan | Mapping[str, str] | str | None = None) -> Path:
    """Convert the newest checkpoint a Keras :class:`HybridParallel` ``fit`` wrote in
    ``src`` (its ``checkpoint_dir``, W workers) into one for ``world_size`` workers in
    ``dst``; return the folder written.

    ``plan`` is the new run's plan as ``HybridParallel(plan=...)`` takes it (``None``:
    ``"auto"`` for ``world_size`` workers). ``world_size=1`` writes a single-process
    checkpoint (``dst/checkpoint.json`` and ``dst/checkpoint.arrays/``) that
    ``fit(model, ..., checkpoint_dir=dst, resume=True)`` of the *unwrapped* model
    accepts; any other size writes ``dst/worker-<r>-of-<world_size>/step-.../`` saves,
    each holding only its worker's regions. Optimizer slots move with their rows; the
    loop's state (position, history) is kept. One process reads every array of
    ``src`` once."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"reshard: world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"reshard: world_size must be >= 1, got {world_size}")
    src, dst = Path(src), Path(dst)
    found = complete_saves(src)
    if not found:
        raise _refuse(DataError, f"reshard: {src} holds no Keras HybridParallel save that all "
                      "of its workers wrote whole (worker-<r>-of-<W>/step-*/index.json)",
                      "pass the checkpoint_dir that fit wrote with a HybridParallel model")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"reshard: the output folder {dst} is the checkpoint's own folder; "
                         "pass another one")
    if dst.exists() and any(dst.iterdir()):
        raise FileExistsError(f"reshard: {dst} is not empty; pass an empty or new output "
                              "folder")
    _, folders = max(found.values(), key=lambda item: item[0])
    where = os.fspath(src)
    source = _Source(folders, where)
    layout = source.layout
    if source.layout.get("version") != LAYOUT:
        raise DataError(f"reshard: {src} has layout {layout.get('version')!r}, not {LAYOUT!r}")
    configs = [TableConfig(name, int(t["cardinality"]), int(t["dim"]), (name,))
               for name, t in layout["tables"].items()]
    target = resolve_plan(plan, configs, world_size, who="reshard")
    from tabstream.train.tensorflow.fit import check_checkpoint_format  # fit imports this module

    state = check_checkpoint_format(read_json_file(folders[0] / "state.json", "checkpoint state"),
                                    folders[0] / "state.json")
    table_of = {t["key"]: name for name, t in layout["tables"].items()}

    def key_path(k: str) -> str:
        return k[len("model/"):] if k.startswith("model/") else k.split("/", 2)[2].rsplit("/", 1)[0]

    # every stored tensor, whole, read once
    whole = {k: source.read(k, (0,) * len(source.size(k)), source.size(k))
             for k in source.chunks}
    dst.mkdir(parents=True, exist_ok=True)
    if world_size == 1:
        chunks = [(k, a, (0,) * a.ndim, a.shape) for k, a in whole.items()]
        single = {**layout, "world_size": 1, "rank": 0,
                  "tables": _describe(target, layout)}
        _write_arrays(dst / NAMED_DIR, single, chunks, source.scalars)
        from tabstream.train.tensorflow.fit import CHECKPOINT_PREFIX

        doc = {"format": 1, **state, "arrays": "named", "model_class": layout["model_class"]}
        (dst / f"{CHECKPOINT_PREFIX}.json").write_text(json.dumps(doc))
        return dst
    save = folders[0].name
    for r in range(world_size):
        chunks = []
        for k, array in whole.items():
            name = table_of.get(key_path(k))
            if name is None:
                chunks.append((k, array, (0,) * array.ndim, array.shape))
                continue
            t = layout["tables"][name]
            held = target.placements[name].region(r, int(t["cardinality"]), int(t["dim"]))
            if held is not None:
                chunks.append((k, _region(array, *held), held[0], array.shape))
        part = {**layout, "world_size": world_size, "rank": r,
                "tables": _describe(target, layout)}
        folder = dst / f"worker-{r}-of-{world_size}" / save
        _write_arrays(folder, part, chunks, source.scalars)
        (folder / "state.json").write_text(json.dumps({"format": 1, **state}))
    return dst


def _describe(plan: ShardingPlan, layout: Mapping[str, Any]) -> dict[str, Any]:
    return {name: {**t, "kind": plan.placements[name].kind, "owner": plan.placements[name].owner,
                   "ranges": [list(r) for r in plan.placements[name].ranges]}
            for name, t in layout["tables"].items()}


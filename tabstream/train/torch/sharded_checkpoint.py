"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), without pickles.

Every rank writes its own tensors (its embedding shards, its optimizer state) in
one collective ``dcp.save``; nothing is gathered on one rank. A checkpoint is a
folder::

    checkpoint-000120.dcp/
        __0_0.distcp, __1_0.distcp     DCP's tensor files, one per rank
        .metadata.json                 DCP's index of them (JSON, not DCP's pickle)
        rank0.json, rank1.json         each rank's plain values and tensor slots
    checkpoint.dcp.json                {"folder": "checkpoint-000120.dcp", "world_size": 2}

The small ``checkpoint.dcp.json`` is replaced last (atomically), so a reader sees
the previous complete checkpoint or the new one. Plain values (ints, floats,
strings, tuples, dicts with int keys) go to JSON; tensors go to DCP under keys
``rank{r}/{n}``: a rank's state may hold tensors of other shapes than another
rank's under the same name, so names are never shared between ranks.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter, _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.jsonfile import read_json_file

__all__ = ["POINTER_FILE", "load_sharded", "read_plain_values", "save_sharded", "sharded_exists"]

POINTER_FILE = "checkpoint.dcp.json"
_META = ".metadata.json"


# ------------------------------------------------------ plain values <-> JSON + tensors


def _encode(obj: Any, tensors: dict[str, torch.Tensor], prefix: str) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}/{len(tensors)}"
        tensors[key] = obj.detach().contiguous()
        return {"__tensor__": key, "shape": list(obj.shape), "dtype": str(obj.dtype)[6:]}
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors, prefix), _encode(v, tensors, prefix)]
                             for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, prefix) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors, prefix) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"sharded checkpoint: cannot store a {type(obj).__name__} ({obj!r}); "
                    "only tensors, numbers, strings, lists, tuples and dicts are stored")


def _slots(skeleton: Any, out: dict[str, torch.Tensor]) -> None:
    """Empty tensors for every tensor slot of ``skeleton`` (DCP loads in place)."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            dtype = getattr(torch, skeleton["dtype"])
            out[skeleton["__tensor__"]] = torch.empty(skeleton["shape"], dtype=dtype)
            return
        for part in skeleton.get("__dict__") or skeleton.get("__tuple__") or []:
            _slots(part, out)
    elif isinstance(skeleton, list):
        for part in skeleton:
            _slots(part, out)


def _decode(skeleton: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__tuple__" in skeleton:
            return tuple(_decode(v, tensors) for v in skeleton["__tuple__"])
        return {_decode(k, tensors): _decode(v, tensors) for k, v in skeleton["__dict__"]}
    if isinstance(skeleton, list):
        return [_decode(v, tensors) for v in skeleton]
    return skeleton


# ------------------------------------------------ DCP storage with a JSON index


class _JsonWriter(FileSystemWriter):
    """DCP's file writer, its index written as JSON instead of a pickle."""

    def finish(self, metadata: Metadata, results: list[list[Any]]) -> None:
        entries = {}
        for name, md in metadata.state_dict_metadata.items():
            if not isinstance(md, TensorStorageMetadata):
                raise TypeError(f"sharded checkpoint: entry {name!r} is not a tensor")
            entries[name] = {
                "dtype": str(md.properties.dtype)[6:], "size": list(md.size),
                "chunks": [[list(c.offsets), list(c.sizes)] for c in md.chunks],
            }
        storage = []
        for wr_list in results:
            for wr in wr_list:
                info = wr.storage_data
                storage.append([
                    wr.index.fqn, None if wr.index.offset is None else list(wr.index.offset),
                    wr.index.index, str(info.relative_path), int(info.offset), int(info.length),
                    None if info.transform_descriptors is None else list(info.transform_descriptors),
                ])
        planner = metadata.planner_data
        planner_json = ({k: list(v) for k, v in planner.items()} if isinstance(planner, dict)
                        else None)
        doc = {"entries": entries, "storage": storage, "planner_data": planner_json,
               "version": getattr(metadata, "version", None)}
        path = Path(self.path) / _META
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)


class _JsonReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        path = Path(self.path) / _META
        try:
            doc = read_json_file(path, "sharded checkpoint index")
        except (OSError, ValueError) as exc:
            raise DataError(f"cannot read sharded checkpoint index {path}: {exc}") from exc
        entries: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {
            name: TensorStorageMetadata(
                properties=TensorProperties(dtype=getattr(torch, e["dtype"])),
                size=torch.Size(e["size"]),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(s))
                        for o, s in e["chunks"]],
            )
            for name, e in doc["entries"].items()
        }
        storage = {
            MetadataIndex(fqn, None if off is None else torch.Size(off), index):
                _StorageInfo(rel, offset, length, transforms)
            for fqn, off, index, rel, offset, length, transforms in doc["storage"]
        }
        planner = doc.get("planner_data")
        planner = {k: tuple(v) for k, v in planner.items()} if planner is not None else None
        metadata = Metadata(state_dict_metadata=entries, planner_data=planner,
                            storage_data=storage, version=doc.get("version"))
        metadata.storage_meta = StorageMeta(load_id=self.load_id)
        return metadata


# ------------------------------------------------------------------ save / load


def sharded_exists(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / POINTER_FILE).exists()


def save_sharded(directory: str | os.PathLike[str], payload: dict[str, Any], tag: str,
                 group: Any = None) -> Path:
    """Collective: every rank saves its ``payload`` into ``directory/<tag>.dcp``, then
    rank 0 points ``checkpoint.dcp.json`` at it and removes the previous folder.

    A write that fails on any rank (a full disk) fails on every rank together with a
    :class:`~tabstream.train.checks.CheckpointError` naming ``directory``: the new
    folder is removed and the pointer still names the previous checkpoint."""
    from tabstream.train.checks import CheckpointError, checkpoint_write

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    directory = Path(directory)
    folder = directory / f"{tag}.dcp"
    pointer = directory / POINTER_FILE
    tmp = pointer.with_name(f".{pointer.name}.tmp")
    failure: BaseException | None = None
    try:
        with checkpoint_write(directory, [tmp]):
            if rank == 0:
                if folder.exists():
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
            dist.barrier(group)
            tensors: dict[str, torch.Tensor] = {}
            skeleton = _encode(payload, tensors, f"rank{rank}")
            dcp.save(tensors, storage_writer=_JsonWriter(folder), process_group=group)
            (folder / f"rank{rank}.json").write_text(json.dumps(skeleton))
    except Exception as exc:  # noqa: BLE001 - every rank must learn of it, then it is raised
        failure = exc
    if not _any_rank(failure is not None, group):  # then the pointer, on rank 0
        previous = None
        if rank == 0:
            try:
                with checkpoint_write(directory, [tmp]):
                    previous = _read_pointer(pointer)["folder"] if pointer.exists() else None
                    tmp.write_text(json.dumps({"format": "tabstream.sharded/1",
                                               "folder": folder.name, "world_size": world}))
                    os.replace(tmp, pointer)
            except OSError as exc:
                failure = exc
        if not _any_rank(failure is not None, group):
            if previous and previous != folder.name:
                shutil.rmtree(directory / previous, ignore_errors=True)
            return folder
    # a write failed on some rank: every rank raises, the pointer names the previous one
    if rank == 0:
        shutil.rmtree(folder, ignore_errors=True)
    if failure is not None:
        raise failure
    raise CheckpointError(f"checkpoint_dir {directory}: another rank could not write its part "
                          "of the checkpoint (see its error); the previous one is kept",
                          hint="point checkpoint_dir at a writable folder with room")


def _any_rank(flag: bool, group: Any = None) -> bool:
    """Whether ``flag`` is set on any rank of ``group`` (one small all-reduce)."""
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, group=group)
    return bool(t.item())


def _read_pointer(pointer: Path) -> dict[str, Any]:
    try:
        doc = read_json_file(pointer, "sharded checkpoint pointer")
        doc["folder"], doc["world_size"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"cannot read sharded checkpoint pointer {pointer}: {exc}; delete it "
                        "or start over with resume=False") from exc
    return doc


def load_sharded(directory: str | os.PathLike[str], group: Any = None) -> dict[str, Any]:
    """Collective: this rank's payload from the checkpoint ``directory`` points at."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    pointer = Path(directory) / POINTER_FILE
    doc = _read_pointer(pointer)
    if doc["world_size"] != world:
        raise SchemaError(
            f"sharded checkpoint {pointer} was written by {doc['world_size']} ranks, this run "
            f"has {world}: its shards do not fit. Resume with {doc['world_size']} ranks, or "
            "load the full state (HybridParallel.full_state_dict) into a new run"
        )
    folder = Path(directory) / doc["folder"]
    try:
        skeleton = read_json_file(folder / f"rank{rank}.json", "checkpoint part")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read rank {rank}'s part of checkpoint {folder}: {exc}") from exc
    tensors: dict[str, torch.Tensor] = {}
    _slots(skeleton, tensors)
    dcp.load(tensors, storage_reader=_JsonReader(folder), process_group=group)
    return _decode(skeleton, tensors)


def read_plain_values(directory: str | os.PathLike[str], rank: int = 0) -> dict[str, Any]:
    """Rank ``rank``'s payload with every tensor left out (``None``): its positions and
    history, readable without a process group."""
    pointer = Path(directory) / POINTER_FILE
    folder = Path(directory) / _read_pointer(pointer)["folder"]
    path = folder / f"rank{rank}.json"
    try:
        skeleton = read_json_file(path, "checkpoint part")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read {path}: {exc}") from exc
    return _decode(skeleton, _NoTensors())


class _NoTensors(dict):
    def __missing__(self, key: str) -> None:
        return None

"""Sharded checkpoints through ``torch.distributed.checkpoint`` (DCP), without pickles.

Every rank writes its own tensors (its embedding shards, its optimizer state) in
one collective ``dcp.save``; nothing is gathered on one rank. A checkpoint is a
folder::

    checkpoint-000120.dcp/
        __0_0.distcp, __1_0.distcp     DCP's tensor files, one per rank
        .metadata.json                 DCP's index of them (JSON, not DCP's pickle)
        rank0.json, rank1.json         each rank's plain values and tensor slots
    checkpoint.dcp.json                {"folder": "checkpoint-000120.dcp", "world_size": 2}

The small ``checkpoint.dcp.json`` is replaced last (atomically), and a save never
writes into (nor removes) the folder it names until it names the new one, so a
reader sees the previous complete checkpoint or the new one. Plain values (ints, floats,
strings, tuples, dicts with int keys) go to JSON; tensors go to DCP under keys
``rank{r}/{n}``: a rank's state may hold tensors of other shapes than another
rank's under the same name, so names are never shared between ranks.

Whole-table layout (format ``tabstream.sharded/2``): a payload may also hold
:class:`Chunk` values, pieces of one whole tensor that several ranks write
together. A chunk is stored under the whole tensor's name with its offsets
(DCP's chunk metadata), e.g. rank 1's rows 25:50 of a 50 x 6 table::

    "model/inputs.embeddings.C1.weight": size [50, 6], chunks [[0, 0], [25, 6]], [[25, 0], [25, 6]]

so any process can later read any region of it (:func:`load_pieces`), whatever
the world size that wrote it: DCP reads the stored chunks that overlap the region
and copies the overlap. This is what resharding rests on
(:mod:`tabstream.train.torch.reshard`). Zero-dimensional tensors (optimizer step
counts) are kept in the JSON as ``{"__scalar__": value, "dtype": ...}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
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
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.jsonfile import read_json_file

__all__ = ["Chunk", "FORMAT", "POINTER_FILE", "Piece", "Stored", "load_part", "load_pieces",
           "load_sharded", "read_parts", "read_plain_values", "save_sharded", "sharded_exists", "write_parts"]

POINTER_FILE = "checkpoint.dcp.json"
#: the pointer's format: /1 per-rank names only, /2 with whole-tensor chunks
FORMAT = "tabstream.sharded/2"
_META = ".metadata.json"


@dataclass(frozen=True)
class Chunk:
    """``tensor`` is the region at ``offsets`` of a whole tensor named ``key`` of shape
    ``size``; each rank saves its own chunks, and the chunks of all ranks tile the
    whole tensor. A chunk that is the whole tensor (``offsets`` all 0, same shape) may
    be saved by several ranks (a replicated weight): it is written once."""

    key: str
    tensor: torch.Tensor
    offsets: tuple[int, ...]
    size: tuple[int, ...]

    @staticmethod
    def whole(key: str, tensor: torch.Tensor) -> Chunk:
        return Chunk(key, tensor, (0,) * tensor.dim(), tuple(tensor.shape))


@dataclass(frozen=True)
class Stored:
    """A tensor of a part as :func:`read_parts` gives it, not read yet: where it is
    stored (``piece``), the whole tensor's shape (``size``), and whether it is a
    chunk of a whole tensor (``chunk``) or a rank's own tensor."""

    piece: Piece
    size: tuple[int, ...]
    chunk: bool


@dataclass(frozen=True)
class Piece:
    """A region to read: ``sizes`` at ``offsets`` of the stored tensor ``key``."""

    key: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype = torch.float32

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * torch.empty((), dtype=self.dtype).element_size()


# ------------------------------------------------------ plain values <-> JSON + tensors


def _encode(obj: Any, tensors: dict[str, torch.Tensor], prefix: str,
            chunks: list[Chunk] | None = None) -> Any:
    if isinstance(obj, Chunk):
        if chunks is None:
            raise TypeError("sharded checkpoint: a Chunk is stored only through save_sharded "
                            "or write_parts")
        chunks.append(obj)
        return {"__chunk__": obj.key, "offsets": list(obj.offsets),
                "sizes": list(obj.tensor.shape), "size": list(obj.size),
                "dtype": str(obj.tensor.dtype)[6:]}
    if isinstance(obj, torch.Tensor) and obj.dim() == 0 and chunks is not None:
        return {"__scalar__": obj.item(), "dtype": str(obj.dtype)[6:]}
    if isinstance(obj, torch.Tensor):
        key = f"{prefix}/{len(tensors)}"
        tensors[key] = obj.detach().contiguous()
        return {"__tensor__": key, "shape": list(obj.shape), "dtype": str(obj.dtype)[6:]}
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors, prefix, chunks),
                              _encode(v, tensors, prefix, chunks)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors, prefix, chunks) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors, prefix, chunks) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"sharded checkpoint: cannot store a {type(obj).__name__} ({obj!r}); "
                    "only tensors, numbers, strings, lists, tuples and dicts are stored")


def chunk_name(marker: dict[str, Any]) -> str:
    """The request name of a ``{"__chunk__": ...}`` marker of a part's JSON."""
    return f"{marker['__chunk__']}@{','.join(str(o) for o in marker['offsets'])}"


def piece_of(marker: dict[str, Any]) -> Piece:
    """The region a part's ``__chunk__`` or ``__tensor__`` marker names."""
    dtype = getattr(torch, marker["dtype"])
    if "__chunk__" in marker:
        return Piece(marker["__chunk__"], tuple(marker["offsets"]), tuple(marker["sizes"]), dtype)
    return Piece(marker["__tensor__"], (0,) * len(marker["shape"]), tuple(marker["shape"]), dtype)


def _slots(skeleton: Any, out: dict[str, Any]) -> None:
    """The regions to read for every tensor slot of ``skeleton`` (DCP loads in place)."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            out[skeleton["__tensor__"]] = piece_of(skeleton)
            return
        if "__chunk__" in skeleton:
            out[chunk_name(skeleton)] = piece_of(skeleton)
            return
        if "__scalar__" in skeleton:
            return
        for part in skeleton.get("__dict__") or skeleton.get("__tuple__") or []:
            _slots(part, out)
    elif isinstance(skeleton, list):
        for part in skeleton:
            _slots(part, out)


def _decode(skeleton: Any, tensors: Any) -> Any:
    if isinstance(skeleton, dict):
        if tensors is None and ("__tensor__" in skeleton or "__chunk__" in skeleton):
            chunk = "__chunk__" in skeleton
            piece = piece_of(skeleton)
            return Stored(piece, tuple(skeleton["size"]) if chunk else piece.sizes, chunk)
        if "__tensor__" in skeleton:
            return tensors[skeleton["__tensor__"]]
        if "__chunk__" in skeleton:
            return tensors[chunk_name(skeleton)]
        if "__scalar__" in skeleton:
            return torch.tensor(skeleton["__scalar__"], dtype=getattr(torch, skeleton["dtype"]))
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
    """DCP's file reader of a JSON index; counts the bytes it reads (``bytes_read``)."""

    bytes_read = 0

    def read_data(self, plan: LoadPlan, planner: Any) -> Any:
        # DCP reads each stored chunk a request overlaps whole, then narrows it
        self.bytes_read += sum(int(self.storage_data[item.storage_index].length)
                               for item in plan.items)
        return super().read_data(plan, planner)

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


class _ChunkSavePlanner(DefaultSavePlanner):
    """Writes this process's :class:`Chunk` values (regions of whole tensors, named by
    the whole tensor) and its own tensors (``rank{r}/{n}``) as DCP write items."""

    def __init__(self, chunks: list[Chunk], tensors: dict[str, torch.Tensor]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self._data: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self._items: list[WriteItem] = []
        entries = [*chunks, *(Chunk.whole(k, t) for k, t in tensors.items())]
        for c in entries:
            where = (c.key, tuple(c.offsets))
            if where in self._data:  # the same replicated chunk of two target ranks
                continue
            tensor = c.tensor.detach().contiguous()
            self._data[where] = tensor
            whole = tuple(tensor.shape) == tuple(c.size) and not any(c.offsets)
            self._items.append(WriteItem(
                index=MetadataIndex(c.key, torch.Size(c.offsets)),
                type=WriteItemType.TENSOR if whole else WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=torch.Size(c.offsets),
                                               sizes=torch.Size(tensor.shape)),
                    properties=TensorProperties.create_from_tensor(tensor),
                    size=torch.Size(c.size)),
            ))

    def create_local_plan(self) -> SavePlan:
        self.plan = SavePlan(list(self._items))
        return self.plan

    def lookup_object(self, index: MetadataIndex) -> Any:
        return self._data[(index.fqn, tuple(index.offset or ()))]


class _PieceLoadPlanner(DefaultLoadPlanner):
    """Reads regions (:class:`Piece`) of stored whole tensors into ``targets``, one
    read item per stored chunk a region overlaps."""

    def __init__(self, pieces: dict[str, Piece], targets: dict[str, torch.Tensor],
                 where: Path) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        self.pieces, self.targets, self.where = pieces, targets, where

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        items = []
        for name, piece in self.pieces.items():
            md = self.metadata.state_dict_metadata.get(piece.key)
            if not isinstance(md, TensorStorageMetadata):
                raise DataError(f"sharded checkpoint {self.where} holds no tensor "
                                f"{piece.key!r}; is it complete?")
            chunk = ChunkStorageMetadata(offsets=torch.Size(piece.offsets),
                                         sizes=torch.Size(piece.sizes))
            _check_covered(self.where, piece, md)
            for item in create_read_items_for_chunk_list(piece.key, md, [chunk]):
                items.append(dataclasses.replace(
                    item, dest_index=MetadataIndex(name, torch.Size(piece.offsets), 0)))
        return LoadPlan(items)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        return self.targets[index.fqn]


def _check_covered(where: Path, piece: Piece, md: TensorStorageMetadata) -> None:
    """The stored chunks overlapping ``piece`` cover all of it (DCP would leave the
    rest of the target as it was: uninitialised memory)."""
    if any(o + n > s for o, n, s in zip(piece.offsets, piece.sizes, md.size)) or \
            len(piece.sizes) != len(md.size):
        raise DataError(f"sharded checkpoint {where}: {piece.key!r} has shape "
                        f"{tuple(md.size)}, which has no region {piece.sizes} at "
                        f"{piece.offsets}")
    covered = 0
    for c in md.chunks:
        overlap = 1
        for o, n, co, cn in zip(piece.offsets, piece.sizes, c.offsets, c.sizes):
            overlap *= max(0, min(o + n, co + cn) - max(o, co))
        covered += overlap
    if covered != math.prod(piece.sizes):
        raise DataError(f"sharded checkpoint {where}: the stored chunks of {piece.key!r} "
                        f"cover {covered} of the {math.prod(piece.sizes)} values at "
                        f"{piece.offsets}; the checkpoint is incomplete")


@contextlib.contextmanager
def _single_process(no_dist: bool) -> Iterator[None]:
    """DCP warns that it reads or writes in one process even when asked to (no_dist)."""
    with warnings.catch_warnings():
        if no_dist:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def load_pieces(folder: str | os.PathLike[str], pieces: dict[str, Piece], group: Any = None,
                no_dist: bool = False) -> tuple[dict[str, torch.Tensor], int]:
    """``({name: tensor of piece.sizes}, bytes read)``: each :class:`Piece` read from the
    checkpoint folder (a ``<tag>.dcp`` folder), whichever ranks wrote it. Collective
    unless ``no_dist``."""
    folder = Path(folder)
    targets = {n: torch.empty(p.sizes, dtype=p.dtype) for n, p in pieces.items()}
    reader = _JsonReader(folder)
    with _single_process(no_dist):
        dcp.load(targets, storage_reader=reader,
                 planner=_PieceLoadPlanner(pieces, targets, folder), process_group=group,
                 no_dist=no_dist)
    return targets, reader.bytes_read


# ------------------------------------------------------------------ save / load


def sharded_exists(directory: str | os.PathLike[str]) -> bool:
    return (Path(directory) / POINTER_FILE).exists()


def save_sharded(directory: str | os.PathLike[str], payload: dict[str, Any], tag: str,
                 group: Any = None) -> Path:
    """Collective: every rank saves its ``payload`` into a new folder
    ``directory/<tag>.dcp``, then rank 0 points ``checkpoint.dcp.json`` at it and
    removes the previous folder.

    The folder the pointer names is never written into nor removed before the
    pointer names the new, complete one: when it is already ``<tag>.dcp`` (a tag
    saved twice, e.g. a mid-epoch and an epoch-end checkpoint at one global step),
    the new save goes to ``<tag>.1.dcp`` instead (and back to ``<tag>.dcp`` the time
    after). A write that fails on any rank (a full disk) fails on every rank together
    with a :class:`~tabstream.train.checks.CheckpointError` naming ``directory``: the
    new folder is removed and the pointer still names the previous checkpoint, whole;
    a process killed midway leaves it so too."""
    from tabstream.train.checks import CheckpointError, checkpoint_write

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    directory = Path(directory)
    pointer = directory / POINTER_FILE
    tmp = pointer.with_name(f".{pointer.name}.tmp")
    names = [f"{tag}.dcp", f"{tag}.1.dcp"]
    failure: BaseException | None = None
    choice, made = 0, False
    if rank == 0:  # a folder the pointer does not name, emptied
        try:
            with checkpoint_write(directory, [tmp]):
                previous = _read_pointer(pointer)["folder"] if pointer.exists() else None
                choice = 1 if previous == names[0] else 0
                folder = directory / names[choice]
                if folder.exists():  # left by a save that never completed
                    shutil.rmtree(folder)
                folder.mkdir(parents=True)
                made = True
        except Exception as exc:  # noqa: BLE001 - every rank must learn of it, then it is raised
            failure = exc
    # every rank learns rank 0's choice (and whether it could make the folder)
    failed, choice = (int(v) for v in _from_rank0([failure is not None, choice], group))
    folder = directory / names[choice]
    if not failed:
        try:
            with checkpoint_write(directory, [tmp]):
                tensors: dict[str, torch.Tensor] = {}
                chunks: list[Chunk] = []
                skeleton = _encode(payload, tensors, f"rank{rank}", chunks)
                dcp.save(tensors, storage_writer=_JsonWriter(folder),
                         planner=_ChunkSavePlanner(chunks, tensors), process_group=group)
                (folder / f"rank{rank}.json").write_text(json.dumps(skeleton))
        except Exception as exc:  # noqa: BLE001 - every rank must learn of it, then it is raised
            failure = exc
    if not failed and not _any_rank(failure is not None, group):  # then the pointer, on rank 0
        previous = None
        if rank == 0:
            try:
                with checkpoint_write(directory, [tmp]):
                    previous = _read_pointer(pointer)["folder"] if pointer.exists() else None
                    tmp.write_text(json.dumps({"format": FORMAT,
                                               "folder": folder.name, "world_size": world}))
                    os.replace(tmp, pointer)
            except OSError as exc:
                failure = exc
        if not _any_rank(failure is not None, group):
            if previous and previous != folder.name:
                shutil.rmtree(directory / previous, ignore_errors=True)
            return folder
    # a write failed on some rank: every rank raises, the pointer names the previous
    # folder, which is never the one removed here
    if made:
        shutil.rmtree(folder, ignore_errors=True)
    if failure is not None:
        raise failure
    raise CheckpointError(f"checkpoint_dir {directory}: another rank could not write its part "
                          "of the checkpoint (see its error); the previous one is kept",
                          hint="point checkpoint_dir at a writable folder with room")


def _from_rank0(values: list[float], group: Any = None) -> list[float]:
    """Rank 0's ``values`` on every rank of ``group`` (one small all-reduce: the
    other ranks add zeros)."""
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    if dist.get_rank(group) != 0:
        t.zero_()
    dist.all_reduce(t, group=group)
    return t.tolist()


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
    """Collective: this rank's payload from the checkpoint ``directory`` points at (as
    this rank wrote it: the world size must be the checkpoint's)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    pointer = Path(directory) / POINTER_FILE
    doc = _read_pointer(pointer)
    if doc["world_size"] != world:
        raise SchemaError(
            f"sharded checkpoint {pointer} was written by {doc['world_size']} ranks, this run "
            f"has {world}: its shards do not fit. Resume with {doc['world_size']} ranks, or "
            f"convert it: tabstream reshard {directory} OUT --world-size {world}"
        )
    folder = Path(directory) / doc["folder"]
    skeleton = _read_part(folder, rank)
    return load_part(folder, skeleton, group)


def load_part(folder: Path, skeleton: Any, group: Any = None, no_dist: bool = False) -> Any:
    """A part's JSON (:func:`read_parts`) with its tensors read (collective unless
    ``no_dist``)."""
    pieces: dict[str, Piece] = {}
    _slots(skeleton, pieces)
    tensors, _ = load_pieces(folder, pieces, group, no_dist)
    return _decode(skeleton, tensors)


def _read_part(folder: Path, rank: int) -> Any:
    try:
        return read_json_file(folder / f"rank{rank}.json", "checkpoint part")
    except (OSError, ValueError) as exc:
        raise DataError(f"cannot read rank {rank}'s part of checkpoint {folder}: {exc}") from exc


def read_parts(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], Path, list[Any]]:
    """``(pointer, folder, [each rank's part])`` of the checkpoint in ``directory``,
    without reading a tensor: a part is the rank's payload, each of its tensors a
    :class:`Stored` (read them with :func:`load_pieces`)."""
    pointer = Path(directory) / POINTER_FILE
    doc = _read_pointer(pointer)
    folder = Path(directory) / doc["folder"]
    world = doc["world_size"]
    if isinstance(world, bool) or not isinstance(world, int) or world < 1:
        raise DataError(f"sharded checkpoint pointer {pointer}: world_size {world!r} is not a "
                        "number of ranks; delete it or start over with resume=False")
    return doc, folder, [_decode(_read_part(folder, r), None) for r in range(world)]


def write_parts(directory: str | os.PathLike[str], parts: list[dict[str, Any]],
                tag: str) -> Path:
    """One process writes the checkpoint of ``len(parts)`` ranks (``parts[r]``: rank r's
    payload, with :class:`Chunk` values) into ``directory/<tag>.dcp`` and points
    ``checkpoint.dcp.json`` at it: what :func:`save_sharded` on that many ranks writes."""
    directory = Path(directory)
    folder = directory / f"{tag}.dcp"
    folder.mkdir(parents=True)
    tensors: dict[str, torch.Tensor] = {}
    chunks: list[Chunk] = []
    skeletons = [_encode(part, tensors, f"rank{r}", chunks) for r, part in enumerate(parts)]
    with _single_process(True):
        dcp.save(tensors, storage_writer=_JsonWriter(folder),
                 planner=_ChunkSavePlanner(chunks, tensors), no_dist=True)
    for r, skeleton in enumerate(skeletons):
        (folder / f"rank{r}.json").write_text(json.dumps(skeleton))
    pointer = directory / POINTER_FILE
    tmp = pointer.with_name(f".{pointer.name}.tmp")
    tmp.write_text(json.dumps({"format": FORMAT, "folder": folder.name,
                               "world_size": len(parts)}))
    os.replace(tmp, pointer)
    return folder


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

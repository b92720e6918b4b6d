"""PyTorch adapter: the core loader's batches as tensors.

    >>> import tempfile
    >>> import pandas as pd
    >>> import tabstream as ts
    >>> from tabstream import ops
    >>> out = tempfile.TemporaryDirectory()
    >>> df = pd.DataFrame({"C1": ["a", "b", "a", "c"], "tags": [["x", "y"], [], ["z"], ["x"]],
    ...                    "label": [1, 0, 0, 1]})
    >>> wf = ts.Workflow((["C1", "tags"] >> ops.Categorify()) + (["label"] >> ops.AddTags(["target"])))
    >>> wf.fit_transform(ts.Dataset(df)).to_parquet(out.name + "/train")
    ExportResult('.../train', files=1, num_rows=4)
    >>> loader = Loader(out.name + "/train", batch_size=4, shuffle=False)
    >>> features, labels = next(iter(loader))
    >>> features["C1"]                           # int64 ids
    tensor([3, 4, 3, 5])
    >>> features["tags"]                         # (values, offsets): row 1 is empty
    (tensor([3, 4, 5, 3]), tensor([0, 2, 2, 3, 4]))
    >>> labels
    tensor([1, 0, 0, 1])
    >>> out.cleanup()

Use it as an iterable, or wrap it: ``torch.utils.data.DataLoader(loader,
batch_size=None)`` (keep ``num_workers=0``: the loader already reads in a
background thread). Under ``torch.distributed`` the rank and world size default
to the process group's, and every rank gets the same number of batches.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.utils.data

from tabstream.core.schema import Tags
from tabstream.loaders import core
from tabstream.loaders.options import LoaderOptions
from tabstream.loaders.stepping import Mapped, Peekable, Stepping

__all__ = ["Loader", "SPARSE_FEATURES", "jagged_parts"]


def _distributed_defaults(global_size: int | None, global_rank: int | None) -> tuple[int | None, int | None]:
    if dist.is_available() and dist.is_initialized():
        size = dist.get_world_size() if global_size is None else global_size
        rank = dist.get_rank() if global_rank is None else global_rank
        return size, rank
    if global_size is not None and global_size > 1 and global_rank is None:
        raise ValueError(f"global_size={global_size} needs global_rank (or an initialized "
                         "torch.distributed process group)")
    return global_size, global_rank


def _map(structure: Any, fn: Any) -> Any:
    if isinstance(structure, dict):
        return {k: _map(v, fn) for k, v in structure.items()}
    if isinstance(structure, tuple):
        return tuple(_map(v, fn) for v in structure)
    if structure is None:
        return None
    return fn(structure)


def _check_device(device: Any) -> torch.device:
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={str(device)!r} but torch sees no CUDA GPU "
                         "(torch.cuda.is_available() is False); use device='cpu'")
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device {str(device)!r}: the loader delivers to 'cpu' or 'cuda' devices")
    return dev


SPARSE_FEATURES = "sparse_features"


def _keyed_jagged_class() -> Any:
    """TorchRec's ``KeyedJaggedTensor``, imported only when asked for."""
    try:
        with warnings.catch_warnings():
            # torchrec's CPU build reports its missing GPU kernels as DeprecationWarnings
            warnings.simplefilter("ignore", DeprecationWarning)
            from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
    except ImportError as exc:
        raise ImportError(
            "keyed_jagged=True needs torchrec (not a tabstream dependency): on CPU, "
            "pip install --no-deps torchrec==1.8.0 fbgemm-gpu-cpu==1.8.0 plus torchrec's "
            "small dependencies (see docs/loaders.md)"
        ) from exc
    return KeyedJaggedTensor


def jagged_parts(features: Mapping[str, Any], keys: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(values, lengths)`` of a ``KeyedJaggedTensor`` over ``keys``: key-major,
    each key's values for the whole batch, then the next key's.

    A single-valued column has length 1 per row; a list column ``(values, offsets)``
    the differences of its offsets; a padded or fixed-length ``(dense, mask)`` pair
    the masked entries, row by row.

    >>> features = {"C1": torch.tensor([7, 3]),
    ...             "tags": (torch.tensor([4, 5, 6]), torch.tensor([0, 2, 3]))}
    >>> jagged_parts(features, ["C1", "tags"])
    (tensor([7, 3, 4, 5, 6]), tensor([1, 1, 2, 1], dtype=torch.int32))
    """
    values, lengths = [], []
    for key in keys:
        if key not in features:
            raise ValueError(f"keyed_jagged: feature {key!r} is not in the batch; the batch has "
                             f"{sorted(features)}")
        column = features[key]
        if isinstance(column, torch.Tensor):
            if column.dim() != 1:
                raise ValueError(f"keyed_jagged: feature {key!r} has shape {tuple(column.shape)}; "
                                 "expected ids of shape (batch,)")
            values.append(column)
            lengths.append(torch.ones(len(column), dtype=torch.int32, device=column.device))
        elif isinstance(column, tuple) and len(column) == 2 and column[1].dtype == torch.bool:
            dense, mask = column
            if dense.dim() != 2:
                raise ValueError(f"keyed_jagged: feature {key!r} is a list of lists (shape "
                                 f"{tuple(dense.shape)}); a KeyedJaggedTensor holds one level")
            values.append(dense[mask])
            lengths.append(mask.sum(dim=1, dtype=torch.int32))
        elif isinstance(column, tuple) and len(column) == 2:
            flat, offsets = column
            values.append(flat)
            lengths.append(offsets.diff().to(torch.int32))
        else:
            raise ValueError(f"keyed_jagged: feature {key!r} is a list of lists; a "
                             "KeyedJaggedTensor holds one level of lists")
    if not keys:
        return torch.empty(0, dtype=torch.int64), torch.empty(0, dtype=torch.int32)
    return torch.cat(values), torch.cat(lengths)


def _tensor(a: Any, pin: bool) -> torch.Tensor:
    """One array as a tensor: numpy shares its memory (pinned when copying to a
    GPU); an array already on a device (cupy, cudf) is taken over through DLPack."""
    if isinstance(a, np.ndarray):
        t = torch.from_numpy(a)
        return t.pin_memory() if pin else t
    if isinstance(a, torch.Tensor):
        return a
    if hasattr(a, "__dlpack__"):
        return torch.from_dlpack(a)
    raise TypeError(f"the loader produced a {type(a).__name__}, which is neither a numpy "
                    "array nor a DLPack-capable array")


def _feature_blocks(loader: core.Loader) -> list[list[str]]:
    """The scalar features grouped by dtype, each group assembled in one buffer per
    batch (:meth:`tabstream.loaders.Loader.set_column_blocks`): a batch of the
    26+13-feature Criteo export is two allocations instead of 39 (a shuffled epoch
    of 2M rows: about 5% less CPU, benchmarks/RESULTS.md, session 19), as in the
    TensorFlow loader. Labels keep a buffer each: a training loop
    that keeps every batch's labels (for a metric) does not keep its features."""
    groups: dict[str, list[str]] = {}
    for name in loader.feature_names:
        layout = loader.column_layout(name)
        if not layout.depth:
            groups.setdefault(str(layout.dtype), []).append(name)
    return [g for g in groups.values() if len(g) > 1]


class Loader(Stepping, Mapped, torch.utils.data.IterableDataset):
    """Shuffled, sharded ``(features, labels)`` tensor batches from exported parquet.

    Takes the arguments of :class:`tabstream.loaders.Loader` (``features=``,
    ``labels=``, ``pad=``, ``prefetch=``, ``storage_options=``, ``transforms=``
    included), plus
    ``device``: where tensors are delivered. On a CUDA device batches are pinned in
    the background thread (page-locked host memory) and copied with
    ``non_blocking=True``, so the copy of one batch overlaps the work on the last;
    arrays that already live on the GPU (anything with ``__dlpack__`` that is not
    numpy, e.g. cupy or cudf columns) are taken over through DLPack without a copy.
    The shuffle does not depend on the device: the same seed gives the same batches
    on CPU and GPU.

    ``keyed_jagged``: ``True`` (the schema's CATEGORICAL features) or a list of
    feature names: those features are delivered together as one TorchRec
    ``KeyedJaggedTensor`` under the key ``"sparse_features"`` (TorchRec's name for
    it), the other features as before. Single-valued ids have length 1, list
    columns their lengths (padded or fixed-length ones without the padding);
    values are int64, lengths int32. Needs torchrec, which tabstream does not
    install (see ``docs/loaders.md``).

    Tensors share memory with the numpy batches (``torch.from_numpy``), so a batch
    costs no copy beyond the shuffle's gather. The scalar features of one dtype are
    rows of one buffer per batch: a feature tensor kept after its batch keeps that
    buffer alive (``.clone()`` it to keep only itself); labels have their own.

    merlin-dataloader's stepping works too (:mod:`tabstream.loaders.stepping`):
    ``next(loader)``, ``peek()``, ``stop()``, ``with``, ``map(fn)`` (``fn`` gets the
    tensors on ``device``) and ``loader.batch_size = n`` (from the next epoch on).
    ``position(epoch, batches)`` / ``set_position(position)`` resume an epoch on any
    number of ranks (the core's, :meth:`tabstream.loaders.Loader.position`).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        parts_per_chunk: int = 2,
        global_size: int | None = None,
        global_rank: int | None = None,
        drop_last: bool = False,
        device: str | torch.device = "cpu",
        *,
        features: Any = None,
        labels: Any = None,
        pad: bool | Mapping[str, Any] = False,
        prefetch: int = 2,
        storage_options: dict | None = None,
        transforms: Any = None,
        keyed_jagged: bool | Sequence[str] = False,
        list_layout: str = "tuple",
    ) -> None:
        super().__init__()
        global_size, global_rank = _distributed_defaults(global_size, global_rank)
        self.core = core.Loader.from_options(LoaderOptions(
            dataset, batch_size, shuffle, seed, parts_per_chunk, global_size, global_rank,
            drop_last, features=features, labels=labels, pad=pad, prefetch=prefetch,
            storage_options=storage_options, transforms=transforms, list_layout=list_layout,
        ))
        if keyed_jagged is not False and list_layout != "tuple":
            raise ValueError(f"keyed_jagged builds its KeyedJaggedTensor from (values, offsets) "
                             f"pairs: use it with list_layout='tuple', not {list_layout!r}")
        self.core.set_column_blocks(_feature_blocks(self.core))
        self.device = _check_device(device)
        self._pin = self.device.type == "cuda"
        self.keyed_jagged_keys = self._jagged_keys(keyed_jagged)
        self._kjt = _keyed_jagged_class() if self.keyed_jagged_keys is not None else None

    def _jagged_keys(self, keyed_jagged: Any) -> list[str] | None:
        if keyed_jagged is False:
            return None
        features = list(self.core.feature_names)
        if keyed_jagged is True:
            categorical = set(self.core.schema.select_by_tag(Tags.CATEGORICAL).column_names)
            keys = [f for f in features if f in categorical]
            if not keys:
                raise ValueError(f"keyed_jagged=True but none of the features {features} is "
                                 "tagged CATEGORICAL; name them: keyed_jagged=[...]")
        elif isinstance(keyed_jagged, (list, tuple)) and all(isinstance(k, str) for k in keyed_jagged):
            keys = list(keyed_jagged)
            unknown = [k for k in keys if k not in features]
            if unknown or not keys:
                raise ValueError(f"keyed_jagged={keys}: {unknown or 'no names'} not among the "
                                 f"loader's features {features}")
        else:
            raise TypeError(f"keyed_jagged must be a bool or a list of feature names, got "
                            f"{type(keyed_jagged).__name__}")
        if SPARSE_FEATURES in features:
            raise ValueError(f"keyed_jagged: a feature is already named {SPARSE_FEATURES!r}, "
                             "the key the KeyedJaggedTensor is delivered under; rename it")
        return keys

    # -- the core's settings ----------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Rows per batch; setting it applies from the next epoch on."""
        return self.core.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.core.batch_size = value

    shuffle = property(lambda self: self.core.shuffle)
    seed = property(lambda self: self.core.seed)
    global_size = property(lambda self: self.core.global_size)
    global_rank = property(lambda self: self.core.global_rank)
    drop_last = property(lambda self: self.core.drop_last)
    schema = property(lambda self: self.core.schema)
    feature_names = property(lambda self: self.core.feature_names)
    label_names = property(lambda self: self.core.label_names)
    num_rows = property(lambda self: self.core.num_rows)
    epoch = property(lambda self: self.core.epoch, doc="The epoch the next iteration runs.")

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (see :class:`tabstream.loaders.Loader`)."""
        self.core.set_epoch(epoch)

    def position(self, epoch: int, batches: int) -> dict[str, Any]:
        """Where ``epoch`` stands once every rank has taken ``batches`` batches: plain
        values, free of the number of ranks (:meth:`tabstream.loaders.Loader.position`)."""
        return self.core.position(epoch, batches)

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Resume from :meth:`position`'s output, taken on any number of ranks: the
        next iteration delivers the rows of its epoch not delivered yet, ``len(loader)``
        batches (:meth:`tabstream.loaders.Loader.set_position`)."""
        self.core.set_position(position)

    def __len__(self) -> int:
        return len(self.core)

    def __repr__(self) -> str:
        return repr(self.core).replace("Loader(", "torch.Loader(", 1)

    # -- iteration ------------------------------------------------------------------
    def _to_tensors(self, batch: core.Batch) -> Any:
        # Runs in the background thread.
        features, labels = _map(batch, lambda a: _tensor(a, self._pin))
        if self.keyed_jagged_keys is not None:
            keys = self.keyed_jagged_keys
            values, lengths = jagged_parts(features, keys)
            features = {k: v for k, v in features.items() if k not in keys}
            kjt = self._kjt.from_lengths_sync(keys, values, lengths)
            features[SPARSE_FEATURES] = kjt.pin_memory() if self._pin else kjt
        return features, labels

    def __iter__(self) -> Iterator[Any]:
        info = torch.utils.data.get_worker_info()
        if info is not None and info.num_workers > 1:
            raise RuntimeError(
                "wrap the tabstream loader in DataLoader(loader, batch_size=None) with "
                "num_workers=0: it reads in its own background thread, and each worker "
                "process would deliver every row again"
            )
        return self._continue_or_open()

    def _open_iteration(self) -> Peekable:
        if self.device.type == "cpu":  # map functions run in the background thread
            return Peekable(self.core.iter_epoch(self.core.next_epoch(),
                                                 self._mapping(self._to_tensors)))
        batches = self.core.iter_epoch(self.core.next_epoch(), self._to_tensors)
        maps = self._mapping()

        def moved() -> Iterator[Any]:
            for batch in batches:
                batch = _map(batch, lambda t: t.to(self.device, non_blocking=True))
                yield batch if maps is None else maps(batch)

        return Peekable(moved(), batches.close)

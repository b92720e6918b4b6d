"""A training loop for any iterable of ``(features, labels)`` batches.

    >>> import torch
    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> def categorical(name, n, *tags):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL, *tags],
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("C1", 1000), categorical("C2", 50),
    ...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
    ...                  ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])])
    >>> features = {"C1": torch.tensor([3, 999, 3, 42]), "C2": torch.tensor([0, 7, 49, 7]),
    ...             "I1": torch.tensor([0.5, -1.0, 2.0, 0.0])}
    >>> labels = torch.tensor([1.0, 0.0, 1.0, 0.0])
    >>> import tempfile
    >>> from tabstream.train.torch import DLRM, LazyAdam, fit
    >>> from tabstream.train.torch.fit import checkpoint_position
    >>> ckpt = tempfile.TemporaryDirectory()
    >>> _ = torch.manual_seed(0)
    >>> model = DLRM(schema, embedding_dim=8)
    >>> train = [(features, labels)] * 5            # or a tabstream.loaders.torch.Loader
    >>> history = fit(model, train, LazyAdam(model.parameters(), lr=1e-2), epochs=2,
    ...               valid_loader=[(features, labels)], checkpoint_dir=ckpt.name, resume=True,
    ...               progress=False)
    >>> history["epoch"], len(history["val_auc"]), checkpoint_position(ckpt.name)
    ([1, 2], 2, (2, 0))
    >>> ckpt.cleanup()

Checkpoints (``checkpoint_dir/checkpoint.pt``) hold only tensors and plain values
(model class name, model and optimizer ``state_dict``, torch's RNG state, position,
history) and load with ``torch.load(..., weights_only=True)``. With ``resume=True``
training continues from the last checkpoint, mid-epoch ones included (the batches
already trained are skipped), and ends with the same parameters as a run that never
stopped, given a loader that yields the same batches for the same epoch
(``set_epoch`` is called when the loader has it). A checkpoint written for another
model or schema is refused (:class:`~tabstream.core.errors.SchemaError` naming the file
and the first differences); a resume that leaves nothing to train says so with a
:class:`NothingToTrainWarning`.

Continuous training: the checkpoint also records which data it was trained on
(:func:`data_identity`: the loader's files, each with its rows, size, modification
time and footer digest). ``fit(resume=True)`` with the same ``checkpoint_dir`` on
*another* file list, after the previous one was trained to the end, starts a new
pass on it (from epoch 0, with the checkpointed model and optimizer); a crash
inside a file list resumes inside it on that file list, and is refused (naming the
files) when files were rewritten in place since.

Another number of ranks: a checkpoint records the world size, the batch size and,
mid-epoch, the tabstream loader's position in the epoch (which rows it delivered,
whatever the world size; :meth:`tabstream.loaders.core.Loader.position`). Resumed
on another number of ranks with the same global batch (ranks x ``batch_size``), the
epoch continues with the rows not trained yet, split over the new ranks, and rank 0
prints one line saying so; another global batch is refused (a ``DataError`` naming
both and the batch size that keeps it). See :mod:`tabstream.train.loop`.

Checked before the first step: the checkpoint folder (created, written, room for
the model's state; :class:`CheckpointError` naming it and ``checkpoint_dir``).
Checked every step: the labels are finite (a :class:`DataError` naming the label
column and the first bad row's file and row); the embedding tables check their ids
(:func:`tabstream.train.torch.embeddings.check_ids`).

The loop itself (epochs, resume, ``checkpoint_every``, file lists, history, the
NaN stop) is :mod:`tabstream.train.loop`, shared with Keras' ``fit``; this module
holds the torch step, checkpoint file and collectives (``_TorchTrainer``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sized
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tabstream.core.errors import DataError, SchemaError
from tabstream.train.checks import (
    CheckpointError,
    check_checkpoint_dir,
    checkpoint_write,
    data_files,
    label_error,
    label_name,
)
from tabstream.train.loop import LoopOptions, NonFiniteLossError, NothingToTrainWarning, Step
from tabstream.train.loop import identity_of as _identity
from tabstream.train.loop import run as run_loop
from tabstream.train.torch.metrics import log_loss, roc_auc

__all__ = [
    "CHECKPOINT_FILE",
    "CheckpointError",
    "NonFiniteLossError",
    "NothingToTrainWarning",
    "checkpoint_position",
    "data_identity",
    "evaluate",
    "fit",
    "move_to_device",
]

CHECKPOINT_FILE = "checkpoint.pt"
_FORMAT = "tabstream.train.torch.checkpoint/1"

LossFn = Callable[[torch.Tensor, Any], torch.Tensor]


def move_to_device(batch: Any, device: torch.device | str) -> Any:
    """Move tensors, also inside dicts and (values, offsets) tuples, to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def unpack_batch(batch: Any, where: str) -> tuple[Mapping[str, Any], Any]:
    """``(features, labels)`` of a batch; labels of one target given as a dict
    come out as that target's tensor, a dict of several targets stays a dict (for
    a ``loss_fn`` that takes it, see :func:`fit`)."""
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], Mapping)):
        raise TypeError(
            f"{where}: the loader must yield (features dict, labels) pairs, got "
            f"{type(batch).__name__}"
        )
    features, labels = batch
    if isinstance(labels, Mapping) and len(labels) == 1:
        labels = next(iter(labels.values()))
    return features, labels


def _batch_size(features: Mapping[str, Any], labels: Any) -> int:
    if isinstance(labels, Mapping):  # several targets: each holds one value per row
        labels = next((v for v in labels.values() if isinstance(v, torch.Tensor)), None)
    if isinstance(labels, torch.Tensor):
        return int(labels.shape[0])
    for value in features.values():
        if isinstance(value, torch.Tensor):
            return int(value.shape[0])
        if isinstance(value, tuple):  # (padded, mask): B rows; (values, offsets): B + 1 offsets
            return int(value[0].shape[0]) if value[0].dim() == 2 else int(value[1].shape[0]) - 1
    raise ValueError("cannot tell the batch size: no labels and no tensor features")


def _loss(model: nn.Module, features: Mapping[str, Any], labels: Any,
          loss_fn: LossFn | None, where: str = "fit") -> tuple[torch.Tensor, torch.Tensor | None]:
    """The training objective (the batch mean), and the logits when computing it
    produced them."""
    if loss_fn is None and isinstance(labels, Mapping):
        raise TypeError(
            f"{where}: labels is a dict of {len(labels)} targets {sorted(labels)}; pass a "
            "loss_fn that takes (logits, labels dict)"
        )
    compute_loss = getattr(model, "compute_loss", None)
    if loss_fn is None and callable(compute_loss):
        return compute_loss(features, labels), None
    logits = model(features)
    if loss_fn is not None:
        return _batch_mean(loss_fn(logits, labels), _batch_size(features, labels), where), logits
    if labels is None:
        raise ValueError("the loader yields no labels; pass a loss_fn or a model with compute_loss")
    loss = F.binary_cross_entropy_with_logits(logits.reshape(-1), labels.reshape(-1).to(logits.dtype))
    return loss, logits


def _batch_mean(loss: Any, rows: int, where: str = "fit") -> torch.Tensor:
    """The batch mean of what a ``loss_fn`` returned for a batch of ``rows`` rows:
    a scalar is the mean already; a ``[rows]`` (or ``[rows, 1]``) tensor holds one
    loss per row and is averaged (so each row weighs the same, as the loop weighs each batch by its
    rows); any other shape is refused.

    >>> _batch_mean(torch.tensor([1.0, 2.0, 6.0]), 3), _batch_mean(torch.tensor(3.0), 3)
    (tensor(3.), tensor(3.))
    """
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"{where}: loss_fn must return a torch.Tensor, got {type(loss).__name__}")
    if loss.dim() == 0:
        return loss
    if loss.dim() == 2 and loss.shape[1] == 1:  # [rows, 1]: one loss per row, as column labels give
        loss = loss[:, 0]
    if loss.dim() == 1 and loss.shape[0] == rows:
        return loss.mean()
    raise ValueError(
        f"{where}: loss_fn returned a tensor of shape {tuple(loss.shape)} for a batch of "
        f"{rows} rows; return a scalar (the batch mean) or one loss per row, shape ({rows},)"
    )


def _device_of(model: nn.Module) -> torch.device:
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable[Any],
    loss_fn: LossFn | None = None,
    device: torch.device | str | None = None,
) -> dict[str, float]:
    """``{"loss", "log_loss", "auc", "samples"}`` over all of ``loader``.

    ``loss`` is the training objective (``loss_fn``, the model's ``compute_loss``
    or binary cross-entropy), averaged per row; ``log_loss`` and ``auc`` score
    ``sigmoid(model(features))`` against the labels (``auc`` is ``nan`` when the
    labels hold one class only).
    """
    device = torch.device(device) if device is not None else _device_of(model)
    was_training = model.training
    model.eval()
    total, n = 0.0, 0
    all_logits, all_labels = [], []
    name = None
    try:
        for batch in loader:
            features, labels = unpack_batch(batch, "evaluate")
            name = name or label_name(loader, batch[1])
            features, labels = move_to_device(features, device), move_to_device(labels, device)
            size = _batch_size(features, labels)
            loss, logits = _loss(model, features, labels, loss_fn, "evaluate")
            total += float(loss) * size
            n += size
            if isinstance(labels, torch.Tensor):
                logits = model(features) if logits is None else logits
                all_logits.append(logits.reshape(-1).float().cpu())
                all_labels.append(labels.reshape(-1).float().cpu())
    finally:
        model.train(was_training)
    total, n, all_logits, all_labels = _gather_evaluation(total, n, all_logits, all_labels)
    out = {"loss": total / n if n else float("nan"), "samples": float(n)}
    if all_labels:
        y, z = torch.cat(all_labels).numpy(), torch.cat(all_logits).numpy()
        bad = y[~np.isfinite(y)]  # every rank holds every row here: all raise together
        if bad.size:
            raise label_error(name, str(float(bad[0])), loader, "in the evaluated data")
        out["log_loss"] = log_loss(y, z)
        out["auc"] = roc_auc(y, z)
    else:
        out["log_loss"] = out["auc"] = float("nan")
    return out


def _load_checkpoint(path: Path, device: torch.device) -> dict[str, Any]:
    try:
        ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as exc:  # a truncated file, or one holding more than tensors/values
        raise DataError(
            f"cannot read checkpoint {path}: {exc}. Only tabstream checkpoints (tensors and "
            "plain values) are loaded; delete the file, or start over with resume=False "
            "(tabstream train: --no-resume)"
        ) from exc
    if not isinstance(ckpt, dict) or ckpt.get("format") != _FORMAT:
        found = ckpt.get("format") if isinstance(ckpt, dict) else type(ckpt).__name__
        raise DataError(f"fit: {path} is not a tabstream checkpoint (format {found!r}, "
                        f"expected {_FORMAT!r})")
    return ckpt


def checkpoint_position(checkpoint_dir: str | os.PathLike[str]) -> tuple[int, int] | None:
    """``(epochs completed, batches done in the next epoch)`` of the checkpoint in
    ``checkpoint_dir`` (``checkpoint.pt``, or a sharded one), or ``None`` when there
    is none.

    >>> import tempfile
    >>> checkpoint_position(tempfile.gettempdir() + "/no-such-checkpoint") is None
    True

    After two epochs and 40 batches of the third it is ``(2, 40)`` (see the
    module's example).
    """
    path = Path(checkpoint_dir) / CHECKPOINT_FILE
    if not path.exists():
        return _sharded_position(Path(checkpoint_dir))
    ckpt = _load_checkpoint(path, torch.device("cpu"))
    return int(ckpt["epoch"]), int(ckpt["step"])


def _check_same_model(path: Path, model: nn.Module, ckpt: dict[str, Any]) -> None:
    """Refuse a checkpoint written for another model class or schema, naming the file
    and the first differences (before anything is loaded)."""
    saved_class, this_class = ckpt.get("model_class"), type(model).__qualname__
    if saved_class is not None and saved_class != this_class:
        raise SchemaError(
            f"checkpoint {path} was written for a {saved_class} model, not {this_class}; "
            "use another checkpoint_dir, or start over with resume=False (tabstream train: "
            "--no-resume)", hint=_OTHER_MODEL_HINT,
        )
    saved = {k: tuple(v.shape) for k, v in ckpt["model"].items()}
    here = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    diffs = [f"{k!r} only in the checkpoint" for k in saved if k not in here]
    diffs += [f"{k!r} missing from the checkpoint" for k in here if k not in saved]
    diffs += [f"{k!r} has shape {saved[k]} in the checkpoint, {here[k]} in the model"
              for k in here if k in saved and saved[k] != here[k]]
    if diffs:
        more = f" (and {len(diffs) - 5} more)" if len(diffs) > 5 else ""
        raise SchemaError(
            f"checkpoint {path} does not match this {this_class} (another schema or model "
            f"settings?): {'; '.join(diffs[:5])}{more}. Use another checkpoint_dir, or start "
            "over with resume=False (tabstream train: --no-resume)", hint=_OTHER_MODEL_HINT,
        )


_OTHER_MODEL_HINT = ("the checkpoint belongs to another training run: pass another --checkpoint-dir, "
                     "or --no-resume to train from scratch and overwrite it")


def _save(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with checkpoint_write(path.parent, [tmp]):
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:  # a Python file: a failed write is an OSError with its errno
            torch.save(payload, f)
        os.replace(tmp, path)  # a reader sees the old or the new checkpoint, never half of one


def fit(
    model: nn.Module,
    train_loader: Iterable[Any],
    optimizer: Any,
    epochs: int = 1,
    valid_loader: Iterable[Any] | None = None,
    loss_fn: LossFn | None = None,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    resume: bool = False,
    progress: bool = True,
    device: torch.device | str | None = None,
    checkpoint_every: int | None = None,
) -> dict[str, list[float]]:
    """Train ``model`` for ``epochs`` over ``train_loader``; return the history.

    Args:
        train_loader: any iterable of ``(features dict, labels)``, such as
            ``tabstream.loaders.torch.Loader`` or a list of batches.
        optimizer: anything with ``zero_grad``/``step``/``state_dict``/
            ``load_state_dict`` (a torch optimizer, :class:`MultiOptimizer`).
        loss_fn: ``(logits, labels) -> loss``: a scalar (the batch mean) or a
            ``[B]`` tensor of per-row losses (averaged over the rows); any other
            shape is refused. ``labels`` is what the loader yields: a tensor, or
            the dict of targets of a loader with several labels. Default: the
            model's ``compute_loss(features, labels)`` if it has one
            (``TwoTower``), else binary cross-entropy on logits (both need one
            target).
        checkpoint_dir: where ``checkpoint.pt`` is written after each epoch (and
            every ``checkpoint_every`` steps).
        resume: continue from ``checkpoint_dir``'s checkpoint when there is one
            (start afresh when there is none). A checkpoint of another number of
            ranks resumes too (a :class:`HybridParallel` model's tables and optimizer
            state are resharded to this run's plan; one line on rank 0 says so); a
            resume inside an epoch needs the checkpoint's global batch size
            (per-rank batch x ranks) and is refused otherwise.
        progress: a tqdm bar per epoch with the running loss and samples/s, and a
            summary line per epoch.
        device: move the model and each batch there (default: the model's device).

    Returns:
        ``{"epoch", "loss", "samples", "samples_per_sec", "time_s"}`` plus, with a
        ``valid_loader``, ``{"val_loss", "val_log_loss", "val_auc"}``: one entry
        per epoch, the epochs before a resume included.

    Raises:
        NonFiniteLossError: (a ``FloatingPointError``) when the loss is NaN or
            infinite, naming the epoch and step; that step is not applied.
        DataError: a NaN/inf label (naming the column, and the file and row of the
            first one for a tabstream loader; the step is not applied), an id
            outside its table, or a mid-epoch resume on data changed since.
        CheckpointError: (an ``OSError``) ``checkpoint_dir`` cannot be written,
            before the first step; or a checkpoint write failed (the previous
            checkpoint is kept).
    """
    options = LoopOptions(epochs=epochs, valid_loader=valid_loader, checkpoint_dir=checkpoint_dir,
                          resume=resume, progress=progress, checkpoint_every=checkpoint_every,
                          identity=data_identity)
    options.check()
    if device is not None:
        model.to(device)
    device = torch.device(device) if device is not None else _device_of(model)
    trainer = _TorchTrainer(model, optimizer, train_loader, loss_fn, device, checkpoint_dir)
    return run_loop(trainer, train_loader, options)


class _TorchTrainer:
    """The torch work of :func:`fit` (:class:`tabstream.train.loop.Trainer`): the step
    (rank-aware: the global-mean loss, NaN agreed over ranks before it is applied), the
    checkpoint file (or a HybridParallel model's shards), the all-reduce, evaluate."""

    def __init__(self, model: nn.Module, optimizer: Any, loader: Any, loss_fn: LossFn | None,
                 device: torch.device, checkpoint_dir: str | os.PathLike[str] | None) -> None:
        self.model, self.optimizer, self.loader = model, optimizer, loader
        self.loss_fn, self.device = loss_fn, device
        self.checkpoint_path = (Path(checkpoint_dir) / CHECKPOINT_FILE
                                if checkpoint_dir is not None else None)
        self.rank, self.world = _ranks()
        _check_loader_ranks(loader, self.world)
        #: rows of the largest global batch trained (all ranks' rows of one step)
        self.global_batch = 0
        #: (global batch, batches done in the epoch, folder) of the checkpoint resumed
        self._resumed_inside: tuple[int, int, Path] | None = None
        #: what loading did to the model's state, for the loop's resume line (resharding)
        self.resume_note: str | None = None
        #: the modules reading the next batch's rows ahead (CachedEmbeddings), and the
        #: next batch's features, handed to them once this step's forward is done
        self._readers = _prefetchers(model)
        self.prefetches = bool(self._readers)
        self._upcoming: Mapping[str, Any] | None = None

    def check_writable(self) -> None:
        assert self.checkpoint_path is not None
        _check_writable(self.checkpoint_path.parent, self.model)

    def checkpoint_exists(self) -> bool:
        assert self.checkpoint_path is not None
        return _checkpoint_exists(self.checkpoint_path, self.model)

    def load(self) -> dict[str, Any]:
        path, model = self.checkpoint_path, self.model
        assert path is not None
        ckpt = self._load_resharded() if _is_sharded(model) else None
        if ckpt is None:
            ckpt = self._load_as_written(path, model)
        if "rng" in ckpt:  # dropout and other torch randomness continue as if never stopped
            torch.random.set_rng_state(ckpt["rng"].cpu())
        self.global_batch = int(ckpt.get("global_batch") or 0)
        self._resumed_inside = (self.global_batch, int(ckpt.get("step", 0)), path.parent)
        return ckpt

    def _load_resharded(self) -> dict[str, Any] | None:
        """A sharded checkpoint in whole-table coordinates, read on this world size and
        plan (None for one of the older per-rank layout)."""
        from tabstream.train.torch.reshard import restore

        assert self.checkpoint_path is not None
        restored = restore(self.model, self.optimizer, self.checkpoint_path.parent)
        if restored is None:
            return None
        ckpt = restored.values
        if not isinstance(ckpt, dict) or ckpt.get("format") != _FORMAT:
            raise DataError(f"fit: {self.checkpoint_path.parent} does not point at a tabstream "
                            f"checkpoint (expected format {_FORMAT!r})")
        # printed by the loop in its one line on the change of workers (or of plan)
        self.resume_note = restored.note(self.checkpoint_path.parent, self.world, self.rank)
        return ckpt

    def _load_as_written(self, path: Path, model: nn.Module) -> dict[str, Any]:
        ckpt = _read_checkpoint(path, model, self.device)
        _check_same_model(path, _checkpointed(model), ckpt)
        _checkpointed(model).load_state_dict(ckpt["model"])
        try:
            self.optimizer.load_state_dict(self._optimizer_state(ckpt, model))
        except (ValueError, KeyError, RuntimeError) as exc:
            raise SchemaError(
                f"checkpoint {path}: its optimizer state does not fit this "
                f"{type(self.optimizer).__name__} ({exc}); resume with the optimizer the "
                "checkpoint was written with, or start over with resume=False (--no-resume)"
            ) from exc
        return ckpt

    def _optimizer_state(self, ckpt: Mapping[str, Any], model: nn.Module) -> Any:
        """The checkpoint's optimizer state; that of a torch optimizer renumbered by
        parameter name where the checkpoint names its ids (``reshard`` to 1 rank)."""
        from tabstream.train.torch.reshard import OPTIMIZER_PARAMS, optimizer_state_by_name

        names = ckpt.get(OPTIMIZER_PARAMS)
        if names is None or not isinstance(self.optimizer, torch.optim.Optimizer):
            return ckpt["optimizer"]
        return optimizer_state_by_name(ckpt["optimizer"], names, _checkpointed(model),
                                       self.optimizer)

    def save(self, state: dict[str, Any]) -> None:
        assert self.checkpoint_path is not None
        inner = _checkpointed(self.model)
        if _is_sharded(self.model):  # whole-table coordinates: resumes on any world size
            from tabstream.train.torch.reshard import checkpoint_state

            tensors = checkpoint_state(self.model, self.optimizer)
        else:
            tensors = {"model": inner.state_dict(), "optimizer": self.optimizer.state_dict()}
        _write_checkpoint(self.checkpoint_path, self.model, {
            "format": _FORMAT, "model_class": type(inner).__qualname__, **tensors,
            "rng": torch.random.get_rng_state(), "world_size": self.world,
            "global_batch": self.global_batch, **state,
        })

    def begin_epoch(self) -> None:
        self.model.train()

    def prefetch(self, batch: Any) -> None:
        """The loop hands the next batch before this step: its rows are read ahead
        once this step's forward has read its own (a read ahead is taken by the
        next lookup of its table)."""
        self._upcoming = unpack_batch(batch, "fit")[0]

    def step(self, batch: Any, where: str) -> Step:
        features, labels = unpack_batch(batch, "fit")
        features, labels = move_to_device(features, self.device), move_to_device(labels, self.device)
        bad_name, labels_bad = _nonfinite_labels(labels)
        loss, _ = _loss(self.model, features, labels, self.loss_fn)
        upcoming, self._upcoming = self._upcoming, None
        if upcoming is not None:
            for read_ahead in self._readers:
                read_ahead(upcoming)
        value = float(loss.detach())
        size = _batch_size(features, labels)
        global_size, finite, labels_ok = _agree_on_step(value, size, labels_bad)
        if self._resumed_inside is not None:
            self._check_global_batch(global_size)
        self.global_batch = max(self.global_batch, global_size)
        if not labels_ok:  # every rank raises: a rank left alone would hang
            raise label_error(bad_name or label_name(self.loader, batch[1]),
                              labels_bad or "NaN or inf on another rank", self.loader, where)
        if not finite:  # the loop raises on every rank together
            return Step(0.0, 0, finite=False, shown=_nonfinite_text(value), applied=False)
        self.optimizer.zero_grad(set_to_none=True)
        _backward(self.model, loss, size, global_size)
        _step(self.optimizer)
        return Step(value * size, size)

    def _check_global_batch(self, rows: int) -> None:
        """The first step after a resume inside an epoch: the global batch must be the
        checkpoint's, or the batches already trained are not the ones skipped now.
        ``rows`` is agreed over ranks, so every rank raises together."""
        assert self._resumed_inside is not None
        expected, done, folder = self._resumed_inside
        self._resumed_inside = None
        if not expected or not done or rows == expected:
            return
        if rows < expected and isinstance(self.loader, Sized) and done + 2 >= len(self.loader):
            # the epoch's last batches: shorter when the rows do not fill them (the
            # loader splits the last full batch in two so that every rank has one)
            return
        per_rank = (f"batch_size={expected // self.world} on each of the {self.world} ranks"
                    if expected % self.world == 0 else
                    f"a number of ranks that divides {expected}")
        raise SchemaError(
            f"fit: checkpoint {folder} stopped after {done} batches of an epoch trained with "
            f"global batches of {expected} rows (all ranks together); this run's global batch "
            f"has {rows} rows on {self.world} rank(s), so the rows already trained are not "
            f"the batches it would skip; resume with {per_rank}, or start over with "
            "resume=False (tabstream train: --no-resume)",
            hint=f"resume with {per_rank}, or start over with --no-resume",
        )

    def all_sum(self, values: list[float]) -> list[float]:
        return _all_reduce(values) if self.world > 1 else list(values)

    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]:
        return evaluate(self.model, loader, loss_fn=self.loss_fn, device=self.device)


def _check_loader_ranks(loader: Any, world: int) -> None:
    """A tabstream loader shares its rows among ``global_size`` ranks: on another
    number of ranks every row would be trained twice (a loader built before
    ``init_process_group`` takes 1) or some never."""
    core = getattr(loader, "core", None)
    size = getattr(core, "global_size", None)
    if isinstance(size, int) and not isinstance(size, bool) and size != world:
        raise ValueError(
            f"fit: the loader shares its rows among {size} rank(s) (global_size={size}, "
            f"global_rank={getattr(core, 'global_rank', '?')}), but fit runs on {world} rank(s), "
            f"so each row would {'be trained more than once' if size < world else 'not be trained'} "
            "per epoch; build the Loader after torch.distributed.init_process_group (it takes "
            f"the group's size and rank) or pass global_size={world} and this rank's global_rank")


def data_identity(loader: Any) -> str | None:
    """What a checkpoint records of the data it was trained on: ``loader.data_id``
    when the loader has one, else a hash of a tabstream loader's files: their
    names and rows, and each file's size, modification time and parquet footer
    (:func:`tabstream.train.checks.data_files`), so that a file rewritten in place
    is other data; ``None`` (unknown) for other iterables."""
    return _identity(loader, data_files(loader))


def _prefetchers(model: nn.Module) -> list[Any]:
    """What reads a batch's rows ahead: the model's ``fit_prefetch(features)`` when
    it has one, else each :class:`CachedEmbeddings`' ``prefetch``."""
    hook = getattr(model, "fit_prefetch", None)
    if callable(hook):
        return [hook]
    from tabstream.train.torch.cache import CachedEmbeddings

    return [m.prefetch for m in model.modules() if isinstance(m, CachedEmbeddings)]


def _step(optimizer: Any) -> None:
    try:
        optimizer.step()
    except RuntimeError as exc:
        if "sparse" not in str(exc).lower():
            raise
        raise TypeError(
            f"optimizer {type(optimizer).__name__} cannot apply a sparse gradient ({exc}). "
            "Embedding tables with at least sparse_threshold rows have sparse gradients: "
            "use tabstream.train.torch.LazyAdam (takes dense and sparse gradients) or a "
            "MultiOptimizer, or build the model with sparse=False"
        ) from exc


# ----------------------------------------------------------------------------------
# Rank awareness. Under torch.distributed (world size > 1, every rank calling fit with
# the same arguments) fit trains the global-mean loss, keeps one progress bar, reports
# epoch and validation figures over all ranks' rows, and writes checkpoints once:
# rank 0 writes checkpoint.pt for a replicated (DDP) model; a HybridParallel model
# saves its shards from every rank through torch.distributed.checkpoint.


def _ranks() -> tuple[int, int]:
    """``(rank, world size)``; ``(0, 1)`` outside torch.distributed."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _is_sharded(model: nn.Module) -> bool:
    from tabstream.train.torch.distributed import HybridParallel

    return isinstance(model, HybridParallel)


def _checkpointed(model: nn.Module) -> nn.Module:
    """The module whose state a checkpoint holds: a DDP model's inner module (its
    checkpoint then loads into the plain model too), else the model itself."""
    from torch.nn.parallel import DistributedDataParallel

    return model.module if isinstance(model, DistributedDataParallel) else model


def _all_reduce(values: list[float]) -> list[float]:
    import torch.distributed as dist

    from tabstream.train.torch.distributed import comm_device

    t = torch.tensor(values, dtype=torch.float64, device=comm_device())
    dist.all_reduce(t)
    return t.tolist()


def _agree_on_step(value: float, size: int, labels_bad: str | None = None) -> tuple[int, bool, bool]:
    """``(rows in the global batch, loss finite on every rank, labels finite on every
    rank)``: one small all-reduce."""
    if _ranks()[1] == 1:
        return size, math.isfinite(value), labels_bad is None
    total, bad, bad_labels = _all_reduce([float(size), 0.0 if math.isfinite(value) else 1.0,
                                          0.0 if labels_bad is None else 1.0])
    return int(total), bad == 0, bad_labels == 0


def _nonfinite_labels(labels: Any) -> tuple[str | None, str | None]:
    """``(target name or None, "nan"/"inf"/"-inf")`` when a float label tensor (or
    a target of a labels dict, named then) holds one, else ``(None, None)``. One
    fused reduction and one host sync per batch and target (the loss costs a sync
    anyway)."""
    if isinstance(labels, Mapping):
        for name, value in labels.items():
            _, bad = _nonfinite_labels(value)
            if bad is not None:
                return str(name), bad
        return None, None
    if not isinstance(labels, torch.Tensor) or not labels.is_floating_point():
        return None, None
    if bool(torch.isfinite(labels).all()):
        return None, None
    first = labels[~torch.isfinite(labels)].reshape(-1)[0]
    return None, str(float(first))


def _check_writable(folder: Path, model: nn.Module) -> None:
    """Before the first step: the ranks that write checkpoints check the folder
    (:func:`~tabstream.train.checks.check_checkpoint_dir`, room for the model's
    state at least); all ranks raise together when one cannot."""
    rank, world = _ranks()
    writes = rank == 0 or _is_sharded(model)
    error: CheckpointError | None = None
    if writes:
        state = _checkpointed(model).state_dict()
        needed = sum(t.numel() * t.element_size() for t in state.values()
                     if isinstance(t, torch.Tensor))
        try:
            check_checkpoint_dir(folder, needed)
        except CheckpointError as exc:
            error = exc
    if world > 1 and _all_reduce([0.0 if error is None else 1.0])[0] and error is None:
        raise CheckpointError(f"checkpoint_dir {folder} cannot take checkpoints on another "
                              "rank (see its error); pass another checkpoint_dir")
    if error is not None:
        raise error


def _nonfinite_text(value: float) -> str:
    return str(value) if not math.isfinite(value) else "NaN or infinite on another rank"


def _backward(model: nn.Module, loss: torch.Tensor, size: int, global_size: int) -> None:
    """Backpropagate this rank's share of the global-mean loss. DDP (and
    HybridParallel's dense part) average gradients over ranks, so the local mean is
    scaled by ``B_rank * W / B_global``: with batches of unequal size (a last
    batch) the result is still the gradient of the mean over all rows."""
    from torch.nn.parallel import DistributedDataParallel

    _, world = _ranks()
    if world > 1 and global_size and (
        _is_sharded(model) or isinstance(model, DistributedDataParallel)
    ):
        loss = loss * (size * world / global_size)
    loss.backward()


def _checkpoint_exists(path: Path, model: nn.Module) -> bool:
    if _is_sharded(model):
        from tabstream.train.torch.sharded_checkpoint import POINTER_FILE, sharded_exists

        if not sharded_exists(path.parent) and path.exists():
            raise SchemaError(
                f"fit: {path} holds a whole-model checkpoint, but a HybridParallel model "
                f"resumes from a sharded one ({path.parent / POINTER_FILE}). Load its "
                "'model' state into the plain model before wrapping it (and train on with "
                "resume=False), or use another checkpoint_dir"
            )
        return sharded_exists(path.parent)
    return path.exists()


def _write_checkpoint(path: Path, model: nn.Module, payload: dict[str, Any]) -> None:
    rank, world = _ranks()
    if _is_sharded(model):
        from tabstream.train.torch.sharded_checkpoint import save_sharded

        save_sharded(path.parent, payload, tag=f"checkpoint-{payload['global_step']:09d}")
        return
    if world > 1:
        import torch.distributed as dist

        # every rank's state_dict (a CachedEmbeddings commits its rank's server there)
        # is taken before the file exists: a rank killed in between cannot leave a
        # checkpoint ahead of its server
        dist.barrier()
    if rank == 0:
        _save(path, payload)
    if world > 1:  # nobody reads (or resumes from) a file still being written
        dist.barrier()


def _read_checkpoint(path: Path, model: nn.Module, device: torch.device) -> dict[str, Any]:
    if _is_sharded(model):
        from tabstream.train.torch.sharded_checkpoint import POINTER_FILE, load_sharded

        ckpt = load_sharded(path.parent)
        if not isinstance(ckpt, dict) or ckpt.get("format") != _FORMAT:
            raise DataError(f"fit: {path.parent / POINTER_FILE} does not point at a tabstream "
                            f"checkpoint (expected format {_FORMAT!r})")
        return move_to_device(ckpt, device) if device.type != "cpu" else ckpt
    return _load_checkpoint(path, device)


def _gather_evaluation(
    total: float, n: int, logits: list[torch.Tensor], labels: list[torch.Tensor]
) -> tuple[float, int, list[torch.Tensor], list[torch.Tensor]]:
    """Under torch.distributed: every rank's rows, in rank order, on every rank, so
    AUC and log-loss are those of the whole validation set and identical everywhere."""
    rank, world = _ranks()
    if world == 1:
        return total, n, logits, labels
    import torch.distributed as dist

    from tabstream.train.torch.distributed import comm_device

    where = comm_device()
    total, n_all = _all_reduce([total, float(n)])
    mine = torch.stack([torch.cat(labels) if labels else torch.zeros(0),
                        torch.cat(logits) if logits else torch.zeros(0)]).float().to(where)
    sizes = [torch.zeros(1, dtype=torch.long, device=where) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([mine.shape[1]], device=where))
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(2, longest, device=where)
    padded[:, : mine.shape[1]] = mine
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    rows = [p[:, : int(s)] for p, s in zip(parts, sizes)]
    if not any(r.shape[1] for r in rows):
        return total, int(n_all), [], []
    return total, int(n_all), [r[1].cpu() for r in rows], [r[0].cpu() for r in rows]


def _sharded_position(checkpoint_dir: Path) -> tuple[int, int] | None:
    from tabstream.train.torch.sharded_checkpoint import read_plain_values, sharded_exists

    if not sharded_exists(checkpoint_dir):
        return None
    values = read_plain_values(checkpoint_dir)
    return int(values["epoch"]), int(values["step"])

"""The training loop both frameworks' ``fit`` run: epochs, mid-epoch resume,
``checkpoint_every``, passes over successive file lists, history, the
non-finite-loss stop, "nothing left to train", progress and validation.

The framework modules (:mod:`tabstream.train.torch.fit`,
:mod:`tabstream.train.tensorflow.fit`) hand :func:`run` a :class:`Trainer`: the
framework work only (one training step, a checkpoint save and restore, a sum
over the workers, an evaluation). Everything else is decided here, once, so
the two ``fit`` loops cannot drift apart::

    run(trainer, loader, options)
      resume?  trainer.load() -> loop state -> where to start (epoch, batches to skip, pass)
      for each epoch:  loader.set_epoch(e); skip batches already trained
          trainer.prefetch(next batch)   (trainers with ``prefetches``: a cache's rows read ahead)
          trainer.step(batch) -> Step(loss_sum, rows, finite on every worker)
          every checkpoint_every steps: trainer.save(loop state)
      epoch end: sums over workers, trainer.evaluate(valid), history, trainer.save(...)

A checkpoint's loop state is plain values (JSON-able)::

    {"epoch": 2, "step": 40, "global_step": 240, "loss_sum": 27.1, "samples": 5120,
     "history": {...}, "data_id": "files:3f...", "data_pass": 0, "data_files": {...},
     "list_position": None, "world": 2, "batch_size": 512, "position": {...},
     "epoch_start": None}

Another number of workers: ``world`` and ``batch_size`` (per worker) say how the
checkpoint was trained, and ``position`` (a tabstream loader's
:meth:`~tabstream.loaders.core.Loader.position`, mid-epoch checkpoints only) which
rows of the epoch were delivered, whatever the world size. A resume on as many
workers with the same batch size skips the batches trained, as before (the
batches are those of a run that never stopped); a resume on another number of
workers hands the position to the loader, which delivers the rows not trained yet
split over the new workers, and says so in one line. The global batch (workers x
batch size) must stay the same: otherwise the resume is refused naming both and
the batch size that keeps it. ``epoch_start`` is where a resumed epoch started
(to replay it on as many workers). Checkpoints without ``world`` (older ones)
resume by skipping batches, on as many workers as they were written with.

``loss_sum`` and ``samples`` are the sums over all workers of the epoch so far
(the chief's record; the other workers resume from zero, so the sum over
workers at the epoch's end is right).

Continuous training: ``data_id`` names the data a checkpoint was trained on
(:func:`data_identity`). Resuming on the same data continues where the
checkpoint stopped; other data after a finished one is a new pass over it
(epoch 0, the checkpointed model and optimizer); other data while the checkpoint
stopped inside its own is refused (:class:`~tabstream.core.errors.DataError`).
:mod:`tabstream.train.lists` trains whole sequences of file lists on top: it runs
each list inside :func:`list_position`, the checkpoint records that position
(``list_position``), and a finished checkpoint of another position is a new pass
even on the same data (one list trained ``passes`` times), with a history of its
own (the history ``fit`` returns there holds that list's epochs only).
"""

from __future__ import annotations

import hashlib
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from tabstream.core.errors import DataError, TabstreamError
from tabstream.train.checks import changed_files, data_files
from tabstream.train.history import history_keys, record_epoch

__all__ = [
    "LoopOptions",
    "NonFiniteLossError",
    "NothingToTrainWarning",
    "Step",
    "Trainer",
    "continue_on_workers",
    "data_identity",
    "list_position",
    "loader_core",
    "run",
]


class NonFiniteLossError(TabstreamError, FloatingPointError):
    """The training loss became NaN or infinite on some worker; every worker stops."""


class NothingToTrainWarning(UserWarning):
    """``fit(resume=True)`` found a checkpoint that leaves no batch to train: all the
    requested epochs are done, or the loader is shorter than the checkpoint's position."""


@dataclass
class Step:
    """What one training step reports to the loop.

    ``loss_sum``/``rows``: this worker's summed loss and rows; ``finite``: the loss
    was finite on every worker (the trainer agrees on it, so all workers stop
    together); ``shown``: the loss to name in the error; ``applied``: whether the
    update was applied (torch checks before applying, Keras' compiled step after)."""

    loss_sum: float
    rows: int
    finite: bool = True
    shown: str = "nan"
    applied: bool = False


class Trainer(Protocol):
    """The framework work of a ``fit`` loop (see the module docstring)."""

    rank: int
    world: int
    #: what checkpoint messages name (a file or a folder)
    checkpoint_path: Path | None

    def check_writable(self) -> None: ...
    def checkpoint_exists(self) -> bool: ...
    def load(self) -> dict[str, Any]: ...
    def save(self, state: dict[str, Any]) -> None: ...
    def begin_epoch(self) -> None: ...
    def step(self, batch: Any, where: str) -> Step: ...
    def all_sum(self, values: list[float]) -> list[float]: ...
    def evaluate(self, loader: Iterable[Any]) -> dict[str, float]: ...
    # optional: ``prefetches`` (True when the model reads rows ahead, a parameter
    # server's cache) and ``prefetch(next_batch)``, called before the step of the
    # batch before it (see :func:`_with_next`)


@dataclass
class LoopOptions:
    """``fit``'s loop settings, checked once (:meth:`check`)."""

    epochs: int = 1
    valid_loader: Iterable[Any] | None = None
    checkpoint_dir: Any = None
    resume: bool = False
    progress: bool = True
    checkpoint_every: int | None = None
    #: the data identity a checkpoint records (default :func:`data_identity`)
    identity: Callable[[Any], str | None] | None = None

    def check(self) -> None:
        if isinstance(self.epochs, bool) or not isinstance(self.epochs, int):
            raise TypeError(f"fit: epochs must be an int, got {self.epochs!r}")
        if self.epochs < 0:
            raise ValueError(f"fit: epochs must be >= 0, got {self.epochs}")
        every = self.checkpoint_every
        if every is not None and (isinstance(every, bool) or not isinstance(every, int) or every < 1):
            raise ValueError(f"fit: checkpoint_every must be >= 1 step, got {every}")
        if self.checkpoint_dir is None and (self.resume or every):
            what = "resume" if self.resume else "checkpoint_every"
            raise ValueError(f"fit: {what} needs a checkpoint_dir (resume and checkpoint_every "
                             "read and write checkpoints there)")


# -- data identity (continuous training) ------------------------------------------------


def data_identity(loader: Any) -> str | None:
    """What a checkpoint records of the data it was trained on: ``loader.data_id``
    when the loader has one, else a hash of a tabstream loader's files (names,
    rows, and each file's size, modification time and parquet footer:
    :func:`tabstream.train.checks.data_files`); ``None`` (unknown) for other
    iterables. Both frameworks' loaders have the same ``core``."""
    return identity_of(loader, data_files(loader))


def identity_of(loader: Any, files: Mapping[str, str] | None) -> str | None:
    given = getattr(loader, "data_id", None)
    if given is not None:
        return str(given)
    if not files:
        return None
    source = loader.core.source
    text = "\n".join(f"{f} {files[f]}" for f in sorted(files)) + f"\n{source.num_rows}"
    return "files:" + hashlib.sha256(text.encode()).hexdigest()[:16]


def _names_identity(loader: Any) -> str | None:
    """The identity checkpoints before the file records had (names and row count)."""
    source = getattr(getattr(loader, "core", None), "source", None)
    if source is None or not source.files:
        return None
    text = "\n".join(sorted(str(f) for f in source.files)) + f"\n{source.num_rows}"
    return "files:" + hashlib.sha256(text.encode()).hexdigest()[:16]


_LIST_POSITION: ContextVar[int | None] = ContextVar("tabstream_list_position", default=None)


@contextmanager
def list_position(position: int) -> Iterator[None]:
    """Run the ``fit`` calls inside as position ``position`` (0-based, counted over
    all passes) of a sequence of file lists (:func:`tabstream.train.lists.train_lists`).

    The checkpoint records the position, so that a finished checkpoint of another
    position starts a new pass even when the data is the same (one file list
    trained ``passes`` times), while a restart at the checkpoint's own position
    resumes inside it (or finds it finished)::

        position 0: mon, finished   ->  position 1: mon   a new pass from epoch 0
        position 1: mon, 3 batches  ->  position 1: mon   resumes after batch 3
    """
    token = _LIST_POSITION.set(int(position))
    try:
        yield
    finally:
        _LIST_POSITION.reset(token)


def continue_on(path: Any, state: Mapping[str, Any], data_id: str | None, epochs: int,
                files_now: Mapping[str, str] | None, loader: Any,
                position: int | None = None) -> tuple[int, int, int]:
    """``(start epoch, batches to skip, pass)`` for a resume from ``state``.

    The same data (or data of unknown identity) resumes where the checkpoint
    stopped. Other data after a finished one starts a new pass over it (epoch 0,
    model and optimizer as checkpointed); other data while the checkpoint stopped
    inside its own is refused, naming the files rewritten in place when the file
    list is the same. ``position``: this run's place in a sequence of file lists
    (:func:`list_position`); a checkpoint of another place is other data, even
    when it is the same file list."""
    start_epoch, skip = int(state.get("epoch", 0)), int(state.get("step", 0))
    saved, data_pass = state.get("data_id") or None, int(state.get("data_pass", 0))
    saved_position = state.get("list_position")
    moved = position is not None and saved_position is not None and int(saved_position) != position
    finished = skip == 0 and start_epoch >= epochs
    same = (saved is None or data_id is None or saved == data_id
            or saved == _names_identity(loader))  # names only: a checkpoint of an older version
    if same and not moved:
        return start_epoch, skip, data_pass
    if finished:
        return 0, 0, data_pass + 1
    if same:
        raise DataError(
            f"fit: checkpoint {path} stopped inside epoch {start_epoch + 1} (after {skip} "
            f"batches) of file list position {saved_position} of a fit_lists sequence; this "
            f"run is position {position}",
            hint="pass the same lists in the same order (and passes) as the run that wrote "
            "the checkpoint, or another checkpoint_dir to start over",
        )
    changed = changed_files(state.get("data_files") or {}, files_now or {})
    if changed:
        more = f" (and {len(changed) - 3} more)" if len(changed) > 3 else ""
        raise DataError(
            f"fit: checkpoint {path} stopped inside epoch {start_epoch + 1} (after {skip} "
            f"batches) of data that has changed since: {', '.join(changed[:3])}{more} was "
            "rewritten in place (size, modification time or parquet footer differ from "
            "the checkpoint's record), so the batches already trained cannot be skipped",
            hint="resume on the data the checkpoint was written with, or start over with "
            "resume=False (tabstream train: --no-resume)",
        )
    raise DataError(
        f"fit: checkpoint {path} stopped inside another file list (epoch {start_epoch + 1}, "
        f"after {skip} batches; data {saved}, this loader's data {data_id})",
        hint="resume on the file list the checkpoint was written with to finish it first, "
        "or start over with resume=False",
    )


# -- another number of workers (elastic resume) -----------------------------------------


def loader_core(loader: Any) -> Any:
    """The tabstream loader core of ``loader`` (the torch and TensorFlow loaders hold
    one as ``.core``; a core loader is its own), or None for other iterables."""
    core = getattr(loader, "core", loader)
    return core if callable(getattr(core, "set_position", None)) else None


def _divisors(n: int, limit: int = 8) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0][:limit]


def continue_on_workers(path: Any, state: Mapping[str, Any], world: int, loader: Any,
                        start_epoch: int, skip: int) -> tuple[int, str | None]:
    """``(batches to skip, the line to print or None)`` for resuming ``state`` on
    ``world`` workers, after :func:`continue_on`; hands the loader the position it
    resumes from. See the module docstring."""
    core = loader_core(loader)
    saved_world = state.get("world")
    if saved_world is None:  # older checkpoints: batch counters, the same world size
        return skip, None
    saved_world = int(saved_world)
    saved_batch, batch = state.get("batch_size"), getattr(core, "batch_size", None)
    if saved_batch is not None and batch is not None and saved_world * saved_batch != world * batch:
        before, now = saved_world * int(saved_batch), world * batch
        if before % world == 0:
            fix = (f"build the loader with batch_size={before // world} on each of the {world} "
                   f"workers (the global batch stays {before} rows)")
        else:
            fix = (f"{before} rows do not split evenly over {world} workers: resume on a number "
                   f"of workers that divides {before} ({', '.join(map(str, _divisors(before)))}, "
                   "...)")
        raise DataError(
            f"fit: checkpoint {path} was trained with a global batch of {before} rows "
            f"({saved_world} workers x batch_size={saved_batch}); this run makes {now} "
            f"({world} x batch_size={batch}), which changes what a step means (the learning "
            f"rate was chosen for {before} rows). To resume, {fix}; or start over with "
            "resume=False",
            hint=f"keep the global batch of {before} rows ({fix}; tabstream train: "
            "--batch-size), or start over with resume=False (--no-resume)",
        )
    if saved_world == world:
        start = state.get("epoch_start")
        if skip and start and core is not None:
            core.set_position(start)  # a resumed epoch: replayed from where it started
        return skip, None
    if not skip:
        return 0, (f"fit: checkpoint {path} was written by {saved_world} workers, this run has "
                   f"{world}: training continues at epoch {start_epoch + 1}")
    position = state.get("position")
    if core is None or not position:
        raise DataError(
            f"fit: checkpoint {path} stopped inside epoch {start_epoch + 1} (after {skip} "
            f"batches on each of {saved_world} workers) and this run has {world} workers: "
            "which rows are left is known only to a tabstream loader's checkpoint (it "
            "records the rows delivered)",
            hint=f"resume on {saved_world} workers to finish the epoch, or start over with "
            "resume=False",
        )
    core.set_position(position)
    left = int(position["num_rows"]) - int(position["rows_delivered"])
    return 0, (f"fit: checkpoint {path} was written by {saved_world} workers, this run has "
               f"{world}: epoch {start_epoch + 1} continues with the {left} rows not trained "
               f"yet, {len(core)} batches on each worker")


# -- the loop ----------------------------------------------------------------------------


def _postfix(bar: Any, loss: float, rate: float) -> None:
    bar.set_postfix({"loss": f"{loss:.4f}", "samples/s": f"{rate:,.0f}"}, refresh=False)


_END = object()


def _with_next(batches: Iterable[Any], ahead: bool) -> Iterable[tuple[Any, Any]]:
    """``(batch, the batch after it or None)``: one batch is held ahead when
    ``ahead`` (so the trainer can read the next batch's rows during this step)."""
    if not ahead:
        for batch in batches:
            yield batch, None
        return
    it = iter(batches)
    batch = next(it, _END)
    while batch is not _END:
        upcoming = next(it, _END)
        yield batch, (None if upcoming is _END else upcoming)
        batch = upcoming


def run(trainer: Trainer, train_loader: Iterable[Any], options: LoopOptions) -> dict[str, list[float]]:
    """Train with ``trainer`` over ``train_loader`` as ``options`` say; return the
    history (:mod:`tabstream.train.history`). Every worker calls it with the same
    arguments; what needs agreeing (a NaN loss, the epoch's sums) is agreed through
    ``trainer.all_sum`` or inside ``trainer.step``."""
    options.check()
    epochs, path = options.epochs, trainer.checkpoint_path
    writes = options.checkpoint_dir is not None
    keys = history_keys(validation=options.valid_loader is not None)
    history: dict[str, list[float]] = {k: [] for k in keys}
    start_epoch, skip, global_step, data_pass = 0, 0, 0, 0
    loss_sum, samples = 0.0, 0
    progress = options.progress and trainer.rank == 0  # one bar and one summary per run
    if writes:
        trainer.check_writable()
    files_now = data_files(train_loader) if writes else None  # for checkpoints only
    data_id = (options.identity or data_identity)(train_loader) if writes else None
    in_list = _LIST_POSITION.get()  # inside fit_lists: this list's place in the sequence
    if options.resume and writes and trainer.checkpoint_exists():
        state = trainer.load()
        global_step = int(state.get("global_step", 0))
        if trainer.rank == 0:  # the chief's record holds the sums over all workers
            loss_sum, samples = float(state.get("loss_sum", 0.0)), int(state.get("samples", 0))
        history = {k: list(state.get("history", {}).get(k, [])) for k in keys}
        start_epoch, skip, data_pass = continue_on(path, state, data_id, epochs, files_now,
                                                   train_loader, in_list)
        if data_pass != int(state.get("data_pass", 0)):  # a new pass
            loss_sum, samples = 0.0, 0
            if in_list is not None:  # fit_lists: each list's history is its own
                history = {k: [] for k in keys}
        if start_epoch < epochs:
            skip, line = continue_on_workers(path, state, trainer.world, train_loader,
                                             start_epoch, skip)
            # one line for the change of workers: the data's part (above) and what the
            # trainer did to the model's state (resharded tables), when it did anything
            tables = getattr(trainer, "resume_note", None)
            line = f"{line}; {tables}" if line and tables else line or tables
            if line and trainer.rank == 0:
                tqdm.write(line)
        if start_epoch >= epochs:
            warnings.warn(
                f"fit: checkpoint {path} already holds {start_epoch} trained epoch(s) of this "
                f"data and epochs={epochs} were asked for: nothing to train. New data (another "
                "file list) starts a new pass by itself, and fit_lists skips the lists already "
                f"trained; to train this data again pass epochs > {start_epoch}, or "
                "resume=False (or another checkpoint_dir) to start over",
                NothingToTrainWarning, stacklevel=3,
            )

    core = loader_core(train_loader)
    prefetch = getattr(trainer, "prefetch", None) if getattr(trainer, "prefetches", False) else None

    def checkpoint(epoch: int, step: int) -> None:
        if not writes:
            return
        total, rows = loss_sum, samples
        if trainer.world > 1:
            total, n = trainer.all_sum([loss_sum, float(samples)])
            total, rows = (total, int(n)) if trainer.rank == 0 else (0.0, 0)
        position = start = None
        if step and core is not None:  # which rows are trained, for any number of workers
            position = core.position(epoch, step)
            start = core.position(epoch, 0)
            start = start if start["rows_delivered"] else None
        trainer.save({
            "epoch": epoch, "step": step, "global_step": global_step,
            "loss_sum": total, "samples": rows, "history": history,
            "data_id": data_id or "", "data_pass": data_pass, "data_files": dict(files_now or {}),
            "list_position": in_list,
            "world": trainer.world, "batch_size": getattr(core, "batch_size", None),
            "position": position, "epoch_start": start,
        })

    for epoch in range(start_epoch, epochs):
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(epoch)
        trainer.begin_epoch()
        total = len(train_loader) if isinstance(train_loader, Sized) else None
        bar = tqdm(total=total, initial=skip, desc=f"epoch {epoch + 1}/{epochs}", unit="batch",
                   disable=not progress, dynamic_ncols=True)
        run_samples, started = 0, time.perf_counter()
        shown = started
        step = -1
        try:
            for step, (batch, upcoming) in enumerate(_with_next(train_loader, prefetch is not None)):
                if step < skip:  # trained before the checkpoint we resumed from
                    continue
                where = f"at epoch {epoch + 1}/{epochs}, step {step + 1}"
                if prefetch is not None and upcoming is not None:
                    prefetch(upcoming)  # its rows are read while this step runs
                result = trainer.step(batch, where)
                if not result.finite:  # every worker knows: all stop together, none hangs
                    applied = "" if result.applied else "; this step was not applied"
                    raise NonFiniteLossError(
                        f"loss is {result.shown} {where} (global step {global_step + 1})"
                        f"{applied}. Lower the learning rate, clip gradients, or check the "
                        "batch for NaN/inf inputs (e.g. FillMissing/Normalize on continuous "
                        "columns)"
                    )
                loss_sum += result.loss_sum
                samples += result.rows
                run_samples += result.rows
                global_step += 1
                bar.update(1)
                now = time.perf_counter()
                if progress and now - shown > 0.5:
                    shown = now
                    _postfix(bar, loss_sum / max(samples, 1), run_samples / (now - started))
                if options.checkpoint_every and (step + 1) % options.checkpoint_every == 0:
                    checkpoint(epoch, step + 1)
            if progress and run_samples:
                now = time.perf_counter()
                _postfix(bar, loss_sum / max(samples, 1), run_samples / (now - started))
        finally:
            bar.close()
        if skip and step + 1 < skip:
            warnings.warn(
                f"fit: checkpoint {path} stopped after {skip} batches of epoch {epoch + 1}, "
                f"but the loader yields only {step + 1}: nothing was trained in that epoch. "
                "Is this the loader (files, batch size) the checkpoint was written with?",
                NothingToTrainWarning, stacklevel=3,
            )
        elapsed = time.perf_counter() - started
        skip = 0
        if trainer.world > 1:
            a, b, c = trainer.all_sum([loss_sum, float(samples), float(run_samples)])
            loss_sum, samples, run_samples = a, int(b), int(c)
        metrics = None
        if options.valid_loader is not None:
            metrics = trainer.evaluate(options.valid_loader)
        line = record_epoch(history, epoch=epoch, epochs=epochs, loss_sum=loss_sum,
                            samples=samples, run_samples=run_samples, elapsed=elapsed,
                            metrics=metrics)
        if progress:
            tqdm.write(line)
        loss_sum, samples = 0.0, 0
        checkpoint(epoch + 1, 0)
    return history

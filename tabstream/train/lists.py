"""Training over a sequence of file lists (continuous training), framework-neutral.

A continuous-training job trains on one file list after another (a day of logs,
say), exports the rows each list changed (:meth:`ParameterServer.export_delta`),
and after a crash or a restart must pick up exactly where it stopped: lists
already trained are not trained again, the list that was cut short resumes
inside itself, its delta is written once. :func:`train_lists` keeps that record
in ``checkpoint_dir/_lists.json`` (written atomically after each list), beside the
fit loop's own checkpoint (:mod:`tabstream.train.loop`, which starts a new pass
on a new list and refuses another list while one is unfinished);
:func:`fit_lists_with` is ``fit_lists`` of both frameworks (``tabstream.train.torch``
and ``tabstream.train.tensorflow``), given their ``fit``.

Order of a list's end, and why a crash anywhere is harmless:

1. the fit loop trains the list and writes its checkpoint (the parameter server
   is committed with it);
2. the delta of the list is exported (``delta_dir/<position>``, an atomic folder);
3. ``_lists.json`` records the list as done.

A restart after 1 finds the list finished in the checkpoint (the fit loop trains
nothing, quietly) and exports the delta; after 2 it finds the delta folder there
and only records the list.

Each list runs inside :func:`tabstream.train.loop.list_position` (its position,
counted over all passes), which the fit loop records in its checkpoint: a finished
checkpoint of an earlier position is a new pass even when it is the same file list
(one list with ``passes=2`` is trained twice), and each list's history holds its
own epochs only.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tabstream.core.errors import DataError
from tabstream.core.jsonfile import read_json_file, write_json_file
from tabstream.train.loop import NothingToTrainWarning, list_position

__all__ = ["LISTS_FILE", "fit_lists_with", "lists_done", "train_lists"]

LISTS_FILE = "_lists.json"
_FORMAT = "tabstream.lists/1"


def lists_done(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """The data identities of the file lists recorded as trained in
    ``checkpoint_dir``, in training order (an empty list when none)."""
    path = Path(checkpoint_dir) / LISTS_FILE
    if not path.exists():
        return []
    try:
        record = read_json_file(path, "record of trained file lists")
        done = [str(x) for x in record["done"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path} is not a readable record of trained file lists: {exc}",
                        hint="remove it to train every list again") from exc
    if record.get("format") != _FORMAT:
        raise DataError(f"{path}: format {record.get('format')!r}, expected {_FORMAT!r}")
    return done


def _record(checkpoint_dir: Path, done: list[str]) -> None:
    write_json_file(checkpoint_dir / LISTS_FILE, {"format": _FORMAT, "done": done})


def train_lists(
    train_one: Callable[[Any], Any],
    loaders: Sequence[Any],
    *,
    checkpoint_dir: str | os.PathLike[str],
    identity: Callable[[Any], str | None],
    servers: Sequence[Any] = (),
    passes: int = 1,
    delta_dir: str | os.PathLike[str] | None = None,
    prefetch: bool = True,
    on_list_end: Callable[[int, Any, Any], None] | None = None,
) -> list[Any]:
    """Train ``loaders`` one after the other, ``passes`` times, skipping what
    ``checkpoint_dir`` records as done.

    Args:
        train_one: ``train_one(loader)`` runs the fit loop on one list with
            ``checkpoint_dir`` and ``resume=True`` and returns its history.
        loaders: one loader per file list; each must have a data identity
            (``identity(loader)``: its files, or a ``data_id`` attribute).
        identity: the fit loop's ``data_identity``.
        servers: the parameter servers the model trains (their deltas are
            exported, their keysets prefetched).
        passes: how many times the whole sequence is trained.
        delta_dir: export each server's changed rows after each list to
            ``delta_dir/<position>`` (``<position>/<i>`` for several servers),
            positions counted over all passes from ``00000``.
        prefetch: stage each list's rows (``ParameterServer.prefetch``) when its
            export folder holds keysets (``write_keysets=True``).
        on_list_end: ``on_list_end(position, loader, history)`` after each list
            trained in this call.

    Returns the histories of the lists trained in this call, one per list: each
    holds that list's epochs only (the epochs of a list resumed after a restart
    include those trained before it).
    """
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
        raise ValueError(f"fit_lists: passes must be an int >= 1, got {passes!r}")
    loaders = list(loaders)
    if not loaders:
        raise ValueError("fit_lists: no file lists given")
    ids = []
    for i, loader in enumerate(loaders):
        data_id = identity(loader)
        if data_id is None:
            raise TypeError(
                f"fit_lists: list {i} ({type(loader).__name__}) has no data identity; pass "
                "tabstream Loaders (their files name them) or give each a data_id attribute"
            )
        ids.append(data_id)
    if len(set(ids)) != len(ids):
        first = next(x for x in ids if ids.count(x) > 1)
        raise ValueError(f"fit_lists: one file list is given twice ({first}); list it once and "
                         "use passes= to train the sequence again")
    folder = Path(checkpoint_dir)
    folder.mkdir(parents=True, exist_ok=True)
    order = [(p, i) for p in range(passes) for i in range(len(loaders))]
    done = lists_done(folder)
    for position, data_id in enumerate(done):
        if position >= len(order) or ids[order[position][1]] != data_id:
            given = ids[order[position][1]] if position < len(order) else "nothing"
            raise DataError(
                f"fit_lists: {folder / LISTS_FILE} records file list {data_id} as trained at "
                f"position {position}, but this sequence has {given} there",
                hint="pass the same lists in the same order (and passes) as the run that "
                "wrote the checkpoint, or another checkpoint_dir to start over",
            )
    histories = []
    for position in range(len(done), len(order)):
        loader = loaders[order[position][1]]
        if prefetch:
            keysets = _keysets_folder(loader)
            if keysets is not None:
                for ps in servers:
                    ps.prefetch(keysets)
        with warnings.catch_warnings(), list_position(position):
            # a list the fit loop finished at this position just before a crash:
            # nothing left, as expected
            warnings.filterwarnings("ignore", category=NothingToTrainWarning,
                                    message=".*already holds.*trained epoch")
            history = train_one(loader)
        if delta_dir is not None:
            for j, ps in enumerate(servers):
                out = Path(delta_dir) / f"{position:05d}"
                if len(servers) > 1:
                    out = out / str(j)
                if not out.exists():  # written before a crash: the folder is whole
                    ps.export_delta(out)
        done.append(ids[order[position][1]])
        _record(folder, done)
        histories.append(history)
        if on_list_end is not None:
            on_list_end(position, loader, history)
    return histories


def fit_lists_with(
    fit: Callable[..., Any],
    identity: Callable[[Any], str | None],
    servers: Sequence[Any],
    model: Any,
    loaders: Sequence[Any],
    optimizer: Any,
    *,
    checkpoint_dir: str | os.PathLike[str],
    passes: int = 1,
    delta_dir: str | os.PathLike[str] | None = None,
    prefetch: bool = True,
    on_list_end: Callable[[int, Any, Any], None] | None = None,
    **fit_kwargs: Any,
) -> list[Any]:
    """``fit_lists`` of a framework whose fit loop is ``fit`` (its data identity
    ``identity``; ``servers``: the parameter servers inside ``model``): ``fit`` on
    each file list of ``loaders`` in turn (``passes`` times over the sequence),
    resuming after a restart where the job stopped (:func:`train_lists`).
    ``fit_kwargs`` go to ``fit`` (``epochs`` per list, ``valid_loader``,
    ``checkpoint_every``, ``progress``, ...)."""
    for key in ("resume", "checkpoint_dir"):
        if key in fit_kwargs:
            raise TypeError(f"fit_lists: {key} is set by fit_lists itself (it always resumes)")
    if delta_dir is not None and not servers:
        raise ValueError("fit_lists: delta_dir needs a model with CachedEmbeddings (a "
                         "ParameterServer to export the rows of); this model has none")

    def train_one(loader: Any) -> Any:
        return fit(model, loader, optimizer, checkpoint_dir=checkpoint_dir, resume=True,
                   **fit_kwargs)

    return train_lists(train_one, loaders, checkpoint_dir=checkpoint_dir, identity=identity,
                       servers=servers, passes=passes, delta_dir=delta_dir, prefetch=prefetch,
                       on_list_end=on_list_end)


def _keysets_folder(loader: Any) -> str | None:
    """The export folder of a tabstream loader when it holds ``_keysets``."""
    files = getattr(getattr(getattr(loader, "core", None), "source", None), "files", None)
    if not files:
        return None
    try:
        parent = os.path.commonpath([os.path.dirname(str(f)) for f in files])
    except ValueError:
        return None
    return parent if os.path.isdir(os.path.join(parent, "_keysets")) else None

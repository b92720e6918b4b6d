"""``fit_lists``: continuous training over file lists with Keras, as
``tabstream.train.torch.fit_lists`` (see :mod:`tabstream.train.lists` for the
record kept and why a crash is harmless).

    >>> import tempfile
    >>> import tensorflow as tf
    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> from tabstream.train.tensorflow import DLRM, LazyAdam
    >>> def categorical(name, n):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("C1", 100), categorical("C2", 10),
    ...                  ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    >>> class Day(list):                       # a file list; tabstream Loaders name their files
    ...     def __init__(self, name, ids):
    ...         features = {"C1": tf.constant(ids, tf.int64), "C2": tf.constant([0, 1], tf.int64)}
    ...         super().__init__([(features, tf.constant([1.0, 0.0]))])
    ...         self.data_id = name
    >>> days = [Day("mon", [1, 2]), Day("tue", [2, 3]), Day("wed", [7, 8])]
    >>> tmp = tempfile.TemporaryDirectory()
    >>> def start():                           # what a (re)started job runs
    ...     model = DLRM(schema, embedding_dim=8, seed=0)
    ...     return model, LazyAdam(1e-2)
    >>> model, opt = start()
    >>> len(fit_lists(model, days[:2], opt, checkpoint_dir=tmp.name, progress=False))
    2
    >>> model, opt = start()                   # the job restarts; a new day arrived
    >>> len(fit_lists(model, days, opt, checkpoint_dir=tmp.name, progress=False))  # only "wed"
    1
    >>> lists_done(tmp.name)
    ['mon', 'tue', 'wed']
    >>> tmp.cleanup()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import keras

from tabstream.train.cache_store import ParameterServer
from tabstream.train.lists import fit_lists_with, lists_done
from tabstream.train.loop import data_identity
from tabstream.train.tensorflow.fit import fit

__all__ = ["fit_lists", "lists_done"]


def parameter_servers(model: Any) -> list[ParameterServer]:
    """The :class:`~tabstream.train.ParameterServer` objects the layers of ``model``
    hold (a Keras ``CachedEmbeddings``'s ``ps``), each once, in the order found."""
    found: list[ParameterServer] = []
    seen: set[int] = set()

    def visit(obj: Any) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, ParameterServer):
            if all(obj is not s for s in found):
                found.append(obj)
        elif isinstance(obj, keras.layers.Layer):
            for value in vars(obj).values():
                visit(value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                visit(value)
        elif isinstance(obj, dict):
            for value in obj.values():
                visit(value)

    visit(model)
    return found


def fit_lists(
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
) -> list[dict[str, list[float]]]:
    """:func:`~tabstream.train.tensorflow.fit` on each file list of ``loaders`` in
    turn (``passes`` times over the sequence), resuming after a restart where the
    job stopped: lists recorded as done in ``checkpoint_dir`` are skipped, a list
    cut short resumes inside itself (mid-epoch with ``checkpoint_every``).

    With ``delta_dir`` the rows each list changed in the model's parameter
    server(s) are exported after it (``delta_dir/<position>``); with ``prefetch``
    each list's keysets are staged before it. ``fit_kwargs`` go to ``fit``
    (``epochs`` per list, ``valid_loader``, ``checkpoint_every``, ``strategy``,
    ``progress``, ...). Returns the histories of the lists trained in this call.
    """
    return fit_lists_with(fit, data_identity, parameter_servers(model), model, loaders,
                          optimizer, checkpoint_dir=checkpoint_dir, passes=passes,
                          delta_dir=delta_dir, prefetch=prefetch, on_list_end=on_list_end,
                          **fit_kwargs)

"""``fit_lists``: continuous training over file lists with PyTorch (see
:mod:`tabstream.train.lists` for the record kept and why a crash is harmless).

    >>> import tempfile, torch
    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> from tabstream.train.torch import (DLRM, CachedEmbeddings, ParameterServer,
    ...                                    table_configs_from_schema)
    >>> def categorical(name, n):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL],
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("C1", 100), categorical("C2", 10),
    ...                  ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    >>> class Day(list):                       # a file list; tabstream Loaders name their files
    ...     def __init__(self, name, ids):
    ...         features = {"C1": torch.tensor(ids), "C2": torch.tensor([0, 1])}
    ...         super().__init__([(features, torch.tensor([1.0, 0.0]))])
    ...         self.data_id = name
    >>> days = [Day("mon", [1, 2]), Day("tue", [2, 3]), Day("wed", [7, 8])]
    >>> tmp = tempfile.TemporaryDirectory()
    >>> def start():                           # what a (re)started job runs
    ...     ps = ParameterServer.open_or_create(tmp.name + "/ps", table_configs_from_schema(
    ...         schema.without(["click"]), dim=8), optimizer="adagrad", lr=0.05)
    ...     torch.manual_seed(0)
    ...     model = DLRM(schema, embedding_dim=8, embeddings=CachedEmbeddings(ps, 10))
    ...     return ps, model, torch.optim.Adam(model.parameters())
    >>> ps, model, opt = start()
    >>> len(fit_lists(model, days[:2], opt, checkpoint_dir=tmp.name + "/ck",
    ...               delta_dir=tmp.name + "/delta", progress=False))     # two lists trained
    2
    >>> ps.close()                             # the job stops; a new day arrives
    >>> ps, model, opt = start()
    >>> len(fit_lists(model, days, opt, checkpoint_dir=tmp.name + "/ck",
    ...               delta_dir=tmp.name + "/delta", progress=False))     # only "wed" is new
    1
    >>> sorted(os.listdir(tmp.name + "/delta")), lists_done(tmp.name + "/ck")
    (['00000', '00001', '00002'], ['mon', 'tue', 'wed'])
    >>> ps.close(); tmp.cleanup()
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from tabstream.train.lists import fit_lists_with, lists_done
from tabstream.train.torch.cache import CachedEmbeddings
from tabstream.train.torch.fit import data_identity, fit

__all__ = ["fit_lists", "lists_done"]


def fit_lists(
    model: nn.Module,
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
    """:func:`~tabstream.train.torch.fit` on each file list of ``loaders`` in turn
    (``passes`` times over the sequence), resuming after a restart where the job
    stopped: lists recorded as done in ``checkpoint_dir`` are skipped, a list cut
    short resumes inside itself.

    With ``delta_dir`` the rows each list changed in the model's parameter
    server(s) are exported after it (``delta_dir/<position>``); with
    ``prefetch`` each list's keysets (an export with ``write_keysets=True``) are
    staged before it. ``fit_kwargs`` go to ``fit`` (``epochs`` per list,
    ``valid_loader``, ``checkpoint_every``, ``progress``, ...). Returns the
    histories of the lists trained in this call.
    """
    servers: list[Any] = []
    for module in model.modules():
        if isinstance(module, CachedEmbeddings) and all(module.ps is not s for s in servers):
            servers.append(module.ps)
    return fit_lists_with(fit, data_identity, servers, model, loaders, optimizer,
                          checkpoint_dir=checkpoint_dir, passes=passes, delta_dir=delta_dir,
                          prefetch=prefetch, on_list_end=on_list_end, **fit_kwargs)

"""Train a bundled PyTorch model on a tabstream export: what ``tabstream train``
and the demo run.

>>> import tempfile
>>> import pandas as pd
>>> import torch
>>> import tabstream as ts
>>> from tabstream import ops
>>> out = tempfile.TemporaryDirectory()
>>> df = pd.DataFrame({"C1": list("abcabcab"), "I1": [0.5, 1.0, 0.0, 2.0, 1.5, 0.1, 0.7, 0.2],
...                    "click": [1, 0, 0, 1, 1, 0, 1, 0]})
>>> wf = ts.Workflow((["C1"] >> ops.Categorify()) + (["I1"] >> ops.Normalize())
...                  + (["click"] >> ops.AddTags(["target", "binary_classification"])))
>>> wf.fit_transform(ts.Dataset(df)).to_parquet(out.name + "/train")
ExportResult('.../train', files=1, num_rows=8)
>>> threads = torch.get_num_threads()           # train_on_export sets torch's thread count
>>> history = train_on_export(out.name + "/train", out.name + "/train", model="dlrm",
...                           epochs=2, batch_size=4, threads=1, progress=False)
>>> history["epoch"], len(history["val_auc"]), type(history["model"]).__name__
([1, 2], 2, 'DLRM')
>>> torch.set_num_threads(threads)
>>> out.cleanup()
"""

from __future__ import annotations

import warnings
from typing import Any

from tabstream.core.threads import usable_cpus

__all__ = ["MODELS", "train_on_export"]

MODELS = ("dlrm", "dcn", "wide_and_deep")


def train_on_export(train: str, valid: str | None = None, model: str = "dlrm", epochs: int = 1,
                    batch_size: int = 2048, lr: float = 3e-3, seed: int = 0,
                    progress: bool | None = True, threads: int | None = None,
                    checkpoint_dir: str | None = None, resume: bool = True) -> dict[str, Any]:
    """Fit ``model`` on the export folder ``train`` (validating on ``valid``) with the
    tabstream torch loader and LazyAdam (sparse updates for large tables, Adam for
    the rest); returns the fit history plus ``"model"`` and ``"resumed_from"``.

    With ``checkpoint_dir`` a checkpoint is written after every epoch and, with
    ``resume=True`` (the default), a run continues from the one already there: model,
    optimizer state, epoch and shuffle epoch. ``"resumed_from"`` is the checkpoint's
    ``(epochs done, batches into the next epoch)``, or ``None`` for a fresh start.
    When all ``epochs`` are already done nothing is trained (the checkpoint's model
    and history come back). ``resume=False`` starts over and overwrites the checkpoint.
    """
    import torch

    from tabstream.loaders.torch import Loader
    from tabstream.pipeline.dataset import Dataset
    from tabstream.train.torch import DCN, DLRM, LazyAdam, NothingToTrainWarning, WideAndDeep, fit
    from tabstream.train.torch.fit import checkpoint_position

    builders = {"dlrm": DLRM, "dcn": DCN, "wide_and_deep": WideAndDeep}
    if model not in builders:
        raise ValueError(f"unknown model {model!r}; choose one of {list(builders)}")
    torch.manual_seed(seed)
    torch.set_num_threads(threads or usable_cpus())  # the CPUs the process may use
    train_ds = Dataset(train, engine="parquet")  # an export: never read raw text logs as CSV
    net = builders[model](train_ds.schema)
    train_loader = Loader(train_ds, batch_size=batch_size, shuffle=True, seed=seed)
    valid_loader = Loader(Dataset(valid, engine="parquet"), batch_size=max(batch_size, 65536), shuffle=False) if valid else None
    optimizer = LazyAdam(net.parameters(), lr=lr)
    resume = bool(resume and checkpoint_dir is not None)
    resumed_from = checkpoint_position(checkpoint_dir) if resume else None  # type: ignore[arg-type]
    with warnings.catch_warnings():
        if resumed_from is not None and resumed_from[0] >= epochs:
            # the caller reads "resumed_from" and says so in its own words
            warnings.simplefilter("ignore", NothingToTrainWarning)
        history: dict[str, Any] = fit(
            net, train_loader, optimizer, epochs=epochs, valid_loader=valid_loader,
            progress=bool(progress), checkpoint_dir=checkpoint_dir, resume=resume,
        )
    history["model"] = net
    history["resumed_from"] = resumed_from
    return history

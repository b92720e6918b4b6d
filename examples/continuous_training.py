"""Continuous training with the embedding cache: file lists, keysets, passes,
incremental exports and a resume after a crash.

    python examples/continuous_training.py                       # 6 x 50,000 rows
    python examples/continuous_training.py --rows 6000 --lists 3 --passes 1

Steps:

1. Criteo-like logs, one file per "file list" (a day of logs, say) plus one held
   out for validation. The Criteo recipe is fitted once on the training lists
   and every list is exported on its own with ``write_keysets=True``: beside the
   data, ``_keysets/*.parquet`` holds the distinct ids of each categorical column.
2. A :class:`ParameterServer` on disk holds every embedding table (16 wide) and
   its Adagrad state; a :class:`CachedEmbeddings` keeps the hot rows in memory
   and a ``DLRM`` reads its embeddings through it. The MLPs train with Adam.
3. For each pass and each list: ``ps.prefetch(list)`` stages the list's rows by
   its keysets, ``fit(..., checkpoint_dir=..., resume=True)`` trains it (a new
   list after a finished one is a new pass of ``fit``), then
   ``ps.export_delta(...)`` writes the rows that changed since the previous
   export, the incremental model a serving system would load.
4. In the second pass one list "crashes" half way (the loader raises); the
   server is reopened (rolled back to the last checkpoint) and ``fit`` resumes
   inside that list.

Prints one line per list, for example::

    pass 1 list 1: loss 0.5214  val_auc 0.7012  delta 21,345 rows  hit rate 0.41
    ...
    pass 2 list 3: crashed after 6 batches; reopened the server at version 2,808
    pass 2 list 3: loss 0.4732  val_auc 0.7611  delta 18,112 rows  hit rate 0.66 (resumed)
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any


class CrashingLoader:
    """Wraps a loader and raises after ``after`` batches: a stand-in for a crash."""

    def __init__(self, loader: Any, after: int) -> None:
        from tabstream.train.torch.fit import data_identity

        self.loader, self.after = loader, after
        self.data_id = data_identity(loader)  # the same file list as the loader it wraps

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Any:
        for i, batch in enumerate(self.loader):
            if i == self.after:
                raise RuntimeError("simulated crash")
            yield batch


def build_exports(workdir: str, rows: int, lists: int, seed: int) -> tuple[list[str], str]:
    """Raw Criteo-like files -> one export (with keysets) per list, and a valid export."""
    import tabstream as ts
    from tabstream.datasets.synthetic import write_data
    from tabstream.recipes import criteo_workflow

    raw = write_data("criteo", os.path.join(workdir, "raw"), rows * (lists + 1),
                     num_files=lists + 1, seed=seed)
    workflow = criteo_workflow(freq_threshold=2)
    workflow.fit(ts.Dataset(raw[:-1]))
    list_dirs = []
    for i, path in enumerate(raw[:-1]):
        out = os.path.join(workdir, "lists", f"list_{i:02d}")
        workflow.transform(ts.Dataset(path)).to_parquet(out, shuffle="per_partition", seed=seed,
                                                       write_keysets=True)
        list_dirs.append(out)
    valid = os.path.join(workdir, "valid")
    workflow.transform(ts.Dataset(raw[-1])).to_parquet(valid)
    return list_dirs, valid


def build_model(ps: Any, schema: Any, cache_rows: int, seed: int) -> tuple[Any, Any]:
    import torch

    from tabstream.train.torch import DLRM, CachedEmbeddings

    torch.manual_seed(seed)
    model = DLRM(schema, embedding_dim=16, embeddings=CachedEmbeddings(ps, cache_rows=cache_rows))
    return model, torch.optim.Adam(model.parameters(), lr=1e-3)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=50_000, help="rows per file list")
    parser.add_argument("--lists", type=int, default=6)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=1024)
    parser.add_argument("--cache-rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary folder")
    args = parser.parse_args(argv)

    import torch

    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train import table_configs_from_schema
    from tabstream.train.torch import ParameterServer, fit

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        workdir = args.workdir or tmp
        list_dirs, valid_dir = build_exports(workdir, args.rows, args.lists, args.seed)
        schema = ts.Dataset(list_dirs[0]).schema
        features = schema.without(schema.select_by_tag("target").column_names)
        ps_dir, ck_dir = os.path.join(workdir, "ps"), os.path.join(workdir, "checkpoint")
        ps = ParameterServer(ps_dir, table_configs_from_schema(features, dim=16),
                             storage="disk", seed=args.seed, optimizer="adagrad", lr=0.05)
        model, optimizer = build_model(ps, schema, args.cache_rows, args.seed)
        valid = Loader(valid_dir, batch_size=65536, shuffle=False)
        crash_at = (1, args.lists // 2) if args.passes > 1 else None
        for p in range(args.passes):
            for i, list_dir in enumerate(list_dirs):
                train = Loader(list_dir, batch_size=args.batch_size, shuffle=True, seed=args.seed + p)
                ps.prefetch(list_dir)
                note = ""
                if crash_at == (p, i):
                    half = max(len(train) // 2, 1)
                    try:
                        fit(model, CrashingLoader(train, half), optimizer, checkpoint_dir=ck_dir,
                            resume=True, checkpoint_every=max(half // 2, 1), progress=False)
                    except RuntimeError as exc:
                        if "simulated crash" not in str(exc):
                            raise
                    ps.close()  # the process "died": reopen everything from disk
                    ps = ParameterServer.open(ps_dir)
                    print(f"pass {p + 1} list {i + 1}: crashed after {half} batches; reopened the "
                          f"server at version {ps.version:,}", flush=True)
                    model, optimizer = build_model(ps, schema, args.cache_rows, args.seed)
                    note = " (resumed)"
                history = fit(model, train, optimizer, valid_loader=valid, checkpoint_dir=ck_dir,
                              resume=True, checkpoint_every=50, progress=False)
                delta = ps.export_delta(os.path.join(workdir, "deltas", f"pass{p + 1}_list{i + 1:02d}"))
                hit = model.inputs.embeddings.hit_rate
                print(f"pass {p + 1} list {i + 1}: loss {history['loss'][-1]:.4f}  "
                      f"val_auc {history['val_auc'][-1]:.4f}  delta {sum(delta.values()):,} rows  "
                      f"hit rate {hit:.2f}{note}", flush=True)
        ps.close()


if __name__ == "__main__":
    main()

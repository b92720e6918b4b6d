"""Embedding tables served by a :class:`~tabstream.train.cache_store.ParameterServer`
through a bounded cache of hot rows, for tables larger than memory.

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
    >>> from tabstream.train.torch import DLRM, fit, table_configs_from_schema
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ps = ParameterServer(tmp.name + "/ps", table_configs_from_schema(schema, dim=16),
    ...                      storage="disk", optimizer="adagrad", lr=0.05)
    >>> emb = CachedEmbeddings(ps, cache_rows=100)      # at most 100 rows per table in memory
    >>> model = DLRM(schema, embeddings=emb)            # dense part: any optimizer
    >>> history = fit(model, [(features, labels)] * 3, torch.optim.Adam(model.parameters()),
    ...               checkpoint_dir=tmp.name + "/ck", progress=False)
    >>> emb.cached_rows, sorted(ps.touched("C1").tolist())   # rows 3, 42 and 999 were trained
    ({'C1': 3, 'C2': 3}, [3, 42, 999])
    >>> tmp.cleanup()

``CachedEmbeddings`` takes batches in every layout :class:`EmbeddingTables` takes
(single-hot ids, ragged ``(values, offsets)``, padded ``(ids, mask)``, the
``__values``/``__offsets``/``__mask`` keys) and returns ``{feature: (B, dim)}``;
list features of a ``combiner=None`` table come out per id, ``(vectors, mask)``
as there.

Per batch and table, the distinct ids are looked up in the cache (misses are
read from the server) and gathered into a small leaf tensor; its gradient,
once backward has summed it, goes straight to the server's fused optimizer
(:meth:`ParameterServer.apply`), whose new rows replace the cached ones. The
tables therefore hold no ``nn.Parameter``: the model's optimizer sees only the
dense part, and gradient clipping does not reach the tables (as with TorchRec's
fused optimizers).

The cache is write-through: every update is in the server before the step
ends, so evicting a row (least recently used first) writes nothing and a crash
loses no row that was only cached. ``state_dict`` commits the server
(``ps.flush()``) and records its version, so a ``fit`` checkpoint and the
server always describe the same step; loading a checkpoint written just before
the server's last commit rolls the server back to it.

Several ranks (torch.distributed, the dense part under DDP): each rank opens its
own server folder and owns the rows ``id % W``; the module exchanges ids, rows
and gradients with their owners (:mod:`tabstream.train.torch.cache_ranks`), and
trains exactly as one process on the concatenated global batch::

    ps = ParameterServer.open_or_create(f"ps/rank{rank}", tables, seed=0)
    model = DDP(DLRM(schema, embeddings=CachedEmbeddings(ps, cache_rows)))
    fit(model, Loader(...), optimizer, checkpoint_dir="ck/")   # on every rank

Every rank builds the module and calls it on the same features (an exchange is
a collective). The servers advance in lockstep (one update per table and step
on each), so the version a checkpoint records is every rank's; ``state_dict``
commits this rank's server only, so a checkpoint of a run of several ranks is
written once every rank has taken its ``state_dict`` (``fit`` does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from tabstream.core.errors import DataError, SchemaError
from tabstream.train.cache_store import ParameterServer
from tabstream.train.row_cache import RowCache, check_cache_args, served_tables
from tabstream.train.tables import TableConfig
from tabstream.train.torch.cache_ranks import RankExchange
from tabstream.train.torch.embeddings import parse_feature, to_ragged

__all__ = ["CachedEmbeddings", "ParameterServer"]

Features = Mapping[str, Any]


class CachedEmbeddings(nn.Module):
    """An ``nn.Module`` like :class:`EmbeddingTables` whose rows live in ``ps``.

    Args:
        ps: the parameter server holding every table's rows and optimizer state.
        cache_rows: at most this many rows per table are kept in memory.
        tables: the server's tables this module serves; by default, for each
            feature, the first table that lists it (a server may hold a second
            table for a feature, as Wide&Deep's wide tables, served by a second
            module with ``tables=``).
        process_group: under torch.distributed, the gloo group whose ranks share
            the tables (default: all ranks, through a gloo group of the module's
            own). Each rank passes its own server (its own folder, the same tables
            and settings) and owns the rows ``id % W``; see the module docstring.

    ``hit_rate`` (cache hits over lookups since construction), ``cached_rows``
    and ``table_names``/``feature_names``/``output_dims`` describe it.
    """

    def __init__(self, ps: ParameterServer, cache_rows: int = 1_000_000,
                 tables: Any = None, process_group: Any = None) -> None:
        super().__init__()
        check_cache_args(ps, cache_rows)
        self.ps = ps
        self.cache_rows = cache_rows
        self.configs: tuple[TableConfig, ...]
        self.configs, self.feature_to_table = served_tables(ps, tables)
        self._config_by_name = {c.name: c for c in self.configs}
        self._caches = {c.name: RowCache(min(cache_rows, c.cardinality), c.dim)
                        for c in self.configs}
        # the server version this module's rows belong to (checkpointed)
        self.register_buffer("ps_version", torch.zeros((), dtype=torch.int64))
        self._ranks = RankExchange.create(process_group)
        if self._ranks is not None:
            self._ranks.check_servers(ps, self.table_names)
        ps.attach(self._on_server_event)

    # -- EmbeddingTables' interface -------------------------------------------

    @property
    def table_names(self) -> list[str]:
        return [c.name for c in self.configs]

    @property
    def feature_names(self) -> list[str]:
        return list(self.feature_to_table)

    @property
    def output_dims(self) -> dict[str, int]:
        return {f: self._config_by_name[t].dim for f, t in self.feature_to_table.items()}

    @property
    def hit_rate(self) -> float:
        hits = sum(c.hits for c in self._caches.values())
        total = hits + sum(c.misses for c in self._caches.values())
        return hits / total if total else float("nan")

    @property
    def cached_rows(self) -> dict[str, int]:
        return {name: len(c) for name, c in self._caches.items()}

    def forward(self, features: Features) -> dict[str, Any]:
        return self._embed(features, self.feature_to_table)

    def prefetch(self, features: Features) -> None:
        """Start reading, in a background thread, the rows of ``features`` (the next
        batch) that the cache does not hold, while the current step runs: the next
        forward takes them from there (:meth:`ParameterServer.read_ahead`) instead
        of reading them then. Optional; the answers are the same without it.
        :func:`~tabstream.train.torch.fit` calls it with each next batch.

            logits = model(features)          # the current step's rows are read
            emb.prefetch(next_features)       # after its forward: a forward takes
            loss = loss_fn(logits, labels); loss.backward(); optimizer.step()

        (Called before the current forward, that forward's reads would take the read
        ahead, one-shot, and the next batch's rows would be read again.)

        Under several ranks it does nothing (the owners read the rows)."""
        if self._ranks is not None:
            return
        by_table: dict[str, list[np.ndarray]] = {}
        for feature, table in self.feature_to_table.items():
            ids = _parse(feature, self._config_by_name[table], features)[0]
            by_table.setdefault(table, []).append(ids.reshape(-1).to(torch.long).cpu().numpy())
        for table, parts in by_table.items():
            uniq = np.unique(np.concatenate(parts))
            # ids outside the table are left to the step that trains them to refuse
            uniq = uniq[(uniq >= 0) & (uniq < self._config_by_name[table].cardinality)]
            missing = uniq[self._caches[table].find(uniq) < 0]
            if len(missing):
                self.ps.read_ahead(table, missing)

    def subset(self, feature_names: Any) -> _CachedSubset:
        """A view serving only ``feature_names`` (each tower of a two-tower model
        looks up its own features); the rows, the cache and the server stay this
        module's."""
        names = list(feature_names)
        unknown = sorted(set(names) - set(self.feature_to_table))
        if unknown:
            raise SchemaError(f"CachedEmbeddings.subset: features {unknown} are not served; "
                              f"it serves {self.feature_names}")
        return _CachedSubset(self, {f: self.feature_to_table[f] for f in names})

    def _embed(self, features: Features, feature_to_table: Mapping[str, str]) -> dict[str, Any]:
        by_table: dict[str, list[tuple[str, tuple[torch.Tensor, ...]]]] = {}
        for feature, table in feature_to_table.items():
            by_table.setdefault(table, []).append(
                (feature, _parse(feature, self._config_by_name[table], features)))
        out: dict[str, Any] = {}
        for table, parsed in by_table.items():
            cfg = self._config_by_name[table]
            ids = [p[1][0] for p in parsed]
            flat = torch.cat([i.reshape(-1).to(torch.long) for i in ids]).cpu().numpy()
            uniq, inverse = np.unique(flat, return_inverse=True)
            train = torch.is_grad_enabled() and self.training
            if self._ranks is None:
                weight = torch.from_numpy(self._rows(table, uniq))
                if train:
                    weight.requires_grad_(True)
                    weight.register_post_accumulate_grad_hook(self._updater(table, uniq))
            else:  # the owners serve the rows and apply their gradients
                weight = self._ranks.rows(table, self.table_names.index(table), uniq, cfg.dim,
                                          self.ps.version, self._rows, self._update_rows, train)
            device = ids[0].device
            if device.type != "cpu":
                weight = weight.to(device)
            local = torch.from_numpy(inverse.reshape(-1)).to(device)
            start = 0
            for (feature, tensors), id_tensor in zip(parsed, ids):
                n = id_tensor.numel()
                mapped = local[start:start + n].reshape(id_tensor.shape)
                start += n
                if len(tensors) == 1:
                    out[feature] = F.embedding(mapped.reshape(-1), weight)
                elif cfg.combiner is None:
                    out[feature] = _per_id(mapped, weight, tensors[1])
                else:
                    out[feature] = F.embedding_bag(mapped, weight, tensors[1].to(torch.long),
                                                   mode=cfg.combiner, include_last_offset=True)
        return out

    # -- cache and server -----------------------------------------------------

    def _rows(self, table: str, uniq: np.ndarray) -> np.ndarray:
        cache = self._caches[table]
        cache.clock += 1
        slots = cache.find(uniq)
        hit = slots >= 0
        cache.hits += int(hit.sum())
        cache.misses += int((~hit).sum())
        rows = np.empty((len(uniq), self._config_by_name[table].dim), np.float32)
        rows[hit] = cache.rows[slots[hit]]
        cache.used[slots[hit]] = cache.clock
        if (~hit).any():
            missing = uniq[~hit]
            fetched = self.ps.lookup(table, missing)
            rows[~hit] = fetched
            cache.put(missing, fetched, keep=slots[hit])
        return rows

    def _updater(self, table: str, uniq: np.ndarray) -> Any:
        def update(weight: torch.Tensor) -> None:
            grad = weight.grad
            weight.grad = None
            if grad is None:
                return
            self._update_rows(table, uniq, grad.detach().cpu().numpy())
        return update

    def _update_rows(self, table: str, uniq: np.ndarray, grads: np.ndarray) -> None:
        """One optimizer step of ``table`` on rows ``uniq`` (sorted, distinct); the
        cached copies of those rows are refreshed."""
        new = self.ps.apply(table, uniq, grads)
        cache = self._caches[table]
        slots = cache.find(uniq)
        cached = slots >= 0
        cache.rows[slots[cached]] = new[cached]

    def _on_server_event(self, event: str, *args: Any) -> None:
        if event == "reset":  # the server went back to an earlier version
            for cache in self._caches.values():
                cache.clear()
        elif event == "stage":
            table, ids, rows = args
            cache = self._caches.get(table)
            if cache is None:
                return  # a table of the server another module serves
            if self._ranks is not None:  # the rows other ranks own are theirs to cache
                mine = self._ranks.owned(ids)
                ids, rows = ids[mine], rows[mine]
            slots = cache.find(ids)
            fresh = slots < 0
            room = max(cache.capacity - len(cache), 0)
            cache.put(ids[fresh][:room], rows[fresh][:room])

    # -- checkpoints ------------------------------------------------------------

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        # under ranks too this is this rank's server alone (no collective: a
        # state_dict taken on rank 0 only must not hang); the servers' versions are
        # equal, checked on every exchange
        self.ps_version.fill_(self.ps.flush())
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, *args: Any) -> None:
        key = prefix + "ps_version"
        if key in state_dict:
            wanted = int(state_dict[key])
            if wanted != self.ps.version:
                if self.ps.trained_since_commit:  # resets alone are kept by the rollback
                    raise DataError(
                        f"parameter server {self.ps.path} holds uncommitted updates (version "
                        f"{self.ps.version}, last commit {self.ps.mark}); reopen it with "
                        "ParameterServer.open before loading a checkpoint"
                    )
                self.ps.rollback_to(wanted)
        super()._load_from_state_dict(state_dict, prefix, *args)


def refuse_cached_under_ranks(model: nn.Module, who: str) -> None:
    """Refuse a model that trains tables through a parameter server where ``who``
    would shard or replicate them itself (HybridParallel): the server's rows are
    already sharded over the ranks by ``CachedEmbeddings``."""
    cached = [name or "<model>" for name, m in model.named_modules() if isinstance(m, CachedEmbeddings)]
    if cached:
        raise ValueError(
            f"{who}: the model trains {cached} through a ParameterServer, whose rows "
            f"CachedEmbeddings shards over the ranks itself; {who} does not shard them. Wrap "
            "the model in torch's DistributedDataParallel instead (each rank opens its own "
            "server folder), or use in-memory tables (HybridParallel shards them)"
        )


def _parse(feature: str, cfg: TableConfig, features: Features) -> tuple[torch.Tensor, ...]:
    """``(ids,)`` for single-hot features, ``(values, offsets)`` for lists (only the
    values the offsets cover, offsets from 0); for a padded list of a per-id table
    (``combiner=None``), ``(ids[mask], mask)``, which keeps the padded shape."""
    x = parse_feature(feature, cfg, features)
    if isinstance(x, torch.Tensor):
        return (x,)
    if cfg.combiner is None and x[0].dim() > 1:
        mask = x[1].to(torch.bool)
        return x[0][mask], mask
    values, offsets = to_ragged(feature, cfg, {feature: x})
    if offsets.numel() and (int(offsets[0]) != 0 or int(offsets[-1]) != values.numel()):
        # an arrow slice: ids outside it are neither looked up nor updated
        values, offsets = values[int(offsets[0]):int(offsets[-1])], offsets - offsets[0]
    return values, offsets


def _per_id(ids: torch.Tensor, weight: torch.Tensor, layout: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of ``weight`` per id, as :class:`EmbeddingTables` gives them with
    ``combiner=None``: ``(vectors, mask)``, zeros where the mask is false. ``layout``
    is the ragged offsets (``(B, L)``, ``L`` the longest list) or the padded mask."""
    if layout.dim() == 1:
        lengths = layout[1:] - layout[:-1]
        width = int(lengths.max()) if lengths.numel() else 0
        mask = torch.arange(width, device=layout.device) < lengths[:, None]
    else:
        mask = layout
    rows = F.embedding(ids.reshape(-1), weight)
    out = rows.new_zeros((*mask.shape, weight.shape[1]))
    return out.index_put((mask,), rows), mask


class _CachedSubset(nn.Module):
    """Some features of a :class:`CachedEmbeddings`, looked up through it."""

    def __init__(self, base: CachedEmbeddings, feature_to_table: dict[str, str]) -> None:
        super().__init__()
        # not a submodule: the owner registers ``base`` once, so its state (and
        # train/eval mode) is not duplicated per view
        object.__setattr__(self, "base", base)
        self.feature_to_table = feature_to_table

    @property
    def feature_names(self) -> list[str]:
        return list(self.feature_to_table)

    @property
    def output_dims(self) -> dict[str, int]:
        dims = self.base.output_dims
        return {f: dims[f] for f in self.feature_to_table}

    def forward(self, features: Features) -> dict[str, Any]:
        return self.base._embed(features, self.feature_to_table)

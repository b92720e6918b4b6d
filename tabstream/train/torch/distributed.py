"""Model-parallel embedding tables and hybrid-parallel training under torch.distributed.

Embedding tables are split over the ranks (whole tables, row ranges or column
slices) while the dense part of the model runs data-parallel under DDP. The plan
is computed alike on every rank, from the model or its table configs:

    >>> from tabstream.train.tables import TableConfig
    >>> configs = [TableConfig("C1", 1_000_000, 16, ("C1",)),
    ...            TableConfig("C2", 50_000, 16, ("C2",)), TableConfig("C3", 100, 16, ("C3",))]
    >>> plan = plan_sharding(configs, world_size=2)    # or plan_sharding(DLRM(schema), 2)
    >>> print(plan)
    ShardingPlan for 2 ranks (bytes = weights + 2 optimizer slots, float32)
      C1    1,000,000 x 16   column_wise   columns 0:8, 8:16
      C2       50,000 x 16   table_wise    on rank 0
      C3          100 x 16   data_parallel replicated
      rank 0: 105,600,000 bytes   rank 1: 96,000,000 bytes   (+19,200 replicated on each)

Then, in each process that ``torchrun`` starts (it sets RANK and WORLD_SIZE)::

    dist.init_process_group("gloo")
    torch.manual_seed(0)                          # the same model on every rank
    model = HybridParallel(DLRM(schema), plan=plan)   # or plan={"C1": "row_wise"}
    loss = F.binary_cross_entropy_with_logits(model(features), labels)
    (loss * model.loss_scale).backward()         # exact global-mean gradient
    model.full_state_dict()                       # collective: the unwrapped state

How a step flows, for the sharded tables (``W`` ranks, rank ``r`` holding a
batch of ``B_r`` rows); every exchange is one ``all_to_all_single`` on a process
group of the embedding's own (:mod:`tabstream.train.torch.exchange`):

1. every rank turns its ids into ``(values, offsets)`` and routes them: all of a
   feature's ids to the owner of a ``table_wise`` table and to every owner of a
   ``column_wise`` slice; for ``row_wise``, each id to the owner of its row range
   only (with the rows they came from kept aside);
2. ``sizes``: each rank tells each other rank its batch size and how many ids and
   list lengths it is about to send (lengths are left out where every bag holds one
   id);
3. ``ids``: the ids travel to their owners only;
4. each owner pools, per requesting rank, what it received: the whole table, its
   column slice, or partial sums over its row range (only for the rows that had ids
   there);
5. ``vectors``: one differentiable all-to-all sends the pooled pieces back; the
   requesting rank concatenates the column slices and adds the row-wise partial sums
   into their rows (dividing by the list lengths for ``combiner="mean"``). Backward
   runs the reverse all-to-all, so each shard receives exactly the gradient of its
   rows.

Per-id lookups (a list feature of a ``combiner=None`` table) take the same path
with every id a bag of its own (no lengths travel); the requesting rank lays the
returned vectors out as ``(vectors (B, L, dim), mask (B, L))``, what
:class:`EmbeddingTables` returns, under every sharding type.

``HybridParallel.comm_stats()`` reports the bytes each exchange moved.

``data_parallel`` tables stay inside the DDP-wrapped module like any dense weight.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tabstream.core.errors import DataError
from tabstream.train.sharding import (
    SHARDING_TYPES,
    ShardingPlan,
    TablePlacement,
    plan_sharding,
    resolve_plan,
)
from tabstream.train.tables import TableConfig
from tabstream.train.torch.embeddings import EmbeddingTables, parse_feature, to_ragged
from tabstream.train.torch.exchange import AllToAll, CommStats, all_to_all

__all__ = ["HybridParallel", "SHARDING_TYPES", "ShardedEmbeddingTables", "ShardingPlan",
           "StatePiece", "TablePlacement", "comm_device", "plan_sharding", "reshard"]


# ----------------------------------------------------------------- autograd pieces


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the gradient is multiplied by ``scale`` on the way back."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, scale: float) -> torch.Tensor:
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.scale, None


def comm_device(group: Any = None) -> torch.device:
    """Where tensors handed to a collective of ``group`` must live: the current CUDA
    device under NCCL, the CPU otherwise (gloo)."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# ------------------------------------------------------------------ sharded tables


class ShardedEmbeddingTables(nn.Module):
    """Stands in for an :class:`EmbeddingTables` inside a model wrapped by
    :class:`HybridParallel`: same ``forward(features) -> {feature: (B, dim)}``, in
    the same feature order, but the sharded tables keep only this rank's shard.
    A list feature of a ``combiner=None`` table comes out per id, as from
    :class:`EmbeddingTables`: ``(vectors (B, L, dim), mask (B, L))``; each of its ids
    is exchanged as a bag of one.

    ``self.replicated`` is an :class:`EmbeddingTables` of the ``data_parallel``
    tables (trained by DDP); ``self.shards[name]`` is this rank's
    ``nn.EmbeddingBag`` piece of a sharded table (absent when it holds none).
    """

    def __init__(self, tables: EmbeddingTables, plan: ShardingPlan, rank: int,
                 group: Any) -> None:
        super().__init__()
        self.configs = tables.configs
        self.feature_to_table = dict(tables.feature_to_table)
        self._config_by_name = {c.name: c for c in self.configs}
        self._table_keys = {c.name: tables._keys[c.name] for c in self.configs}
        self.plan = plan
        self.rank = rank
        self.world_size = plan.world_size
        self.group = group
        replicated = [c for c in self.configs if plan[c.name] == "data_parallel"]
        self.replicated = EmbeddingTables(replicated)
        for cfg in replicated:  # copy the model's weights and sparse flag
            src, dst = tables[cfg.name], self.replicated[cfg.name]
            dst.sparse = src.sparse
            with torch.no_grad():
                dst.weight.copy_(src.weight)
        self.shards = nn.ModuleDict()
        self.sharded_tables = [c.name for c in self.configs if plan[c.name] != "data_parallel"]
        for name in self.sharded_tables:
            src = tables[name]
            for k, a, b in plan.placements[name].pieces():
                if k != rank:
                    continue
                kind = plan[name]
                if kind == "table_wise":
                    weight = src.weight
                elif kind == "row_wise":
                    weight = src.weight[a:b]
                else:
                    weight = src.weight[:, a:b]
                bag = nn.EmbeddingBag(weight.shape[0], weight.shape[1], mode=src.mode,
                                      sparse=src.sparse)
                with torch.no_grad():
                    bag.weight.copy_(weight)
                self.shards[self._table_keys[name]] = bag
        self.sharded_features = [f for f, t in self.feature_to_table.items()
                                 if t in self.sharded_tables]
        # the pieces each rank holds, in the order every message lists them
        self._by_rank = [[t for t in self._all_pieces() if t[2][0] == k]
                         for k in range(self.world_size)]
        self.comm = CommStats()
        self.loss_scale_world = 1.0 / self.world_size
        self.batch_sizes: list[int] = []

    @property
    def table_names(self) -> list[str]:
        return [c.name for c in self.configs]

    @property
    def feature_names(self) -> list[str]:
        return list(self.feature_to_table)

    @property
    def output_dims(self) -> dict[str, int]:
        return {f: self._config_by_name[t].dim for f, t in self.feature_to_table.items()}

    def shard_weights(self) -> dict[str, torch.Tensor]:
        """``{table name: this rank's shard weight}``."""
        keys = {v: k for k, v in self._table_keys.items()}
        return {keys[k]: cast(nn.EmbeddingBag, bag).weight for k, bag in self.shards.items()}

    # -- the forward pass -----------------------------------------------------

    def forward(self, features: Mapping[str, Any]) -> dict[str, torch.Tensor]:
        local = self.replicated(features) if len(self.replicated.configs) else {}
        sharded = self._sharded_forward(features)
        return {f: (local[f] if f in local else sharded[f]) for f in self.feature_to_table}

    def _sharded_forward(self, features: Mapping[str, Any]) -> dict[str, Any]:
        self.comm.begin_step()
        ragged: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        rows: dict[str, int] = {}
        per_id: dict[str, tuple[tuple[int, ...], torch.Tensor]] = {}
        for f in self.sharded_features:
            cfg = self._config_by_name[self.feature_to_table[f]]
            if cfg.combiner is None:
                x = parse_feature(f, cfg, features)
                if isinstance(x, tuple):
                    # a list looked up per id: every id travels as a bag of its own and
                    # comes back as its own vector, laid out (B, L, dim) at the end
                    values, shape, mask = _per_id_layout(f, cfg, x)
                    ragged[f] = (values, torch.arange(values.numel() + 1,
                                                      device=values.device))
                    rows[f] = shape[0]
                    per_id[f] = (shape, mask)
                    continue
            ragged[f] = _to_ragged(f, cfg, features)
            rows[f] = int(ragged[f][1].numel()) - 1
        # bags per feature: the batch's rows, or its ids for a per-id list
        bags = {f: int(offsets.numel()) - 1 for f, (_, offsets) in ragged.items()}
        batch = _batch_rows(rows, features)
        device = _device(features, self.shards)
        w, rank = self.world_size, self.rank
        where = comm_device(self.group)
        # 1. route: what this rank sends each owner (ids, list lengths, requesting rows)
        routed = self._route(ragged, bags)
        # 2. sizes: to each rank d, [B, then (ids, lengths) per piece d owns]
        header = [[batch] + [n for f, _, p in self._by_rank[d]
                             for n in _counts(routed[f][p[0]])] for d in range(w)]
        mine_len = len(header[rank])
        got = all_to_all(torch.tensor([n for h in header for n in h], dtype=torch.long,
                                      device=where),
                         [mine_len] * w, [len(h) for h in header], self.group, rank,
                         self.comm, "sizes")
        sizes = got.view(w, mine_len).tolist()
        self.batch_sizes = [int(s[0]) for s in sizes]
        if not self.sharded_features:
            return {}
        # 3. ids: each id only to the ranks that own its table, rows or columns
        messages = [torch.cat([t for f, _, p in self._by_rank[d]
                               for t in _payload(routed[f][p[0]])]
                              or [torch.zeros(0, dtype=torch.long, device=device)])
                    for d in range(w)]
        ids = all_to_all(torch.cat(messages).to(where, torch.long), [sum(s[1:]) for s in sizes],
                         [m.numel() for m in messages], self.group, rank, self.comm, "ids")
        ids = ids.to(device)
        # 4. pool what this rank owns for every requesting rank's rows
        pieces: list[torch.Tensor] = []
        send_sizes = []
        for src, flat in enumerate(ids.split([sum(s[1:]) for s in sizes])):
            counts = sizes[src][1:]
            parts = flat.split(counts)
            total = 0
            for j, (_, name, piece) in enumerate(self._by_rank[rank]):
                values, lengths = parts[2 * j], parts[2 * j + 1]
                pooled = self._pool_piece(name, piece, values,
                                          lengths if lengths.numel() else None)
                pieces.append(pooled.reshape(-1))
                total += pooled.numel()
            send_sizes.append(total)
        # 5. vectors back to the rank whose rows they are (gradients the reverse way)
        recv_sizes = [sum(_bags(routed[f][p[0]], bags[f]) * self._piece_width(n, p)
                          for f, n, p in self._by_rank[d]) for d in range(w)]
        send = torch.cat(pieces) if pieces else torch.zeros(0, device=device)
        received = AllToAll.apply(send.to(where), recv_sizes, send_sizes, self.group, rank,
                                  self.comm).to(device)
        received = _ScaleGrad.apply(received, self.loss_scale_world)
        out: dict[str, Any] = self._assemble(received, routed, ragged, bags)
        for f, (shape, mask) in per_id.items():
            # one vector per id, in the order of the real positions of the mask
            vectors = out[f]
            out[f] = (vectors.new_zeros((*shape, vectors.shape[1])).index_put(
                (mask.to(vectors.device),), vectors), mask)
        return out

    def _route(self, ragged: Mapping[str, tuple[torch.Tensor, torch.Tensor]],
               bags: Mapping[str, int]) -> dict[str, dict[int, _Routed]]:
        """``{feature: {owner rank: what goes there}}`` for this rank's rows
        (``bags[feature]`` of them: the batch's rows, or its ids for a per-id list)."""
        out: dict[str, dict[int, _Routed]] = {}
        for f in self.sharded_features:
            batch = bags[f]
            name = self.feature_to_table[f]
            place = self.plan.placements[name]
            values, offsets = ragged[f]
            if int(offsets[0]) != 0 or int(offsets[-1]) != values.numel():
                values = values[int(offsets[0]):int(offsets[-1])]
            counts = torch.diff(offsets)
            single = values.numel() == batch and bool((counts == 1).all())
            pieces = place.pieces()
            if place.kind != "row_wise":
                # the whole table, or every column slice: all of this rank's ids
                entry = _Routed(values, None if single else counts, None)
                out[f] = {p[0]: entry for p in pieces}
                continue
            # row_wise: each id to the owner of its row range, in row order
            starts = torch.tensor([a for _, a, _ in pieces], dtype=values.dtype,
                                  device=values.device)
            owner = torch.searchsorted(starts, values, right=True) - 1
            order = torch.argsort(owner, stable=True)
            nnz = torch.bincount(owner, minlength=len(pieces)).tolist()
            parts = values[order].split(nnz)
            if single:  # row i holds value i: the rows of the sorted ids are `order`
                rows = order.split(nnz)
                lengths: list[torch.Tensor | None] = [None] * len(pieces)
            else:
                row = torch.repeat_interleave(torch.arange(batch, device=values.device), counts)
                per = torch.bincount(owner * batch + row,
                                     minlength=len(pieces) * batch).view(len(pieces), batch)
                rows, lengths = [], []
                for j in range(len(pieces)):
                    hit = per[j].nonzero().squeeze(1)
                    rows.append(hit)
                    n = per[j][hit]
                    lengths.append(None if bool((n == 1).all()) else n)
            out[f] = {p[0]: _Routed(parts[j], lengths[j], rows[j])
                      for j, p in enumerate(pieces)}
        return out

    def _all_pieces(self) -> list[tuple[str, str, tuple[int, int, int]]]:
        """``(feature, table, (rank, start, stop))`` of every sharded feature's pieces."""
        out = []
        for f in self.sharded_features:
            name = self.feature_to_table[f]
            for piece in self.plan.placements[name].pieces():
                out.append((f, name, piece))
        return out

    def _piece_width(self, name: str, piece: tuple[int, int, int]) -> int:
        cfg = self._config_by_name[name]
        if self.plan[name] == "column_wise":
            return piece[2] - piece[1]
        return cfg.dim

    def _pool_piece(self, name: str, piece: tuple[int, int, int], values: torch.Tensor,
                    lengths: torch.Tensor | None) -> torch.Tensor:
        """One requesting rank's bags of this rank's shard of ``name``: one id per bag
        when ``lengths`` is None, else ``lengths[i]`` ids in bag ``i``."""
        bag = cast(nn.EmbeddingBag, self.shards[self._table_keys[name]])
        kind = self.plan[name]
        if kind == "row_wise":
            values = values - piece[1]
        if lengths is None:
            # single ids: a plain gather is ~4x faster than bags of one (as in EmbeddingTables)
            return F.embedding(values, bag.weight, sparse=bag.sparse)
        offsets = F.pad(lengths.cumsum(0), (1, 0))
        # row-wise: partial sums; the requesting rank divides for "mean"
        mode: str = "sum" if kind == "row_wise" else bag.mode
        return F.embedding_bag(values, bag.weight, offsets, mode=mode, sparse=bag.sparse,
                               include_last_offset=True)

    def _assemble(self, received: torch.Tensor, routed: dict[str, dict[int, _Routed]],
                  ragged: dict[str, tuple[torch.Tensor, torch.Tensor]],
                  bags: Mapping[str, int]) -> dict[str, torch.Tensor]:
        # received = for each owner d: for each piece d holds: (bags, width) row-major
        order = [(f, d, self._piece_width(name, p), _bags(routed[f][d], bags[f]))
                 for d in range(self.world_size) for f, name, p in self._by_rank[d]]
        # one split (its backward is one cat), not a slice per piece (each slice's
        # backward would fill a zero tensor the size of the whole message)
        parts_flat = received.split([n * width for _, _, width, n in order])
        chunks = {(f, d): part.view(n, width)
                  for (f, d, width, n), part in zip(order, parts_flat)}
        out = {}
        for f in self.sharded_features:
            name = self.feature_to_table[f]
            kind, cfg = self.plan[name], self._config_by_name[name]
            owners = [p[0] for p in self.plan.placements[name].pieces()]
            if kind == "table_wise":
                out[f] = chunks[(f, owners[0])]
            elif kind == "column_wise":
                out[f] = torch.cat([chunks[(f, d)] for d in owners], dim=1)
            else:
                # each owner sent the partial sums of the rows that had ids in its range
                rows = torch.cat([cast(torch.Tensor, routed[f][d].rows) for d in owners])
                vectors = torch.cat([chunks[(f, d)] for d in owners])
                total = vectors.new_zeros(bags[f], cfg.dim).index_add(
                    0, rows.to(vectors.device), vectors)
                if cfg.combiner == "mean":
                    counts = torch.diff(ragged[f][1]).clamp(min=1).to(total.dtype)
                    total = total / counts[:, None].to(total.device)
                out[f] = total
        return out


class _Routed(NamedTuple):
    """What one rank sends one owner for one feature: the ids, the list lengths
    (None: one id per bag) and, for a row-wise table, the requesting rows the bags
    belong to (None: every row of the batch, in order)."""

    values: torch.Tensor
    lengths: torch.Tensor | None
    rows: torch.Tensor | None


def _counts(r: _Routed) -> tuple[int, int]:
    return int(r.values.numel()), 0 if r.lengths is None else int(r.lengths.numel())


def _payload(r: _Routed) -> list[torch.Tensor]:
    return [r.values] if r.lengths is None else [r.values, r.lengths]


def _bags(r: _Routed, batch: int) -> int:
    """How many pooled vectors the owner sends back for ``r``."""
    return batch if r.rows is None else int(r.rows.numel())


def _device(features: Mapping[str, Any], shards: nn.ModuleDict) -> torch.device:
    for bag in shards.values():
        return cast(nn.EmbeddingBag, bag).weight.device
    for value in features.values():
        if isinstance(value, torch.Tensor):
            return value.device
    return torch.device("cpu")


def _to_ragged(feature: str, cfg: TableConfig,
               features: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Any accepted layout of a categorical feature as ``(values, offsets)`` int64,
    with every id checked against the table size (a row-wise shard would otherwise
    drop an id that no rank owns)."""
    values, offsets = to_ragged(feature, cfg, features)
    _check_range(feature, cfg, values)
    return values, offsets


def _check_range(feature: str, cfg: TableConfig, values: torch.Tensor) -> None:
    if values.numel():
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= cfg.cardinality:
            bad = low if low < 0 else high
            raise DataError(
                f"categorical feature {feature!r}: id {bad} is outside table {cfg.name!r} "
                f"(expected 0 <= id < {cfg.cardinality}); was the data encoded with another "
                "workflow than the schema the model was built from?"
            )


def _per_id_layout(feature: str, cfg: TableConfig, x: tuple[torch.Tensor, torch.Tensor]
                   ) -> tuple[torch.Tensor, tuple[int, ...], torch.Tensor]:
    """A list feature of a ``combiner=None`` table as ``(ids, shape, mask)``: its real
    ids in row-major order, and the ``(B, L)`` (or ``(B, F, L)``) layout with the mask
    of the real positions that :class:`EmbeddingTables` returns for it (``L`` the
    longest list of the batch for ragged input, the padded length otherwise)::

        (values [5, 6, 9], offsets [0, 2, 3])  ->  ids [5, 6, 9], (2, 2), [[1, 1], [1, 0]]
    """
    first, second = x
    if first.dim() == 1:  # ragged (values, offsets)
        offsets = second.to(torch.long)
        values = first[int(offsets[0]):int(offsets[-1])].to(torch.long)
        lengths = offsets[1:] - offsets[:-1]
        width = int(lengths.max()) if lengths.numel() else 0
        mask = torch.arange(width, device=offsets.device) < lengths[:, None]
    else:  # padded (ids, mask): the real positions only
        mask = second.to(torch.bool)
        values = first[mask].to(torch.long)
    _check_range(feature, cfg, values)
    return values, tuple(mask.shape), mask


def _batch_rows(rows: Mapping[str, int], features: Mapping[str, Any]) -> int:
    for n in rows.values():
        return n
    for value in features.values():
        if isinstance(value, torch.Tensor):
            return int(value.shape[0])
    return 0


# ------------------------------------------------------------------ the wrapper


class HybridParallel(nn.Module):
    ddp: DistributedDataParallel
    """Shards ``model``'s embedding tables over the ranks and wraps the rest in DDP.

    Build it on every rank from the same seed (the shards are cut from the
    model's own initial weights; DDP broadcasts rank 0's dense weights). Trained
    with the global-mean loss, it follows exactly the path of one process
    training ``model`` on the concatenation of all ranks' batches (rank 0's rows
    first). Each rank's local mean loss times :attr:`loss_scale` is that global
    mean's share: ``(loss * model.loss_scale).backward()``;
    :func:`~tabstream.train.torch.fit` does this itself. When every rank's batch
    has the same size, ``loss_scale`` is 1.

    Args:
        model: a module holding :class:`EmbeddingTables` (``DLRM``, ``DCN``, ...).
        plan: a :class:`ShardingPlan`, a strategy name (``"auto"``, ``"table_wise"``,
            ``"row_wise"``, ``"column_wise"``, ``"data_parallel"``) or ``{table: type}``
            overriding :func:`plan_sharding`'s ``"auto"`` choice for those tables;
            ``None`` is ``"auto"``.
        group: the process group (default: the world).
        **ddp_kwargs: passed on to ``DistributedDataParallel``.

    Any optimizer works on ``model.parameters()``: shards are ordinary
    ``nn.EmbeddingBag`` weights (sparse gradients when the table was sparse), so
    :class:`LazyAdam` and :class:`MultiOptimizer` (``split_embeddings_on_size``
    finds the shards) apply as on one process.
    """

    def __init__(self, model: nn.Module, plan: ShardingPlan | Mapping[str, str] | str | None = None,
                 group: Any = None, **ddp_kwargs: Any) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"HybridParallel wraps an nn.Module, got {type(model).__name__}")
        from tabstream.train.torch.cache import refuse_cached_under_ranks

        refuse_cached_under_ranks(model, "HybridParallel")
        if not dist.is_available() or not dist.is_initialized():
            raise ValueError(
                "HybridParallel needs torch.distributed: call "
                "torch.distributed.init_process_group('gloo' or 'nccl') first (torchrun "
                "sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
            )
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        plan = resolve_plan(plan, model, self.world_size)
        self.plan = plan
        self._original_keys = list(model.state_dict())
        self._original_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        self._original_params = [n for n, _ in model.named_parameters()]
        # a group of its own, so that the embedding exchange never interleaves with
        # DDP's gradient all-reduces on one communicator
        ranks = dist.get_process_group_ranks(group) if group is not None else None
        self._exchange_group = dist.new_group(ranks, backend=dist.get_backend(group))
        self._sharded: dict[str, ShardedEmbeddingTables] = {}
        for prefix, tables in [(n, m) for n, m in model.named_modules()
                               if isinstance(m, EmbeddingTables)]:
            sharded = ShardedEmbeddingTables(tables, plan, self.rank, self._exchange_group)
            _set_submodule(model, prefix, sharded)
            self._sharded[prefix] = sharded
        unknown = set(plan) - {c.name for s in self._sharded.values() for c in s.configs}
        if unknown:
            raise ValueError(f"HybridParallel: the plan names tables {sorted(unknown)} that "
                             "the model does not have")
        ignored = [f"model.{p}.shards.{k}.weight" for p, s in self._sharded.items()
                   for k in s.shards]
        entry = _Entry(model)
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(entry, ignored)
        self.module = model
        # kept out of the module tree: the state_dict and parameters are the model's
        # own (keys "module.…"), not listed twice
        object.__setattr__(self, "ddp", DistributedDataParallel(
            entry, process_group=group, **ddp_kwargs))
        if callable(getattr(model, "compute_loss", None)):
            # fit trains a model's own objective (TwoTower's in-batch softmax); it must
            # run through DDP's forward too, or the dense gradients are not averaged
            object.__setattr__(self, "compute_loss", self._compute_loss)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, **kwargs)

    def _compute_loss(self, features: Mapping[str, Any], labels: Any = None) -> torch.Tensor:
        """The wrapped model's ``compute_loss``, run through DDP."""
        return self.ddp(features, labels, _loss=True)

    def train(self, mode: bool = True) -> HybridParallel:
        super().train(mode)
        self.ddp.train(mode)
        return self

    @property
    def batch_sizes(self) -> list[int]:
        """Every rank's batch size in the last forward pass."""
        for s in self._sharded.values():
            return s.batch_sizes
        return []

    def comm_stats(self) -> dict[str, Any]:
        """Bytes this rank's embedding exchange sent to and received from the other
        ranks (its messages to itself are not counted): ``{"steps": n, "last": {...},
        "total": {...}}``, ``"last"`` the last step (forward and, once it ran, its
        backward), ``"total"`` every step so far. Each holds ``<kind>_sent`` and
        ``<kind>_received`` for the kinds ``sizes`` (the split sizes and batch size,
        int64), ``ids`` (ids and list lengths, int64, each id only to the ranks owning
        its table, rows or columns), ``vectors`` (pooled float32 vectors back to the
        rows' rank) and ``gradients`` (their gradients, backward), and the sums
        ``sent`` / ``received``. DDP's all-reduce of the dense and replicated
        weights' gradients is not included::

            stats = model.comm_stats()
            stats["last"]["ids_sent"], stats["total"]["sent"] / stats["steps"]
        """
        stats = [s.comm.as_dict() for s in self._sharded.values()]
        if not stats:
            return CommStats().as_dict()
        out = {"steps": max(s["steps"] for s in stats), "last": {}, "total": {}}
        for when in ("last", "total"):
            for key in stats[0][when]:
                out[when][key] = sum(s[when][key] for s in stats)
        return out

    @property
    def loss_scale(self) -> float:
        """``B_rank * W / B_global`` of the last forward pass: the local mean loss
        times this, averaged over ranks (as DDP averages gradients), is the mean
        over the global batch."""
        sizes = self.batch_sizes
        total = sum(sizes)
        return sizes[self.rank] * self.world_size / total if total else 0.0

    def global_mean(self, local_mean: float | torch.Tensor) -> float:
        """Collective: the mean over all ranks' rows of the last batch, from this
        rank's mean over its own rows."""
        sizes = self.batch_sizes
        value = torch.tensor([float(local_mean) * sizes[self.rank]], dtype=torch.float64,
                             device=comm_device())
        dist.all_reduce(value)
        total = sum(sizes)
        return float(value) / total if total else float("nan")

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Collective (every rank calls it): the wrapped model's ``state_dict`` as
        if it had never been sharded, with every table whole, on every rank."""
        state = self.module.state_dict()
        for prefix, sharded in self._sharded.items():
            p = f"{prefix}." if prefix else ""
            for key in [k for k in state if k.startswith(p + "replicated.")
                        or k.startswith(p + "shards.")]:
                del state[key]
            for cfg in sharded.configs:
                key = f"{p}{sharded._table_keys[cfg.name]}.weight"
                if self.plan[cfg.name] == "data_parallel":
                    state[key] = sharded.replicated[cfg.name].weight.detach().clone()
                else:
                    state[key] = self._gather_table(sharded, cfg)
        return {k: state[k] for k in self._original_keys}

    def _gather_table(self, sharded: ShardedEmbeddingTables, cfg: TableConfig) -> torch.Tensor:
        place = self.plan.placements[cfg.name]
        mine = sharded.shard_weights().get(cfg.name)
        parts = []
        for k, a, b in place.pieces():
            if place.kind == "table_wise":
                shape: tuple[int, int] = (cfg.cardinality, cfg.dim)
            elif place.kind == "row_wise":
                shape = (b - a, cfg.dim)
            else:
                shape = (cfg.cardinality, b - a)
            buf = (mine.detach().clone() if k == self.rank and mine is not None
                   else torch.empty(shape, dtype=torch.float32,
                                    device=comm_device(self._exchange_group)))
            dist.broadcast(buf, src=k, group=self._exchange_group)
            parts.append(buf)
        if place.kind == "column_wise":
            return torch.cat(parts, dim=1)
        return torch.cat(parts, dim=0)

    def state_pieces(self) -> dict[str, StatePiece]:
        """Where each entry of ``self.module.state_dict()`` lies in the unwrapped
        model's ``state_dict`` (the whole-table coordinates that resharding uses)::

            {"inputs.embeddings.shards.C1.weight":      # rank 1, C1 rows 25:50 of 50
                 StatePiece("inputs.embeddings.C1.weight", offsets=(25, 0), size=(50, 6)),
             "bottom.0.weight": StatePiece("bottom.0.weight", (0, 0), (8, 2)), ...}
        """
        tables: dict[int, StatePiece] = {}
        for prefix, sharded in self._sharded.items():
            p = f"{prefix}." if prefix else ""
            weights = sharded.shard_weights()
            for cfg in sharded.configs:
                key = f"{p}{sharded._table_keys[cfg.name]}.weight"
                size = (cfg.cardinality, cfg.dim)
                place = self.plan.placements[cfg.name]
                if place.kind == "data_parallel":
                    tables[id(sharded.replicated[cfg.name].weight)] = StatePiece(key, (0, 0), size)
                    continue
                if cfg.name not in weights:
                    continue
                start = {k: a for k, a, _ in place.pieces()}[self.rank]
                offsets = {"table_wise": (0, 0), "row_wise": (start, 0),
                           "column_wise": (0, start)}[place.kind]
                tables[id(weights[cfg.name])] = StatePiece(key, offsets, size)
        out = {}
        for k, v in self.module.state_dict(keep_vars=True).items():
            out[k] = tables.get(id(v)) or StatePiece(k, (0,) * v.dim(), tuple(v.shape))
        return out

    def layout(self) -> dict[str, Any]:
        """Plain values (JSON) that describe the unwrapped model and this plan: what a
        checkpoint needs to be resharded without the model at hand::

            {"world_size": 2, "model_class": "DLRM",
             "tables": {"C1": {"key": "inputs.embeddings.C1.weight", "cardinality": 50,
                               "dim": 6, "kind": "row_wise", "owner": None,
                               "ranges": [[0, 25], [25, 50]]}, ...},
             "shapes": {"inputs.embeddings.C1.weight": [50, 6], ...},   # state_dict order
             "params": ["inputs.embeddings.C1.weight", ...]}            # parameters order
        """
        tables = {}
        for prefix, sharded in self._sharded.items():
            p = f"{prefix}." if prefix else ""
            for cfg in sharded.configs:
                place = self.plan.placements[cfg.name]
                tables[cfg.name] = {
                    "key": f"{p}{sharded._table_keys[cfg.name]}.weight",
                    "cardinality": cfg.cardinality, "dim": cfg.dim, "kind": place.kind,
                    "owner": place.owner, "ranges": [list(r) for r in place.ranges],
                }
        return {"world_size": self.world_size, "model_class": type(self.module).__qualname__,
                "tables": tables,
                "shapes": {k: list(v) for k, v in self._original_shapes.items()},
                "params": list(self._original_params)}

    def extra_repr(self) -> str:
        return f"rank={self.rank}, world_size={self.world_size}"


@dataclass(frozen=True)
class StatePiece:
    """The region ``offsets`` (of the local tensor's shape) of the unwrapped model's
    ``state_dict()[key]``, whose shape is ``size``."""

    key: str
    offsets: tuple[int, ...]
    size: tuple[int, ...]


def reshard(src: str | os.PathLike[str], dst: str | os.PathLike[str], world_size: int,
            plan: ShardingPlan | Mapping[str, str] | str | None = None) -> Path:
    """Convert the sharded checkpoint in ``src`` (written by ``fit`` with a
    :class:`HybridParallel` model) for ``world_size`` ranks into ``dst``; see
    :func:`tabstream.train.torch.reshard.reshard`."""
    from tabstream.train.torch.reshard import reshard as _reshard

    return _reshard(src, dst, world_size, plan)


class _Entry(nn.Module):
    """What DDP wraps: the model's forward, or its ``compute_loss`` when asked."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: Any, _loss: bool = False, **kwargs: Any) -> Any:
        if _loss:
            return cast(Any, self.model).compute_loss(*args, **kwargs)
        return self.model(*args, **kwargs)


def _set_submodule(model: nn.Module, path: str, module: nn.Module) -> None:
    if not path:
        raise ValueError("HybridParallel wraps a model that holds EmbeddingTables, not an "
                         "EmbeddingTables itself")
    parent_name, _, child = path.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, child, module)

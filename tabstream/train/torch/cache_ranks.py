"""The row exchange of :class:`~tabstream.train.torch.CachedEmbeddings` under
torch.distributed: each rank's parameter server holds the rows it owns, and ids,
rows and gradients travel to and from their owners by ``all_to_all``.

Ownership is ``owner(id) = id % W`` (``W`` ranks of the exchange group). Per
batch and table::

    rank r: the batch's distinct ids --ids, grouped by owner--> owners
    owner:  rows through its cache (hits, misses, eviction) and its server
    owner   --rows-->  rank r: a (distinct ids, dim) tensor, as in one process
    backward: rank r --gradient of each id--> owner; the owner sums the ranks'
            contributions, divides by W (DDP's averaging) and applies them in one
            ps.apply per table and step, with no ids of its own too

So each rank's server makes exactly one update per table and step, as one
process's server does: every server's ``version`` and ``table_steps`` (Adam's
bias correction) stay equal to the single-process run's, and equal across ranks.
That lockstep is checked on every exchange (each rank sends its server version
along with its id counts), so servers of different runs or commits are refused
instead of training silently on mixed rows.

Every exchange is a collective: all ranks call the module on the same features
in the same order (tables in the module's order), a rank without ids for a table
included (it sends and receives empty lists). The exchange runs on a gloo group
of its own: rows live on the CPU, and the exchange never interleaves with DDP's
gradient all-reduces on the default group.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tabstream.core.errors import DataError
from tabstream.train.cache_store import ParameterServer

__all__ = ["RankExchange"]

Serve = Callable[[str, np.ndarray], np.ndarray]
Apply = Callable[[str, np.ndarray, np.ndarray], None]


class RankExchange:
    """The ranks of one ``CachedEmbeddings``: ``rank`` of ``world`` in ``group``."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    @classmethod
    def create(cls, process_group: Any) -> RankExchange | None:
        """The exchange for ``process_group`` (default: every rank of an initialized
        torch.distributed, through a new gloo group); ``None`` for one process."""
        if process_group is None:
            if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
                return None
            # collective: every rank builds its module, as it builds the model
            return cls(dist.new_group(backend="gloo"))
        backend = dist.get_backend(process_group)
        if backend != "gloo":
            raise ValueError(
                f"CachedEmbeddings: process_group must be a gloo group (rows travel on the "
                f"CPU), got a {backend!r} group; create one with "
                "torch.distributed.new_group(backend='gloo')"
            )
        if dist.get_world_size(process_group) < 2:
            return None
        return cls(process_group)

    def owned(self, ids: np.ndarray) -> np.ndarray:
        """The mask of ``ids`` this rank owns."""
        return ids % self.world == self.rank

    # -- agreement at construction ---------------------------

    def check_servers(self, ps: ParameterServer, tables: list[str]) -> None:
        """Refuse (on every rank alike) servers that would not train as one: other
        settings or tables, one folder for two ranks, other versions."""
        mine = {
            "host": socket.gethostname(), "path": str(ps.path.resolve()),
            "version": ps.version, "tables": tables,
            "settings": {"seed": ps.seed, "optimizer": ps.optimizer, "lr": ps.lr,
                         "betas": list(ps.betas), "eps": ps.eps, "init_scale": ps.init_scale,
                         "configs": [[c.name, c.cardinality, c.dim, list(c.feature_names),
                                      c.is_list, c.combiner] for c in ps.configs]},
        }
        everyone = self._gather_json(mine)
        first = everyone[0]
        for r, other in enumerate(everyone[1:], start=1):
            for key, what in (("tables", "serves tables"), ("settings", "has server settings")):
                if other[key] != first[key]:
                    raise DataError(
                        f"CachedEmbeddings under {self.world} ranks: rank {r} {what} "
                        f"{other[key]}, rank 0 {first[key]}; every rank's module serves the "
                        "same tables from a server created with the same tables and settings "
                        "(seed included: it fixes the initial rows)"
                    )
        places = [(e["host"], e["path"]) for e in everyone]
        for r, place in enumerate(places):
            if places.index(place) != r:
                raise DataError(
                    f"CachedEmbeddings under {self.world} ranks: ranks {places.index(place)} and "
                    f"{r} use one parameter server folder {place[1]}; each rank opens its own "
                    "(e.g. ps/rank0, ps/rank1) and holds the rows it owns (id % world size)"
                )
        self.check_versions([e["version"] for e in everyone], f"this rank's is {ps.path}")

    def check_versions(self, versions: list[int], where: str) -> None:
        if len(set(versions)) > 1:
            raise DataError(
                f"CachedEmbeddings under {self.world} ranks: the ranks' parameter servers are "
                f"at versions {versions} (rank order; {where}); they must be at one version, "
                "as servers of one run are",
                hint="reopen each rank's own folder of the same run (ParameterServer.open rolls "
                "it back to its last commit) and load the checkpoint written with them",
            )

    def _gather_json(self, payload: Any) -> list[Any]:
        data = torch.frombuffer(bytearray(json.dumps(payload).encode()), dtype=torch.uint8)
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64), group=self.group)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.uint8)
        padded[: len(data)] = data
        parts = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(parts, padded, group=self.group)
        return [json.loads(bytes(p[: int(s)].tolist()).decode()) for p, s in zip(parts, sizes)]

    # -- the exchange -------------------------------------------------------------

    def rows(self, table: str, table_index: int, uniq: np.ndarray, dim: int, version: int,
             serve: Serve, apply: Apply, train: bool) -> torch.Tensor:
        """The rows of ``uniq`` (sorted distinct ids) as a ``(len(uniq), dim)`` tensor
        served by their owners; with ``train``, its gradient goes back to them."""
        route = _Route(self, table, table_index, uniq, version)
        owned_rows = serve(table, route.requested)
        got = route.to_requesters(owned_rows, dim)
        if not train:
            return got
        anchor = torch.zeros(0, requires_grad=True)  # makes backward reach _Exchange
        return _Exchange.apply(anchor, got, route, apply)


class _Route:
    """Where one table's ids of one batch went, and who asked for the rows this
    rank owns; the same route carries the gradients back."""

    def __init__(self, ex: RankExchange, table: str, table_index: int, uniq: np.ndarray,
                 version: int) -> None:
        self.ex, self.table = ex, table
        world, group = ex.world, ex.group
        owner = uniq % world
        self.order = np.argsort(owner, kind="stable")
        self.n = len(uniq)
        send = np.bincount(owner, minlength=world).astype(np.int64)
        meta = np.stack([send, np.full(world, version), np.full(world, table_index)], axis=1)
        got = torch.empty((world, 3), dtype=torch.int64)
        dist.all_to_all_single(got, torch.from_numpy(np.ascontiguousarray(meta)), group=group)
        got_np = got.numpy()
        if len(set(got_np[:, 2].tolist())) > 1:  # every rank sees every rank's row: all raise
            raise ValueError(
                f"CachedEmbeddings under {world} ranks: the ranks looked up tables "
                f"{got_np[:, 2].tolist()} (indices, rank order) in one exchange; every rank "
                "calls the module on the same features in the same order"
            )
        ex.check_versions(got_np[:, 1].tolist(), f"looking up table {table!r}")
        self.send_counts, self.recv_counts = send.tolist(), got_np[:, 0].tolist()
        ids = torch.empty(sum(self.recv_counts), dtype=torch.int64)
        dist.all_to_all_single(ids, torch.from_numpy(np.ascontiguousarray(uniq[self.order])),
                               self.recv_counts, self.send_counts, group=group)
        asked = ids.numpy()
        self.requested, self.inverse = np.unique(asked, return_inverse=True)
        self.inverse = self.inverse.reshape(-1)

    def to_requesters(self, owned_rows: np.ndarray, dim: int) -> torch.Tensor:
        """Send the owned rows to the ranks that asked; receive this rank's rows."""
        send = torch.from_numpy(np.ascontiguousarray(owned_rows[self.inverse]).reshape(-1, dim))
        got = torch.empty((self.n, dim), dtype=torch.float32)
        dist.all_to_all_single(got, send, self.send_counts, self.recv_counts, group=self.ex.group)
        rows = torch.empty_like(got)
        rows[torch.from_numpy(self.order)] = got
        return rows

    def to_owners(self, grad: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        """Send each id's gradient to its owner; return the owned ids asked for in
        this batch and their gradients summed over the ranks, divided by W."""
        dim = grad.shape[-1]
        send = grad.detach().to("cpu", torch.float32).reshape(self.n, dim)[torch.from_numpy(self.order)]
        got = torch.empty((sum(self.recv_counts), dim), dtype=torch.float32)
        dist.all_to_all_single(got, send.contiguous(), self.recv_counts, self.send_counts,
                               group=self.ex.group)
        summed = np.zeros((len(self.requested), dim), np.float32)
        np.add.at(summed, self.inverse, got.numpy())
        return self.requested, summed / np.float32(self.ex.world)


class _Exchange(torch.autograd.Function):
    """Identity on the received rows; its backward sends their gradient to the
    owners, which apply it. Backward runs on every rank whose loss used the rows,
    which is every rank (the model is the same), empty rows included."""

    @staticmethod
    def forward(ctx: Any, anchor: torch.Tensor, rows: torch.Tensor, route: _Route,
                apply: Apply) -> torch.Tensor:
        ctx.route, ctx.update = route, apply
        return rows.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, None, None, None]:
        route: _Route = ctx.route
        ids, grads = route.to_owners(grad)
        ctx.update(route.table, ids, grads)  # one update per table and step, ids or not
        return None, None, None, None

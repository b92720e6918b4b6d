"""The all-to-all exchanges of :class:`~tabstream.train.torch.distributed.HybridParallel`
and the count of the bytes they move.

Each step of a sharded lookup makes three exchanges on the embedding group, every
one an ``all_to_all_single`` with uneven splits:

``sizes``      how many ids (and list lengths) each rank is about to send to each
               other rank, plus its batch size: a few int64 per rank pair;
``ids``        every id goes to the ranks that own its table, rows or columns only;
``vectors``    the pooled vectors go back to the rank whose rows they belong to
               (differentiable: :class:`AllToAll`);
``gradients``  in backward, the reverse of ``vectors``.

:class:`CommStats` counts the bytes each of them sends to and receives from the
*other* ranks (a rank's message to itself is a local copy, not traffic), for the
last step and in total. ``HybridParallel.comm_stats()`` reads them.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["AllToAll", "CommStats", "KINDS", "all_to_all"]

#: the exchanges of one step, in the order they run
KINDS = ("sizes", "ids", "vectors", "gradients")


class CommStats:
    """Bytes sent to and received from the other ranks, per exchange kind, in the
    last step (since the last :meth:`begin_step`) and since construction."""

    def __init__(self) -> None:
        self.steps = 0
        self.last = _zeros()
        self.total = _zeros()

    def begin_step(self) -> None:
        self.steps += 1
        self.last = _zeros()

    def add(self, kind: str, sent: int, received: int) -> None:
        for counts in (self.last, self.total):
            counts[f"{kind}_sent"] += int(sent)
            counts[f"{kind}_received"] += int(received)

    def as_dict(self) -> dict[str, Any]:
        """``{"steps": n, "last": {...}, "total": {...}}``; each count dict has
        ``<kind>_sent`` / ``<kind>_received`` for every kind of :data:`KINDS` and
        their sums ``sent`` / ``received``."""
        return {"steps": self.steps, "last": _with_sums(self.last),
                "total": _with_sums(self.total)}


def _zeros() -> dict[str, int]:
    return {f"{k}_{d}": 0 for k in KINDS for d in ("sent", "received")}


def _with_sums(counts: dict[str, int]) -> dict[str, int]:
    out = dict(counts)
    out["sent"] = sum(counts[f"{k}_sent"] for k in KINDS)
    out["received"] = sum(counts[f"{k}_received"] for k in KINDS)
    return out


def off_rank(sizes: list[int], rank: int, element_size: int) -> int:
    """Bytes of the splits ``sizes`` (elements) that go to or come from other ranks."""
    return (sum(sizes) - sizes[rank]) * element_size


def all_to_all(x: torch.Tensor, out_sizes: list[int], in_sizes: list[int], group: Any,
               rank: int, stats: CommStats | None = None,
               kind: str = "ids") -> torch.Tensor:
    """Plain (not differentiable) ``all_to_all_single`` of a flat tensor: ``in_sizes[k]``
    elements of ``x`` go to rank ``k``, ``out_sizes[k]`` come from it."""
    out = x.new_empty(sum(out_sizes))
    dist.all_to_all_single(out, x.contiguous(), out_sizes, in_sizes, group=group)
    if stats is not None:
        size = x.element_size()
        stats.add(kind, off_rank(in_sizes, rank, size), off_rank(out_sizes, rank, size))
    return out


class AllToAll(torch.autograd.Function):
    """Differentiable ``all_to_all_single`` of a flat float tensor with uneven splits;
    backward sends the gradients the reverse way. Counts ``vectors`` bytes forward and
    ``gradients`` bytes backward in ``stats``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, out_sizes: list[int], in_sizes: list[int],
                group: Any, rank: int, stats: CommStats) -> torch.Tensor:
        ctx.sizes = (out_sizes, in_sizes)
        ctx.group, ctx.rank, ctx.stats = group, rank, stats
        return all_to_all(x, out_sizes, in_sizes, group, rank, stats, "vectors")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        out_sizes, in_sizes = ctx.sizes
        back = all_to_all(grad, in_sizes, out_sizes, ctx.group, ctx.rank, ctx.stats,
                          "gradients")
        return back, None, None, None, None, None

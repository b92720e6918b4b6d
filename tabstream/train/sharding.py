"""One embedding-sharding planner for both frameworks.

A :class:`ShardingPlan` says, for every embedding table of a model, how it is split
over ``world_size`` workers: whole on one worker (``table_wise``), by row ranges
(``row_wise``), by column slices (``column_wise``) or replicated
(``data_parallel``). It is computed alike on every worker from the table configs
alone, so :class:`tabstream.train.torch.distributed.HybridParallel` and
:class:`tabstream.train.tensorflow.distributed.HybridParallel` take the same plans
(both ``distributed`` modules re-export :func:`plan_sharding`):

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
    >>> dict(resolve_plan("table_wise", configs, 2))
    {'C1': 'table_wise', 'C2': 'table_wise', 'C3': 'table_wise'}

No framework is imported here: a model is searched for its embedding-table
modules or layers by what they expose (a ``configs`` list of :class:`TableConfig`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tabstream.train.tables import TableConfig

__all__ = [
    "SHARDING_TYPES",
    "STRATEGIES",
    "ShardingPlan",
    "TablePlacement",
    "plan_sharding",
    "resolve_plan",
    "table_configs_of",
]

SHARDING_TYPES = ("table_wise", "row_wise", "column_wise", "data_parallel")
STRATEGIES = ("auto", *SHARDING_TYPES)
_STRATEGIES = STRATEGIES
_FLOAT_BYTES = 4


@dataclass(frozen=True)
class TablePlacement:
    """Where one table lives. ``ranges[k]`` is rank ``k``'s ``(start, stop)`` row
    range (``row_wise``) or column range (``column_wise``); ``owner`` is the rank of
    a ``table_wise`` table."""

    kind: str
    owner: int | None = None
    ranges: tuple[tuple[int, int], ...] = ()

    def pieces(self) -> list[tuple[int, int, int]]:
        """``[(rank, start, stop), ...]`` of the non-empty shards (ranks ascending)."""
        if self.kind == "table_wise":
            return [(int(self.owner or 0), 0, -1)]
        return [(k, a, b) for k, (a, b) in enumerate(self.ranges) if b > a]

    def region(self, rank: int, rows: int, dim: int) -> tuple[tuple[int, int], tuple[int, int]] | None:
        """``(offsets, sizes)`` of the part of a ``rows x dim`` table that ``rank``
        holds (the whole table for ``data_parallel``), None where it holds none.

        >>> TablePlacement("row_wise", ranges=((0, 6), (6, 10))).region(1, 10, 4)
        ((6, 0), (4, 4))
        >>> TablePlacement("column_wise", ranges=((0, 2), (2, 4))).region(0, 10, 4)
        ((0, 0), (10, 2))
        """
        if self.kind == "data_parallel":
            return (0, 0), (rows, dim)
        for k, a, b in self.pieces():
            if k != rank:
                continue
            if self.kind == "table_wise":
                return (0, 0), (rows, dim)
            if self.kind == "row_wise":
                return (a, 0), (b - a, dim)
            return (0, a), (rows, b - a)
        return None


@dataclass
class ShardingPlan(Mapping[str, str]):
    """A mapping ``{table name: sharding type}`` plus where each shard lives and
    how many bytes (weights + ``optimizer_slots`` same-sized optimizer tensors)
    each rank holds. ``print(plan)`` explains it."""

    world_size: int
    configs: dict[str, TableConfig]
    placements: dict[str, TablePlacement]
    optimizer_slots: int = 2
    _bytes: list[int] = field(default_factory=list, repr=False)

    def __getitem__(self, table: str) -> str:
        return self.placements[table].kind

    def __iter__(self) -> Iterator[str]:
        return iter(self.placements)

    def __len__(self) -> int:
        return len(self.placements)

    def table_bytes(self, table: str) -> int:
        cfg = self.configs[table]
        return cfg.cardinality * cfg.dim * _FLOAT_BYTES * (1 + self.optimizer_slots)

    def rank_bytes(self) -> list[int]:
        """Bytes of sharded tables held by each rank (replicated tables not counted)."""
        out = [0] * self.world_size
        for name, place in self.placements.items():
            cfg = self.configs[name]
            per_value = _FLOAT_BYTES * (1 + self.optimizer_slots)
            if place.kind == "table_wise":
                out[int(place.owner or 0)] += self.table_bytes(name)
            elif place.kind == "row_wise":
                for k, (a, b) in enumerate(place.ranges):
                    out[k] += (b - a) * cfg.dim * per_value
            elif place.kind == "column_wise":
                for k, (a, b) in enumerate(place.ranges):
                    out[k] += (b - a) * cfg.cardinality * per_value
        return out

    def replicated_bytes(self) -> int:
        """Bytes of the ``data_parallel`` tables, held whole by every rank."""
        return sum(self.table_bytes(n) for n, p in self.placements.items()
                   if p.kind == "data_parallel")

    def __str__(self) -> str:
        lines = [f"ShardingPlan for {self.world_size} ranks (bytes = weights + "
                 f"{self.optimizer_slots} optimizer slots, float32)"]
        width = max((len(n) for n in self.placements), default=0)
        for name, place in self.placements.items():
            cfg = self.configs[name]
            where = {
                "table_wise": f"on rank {place.owner}",
                "row_wise": "rows " + ", ".join(f"{a}:{b}" for a, b in place.ranges),
                "column_wise": "columns " + ", ".join(f"{a}:{b}" for a, b in place.ranges),
                "data_parallel": "replicated",
            }[place.kind]
            lines.append(f"  {name:<{width}}  {cfg.cardinality:>11,} x {cfg.dim:<4} "
                         f"{place.kind:<13} {where}")
        per_rank = "   ".join(f"rank {k}: {b:,} bytes" for k, b in enumerate(self.rank_bytes()))
        lines.append(f"  {per_rank}   (+{self.replicated_bytes():,} replicated on each)")
        return "\n".join(lines)

    __repr__ = __str__


def _even_ranges(n: int, parts: int) -> tuple[tuple[int, int], ...]:
    # np.array_split sizes: the first n % parts parts one longer
    sizes = [len(a) for a in np.array_split(np.arange(n), parts)]
    bounds = [0, *np.cumsum(sizes).tolist()]
    return tuple((bounds[k], bounds[k + 1]) for k in range(parts))


def plan_sharding(
    model_or_tables: Any,
    world_size: int,
    strategy: str = "auto",
    overrides: Mapping[str, str] | None = None,
    optimizer_slots: int = 2,
    data_parallel_bytes: int = 1 << 20,
) -> ShardingPlan:
    """Decide how each embedding table is split over ``world_size`` ranks.

    ``strategy="auto"``: tables under ``data_parallel_bytes`` (weights + optimizer
    state) are replicated (``data_parallel``), tables larger than an even share of
    all the sharded bytes are split over every rank, by columns (``column_wise``)
    when ``dim >= world_size``, else by rows (``row_wise``), and the others are
    placed whole (``table_wise``), largest first, each on the rank holding the
    fewest bytes so far. Any other strategy gives every table that type;
    ``overrides`` (``{table: type}``) win over the strategy. Deterministic: every
    rank computes the same plan.

    >>> from tabstream.train.tables import TableConfig
    >>> model = [TableConfig(name, rows, 16, (name,))     # or a model holding these tables
    ...          for name, rows in [("C1", 1_000_000), ("C2", 50_000), ("C7", 20_000), ("C9", 100)]]
    >>> plan = plan_sharding(model, world_size=2, overrides={"C7": "column_wise"})
    >>> dict(plan)
    {'C1': 'column_wise', 'C2': 'table_wise', 'C7': 'column_wise', 'C9': 'data_parallel'}
    >>> plan.rank_bytes()          # 1M, 50k, 20k and 100 rows x 16: weights + Adam state
    [107520000, 97920000]
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"plan_sharding: world_size must be an int, got {world_size!r}")
    if world_size < 1:
        raise ValueError(f"plan_sharding: world_size must be >= 1, got {world_size}")
    if strategy not in _STRATEGIES:
        raise ValueError(f"plan_sharding: strategy must be one of {list(_STRATEGIES)}, "
                         f"got {strategy!r}")
    configs = {c.name: c for c in table_configs_of(model_or_tables)}
    overrides = dict(overrides or {})
    for name, kind in overrides.items():
        if name not in configs:
            raise ValueError(f"plan_sharding: the plan names table {name!r}, which the model "
                             f"does not have; its tables are {sorted(configs)}")
        if kind not in SHARDING_TYPES:
            raise ValueError(f"plan_sharding: table {name!r}: sharding type must be one of "
                             f"{list(SHARDING_TYPES)}, got {kind!r}")
    plan = ShardingPlan(world_size, configs, {}, optimizer_slots)
    kinds: dict[str, str] = {}
    for name in configs:
        if name in overrides:
            kinds[name] = overrides[name]
        elif strategy != "auto":
            kinds[name] = strategy
        elif plan.table_bytes(name) < data_parallel_bytes:
            kinds[name] = "data_parallel"
    auto = [n for n in configs if n not in kinds]
    sharded_total = sum(plan.table_bytes(n) for n in auto)
    for name in auto:
        big = plan.table_bytes(name) > sharded_total / world_size and world_size > 1
        # a big table is split over all ranks: by columns when each rank gets one at
        # least (a rank then sends B x dim/W floats per table and step, where a row
        # split sends partial sums of B x dim to every other rank), else by rows
        if not big:
            kinds[name] = "table_wise"
        else:
            kinds[name] = "column_wise" if configs[name].dim >= world_size else "row_wise"

    load = [0] * world_size
    for name in configs:  # fixed costs first: row/column splits spread over all ranks
        cfg, kind = configs[name], kinds[name]
        if kind == "row_wise":
            if cfg.cardinality < world_size:
                raise ValueError(f"plan_sharding: table {name!r} has {cfg.cardinality} rows, "
                                 f"fewer than {world_size} ranks: it cannot be row_wise")
            ranges = _even_ranges(cfg.cardinality, world_size)
        elif kind == "column_wise":
            ranges = _even_ranges(cfg.dim, world_size)
        else:
            continue
        plan.placements[name] = TablePlacement(kind, ranges=ranges)
    load = plan.rank_bytes()
    by_size = sorted((n for n in configs if kinds[n] == "table_wise"),
                     key=lambda n: (-plan.table_bytes(n), n))
    for name in by_size:
        owner = int(np.argmin(load))
        load[owner] += plan.table_bytes(name)
        plan.placements[name] = TablePlacement("table_wise", owner=owner)
    for name in configs:
        if kinds[name] == "data_parallel":
            plan.placements[name] = TablePlacement("data_parallel")
    plan.placements = {n: plan.placements[n] for n in configs}  # the model's table order
    return plan



def _tables_in(obj: Any) -> list[TableConfig] | None:
    """The configs of an embedding-tables module or layer (torch or Keras), else None."""
    configs = getattr(obj, "configs", None)
    if isinstance(configs, (list, tuple)) and configs and all(
            isinstance(c, TableConfig) for c in configs):
        return list(configs)
    return None


def _named_children(obj: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, module)`` of every sub-module of a torch module (``named_modules()``),
    or of every nested layer of a Keras model (``layers``, recursively; paths joined
    by ``/``)."""
    named = getattr(obj, "named_modules", None)
    if callable(named):
        return [(n, m) for n, m in named() if m is not obj]
    out: list[tuple[str, Any]] = []
    for i, layer in enumerate(getattr(obj, "layers", None) or []):
        name = getattr(layer, "name", None) or f"layers[{i}]"
        path = f"{prefix}/{name}" if prefix else str(name)
        out.append((path, layer))
        out.extend(_named_children(layer, path))
    return out


def _inside(path: str, outer: str) -> bool:
    return path.startswith(outer + ".") or path.startswith(outer + "/")


def table_configs_of(model_or_tables: Any) -> list[TableConfig]:
    """The embedding tables of a torch or Keras model, of an ``EmbeddingTables``
    (either framework), or of an iterable of :class:`TableConfig`, in model order.

    A plan keys tables by name, so two tables of one name (in two embedding modules
    of a model, or twice in the configs given) are refused with a ``ValueError``
    naming them."""
    return _table_configs(model_or_tables, "plan_sharding")


def _table_configs(model_or_tables: Any, who: str) -> list[TableConfig]:
    own = _tables_in(model_or_tables)
    if own is not None:
        return _unique(own, ["the configs given"] * len(own), who)
    if isinstance(model_or_tables, TableConfig):
        return [model_or_tables]
    if hasattr(model_or_tables, "modules") or hasattr(model_or_tables, "layers"):
        configs: list[TableConfig] = []
        owners: list[str] = []
        found_at: list[str] = []
        seen: set[int] = set()
        for path, child in _named_children(model_or_tables):
            found = _tables_in(child)
            if found is None or id(child) in seen:
                continue
            if any(_inside(path, outer) for outer in found_at):
                continue  # a part of an embedding module already counted (its replicas)
            seen.add(id(child))
            found_at.append(path)
            configs.extend(found)
            owners.extend([path or type(child).__name__] * len(found))
        if not configs:
            raise ValueError(
                f"plan_sharding: {type(model_or_tables).__name__} has no EmbeddingTables "
                "module or layer; build the model from a schema (DLRM, DCN, ...) or pass "
                "table configs"
            )
        return _unique(configs, owners, who)
    if isinstance(model_or_tables, (str, bytes)) or not hasattr(model_or_tables, "__iter__"):
        raise TypeError(
            "plan_sharding takes a model, an EmbeddingTables or TableConfigs, got "
            f"{type(model_or_tables).__name__}"
        )
    items = list(model_or_tables)
    bad = [type(t).__name__ for t in items if not isinstance(t, TableConfig)]
    if bad:
        raise TypeError(
            "plan_sharding takes a model, an EmbeddingTables or TableConfigs, got "
            f"{bad[0]} items"
        )
    return _unique(items, ["the configs given"] * len(items), who)


def _unique(configs: list[TableConfig], owners: list[str], who: str) -> list[TableConfig]:
    """``configs``, refused when two share a name (``owners[i]``: where config i is)."""
    first: dict[str, int] = {}
    for i, cfg in enumerate(configs):
        if cfg.name not in first:
            first[cfg.name] = i
            continue
        j = first[cfg.name]
        a = configs[j]
        if owners[i] == owners[j]:
            where = f"twice in {owners[i]}"
        else:
            where = f"in two embedding modules, {owners[j]!r} and {owners[i]!r}"
        raise ValueError(
            f"{who}: table {cfg.name!r} is {where} ({a.cardinality} x {a.dim} and "
            f"{cfg.cardinality} x {cfg.dim}); a sharding plan keys tables by name, so each "
            "table of a model needs a name of its own: rename one (TableConfig(name=...)), "
            "or give both modules one EmbeddingTables to share the table"
        )
    return configs


def resolve_plan(plan: Any, model_or_tables: Any, world_size: int,
                 who: str = "HybridParallel") -> ShardingPlan:
    """What ``HybridParallel(model, plan=...)`` accepts, as a :class:`ShardingPlan` for
    ``world_size`` workers: ``None`` (the ``"auto"`` plan), a strategy name
    (``"auto"``, ``"table_wise"``, ...: :func:`plan_sharding`'s ``strategy``), a
    ``{table: type}`` dict (overrides of ``"auto"``) or a ready :class:`ShardingPlan`
    (checked against ``world_size`` and against the model's tables: their names, sizes
    and the ranges that the placements cut)."""
    if isinstance(plan, ShardingPlan):
        if plan.world_size != world_size:
            raise ValueError(f"{who}: the plan is for {plan.world_size} ranks, but the process "
                             f"group has {world_size}; plan with "
                             f"plan_sharding(model, world_size={world_size})")
        _check_plan(plan, _table_configs(model_or_tables, who), who)
        return plan
    if plan is None:
        return plan_sharding(_table_configs(model_or_tables, who), world_size)
    if isinstance(plan, str):
        if plan not in STRATEGIES:
            raise ValueError(f"{who}: plan={plan!r} is not a strategy; give one of "
                             f"{list(STRATEGIES)}, a {{table: type}} dict or a ShardingPlan")
        return plan_sharding(_table_configs(model_or_tables, who), world_size, strategy=plan)
    if isinstance(plan, Mapping):
        return plan_sharding(_table_configs(model_or_tables, who), world_size, overrides=plan)
    raise TypeError(f"{who}: plan must be a ShardingPlan, a {{table: type}} dict, a strategy "
                    f"name ({', '.join(STRATEGIES)}) or None, got {type(plan).__name__}")


def _check_plan(plan: ShardingPlan, configs: list[TableConfig], who: str) -> None:
    """A ready plan fits the model's tables: the same names, each table planned for
    the model's size, and placements that cover its rows or columns exactly once."""
    fix = f"plan with plan_sharding(model, world_size={plan.world_size}) for this model"
    model = {c.name: c for c in configs}
    missing = [n for n in model if n not in plan.placements]
    if missing:
        raise ValueError(f"{who}: the plan has no placement for tables {missing} of the model "
                         f"(it plans {sorted(plan.placements)}); {fix}")
    unknown = [n for n in plan.placements if n not in model]
    if unknown:
        raise ValueError(f"{who}: the plan names tables {sorted(unknown)} that the model does "
                         f"not have (its tables are {sorted(model)}); {fix}")
    for name, cfg in model.items():
        planned = plan.configs.get(name)
        if planned is not None and (planned.cardinality, planned.dim) != (cfg.cardinality,
                                                                          cfg.dim):
            raise ValueError(
                f"{who}: table {name!r} is {planned.cardinality} x {planned.dim} (rows x dim) "
                f"in the plan but {cfg.cardinality} x {cfg.dim} in the model; {fix}")
        place = plan.placements[name]
        if place.kind not in SHARDING_TYPES:
            raise ValueError(f"{who}: table {name!r}: sharding type {place.kind!r} is not one "
                             f"of {list(SHARDING_TYPES)}")
        if place.kind == "table_wise":
            if place.owner is None or not 0 <= int(place.owner) < plan.world_size:
                raise ValueError(f"{who}: table {name!r} is placed on rank {place.owner}, not "
                                 f"on one of the plan's {plan.world_size} ranks; {fix}")
        elif place.kind in ("row_wise", "column_wise"):
            what, total = (("rows", cfg.cardinality) if place.kind == "row_wise"
                           else ("columns", cfg.dim))
            ranges = [(int(a), int(b)) for a, b in place.ranges]
            ends = [0] + [b for _, b in ranges]
            tiles = (len(ranges) == plan.world_size and ends[-1] == total
                     and all(a == ends[k] and b >= a for k, (a, b) in enumerate(ranges)))
            if not tiles:
                cut = ", ".join(f"{a}:{b}" for a, b in ranges)
                raise ValueError(
                    f"{who}: table {name!r} is {place.kind} over {what} {cut} in the plan, "
                    f"which do not cover the model's {total} {what} (0:{total}) once over "
                    f"{plan.world_size} ranks; {fix}")

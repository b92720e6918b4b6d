"""Bundled models, each built from a schema and returning logits.

Every model takes ``features: dict[str, Tensor]`` keyed by the schema's column
names (categorical ids int64, continuous float; list columns as in
:mod:`tabstream.train.torch.embeddings`) and returns ``(B,)`` logits::

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
    >>> model = DLRM(schema, embedding_dim=16)
    >>> model(features).shape                       # features, labels = next(iter(loader))
    torch.Size([4])

Common keyword arguments: ``sparse`` / ``sparse_threshold`` (which tables get
sparse gradients, see :class:`EmbeddingTables`) and ``combiner`` ("sum" or
"mean", for list columns). ``DLRM``, ``DCN``, ``WideAndDeep`` (its deep part)
and ``TwoTower`` also take ``embeddings=``: ready-made tables serving the schema's
categorical features, such as a :class:`~tabstream.train.torch.CachedEmbeddings`
for tables larger than memory (``TwoTower`` looks up each tower's features
through ``embeddings.subset(names)``, and refuses a table shared by both towers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema, Tags
from tabstream.train.spec import check_positive, feature_spec
from tabstream.train.tables import TableConfig, wide_table_configs
from tabstream.train.torch.blocks import MLP, CrossNetwork, DotInteraction, FeatureInputs
from tabstream.train.torch.embeddings import DEFAULT_SPARSE_THRESHOLD

__all__ = ["DCN", "DLRM", "TwoTower", "WideAndDeep", "recall_at_k"]

Features = Mapping[str, Any]


def _pooling(combiner: Any, who: str) -> str:
    """``combiner`` of a bundled model: its layers read one vector per feature and
    row, so list columns must be pooled ("sum" or "mean"). ``combiner=None`` (one
    vector per id, a ``(B, L, dim)`` block) is for models of your own over
    :class:`EmbeddingTables`."""
    if combiner not in ("sum", "mean"):
        raise ValueError(
            f"{who}: combiner must be 'sum' or 'mean' (list columns pooled into one vector "
            f"per row, as the model's layers read them), got {combiner!r}; combiner=None "
            "(one vector per id) is for models of your own built on EmbeddingTables"
        )
    return str(combiner)


class DLRM(nn.Module):
    """DLRM: a bottom MLP maps the continuous features to one ``embedding_dim``
    vector; it and every categorical embedding (all ``embedding_dim`` wide) meet in
    pairwise dot products; the top MLP reads ``[bottom output, dot products]``.

    ``(B, n_cont) -> bottom -> (B, D)``; ``F`` vectors ``-> (B, F(F-1)/2)``;
    ``concat -> top -> (B,)`` logits.
    """

    def __init__(
        self,
        schema: Schema,
        embedding_dim: int = 16,
        bottom_mlp: Sequence[int] = (64,),
        top_mlp: Sequence[int] = (64, 32),
        sparse: bool | None = None,
        sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
        combiner: str = "sum",
        embeddings: nn.Module | None = None,
    ) -> None:
        super().__init__()
        combiner = _pooling(combiner, "DLRM")
        self.inputs = FeatureInputs(
            schema, embedding_dim=embedding_dim, sparse=sparse,
            sparse_threshold=sparse_threshold, combiner=combiner, embeddings=embeddings,
        )
        other = {f: d for f, d in self.inputs.embedding_dims.items() if d != embedding_dim}
        if other:
            raise ValueError(
                f"DLRM: every embedding must be embedding_dim={embedding_dim} wide for the dot "
                f"interaction; the given embeddings have {other}"
            )
        n_cont = self.inputs.num_continuous
        self.bottom = (
            MLP(n_cont, [*bottom_mlp, embedding_dim], final_activation=True) if n_cont else None
        )
        num_vectors = len(self.inputs.embedding_dims) + (1 if n_cont else 0)
        if num_vectors < 2:
            raise ValueError(
                "DLRM needs at least two vectors to interact (categorical features, plus "
                f"one for the continuous ones); schema {schema.column_names} gives {num_vectors}"
            )
        self.interaction = DotInteraction(num_vectors)
        top_in = self.interaction.output_dim + (embedding_dim if n_cont else 0)
        self.top = MLP(top_in, [*top_mlp, 1], final_activation=False)

    def forward(self, features: Features) -> torch.Tensor:
        embeddings, continuous = self.inputs(features)
        vectors = list(embeddings.values())
        dense = []
        if self.bottom is not None:
            bottom = self.bottom(continuous)
            vectors.insert(0, bottom)
            dense.append(bottom)
        interactions = self.interaction(torch.stack(vectors, dim=1))
        return self.top(torch.cat([*dense, interactions], dim=1)).squeeze(1)


class DCN(nn.Module):
    """DCN-v2: a cross network over ``x0 = [embeddings, continuous]`` and a deep MLP,
    either ``"stacked"`` (cross, then deep) or ``"parallel"`` (both read ``x0``,
    outputs concatenated), then one linear layer to a logit."""

    def __init__(
        self,
        schema: Schema,
        embedding_dim: int | None = None,
        multiplier: float = 2.0,
        cross_layers: int = 3,
        deep: Sequence[int] = (128, 64),
        structure: str = "stacked",
        low_rank: int | None = None,
        sparse: bool | None = None,
        sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
        combiner: str = "sum",
        embeddings: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if structure not in ("stacked", "parallel"):
            raise ValueError(f"DCN: structure must be 'stacked' or 'parallel', got {structure!r}")
        combiner = _pooling(combiner, "DCN")
        self.structure = structure
        self.inputs = FeatureInputs(
            schema, embedding_dim=embedding_dim, multiplier=multiplier, sparse=sparse,
            sparse_threshold=sparse_threshold, combiner=combiner, embeddings=embeddings,
        )
        width = self.inputs.output_dim
        self.cross = CrossNetwork(width, cross_layers, low_rank=low_rank)
        self.deep = MLP(width, list(deep), final_activation=True)
        head_in = self.deep.output_dim + (width if structure == "parallel" else 0)
        self.head = nn.Linear(head_in, 1)

    def forward(self, features: Features) -> torch.Tensor:
        x0 = self.inputs.concat(features)
        if self.structure == "stacked":
            out = self.deep(self.cross(x0))
        else:
            out = torch.cat([self.cross(x0), self.deep(x0)], dim=1)
        return self.head(out).squeeze(1)


class WideAndDeep(nn.Module):
    """Wide & Deep: a linear model over ``wide_columns`` (one weight per id of each
    categorical, as a 1-wide embedding table, plus a linear layer over continuous
    ones) added to an MLP over all embeddings and continuous features.

    ``wide_columns`` defaults to every feature of the schema.

    With ``embeddings=`` a :class:`~tabstream.train.torch.CachedEmbeddings`, the
    wide part trains from the same parameter server: create the server with
    :meth:`table_configs` (the deep tables, then a 1-wide ``<table>_wide`` table
    per wide categorical), so that ``export_delta`` covers the whole sparse model.
    Wide rows then start from the server's initial values (uniform in
    ``+-init_scale``) instead of zeros.
    """

    @staticmethod
    def table_configs(
        schema: Schema,
        embedding_dim: int | dict[str, int] | None = None,
        multiplier: float = 2.0,
        wide_columns: Iterable[str] | None = None,
        combiner: str = "sum",
    ) -> list[TableConfig]:
        """Every embedding table of this model over ``schema``, for a parameter
        server: the deep tables, then the wide ones (``<table>_wide``, 1 wide)."""
        wide_schema = schema if wide_columns is None else schema.select_by_name(list(wide_columns))
        deep = feature_spec(schema, dim=embedding_dim, multiplier=multiplier, combiner=combiner)
        return [*deep.tables, *wide_table_configs(wide_schema, combiner=combiner)]

    def __init__(
        self,
        schema: Schema,
        embedding_dim: int | None = None,
        multiplier: float = 2.0,
        deep: Sequence[int] = (128, 64),
        wide_columns: Iterable[str] | None = None,
        sparse: bool | None = None,
        sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
        combiner: str = "sum",
        embeddings: nn.Module | None = None,
    ) -> None:
        super().__init__()
        combiner = _pooling(combiner, "WideAndDeep")
        self.deep_inputs = FeatureInputs(
            schema, embedding_dim=embedding_dim, multiplier=multiplier, sparse=sparse,
            sparse_threshold=sparse_threshold, combiner=combiner, embeddings=embeddings,
        )
        self.deep = MLP(self.deep_inputs.output_dim, [*deep, 1], final_activation=False)
        wide_schema = schema if wide_columns is None else schema.select_by_name(list(wide_columns))
        self.wide_inputs = FeatureInputs(
            wide_schema, embedding_dim=1, sparse=sparse, sparse_threshold=sparse_threshold,
            combiner=combiner, init_scale=0.0, embeddings=_wide_from_server(embeddings, wide_schema),
        )
        n_cont = self.wide_inputs.num_continuous
        self.wide_linear = nn.Linear(n_cont, 1) if n_cont else None

    def forward(self, features: Features) -> torch.Tensor:
        logits = self.deep(self.deep_inputs.concat(features)).squeeze(1)
        weights, continuous = self.wide_inputs(features)
        for w in weights.values():
            logits = logits + w.squeeze(1)
        if self.wide_linear is not None:
            logits = logits + self.wide_linear(continuous).squeeze(1)
        return logits


def _wide_from_server(embeddings: nn.Module | None, wide_schema: Schema) -> nn.Module | None:
    """The wide part's tables from the deep part's parameter server, when the deep
    tables come from one (``None``: plain in-memory wide tables)."""
    ps = getattr(embeddings, "ps", None)
    if ps is None:
        return None
    from tabstream.train.torch.cache import CachedEmbeddings

    wanted = [cfg.name for cfg in wide_table_configs(wide_schema)]
    have = {cfg.name for cfg in ps.configs}
    missing = [name for name in wanted if name not in have]
    if missing:
        raise SchemaError(
            f"WideAndDeep: embeddings= serves the deep tables from parameter server {ps.path}, "
            f"which has no wide tables {missing}: the wide part would train in memory, outside "
            "the server and its export_delta. Create the server with "
            "WideAndDeep.table_configs(schema, embedding_dim) (deep and wide tables)"
        )
    return CachedEmbeddings(ps, getattr(embeddings, "cache_rows", 1_000_000), tables=wanted)


class _Tower(nn.Module):
    def __init__(self, inputs: FeatureInputs, hidden: Sequence[int], output_dim: int) -> None:
        super().__init__()
        self.inputs = inputs
        self.mlp = MLP(inputs.output_dim, [*hidden, output_dim], final_activation=False)

    def forward(self, features: Features) -> torch.Tensor:
        return self.mlp(self.inputs.concat(features))


class TwoTower(nn.Module):
    """Retrieval model: a query tower over the USER-tagged columns and an item tower
    over the ITEM-tagged ones, trained with in-batch negatives.

    ``forward(features)`` scores each row's own (user, item) pair: ``(B,)`` logits
    ``<q, i> / temperature``. ``compute_loss(features, labels)`` (used by
    :func:`~tabstream.train.torch.fit`) is the in-batch softmax: each positive row's
    item against the items of the other positive rows (rows with ``label > 0.5``;
    all rows when ``labels`` is None); another row holding the same item id is not
    counted as a negative. With ``logq_correction`` (the default) each negative's
    logit is lowered by ``log Q(item)``, the item's share of the positives seen in
    training so far (the buffer ``item_counts``, saved in the state dict): popular
    items are in-batch negatives more often, and without the correction the model
    learns to rank them too low (recall@10 far below ranking by popularity).
    :meth:`recall_at_k` evaluates retrieval on a loader.

    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> def categorical(name, n, *tags):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL, *tags],
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("user_id", 100, Tags.USER_ID), categorical("age", 10, Tags.USER),
    ...                  categorical("item_id", 500, Tags.ITEM_ID), categorical("cat", 20, Tags.ITEM)])
    >>> features = {"user_id": torch.tensor([1, 2, 3]), "age": torch.tensor([0, 9, 4]),
    ...             "item_id": torch.tensor([10, 499, 7]), "cat": torch.tensor([3, 3, 19])}
    >>> model = TwoTower(schema, output_dim=32)       # user_id, age: USER; item_id, cat: ITEM
    >>> model.query_embeddings(features).shape, model.item_embeddings(features).shape
    (torch.Size([3, 32]), torch.Size([3, 32]))
    >>> model(features).shape                         # each row's own (user, item) score
    torch.Size([3])
    """

    def __init__(
        self,
        schema: Schema,
        query_tower: Sequence[int] = (64,),
        item_tower: Sequence[int] = (64,),
        output_dim: int = 32,
        embedding_dim: int | None = None,
        multiplier: float = 2.0,
        temperature: float = 0.1,
        l2_normalize: bool = True,
        sparse: bool | None = None,
        sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
        combiner: str = "sum",
        logq_correction: bool = True,
        embeddings: nn.Module | None = None,
    ) -> None:
        super().__init__()
        features = schema.without(schema.select_by_tag(Tags.TARGET).column_names)
        user, item = features.select_by_tag(Tags.USER), features.select_by_tag(Tags.ITEM)
        if not len(user) or not len(item):
            raise ValueError(
                "TwoTower needs columns tagged USER and columns tagged ITEM; schema "
                f"{features.column_names} has USER {user.column_names} and ITEM "
                f"{item.column_names}. Tag them with ops.AddTags or ColumnSchema.with_tags"
            )
        both = sorted(set(user.column_names) & set(item.column_names))
        if both:
            raise ValueError(f"TwoTower: columns {both} are tagged both USER and ITEM")
        self.temperature = check_positive(temperature, "TwoTower: temperature")
        combiner = _pooling(combiner, "TwoTower")
        self.l2_normalize = l2_normalize

        views: dict[int, nn.Module | None] = {id(user): None, id(item): None}
        if embeddings is not None:
            views = self._tower_embeddings(embeddings, user, item, embedding_dim, multiplier,
                                           combiner)
            self.embeddings = embeddings  # registered once; each tower looks up through a view

        def inputs(part: Schema) -> FeatureInputs:
            return FeatureInputs(part, embedding_dim=embedding_dim, multiplier=multiplier,
                                 sparse=sparse, sparse_threshold=sparse_threshold,
                                 combiner=combiner, embeddings=views[id(part)])

        self.query_tower = _Tower(inputs(user), query_tower, output_dim)
        self.item_tower = _Tower(inputs(item), item_tower, output_dim)
        ids = [c.name for c in item.select_by_tag([Tags.ITEM, Tags.ID]) if not c.is_list]
        cats = [c.name for c in item.select_by_tag(Tags.CATEGORICAL) if not c.is_list]
        self.item_id_column: str | None = next(iter(ids + cats), None)
        self.logq_correction = bool(logq_correction) and self.item_id_column is not None
        # Clicks per item id seen in training: the in-batch sampling frequency of
        # each item as a negative, for the log-Q correction (kept in the state dict,
        # so a checkpoint resumes with it).
        cardinality = item[self.item_id_column].cardinality if self.item_id_column else 0
        self.register_buffer("item_counts", torch.zeros(int(cardinality or 0), dtype=torch.float64))

    @staticmethod
    def _tower_embeddings(embeddings: nn.Module, user: Schema, item: Schema,
                          embedding_dim: int | None, multiplier: float,
                          combiner: str) -> dict[int, nn.Module | None]:
        """Split ``embeddings=`` (e.g. :class:`CachedEmbeddings`) into a view per tower."""
        if not hasattr(embeddings, "subset"):
            raise TypeError(
                f"TwoTower: embeddings= must offer subset(feature_names), one view per tower "
                f"(CachedEmbeddings does); got {type(embeddings).__name__}"
            )
        names = {}
        for key, part in (("user", user), ("item", item)):
            spec = feature_spec(part, dim=embedding_dim, multiplier=multiplier, combiner=combiner)
            names[key] = [f for t in spec.tables for f in t.feature_names]
        tables = getattr(embeddings, "feature_to_table", {})
        shared = sorted({tables.get(f) for f in names["user"]} & {tables.get(f) for f in names["item"]}
                        - {None})
        if shared:
            # two towers updating one table would apply two sparse steps where
            # in-memory training applies one
            raise ValueError(f"TwoTower: embeddings= tables {shared} serve both USER and ITEM "
                             "features; give each tower its own tables")
        return {id(user): embeddings.subset(names["user"]),
                id(item): embeddings.subset(names["item"])}

    def query_embeddings(self, features: Features) -> torch.Tensor:
        q = self.query_tower(features)
        return F.normalize(q, dim=1) if self.l2_normalize else q

    def item_embeddings(self, features: Features) -> torch.Tensor:
        i = self.item_tower(features)
        return F.normalize(i, dim=1) if self.l2_normalize else i

    def candidate_embeddings(self, features: Features) -> torch.Tensor:
        """``(B, output_dim)`` item vectors: the name Keras' ``TwoTower`` uses too
        (``item_embeddings`` is the same)."""
        return self.item_embeddings(features)

    def forward(self, features: Features) -> torch.Tensor:
        q, i = self.query_embeddings(features), self.item_embeddings(features)
        return (q * i).sum(dim=1) / self.temperature

    def item_ids(self, features: Features) -> torch.Tensor | None:
        if self.item_id_column is None:
            return None
        return features[self.item_id_column].reshape(-1)

    def compute_loss(self, features: Features, labels: torch.Tensor | None = None) -> torch.Tensor:
        q, i = self.query_embeddings(features), self.item_embeddings(features)
        ids = self.item_ids(features)
        if labels is not None:
            positive = labels.reshape(-1) > 0.5
            q, i = q[positive], i[positive]
            ids = ids[positive] if ids is not None else None
        if q.shape[0] == 0:  # no positives: a zero loss that leaves every .grad None
            return torch.zeros((), device=q.device, requires_grad=True)
        logits = q @ i.T / self.temperature
        if ids is not None and len(self.item_counts):
            log_q = self._log_q(ids)
            if self.logq_correction:
                logits = logits - log_q[None, :]
        if ids is not None:
            same_item = ids[:, None] == ids[None, :]
            same_item.fill_diagonal_(False)
            logits = logits.masked_fill(same_item, float("-inf"))
        target = torch.arange(q.shape[0], device=q.device)
        return F.cross_entropy(logits, target)

    def _log_q(self, ids: torch.Tensor) -> torch.Tensor:
        """log of each in-batch item's share of the positives seen so far (this batch
        included, so never log 0)."""
        if self.training:
            with torch.no_grad():
                self.item_counts.index_add_(
                    0, ids, torch.ones(ids.shape, dtype=self.item_counts.dtype, device=ids.device)
                )
        counts = self.item_counts[ids].clamp_min(1.0)
        return torch.log(counts / self.item_counts.sum().clamp_min(1.0)).to(torch.float32)

    def recall_at_k(self, loader: Iterable[Any], k: int = 10, device: Any = None) -> float:
        """See :func:`recall_at_k`."""
        return recall_at_k(self, loader, k=k, device=device)


@torch.no_grad()
def recall_at_k(model: TwoTower, loader: Iterable[Any], k: int = 10, device: Any = None) -> float:
    """Share of positive (user, item) rows of ``loader`` whose item is among the
    ``k`` best-scored candidates for that user; the candidates are all distinct
    items of the positive rows (by ``model.item_id_column``; by embedding when
    there is none). Random scoring gives about ``k / number of candidates``.

    ``loader`` yields ``(features, labels)`` (rows with ``label > 0.5`` are the
    positives; ``labels=None`` means all rows are).
    """
    from tabstream.train.torch.fit import move_to_device, unpack_batch

    if k < 1:
        raise ValueError(f"recall_at_k: k must be >= 1, got {k}")
    device = device if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    queries, items, ids = [], [], []
    try:
        for batch in loader:
            features, labels = unpack_batch(batch, "recall_at_k")
            features = move_to_device(features, device)
            q, i = model.query_embeddings(features), model.item_embeddings(features)
            row_ids = model.item_ids(features)
            if labels is not None:
                positive = labels.reshape(-1).to(device) > 0.5
                q, i = q[positive], i[positive]
                row_ids = row_ids[positive] if row_ids is not None else None
            queries.append(q)
            items.append(i)
            if row_ids is not None:
                ids.append(row_ids)
    finally:
        model.train(was_training)
    if not queries or sum(len(q) for q in queries) == 0:
        raise ValueError("recall_at_k: the loader yielded no positive rows")
    query, item = torch.cat(queries), torch.cat(items)
    if ids:
        _, inverse = torch.unique(torch.cat(ids), return_inverse=True)
    else:
        _, inverse = torch.unique(item, dim=0, return_inverse=True)
    n_candidates = int(inverse.max()) + 1
    # Each candidate's embedding is its first row's (items' features are per item).
    first = torch.full((n_candidates,), len(inverse), dtype=torch.long, device=inverse.device)
    first.scatter_reduce_(0, inverse, torch.arange(len(inverse), device=inverse.device), "amin")
    candidates = item[first]
    top = min(k, n_candidates)
    hits = 0
    for start in range(0, len(query), 4096):
        scores = query[start:start + 4096] @ candidates.T
        best = scores.topk(top, dim=1).indices
        hits += int((best == inverse[start:start + 4096, None]).any(dim=1).sum())
    return hits / len(query)

"""Building blocks of the bundled models: schema inputs, MLP, dot interaction, cross network."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema
from tabstream.train.spec import feature_spec
from tabstream.train.torch.embeddings import DEFAULT_SPARSE_THRESHOLD, EmbeddingTables

__all__ = ["CrossNetwork", "DotInteraction", "FeatureInputs", "MLP"]


class FeatureInputs(nn.Module):
    """The model-facing view of a schema: embeddings for its categorical columns
    and a ``(B, n_continuous)`` block for its continuous ones (targets left out).

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
    >>> inputs = FeatureInputs(schema, embedding_dim=8)    # C1, C2 categorical; I1 continuous
    >>> embeddings, continuous = inputs(features)
    >>> {k: v.shape for k, v in embeddings.items()}, continuous.shape
    ({'C1': torch.Size([4, 8]), 'C2': torch.Size([4, 8])}, torch.Size([4, 1]))
    """

    def __init__(
        self,
        schema: Schema,
        embedding_dim: int | dict[str, int] | None = None,
        multiplier: float = 2.0,
        sparse: bool | None = None,
        sparse_threshold: int = DEFAULT_SPARSE_THRESHOLD,
        combiner: str = "sum",
        init_scale: float = 0.05,
        embeddings: nn.Module | None = None,
    ) -> None:
        super().__init__()
        # which columns are embedded and which are floats: the rules both frameworks share
        self.spec = feature_spec(schema, dim=embedding_dim, multiplier=multiplier,
                                 combiner=combiner)
        if embeddings is None:
            self.embeddings: EmbeddingTables = EmbeddingTables(
                self.spec.tables, sparse=sparse, sparse_threshold=sparse_threshold,
                init_scale=init_scale,
            )
        else:
            # given tables (e.g. CachedEmbeddings): they must serve exactly the
            # schema's categorical features
            categorical = {f for t in self.spec.tables for f in t.feature_names}
            have = set(getattr(embeddings, "feature_names", ()))
            if have != categorical:
                raise SchemaError(
                    f"embeddings= serves features {sorted(have)} but the schema's categorical "
                    f"features are {sorted(categorical)}: missing {sorted(categorical - have)}, "
                    f"extra {sorted(have - categorical)}"
                )
            self.embeddings = embeddings  # type: ignore[assignment]
        self.continuous_names: list[str] = list(self.spec.continuous)

    @property
    def embedding_dims(self) -> dict[str, int]:
        return self.embeddings.output_dims

    @property
    def num_continuous(self) -> int:
        return len(self.continuous_names)

    @property
    def output_dim(self) -> int:
        """Width of :meth:`concat`'s output."""
        return sum(self.embedding_dims.values()) + self.num_continuous

    def forward(
        self, features: Mapping[str, Any]
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor | None]:
        embeddings = self.embeddings(features)
        if not self.continuous_names:
            return embeddings, None
        dtype = next(iter(embeddings.values())).dtype if embeddings else torch.float32
        columns = []
        for name in self.continuous_names:
            if name not in features:
                raise SchemaError(
                    f"continuous feature {name!r} is missing from the batch; the batch has "
                    f"{sorted(features)}"
                )
            x = features[name]
            if x.dim() > 1 and x[0].numel() != 1:
                raise ValueError(
                    f"continuous feature {name!r}: expected shape (B,) or (B, 1), got "
                    f"{tuple(x.shape)}"
                )
            columns.append(x.reshape(-1).to(dtype))
        return embeddings, torch.stack(columns, dim=1)

    def concat(self, features: Mapping[str, Any]) -> torch.Tensor:
        """All inputs side by side: ``(B, sum of embedding dims + n_continuous)``."""
        embeddings, continuous = self(features)
        parts = list(embeddings.values()) + ([continuous] if continuous is not None else [])
        return torch.cat(parts, dim=1)


class MLP(nn.Sequential):
    """``Linear -> ReLU`` for each width in ``dims``; no ReLU after the last layer
    unless ``final_activation``."""

    def __init__(self, in_dim: int, dims: Sequence[int], final_activation: bool = True) -> None:
        layers: list[nn.Module] = []
        for i, width in enumerate(dims):
            layers.append(nn.Linear(in_dim, width))
            if i < len(dims) - 1 or final_activation:
                layers.append(nn.ReLU())
            in_dim = width
        super().__init__(*layers)
        self.output_dim = in_dim


class DotInteraction(nn.Module):
    """Pairwise dot products of ``F`` vectors, upper triangle without the diagonal:
    ``(B, F, D) -> (B, F * (F - 1) / 2)``, the DLRM interaction."""

    rows: torch.Tensor
    cols: torch.Tensor

    def __init__(self, num_features: int) -> None:
        super().__init__()
        # each its own storage (not two views of one): torch.export.save stores tensors whole
        rows, cols = (t.clone() for t in torch.triu_indices(num_features, num_features, offset=1))
        self.register_buffer("rows", rows, persistent=False)
        self.register_buffer("cols", cols, persistent=False)
        self.output_dim = int(rows.numel())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gram = torch.bmm(x, x.transpose(1, 2))
        return gram[:, self.rows, self.cols]


class CrossNetwork(nn.Module):
    """DCN-v2 cross layers: ``x_{l+1} = x_0 * (W_l x_l + b_l) + x_l``; with
    ``low_rank=r`` each ``W_l`` is factored as ``U_l V_l`` (``dim x r`` and ``r x dim``)."""

    def __init__(self, dim: int, num_layers: int = 3, low_rank: int | None = None) -> None:
        super().__init__()
        if low_rank is not None and (isinstance(low_rank, bool)
                                     or not isinstance(low_rank, numbers.Integral) or low_rank < 1):
            # 0 would factor W_l through no dimension at all (each layer its bias only)
            raise ValueError(f"CrossNetwork (DCN's cross layers): low_rank must be None "
                             f"(full-rank layers) or an int >= 1, got {low_rank!r}")
        layers: list[nn.Module] = []
        for _ in range(num_layers):
            if low_rank is None:
                layers.append(nn.Linear(dim, dim))
            else:
                layers.append(nn.Sequential(nn.Linear(dim, low_rank, bias=False), nn.Linear(low_rank, dim)))
        self.layers = nn.ModuleList(layers)
        self.output_dim = dim

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for layer in self.layers:
            x = x0 * layer(x) + x
        return x

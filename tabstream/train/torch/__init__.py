"""PyTorch training: embedding tables from a schema, LazyAdam and MultiOptimizer,
the DLRM / DCN / Wide&Deep / TwoTower models and a fit loop.

    >>> from tabstream.train.torch import DLRM, LazyAdam, fit
    >>> model = DLRM(schema)                       # tables >= 100,000 rows: sparse grads
    >>> history = fit(model, train_loader, LazyAdam(model.parameters(), lr=1e-3),
    ...               epochs=1, valid_loader=valid_loader)
    >>> history["val_auc"]
    [0.79]
"""

try:
    import torch  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "tabstream.train.torch needs PyTorch: pip install 'tabstream[torch]'"
    ) from exc

from tabstream.train.tables import TableConfig, infer_embedding_dim, table_configs_from_schema
from tabstream.train.torch.blocks import MLP, CrossNetwork, DotInteraction, FeatureInputs
from tabstream.train.torch.cache import CachedEmbeddings, ParameterServer
from tabstream.train.torch.embeddings import (
    DEFAULT_SPARSE_THRESHOLD,
    EmbeddingTables,
    embedding_tables_from_schema,
    split_embeddings_on_size,
)
from tabstream.train.torch.fit import (
    NonFiniteLossError,
    NothingToTrainWarning,
    evaluate,
    fit,
    move_to_device,
)
from tabstream.train.torch.metrics import log_loss, roc_auc
from tabstream.train.torch.models import DCN, DLRM, TwoTower, WideAndDeep, recall_at_k
from tabstream.train.torch.optimizers import LazyAdam, MultiOptimizer

__all__ = [
    "CachedEmbeddings",
    "DCN",
    "DEFAULT_SPARSE_THRESHOLD",
    "DLRM",
    "MLP",
    "CrossNetwork",
    "DotInteraction",
    "EmbeddingTables",
    "FeatureInputs",
    "LazyAdam",
    "MultiOptimizer",
    "NonFiniteLossError",
    "NothingToTrainWarning",
    "ParameterServer",
    "TableConfig",
    "TwoTower",
    "WideAndDeep",
    "embedding_tables_from_schema",
    "evaluate",
    "fit",
    "infer_embedding_dim",
    "log_loss",
    "move_to_device",
    "recall_at_k",
    "roc_auc",
    "split_embeddings_on_size",
    "table_configs_from_schema",
]

"""PyTorch training: embedding tables from a schema, LazyAdam and MultiOptimizer,
the DLRM / DCN / Wide&Deep / TwoTower models and a fit loop.

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
    >>> from tabstream.train.torch import DLRM, LazyAdam, fit
    >>> _ = torch.manual_seed(0)
    >>> model = DLRM(schema, embedding_dim=8)      # tables >= 100,000 rows would get sparse grads
    >>> history = fit(model, [(features, labels)] * 8, LazyAdam(model.parameters(), lr=1e-2),
    ...               epochs=2, valid_loader=[(features, labels)], progress=False)
    >>> history["epoch"], history["samples"], len(history["val_auc"])
    ([1, 2], [32, 32], 2)
    >>> history["val_loss"][1] < history["val_loss"][0]
    True
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
from tabstream.train.torch.continuous import fit_lists, lists_done
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

__all__ = ["CachedEmbeddings", "CrossNetwork", "DCN", "DEFAULT_SPARSE_THRESHOLD", "DLRM",
           "DotInteraction", "EmbeddingTables", "FeatureInputs", "LazyAdam", "MLP",
           "MultiOptimizer", "NonFiniteLossError", "NothingToTrainWarning", "ParameterServer",
           "TableConfig", "TwoTower", "WideAndDeep", "embedding_tables_from_schema", "evaluate",
           "fit", "fit_lists", "infer_embedding_dim", "lists_done", "log_loss", "move_to_device",
           "recall_at_k", "roc_auc", "split_embeddings_on_size", "table_configs_from_schema"]

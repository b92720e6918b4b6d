"""Training pieces: embedding tables sized from the schema, sparse-aware optimizers,
bundled models and fit loops. Framework code lives in ``tabstream.train.torch`` and
``tabstream.train.tensorflow``; this package itself imports neither framework. Both
build their models from :func:`feature_spec` (:mod:`tabstream.train.spec`)."""

from tabstream.train.cache_store import ParameterServer
from tabstream.train.spec import FeatureSpec, feature_spec
from tabstream.train.tables import TableConfig, infer_embedding_dim, table_configs_from_schema

__all__ = [
    "FeatureSpec",
    "ParameterServer",
    "TableConfig",
    "feature_spec",
    "infer_embedding_dim",
    "table_configs_from_schema",
]

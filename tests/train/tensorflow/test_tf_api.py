import pytest

pytest.importorskip("tensorflow")

import tabstream.train.tensorflow as tstf  # noqa: E402


def test_public_names_are_pinned():
    assert sorted(tstf.__all__) == sorted([
        "DCN", "DLRM", "MLP", "CrossNetV2", "DotInteraction", "EmbeddingTable", "EmbeddingTables",
        "LazyAdam", "LogLoss", "MultiOptimizer", "TableConfig", "ThroughputCallback", "TwoTower",
        "WideAndDeep", "binary_classification_metrics", "embedding_tables_from_schema",
        "infer_embedding_dim", "split_embeddings_on_size", "table_configs_from_schema",
    ])
    for name in tstf.__all__:
        assert hasattr(tstf, name), name

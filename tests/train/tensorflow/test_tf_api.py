import pytest

pytest.importorskip("tensorflow")

import tabstream.train.tensorflow as tstf  # noqa: E402


def test_public_names_are_pinned():
    assert sorted(tstf.__all__) == sorted([
        "CachedEmbeddings", "DCN", "DLRM", "MLP", "CrossNetwork", "DotInteraction", "EmbeddingTable",
        "EmbeddingTables", "LazyAdam", "LogLoss", "MultiOptimizer", "NonFiniteLossError",
        "NothingToTrainWarning", "ParameterServer", "TableConfig", "ThroughputCallback", "TwoTower",
        "WideAndDeep", "binary_classification_metrics", "embedding_tables_from_schema",
        "evaluate", "fit", "fit_lists", "infer_embedding_dim", "split_embeddings_on_size",
        "table_configs_from_schema",
    ])
    # the name DCN-v2's cross network had before both frameworks called it CrossNetwork
    assert tstf.CrossNetV2 is tstf.CrossNetwork
    for name in tstf.__all__:
        assert hasattr(tstf, name), name

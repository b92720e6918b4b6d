import subprocess
import sys

import pytest

pytest.importorskip("torch")

import tabstream.train.torch as tt  # noqa: E402

EXPORTED = {
    "DCN", "DEFAULT_SPARSE_THRESHOLD", "DLRM", "MLP", "CrossNetwork", "DotInteraction",
    "EmbeddingTables", "FeatureInputs", "LazyAdam", "MultiOptimizer", "NonFiniteLossError",
    "NothingToTrainWarning", "CachedEmbeddings", "ParameterServer",
    "TableConfig", "TwoTower", "WideAndDeep", "embedding_tables_from_schema", "evaluate", "fit",
    "fit_lists", "lists_done", "infer_embedding_dim", "log_loss", "move_to_device", "recall_at_k", "roc_auc",
    "split_embeddings_on_size", "table_configs_from_schema",
}


def test_exported_names_are_pinned():
    assert set(tt.__all__) == EXPORTED
    for name in tt.__all__:
        assert getattr(tt, name) is not None


def test_importing_tabstream_train_does_not_import_torch():
    code = "import sys, tabstream.train; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"

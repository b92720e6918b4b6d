import subprocess
import sys

import tabstream


def test_import_does_not_pull_frameworks():
    code = ("import sys, tabstream, tabstream.ops, tabstream.loaders, tabstream.train, tabstream.recipes;"
            "bad = [m for m in ('torch', 'tensorflow', 'keras', 'cudf') if m in sys.modules];"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_public_names_are_pinned():
    assert sorted(tabstream.__all__) == sorted([
        "ColumnSchema", "ColumnSelector", "DataError", "Dataset", "ExportError", "Node",
        "NotFittedError", "Schema", "SchemaError", "TabstreamError", "Tags",
        "TransformedDataset", "Workflow", "__version__",
    ])
    for name in tabstream.__all__:
        assert hasattr(tabstream, name)

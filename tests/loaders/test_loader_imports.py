"""``import tabstream.loaders`` stays framework-free, and its public names are pinned."""

from __future__ import annotations

import subprocess
import sys

import tabstream.loaders


def test_core_imports_no_framework() -> None:
    code = ("import sys, tabstream.loaders; "
            "bad = [m for m in ('torch', 'tensorflow', 'keras') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_public_names() -> None:
    assert sorted(tabstream.loaders.__all__) == [
        "Batch", "Layout", "Loader", "ParquetSource", "RankShare", "open_source", "pad_lists",
        "pad_nested", "split_rows",
    ]

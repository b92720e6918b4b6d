"""The documentation site builds with warnings as errors (``make docs``), and the
pieces it is made of hold together."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _extension():
    spec = importlib.util.spec_from_file_location("griffe_doctest_blocks",
                                                  ROOT / "tools" / "griffe_doctest_blocks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                           "-f", str(ROOT / "mkdocs.yml"), "-d", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (tmp_path / "site" / "ops" / "categorical" / "index.html").read_text()
    assert "Encoding (as NVTabular)" in page  # the differences are included, not linked only
    assert "--8&lt;--" not in page
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    assert "inspect_dataset" in api and "schema_from_pbtxt" in api


def test_every_included_section_of_the_differences_exists():
    differences = (DOCS / "nvtabular-differences.md").read_text()
    starts = re.findall(r"\[start:(\w+)\]", differences)
    assert starts == re.findall(r"\[end:(\w+)\]", differences)
    used = set()
    for page in DOCS.rglob("*.md"):
        used |= set(re.findall(r'--8<-- "docs/nvtabular-differences.md:(\w+)"', page.read_text()))
    assert used and used <= set(starts)
    for name in used:
        body = differences.split(f"[start:{name}] -->", 1)[1].split(f"<!-- --8<-- [end:{name}]", 1)[0]
        assert body.strip().startswith("- "), name


def test_doctest_lines_become_code_blocks():
    fence = _extension().fence_doctests
    text = "Text.\n\n    >>> f(x)['a'][0]\n    [0, 1]\n\n    After.\n```\n>>> kept\n```"
    assert fence(text) == ("Text.\n\n    ```pycon\n    >>> f(x)['a'][0]\n    [0, 1]\n    ```\n\n"
                           "    After.\n```\n>>> kept\n```")


def test_sphinx_roles_become_code():
    roles = _extension().plain_roles
    assert roles("raises :class:`~tabstream.core.errors.DataError` or :func:`fit`") == \
        "raises `DataError` or `fit`"


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    others = {"backends.md", "distributed-training.md", "keras-distributed.md",
              "embedding-cache.md", "multi-hot.md", "scaling-out.md"}  # the lead adds these
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} - others
    missing = sorted(p for p in pages if p not in nav)
    assert not missing, f"pages not in mkdocs.yml's nav: {missing}"

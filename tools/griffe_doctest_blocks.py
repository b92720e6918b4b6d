"""A griffe extension for the docs site: the doctest examples of a docstring
(``>>>`` lines, their ``...`` continuations and expected output) are shown as
Python console code blocks, not read as Markdown (where ``x["a"][0]`` would be a
reference link), and Sphinx roles as code. Loaded by mkdocs.yml; the docstrings
themselves are unchanged."""

from __future__ import annotations

import re
from typing import Any

import griffe

# Sphinx roles (:class:`~a.b.C`, :func:`f`) shown as code: ``C``, ``f``
_ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj):`(~?)([^`]+)`")


def plain_roles(text: str) -> str:
    return _ROLE.sub(lambda m: f"`{m.group(2).rsplit('.', 1)[-1] if m.group(1) else m.group(2)}`", text)


def fence_doctests(text: str) -> str:
    """Wrap each run of doctest lines (and the output lines after them) in a
    ```` ```pycon ```` fence, at the run's own indentation (see tests/test_docs.py)."""
    out: list[str] = []
    lines = text.split("\n")
    i, in_fence = 0, False
    while i < len(lines):
        line = lines[i]
        stripped = line.lstrip()
        if stripped.startswith("```"):
            in_fence = not in_fence
        if in_fence or not stripped.startswith(">>>"):
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(stripped)]
        out.append(f"{indent}```pycon")
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            out.append(lines[i])
            i += 1
        out.append(f"{indent}```")
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = plain_roles(fence_doctests(obj.docstring.value))

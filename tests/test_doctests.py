"""Docstring examples run as doctests. ``RUNNABLE`` lists the modules with
examples, each of which builds its own small inputs and shows what really
prints; ``NOT_YET_RUNNABLE`` would hold a module whose examples cannot run yet
(it is empty), so a new module with examples must be put in one of the two
lists."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import tabstream

RUNNABLE = [
    "tabstream.backends",
    "tabstream.backends.arrow",
    "tabstream.core.dtypes",
    "tabstream.core.errors",
    "tabstream.core.graph",
    "tabstream.core.hashing",
    "tabstream.core.jsonfile",
    "tabstream.core.merlin",
    "tabstream.core.scratch",
    "tabstream.datasets.synthetic",
    "tabstream.loaders.batching",
    "tabstream.loaders.layout",
    "tabstream.loaders.options",
    "tabstream.loaders.plan",
    "tabstream.loaders.torch",
    "tabstream.ops.bucketize",
    "tabstream.ops.categorify",
    "tabstream.ops.continuous",
    "tabstream.ops.embedding_sizes",
    "tabstream.ops.groupby",
    "tabstream.ops.hashing",
    "tabstream.ops.joins",
    "tabstream.ops.lists",
    "tabstream.ops.statistics",
    "tabstream.ops.structural",
    "tabstream.ops.tags",
    "tabstream.ops.vocabulary_policy",
    "tabstream.pipeline.dataset",
    "tabstream.pipeline.export",
    "tabstream.pipeline.inspect",
    "tabstream.pipeline.vocabulary_delta",
    "tabstream.pipeline.workflow",
    "tabstream.serving.inputs",
    "tabstream.serving.keras",
    "tabstream.serving.plan",
    "tabstream.serving.torch",
    "tabstream.testing.op_contract",
    "tabstream.testing.tables",
    "tabstream.train.cache_store",
    "tabstream.train.checks",
    "tabstream.train.history",
    "tabstream.train.metrics",
    "tabstream.train.ps_layout",
    "tabstream.train.row_cache",
    "tabstream.train.runner",
    "tabstream.train.sharding",
    "tabstream.train.spec",
    "tabstream.train.tables",
    "tabstream.train.tensorflow",
    "tabstream.train.tensorflow.cache",
    "tabstream.train.tensorflow.continuous",
    "tabstream.train.tensorflow.embeddings",
    "tabstream.train.tensorflow.fit",
    "tabstream.train.tensorflow.models",
    "tabstream.train.torch",
    "tabstream.train.torch.blocks",
    "tabstream.train.torch.cache",
    "tabstream.train.torch.continuous",
    "tabstream.train.torch.distributed",
    "tabstream.train.torch.embeddings",
    "tabstream.train.torch.fit",
    "tabstream.train.torch.metrics",
    "tabstream.train.torch.models",
]

# Modules whose examples cannot run yet; a new module with examples goes in one of the
# two lists. Empty: every example runs.
NOT_YET_RUNNABLE: set[str] = set()

_NEEDS = {"tabstream.train.torch": "torch", "tabstream.train.tensorflow": "tensorflow",
          "tabstream.serving.torch": "torch", "tabstream.serving.keras": "tensorflow"}


@pytest.mark.parametrize("name", RUNNABLE)
def test_docstring_examples(name):
    for prefix, framework in _NEEDS.items():
        if name.startswith(prefix):
            pytest.importorskip(framework)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
                             report=True)
    assert result.attempted > 0, f"{name} has no examples: take it off RUNNABLE"
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} failed"


def test_every_module_with_examples_is_listed():
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    with_examples = set()
    for info in pkgutil.walk_packages(tabstream.__path__, "tabstream."):
        module = importlib.import_module(info.name)
        if any(t.examples for t in doctest.DocTestFinder().find(module)):
            with_examples.add(info.name)
    unlisted = sorted(with_examples - set(RUNNABLE) - NOT_YET_RUNNABLE)
    assert not unlisted, f"modules with docstring examples in neither list: {unlisted}"

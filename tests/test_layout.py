"""The package layout of DESIGN.md: documented names import from their documented
places, modules that moved into ``tabstream.core`` keep their old paths, and imports
point down only (``lint-imports`` checks the whole graph; here, its verdict)."""

import ast
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

DOCUMENTED = {
    "tabstream": ["ColumnSchema", "ColumnSelector", "DataError", "Dataset", "ExportError",
                  "Node", "NotFittedError", "Schema", "SchemaError", "TabstreamError", "Tags",
                  "TransformedDataset", "Workflow"],
    "tabstream.ops": ["Categorify", "HashBucket", "HashedCross", "Normalize", "NormalizeMinMax",
                      "FillMissing", "FillMedian", "Clip", "LogOp", "Bucketize", "LambdaOp",
                      "Rename", "Filter", "Dropna", "ListSlice", "TargetEncoding", "JoinGroupby",
                      "JoinExternal", "DifferenceLag", "ValueCount", "DropLowCardinality",
                      "ReduceDtypeSize", "AddTags", "AddMetadata", "Groupby"],
    "tabstream.core.errors": ["DataError", "ExportError", "NotFittedError", "SchemaError",
                              "TabstreamError"],
    "tabstream.core.schema": ["ColumnSchema", "Schema", "Tags"],
    "tabstream.train": ["TableConfig", "infer_embedding_dim", "table_configs_from_schema"],
    "tabstream.backends": ["registered", "available"],
}

MOVED = {
    "tabstream.errors": "tabstream.core.errors",
    "tabstream.pipeline.schema": "tabstream.core.schema",
    "tabstream.pipeline.dtypes": "tabstream.core.dtypes",
    "tabstream.pipeline.graph": "tabstream.core.graph",
    "tabstream.pipeline.hashing": "tabstream.core.hashing",
    "tabstream.pipeline.merlin": "tabstream.core.merlin",
    "tabstream.ops.base": "tabstream.core.operators",
}


@pytest.mark.parametrize("module", sorted(DOCUMENTED))
def test_documented_names_import_from_their_documented_place(module):
    mod = importlib.import_module(module)
    missing = [name for name in DOCUMENTED[module] if not hasattr(mod, name)]
    assert missing == []


def test_torch_names_import_from_their_documented_place():
    pytest.importorskip("torch")
    from tabstream.loaders.torch import Loader  # noqa: F401
    from tabstream.train.torch import (  # noqa: F401
        DCN,
        DLRM,
        LazyAdam,
        MultiOptimizer,
        TwoTower,
        WideAndDeep,
        embedding_tables_from_schema,
        fit,
        split_embeddings_on_size,
    )


@pytest.mark.parametrize("old", sorted(MOVED))
def test_moved_modules_keep_their_old_path_and_warn(old):
    # the old path is the same module object (so a patch through either is seen by
    # both), keeps its own name and spec, and its first import warns naming the new
    # path; a fresh process, as the first import of a program would be
    new = MOVED[old]
    code = f"""
import importlib, warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    old = importlib.import_module({old!r})
mod = importlib.import_module({new!r})
parent, _, leaf = {old!r}.rpartition(".")
print(old is mod, getattr(importlib.import_module(parent), leaf) is mod, mod.__spec__.name, mod.__file__)
print([str(w.message) for w in seen if w.category is DeprecationWarning])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    same, via_parent, spec, path, warned = out.stdout.splitlines()[0].split(" ") + [out.stdout.splitlines()[1]]
    assert (same, via_parent, spec) == ("True", "True", new)
    assert Path(path).resolve().is_relative_to(ROOT / "tabstream" / "core")
    assert f"{old} moved to {new}; import {new} instead" in warned


def test_a_moved_module_reached_as_an_attribute_warns_too():
    code = ("import warnings, tabstream, tabstream.pipeline, tabstream.ops\n"
            "warnings.simplefilter('error', DeprecationWarning)\n"
            "for parent, leaf in ((tabstream, 'errors'), (tabstream.pipeline, 'schema'), (tabstream.ops, 'base')):\n"
            "    try:\n"
            "        getattr(parent, leaf)\n"
            "    except DeprecationWarning as exc:\n"
            "        print(exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        f"{old} moved to {MOVED[old]}; import {MOVED[old]} instead (the old path will be removed)"
        for old in ("tabstream.errors", "tabstream.pipeline.schema", "tabstream.ops.base")]


def test_core_imports_without_pandas_dask_or_frameworks():
    code = ("import sys, tabstream.core.schema, tabstream.core.dtypes, tabstream.core.errors, "
            "tabstream.core.graph, tabstream.core.operators, tabstream.core.hashing, "
            "tabstream.core.merlin, "
            "tabstream.pipeline;"
            "print(','.join(m for m in ('pandas', 'dask', 'torch', 'tensorflow', 'cudf') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_imports_point_down_only():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    out = subprocess.run([exe, "--config", str(ROOT / "pyproject.toml")], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "layers point down KEPT" in out.stdout


def test_every_all_is_sorted():
    # a module's public names, listed once, in sorted order (issue 29 item 5)
    unsorted = []
    for path in sorted((ROOT / "tabstream").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
                try:
                    names = list(ast.literal_eval(node.value))
                except ValueError:  # built from other names: checked on the module
                    module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                    names = list(importlib.import_module(module).__all__)
                if names != sorted(names) or len(set(names)) != len(names):
                    unsorted.append(str(path.relative_to(ROOT)))
    assert unsorted == []


def _is_module(package: str, name: str) -> bool:
    base = ROOT.joinpath(*package.split("."))
    return (base / f"{name}.py").exists() or (base / name).is_dir()


def test_no_private_name_is_imported_across_modules():
    # a private name (_x) is its module's own: another module that needs it gets a
    # public name (issue 29 item 5); private modules (tabstream.train.tensorflow._autograph)
    # and dunders (__version__) are not names of this kind
    found = []
    for path in sorted((ROOT / "tabstream").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("tabstream"):
                found += [f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                          for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")
                          and not _is_module(node.module, a.name)]
    assert found == []

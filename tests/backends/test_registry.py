"""The backend registry, the choice a Dataset makes once, and the executor handing
that backend to the ops of every partition."""

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
import tabstream.backends as backends
from tabstream import ops
from tabstream.backends.arrow import ArrowBackend
from tabstream.core.errors import BackendUnavailableError

OPS_DIR = Path(__file__).resolve().parents[2] / "tabstream" / "ops"


def test_registry_lists_every_shipped_backend():
    assert backends.registered() == ["arrow", "cudf"]
    expected = ["arrow"] + (["cudf"] if backends.gpu_status() is None else [])
    assert backends.available() == expected


def test_get_returns_one_instance_per_backend():
    assert isinstance(backends.get("arrow"), ArrowBackend)
    assert backends.get("arrow") is backends.get("arrow")
    assert backends.current() is backends.get("arrow")  # outside any ``use``


def test_get_refuses_unknown_names_and_non_strings():
    with pytest.raises(ValueError, match=r"unknown backend 'polars'; registered backends: \['arrow', 'cudf'\]"):
        backends.get("polars")
    with pytest.raises(TypeError, match="a backend is named by a string.*got 3"):
        backends.get(3)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(backends, "gpu_status", lambda: "cudf/cupy do not import (No module named 'cudf')")


@pytest.fixture
def with_gpu(monkeypatch):
    monkeypatch.setattr(backends, "gpu_status", lambda: None)


def test_choose_without_a_gpu(no_gpu):
    assert backends.choose(True) == "arrow"
    assert backends.choose(None) == "arrow"
    with pytest.raises(BackendUnavailableError,
                       match=r"Dataset\(cpu=False\) asks for the GPU \(cudf\) backend, which cannot run "
                             r"here: cudf/cupy do not import \(No module named 'cudf'\)") as info:
        backends.choose(False)
    assert "tabstream[gpu]" in info.value.hint and "tabstream[gpu-cu13]" in info.value.hint and "cpu=True" in info.value.hint
    assert isinstance(info.value, ValueError)  # as Dataset(cpu=False) always raised


def test_choose_with_a_gpu_prefers_cudf_unless_cpu_is_asked(with_gpu):
    assert backends.choose(None) == "cudf"
    assert backends.choose(False) == "cudf"
    assert backends.choose(True) == "arrow"


def test_choose_refuses_a_non_bool():
    with pytest.raises(TypeError, match="cpu must be True, False or None, got str 'gpu'"):
        backends.choose("gpu")


def test_unavailable_backend_says_what_to_install(no_gpu):
    with pytest.raises(BackendUnavailableError, match="the cudf backend cannot run here: cudf/cupy do not import") as info:
        backends.get("cudf")
    assert "pip install 'tabstream[gpu]'" in info.value.hint


def test_cudf_module_imports_without_cudf():
    import tabstream.backends.cudf as cudf_backend

    assert cudf_backend.CudfBackend.name == "cudf" and cudf_backend.CudfBackend.gpu


def test_dataset_chooses_its_backend_once(small_raw, no_gpu):
    assert ts.Dataset(small_raw).backend_name == "arrow"
    assert ts.Dataset(small_raw, cpu=True).backend_name == "arrow"
    with pytest.raises(BackendUnavailableError, match=r"Dataset\(cpu=False\).*cudf"):
        ts.Dataset(small_raw, cpu=False)


class _Recording(ArrowBackend):
    """The arrow kernels, noting which ran (from any dask thread)."""

    name = "recording"

    def __init__(self):
        self.calls = []

    def moments(self, column):
        self.calls.append("moments")
        return super().moments(column)

    def standardize(self, column, mean, std):
        self.calls.append("standardize")
        return super().standardize(column, mean, std)

    def value_counts(self, column):
        self.calls.append("value_counts")
        return super().value_counts(column)

    def encode(self, column, vocabulary):
        self.calls.append("encode")
        return super().encode(column, vocabulary)

    def encode_ids(self, column, vocabulary, start, missing, unknown, index=None):
        self.calls.append("encode_ids")
        return super().encode_ids(column, vocabulary, start, missing, unknown, index)


@pytest.fixture
def recording(monkeypatch):
    rec = _Recording()
    monkeypatch.setitem(backends._REGISTRY, "recording", ("tests", "unused"))
    monkeypatch.setitem(backends._INSTANCES, "recording", rec)
    return rec


def test_ops_run_the_kernels_of_the_datasets_backend(small_raw, recording):
    ds = ts.Dataset(small_raw, part_size=20_000)
    assert ds.npartitions > 1
    ds.backend_name = "recording"
    wf = ts.Workflow((["I2"] >> ops.Normalize()) + (["C1"] >> ops.Categorify()))
    wf.fit(ds)
    n_parts = ds.npartitions
    assert recording.calls.count("moments") == n_parts
    assert recording.calls.count("value_counts") == n_parts
    recording.calls.clear()
    out = wf.transform(ds).compute()
    assert recording.calls.count("standardize") == n_parts and recording.calls.count("encode_ids") == n_parts
    # and the values are the arrow backend's (the recording backend is arrow)
    expected = (small_raw["I2"] - small_raw["I2"].mean()) / small_raw["I2"].std()
    np.testing.assert_allclose(out["I2"].to_numpy(), expected.to_numpy(np.float32), rtol=1e-5)
    # in-memory input runs on the arrow backend, whatever a Dataset chose
    recording.calls.clear()
    wf.transform(pd.DataFrame(small_raw))
    assert recording.calls == []


# -- ops/ stays backend-neutral ------------------------------------------------------
_FORBIDDEN = [
    (r"\bimport\s+(cudf|cupy|dask_cudf)\b|\bfrom\s+(cudf|cupy|dask_cudf)\b", "imports a GPU library"),
    (r"\bcudf\.|\bcupy\.", "calls a GPU library"),
    (r"\bif\b[^\n]*\b(gpu|cudf|cupy|cpu)\b", "branches on the device"),
    (r"\bpandas\.core\b|\bpd\.core\b|\bpandas\._libs\b|\bpd\._libs\b|\._mgr\b|\._values\b",
     "uses pandas internals"),
    (r"\bbackend\(\)\.name\b|\bbackend_name\b|isinstance\([^)]*Backend\)", "branches on the backend"),
]


def _code_lines(path):
    """(line number, text) of ``path`` without comments and docstring-only lines."""
    in_doc = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        stripped = line.strip()
        quotes = stripped.count('"""')
        if in_doc:
            in_doc = quotes % 2 == 0
            continue
        if stripped.startswith('"""'):
            in_doc = quotes == 1
            continue
        yield number, line.split("#", 1)[0]


def test_ops_never_name_a_backend_library_or_branch_on_it():
    found = []
    for path in sorted(OPS_DIR.glob("*.py")):
        for number, code in _code_lines(path):
            for pattern, what in _FORBIDDEN:
                if re.search(pattern, code):
                    found.append(f"{path.name}:{number}: {what}: {code.strip()}")
    assert found == []


def test_the_grep_catches_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text('"""doc naming cudf."""\nimport cudf\nif gpu:\n    x = cupy.zeros(3)\nok = 1  # cudf\n')
    hits = [(n, what) for n, code in _code_lines(bad) for p, what in _FORBIDDEN if re.search(p, code)]
    assert hits == [(2, "imports a GPU library"), (3, "branches on the device"), (4, "calls a GPU library")]


# -- pipeline/ and loaders/ ask their backend, never name one ----------------------------
_PIPELINE_FORBIDDEN = [
    (r"\bbackend_name\s*[!=]=", "compares a backend's name"),
    (r"[\"'](cudf|arrow)[\"']", "names a backend"),
    (r"\btabstream\.backends\.(cudf|arrow)\b", "imports a backend's module"),
    (r"\bimport\s+(cudf|cupy|dask_cudf)\b|\bfrom\s+(cudf|cupy|dask_cudf)\b", "imports a GPU library"),
]


def test_pipeline_and_loaders_never_name_a_backend():
    root = Path(ts.__file__).parent
    found = []
    for folder in ("pipeline", "loaders"):
        for path in sorted((root / folder).glob("*.py")):
            for number, code in _code_lines(path):
                for pattern, what in _PIPELINE_FORBIDDEN:
                    if re.search(pattern, code):
                        found.append(f"{folder}/{path.name}:{number}: {what}: {code.strip()}")
    assert found == []
    bad = root.parent / "does-not-exist"  # the patterns catch what they forbid
    lines = ['if ds.backend_name == "cudf":', "from tabstream.backends.cudf import x", "import cupy"]
    assert [what for line in lines for p, what in _PIPELINE_FORBIDDEN if re.search(p, line)] == [
        "compares a backend's name", "names a backend", "imports a backend's module", "imports a GPU library"]
    assert not bad.exists()


def test_a_dask_frame_is_turned_into_arrow_by_the_backend_whose_frame_it_is():
    # pandas partitions are the arrow backend's; nothing else claims them; a cudf
    # frame is recognised by its type's module, without importing cudf
    frame = pd.DataFrame({"a": [1, 2], "b": ["x", None]})
    assert backends.frame_backend(frame) == "arrow"
    assert backends.frame_to_arrow(frame).to_pydict() == {"a": [1, 2], "b": ["x", None]}
    fake = type("DataFrame", (), {"__module__": "cudf.core.dataframe", "to_arrow": lambda self, **k: None})()
    assert backends.frame_backend(fake) == "cudf"

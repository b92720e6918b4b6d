"""Categorify's candidates (the values below freq_threshold kept for Workflow.update)
held in a memory map of an unlinked temporary file once they pass a size: the same
candidates, updates and saved state as on the heap, and no file left behind."""

from __future__ import annotations

import glob
import importlib.util
import os
import tempfile

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
from tabstream import ops
from tabstream.ops import categorify

_HERE = os.path.dirname(os.path.abspath(__file__))


def _living_vocabulary_tests():
    spec = importlib.util.spec_from_file_location("_lv", os.path.join(_HERE, "test_living_vocabulary.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _leftovers() -> list[str]:
    return glob.glob(os.path.join(tempfile.gettempdir(), "tabstream-candidates-*"))


def _fit(tmp_path, name: str) -> ts.Workflow:
    rng = np.random.default_rng(3)
    values = [f"v{int(x):06d}" for x in rng.zipf(1.3, 20_000) % 50_000]
    values[::11] = [None] * len(values[::11])
    path = tmp_path / f"{name}.parquet"
    pd.DataFrame({"C1": pd.array(values, dtype="str"), "label": range(len(values))}).to_parquet(path)
    wf = ts.Workflow((["C1"] >> ops.Categorify(freq_threshold=4)) + ["label"])
    return wf.fit(ts.Dataset(str(path)))


def _categorify(wf: ts.Workflow):
    return next(n.op for n in wf.output_node.walk() if n.kind == "op" and isinstance(n.op, ops.Categorify))


def test_off_heap_candidates_equal_the_heap_ones(tmp_path, monkeypatch):
    before = set(_leftovers())
    heap = _categorify(_fit(tmp_path, "a")).candidates["C1"]
    monkeypatch.setattr(categorify, "_OFF_HEAP_BYTES", 0)
    allocated = pa.total_allocated_bytes()
    wf = _fit(tmp_path, "b")
    mapped = _categorify(wf).candidates["C1"]
    assert mapped.num_rows > 1000 and mapped.equals(heap)
    # the candidates are not in Arrow's heap (their bytes are the file's)
    assert pa.total_allocated_bytes() - allocated < mapped.nbytes
    assert set(_leftovers()) == before
    # saved and loaded, they come back as they were
    wf.save(str(tmp_path / "wf"))
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    assert _categorify(loaded).candidates["C1"].equals(heap)


def test_updates_with_off_heap_candidates_match_the_reference(tmp_path, monkeypatch):
    monkeypatch.setattr(categorify, "_OFF_HEAP_BYTES", 0)
    before = set(_leftovers())
    lv = _living_vocabulary_tests()
    lv.test_workflow_update_ten_days_against_the_reference(tmp_path, "lru", 0)
    (tmp_path / "saved").mkdir()
    lv.test_save_load_round_trips_state_and_the_delta_chain(tmp_path / "saved")
    assert set(_leftovers()) == before


def test_a_temporary_folder_that_cannot_take_them_keeps_them_on_the_heap(tmp_path, monkeypatch):
    heap = _categorify(_fit(tmp_path, "a")).candidates["C1"]
    monkeypatch.setattr(categorify, "_OFF_HEAP_BYTES", 0)
    # a temporary folder that is not there: mkstemp fails, the table stays as it is
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))
    table = pa.table({"values": ["a", "b"], "counts": [1, 2]})
    assert categorify._off_heap(table) is table
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert _categorify(_fit(tmp_path, "b")).candidates["C1"].equals(heap)

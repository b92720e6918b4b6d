"""VocabularyDelta.write: each update is written once. Two processes writing the same
delta folder at once (both past the first "already exists" check, held there until
both are): exactly one succeeds, the other gets the "already exists" DataError, and
the folder holds the winner's delta whole. A folder left by a write cut short (no
``_delta.json``) is replaced; a complete one never is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest

from tabstream.core.errors import DataError
from tabstream.pipeline.vocabulary_delta import VocabularyChanges, VocabularyDelta

ROOT = Path(__file__).resolve().parents[2]

WRITER = """
    import json, os, sys, time
    import pyarrow as pa
    from tabstream.pipeline.vocabulary_delta import VocabularyChanges, VocabularyDelta

    folder, meet, me, other, value = sys.argv[1:6]

    def meet_the_other():
        # both writers are past write()'s first check before either goes on
        open(os.path.join(meet, me), "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(meet, other)) and time.monotonic() < deadline:
            time.sleep(0.001)

    files = VocabularyDelta.files

    def met(self):
        meet_the_other()
        return files(self)

    VocabularyDelta.files = met
    delta = VocabularyDelta(1, {"C1": VocabularyChanges(
        ("C1",), pa.table({"id": [7], "value": [value]}), pa.table({"id": [7], "value": ["old"]}))})
    try:
        print(json.dumps({"value": value, "ok": True, "path": delta.write(folder)}))
    except Exception as exc:
        print(json.dumps({"value": value, "ok": False, "error": type(exc).__name__, "message": str(exc)}))
"""


def _delta(value: str) -> VocabularyDelta:
    return VocabularyDelta(1, {"C1": VocabularyChanges(
        ("C1",), pa.table({"id": [7], "value": [value]}), pa.table({"id": [7], "value": ["old"]}))})


def test_two_processes_writing_one_delta_one_is_refused(tmp_path):
    folder, meet = tmp_path / "deltas", tmp_path / "meet"
    meet.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(WRITER), str(folder), str(meet),
                               me, other, f"from-{me}"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me, other in (("A", "B"), ("B", "A"))]
    results = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
        results.append(json.loads(stdout.strip().splitlines()[-1]))
    won = [r for r in results if r["ok"]]
    lost = [r for r in results if not r["ok"]]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0]["error"] == "DataError"
    assert "update_00001 already exists; each update is written once" in lost[0]["message"]
    # the folder holds the winner's delta, whole; nothing hidden is left beside it
    back = VocabularyDelta.read(str(folder / "update_00001"))
    assert back["C1"].admitted.to_pylist() == [{"id": 7, "value": won[0]["value"]}]
    assert back["C1"].evicted.to_pylist() == [{"id": 7, "value": "old"}]
    assert sorted(os.listdir(folder)) == ["update_00001"]


def test_a_write_cut_short_is_replaced_a_complete_delta_is_not(tmp_path):
    folder = tmp_path / "deltas"
    cut = folder / "update_00001"
    cut.mkdir(parents=True)
    (cut / "000_C1.parquet").write_bytes(b"half a file")  # no _delta.json: cut short
    _delta("first").write(str(folder))
    assert VocabularyDelta.read(str(cut))["C1"].admitted["value"].to_pylist() == ["first"]
    with pytest.raises(DataError, match=r"update_00001 already exists; each update is written once"):
        _delta("second").write(str(folder))
    assert VocabularyDelta.read(str(cut))["C1"].admitted["value"].to_pylist() == ["first"]
    assert sorted(os.listdir(folder)) == ["update_00001"]

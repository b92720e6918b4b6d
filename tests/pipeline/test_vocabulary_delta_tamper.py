"""Vocabulary delta folders whose parquet file or ``_delta.json`` was damaged or
edited, or written by a newer tabstream: refused by ``VocabularyDelta.read`` and
``Workflow.load`` with the file, the column or field and the value named (a delta
that lost a recycled id would leave that id's embedding row trained for another
value). The expected recycled ids are computed a second way, with Python sets."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.pipeline.vocabulary_delta import VocabularyChanges, VocabularyDelta
from tabstream.train.cache_store import ParameterServer, initial_rows
from tabstream.train.tables import TableConfig

# evicted rows first, then admitted, as the file lists them: the last row admits id 5
EVICTED = [(4, "b"), (5, "c")]
ADMITTED = [(9, "g"), (4, "d"), (5, "e")]


def _write(tmp_path):
    changes = VocabularyChanges(
        ("s",), pa.table({"id": [i for i, _ in ADMITTED], "value": [v for _, v in ADMITTED]}),
        pa.table({"id": [i for i, _ in EVICTED], "value": [v for _, v in EVICTED]}))
    return VocabularyDelta(1, {"s": changes}).write(str(tmp_path / "deltas"))


def _parquet(folder):
    (file,) = [p for p in Path(folder).iterdir() if p.suffix == ".parquet"]
    return file


def test_an_intact_delta_resets_exactly_its_recycled_rows(tmp_path):
    folder = _write(tmp_path)
    recycled = sorted({i for i, _ in EVICTED} & {i for i, _ in ADMITTED})
    delta = VocabularyDelta.read(folder)
    assert delta["s"].recycled.tolist() == recycled
    ps = ParameterServer(tmp_path / "ps", [TableConfig("s", 16, 4, ("s",))], seed=0)
    ps.apply("s", np.arange(16), np.ones((16, 4), np.float32))
    before = ps.lookup("s", np.arange(16))
    ps.apply_vocabulary_delta(delta)
    after = ps.lookup("s", np.arange(16))
    expected = before.copy()
    expected[recycled] = initial_rows(0, "s", np.array(recycled), 4, 0.05)
    np.testing.assert_array_equal(after, expected)
    ps.close()


def _rewrite(edit):
    def run(folder):
        path = _parquet(folder)
        pq.write_table(edit(pq.read_table(path)), path)
    return run


def _column(name, values, type_=None):
    return _rewrite(lambda t: t.set_column(t.column_names.index(name), name, pa.array(values, type_)))


def _doc(edit):
    def run(folder):
        path = f"{folder}/_delta.json"
        with open(path) as f:
            doc = json.load(f)
        edit(doc)
        with open(path, "w") as f:
            json.dump(doc, f)
    return run


_FILE = r"000_s\.parquet"
_FIELD = r"_delta\.json \(field 'vocabularies\.s\.{}'\)"

CASES = [
    ("last row lost", _rewrite(lambda t: t.slice(0, t.num_rows - 1)),
     _FILE + r" holds 2 admitted ids, but .*" + _FIELD.format("admitted") + " says 3"),
    ("emptied", _rewrite(lambda t: t.slice(0, 0)),
     _FILE + r" holds 0 admitted ids, but .*" + _FIELD.format("admitted") + " says 3"),
    ("an id shifted by 100", _column("id", [104, 5, 9, 4, 5], pa.int64()),
     _FILE + r" holds 1 recycled ids, but .*" + _FIELD.format("recycled") + " says 2"),
    ("an unknown change", _column("change", ["evicted", "x", "admitted", "admitted", "admitted"]),
     _FILE + r": column 'change' holds 'x' in row 1, expected 'evicted' or 'admitted'"),
    ("a missing change", _column("change", ["evicted", None, "admitted", "admitted", "admitted"],
                                 pa.string()),
     _FILE + r": column 'change' holds None in row 1, expected 'evicted' or 'admitted'"),
    ("a negative id", _column("id", [-1, 5, 9, 4, 5], pa.int64()),
     _FILE + r": column 'id' holds -1 in row 0, expected an id >= 0"),
    ("an id admitted twice", _column("id", [4, 5, 9, 4, 4], pa.int64()),
     _FILE + r": id 4 is admitted in more than one row"),
    ("a count not a number", _doc(lambda d: d["vocabularies"]["s"].__setitem__("admitted", "3")),
     _FIELD.format("admitted") + r" is '3', expected the number of admitted ids"),
    ("a count edited", _doc(lambda d: d["vocabularies"]["s"].__setitem__("recycled", 1)),
     _FILE + r" holds 2 recycled ids, but .*" + _FIELD.format("recycled") + " says 1"),
    ("a newer version", _doc(lambda d: d.__setitem__("version", 2)),
     r"_delta\.json: unknown vocabulary delta format version 2; this tabstream \(.*\) reads "
     r"version 1; it was written by a newer tabstream, upgrade to read it"),
    ("no version", _doc(lambda d: d.pop("version")),
     r"_delta\.json: unknown vocabulary delta format version None; this tabstream \(.*\) reads "
     r"version 1$"),
    ("version true", _doc(lambda d: d.__setitem__("version", True)),
     r"_delta\.json: unknown vocabulary delta format version True"),
]


@pytest.mark.parametrize(("edit", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_or_newer_delta_is_refused_naming_file_and_field(tmp_path, edit, expected):
    folder = _write(tmp_path)
    edit(folder)
    with pytest.raises(DataError, match=expected):
        VocabularyDelta.read(folder)


def test_a_saved_workflow_whose_delta_lost_a_row_or_is_newer_is_refused(tmp_path):
    day1 = pd.DataFrame({"s": ["a", "b", "a", "c"] * 5})
    day2 = pd.DataFrame({"s": ["a", "d", "d", "e", "f"] * 4})
    wf = ts.Workflow(["s"] >> ops.Categorify(max_size=6, eviction="lru"))
    wf.fit(day1)
    wf.update(day2)
    wf.save(str(tmp_path / "wf"))
    (folder,) = (tmp_path / "wf" / "vocabulary").iterdir()
    saved = pq.read_table(_parquet(folder))
    # a second way: recycled ids are those both evicted and admitted in the saved file
    rows = saved.to_pylist()
    recycled = sorted({r["id"] for r in rows if r["change"] == "evicted"}
                      & {r["id"] for r in rows if r["change"] == "admitted"})
    assert ts.Workflow.load(str(tmp_path / "wf")).vocabulary_deltas[0]["s"].recycled.tolist() == recycled
    assert recycled and rows[-1]["change"] == "admitted" and rows[-1]["id"] in recycled
    pq.write_table(saved.slice(0, saved.num_rows - 1), _parquet(folder))
    admitted = sum(r["change"] == "admitted" for r in rows)
    with pytest.raises(DataError, match=_FILE + rf" holds {admitted - 1} admitted ids, but .*"
                                        + _FIELD.format("admitted") + f" says {admitted}"):
        ts.Workflow.load(str(tmp_path / "wf"))
    pq.write_table(saved, _parquet(folder))
    _doc(lambda d: d.__setitem__("version", 2))(str(folder))
    with pytest.raises(DataError, match=r"update_00001/_delta\.json: unknown vocabulary delta format "
                                        r"version 2; .* written by a newer tabstream, upgrade"):
        ts.Workflow.load(str(tmp_path / "wf"))

"""Living vocabularies (Workflow.update, vocabulary deltas, tables that follow
them) given what they cannot use: an unfitted or non-updatable workflow, another
day's columns or dtypes, a damaged delta chain, deltas out of order, ids beyond a
table."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.train.cache_store import ParameterServer, vocabulary_resets
from tabstream.train.tables import TableConfig


def _day(tmp, name, values, **extra):
    path = tmp / f"{name}.parquet"
    pd.DataFrame({"C1": pd.array(values, dtype="str"), "I1": np.arange(len(values), dtype=np.float64),
                  **extra}).to_parquet(path)
    return str(path)


def _fitted(tmp, **kwargs):
    wf = ts.Workflow(["C1"] >> ops.Categorify(freq_threshold=2, max_size=5, **kwargs))
    return wf.fit(ts.Dataset(_day(tmp, "d0", list("aabbc"))))


def _saved(tmp, updates=2):
    wf = _fitted(tmp)
    for i in range(updates):
        wf.update(ts.Dataset(_day(tmp, f"d{i + 1}", list("ccddee")[i:])))
    wf.save(str(tmp / "wf"))
    return tmp / "wf"


def _unfitted(tmp):
    ts.Workflow(["C1"] >> ops.Categorify()).update(ts.Dataset(_day(tmp, "d", ["a"])))


def _normalize_in_graph(tmp):
    wf = ts.Workflow((["C1"] >> ops.Categorify()) + (["I1"] >> ops.Normalize()))
    wf.fit(ts.Dataset(_day(tmp, "d0", list("ab"))))
    wf.update(ts.Dataset(_day(tmp, "d1", list("cd"))))


def _missing_column(tmp):
    wf = _fitted(tmp)
    path = tmp / "other.parquet"
    pd.DataFrame({"C2": ["a"]}).to_parquet(path)
    wf.update(ts.Dataset(str(path)))


def _other_dtype(tmp):
    wf = _fitted(tmp)
    path = tmp / "ints.parquet"
    pd.DataFrame({"C1": [1, 2], "I1": [0.0, 1.0]}).to_parquet(path)
    wf.update(ts.Dataset(str(path)))


def _single_table(tmp):
    wf = ts.Workflow(["C1", "C2"] >> ops.Categorify(single_table=True))
    wf.fit(ts.Dataset(_day(tmp, "d0", list("ab"), C2=["x", "y"])))
    wf.update(ts.Dataset(_day(tmp, "d1", list("cd"), C2=["x", "z"])))


def _delta_not_json(tmp):
    folder = _saved(tmp)
    (folder / "vocabulary" / "update_00001" / "_delta.json").write_text("{nope")
    ts.Workflow.load(str(folder))


def _delta_folder_missing(tmp):
    folder = _saved(tmp)
    doc = json.loads((folder / "workflow.json").read_text())
    doc["vocabulary_deltas"].append("update_00003")
    (folder / "workflow.json").write_text(json.dumps(doc))
    ts.Workflow.load(str(folder))


def _delta_name_odd(tmp):
    folder = _saved(tmp)
    doc = json.loads((folder / "workflow.json").read_text())
    doc["vocabulary_deltas"][0] = "../stats"
    (folder / "workflow.json").write_text(json.dumps(doc))
    ts.Workflow.load(str(folder))


def _delta_file_columns(tmp):
    folder = _saved(tmp)
    delta = folder / "vocabulary" / "update_00001"
    entry = next(iter(json.loads((delta / "_delta.json").read_text())["vocabularies"].values()))
    pd.DataFrame({"key": [1]}).to_parquet(delta / entry["file"])
    ts.Workflow.load(str(folder))


def _updates_disagree(tmp):
    folder = _saved(tmp)
    doc = json.loads((folder / "workflow.json").read_text())
    doc["vocabulary_deltas"] = doc["vocabulary_deltas"][:1]
    (folder / "workflow.json").write_text(json.dumps(doc))
    ts.Workflow.load(str(folder))


def _delta_skipped(tmp):
    wf = _fitted(tmp)
    wf.update(ts.Dataset(_day(tmp, "d1", list("ccdd"))))
    second = wf.update(ts.Dataset(_day(tmp, "d2", list("eeff"))))
    ps = ParameterServer(tmp / "ps", [TableConfig("C1", 5, 2, ("C1",))])
    try:
        ps.apply_vocabulary_delta(second)
    finally:
        ps.close()


def _id_beyond_table(tmp):
    ps = ParameterServer(tmp / "ps", [TableConfig("C1", 4, 2, ("C1",))])
    try:
        ps.apply_vocabulary_delta({"C1": [9]})
    finally:
        ps.close()


def _delta_folder_empty(tmp):
    (tmp / "update_00001").mkdir()
    ps = ParameterServer(tmp / "ps", [TableConfig("C1", 4, 2, ("C1",))])
    try:
        ps.apply_vocabulary_delta(tmp / "update_00001")
    finally:
        ps.close()


def _resets_of_a_list(tmp):
    vocabulary_resets([3, 4], {"C1": ("C1",)})


def _good_update_round_trip(tmp):
    """Worked by hand: fit a2 b2 c1 with room for 2 values: a 3, b 4 (c a candidate).
    Update 1 (c2 d2 e2): c 3 d 2 e 2 all reach 2; a and b, not seen, are evicted (a
    first: equal last update and count, by value) and c, d take ids 3, 4; e waits.
    Update 2 (c1 d2 e2): e reaches 4, but c and d were seen: nothing to evict."""
    folder = _saved(tmp)
    loaded = ts.Workflow.load(str(folder))
    ids = loaded.transform(pd.DataFrame({"C1": pd.array(list("abcde"), dtype="str")}))["C1"].tolist()
    assert ids == [2, 2, 3, 4, 2]
    assert [d.summary()["C1"] for d in loaded.vocabulary_deltas] == [
        {"admitted": 2, "evicted": 2, "recycled": 2}, {"admitted": 0, "evicted": 0, "recycled": 0}]


WF = r"workflow\.json: "
CASES = [
    ("update before fit", _unfitted, NotFittedError, r"workflow is not fitted; call fit\(dataset\) first"),
    ("update with Normalize", _normalize_in_graph, ValueError,
     r"Normalize \(node \d+\) cannot update their statistics .*pass others='keep'"),
    ("update lacks a column", _missing_column, SchemaError, r"lacks the columns \['C1'\] the workflow was fitted on"),
    ("update of another dtype", _other_dtype, SchemaError,
     r"column 'C1' of .* is int64, but the workflow was fitted on string; read it with the fitted dtype"),
    ("update of single_table", _single_table, ValueError, r"Categorify\(single_table=True\) cannot update"),
    ("eviction unknown", lambda tmp: ops.Categorify(eviction="lfu"), ValueError,
     r"Categorify: eviction must be one of \('lru', 'decay'\)"),
    ("window 0", lambda tmp: ops.Categorify(window=0), ValueError,
     r"Categorify: window must be a positive number of updates, got 0"),
    ("decay 0", lambda tmp: ops.Categorify(eviction="decay", decay=0), ValueError,
     r"Categorify: decay must be a number in \(0, 1\], got 0"),
    ("delta json damaged", _delta_not_json, DataError, r"update_00001/_delta\.json: not a vocabulary delta file"),
    ("delta folder missing", _delta_folder_missing, DataError,
     r"update_00003 holds no vocabulary delta \(.*_delta\.json is missing\)"),
    ("delta name leaves the folder", _delta_name_odd, DataError,
     WF + r"field 'vocabulary_deltas' must list delta names such as 'update_00001', found \['\.\./stats'"),
    ("delta file without its columns", _delta_file_columns, DataError,
     r"a vocabulary delta file has columns id, value, change; found \['key'\]"),
    ("updates disagree with the chain", _updates_disagree, DataError,
     WF + r"node \d+: Categorify was updated 2 times, but the workflow lists 1 vocabulary deltas"),
    ("delta applied out of order", _delta_skipped, DataError,
     r"update_00002 follows update_00001, but the last delta this server applied is update_00000"),
    ("reset id beyond the table", _id_beyond_table, ValueError, r"table 'C1': id 9 is out of range; the table has 4 rows"),
    ("delta folder empty", _delta_folder_empty, DataError, r"update_00001 holds no vocabulary delta"),
    ("delta of the wrong type", _resets_of_a_list, TypeError,
     r"a vocabulary delta is a VocabularyDelta, the folder of one or a mapping \{table: ids\}, got list"),
    ("saved chain loads", _good_update_round_trip, None, None),
]

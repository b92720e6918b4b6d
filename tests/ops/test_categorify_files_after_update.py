"""Categorify(out_path=...)'s id -> value files (``categories/unique.<name>.parquet``,
``op.categories``: row ``i`` is id ``start + i``) describe the ids ``transform`` emits
after ``Workflow.update`` recycles ids, after a save and load, and after an update
that is rolled back. The reference is plain pandas: each value's id from
``transform``, its count from ``value_counts`` of the days it was counted in."""

from __future__ import annotations

import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError

# capacity 3 (max_size 6 - 3 reserved ids): the update evicts b and c (not seen
# since the fit) and recycles their ids for x and y; a is seen again and stays
DAY0 = pd.DataFrame({"C": ["a"] * 5 + ["b"] * 4 + ["c"] * 3, "N": [7] * 6 + [8] * 4 + [9] * 2})
DAY1 = pd.DataFrame({"C": ["x"] * 6 + ["y"] * 5 + ["a"] * 2, "N": [5] * 7 + [6] * 4 + [7] * 2})
START = 3  # first vocabulary id (0 padding, 1 missing, 2 out of vocabulary)


def _categorify(tmp_path, eviction: str) -> ops.Categorify:
    return ops.Categorify(max_size=6, eviction=eviction, out_path=str(tmp_path / "stats"))


def _file_matches_transform(wf: ts.Workflow, op: ops.Categorify, days: list[pd.DataFrame],
                            paths: dict[str, str] | None = None) -> None:
    """Each file's row for id ``i`` is the value ``transform`` gives id ``i``, with the
    count pandas finds for it in ``days``; and the file lists exactly those values.
    ``paths``: the files to read (default: ``op.categories``, which may write them)."""
    for col in ("C", "N"):
        values = pd.concat([d[col] for d in days]).drop_duplicates().tolist()
        probe = pd.DataFrame({c: values if c == col else [DAY0[c][0]] * len(values) for c in ("C", "N")})
        ids = wf.transform(probe)[col].tolist()
        expected = {i: v for v, i in zip(values, ids, strict=True) if i >= START}
        written = pd.read_parquet((paths or op.categories)[col])
        by_id = {START + row: v for row, v in enumerate(written[col].tolist())}
        assert by_id == expected, col
        counts = pd.concat([d[col] for d in days]).value_counts()
        assert written[f"{col}_size"].tolist() == [int(counts[v]) for v in written[col]], col
        # the op's own reverse mapping says the same
        mapping = op.reverse_mapping(col).to_pandas()
        assert dict(zip(mapping["id"], mapping["value"], strict=True)) == expected, col


@pytest.mark.parametrize("eviction", ["lru", "decay"])
def test_files_follow_an_update_that_recycles_ids(tmp_path, eviction):
    op = _categorify(tmp_path, eviction)
    wf = ts.Workflow(["C", "N"] >> op).fit(ts.Dataset(DAY0))
    _file_matches_transform(wf, op, [DAY0])
    delta = wf.update(ts.Dataset(DAY1))
    assert delta["C"].recycled.tolist()  # ids were given to new values
    _file_matches_transform(wf, op, [DAY0, DAY1])
    assert op.stats_files == {f"unique.{c}": op.categories[c] for c in ("C", "N")}


def test_a_loaded_workflow_lists_files_that_match_it(tmp_path):
    op = _categorify(tmp_path, "lru")
    wf = ts.Workflow(["C", "N"] >> op).fit(ts.Dataset(DAY0))
    wf.update(ts.Dataset(DAY1))
    wf.save(str(tmp_path / "wf"))
    # the folder's files describe another vocabulary now (another job's fit into the
    # same out_path): a loaded workflow must not point at them as its own
    other = ts.Workflow(["C", "N"] >> _categorify(tmp_path, "lru")).fit(ts.Dataset(DAY1))
    assert pd.read_parquet(other.output_node.op.categories["C"])["C"].tolist() == ["x", "y", "a"]
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    lop = loaded.output_node.op
    assert set(lop.stats_files) == {"unique.C", "unique.N"}
    _file_matches_transform(loaded, lop, [DAY0, DAY1])


def test_an_update_rolled_back_leaves_the_files_of_the_fit(tmp_path):
    op = _categorify(tmp_path, "lru")
    wf = ts.Workflow(["C", "N"] >> op).fit(ts.Dataset(DAY0))
    wf.update(ts.Dataset(DAY1), delta_dir=str(tmp_path / "deltas"))
    again = ts.Workflow(["C", "N"] >> _categorify(tmp_path, "lru")).fit(ts.Dataset(DAY0))
    paths = dict(again.output_node.op.categories)
    # update_00001 is in delta_dir already: this update fails and is undone, its
    # files with it (read by path: nothing asks the op first)
    with pytest.raises(DataError, match="update_00001 already exists"):
        again.update(ts.Dataset(DAY1), delta_dir=str(tmp_path / "deltas"))
    _file_matches_transform(again, again.output_node.op, [DAY0], paths)

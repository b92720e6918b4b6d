"""Online transforms: a fitted workflow applied to each row group as it is read
gives the batches of transforming offline and loading the result."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, NotFittedError
from tabstream.core.operators import Operator
from tabstream.loaders import Loader

FILE_ROWS = (400, 130, 271)
ROW_GROUP = 90


def _raw(start: int, n: int) -> pa.Table:
    rng = np.random.default_rng(start)
    ids = np.arange(start, start + n)
    cont = rng.normal(3.0, 2.0, n)
    cont[rng.random(n) < 0.1] = np.nan
    cats = np.array(["a", "b", "c", "d", None], dtype=object)[rng.integers(0, 5, n)]
    return pa.table({"row_id": ids, "cat": pa.array(cats, pa.string()),
                     "city": pa.array([f"c{i % 13}" for i in ids]),
                     "x": pa.array(cont, pa.float64()), "label": ids % 2})


@pytest.fixture(scope="module")
def raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("raw")
    start = 0
    for i, n in enumerate(FILE_ROWS):
        pq.write_table(_raw(start, n), path / f"part_{i}.parquet", row_group_size=ROW_GROUP)
        start += n
    return path


def _workflow(raw: Path) -> ts.Workflow:
    cats = ["cat"] >> ops.Categorify()
    hashed = ["city"] >> ops.HashBucket(7)
    conts = ["x"] >> ops.FillMissing(0.0) >> ops.Normalize()
    wf = ts.Workflow(cats + hashed + conts + ["row_id", "label"])
    return wf.fit(ts.Dataset(str(raw), engine="parquet"))


def _offline(raw: Path, wf: ts.Workflow, out: Path) -> Path:
    """Transform each file with the workflow's table transform, keeping its row
    groups, and write it where a loader reads it (the simpler, offline way)."""
    out.mkdir()
    files = []
    for f in sorted(raw.glob("*.parquet")):
        table = wf.transform_table(pq.read_table(f))
        pq.write_table(table, out / f.name, row_group_size=ROW_GROUP)
        files.append({"path": f.name, "num_rows": table.num_rows})
    wf.output_schema.to_json(str(out / "_schema.json"))
    (out / "_manifest.json").write_text(json.dumps(
        {"num_rows": sum(x["num_rows"] for x in files), "files": files}))
    return out


def _batches(loader: Loader) -> list:
    return [(f, y) for f, y in loader]


@pytest.mark.parametrize("how", ["transform", "transforms="])
@pytest.mark.parametrize("w", [1, 2])
def test_online_equals_offline(raw: Path, tmp_path: Path, how: str, w: int) -> None:
    wf = _workflow(raw)
    offline = _offline(raw, wf, tmp_path / "offline")
    ds = ts.Dataset(str(raw), engine="parquet")
    all_ids = []
    for rank in range(w):
        kw = {"seed": 5, "global_size": w, "global_rank": rank, "parts_per_chunk": 2,
              "labels": ["label"], "shuffle": True}
        online = (Loader(wf.transform(ds), 64, **kw) if how == "transform"
                  else Loader(ds, 64, transforms=wf, **kw))
        want_loader = Loader(offline, 64, **kw)
        assert online.feature_names == want_loader.feature_names
        assert len(online) == len(want_loader)
        for _ in range(2):  # two epochs, each shuffled differently
            got, want = _batches(online), _batches(want_loader)
            assert len(got) == len(want)
            for (gf, gy), (wf_, wy) in zip(got, want, strict=True):
                assert gf.keys() == wf_.keys()
                for name in gf:
                    assert gf[name].dtype == wf_[name].dtype
                    np.testing.assert_array_equal(gf[name], wf_[name])
                np.testing.assert_array_equal(gy, wy)
                all_ids.append(gf["row_id"])
    # every row exactly once per epoch across ranks (two epochs)
    ids = np.sort(np.concatenate(all_ids))
    assert np.array_equal(ids, np.repeat(np.arange(sum(FILE_ROWS)), 2))


def test_online_values_match_the_workflow_on_the_whole_frame(raw: Path) -> None:
    wf = _workflow(raw)
    ds = ts.Dataset(str(raw), engine="parquet")
    whole = wf.transform(pa.concat_tables(pq.read_table(f) for f in sorted(raw.glob("*.parquet"))))
    whole = whole.sort_by("row_id")
    train, _ = ds.split([0.7, 0.3], seed=1)
    seen = []
    for features, labels in Loader(wf.transform(train), 100, seed=2, labels=["label"],
                                   shuffle=True):
        want = whole.take(features["row_id"])
        for name in ("cat", "city", "x"):
            np.testing.assert_array_equal(features[name], want[name].to_numpy())
        np.testing.assert_array_equal(labels, want["label"].to_numpy())
        seen.append(features["row_id"])
    # the split's rows only, each once
    seen = np.concatenate(seen)
    assert len(seen) == len(set(seen.tolist())) == train.num_rows


def test_unfitted_workflow_is_refused(raw: Path) -> None:
    wf = ts.Workflow(["cat"] >> ops.Categorify())
    with pytest.raises(NotFittedError, match=r"the workflow given to the loader is not fitted "
                                             r".*need workflow.fit\(train_dataset\) first"):
        Loader(str(raw), 10, transforms=wf, shuffle=True)


@pytest.mark.parametrize("op", [ops.Dropna(), ops.Filter(lambda df: df["x"] > 0)])
def test_row_changing_ops_are_refused(raw: Path, op) -> None:
    wf = ts.Workflow(["x", "label"] >> op).fit(ts.Dataset(str(raw), engine="parquet"))
    name = type(op).__name__
    with pytest.raises(ValueError, match=rf"the workflow given to the loader holds \['{name}'\], "
                                         r"which change the number of rows"):
        Loader(str(raw), 10, transforms=wf, shuffle=True)


class _EveryOtherRow(Operator):
    """An op of a user's own (not registered: the name starts with "_") that drops
    every other row and says so."""

    changes_row_count = True

    def transform(self, table: pa.Table) -> pa.Table:
        return table.take(np.arange(0, table.num_rows, 2))


def test_an_op_declaring_changes_row_count_is_refused_whatever_its_name(raw: Path) -> None:
    # the loader asks the op (Operator.changes_row_count), not a list of class names
    wf = ts.Workflow(["x", "label"] >> _EveryOtherRow()).fit(ts.Dataset(str(raw), engine="parquet"))
    assert wf.transform(_raw(0, 10)).num_rows == 5
    with pytest.raises(ValueError, match=r"the workflow given to the loader holds \['_EveryOtherRow'\], "
                                         r"which change the number of rows"):
        Loader(str(raw), 10, transforms=wf, shuffle=True)


def test_an_inner_join_dropping_rows_is_refused_when_it_drops_them(raw: Path) -> None:
    # JoinExternal keeps changes_row_count False: with how="left" and unique side keys
    # (the usual case) it keeps every row, so the loader accepts it; an inner join
    # that drops rows of a row group is refused when that row group is read, naming it
    side = pa.table({"label": [1], "weight": [0.5]})
    left = ts.Workflow(["label", "x"] >> ops.JoinExternal(side, on="label"))
    left.fit(ts.Dataset(str(raw), engine="parquet"))
    assert sum(len(b[1]) for b in Loader(str(raw), 50, transforms=left, labels=["label"])) == sum(FILE_ROWS)
    inner = ts.Workflow(["label", "x"] >> ops.JoinExternal(side, on="label", how="inner"))
    inner.fit(ts.Dataset(str(raw), engine="parquet"))
    dropped = 45  # the rows of row group 0 (ids 0..89) whose label (id % 2) is 0
    with pytest.raises(DataError, match=rf"the loader's transforms turned the 90 rows of row group 0 of "
                                        rf"'[^']*part_0.parquet' into {90 - dropped}; online transforms must "
                                        "keep every row"):
        for _ in Loader(str(raw), 50, transforms=inner, labels=["label"], shuffle=False):
            pass  # the error comes while iterating


def test_groupby_transform_is_refused(raw: Path) -> None:
    wf = ts.Workflow(["cat", "x"] >> ops.Groupby("cat", aggs={"x": ["sum"]}))
    wf.fit(ts.Dataset(str(raw), engine="parquet"))
    with pytest.raises(ValueError, match=r"holds \['Groupby'\], which change the number of rows"):
        Loader(wf.transform(ts.Dataset(str(raw), engine="parquet")), 10, shuffle=True)


def test_transforms_twice_and_wrong_type(raw: Path) -> None:
    wf = _workflow(raw)
    ds = ts.Dataset(str(raw), engine="parquet")
    with pytest.raises(ValueError, match=r"data is already workflow.transform\(dataset\)"):
        Loader(wf.transform(ds), 10, transforms=wf, shuffle=True)
    with pytest.raises(TypeError, match=r"transforms must be a fitted tabstream.Workflow, got dict"):
        Loader(ds, 10, transforms={"x": 1}, shuffle=True)


def test_a_transform_failing_on_a_chunk_names_it(raw: Path) -> None:
    def boom(col):
        if len(col):
            raise ValueError("bad chunk")
        return col

    wf = ts.Workflow(["x"] >> ops.LambdaOp(boom)).fit(ts.Dataset(str(raw), engine="parquet"))
    loader = Loader(str(raw), 10, transforms=wf, shuffle=False)
    with pytest.raises(DataError, match=r"the loader's transforms failed on row group 0 of "
                                        r"'.*part_0.parquet': .*bad chunk"):
        next(iter(loader))

"""Workflow.fit refuses statistics ops left with no rows (issue 27, item 7 of the
issue / item 4 of this round): by an empty dataset, or by a Filter or Dropna of the
workflow that removes every row before them; the error names the dataset, the
statistics op and the op that removed the rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError


def frame(n: int = 200) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({"c": np.array(["a", "b", "c"], dtype=object)[rng.integers(0, 3, n)],
                         "v": rng.normal(size=n), "w": np.arange(n, dtype="float64")})


def none_pass(df):
    return df["w"] < 0


def late_rows(df):
    return df["w"] >= 190  # only the last partition keeps rows


def test_filter_removing_every_row_before_categorify(tmp_path):
    ds = ts.Dataset(frame(), part_size=800)
    assert ds.npartitions > 1
    wf = ts.Workflow(["c", "w"] >> ops.Filter(none_pass) >> ops.Categorify())
    with pytest.raises(DataError, match=r"cannot fit the workflow on Dataset\(.*npartitions=\d+\): Categorify "
                                        r"\(node \d+\) has no rows to fit on after Filter\(f='none_pass'\) \(node \d+\), "
                                        r"which removed all 200 rows of its input; a workflow fitted on no rows") as info:
        wf.fit(ds)
    assert "check the Filter's function" in info.value.hint
    with pytest.raises(Exception, match="not fitted"):
        wf.save(str(tmp_path / "wf"))


def test_dropna_removing_every_row_and_only_that_branch_is_named():
    df = frame()
    df["n"] = np.nan
    ds = ts.Dataset(df, part_size=800)
    kept = ["c"] >> ops.Categorify()
    emptied = ["n", "v"] >> ops.Dropna() >> ops.Normalize()
    with pytest.raises(DataError, match=r"Normalize \(node \d+\) has no rows to fit on after Dropna\(\) "
                                        r"\(node \d+\), which removed all 200 rows"):
        ts.Workflow(kept + emptied).fit(ds)


def test_second_level_statistics_after_a_filter():
    """The statistics op after the filter is fitted in the second pass; the first
    pass's op had rows."""
    ds = ts.Dataset(frame(), part_size=800)
    node = ["v", "w"] >> ops.Normalize() >> ops.Filter(lambda df: df["w"] > 1e9) >> ops.Normalize()
    with pytest.raises(DataError, match=r"Normalize \(node \d+\) has no rows to fit on after Filter\(f=.*<lambda>.*\) "
                                        r"\(node \d+\), which removed all 200 rows"):
        ts.Workflow(node).fit(ds)


def test_an_empty_dataset_is_refused_as_before(tmp_path):
    path = tmp_path / "empty.parquet"
    frame(0).to_parquet(path, index=False)
    with pytest.raises(DataError, match=r"cannot fit the workflow on Dataset\(.*empty\.parquet.*\): it has no rows"):
        ts.Workflow(["v"] >> ops.Normalize()).fit(ts.Dataset(str(path)))


def test_rows_in_one_partition_only_fit_as_pandas():
    df = frame()
    ds = ts.Dataset(df, part_size=800)
    wf = ts.Workflow(["v", "w"] >> ops.Filter(late_rows) >> ops.Normalize()).fit(ds)
    out = wf.transform(df)
    kept = df[df["w"] >= 190]
    expected = (kept["v"] - kept["v"].mean()) / kept["v"].std()  # Normalize: sample std, float32
    np.testing.assert_allclose(out["v"].to_numpy(), expected.to_numpy(), rtol=1e-5)
    assert len(out) == 10

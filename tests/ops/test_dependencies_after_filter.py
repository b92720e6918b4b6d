"""Ops that read columns besides their selection (NVTabular's dependencies:
TargetEncoding's target, JoinGroupby's cont_cols, DifferenceLag's partition columns,
Groupby's keys) after an op that drops rows (Dropna, Filter). When the selection already
holds the dependency, the op reads the kept rows' values: before, the raw column was put
beside the filtered ones and the workflow failed on their row counts. A dependency the
selection does not hold is still refused with that message."""

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import SchemaError


@pytest.fixture
def frame() -> pd.DataFrame:
    rng = np.random.default_rng(8)
    n = 3000
    x = rng.normal(size=n)
    x[rng.random(n) < 0.2] = np.nan
    return pd.DataFrame({"k": rng.integers(0, 40, n), "x": x, "y": rng.integers(0, 2, n).astype(float)})


def _fit_transform(node, frame: pd.DataFrame) -> pd.DataFrame:
    wf = ts.Workflow(node).fit(ts.Dataset(frame, part_size=16_000))  # several partitions
    return wf.transform(frame).reset_index(drop=True)


def test_join_groupby_after_dropna_reads_the_kept_rows(frame):
    out = _fit_transform(["k", "x"] >> ops.Dropna() >> ops.JoinGroupby(cont_cols=["x"], stats=["mean", "count"]),
                         frame)
    kept = frame.dropna(subset=["k", "x"]).reset_index(drop=True)
    np.testing.assert_allclose(out["k_x_mean"], kept.groupby("k")["x"].transform("mean"), rtol=1e-6)
    np.testing.assert_array_equal(out["k_count"], kept.groupby("k")["x"].transform("size"))


def test_target_encoding_after_filter_reads_the_kept_rows(frame):
    node = ["k", "x", "y"] >> ops.Filter(lambda d: d["x"] > 0) >> ops.TargetEncoding(
        "y", kfold=1, p_smooth=0, cat_groups=["k"])
    out = _fit_transform(node, frame)
    kept = frame[frame["x"] > 0].reset_index(drop=True)
    np.testing.assert_allclose(out["TE_k_y"], kept.groupby("k")["y"].transform("mean"), rtol=1e-6)


def test_difference_lag_after_dropna_reads_the_kept_rows(frame):
    out = _fit_transform(["k", "x"] >> ops.Dropna() >> ops.DifferenceLag("k"), frame)
    kept = frame.dropna(subset=["k", "x"]).reset_index(drop=True)
    expected = kept["x"].diff().where(kept["k"] == kept["k"].shift())
    np.testing.assert_allclose(out["x_difference_lag_1"], expected, rtol=1e-6)


def test_groupby_after_dropna_groups_the_kept_rows(frame):
    out = _fit_transform(["k", "x"] >> ops.Dropna() >> ops.Groupby("k", aggs={"x": ["sum"]}), frame)
    expected = frame.dropna(subset=["k", "x"]).groupby("k")["x"].sum()
    out = out.set_index("k").sort_index()
    np.testing.assert_array_equal(out.index, expected.index)
    np.testing.assert_allclose(out["x-sum"], expected.to_numpy(), rtol=1e-9)


def test_a_dependency_the_filtered_selection_lacks_is_still_refused(frame):
    node = ["k", "x"] >> ops.Dropna() >> ops.TargetEncoding("y", kfold=1, cat_groups=["k"])
    with pytest.raises(SchemaError, match="cannot put columns with different row counts side by side"):
        _fit_transform(node, frame)

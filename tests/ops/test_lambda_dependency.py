"""LambdaOp(f, dependency=...): NVTabular's form where ``f(col, df)`` reads columns
besides its selection. Expected values come from plain pandas on the raw frame."""
import json

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
import tabstream.compat.nvtabular as nvt
from tabstream.compat.nvtabular import ops as nvt_ops
from tabstream.core.errors import SchemaError
from tabstream.ops import Filter, LambdaOp, LogOp, Rename


def share_of_total(col, df):
    return col.astype("float64") / df["total_events"]


def minus_dependency_mean(col, df):
    return col - df["total_events"].mean()


def total_is_even(df):
    return df["total_events"] % 2 == 0


@pytest.fixture
def events():
    rng = np.random.default_rng(7)
    total = rng.integers(1, 50, 40)
    return pd.DataFrame({"event1": rng.integers(0, 20, 40), "event2": rng.integers(0, 20, 40),
                         "total_events": total, "other": rng.normal(size=40)})


def fit_transform(node, df):
    ds = ts.Dataset(df, part_size=400)
    assert ds.npartitions > 1
    wf = ts.Workflow(node).fit(ds)
    return wf, wf.transform(ds).compute()


def test_nvtabular_documented_form(events):
    feats = (["event1", "event2"] >> nvt_ops.LambdaOp(share_of_total, dependency=["total_events"])
             >> nvt_ops.Rename(postfix="_cond"))
    out = nvt.Workflow(feats).fit_transform(nvt.Dataset(events)).to_ddf().compute()
    assert list(out.columns) == ["event1_cond", "event2_cond"]
    for name in ("event1", "event2"):
        expected = events[name].to_numpy() / events["total_events"].to_numpy()
        np.testing.assert_allclose(out[f"{name}_cond"].to_numpy(), expected)


def test_dependency_is_read_not_output(events):
    wf, out = fit_transform(["event1"] >> LambdaOp(share_of_total, dependency="total_events"), events)
    assert list(out.columns) == ["event1"]
    assert wf.output_schema.column_names == ["event1"]
    assert str(out["event1"].dtype) == "float64"
    np.testing.assert_allclose(out["event1"].to_numpy(), events.event1 / events.total_events)


def test_dependency_as_a_node_gets_its_output(events):
    # the dependency is itself transformed: f sees log1p(total), not the raw column
    logged = ["total_events"] >> LogOp()
    wf, out = fit_transform(["event1", "event2"] >> LambdaOp(share_of_total, dependency=logged), events)
    assert list(out.columns) == ["event1", "event2"]
    for name in ("event1", "event2"):
        np.testing.assert_allclose(out[name].to_numpy(), events[name] / np.log1p(events.total_events))


def test_frame_wide_statistic_of_a_dependency_is_per_partition(events):
    # like every LambdaOp, f runs per partition: the mean is the partition's
    ds = ts.Dataset(events, part_size=400)
    wf = ts.Workflow(["event1"] >> LambdaOp(minus_dependency_mean, dtype="float64",
                                            dependency=["total_events"])).fit(ds)
    parts = [wf.transform(ts.Dataset(p)).compute() for p in ds.to_ddf().partitions]
    got = pd.concat(parts).event1.to_numpy()
    expected = np.concatenate([p.event1.compute() - p.total_events.compute().mean()
                               for p in ds.to_ddf().partitions])
    np.testing.assert_allclose(got, expected)


def test_dependency_after_a_filter(events):
    kept = ["event1", "total_events"] >> Filter(total_is_even)
    wf, out = fit_transform(kept["event1"] >> LambdaOp(share_of_total, dependency=kept["total_events"]),
                            events)
    raw = events[events.total_events % 2 == 0]
    np.testing.assert_allclose(out["event1"].to_numpy(), raw.event1 / raw.total_events)


def test_save_load_round_trip(events, tmp_path):
    node = ["event1", "event2"] >> LambdaOp(share_of_total, dependency=["total_events"],
                                            label="conditional") >> Rename(postfix="_cond")
    wf, out = fit_transform(node, events)
    wf.save(str(tmp_path / "wf"))
    doc = json.loads((tmp_path / "wf" / "workflow.json").read_text())
    params = [n["op"]["params"] for n in doc["nodes"] if n["kind"] == "op" and n["op"]["class"] == "LambdaOp"]
    assert params[0]["dependency"] == ["total_events"] and params[0]["label"] == "conditional"
    loaded = ts.Workflow.load(str(tmp_path / "wf"))
    pd.testing.assert_frame_equal(loaded.transform(events), out)


def test_selected_dependency_is_not_mapped_and_all_dependencies_refused(events):
    # a column named in dependency is read only, even when it is also selected
    wf, out = fit_transform(["event1", "total_events"] >> LambdaOp(share_of_total,
                                                                   dependency=["total_events"]), events)
    assert list(out.columns) == ["event1"]
    with pytest.raises(SchemaError, match=r"every selected column \['total_events'\] is a dependency"):
        ts.Workflow(["total_events"] >> LambdaOp(share_of_total, dependency=["total_events"])).fit(
            ts.Dataset(events))


def test_bad_arguments(events):
    with pytest.raises(TypeError, match="LambdaOp: dependency must be a column name"):
        LambdaOp(share_of_total, dependency=[3])
    with pytest.raises(TypeError, match="LambdaOp: label must be a string"):
        LambdaOp(share_of_total, label=5)
    with pytest.raises(SchemaError, match="missing_col"):
        ts.Workflow(["event1"] >> LambdaOp(share_of_total, dependency=["missing_col"])).fit(
            ts.Dataset(events))
    # no dependency: the op's params are unchanged apart from the two new defaults
    assert LambdaOp(share_of_total).dependencies() == []

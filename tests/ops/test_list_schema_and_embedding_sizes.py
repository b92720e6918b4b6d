"""List columns' shape and tags, and embedding sizes, as NVTabular writes them in the
schema: a list whose rows all have one length is not ragged; ops add the LIST tag
only where NVTabular's do (ListSlice); ``embedding_sizes.dimension`` follows
NVTabular's rule unless another rule is asked for by name."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.schema import EMBEDDING_RULES, embedding_dim, infer_embedding_dim
from tabstream.ops.lists import ListSlice, ValueCount


def nvtabular_dim_reference(n: int) -> int:
    """1.6 * n ** 0.56 rounded (numpy's half-to-even, as Python's round), in [16, 512]."""
    return int(np.clip(np.round(1.6 * np.float64(n) ** 0.56), 16, 512))


@pytest.mark.parametrize("n", [1, 2, 3, 29, 100, 1_000, 12_345, 10**6, 10**9])
def test_embedding_dim_default_is_nvtabular_rule(n):
    assert embedding_dim(n) == nvtabular_dim_reference(n)
    assert embedding_dim(n, rule="nvtabular") == nvtabular_dim_reference(n)


@pytest.mark.parametrize("n", [1, 29, 1_000, 10**6])
def test_embedding_dim_fourth_root_rule_by_name(n):
    raw = math.floor(n ** 0.25 * 2)
    assert embedding_dim(n, rule="fourth_root") == max(8, -(-raw // 8) * 8) == infer_embedding_dim(n)
    assert set(EMBEDDING_RULES) == {"nvtabular", "fourth_root"}


def test_embedding_dim_errors():
    with pytest.raises(ValueError, match="unknown embedding size rule 'fastai'; expected one of: "
                                         "nvtabular, fourth_root"):
        embedding_dim(10, rule="fastai")
    with pytest.raises(ValueError, match="cardinality must be positive, got 0"):
        embedding_dim(0)


@pytest.mark.parametrize("seed", [0, 1])
def test_categorify_hashbucket_bucketize_write_nvtabular_dimension(seed):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"c": rng.integers(0, 26, 500), "h": rng.integers(0, 99, 500), "x": rng.normal(size=500)})
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["h"] >> ops.HashBucket(40))
                     + (["x"] >> ops.Bucketize([-1.0, 0.0, 1.0])))
    wf.fit(ts.Dataset(df))
    schema = wf.output_schema
    card = {"c": 3 + df["c"].nunique(), "h": 40 + 1, "x": 4}
    for name, n in card.items():
        assert schema[name].properties["embedding_sizes"] == {"cardinality": n,
                                                              "dimension": nvtabular_dim_reference(n)}


def test_categorify_of_26_values_has_cardinality_29_and_dimension_16():
    df = pd.DataFrame({"c": list("abcdefghijklmnopqrstuvwxyz") * 2})
    wf = ts.Workflow(["c"] >> ops.Categorify()).fit(ts.Dataset(df))
    assert wf.output_schema["c"].properties["embedding_sizes"] == {"cardinality": 29, "dimension": 16}


@pytest.mark.parametrize("rows, ragged", [
    ([[1, 2, 3], [4, 5, 6]], False),
    ([[1, 2, 3], [4, 5], [6]], True),
    ([[1], [2], [3]], False),
])
def test_value_count_flags_fixed_length_lists_not_ragged(rows, ragged):
    df = pd.DataFrame({"f": rows})
    wf = ts.Workflow(["f"] >> ValueCount()).fit(ts.Dataset(df))
    col = wf.output_schema["f"]
    lengths = [len(r) for r in rows]
    assert col.properties["value_count"] == {"min": min(lengths), "max": max(lengths)}
    assert col.is_list and col.is_ragged == (len(set(lengths)) > 1) == ragged
    assert col.tags == frozenset()           # NVTabular's ValueCount adds no tag


def test_fixed_size_arrow_lists_are_not_ragged(tmp_path):
    table = pa.table({
        "fixed": pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int64(), 2)),
        "var": pa.array([[1, 2], [3], []], pa.list_(pa.int64())),
    })
    pq.write_table(table, tmp_path / "l.parquet")
    for source in (table, str(tmp_path / "l.parquet")):
        schema = ts.Dataset(source).schema
        widths = {n: {len(r) for r in table.column(n).to_pylist()} for n in table.column_names}
        for name in table.column_names:
            assert schema[name].is_list
            assert schema[name].is_ragged == (len(widths[name]) > 1)
            assert schema[name].tags == frozenset()   # Merlin infers no tag for a list


def test_list_slice_adds_the_list_tag_and_groupby_lists_keep_their_tags():
    df = pd.DataFrame({"s": [1, 1, 2], "l": [[1, 2, 3], [4], [5, 6]], "x": [1, 2, 3]})
    sliced = ts.Workflow(["l"] >> ListSlice(0, 2, pad=True)).fit(ts.Dataset(df)).output_schema["l"]
    assert ts.Tags.LIST in sliced.tags and not sliced.is_ragged
    assert ts.Workflow(["l"] >> ListSlice(0, 2)).fit(ts.Dataset(df)).output_schema["l"].tags == {ts.Tags.LIST}
    grouped = ts.Workflow(["s", "x"] >> ops.AddTags(["continuous"]) >> ops.Groupby("s", aggs=["list"]))
    out = grouped.fit(ts.Dataset(df)).output_schema["x-list"]
    assert out.is_list and out.is_ragged and out.tags == frozenset({ts.Tags.CONTINUOUS})


def test_a_hashed_copy_of_a_categorified_column_gets_its_own_table():
    """["user"] >> Categorify() beside ["user"] >> HashBucket(7) >> Rename(postfix="_hashed"):
    two tables (NVTabular's HashBucket names no domain); both were named "user" and
    shared one table, hashed ids landing on vocabulary rows."""
    from tabstream.train.tables import table_configs_from_schema

    df = pd.DataFrame({"user": [f"u{i % 30}" for i in range(300)]})
    node = (["user"] >> ops.Categorify()) + (["user"] >> ops.HashBucket(7) >> ops.Rename(postfix="_hashed"))
    wf = ts.Workflow(node).fit(ts.Dataset(df))
    configs = {c.name: c for c in table_configs_from_schema(wf.output_schema)}
    assert sorted(configs) == ["user", "user_hashed"]
    out = wf.transform(df)
    assert configs["user"].cardinality > out["user"].max() and configs["user"].feature_names == ("user",)
    assert configs["user_hashed"].cardinality == 8 and configs["user_hashed"].feature_names == ("user_hashed",)

"""Join and group ops (TargetEncoding, JoinGroupby, JoinExternal, DifferenceLag) and
DropLowCardinality: side tables, key types and settings a user gets wrong, and
missing keys that must be read right."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.ops import (
    AddTags,
    DifferenceLag,
    DropLowCardinality,
    JoinExternal,
    JoinGroupby,
    TargetEncoding,
)


def _events() -> pa.Table:
    return pa.table({"user": ["a", "b", None, "a"], "item": [1, 2, 2, 3],
                     "label": [1.0, 0.0, 1.0, np.nan], "ts": [1, 2, 3, 4]})


def _fit(node, table):
    return ts.Workflow(node).fit(ts.Dataset(table))


def _side_file_missing(tmp):
    _fit(["item"] >> JoinExternal(str(tmp / "side.parquet"), on="item"), _events())


def _side_file_not_parquet(tmp):
    (tmp / "side.parquet").write_text("item,w\n1,2\n")
    _fit(["item"] >> JoinExternal(str(tmp / "side.parquet"), on="item"), _events())


def _side_key_is_string(tmp):
    side = pd.DataFrame({"item": ["1", "2"], "w": [0.5, 1.5]})
    _fit(["item"] >> JoinExternal(side, on="item"), _events())


def _side_key_column_missing(tmp):
    side = pd.DataFrame({"item_id": [1, 2], "w": [0.5, 1.5]})
    _fit(["item"] >> JoinExternal(side, on="item"), _events())


def _dedupe_list_payload(tmp):
    side = pa.table({"item": [1, 1], "tags": pa.array([[1], [1]], pa.list_(pa.int64()))})
    JoinExternal(side, on="item", drop_duplicates_ext=True)


def _dedupe_flag_not_bool(tmp):
    JoinExternal(pd.DataFrame({"item": [1], "w": [2]}), on="item", drop_duplicates_ext="yes")


def _te_target_is_string(tmp):
    t = _events().append_column("y", pa.array(["1", "0", "1", "0"]))
    _fit(["user", "y"] >> TargetEncoding("y"), t)


def _te_transform_key_type_changed(tmp):
    op = TargetEncoding("label", kfold=1).fit_table(_events().select(["item", "label"]))
    op.transform(pa.table({"item": ["1", "2"], "label": [1.0, 0.0]}))


def _groupby_string_cont(tmp):
    _fit(["item", "user"] >> JoinGroupby(cont_cols=["user"], stats=["mean"]), _events())


def _lag_of_strings(tmp):
    _fit(["user", "item"] >> DifferenceLag("item"), _events())


def _low_card_not_int(tmp):
    DropLowCardinality("4")


def _low_card_zero(tmp):
    DropLowCardinality(0)


def _low_card_never_counted(tmp):
    op = DropLowCardinality()
    _fit(["item"] >> op, _events())
    op.compute_output_schema(ts.Schema([ts.ColumnSchema("item", "int64", frozenset({ts.Tags.CATEGORICAL}))]))


def _nan_and_null_keys_never_join(tmp):
    """Read right: NaN and null keys never match (not even the side's own NaN/null
    keys), -0.0 matches 0.0; pandas.merge would match the missing keys."""
    left = pa.table({"k": pa.array([np.nan, None, -0.0, 2.0], pa.float64())})
    side = pa.table({"k": pa.array([None, np.nan, 0.0], pa.float64()), "w": ["null", "nan", "zero"]})
    wf = _fit(["k"] >> JoinExternal(side, on="k"), left)
    assert wf.transform(left)["w"].to_pylist() == [None, None, "zero", None]


def _nan_and_null_one_group(tmp):
    """Read right: JoinGroupby counts NaN and null keys as one category, -0.0 as 0.0."""
    t = pa.table({"k": pa.array([np.nan, None, -0.0, 0.0, 1.0], pa.float64())})
    wf = _fit(["k"] >> JoinGroupby(stats=["count"]), t)
    keys = pd.Series([np.nan, np.nan, 0.0, 0.0, 1.0])
    expected = keys.map(keys.value_counts(dropna=False)).tolist()
    assert wf.transform(t)["k_count"].to_pylist() == expected


def _low_card_missing_counts_once(tmp):
    """Read right: a categorical column of NaN, null, 0.0 and -0.0 has one value."""
    t = pa.table({"z": pa.array([np.nan, None, 0.0, -0.0], pa.float64()), "n": [1, 2, 3, 4]})
    # one value: ids up to 2 (0 padding, 1 missing), below 4 so dropped; counted as
    # two values (0.0 apart from -0.0) it would reach 3 and stay (NVTabular's rule:
    # dropped only below min_cardinality)
    wf = _fit((["z", "n"] >> AddTags(["categorical"])) >> DropLowCardinality(4), t)
    distinct = pd.Series([np.nan, np.nan, 0.0, 0.0]).dropna().nunique()
    assert distinct + 2 < 4 and wf.output_schema.column_names == ["n"]


CASES = [
    ("side parquet missing", _side_file_missing, FileNotFoundError,
     r"JoinExternal: side table '.*side\.parquet' does not exist"),
    ("side file not parquet", _side_file_not_parquet, DataError,
     r"cannot read side table '.*side\.parquet' as parquet"),
    ("side key string, data key int", _side_key_is_string, TypeError,
     r"key column 'item' is int64, but the side table's key 'item' is (large_)?string"),
    ("side key column missing", _side_key_column_missing, SchemaError,
     r"side table has no columns \['item'\]; it has \['item_id', 'w'\]"),
    ("dedupe over list payload", _dedupe_list_payload, TypeError,
     r"drop_duplicates_ext compares whole side rows, but side columns \['tags'\] hold lists"),
    ("dedupe flag not bool", _dedupe_flag_not_bool, TypeError,
     "drop_duplicates_ext must be True or False, got 'yes'"),
    ("target encoding of a string target", _te_target_is_string, TypeError,
     "TargetEncoding needs numeric columns, but column 'y' is string"),
    ("target encoding key type changed", _te_transform_key_type_changed, TypeError,
     r"key column 'item' is string, but the fitted statistics' key 'item' is int64"),
    ("groupby mean of strings", _groupby_string_cont, TypeError,
     "JoinGroupby needs numeric columns, but column 'user' is string"),
    ("lag of a string column", _lag_of_strings, TypeError,
     "DifferenceLag needs numeric columns, but column 'user' is string"),
    ("min_cardinality a string", _low_card_not_int, TypeError,
     "min_cardinality must be an integer, got '4'"),
    ("min_cardinality zero", _low_card_zero, ValueError,
     "min_cardinality must be an integer >= 1, got 0"),
    ("categorical never counted", _low_card_never_counted, SchemaError,
     "categorical column 'item' has no domain in the schema"),
    ("NaN and null keys never join", _nan_and_null_keys_never_join, None, None),
    ("NaN and null keys one group", _nan_and_null_one_group, None, None),
    ("missing values count once", _low_card_missing_counts_once, None, None),
]

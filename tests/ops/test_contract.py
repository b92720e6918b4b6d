"""One contract suite over every registered op (scikit-learn's check_estimator idea).

Registering an op = subclassing Operator; `test_every_op_has_an_example` fails until
the new op has an entry in EXAMPLES, and then the whole suite runs over it.
"""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.errors import NotFittedError
from tabstream.ops.base import registered_ops
from tabstream.pipeline.dtypes import arrow_type_to_dtype
from tabstream.testing import assert_tables_equal


def contract_frame(n=600, seed=0):
    rng = np.random.default_rng(seed)
    cat = np.array(["a", "b", "c", "d", ""], dtype=object)[rng.integers(0, 5, n)]
    cat[rng.random(n) < 0.1] = None
    cont = rng.normal(size=n)
    cont[rng.random(n) < 0.05] = np.nan
    cont[::97] = np.inf
    count = rng.integers(-2, 50, n).astype(float)
    count[rng.random(n) < 0.1] = np.nan
    lists = [list(rng.integers(0, 20, rng.integers(0, 4))) for _ in range(n)]
    return pa.table({
        "cat": pa.array(cat, pa.string()),
        "cat2": pa.array(rng.integers(0, 30, n)),
        "cont": pa.array(cont),
        "count": pa.array(count, from_pandas=True).cast(pa.int64()),
        "lst": pa.array(lists, pa.list_(pa.int64())),
        "text": pa.array(["|".join(map(str, r)) for r in lists]),
        "label": pa.array(rng.integers(0, 2, n)),
        "user_id": pa.array(rng.integers(0, 40, n)),
        "ts": pa.array(np.sort(rng.integers(0, 10_000, n))),
    })


# user functions must be module-level to be saved by name (see tabstream.ops.structural)
def contract_keep_positive(df):
    return df["cont"] > 0


def contract_double(s):
    return s * 2


# op name -> (factory, selected columns)
EXAMPLES = {
    "Categorify": (lambda: ops.Categorify(freq_threshold=2), ["cat", "cat2", "lst"]),
    "HashBucket": (lambda: ops.HashBucket(17), ["cat", "cat2", "lst"]),
    "HashedCross": (lambda: ops.HashedCross(31), ["cat", "cat2"]),
    "FillMissing": (lambda: ops.FillMissing(0, add_binary_cols=True), ["cont", "count"]),
    "Clip": (lambda: ops.Clip(min_value=0, max_value=10), ["cont", "count"]),
    "LogOp": (lambda: ops.LogOp(), ["cont", "count"]),
    "Normalize": (lambda: ops.Normalize(), ["cont", "count"]),
    "AddTags": (lambda: ops.AddTags(["user_id", "categorical"]), ["user_id"]),
    "AddMetadata": (lambda: ops.AddMetadata(tags=["item"], properties={"source": "test"}), ["cat2"]),
    "SplitList": (lambda: ops.SplitList("|", dtype="int64"), ["text"]),
    "ListSlice": (lambda: ops.ListSlice(0, 2, pad=True, pad_value=-1), ["lst"]),
    "ValueCount": (lambda: ops.ValueCount(), ["lst"]),
    "Rename": (lambda: ops.Rename(postfix="_renamed"), ["cat", "cont"]),
    "Filter": (lambda: ops.Filter(contract_keep_positive), ["cont", "cat"]),
    "Dropna": (lambda: ops.Dropna(), ["cat", "cont", "lst"]),
    "LambdaOp": (lambda: ops.LambdaOp(contract_double, dtype="float64"), ["cont", "count"]),
    "TagAsUserID": (lambda: ops.TagAsUserID(), ["user_id"]),
    "TagAsItemID": (lambda: ops.TagAsItemID(), ["cat2"]),
    "TagAsUserFeatures": (lambda: ops.TagAsUserFeatures(), ["count"]),
    "TagAsItemFeatures": (lambda: ops.TagAsItemFeatures(tags=["categorical"]), ["cat"]),
    "NormalizeMinMax": (lambda: ops.NormalizeMinMax(), ["cont", "count"]),
    "FillMedian": (lambda: ops.FillMedian(add_binary_cols=True), ["cont", "count"]),
    "Bucketize": (lambda: ops.Bucketize([-1.0, 0.0, 1.0]), ["cont", "count"]),
    "DropLowCardinality": (lambda: ops.DropLowCardinality(3), ["cat", "cat2", "label", "lst"]),
    "ReduceDtypeSize": (lambda: ops.ReduceDtypeSize(), ["cont", "count", "cat2", "lst"]),
    "DataStats": (lambda: ops.DataStats(), ["cat", "cont", "count", "lst", "text"]),
    "TargetEncoding": (lambda: ops.TargetEncoding("label", fold_col="ts", cat_groups=["cat", ["cat", "cat2"]]),
                       ["cat", "cat2", "ts", "label"]),
    "JoinGroupby": (lambda: ops.JoinGroupby(cont_cols=["cont", "count"],
                                            stats=["count", "sum", "mean", "std", "var", "min", "max"]),
                    ["cat", "cat2", "cont", "count"]),
    "JoinExternal": (lambda: ops.JoinExternal(pa.table({"cat2": np.arange(0, 30, 2), "weight": np.arange(15) / 10}),
                                              on="cat2"), ["cat2", "cat"]),
    "DifferenceLag": (lambda: ops.DifferenceLag("user_id", shift=[1, -1]), ["ts", "cont", "user_id"]),
    "Groupby": (lambda: ops.Groupby("user_id", sort_cols="ts", aggs={"cat": ["list", "first", "last", "count"], "cont": ["sum", "mean", "min", "max"], "lst": ["list", "count"]}), ["user_id", "ts", "cat", "cont", "lst"]),  # noqa: E501
}


def run(op_factory, columns, table, part_size=None):
    wf = ts.Workflow(columns >> op_factory())
    wf.fit(ts.Dataset(table, part_size=part_size))
    return wf, wf.transform(table)


def test_every_op_has_an_example():
    import tabstream.ops  # noqa: F401

    missing = sorted(set(registered_ops()) - set(EXAMPLES))
    assert not missing, f"add contract examples for {missing}"


@pytest.fixture(params=sorted(EXAMPLES))
def example(request):
    return request.param, *EXAMPLES[request.param]


def test_params_round_trip_through_json(example):
    name, factory, _ = example
    op = factory()
    params = json.loads(json.dumps(op.get_params()))
    again = type(op)(**params)
    assert again.get_params() == op.get_params()
    assert type(op).__name__ == name


def test_declared_schema_equals_produced(example):
    _, factory, columns = example
    wf, out = run(factory, columns, contract_frame())
    schema = wf.output_schema
    assert out.column_names == schema.column_names
    for col, field in zip(schema, out.schema):
        assert arrow_type_to_dtype(field.type) == (col.dtype, col.is_list), col.name


def test_statistics_equal_on_one_and_many_partitions(example):
    _, factory, columns = example
    table = contract_frame()
    _, one = run(factory, columns, table)
    _, many = run(factory, columns, table, part_size=2048)
    assert_tables_equal(one, many)


def test_transform_before_fit_raises(example):
    _, factory, columns = example
    op = factory()
    wf = ts.Workflow(columns >> op)
    with pytest.raises(NotFittedError):
        wf.transform(contract_frame())
    if op.is_stat:
        with pytest.raises(NotFittedError, match="has not been fitted"):
            op.transform(contract_frame().select(columns))


def test_save_load_gives_identical_output(example, tmp_path):
    _, factory, columns = example
    table = contract_frame()
    wf, out = run(factory, columns, table)
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert_tables_equal(again.transform(table), out)
    assert again.output_schema == wf.output_schema


def test_empty_partitions_and_all_null_columns(example):
    _, factory, columns = example
    table = contract_frame()
    nulls = pa.table({name: pa.nulls(table.num_rows, table.schema.field(name).type) if name in columns
                      else table.column(name) for name in table.column_names})
    wf, out = run(factory, columns, nulls, part_size=4096)
    assert out.num_rows <= table.num_rows
    empty = wf.transform(table.slice(0, 0))
    assert empty.num_rows == 0 and empty.column_names == wf.output_schema.column_names


def test_pandas_in_pandas_out(example):
    _, factory, columns = example
    table = contract_frame()
    wf, out = run(factory, columns, table)
    df = wf.transform(table.to_pandas())
    assert isinstance(df, pd.DataFrame) and list(df.columns) == out.column_names

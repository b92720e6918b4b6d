"""One contract suite over every registered op (scikit-learn's check_estimator idea).

Registering an op = subclassing Operator; `test_every_op_has_an_example` fails until
the new op has an entry in EXAMPLES, and then the whole suite runs over it.
"""

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.dtypes import arrow_type_to_dtype
from tabstream.core.errors import NotFittedError
from tabstream.core.operators import registered_ops
from tabstream.pipeline.dataset import arrow_to_pandas
from tabstream.testing import assert_tables_equal, nan_to_null, negative_zero_to_zero


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


def nasty_frame(n=80, seed=1):
    """The contract frame's columns, full of the values that break ops: NaN and null
    (both in float columns and float list elements), -0.0 beside 0.0, ±inf, empty
    strings, null rows, empty lists, nulls in integer columns."""
    rng = np.random.default_rng(seed)
    floats = [np.nan, None, -0.0, 0.0, np.inf, -np.inf, 1.5, -2.0, 0.5, 3.0]
    cont = [floats[i % len(floats)] if i % 3 else float(rng.normal()) for i in range(n)]
    strings = ["", None, "a", "b", "0", "-0", "a", ""]
    ints = [None, 0, -1, 3, 7, 0, None, 12]
    elements = [np.nan, None, -0.0, 0.0, np.inf, -np.inf, 1.0, 2.0]
    return pa.table({
        "cat": pa.array([strings[i % len(strings)] for i in range(n)], pa.string()),
        "cat2": pa.array([None if i % 11 == 0 else int(v) for i, v in enumerate(rng.integers(0, 30, n))],
                         pa.int64()),
        "cont": pa.array(cont, pa.float64()),
        "count": pa.array([ints[(i * 3) % len(ints)] for i in range(n)], pa.int64()),
        "lst": pa.array([None if i % 13 == 5 else [elements[(i + j) % len(elements)] for j in range(i % 4)]
                         for i in range(n)], pa.list_(pa.float64())),
        "text": pa.array([None if i % 9 == 4 else "" if i % 9 == 2 else "|".join(str(j - 1) for j in range(i % 4))
                          for i in range(n)], pa.string()),
        "label": pa.array(rng.integers(0, 2, n)),
        "user_id": pa.array([None if i % 17 == 3 else int(v) for i, v in enumerate(rng.integers(0, 8, n))],
                            pa.int64()),
        "ts": pa.array(np.sort(rng.integers(0, 10_000, n))),
        # a float key: -0.0 and 0.0 one category/group/hash, NaN and null one missing key
        "fkey": pa.array([[np.nan, None, -0.0, 0.0, np.inf, -np.inf, 2.5][k] for k in rng.integers(0, 7, n)],
                         pa.float64()),
        # string lists: empty strings and null elements, empty lists and null rows
        "slst": pa.array([None if i % 7 == 3 else [strings[(i + j) % len(strings)] for j in range(i % 3)]
                          for i in range(n)], pa.list_(pa.string())),
    })


def nasty_pandas(table):
    """The pandas frame a user would hold: NaN for missing floats (null and NaN
    alike), nullable Int64 for integers with nulls, Arrow-backed lists."""
    def mapper(t):
        if pa.types.is_list(t):
            return pd.ArrowDtype(t)
        return pd.Int64Dtype() if pa.types.is_integer(t) else None
    return table.to_pandas(types_mapper=mapper)


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


# ops whose output depends on a key's identity, once more with the float key "fkey"
# and the string-list column "slst" of nasty_frame (run only by the nasty-value tests)
NASTY_EXAMPLES = {
    "Categorify[fkey]": (lambda: ops.Categorify(), ["fkey"]),
    "HashBucket[fkey]": (lambda: ops.HashBucket(17), ["fkey"]),
    "HashedCross[fkey]": (lambda: ops.HashedCross(31), ["fkey", "cat"]),
    "TargetEncoding[fkey]": (lambda: ops.TargetEncoding("label", fold_col="ts"), ["fkey", "ts", "label"]),
    "JoinGroupby[fkey]": (lambda: ops.JoinGroupby(cont_cols=["cont"], stats=["count", "sum"]), ["fkey", "cont"]),
    "DifferenceLag[fkey]": (lambda: ops.DifferenceLag("fkey"), ["ts", "fkey"]),
    "DropLowCardinality[fkey]": (lambda: ops.DropLowCardinality(6), ["fkey"]),
    "DataStats[fkey]": (lambda: ops.DataStats(), ["fkey", "slst"]),
    "Bucketize[fkey]": (lambda: ops.Bucketize([0.0]), ["fkey"]),
    "Categorify[slst]": (lambda: ops.Categorify(), ["slst"]),
    "HashBucket[slst]": (lambda: ops.HashBucket(17), ["slst"]),
    "ListSlice[slst]": (lambda: ops.ListSlice(-2, pad=True, pad_value=""), ["slst"]),
    "ValueCount[slst]": (lambda: ops.ValueCount(), ["slst"]),
    "Dropna[slst]": (lambda: ops.Dropna(), ["slst", "fkey"]),
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


@pytest.fixture(params=[*sorted(EXAMPLES), *sorted(NASTY_EXAMPLES)])
def nasty_example(request):
    name = request.param
    return name, *(NASTY_EXAMPLES[name] if name in NASTY_EXAMPLES else EXAMPLES[name])


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
    """A statistics op refuses to transform before fit; a workflow of ops without
    statistics needs no fit (NVTabular's behaviour) and gives what a fitted one gives."""
    _, factory, columns = example
    op = factory()
    wf = ts.Workflow(columns >> op)
    if op.is_stat:
        with pytest.raises(NotFittedError):
            wf.transform(contract_frame())
        with pytest.raises(NotFittedError, match="has not been fitted"):
            op.transform(contract_frame().select(columns))
    else:
        fitted = ts.Workflow(columns >> factory()).fit(ts.Dataset(contract_frame()))
        assert_tables_equal(wf.transform(contract_frame()), fitted.transform(contract_frame()))


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


# -- the same invariants on NaN, null, -0.0, 0.0, ±inf and empty strings --------
def _many(table):
    return table.nbytes // 5  # about five partitions


def assert_same_state(wf, other, rtol=0.0):
    """The fitted state (JSON values and tables) of every stat op of two workflows
    agree, NaN equal to NaN or None, -0.0 equal to 0.0, floats within ``rtol``."""
    def state(w):
        out = []
        for node in w.output_node.walk():
            if node.kind == "op" and node.op.is_stat:
                values, tables = node.op.get_state()
                out.append((type(node.op).__name__, values, {k: nan_to_null(t) for k, t in tables.items()}))
        return out

    def same(a, b):
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        a, b = (None if isinstance(v, float) and np.isnan(v) else v for v in (a, b))
        if isinstance(a, float) and isinstance(b, float):
            return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
        return a == b

    for (name, values, tables), (_, values2, tables2) in zip(state(wf), state(other), strict=True):
        assert same(values, values2), f"{name}: fitted state differs: {values} != {values2}"
        assert tables.keys() == tables2.keys(), name
        for key in tables:
            try:
                assert_tables_equal(tables[key], tables2[key], check_dtype=False, rtol=rtol)
            except AssertionError as exc:
                raise AssertionError(f"{name}: fitted table {key!r} differs: {exc}") from None


@pytest.mark.parametrize("source", ["arrow", "pandas"])
def test_nasty_values_schema_and_partitions(nasty_example, source):
    _, factory, columns = nasty_example
    table = nasty_frame()
    data = table if source == "arrow" else nasty_pandas(table)
    wf_one = ts.Workflow(columns >> factory())
    wf_one.fit(ts.Dataset(data))
    wf_many = ts.Workflow(columns >> factory())
    wf_many.fit(ts.Dataset(data, part_size=_many(table)))
    one, many = wf_one.transform(table), wf_many.transform(table)
    for field in one.schema:
        col = wf_one.output_schema[field.name]
        assert arrow_type_to_dtype(field.type) == (col.dtype, col.is_list), col.name
    assert one.column_names == wf_one.output_schema.column_names
    assert_tables_equal(one, many)
    assert wf_one.output_schema == wf_many.output_schema


def test_nasty_values_save_load(nasty_example, tmp_path):
    _, factory, columns = nasty_example
    table = nasty_frame()
    wf, out = run(factory, columns, table, part_size=_many(table))
    wf.save(str(tmp_path / "wf"))
    again = ts.Workflow.load(str(tmp_path / "wf"))
    assert_tables_equal(again.transform(table), out)
    assert again.output_schema == wf.output_schema


def test_nan_and_null_are_one_missing_value(nasty_example):
    """Issue 8: the same frame with every NaN replaced by null fits the same
    statistics and gives the same output, up to NaN versus null."""
    _, factory, columns = nasty_example
    table = nasty_frame()
    wf, out = run(factory, columns, table, part_size=_many(table))
    wf_null, out_null = run(factory, columns, nan_to_null(table), part_size=_many(table))
    assert_same_state(wf, wf_null)
    assert_tables_equal(nan_to_null(out), nan_to_null(out_null))
    assert wf.output_schema == wf_null.output_schema


def test_negative_zero_is_zero(nasty_example):
    """-0.0 and 0.0 are one value: replacing -0.0 by 0.0 changes no output
    (float comparison treats -0.0 == 0.0; ids, buckets and groups must agree)."""
    _, factory, columns = nasty_example
    table = nasty_frame()
    wf, out = run(factory, columns, table, part_size=_many(table))
    wf_zero, out_zero = run(factory, columns, negative_zero_to_zero(table), part_size=_many(table))
    assert_same_state(wf, wf_zero)
    assert_tables_equal(out, out_zero)
    assert wf.output_schema == wf_zero.output_schema


def test_pandas_input_equals_arrow_input(nasty_example):
    """A pandas frame (NaN for every missing float) fits and transforms like the
    Arrow table it came from, up to NaN versus null. (Its partitions differ in
    size, and a sum over other partitions may differ in the last bit: rtol.)"""
    _, factory, columns = nasty_example
    table = nasty_frame()
    df = nasty_pandas(table)
    wf, out = run(factory, columns, table, part_size=_many(table))
    wf_pd = ts.Workflow(columns >> factory())
    wf_pd.fit(ts.Dataset(df, part_size=_many(table)))
    got = wf_pd.transform(df)
    assert isinstance(got, pd.DataFrame)
    assert wf_pd.output_schema == wf.output_schema
    assert_same_state(wf, wf_pd, rtol=1e-12)
    # pandas holds strings as large_string once back in Arrow: compare values, and the
    # pandas dtypes with those of the Arrow output converted the same way
    assert_tables_equal(nan_to_null(pa.Table.from_pandas(got, preserve_index=False)), nan_to_null(out),
                        check_dtype=False, rtol=1e-12)
    assert dict(got.dtypes) == dict(arrow_to_pandas(out).dtypes)


# -- what an op declares for the workflow and the loaders ----------------------------
# (class attributes of Operator / StatOperator, read instead of class names or
# getattr probes: each must say what the op really does)
FRAMES = {**{name: contract_frame for name in EXAMPLES}, **{name: nasty_frame for name in NASTY_EXAMPLES}}


def _example(name):
    return {**EXAMPLES, **NASTY_EXAMPLES}[name]


@pytest.mark.parametrize("name", sorted(FRAMES))
def test_changes_row_count_says_whether_transform_changes_the_row_count(name):
    """Every registered op (through its example) declares ``changes_row_count`` True
    exactly when its output holds another number of rows than its input."""
    factory, columns = _example(name)
    table = FRAMES[name]()
    _, out = run(factory, columns, table)
    assert type(factory()).changes_row_count == (out.num_rows != table.num_rows), (
        f"{name}: {table.num_rows} rows in, {out.num_rows} out, but changes_row_count is "
        f"{type(factory()).changes_row_count}")


def test_the_row_changing_ops_are_the_documented_ones():
    changing = sorted(n for n, cls in registered_ops().items() if cls.changes_row_count)
    assert changing == sorted(["Filter", "Dropna", "Groupby"])


def _dictionary_encoded(table):
    strings = [n for n in table.column_names if pa.types.is_string(table.schema.field(n).type)]
    assert strings, "the example selects no string column to hand over as a dictionary"
    return pa.table({n: pc.dictionary_encode(table.column(n)) if n in strings else table.column(n)
                     for n in table.column_names})


def _reads_strings(name):
    schema = FRAMES[name]().schema
    return any(pa.types.is_string(schema.field(c).type) for c in _example(name)[1])


# (the workflow hands over as dictionaries only plain string columns)
@pytest.mark.parametrize("name", sorted(n for n in FRAMES if type(_example(n)[0]()).accepts_dictionary
                                        and _reads_strings(n)))
def test_ops_accepting_dictionaries_give_the_same_from_dictionary_columns(name):
    """An op with ``accepts_dictionary`` fits and transforms string columns handed
    over as dictionary arrays (as the workflow reads them from parquet) exactly as
    the plain strings."""
    factory, columns = _example(name)
    table = FRAMES[name]().select(columns)
    encoded = _dictionary_encoded(table)
    plain, from_dictionary = factory(), factory()
    if plain.is_stat:
        plain.fit_table(table)
        from_dictionary.fit_table(encoded)
    expected = plain.transform(table)
    assert_tables_equal(from_dictionary.transform(encoded), expected)
    assert_tables_equal(plain.transform(encoded), expected)


def test_some_op_accepts_dictionaries():
    assert sorted(n for n, cls in registered_ops().items() if cls.accepts_dictionary) == ["Categorify"]


@pytest.mark.parametrize("name", sorted(n for n in FRAMES if getattr(type(_example(n)[0]()), "shards_root", False)))
@pytest.mark.parametrize("shards", [1, 2, 3])
def test_shards_root_merges_in_shares_as_in_one(name, shards):
    """An op with ``shards_root`` fitted through ``combine_root`` in ``shards``
    shares joined by ``join_root`` transforms as the same op fitted with
    ``combine`` alone (``fit_table``)."""
    factory, columns = _example(name)
    table = FRAMES[name]().select(columns)
    parts = [table.slice(start, 97) for start in range(0, table.num_rows, 97)]
    sharded = factory()
    partials = [sharded.fit_partition(part) for part in parts]
    sharded.finalize(sharded.join_root([sharded.combine_root(partials, s, shards) for s in range(shards)]))
    assert_tables_equal(sharded.transform(table), factory().fit_table(table).transform(table))


def test_some_op_shards_its_root():
    assert sorted(n for n, cls in registered_ops().items() if getattr(cls, "shards_root", False)) == ["Categorify"]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_spills_is_declared_by_the_ops_that_take_a_spill_dir(name):
    """The workflow gives ``spill_dir`` to the ops declaring ``spills`` (on a cluster
    on the client's machine): exactly the ops that take that argument."""
    factory, _ = EXAMPLES[name]
    op = factory()
    assert getattr(op, "spills", False) == ("spill_dir" in op.get_params())

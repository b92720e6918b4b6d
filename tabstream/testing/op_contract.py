"""The op contract: the invariants every op keeps, runnable on an op of your own.

Every op of the catalog passes these checks (the project's own test suite runs them
over :data:`CONTRACT_EXAMPLES`); an op you write runs them with :func:`check_op`:

>>> from tabstream import ops
>>> from tabstream.testing import check_op
>>> ran = check_op(ops.Clip(min_value=0, max_value=10), ["cont", "count"])
>>> "save_load_gives_identical_output" in ran
True

The checks (see :data:`CHECKS`): constructor parameters round-trip through JSON; the
declared output schema is the produced one; statistics fitted over one partition
equal those fitted over many; a stat op refuses to transform before ``fit``; a saved
and loaded workflow transforms identically; empty partitions and all-null columns
work; a pandas frame in gives a pandas frame out; ``changes_row_count`` says whether
rows change; an op taking ``spill_dir`` declares ``spills``; and on a frame full of
NaN, null, -0.0, ±inf and empty strings: NaN and null are one missing value, -0.0 is
0.0, a pandas input equals its Arrow table, and the schema, partitions and
save/load checks hold again.

The check frames (:func:`contract_frame`, :func:`nasty_frame`) hold the columns
``cat`` (strings), ``cat2`` (ints), ``cont`` (floats), ``count`` (ints with nulls),
``lst`` (int lists), ``text`` (``|``-joined strings), ``label``, ``user_id``, ``ts``
and, in the nasty frame, ``fkey`` (a float key) and ``slst`` (string lists); give
``frame=`` for an op that needs other columns. A user function given to an op
(``Filter``, ``LambdaOp``) must be defined at module level so the saved workflow can
name it.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from tabstream import ops
from tabstream.core.dtypes import arrow_to_pandas, arrow_type_to_dtype
from tabstream.core.errors import NotFittedError
from tabstream.core.operators import Operator
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.workflow import Workflow
from tabstream.testing.tables import assert_tables_equal, nan_to_null, negative_zero_to_zero

__all__ = ["CHECKS", "CONTRACT_EXAMPLES", "NASTY_EXAMPLES", "assert_same_state", "check_op", "contract_double",
           "contract_frame", "contract_keep_positive", "nasty_frame", "nasty_pandas", "run_check"]

Factory = Callable[[], Operator]


def contract_frame(n: int = 600, seed: int = 0) -> pa.Table:
    """The frame the contract checks run on: every kind of column an op reads, with
    nulls, NaN and inf where such values occur in logs."""
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


def nasty_frame(n: int = 80, seed: int = 1) -> pa.Table:
    """The contract frame's columns, full of the values that break ops: NaN and null
    (both in float columns and float list elements), -0.0 beside 0.0, ±inf, empty
    strings, null rows, empty lists, nulls in integer columns; plus a float key
    ``fkey`` and a string-list column ``slst``."""
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


def nasty_pandas(table: pa.Table) -> pd.DataFrame:
    """The pandas frame a user would hold: NaN for missing floats (null and NaN
    alike), nullable Int64 for integers with nulls, Arrow-backed lists."""
    def mapper(t: pa.DataType) -> Any:
        if pa.types.is_list(t):
            return pd.ArrowDtype(t)
        return pd.Int64Dtype() if pa.types.is_integer(t) else None
    return table.to_pandas(types_mapper=mapper)


# user functions of the examples: module-level, so saved workflows name them
def contract_keep_positive(df: Any) -> Any:
    """The rows whose ``cont`` is positive (the ``Filter`` example)."""
    return df["cont"] > 0


def contract_double(s: Any) -> Any:
    """Twice the value (the ``LambdaOp`` example)."""
    return s * 2


def _examples() -> dict[str, tuple[Factory, list[str]]]:
    groupby_aggs = {"cat": ["list", "first", "last", "count"], "cont": ["sum", "mean", "min", "max"],
                    "lst": ["list", "count"]}
    return {
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
        "JoinExternal": (lambda: ops.JoinExternal(pa.table({"cat2": np.arange(0, 30, 2),
                                                            "weight": np.arange(15) / 10}), on="cat2"),
                         ["cat2", "cat"]),
        "DifferenceLag": (lambda: ops.DifferenceLag("user_id", shift=[1, -1]), ["ts", "cont", "user_id"]),
        "Groupby": (lambda: ops.Groupby("user_id", sort_cols="ts", aggs=groupby_aggs),
                    ["user_id", "ts", "cat", "cont", "lst"]),
    }


def _nasty_examples() -> dict[str, tuple[Factory, list[str]]]:
    return {
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


#: op name -> (a zero-argument factory, the columns it selects) over :func:`contract_frame`
CONTRACT_EXAMPLES: dict[str, tuple[Factory, list[str]]] = _examples()
#: the ops whose output depends on a key's identity, once more on :func:`nasty_frame`'s
#: float key ``fkey`` and string lists ``slst`` (run by the nasty-value checks only)
NASTY_EXAMPLES: dict[str, tuple[Factory, list[str]]] = _nasty_examples()


# -- the checks ---------------------------------------------------------------------
def _fit_transform(factory: Factory, columns: Sequence[str], table: Any,
                   part_size: int | None = None) -> tuple[Any, Any]:
    wf = Workflow(list(columns) >> factory())
    wf.fit(Dataset(table, part_size=part_size))
    return wf, wf.transform(table)


def _parts(table: pa.Table, n: int) -> int:
    """The ``part_size`` that cuts ``table`` into about ``n`` partitions."""
    return max(1, table.nbytes // n)


def _many(table: pa.Table) -> int:
    return _parts(table, 5)


def _load_again(wf: Any) -> Any:
    with tempfile.TemporaryDirectory(prefix="tabstream-contract-") as tmp:
        wf.save(str(Path(tmp) / "wf"))
        return Workflow.load(str(Path(tmp) / "wf"))


def assert_same_state(wf: Any, other: Any, rtol: float = 0.0) -> None:
    """The fitted state (JSON values and tables) of every stat op of two workflows
    agree, NaN equal to NaN or None, -0.0 equal to 0.0, floats within ``rtol``."""
    def state(w: Any) -> list[Any]:
        out = []
        for node in w.output_node.walk():
            if node.kind == "op" and node.op.is_stat:
                values, tables = node.op.get_state()
                out.append((type(node.op).__name__, values, {k: nan_to_null(t) for k, t in tables.items()}))
        return out

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, dict) and isinstance(b, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        a, b = (None if isinstance(v, float) and np.isnan(v) else v for v in (a, b))
        if isinstance(a, float) and isinstance(b, float):
            return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
        return bool(a == b)

    for (name, values, tables), (_, values2, tables2) in zip(state(wf), state(other), strict=True):
        assert same(values, values2), f"{name}: fitted state differs: {values} != {values2}"
        assert tables.keys() == tables2.keys(), name
        for key in tables:
            try:
                assert_tables_equal(tables[key], tables2[key], check_dtype=False, rtol=rtol)
            except AssertionError as exc:
                raise AssertionError(f"{name}: fitted table {key!r} differs: {exc}") from None


def _params_round_trip_through_json(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    op = factory()
    params = json.loads(json.dumps(op.get_params()))
    again = type(op)(**params)
    assert again.get_params() == op.get_params(), (
        f"{type(op).__name__}(**get_params()) after a JSON round trip has other parameters: "
        f"{again.get_params()} != {op.get_params()}")


def _declared_schema_equals_produced(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table)
    schema = wf.output_schema
    assert out.column_names == schema.column_names, (
        f"produced columns {out.column_names} != declared {schema.column_names}")
    for col, field in zip(schema, out.schema):
        assert arrow_type_to_dtype(field.type) == (col.dtype, col.is_list), (
            f"column {col.name!r}: produced {field.type}, declared dtype {col.dtype} (list: {col.is_list})")


def _statistics_equal_on_one_and_many_partitions(factory: Factory, columns: Sequence[str],
                                                 table: pa.Table) -> None:
    _, one = _fit_transform(factory, columns, table)
    _, many = _fit_transform(factory, columns, table, part_size=_parts(table, 20))
    assert_tables_equal(one, many)


def _transform_before_fit_raises(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    op = factory()
    try:
        Workflow(list(columns) >> op).transform(table)
    except NotFittedError:
        pass  # what is expected: the workflow refuses
    else:
        raise AssertionError("Workflow.transform before fit did not raise NotFittedError")
    if op.is_stat:
        try:
            op.transform(table.select(list(columns)))
        except NotFittedError as exc:
            assert "has not been fitted" in str(exc), f"the NotFittedError does not say so: {exc}"
        else:
            raise AssertionError(f"{type(op).__name__}.transform before fit did not raise NotFittedError")


def _save_load_gives_identical_output(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table)
    again = _load_again(wf)
    assert_tables_equal(again.transform(table), out)
    assert again.output_schema == wf.output_schema, "the loaded workflow declares another schema"


def _empty_partitions_and_all_null_columns(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    nulls = pa.table({name: pa.nulls(table.num_rows, table.schema.field(name).type) if name in columns
                      else table.column(name) for name in table.column_names})
    wf, out = _fit_transform(factory, columns, nulls, part_size=_parts(table, 20))
    assert out.num_rows <= table.num_rows, f"{out.num_rows} rows out of {table.num_rows} all-null rows"
    empty = wf.transform(table.slice(0, 0))
    assert empty.num_rows == 0 and empty.column_names == wf.output_schema.column_names, (
        f"an empty input gave {empty.num_rows} rows and columns {empty.column_names}")


def _pandas_in_pandas_out(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table)
    df = wf.transform(table.to_pandas())
    assert isinstance(df, pd.DataFrame), f"a pandas input gave a {type(df).__name__}"
    assert list(df.columns) == out.column_names, f"pandas columns {list(df.columns)} != {out.column_names}"


def _changes_row_count_is_declared(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    _, out = _fit_transform(factory, columns, table)
    declared = type(factory()).changes_row_count
    assert declared == (out.num_rows != table.num_rows), (
        f"{table.num_rows} rows in, {out.num_rows} out, but changes_row_count is {declared}")


def _spills_declared_with_spill_dir(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    op = factory()
    assert getattr(op, "spills", False) == ("spill_dir" in op.get_params()), (
        "an op takes spill_dir exactly when it declares spills = True")


def _nasty_schema_and_partitions(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    for data in (table, nasty_pandas(table)):
        wf_one = Workflow(list(columns) >> factory())
        wf_one.fit(Dataset(data))
        wf_many = Workflow(list(columns) >> factory())
        wf_many.fit(Dataset(data, part_size=_many(table)))
        one, many = wf_one.transform(table), wf_many.transform(table)
        for field in one.schema:
            col = wf_one.output_schema[field.name]
            assert arrow_type_to_dtype(field.type) == (col.dtype, col.is_list), col.name
        assert one.column_names == wf_one.output_schema.column_names
        assert_tables_equal(one, many)
        assert wf_one.output_schema == wf_many.output_schema


def _nasty_save_load(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table, part_size=_many(table))
    again = _load_again(wf)
    assert_tables_equal(again.transform(table), out)
    assert again.output_schema == wf.output_schema


def _nan_and_null_are_one_missing_value(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table, part_size=_many(table))
    wf_null, out_null = _fit_transform(factory, columns, nan_to_null(table), part_size=_many(table))
    assert_same_state(wf, wf_null)
    assert_tables_equal(nan_to_null(out), nan_to_null(out_null))
    assert wf.output_schema == wf_null.output_schema


def _negative_zero_is_zero(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    wf, out = _fit_transform(factory, columns, table, part_size=_many(table))
    wf_zero, out_zero = _fit_transform(factory, columns, negative_zero_to_zero(table), part_size=_many(table))
    assert_same_state(wf, wf_zero)
    assert_tables_equal(out, out_zero)
    assert wf.output_schema == wf_zero.output_schema


def _pandas_input_equals_arrow_input(factory: Factory, columns: Sequence[str], table: pa.Table) -> None:
    # a pandas frame's partitions differ in size, so a sum over other partitions may
    # differ in the last bit (rtol); pandas holds strings as large_string once back in
    # Arrow, so values are compared, and the dtypes against the Arrow output converted
    # the same way
    df = nasty_pandas(table)
    wf, out = _fit_transform(factory, columns, table, part_size=_many(table))
    wf_pd = Workflow(list(columns) >> factory())
    wf_pd.fit(Dataset(df, part_size=_many(table)))
    got = wf_pd.transform(df)
    assert isinstance(got, pd.DataFrame), f"a pandas input gave a {type(got).__name__}"
    assert wf_pd.output_schema == wf.output_schema
    assert_same_state(wf, wf_pd, rtol=1e-12)
    assert_tables_equal(nan_to_null(pa.Table.from_pandas(got, preserve_index=False)), nan_to_null(out),
                        check_dtype=False, rtol=1e-12)
    assert dict(got.dtypes) == dict(arrow_to_pandas(out).dtypes)


#: check name -> (check, the frame it runs on: "contract" or "nasty"); a check takes
#: ``(factory, columns, table)`` and raises AssertionError saying what broke
CHECKS: dict[str, tuple[Callable[[Factory, Sequence[str], pa.Table], None], str]] = {
    "params_round_trip_through_json": (_params_round_trip_through_json, "contract"),
    "declared_schema_equals_produced": (_declared_schema_equals_produced, "contract"),
    "statistics_equal_on_one_and_many_partitions": (_statistics_equal_on_one_and_many_partitions, "contract"),
    "transform_before_fit_raises": (_transform_before_fit_raises, "contract"),
    "save_load_gives_identical_output": (_save_load_gives_identical_output, "contract"),
    "empty_partitions_and_all_null_columns": (_empty_partitions_and_all_null_columns, "contract"),
    "pandas_in_pandas_out": (_pandas_in_pandas_out, "contract"),
    "changes_row_count_is_declared": (_changes_row_count_is_declared, "contract"),
    "spills_declared_with_spill_dir": (_spills_declared_with_spill_dir, "contract"),
    "nasty_values_schema_and_partitions": (_nasty_schema_and_partitions, "nasty"),
    "nasty_values_save_load": (_nasty_save_load, "nasty"),
    "nan_and_null_are_one_missing_value": (_nan_and_null_are_one_missing_value, "nasty"),
    "negative_zero_is_zero": (_negative_zero_is_zero, "nasty"),
    "pandas_input_equals_arrow_input": (_pandas_input_equals_arrow_input, "nasty"),
}


def _factory_of(op: Any) -> Factory:
    if isinstance(op, Operator):
        cls = type(op)

        def rebuilt() -> Operator:
            try:
                params = op.get_params()
            except AttributeError as exc:
                raise AssertionError(
                    f"{cls.__name__}.get_params() fails ({exc}): every constructor argument must be kept "
                    "in an attribute of the same name (a saved workflow rebuilds its ops from them)") from exc
            return cls(**params)
        return rebuilt
    if isinstance(op, type) and issubclass(op, Operator):
        return op
    if callable(op):
        return op
    raise TypeError(f"check_op takes an op, an op class or a zero-argument factory of ops, got {op!r}")


def _name_of(op: Any) -> str:
    if isinstance(op, Operator):
        return type(op).__name__
    if isinstance(op, type):
        return op.__name__
    return type(op()).__name__


def _check_columns(table: pa.Table, columns: Sequence[str], which: str) -> None:
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise ValueError(f"check_op: the {which} frame has no columns {missing} (it has {table.column_names}); "
                         f"give {which}= a frame holding the columns the op reads")


def run_check(name: str, op: Any, columns: Sequence[str], *, frame: pa.Table | None = None,
              nasty: pa.Table | None = None) -> None:
    """Run one check of :data:`CHECKS` on ``op`` (an op, its class or a factory)
    selecting ``columns``; an AssertionError names the check and what broke."""
    check, which = CHECKS[name]
    table = (frame if frame is not None else contract_frame()) if which == "contract" else \
        (nasty if nasty is not None else nasty_frame())
    _check_columns(table, columns, which if which == "nasty" else "frame")
    factory = _factory_of(op)
    try:
        check(factory, list(columns), table)
    except AssertionError as exc:
        raise AssertionError(f"op contract check {name!r} failed for {_name_of(op)} "
                             f"on columns {list(columns)}: {exc}") from exc


def check_op(op: Any, columns: Sequence[str] | None = None, *, frame: pa.Table | None = None,
             nasty: pa.Table | None = None, nasty_values: bool = True) -> list[str]:
    """Run the op contract on ``op``; return the names of the checks run.

    ``op`` is an op, an op class or a zero-argument factory of ops (each check builds
    fresh ops from it; an op is rebuilt from its ``get_params()``). ``columns`` are
    the columns it selects; for an op of the catalog they default to its entry of
    :data:`CONTRACT_EXAMPLES` (and its class is built as that entry builds it). The checks run on :func:`contract_frame` (or
    ``frame=``) and, with ``nasty_values``, on :func:`nasty_frame` (or ``nasty=``).
    The first failing check raises an AssertionError naming it.
    """
    _factory_of(op)  # refuses what is not an op
    if columns is None:
        name = _name_of(op)
        if name not in CONTRACT_EXAMPLES:
            raise ValueError(f"check_op: give the columns {name} selects (columns=[...]); only the ops of "
                             "the catalog have default columns")
        example, columns = CONTRACT_EXAMPLES[name]
        if isinstance(op, type):
            op = example  # the class of a catalog op: built as its example
    ran = []
    for name, (_, which) in CHECKS.items():
        if which == "nasty" and not nasty_values:
            continue
        run_check(name, op, columns, frame=frame, nasty=nasty)
        ran.append(name)
    return ran

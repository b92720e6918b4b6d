"""NVTabular's call forms and custom ops gone wrong (issue 31, the measurement against
NVTabular's own tests): an op class that needs parameters applied bare, methods called
with the wrong arguments, custom ops that return the wrong thing or another dtype than
they declare, files asked of an op that wrote none; and a custom op read right."""

from __future__ import annotations

import numpy as np
import pandas as pd

import tabstream.compat.nvtabular as nvt
from tabstream.compat.nvtabular import ColumnSelector, ops
from tabstream.core.errors import SchemaError

FRAME = pd.DataFrame({"u": [1, 1, 2, 2], "x": [1.0, 3.0, 2.0, 6.0], "c": ["a", "b", "a", "b"]})


def _fit(node, frame=FRAME):
    return nvt.Workflow(node).fit_transform(nvt.Dataset(frame)).to_ddf().compute()


class _ReturnsList(ops.Operator):
    def transform(self, col_selector, df):
        return df[col_selector.names].to_numpy().tolist()


class _DeclaresInt(ops.Operator):
    output_dtype = np.int64

    def transform(self, col_selector, df):
        return df[col_selector.names] / 2


class _MinusUserMean(ops.Operator):
    @property
    def dependencies(self):
        return ["u"]

    def transform(self, col_selector, df):
        return df[col_selector.names].sub(df.groupby("u")["x"].transform("mean"), axis=0)


def _class_needing_parameters(tmp):
    ["x"] >> ops.Bucketize


def _transform_three_arguments(tmp):
    ops.LogOp().transform(ColumnSelector(["x"]), FRAME, "extra")


def _custom_op_returns_a_list(tmp):
    _fit(["x"] >> _ReturnsList())


def _custom_op_dtype_not_as_declared(tmp):
    _fit(["x"] >> _DeclaresInt())


def _categories_without_out_path(tmp):
    op = ops.Categorify()
    _fit(["c"] >> op)
    _ = op.categories


def _subtract_a_node_selecting_by_tag(tmp):
    (["x", "c"] >> ops.Operator()) - (ColumnSelector(tags=["continuous"]) >> ops.Operator())


def _custom_op_with_a_dependency_read_right(tmp):
    out = _fit(["x"] >> _MinusUserMean())
    expected = FRAME["x"] - FRAME.groupby("u")["x"].transform("mean")
    assert list(out.columns) == ["x"] and out["x"].tolist() == expected.tolist()


CASES = [
    ("op-class-needs-parameters", _class_needing_parameters, TypeError,
     r"Bucketize is a class and it needs \['boundaries'\]; apply an instance: >> Bucketize\(\.\.\.\)"),
    ("transform-three-arguments", _transform_three_arguments, TypeError,
     r"LogOp.transform takes \(table\) or NVTabular's \(col_selector, df\), got 3 arguments"),
    ("custom-op-returns-a-list", _custom_op_returns_a_list, TypeError,
     r"_ReturnsList.transform\(col_selector, df\) must return a pandas DataFrame of its output columns, got list"),
    ("custom-op-dtype-not-as-declared", _custom_op_dtype_not_as_declared, SchemaError,
     r"_DeclaresInt declared column 'x' as int64 but produced float64"),
    ("categories-without-out-path", _categories_without_out_path, ValueError,
     r"this op has none: pass Categorify\(out_path=folder\)"),
    ("subtract-node-selecting-by-tag", _subtract_a_node_selecting_by_tag, TypeError,
     r"selects columns by tag; give the column names instead"),
    ("custom-op-dependency-read-right", _custom_op_with_a_dependency_read_right, None, None),
]

"""NVTabular code a migrating user gets wrong (issue 31): NVTabular's parameters with
values tabstream cannot honour, filtered frames that lost their rows' labels, side
tables that are not tables, schema shapes, misspelt tags; and one input read right
(a workflow without statistics transformed without fit)."""

from __future__ import annotations

import numpy as np
import pandas as pd

import tabstream.compat.nvtabular as nvt
from tabstream.compat.nvtabular import ops
from tabstream.core.errors import DataError, ExportError, SchemaError

FRAME = pd.DataFrame({"c": ["a", "b", "a", None], "x": [1.0, -2.0, 3.0, np.nan], "y": [1, 2, 3, 4],
                      "l": [[1, 2], [3], [], [4]]})


def _fit(node, frame=FRAME):
    return nvt.Workflow(node).fit_transform(frame)


def _out_path_is_a_file(tmp):
    blocker = tmp / "stats"
    blocker.write_text("not a folder")
    _fit(["c"] >> ops.Categorify(out_path=str(blocker)))


def _side_csv_garbage(tmp):
    path = tmp / "side.csv"
    path.write_bytes(b'"c,\x00\x01\n"unterminated')
    _fit(["c"] >> ops.JoinExternal(str(path), on="c"))


def _transform_without_fit_is_right(tmp):
    out = nvt.Workflow(["x"] >> ops.Clip(min_value=0) >> ops.LogOp()).transform(FRAME)
    expected = np.log1p(FRAME["x"].clip(lower=0)).astype("float32")
    np.testing.assert_array_equal(out["x"].to_numpy(), expected.to_numpy())


CASES = [
    ("Categorify dtype not an integer", lambda tmp: ops.Categorify(dtype=np.float32), TypeError,
     r"Categorify: dtype must be an integer dtype such as 'int32', np.int64 or None, got <class 'numpy.float32'>"),
    ("Categorify ids beyond the dtype", lambda tmp: _fit(["c"] >> ops.Categorify(dtype="int8"),
                                                         pd.DataFrame({"c": [str(i) for i in range(200)]})),
     ValueError, r"the ids of 'c' do not fit dtype int8 .*pass a wider dtype, e.g. dtype='int64'"),
    ("Categorify num_buckets dict of zero", lambda tmp: ops.Categorify(num_buckets={"c": 0}), ValueError,
     r"num_buckets must be a positive integer, a dict column -> positive integer, or None, got \{'c': 0\}"),
    ("Categorify num_buckets dict with single_table",
     lambda tmp: ops.Categorify(num_buckets={"c": 2}, single_table=True), ValueError,
     "single_table=True shares one range of out-of-vocabulary ids; give num_buckets as one integer"),
    ("Categorify out_path is a file", _out_path_is_a_file, ExportError,
     r"Categorify: cannot write its statistics to out_path='.*stats'.*pass a writable folder, or out_path=None"),
    ("out_path not a string", lambda tmp: ops.TargetEncoding("y", out_path=3), TypeError,
     r"TargetEncoding: out_path must be a folder path \(a non-empty string\) or None, got 3"),
    ("split_out of zero", lambda tmp: ops.JoinGroupby(cont_cols=["x"], split_out=0), ValueError,
     r"JoinGroupby: split_out must be a positive integer, a dict column -> positive integer, or None, got 0"),
    ("TargetEncoding target node selecting by tag",
     lambda tmp: ops.TargetEncoding(nvt.ColumnSelector(tags=["target"]) >> ops.LogOp()), TypeError,
     r"TargetEncoding: target: .* selects columns by tag; give the column names instead"),
    ("TargetEncoding name_sep", lambda tmp: ops.TargetEncoding("y", name_sep="-"), ValueError,
     r"TargetEncoding: name_sep='-' is not supported; outputs are named TE_<group>_<target>"),
    ("Filter frame with a reset index",
     lambda tmp: _fit(["x", "y"] >> ops.Filter(lambda d: d[d.x > 0].reset_index(drop=True))), TypeError,
     r"returned a frame whose rows are not the given rows at its index labels \(was the index reset"),
    ("Filter frame with an index out of the rows",
     lambda tmp: _fit(["x", "y"] >> ops.Filter(lambda d: d.set_axis([5, 6, 7, 8]))), TypeError,
     r"returned a frame whose index is not a selection of the given rows 0..3 \(do not reset"),
    ("Filter frame with other columns", lambda tmp: _fit(["x", "y"] >> ops.Filter(lambda d: d[["x"]])),
     TypeError, r"returned a frame with columns \['x'\]; a filtered frame keeps the columns it was given \['x', 'y'\]"),
    ("JoinExternal CSV side table unreadable", _side_csv_garbage, DataError,
     r"JoinExternal: cannot read side table '.*side.csv' as CSV .*kind_ext='csv'"),
    ("JoinExternal kind_ext unknown", lambda tmp: ops.JoinExternal(FRAME, on="c", kind_ext="excel"), ValueError,
     r"kind_ext must be None \(inferred\) or one of \['parquet', 'csv', 'pandas', 'arrow', .*'dask'\], got 'excel'"),
    ("JoinExternal a list as side table", lambda tmp: ops.JoinExternal([1, 2], on="c"), TypeError,
     r"df_ext must be a pandas or dask DataFrame, a pyarrow Table, a Dataset or a parquet/CSV path, got list"),
    ("ColumnSchema shape of three dims", lambda tmp: nvt.ColumnSchema("v", dtype=np.int64).with_shape((None, 2, 2)),
     ValueError, r"ColumnSchema 'v': shape must be \(None,\), \(None, None\) or \(None, n\)"),
    ("misspelt tag", lambda tmp: ops.AddTags(["categorial"]), ValueError,
     "unknown tag 'categorial'; did you mean 'categorical'"),
    ("output_schema before fit", lambda tmp: (["c"] >> ops.Categorify()).output_schema["c"], SchemaError,
     r"has no output schema yet: fit its workflow first"),
    ("get_embedding_sizes of a frame", lambda tmp: ops.get_embedding_sizes(FRAME), (TypeError, AttributeError),
     r"get_embedding_sizes takes a fitted Workflow or a node of one|has no attribute 'output_schema'"),
    ("Groupby nunique of a list column",
     lambda tmp: _fit(["l"] >> ops.Groupby("c", aggs={"l": "nunique"})), TypeError,
     r"aggregation 'nunique' does not apply to the list column 'l'"),
    ("node pick of a missing column", lambda tmp: _fit((["c", "x"] >> ops.Categorify())["z"]), SchemaError,
     r"node\[\['z'\]\]: \['z'\] are not among its columns \['c', 'x'\]"),
    ("NVTabular name without a counterpart", lambda tmp: ops.ColumnSimilarity, AttributeError,
     "nvtabular.ops.ColumnSimilarity has no tabstream counterpart"),
    ("workflow without statistics transforms without fit", _transform_without_fit_is_right, None, None),
]

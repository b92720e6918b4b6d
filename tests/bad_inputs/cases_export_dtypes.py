"""to_parquet(dtypes=...) and to_npy: casts and arrays that cannot hold the data."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError


def _export(tmp, df, dtypes):
    ts.Dataset(df, part_size=None).to_parquet(str(tmp / "out"), dtypes=dtypes)


def _id_over_int32(tmp):
    _export(tmp, pd.DataFrame({"id": [5, 2**31]}), {"id": "int32"})


def _negative_into_unsigned(tmp):
    _export(tmp, pd.DataFrame({"id": [5, -1]}), {"id": np.uint64})


def _fraction_into_int(tmp):
    _export(tmp, pd.DataFrame({"p": [1.0, 0.75]}), {"p": pa.int32()})


def _whole_floats_into_int8(tmp):
    _export(tmp, pd.DataFrame({"p": [1.0, 2.0]}), {"p": "int8"})  # they fit: read back
    got = pq.read_table(tmp / "out").column("p")
    assert got.type == pa.int8() and got.to_pylist() == [1, 2]


def _float_overflow(tmp):
    _export(tmp, pd.DataFrame({"p": [1.5, -3e40]}), {"p": "float32"})


def _list_value_over_int16(tmp):
    _export(tmp, pd.DataFrame({"l": [[1, 2], [40_000]]}), {"l": "int16"})


def _unknown_column(tmp):
    _export(tmp, pd.DataFrame({"id": [1]}), {"id": "int32", "ID": "int32"})


def _bad_dtype(tmp):
    _export(tmp, pd.DataFrame({"id": [1]}), {"id": "integer32"})


def _dtypes_not_dict(tmp):
    _export(tmp, pd.DataFrame({"id": [1]}), ["int32"])


def _npy_strings(tmp):
    ts.Dataset(pd.DataFrame({"a": [1], "name": ["x"]})).to_npy(tmp / "a.npy")


def _npy_ragged(tmp):
    ts.Dataset(pd.DataFrame({"l": [[1, 2], [3]]})).to_npy(tmp / "a.npy")


def _npy_null(tmp):
    ts.Dataset(pd.DataFrame({"a": pd.array([1, None], dtype="Int64")})).to_npy(tmp / "a.npy")


def _npy_append_other_width(tmp):
    np.save(tmp / "a.npy", np.zeros((2, 3)))
    ts.Dataset(pd.DataFrame({"a": [1.0]})).to_npy(tmp / "a.npy", append=True)


def _npy_missing_folder(tmp):
    ts.Dataset(pd.DataFrame({"a": [1.0]})).to_npy(tmp / "no" / "a.npy")


CASES = [
    ("dtypes_id_over_int32", _id_over_int32, DataError, r"column 'id': value 2147483648 does not fit int32"),
    ("dtypes_negative_into_unsigned", _negative_into_unsigned, DataError, r"column 'id': value -1 does not fit uint64"),
    ("dtypes_fraction_into_int", _fraction_into_int, DataError, r"column 'p': value 0\.75 does not fit int32"),
    ("dtypes_whole_floats_into_int8", _whole_floats_into_int8, None, None),
    ("dtypes_float_overflow", _float_overflow, DataError, r"column 'p': value -3e\+40 does not fit float32"),
    ("dtypes_list_value_over_int16", _list_value_over_int16, DataError, r"column 'l': value 40000 does not fit int16"),
    ("dtypes_unknown_column", _unknown_column, SchemaError, r"column\(s\) \['ID'\] are not in the output"),
    ("dtypes_bad_dtype", _bad_dtype, TypeError, r"column 'id': unsupported dtype 'integer32'"),
    ("dtypes_not_a_dict", _dtypes_not_dict, TypeError, r"dtypes must be a dict \{column: dtype\}, got list"),
    ("npy_strings", _npy_strings, SchemaError, r"column\(s\) \['name'\] hold strings"),
    ("npy_ragged_list", _npy_ragged, DataError, r"list column 'l' is ragged \(rows of 1 to 2 values\)"),
    ("npy_null", _npy_null, DataError, r"column 'a' has 1 null value\(s\)"),
    ("npy_append_other_width", _npy_append_other_width, DataError,
     r"the file holds a float64 array of shape \(2, 3\); the rows to append are float64 with 1 columns"),
    ("npy_missing_folder", _npy_missing_folder, FileNotFoundError, r"folder '.*/no' does not exist"),
]

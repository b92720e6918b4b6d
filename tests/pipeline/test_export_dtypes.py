"""to_parquet(dtypes=...) and to_npy, as NVTabular/Merlin users call them: the values
and dtypes read back equal a plain pandas/numpy reference, and what cannot be written
faithfully is refused with a message naming the column and value."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, SchemaError


def _frame(n: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({
        "id": rng.integers(0, 2**31 - 1, n, dtype=np.int64),
        "price": rng.random(n),
        "cat": rng.choice(["a", "b", "c", "d"], n),
        "label": rng.integers(0, 2, n, dtype=np.int64),
    })


def _read(folder) -> pd.DataFrame:
    files = json.loads((folder / "_manifest.json").read_text())["files"]
    return pd.concat([pq.read_table(folder / f["path"]).to_pandas() for f in files], ignore_index=True)


@pytest.mark.parametrize(("id_dtype", "price_dtype"), [
    (np.int32, np.float32), ("int32", "float32"), (pa.int32(), pa.float32()), (np.dtype("uint32"), "float16"),
])
def test_dtypes_cast_as_pandas_astype(tmp_path, id_dtype, price_dtype):
    df = _frame()
    out = tmp_path / "out"
    ts.Dataset(df, part_size=None).to_parquet(str(out), num_files=3, dtypes={"id": id_dtype, "price": price_dtype})
    got = _read(out)
    np_id = np.dtype(id_dtype.to_pandas_dtype() if isinstance(id_dtype, pa.DataType) else id_dtype)
    np_price = np.dtype(price_dtype.to_pandas_dtype() if isinstance(price_dtype, pa.DataType) else price_dtype)
    expected = df.astype({"id": np_id, "price": np_price})
    assert got["id"].dtype == np_id and got["price"].dtype == np_price
    np.testing.assert_array_equal(got["id"].to_numpy(), expected["id"].to_numpy())
    np.testing.assert_array_equal(got["price"].to_numpy(), expected["price"].to_numpy())
    np.testing.assert_array_equal(got["label"].to_numpy(), df["label"].to_numpy())  # untouched
    schema = ts.Schema.from_json((out / "_schema.json").read_text())
    assert (schema["id"].dtype, schema["price"].dtype, schema["label"].dtype) == (
        np_id.name, np_price.name, "int64")
    assert ts.Dataset(str(out)).schema["id"].dtype == np_id.name


def test_dtypes_after_a_workflow_and_on_lists(tmp_path):
    df = _frame()
    df["hist"] = [[int(i), int(i) + 1, int(i) * 2] for i in range(len(df))]
    wf = ts.Workflow((["cat"] >> ops.Categorify()) + ["hist", "label"])
    ds = ts.Dataset(df, part_size=None)
    wf.fit(ds)
    reference = wf.transform(df)
    out = tmp_path / "out"
    wf.transform(ds).to_parquet(str(out), dtypes={"cat": "int16", "hist": np.int32, "label": "float32"},
                                shuffle="per_partition", seed=3)
    got = _read(out).sort_values(["label", "cat"], kind="stable")
    assert (got["cat"].dtype, got["label"].dtype) == (np.int16, np.float32)
    assert pq.read_schema(out / "part_00000.parquet").field("hist").type.value_type == pa.int32()
    want = reference.astype({"cat": "int16", "label": "float32"})
    key = lambda frame: sorted(zip(frame["cat"], frame["label"], map(tuple, frame["hist"])))  # noqa: E731
    assert key(got) == key(want)
    schema = ts.Schema.from_json((out / "_schema.json").read_text())
    assert schema["hist"].dtype == "int32" and schema["hist"].is_list
    assert schema["cat"].properties == wf.output_schema["cat"].properties  # cardinality kept


def _refused(tmp_path, df, dtypes):
    out = tmp_path / "out"
    ts.Dataset(df, part_size=None).to_parquet(str(out), dtypes=dtypes)


def test_dtypes_refusals(tmp_path):
    with pytest.raises(DataError, match=r"column 'id': value 3000000000 does not fit int32"):
        _refused(tmp_path, pd.DataFrame({"id": [1, 3_000_000_000]}), {"id": "int32"})
    with pytest.raises(DataError, match=r"column 'p': value 2\.5 does not fit int64"):
        _refused(tmp_path, pd.DataFrame({"p": [1.0, 2.5]}), {"p": np.int64})
    with pytest.raises(DataError, match=r"column 'p': value 1e\+300 does not fit float32"):
        _refused(tmp_path, pd.DataFrame({"p": [0.1, 1e300]}), {"p": "float32"})
    with pytest.raises(DataError, match=r"column 's': value 'x' does not fit int64"):
        _refused(tmp_path, pd.DataFrame({"s": ["1", "x"]}), {"s": "int64"})
    with pytest.raises(SchemaError, match=r"column\(s\) \['nope'\] are not in the output; the output "
                                          r"columns are \['id'\]"):
        _refused(tmp_path, pd.DataFrame({"id": [1]}), {"nope": "int32"})
    with pytest.raises(TypeError, match=r"column 'id': unsupported dtype 'int33'"):
        _refused(tmp_path, pd.DataFrame({"id": [1]}), {"id": "int33"})
    assert list(tmp_path.iterdir()) == []  # nothing written, no leftovers


def _npy_reference(frame: pd.DataFrame) -> np.ndarray:
    """Merlin's layout, the simple way: scalars, then list columns spread as name_i."""
    scalars = [c for c in frame.columns if frame[c].dtype != object]
    lists = [c for c in frame.columns if frame[c].dtype == object]
    parts = [frame[scalars].to_numpy()] + [np.array(frame[c].tolist()) for c in lists]
    return np.concatenate(parts, axis=1)


def test_to_npy_layout_and_append(tmp_path):
    df = pd.DataFrame({"a": np.arange(9, dtype=np.int64), "emb": [[i, -i] for i in range(9)],
                       "b": np.arange(9) / 4})
    ds = ts.Dataset(df, part_size=None)
    path = ds.to_npy(tmp_path / "out")  # .npy added, as np.save does
    assert path == str(tmp_path / "out.npy")
    got = np.load(path, allow_pickle=False)
    want = _npy_reference(df[["a", "b", "emb"]])
    assert got.dtype == want.dtype == np.float64
    np.testing.assert_array_equal(got, want)
    ds.to_npy(path, append=True)
    np.testing.assert_array_equal(np.load(path, allow_pickle=False), np.concatenate([want, want]))
    with pytest.raises(DataError, match=r"append=True\): the file holds a float64 array of shape \(18, 4\); "
                                        r"the rows to append are int64 with 1 columns \(\['a'\]\)"):
        ts.Dataset(df[["a"]]).to_npy(path, append=True)


def test_to_npy_of_a_transformed_dataset(tmp_path):
    df = _frame(30)
    wf = ts.Workflow((["cat"] >> ops.Categorify()) + ["label"])
    ds = ts.Dataset(df, part_size=None)
    wf.fit(ds)
    got = np.load(wf.transform(ds).to_npy(tmp_path / "t.npy"), allow_pickle=False)
    want = wf.transform(df)[["cat", "label"]].to_numpy()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, want)


def test_to_npy_refusals(tmp_path):
    with pytest.raises(SchemaError, match=r"column\(s\) \['cat'\] hold strings"):
        ts.Dataset(_frame()).to_npy(tmp_path / "s.npy")
    with pytest.raises(DataError, match=r"list column 'l' is ragged \(rows of 1 to 2 values\)"):
        ts.Dataset(pd.DataFrame({"l": [[1], [1, 2]]})).to_npy(tmp_path / "r.npy")
    with pytest.raises(DataError, match=r"column 'x' has 1 null value\(s\)"):
        ts.Dataset(pd.DataFrame({"x": [1.0, None, 2.0]})).to_npy(tmp_path / "n.npy")
    with pytest.raises(ValueError, match=r"to_npy writes a local file, got 's3://b/k.npy'"):
        ts.Dataset(pd.DataFrame({"x": [1]})).to_npy("s3://b/k.npy")
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left

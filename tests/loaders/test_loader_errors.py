"""Bad input fails before or at the first batch, with the file and column named,
and never hangs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream
from tabstream.core.errors import DataError, SchemaError
from tabstream.loaders import Loader
from tabstream.pipeline.dataset import DatasetWarning


def first_batch(data: Any, **kwargs: Any) -> Any:
    return next(iter(Loader(data, 100, **kwargs)))


def test_missing_file(export: Path) -> None:
    files = sorted(str(p) for p in export.glob("part_*.parquet"))
    gone = str(export / "part_99999.parquet")
    with pytest.raises(FileNotFoundError, match="part_99999.parquet"):
        Loader([*files, gone], 100)


def test_missing_file_listed_in_the_manifest(export: Path) -> None:
    (export / "part_00002.parquet").unlink()
    with pytest.raises(DataError, match=r"part_00002.parquet: listed in .*_manifest.json with 1500 "
                                        r"rows, but the file is missing \(found 0 rows\)"):
        Loader(export, 100)


def test_missing_path_and_empty_glob(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        Loader(tmp_path / "nowhere", 100)
    with pytest.raises(FileNotFoundError, match="no files match"):
        Loader(str(tmp_path / "*.parquet"), 100)


def test_corrupt_footer(export: Path) -> None:
    (export / "part_00003.parquet").write_bytes(b"this is not parquet" * 10)
    with pytest.raises(DataError, match="part_00003.parquet.*not a readable parquet file"):
        Loader(export, 100)


def test_corrupt_data_pages_fail_at_the_first_batch(tmp_path: Path, testdata: Any) -> None:
    # A file with an intact footer and garbage pages: only reading the data finds it,
    # in the background thread; the error must reach the consumer. (The first file
    # is good: the Dataset samples it when planning.)
    path = tmp_path / "bad"
    path.mkdir()
    pq.write_table(testdata.make_table(np.arange(100), with_lists=False), path / "part_0.parquet")
    pq.write_table(testdata.make_table(np.arange(100, 5100), with_lists=False),
                   path / "part_1.parquet", compression="snappy")
    raw = bytearray((path / "part_1.parquet").read_bytes())
    md = pq.read_metadata(path / "part_1.parquet")
    col = md.row_group(0).column(1)
    start = col.data_page_offset
    raw[start + 20:start + 400] = b"\xff" * 380
    (path / "part_1.parquet").write_bytes(bytes(raw))
    loader = Loader(path, 100, labels=[], shuffle=False)
    with pytest.raises(DataError, match="cannot read row group 0 of .*part_1.parquet"):
        for _ in loader:
            pass


def _all_rows(loader: Loader) -> dict[str, np.ndarray]:
    batches = [features for features, _ in loader]
    return {name: np.concatenate([b[name] for b in batches]) for name in batches[0]}


def test_column_missing_in_one_file_is_null_there(export: Path, testdata: Any) -> None:
    # Files whose columns differ are read as one Dataset (missing cells are null):
    # a float column delivers NaN there, an integer column refuses with the file named.
    (export / "_manifest.json").unlink()
    table = testdata.make_table(np.arange(5000, 5100), with_lists=False).drop_columns(["I1"])
    pq.write_table(table, export / "part_00001.parquet")
    with pytest.warns(DatasetWarning,
                      match=r"\['I1', 'tags', 'weights'\] null in the rows of .*part_00001.parquet"):
        loader = Loader(export, 100, shuffle=False, features=["row_id", "I1"], labels=[])
    got = _all_rows(loader)
    expected = pd.concat([pd.read_parquet(p, columns=["row_id", "I1"]) if "I1" in pq.read_schema(p).names
                          else pd.read_parquet(p, columns=["row_id"]).assign(I1=np.nan)
                          for p in sorted(export.glob("part_*.parquet"))])
    assert np.array_equal(got["row_id"], expected["row_id"].to_numpy())
    np.testing.assert_array_equal(got["I1"], expected["I1"].to_numpy(dtype=np.float32))
    assert np.isnan(got["I1"][np.isin(got["row_id"], np.arange(5000, 5100))]).all()

    table = testdata.make_table(np.arange(5000, 5100), with_lists=False).drop_columns(["C1"])
    pq.write_table(table, export / "part_00001.parquet")
    with pytest.raises(DataError, match="column 'C1' has 100 nulls in row group 0 of .*part_00001"), \
            pytest.warns(DatasetWarning,
                         match=r"\['C1', 'tags', 'weights'\] null in the rows of .*part_00001.parquet"):
        _all_rows(Loader(export, 100, shuffle=False, features=["C1"], labels=[]))


def test_column_types_differing_between_files(export: Path, testdata: Any) -> None:
    (export / "_manifest.json").unlink()
    table = testdata.make_table(np.arange(5000, 5100))
    table = table.set_column(2, "I1", table["I1"].cast(pa.float64()))
    pq.write_table(table, export / "part_00004.parquet")
    # The schema file says float32, and part_00004 disagrees: refused, file named.
    with pytest.raises(SchemaError, match="column 'I1' is float64 in .*part_00004.parquet' but the "
                                          "schema says float32"):
        Loader(export, 100)
    # Without one, float32 and float64 widen to float64 in every batch.
    (export / "schema.json").unlink()
    got = _all_rows(Loader(export, 100, shuffle=False, features=["row_id", "I1"], labels=[]))
    expected = pd.concat([pd.read_parquet(p, columns=["row_id", "I1"]).astype({"I1": "float64"})
                          for p in sorted(export.glob("part_*.parquet"))])
    assert got["I1"].dtype == np.float64
    np.testing.assert_array_equal(got["I1"], expected["I1"].to_numpy())
    # Types that do not widen into one another are refused, both files named.
    table = table.set_column(2, "I1", pa.array([str(i) for i in range(100)]))
    pq.write_table(table, export / "part_00004.parquet")
    with pytest.raises(SchemaError, match="part_00004.parquet: column 'I1' is string, but "
                                          ".*part_00000.parquet has float"):
        Loader(export, 100)


def test_files_disagree_with_schema_json(export: Path, testdata: Any) -> None:
    schema = testdata.export_schema()
    schema = schema.replace(schema["C1"].with_dtype("int32"))
    schema.to_json(str(export / "schema.json"))
    with pytest.raises(SchemaError, match="column 'C1' is int64 in .*part_00000.parquet' but the "
                                          "schema says int32"):
        Loader(export, 100)


def test_selected_column_not_in_schema(export: Path) -> None:
    with pytest.raises(SchemaError, match="features column 'nope' is not in the dataset schema"):
        Loader(export, 100, features=["nope"])
    with pytest.raises(SchemaError, match="no column of the schema is tagged 'user_id'"):
        Loader(export, 100, features=[tabstream.Tags.USER_ID])
    with pytest.raises(ValueError, match=r"columns \['C1'\] are selected both"):
        Loader(export, 100, features=["C1"], labels=["C1"])


def test_empty_dataset(tmp_path: Path, testdata: Any) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="folder .*empty' holds no data files"):
        Loader(tmp_path / "empty", 100)
    (tmp_path / "zero").mkdir()
    pq.write_table(testdata.make_table(np.arange(0), with_lists=False),
                   tmp_path / "zero" / "part_0.parquet")
    with pytest.raises(DataError, match="the dataset is empty: its 1 file.*hold no rows"):
        Loader(tmp_path / "zero", 100)
    with pytest.raises(DataError, match="empty list of files"):
        Loader([], 100)


@pytest.mark.parametrize("bad", [0, -5])
def test_batch_size_must_be_positive(export: Path, bad: int) -> None:
    with pytest.raises(ValueError, match=f"batch_size must be >= 1, got {bad}"):
        Loader(export, bad)


def test_bad_argument_types_and_ranks(export: Path) -> None:
    with pytest.raises(TypeError, match="batch_size must be an int, got float"):
        Loader(export, 10.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="global_rank must be < global_size=2, got 2"):
        Loader(export, 10, global_size=2, global_rank=2)
    with pytest.raises(TypeError, match="a loader reads a tabstream.Dataset"):
        Loader(42, 10)


def test_fewer_rows_than_ranks_and_drop_last(tmp_path: Path, testdata: Any) -> None:
    path = testdata.write_export(tmp_path / "tiny", file_rows=[3], row_groups=[3])
    with pytest.raises(ValueError, match="3 rows, fewer than the 4 ranks"):
        Loader(path, 10, global_size=4, global_rank=0)
    with pytest.raises(ValueError, match="drop_last=True the 3 rows give no batch"):
        Loader(path, 10, drop_last=True)


def test_string_columns_must_be_encoded(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    pq.write_table(pa.table({"C1": ["a", "b"], "label": [0, 1]}), tmp_path / "raw" / "p.parquet")
    with pytest.raises(TypeError, match="column 'C1' has type string.*Categorify"):
        Loader(tmp_path / "raw", 10)
    features, _ = next(iter(Loader(tmp_path / "raw", 10, features=["label"])))
    assert features["label"].tolist() == [0, 1]


def test_nulls_in_integer_column_fail_at_the_first_batch(tmp_path: Path) -> None:
    (tmp_path / "nulls").mkdir()
    pq.write_table(pa.table({"C1": pa.array([1, None, 3], pa.int64()),
                             "I1": pa.array([1.0, None, 2.0], pa.float32())}),
                   tmp_path / "nulls" / "p.parquet")
    features, _ = first_batch(tmp_path / "nulls", features=["I1"])
    assert np.isnan(features["I1"][1])
    with pytest.raises(DataError, match="column 'C1' has 1 nulls in row group 0 of .*p.parquet"):
        first_batch(tmp_path / "nulls")


def test_pad_without_a_length(export: Path, testdata: Any) -> None:
    schema = testdata.export_schema()
    schema = schema.replace(schema["tags"].with_properties(value_count={}))
    schema.to_json(str(export / "schema.json"))
    with pytest.raises(ValueError, match=r"list column 'tags' has no value_count max.*pad=\{'tags'"):
        Loader(export, 100, pad=True)
    with pytest.raises(ValueError, match=r"pad names \['C1'\], which are not selected list"):
        Loader(export, 100, pad={"C1": 3})


def test_csv_dataset_is_refused(tmp_path: Path) -> None:
    (tmp_path / "raw.csv").write_text("label,I1\n0,1.5\n1,2.5\n")
    with pytest.raises(DataError, match="engine is 'csv'.*to_parquet"):
        Loader(tabstream.Dataset(str(tmp_path / "raw.csv")), 10)


def test_files_changed_after_planning_fail_loudly(export: Path, testdata: Any) -> None:
    loader = Loader(export, 100, shuffle=False)
    shutil.copy(export / "part_00001.parquet", export / "part_00000.parquet")
    with pytest.raises(DataError, match="part_00000.parquet"):
        for _ in loader:
            pass

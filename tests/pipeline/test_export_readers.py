"""An export folder is read as-is by pandas, pyarrow.dataset, polars and dask, and
its data files keep the Schema (tags, properties) in their parquet key-value
metadata."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.core.schema import Schema, Tags
from tabstream.testing import assert_tables_equal


@pytest.fixture
def exported(small_raw, tmp_path):
    graph = (["C1", "C2"] >> ops.Categorify() ) + (["I2"] >> ops.Normalize()) + (
        ["label"] >> ops.AddTags([Tags.TARGET]))
    wf = ts.Workflow(graph).fit(ts.Dataset(small_raw, part_size=4000))
    out = tmp_path / "out"
    wf.transform(ts.Dataset(small_raw, part_size=4000)).to_parquet(str(out), num_files=3)
    manifest = json.loads((out / "_manifest.json").read_text())
    expected = pa.concat_tables([pq.read_table(out / f["path"]) for f in manifest["files"]])
    assert len(manifest["files"]) == 3
    return out, wf, expected.replace_schema_metadata(None)


def _plain(table: pa.Table) -> pa.Table:
    return table.replace_schema_metadata(None)


def test_pandas_reads_export_folder(exported):
    import pandas as pd

    out, _, expected = exported
    assert_tables_equal(pd.read_parquet(out), expected.to_pandas(), check_dtype=False)


def test_pyarrow_dataset_reads_export_folder(exported):
    import pyarrow.dataset as pds

    out, _, expected = exported
    assert_tables_equal(_plain(pds.dataset(str(out)).to_table()), expected)


def test_polars_scans_export_files(exported):
    import polars as pl

    out, _, expected = exported
    frame = pl.scan_parquet(str(out) + "/*.parquet").collect()
    assert_tables_equal(_plain(frame.to_arrow()), expected, check_dtype=False)


# dask's parquet reader itself calls reset_index(inplace=True), deprecated by pandas 3.1
@pytest.mark.filterwarnings("ignore:The inplace keyword in DataFrame.reset_index:DeprecationWarning")
def test_dask_reads_export_folder(exported):
    import dask.dataframe as dd

    out, _, expected = exported
    frame = dd.read_parquet(str(out)).compute(scheduler="sync").reset_index(drop=True)
    assert_tables_equal(frame, expected.to_pandas(), check_dtype=False)


def test_tags_travel_in_parquet_key_value_metadata(exported, tmp_path):
    out, wf, expected = exported
    for f in sorted(out.glob("*.parquet")):
        stored = pq.read_schema(f).metadata[b"tabstream.schema"]
        assert Schema.from_json(stored.decode()) == wf.output_schema
    # only the data files, copied elsewhere: the Dataset still knows the tags
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in out.glob("*.parquet"):
        shutil.copy(f, bare / f.name)
    schema = ts.Dataset(str(bare)).schema
    assert schema.select_by_tag(Tags.CATEGORICAL).column_names == ["C1", "C2"]
    assert schema.select_by_tag(Tags.TARGET).column_names == ["label"]
    assert schema["C1"].properties == wf.output_schema["C1"].properties


def test_bad_schema_in_key_value_metadata_is_refused(tmp_path):
    table = pa.table({"a": [1, 2]}).replace_schema_metadata({b"tabstream.schema": b"{not json"})
    path = tmp_path / "x" / "part_0.parquet"
    path.parent.mkdir()
    pq.write_table(table, path)
    with pytest.raises(DataError, match=r"part_0\.parquet: the schema in its parquet key-value "
                                         r"metadata \(tabstream\.schema\) is not a valid"):
        ts.Dataset(str(path.parent))


def test_plain_files_without_key_value_schema_still_read(tmp_path):
    Path(tmp_path / "y").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "y" / "p.parquet")
    assert ts.Dataset(str(tmp_path / "y")).schema.column_names == ["a"]

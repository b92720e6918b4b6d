"""Bad inputs found by the review of the "nothing silent" work (issue 8): each
row once read silently wrong (rows lost or doubled) or failed with a raw error."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream.core.errors import DataError, SchemaError
from tabstream.pipeline.dataset import DatasetWarning


def _export(out, rows=600, files=3):
    df = pd.DataFrame({"row_id": np.arange(rows), "x": np.linspace(0, 1, rows)})
    ts.Dataset(df, part_size=rows * 16 // files).to_parquet(str(out), num_files=files)
    return {e["path"]: e["num_rows"] for e in json.loads((out / "_manifest.json").read_text())["files"]}


def _nested_export_file_deleted(tmp):
    # root/train and root/valid: Dataset(root) once skipped train's manifest
    _export(tmp / "root" / "valid")
    _export(tmp / "root" / "train")
    (tmp / "root" / "train" / "part_00001.parquet").unlink()
    ts.Dataset(str(tmp / "root"))


def _nested_export_file_deleted_loader(tmp):
    from tabstream.loaders.torch import Loader

    _export(tmp / "root" / "valid")
    _export(tmp / "root" / "train")
    (tmp / "root" / "train" / "part_00000.parquet").unlink()
    Loader(str(tmp / "root"), batch_size=100)


def _glob_over_export_file_deleted(tmp):
    _export(tmp / "out")
    (tmp / "out" / "part_00002.parquet").unlink()
    ts.Dataset(str(tmp / "out" / "*.parquet"))


def _glob_over_export_every_file_deleted(tmp):
    _export(tmp / "out")
    for p in (tmp / "out").glob("part_*.parquet"):
        p.unlink()
    ts.Dataset(str(tmp / "out" / "part_*.parquet"))


def _glob_not_matching_the_deleted_file_reads(tmp):
    # a glob that does not match the deleted file reads what it matches
    counts = _export(tmp / "out")
    (tmp / "out" / "part_00000.parquet").unlink()
    ds = ts.Dataset(str(tmp / "out" / "part_0000[12].parquet"))
    assert ds.num_rows == counts["part_00001.parquet"] + counts["part_00002.parquet"]


def _nested_exports_read_whole(tmp):
    valid = _export(tmp / "root" / "valid", rows=300)
    train = _export(tmp / "root" / "train")
    ds = ts.Dataset(str(tmp / "root"))
    assert ds.num_rows == sum(valid.values()) + sum(train.values())
    expected = pd.concat([pd.read_parquet(tmp / "root" / d / f) for d, c in [("train", train), ("valid", valid)]
                          for f in sorted(c)], ignore_index=True)
    got = pd.concat(list(ds.to_iter()), ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def _same_folder_twice(tmp):
    _export(tmp / "out")
    ts.Dataset([str(tmp / "out"), str(tmp / "out")])


def _folder_and_its_glob(tmp):
    _export(tmp / "out")
    ts.Dataset([str(tmp / "out"), str(tmp / "out" / "*.parquet")])


def _days():
    return pd.DataFrame({"day": np.arange(1000) % 7, "x": np.arange(1000.0)})


def _split_groups_overlap(tmp):
    ts.Dataset(_days()).split_by_value("day", [range(0, 6), [5, 6]])


def _split_value_of_wrong_type(tmp):
    ts.Dataset(_days()).split_by_value("day", [[1, 2], ["5"]])


def _split_value_truncated(tmp):
    ts.Dataset(_days()).split_by_value("day", [[2.5]])


def _split_values_cast(tmp):
    # numpy ints and a range are values of the int column: rows as pandas picks them
    df = _days()
    train, valid = ts.Dataset(df).split_by_value("day", [range(0, 5), [np.int32(5), np.int64(6)]])
    assert train.num_rows == int((df.day < 5).sum())
    assert valid.num_rows == int(df.day.isin([5, 6]).sum())
    assert train.num_rows + valid.num_rows == len(df)


def _raw_tsv(tmp, text="1\t5\t1\tab\n0\t6\t2\tcd\n"):
    raw = tmp / "raw"
    raw.mkdir()
    (raw / "day_0.tsv").write_text(text)
    return raw


def _headerless_tsv_without_names(tmp):
    ts.Dataset(str(_raw_tsv(tmp) / "day_0.tsv"))


def _header_with_empty_name(tmp):
    ts.Dataset(str(_raw_tsv(tmp, "a\t\tc\n1\t2\t3\n") / "day_0.tsv"))


def _inspect_headerless_folder(tmp):
    cli("inspect", _raw_tsv(tmp))


def _train_on_raw_folder(tmp):
    cli("train", _raw_tsv(tmp), "--quiet")


def _non_nullable_columns_unified(tmp):
    # a non-nullable column missing from a later file, or nullable (with nulls) there,
    # once failed with a raw "Casting field 'c' with null values to non-nullable"
    import pyarrow as pa
    import pyarrow.parquet as pq

    strict = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("c", pa.int64(), nullable=False)])
    pq.write_table(pa.table({"a": [1, 2], "c": [3, 4]}, schema=strict), tmp / "p0.parquet")
    pq.write_table(pa.table({"a": [5, 6]}), tmp / "p1.parquet")
    pq.write_table(pa.table({"a": [7, 8], "c": pa.array([None, 9], pa.int64())}), tmp / "p2.parquet")
    with pytest.warns(DatasetWarning, match=r"\['c'\] null in the rows of .*p1\.parquet \(held by .*p0\.parquet"):
        ds = ts.Dataset(str(tmp))
    got = pd.concat(list(ds.to_iter()), ignore_index=True)
    expected = pd.concat([pd.read_parquet(tmp / f"p{i}.parquet") for i in range(3)], ignore_index=True)
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)
    assert ds.arrow_schema.field("c").nullable and int(got["c"].isna().sum()) == 3


def _list_widths_widened(tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"l": pa.array([[1], [2, 3]], pa.list_(pa.int32()))}), tmp / "p0.parquet")
    pq.write_table(pa.table({"l": pa.array([[2**40], None], pa.list_(pa.int64()))}), tmp / "p1.parquet")
    ds = ts.Dataset(str(tmp))
    assert ds.arrow_schema.field("l").type.value_type == pa.int64()
    got = [v for p in ds.pieces for v in ds.read_piece(p).column("l").to_pylist()]
    expected = [v for i in range(2) for v in pq.read_table(tmp / f"p{i}.parquet").column("l").to_pylist()]
    assert got == expected


def _list_int_and_float_refused(tmp):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"l": pa.array([[1]], pa.list_(pa.int32()))}), tmp / "p0.parquet")
    pq.write_table(pa.table({"l": pa.array([[1.5]], pa.list_(pa.float64()))}), tmp / "p1.parquet")
    ts.Dataset(str(tmp))


def _fit_on_no_rows(tmp):
    wf = ts.Workflow(["x"] >> ts.ops.Normalize())
    wf.fit(ts.Dataset(pd.DataFrame({"x": np.array([], dtype="float64")})))


def _fit_on_a_split_with_no_rows(tmp):
    df = _days()
    _, empty = ts.Dataset(df).split_by_value("day", [range(7), [9]])
    ts.Workflow(["x"] >> ts.ops.Normalize()).fit(empty)


def _fit_without_statistics_on_no_rows(tmp):
    ts.Workflow(["x"] >> ts.ops.LogOp()).fit(ts.Dataset(pd.DataFrame({"x": np.array([], dtype="float64")})))


def _cli_fit_on_an_empty_log(tmp):
    # Before: "saved workflow to wf" (fitted on 0 rows), then the export was refused.
    (tmp / "day_0.tsv").write_text("")
    try:
        cli("fit", tmp / "day_0.tsv", "--workflow-dir", tmp / "wf", "--output", tmp / "out", "--quiet")
    finally:
        assert not (tmp / "wf").exists() and not (tmp / "out").exists()


def _fit_on_rows_still_works(tmp):
    df = _days()
    train, _ = ts.Dataset(df).split_by_value("day", [range(3), range(3, 7)])
    wf = ts.Workflow(["x"] >> ts.ops.Normalize()).fit(train)
    x = df.loc[df.day < 3, "x"].to_numpy()
    got = wf.transform(pd.DataFrame({"x": x}))["x"].to_numpy()
    np.testing.assert_allclose(got, (x - x.mean()) / x.std(ddof=1), rtol=1e-5)


def _cli_checkpoint_of_another_model(tmp):
    from cases_train import _export as train_export

    export = train_export(tmp)
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet", "--batch-size", "64")
    cli("train", export, "--checkpoint-dir", tmp / "ck", "--quiet", "--model", "wide_and_deep")


CASES = [
    ("nested export, a file deleted", _nested_export_file_deleted, DataError,
     r"root/train/part_00001\.parquet: listed in .*root/train/_manifest\.json with \d+ rows, "
     r"but the file is missing"),
    ("nested export, a file deleted, loader", _nested_export_file_deleted_loader, DataError,
     r"root/train/part_00000\.parquet: listed in .*train/_manifest\.json"),
    ("glob over an export, a file deleted", _glob_over_export_file_deleted, DataError,
     r"out/part_00002\.parquet: listed in .*out/_manifest\.json with \d+ rows, but the file is missing"),
    ("glob over an export, every file deleted", _glob_over_export_every_file_deleted, DataError,
     r"out/part_00000\.parquet: listed in .*out/_manifest\.json with \d+ rows, but the file is missing"),
    ("glob not matching the deleted file", _glob_not_matching_the_deleted_file_reads, None, None),
    ("nested exports untouched read whole", _nested_exports_read_whole, None, None),
    ("split_by_value groups overlap", _split_groups_overlap, ValueError,
     r"split_by_value\('day'\): the value 5 is in group 0 and in group 1"),
    ("split_by_value value of the wrong type", _split_value_of_wrong_type, TypeError,
     r"split_by_value\('day'\): the value '5' \(str\) of group 1 is not a int64 value"),
    ("split_by_value float for an int column", _split_value_truncated, TypeError,
     r"the value 2\.5 \(float\) of group 0 is not a int64 value, the type of column 'day'"),
    ("split_by_value values cast", _split_values_cast, None, None),
    ("headerless TSV read without names=", _headerless_tsv_without_names, DataError,
     r"raw/day_0\.tsv, line 1: read as the header line, it has the column name '1' twice \(field 3 of 4"),
    ("header line with an empty name", _header_with_empty_name, DataError,
     r"day_0\.tsv, line 1: read as the header line, it has an empty column name \(field 2 of 3"),
    ("inspect a headerless TSV folder", _inspect_headerless_folder, CliFailed,
     r"day_0\.tsv, line 1 holds the number '1', so it is a row of data[\s\S]*hint: .*--names.*--criteo-tsv"),
    ("train on a raw TSV folder", _train_on_raw_folder, CliFailed, r"raw' holds no data files \(looked for \.parquet files\)"),
    ("non-nullable column missing from a later file", _non_nullable_columns_unified, None, None),
    ("list<int32> and list<int64> files widen", _list_widths_widened, None, None),
    ("list<int32> and list<double> files", _list_int_and_float_refused, SchemaError,
     r"p1\.parquet: column 'l' is list<.*double>, but .*p0\.parquet has list<.*int32>"),
    ("fit on no rows", _fit_on_no_rows, DataError,
     r"cannot fit the workflow on Dataset\(.*\): it has no rows; a workflow fitted on no rows"),
    ("fit on a split with no rows", _fit_on_a_split_with_no_rows, DataError,
     r"it has no rows after its filters or split"),
    ("fit without statistics on no rows", _fit_without_statistics_on_no_rows, DataError,
     r"cannot fit the workflow on .*: it has no rows"),
    ("tabstream fit on an empty log", _cli_fit_on_an_empty_log, CliFailed,
     r"cannot fit the workflow on .*day_0\.tsv.*: it has no rows[\s\S]*hint: check the input path"),
    ("fit on a split with rows", _fit_on_rows_still_works, None, None),
    ("checkpoint of another model: its own hint", _cli_checkpoint_of_another_model, CliFailed,
     r"written for a DLRM model, not WideAndDeep.*\n  hint: the checkpoint belongs to another training "
     r"run: pass another --checkpoint-dir, or --no-resume"),
    ("same folder twice", _same_folder_twice, ValueError,
     r"out/part_00000\.parquet: picked more than once by the paths .*give each file once"),
    ("a folder and its glob", _folder_and_its_glob, ValueError,
     r"out/part_00000\.parquet: picked more than once by the paths \[.*out', .*out/\*\.parquet'\]"),
]

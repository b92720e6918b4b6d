import json

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import CacheWarning, DataError, SchemaError
from tabstream.pipeline.dataset import DatasetWarning

NAMES = ["label", "I1", "C1"]
DTYPES = {"label": "int64", "I1": "int64", "C1": "string"}


def read_all(ds: ts.Dataset) -> pd.DataFrame:
    return pa.concat_tables([ds.read_piece(p) for p in ds.pieces]).to_pandas()


def write_tsv(path, rows):
    path.write_text("".join("\t".join(r) + "\n" for r in rows))
    return str(path)


def test_tsv_raw_logs_with_missing_fields(tmp_path):
    rows = [["1", "5", "ab"], ["0", "", "cd"], ["1", "-2", ""], ["0", "7", "ab"]]
    path = write_tsv(tmp_path / "day_0.tsv", rows)
    ds = ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t")
    assert ds.schema.column_names == NAMES
    assert [c.dtype for c in ds.schema] == ["int64", "int64", "string"]
    got = pa.concat_tables([ds.read_piece(p) for p in ds.pieces])
    assert got.column("I1").to_pylist() == [5, None, -2, 7]
    assert got.column("C1").to_pylist() == ["ab", "cd", None, "ab"]
    assert ds.num_rows == 4


@pytest.mark.parametrize("part_size", [40, 97, 10_000])
def test_csv_partitions_cover_every_line_once(tmp_path, part_size):
    rng = np.random.default_rng(0)
    rows = [[str(rng.integers(2)), str(i), f"v{rng.integers(50)}"] for i in range(500)]
    path = write_tsv(tmp_path / "d.tsv", rows)
    ds = ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size)
    if part_size < 1000:
        assert ds.npartitions > 1
    got = read_all(ds)
    assert got["I1"].tolist() == list(range(500))
    assert got["C1"].tolist() == [r[2] for r in rows]


@pytest.mark.parametrize("part_size", [1000, 3000])
def test_csv_partitions_of_a_file_hold_about_equal_rows(tmp_path, part_size):
    """A file is cut into equal blocks of at most 3/5 part_size, not into full blocks
    and a short remainder: partitions are balanced across cores."""
    rows = [["1", f"{i:05d}", "v"] for i in range(2000)]  # 10 bytes a row
    path = write_tsv(tmp_path / "d.tsv", rows)
    size = (tmp_path / "d.tsv").stat().st_size
    ds = ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size)
    expected_parts = -(-size // (part_size * 3 // 5))
    assert ds.npartitions == expected_parts > 2
    counts = [ds.read_piece(p).num_rows for p in ds.pieces]
    assert sum(counts) == 2000
    # equal byte ranges (rounded up, the last one takes the rest) of equal rows
    assert max(counts) - min(counts) <= 4, counts
    assert read_all(ds)["I1"].tolist() == list(range(2000))


def test_csv_wrong_field_count_names_file_and_line(tmp_path):
    rows = [["1", "5", "ab"]] * 300 + [["0", "7"]] + [["1", "5", "ab"]] * 20
    path = write_tsv(tmp_path / "bad.tsv", rows)
    ds = ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t", part_size=1000)
    with pytest.raises(DataError, match=r"bad\.tsv, line 301: expected 3 fields .* got 2"):
        read_all(ds)


def test_tsv_blank_line_is_an_error_not_a_dropped_row(tmp_path):
    path = tmp_path / "blank.tsv"
    lines = ["1\t5\tab"] * 50 + [""] + ["0\t7\tcd"] * 10
    path.write_text("\n".join(lines) + "\n")
    ds = ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=200)
    with pytest.raises(DataError, match=r"blank\.tsv, line 51: expected 3 fields .* got a blank line"):
        read_all(ds)
    # a blank line at the start of a later block is found too
    path.write_text("\n".join(["1\t5\tab"] * 50 + ["", "0\t7\tcd"]) + "\n")
    for part_size in (60, 80, 100, 10_000):
        with pytest.raises(DataError, match=r"line 51: .* blank line"):
            read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t", part_size=part_size))
    # blank lines at the very end carry nothing and are dropped
    path.write_text("1\t5\tab\n0\t7\tcd\n\n\n")
    got = read_all(ts.Dataset(str(path), names=NAMES, dtypes=DTYPES, sep="\t"))
    assert got["I1"].tolist() == [5, 7]


def test_tsv_quote_characters_are_plain_data(tmp_path):
    # raw logs are not quoted: a stray quote must not swallow the following lines
    rows = [["1", "5", 'a"b'], ["0", "6", "cd"], ["1", "7", '"ef'], ["0", "8", "gh"]]
    path = write_tsv(tmp_path / "quotes.tsv", rows)
    got = read_all(ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t"))
    assert got["I1"].tolist() == [5, 6, 7, 8]
    assert got["C1"].tolist() == [r[2] for r in rows]


def test_csv_unparseable_value_names_file_line_and_column(tmp_path):
    rows = [["1", "5", "ab"]] * 120 + [["0", "x7", "cd"]] + [["1", "5", "ab"]] * 3
    path = write_tsv(tmp_path / "bad.tsv", rows)
    ds = ts.Dataset(path, names=NAMES, dtypes=DTYPES, sep="\t", part_size=500)
    with pytest.raises(DataError, match=r"bad\.tsv, line 121, column 'I1': value 'x7' is not a valid int64"):
        read_all(ds)


def test_csv_needs_names_without_header(tmp_path):
    path = write_tsv(tmp_path / "d.csv", [["1", "2", "3"]])
    with pytest.raises(SchemaError, match=r"dtypes given for columns \['zzz'\]"):
        ts.Dataset(path, names=NAMES, dtypes={"zzz": "int64"})


def test_csv_with_header(tmp_path):
    path = tmp_path / "h.csv"
    path.write_text("a,b\n1,x\n2,\n")
    ds = ts.Dataset(str(path), dtypes={"a": "int64"})
    got = pa.concat_tables([ds.read_piece(p) for p in ds.pieces])
    assert got.to_pydict() == {"a": [1, 2], "b": ["x", None]}


def _write_parquet_files(folder, n_files=3, rows=100, row_group_size=30):
    folder.mkdir(parents=True, exist_ok=True)
    frames = []
    for i in range(n_files):
        df = pd.DataFrame({"id": np.arange(i * rows, (i + 1) * rows), "x": np.random.default_rng(i).random(rows)})
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), folder / f"part_{i}.parquet",
                       row_group_size=row_group_size)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


@pytest.mark.parametrize("how", ["folder", "glob", "list", "file_url"])
def test_parquet_sources(tmp_path, how):
    expected = _write_parquet_files(tmp_path / "data")
    src = {
        "folder": str(tmp_path / "data"),
        "glob": str(tmp_path / "data" / "*.parquet"),
        "list": [str(p) for p in sorted((tmp_path / "data").glob("*.parquet"))],
        "file_url": f"file://{tmp_path}/data",
    }[how]
    ds = ts.Dataset(src)
    assert ds.num_rows == len(expected)
    pd.testing.assert_frame_equal(read_all(ds), expected)


def test_parquet_part_size_groups_row_groups(tmp_path):
    expected = _write_parquet_files(tmp_path / "d", n_files=1, rows=300, row_group_size=10)
    small = ts.Dataset(str(tmp_path / "d"), part_size=1)
    big = ts.Dataset(str(tmp_path / "d"), part_size="1GB")
    assert small.npartitions == 30 and big.npartitions == 1
    pd.testing.assert_frame_equal(read_all(small), expected)


def test_memory_filesystem():
    fs = fsspec.filesystem("memory")
    df = pd.DataFrame({"a": [1, 2, 3], "s": ["x", None, "z"]})
    with fs.open("/tsdata/one.parquet", "wb") as f:
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), f)
    ds = ts.Dataset("memory://tsdata/")
    assert ds.files == ["memory:///tsdata/one.parquet"]
    pd.testing.assert_frame_equal(read_all(ds), df)


def test_corrupt_parquet_names_file(tmp_path):
    _write_parquet_files(tmp_path / "d", n_files=2)
    (tmp_path / "d" / "part_9.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"part_9\.parquet: not a readable parquet file"):
        ts.Dataset(str(tmp_path / "d"))


@pytest.mark.parametrize("missing_in", [0, 1])
def test_parquet_schemas_are_unified_across_files(tmp_path, missing_in):
    # A column missing from one file is null there, never dropped from the others
    # (before: a column absent from the first file vanished from every file).
    (tmp_path / "d").mkdir()
    full = pd.DataFrame({"id": np.arange(5, 9), "x": [0.5, 1.5, 2.5, 3.5], "extra": [1, 2, 3, 4]})
    narrow = pd.DataFrame({"id": np.arange(0, 5, dtype="int32")})
    frames = [narrow, full] if missing_in == 0 else [full, narrow]
    for i, df in enumerate(frames):
        pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp_path / "d" / f"part_{i}.parquet")
    narrow_file = tmp_path / "d" / f"part_{missing_in}.parquet"
    with pytest.warns(DatasetWarning, match=rf"\['x', 'extra'\] null in the rows of {narrow_file}") as said:
        ds = ts.Dataset(str(tmp_path / "d"))
    assert len(said) == 1  # one warning for the Dataset
    expected = pd.concat(frames, ignore_index=True)  # pandas fills the missing cells
    assert sorted(ds.schema.column_names) == ["extra", "id", "x"]
    assert ds.arrow_schema.field("id").type == pa.int64()  # int32 and int64 widen to int64
    got = read_all(ds)[expected.columns]
    assert got["id"].tolist() == expected["id"].tolist()
    assert got["x"].isna().tolist() == expected["x"].isna().tolist()
    assert got["x"].dropna().tolist() == expected["x"].dropna().tolist()
    assert [None if pd.isna(v) else int(v) for v in got["extra"]] == \
        [None if pd.isna(v) else int(v) for v in expected["extra"]]
    assert ds.num_rows == len(expected)


@pytest.mark.parametrize("null_first", [True, False])
def test_parquet_column_of_the_null_type_reads_as_nulls_of_the_others_type(tmp_path, null_first):
    """A day whose string column is all None: pandas writes it with Arrow's null type.
    Read with the other files as nulls of their type (it was refused as a type clash),
    as pyarrow reads the folder when a file of the other type comes first."""
    (tmp_path / "d").mkdir()
    full = pd.DataFrame({"id": [1, 2], "city": ["a", "b"], "tags": [["x"], []]})
    empty = pd.DataFrame({"id": [3, 4], "city": [None, None], "tags": [[], None]})
    frames = [empty, full] if null_first else [full, empty]
    for i, df in enumerate(frames):
        df.to_parquet(tmp_path / "d" / f"part_{i}.parquet")
    assert pq.read_schema(tmp_path / "d" / f"part_{0 if null_first else 1}.parquet").field("city").type == pa.null()
    ds = ts.Dataset(str(tmp_path / "d"))
    assert pa.types.is_string(ds.arrow_schema.field("city").type) or pa.types.is_large_string(
        ds.arrow_schema.field("city").type)
    got = read_all(ds)
    expected = pd.concat(frames, ignore_index=True)  # pyarrow's folder read fails with the null file first
    assert got["id"].tolist() == expected["id"].tolist()
    assert [None if pd.isna(v) else v for v in got["city"]] == [None if pd.isna(v) else v for v in expected["city"]]
    assert [None if v is None else list(v) for v in got["tags"]] == [
        None if v is None else list(v) for v in expected["tags"]]


@pytest.mark.parametrize(("rows", "n"), [(10, 4), (10, 1), (3, 5), (1000, 7)])
def test_npartitions_cuts_in_memory_data_in_equal_row_ranges(rows, n):
    """NVTabular's Dataset(df, npartitions=n) (it was taken and ignored: one partition)."""
    df = pd.DataFrame({"x": np.arange(rows), "s": [f"v{i}" for i in range(rows)]})
    for source in (df, pa.Table.from_pandas(df, preserve_index=False)):
        ds = ts.Dataset(source, npartitions=n)
        assert ds.npartitions == min(n, rows)
        sizes = [p.stop - p.start for p in ds.pieces]
        assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
        assert read_all(ds)["x"].tolist() == list(range(rows))


def test_keyword_arguments_a_dataset_would_not_use_are_refused(tmp_path):
    df = pd.DataFrame({"x": np.arange(5)})
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'no_such_option'.*engine is 'dataframe'"):
        ts.Dataset(df, no_such_option=1)
    df.to_parquet(tmp_path / "x.parquet")
    with pytest.raises(TypeError, match=r"unexpected keyword arguments 'names', 'sep'.*engine is 'parquet'"):
        ts.Dataset(str(tmp_path / "x.parquet"), names=["x"], sep="\t")
    with pytest.raises(TypeError, match=r"npartitions applies to a DataFrame.*part_size"):
        ts.Dataset(str(tmp_path / "x.parquet"), npartitions=3)
    with pytest.raises(ValueError, match=r"npartitions must be a positive integer, got 0"):
        ts.Dataset(df, npartitions=0)
    (tmp_path / "x.tsv").write_text("1\t2\n3\t4\n")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'delimiter': CSV/TSV reading takes names, "):
        ts.Dataset(str(tmp_path / "x.tsv"), names=["a", "b"], delimiter="\t")
    assert ts.Dataset(str(tmp_path / "x.tsv"), names=["a", "b"], sep="\t", block_size="1MB").num_rows == 2


def test_parquet_incompatible_types(tmp_path):
    (tmp_path / "d").mkdir()
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "d" / "a.parquet")
    pq.write_table(pa.table({"a": ["x", "y"]}), tmp_path / "d" / "b.parquet")
    with pytest.raises(SchemaError, match=r"b\.parquet: column 'a' is string, but .*a\.parquet has int64"):
        ts.Dataset(str(tmp_path / "d"))


def test_missing_path_and_empty_glob(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or folder"):
        ts.Dataset(str(tmp_path / "nope.parquet"))
    with pytest.raises(FileNotFoundError, match="no files match"):
        ts.Dataset(str(tmp_path / "*.parquet"))


def test_dataframe_source_partitions_and_schema(small_raw):
    ds = ts.Dataset(small_raw, part_size=4096)
    assert ds.npartitions > 1
    assert ds.schema["I1"].dtype == "int64" and ds.schema["C1"].dtype == "string"
    got = read_all(ds)
    assert got["row_id"].tolist() == small_raw["row_id"].tolist()
    ddf = ds.to_ddf()
    assert len(ddf.compute()) == len(small_raw)


def test_dask_dataframe_source(small_raw):
    import dask.dataframe as dd

    ds = ts.Dataset(dd.from_pandas(small_raw, npartitions=3))
    assert ds.npartitions == 3
    assert sorted(read_all(ds)["row_id"]) == list(range(len(small_raw)))


def test_part_size_parsing():
    from tabstream.pipeline.dataset import parse_bytes

    assert parse_bytes("128MB") == 128 * 2**20
    assert parse_bytes("1.5 GiB") == int(1.5 * 2**30)
    assert parse_bytes(1000) == 1000
    with pytest.raises(ValueError, match="cannot parse part_size"):
        parse_bytes("lots")


def test_gpu_backend_request_is_explicit(small_raw):
    with pytest.raises(ValueError, match="GPU .* backend"):
        ts.Dataset(small_raw, cpu=False)


@pytest.mark.parametrize("seed", [0, 1, 42])
def test_random_split_is_a_reproducible_partition(small_raw, seed):
    ds = ts.Dataset(small_raw, part_size=5000)
    parts = ds.split([0.7, 0.2, 0.1], seed=seed)
    ids = [read_all(p)["row_id"].tolist() for p in parts]
    assert sorted(sum(ids, [])) == list(range(len(small_raw)))
    assert abs(len(ids[0]) / len(small_raw) - 0.7) < 0.05
    again = [read_all(p)["row_id"].tolist() for p in ds.split([0.7, 0.2, 0.1], seed=seed)]
    assert again == ids
    other = read_all(ds.split([0.7, 0.2, 0.1], seed=seed + 100)[0])["row_id"].tolist()
    assert other != ids[0]
    assert parts[1].num_rows == len(ids[1])


def test_split_by_value_day_column(tmp_path, small_raw):
    df = small_raw.assign(day=small_raw["row_id"] % 5)
    ds = ts.Dataset(df, part_size=5000)
    train, valid = ds.split_by_value("day", [[0, 1, 2, 3], [4]])
    assert read_all(train)["day"].isin([0, 1, 2, 3]).all() and len(read_all(train)) == (df["day"] < 4).sum()
    assert read_all(valid)["row_id"].tolist() == df.loc[df["day"] == 4, "row_id"].tolist()
    from tabstream import ops

    wf = ts.Workflow((["C1"] >> ops.Categorify()) + ["day"]).fit(train)
    wf.transform(train).to_parquet(str(tmp_path / "train"))
    wf.transform(valid).to_parquet(str(tmp_path / "valid"))
    assert ts.Dataset(str(tmp_path / "train")).schema == ts.Dataset(str(tmp_path / "valid")).schema
    assert ts.Dataset(str(tmp_path / "valid")).num_rows == (df["day"] == 4).sum()


def test_split_errors(small_raw):
    ds = ts.Dataset(small_raw)
    with pytest.raises(ValueError, match="sum to 1"):
        ds.split([0.5, 0.6])
    with pytest.raises(SchemaError, match="cannot split on 'nope'"):
        ds.split_by_value("nope", [[1]])


# -- the export manifest --------------------------------------------------------
def _export(tmp_path, rows=1000, files=4):
    df = pd.DataFrame({"row_id": np.arange(rows), "x": np.random.default_rng(0).random(rows)})
    out = tmp_path / "export"
    ts.Dataset(df, part_size=2000).to_parquet(str(out), num_files=files)
    counts = {e["path"]: e["num_rows"] for e in json.loads((out / "_manifest.json").read_text())["files"]}
    return out, counts


def _tamper(out, how):
    """Returns the file tampered with and its row count found on disk."""
    if how == "deleted":
        (out / "part_00001.parquet").unlink()
        return "part_00001.parquet", 0
    if how == "smaller":
        small = pq.read_table(out / "part_00002.parquet").slice(0, 30)
        pq.write_table(small, out / "part_00002.parquet")
        return "part_00002.parquet", 30
    extra = pq.read_table(out / "part_00000.parquet").slice(0, 7)
    pq.write_table(extra, out / "part_00009.parquet")
    return "part_00009.parquet", 7


@pytest.mark.parametrize("how", ["deleted", "smaller", "extra"])
def test_export_folder_must_match_its_manifest(tmp_path, how):
    # Before: each of these read silently, with fewer (or more) rows than exported.
    out, counts = _export(tmp_path)
    assert ts.Dataset(str(out)).num_rows == sum(counts.values())
    name, found = _tamper(out, how)
    if how == "deleted":
        msg = rf"{name}: listed in .*_manifest.json with {counts[name]} rows, but the file is missing \(found 0 rows\)"
    elif how == "smaller":
        msg = rf"{name}: .*_manifest.json lists {counts[name]} rows, found {found} rows"
    else:
        msg = rf"{name}: not listed in .*_manifest.json \(found {found} rows, expected no such file\)"
    with pytest.raises(DataError, match=msg):
        ts.Dataset(str(out))


@pytest.mark.parametrize("form", ["glob", "list", "file"])
def test_files_picked_inside_an_export_are_checked_against_its_manifest(tmp_path, form):
    out, counts = _export(tmp_path)
    pick = {"glob": str(out / "part_0000[23].parquet"),
            "list": [str(out / "part_00002.parquet"), str(out / "part_00003.parquet")],
            "file": str(out / "part_00002.parquet")}[form]
    expected = pd.concat([pd.read_parquet(out / f) for f in ["part_00002.parquet", "part_00003.parquet"]][
        : 1 if form == "file" else 2], ignore_index=True)
    pd.testing.assert_frame_equal(read_all(ts.Dataset(pick)), expected)  # untouched: fine
    _, found = _tamper(out, "smaller")
    with pytest.raises(DataError, match=rf"part_00002.parquet: .*_manifest.json lists "
                                        rf"{counts['part_00002.parquet']} rows, found {found} rows"):
        ts.Dataset(pick)
    # a file the manifest does not list, picked by a glob
    _tamper(out, "extra")
    with pytest.raises(DataError, match=r"part_00009.parquet: not listed in .*_manifest.json"):
        ts.Dataset(str(out / "part_0000[9].parquet"))


def test_export_folder_with_every_file_deleted(tmp_path):
    out, counts = _export(tmp_path, files=2)
    for p in out.glob("part_*.parquet"):
        p.unlink()
    with pytest.raises(DataError, match=rf"part_00000.parquet: listed in .*with {counts['part_00000.parquet']} rows"):
        ts.Dataset(str(out))


def test_unreadable_manifest_is_named(tmp_path):
    out, _ = _export(tmp_path)
    (out / "_manifest.json").write_text('{"files": [{"name": "part_00000.parquet"}]}')
    with pytest.raises(DataError, match=r"_manifest.json: not a valid export manifest"):
        ts.Dataset(str(out))


# -- filters ---------------------------------------------------------------------
def test_filters_select_rows_everywhere(tmp_path):
    out, _ = _export(tmp_path)
    df = pd.concat([pd.read_parquet(p) for p in sorted(out.glob("part_*.parquet"))], ignore_index=True)
    ds = ts.Dataset(str(out), filters=[("x", ">", 0.25), ("row_id", "<", 800)])
    want = df[(df["x"] > 0.25) & (df["row_id"] < 800)].reset_index(drop=True)
    assert ds.num_rows == len(want)
    pd.testing.assert_frame_equal(read_all(ds), want)
    pd.testing.assert_frame_equal(pd.concat(list(ds.to_iter()), ignore_index=True), want, check_dtype=False)
    got = ts.Dataset(str(out), filters=pc.field("x") > 0.5).to_ddf().compute().reset_index(drop=True)
    pd.testing.assert_frame_equal(got, df[df["x"] > 0.5].reset_index(drop=True), check_dtype=False)


def test_filters_on_a_dataframe_and_null_rows(tmp_path):
    df = pd.DataFrame({"a": pd.array([1, None, 3, 4], dtype="Int64"), "b": ["w", "x", "y", "z"]})
    ds = ts.Dataset(df, filters=[("a", "!=", 3)])
    # a null compares to null: the row is dropped, as in pyarrow and pandas filters
    assert read_all(ds)["b"].tolist() == ["w", "z"]
    assert ds.num_rows == 2


def test_bad_filters(tmp_path):
    out, _ = _export(tmp_path)
    with pytest.raises(TypeError, match=r"filters must be a list of \(column, op, value\) tuples .*got str"):
        ts.Dataset(str(out), filters="x > 1")
    with pytest.raises(ValueError, match=r"cannot read filters=\[\('x', '~', 1\)\]"):
        ts.Dataset(str(out), filters=[("x", "~", 1)])
    with pytest.raises(SchemaError, match=r"filters .*nope.* do not apply to this dataset.*columns: \['row_id', 'x'\]"):
        ts.Dataset(str(out), filters=[("nope", "==", 1)])
    with pytest.raises(TypeError, match=r"filters add_checked\(x, 1\) give double values; a filter must give true/false"):
        ts.Dataset(str(out), filters=pc.field("x") + 1)
    with pytest.raises(ValueError, match=r"filters true read no column"):
        ts.Dataset(str(out), filters=pc.scalar(True))


def test_file_replaced_after_planning_is_named(tmp_path):
    _write_parquet_files(tmp_path / "d", n_files=2, rows=100, row_group_size=100)
    ds = ts.Dataset(str(tmp_path / "d"))
    pq.write_table(pq.read_table(tmp_path / "d" / "part_1.parquet").slice(0, 40), tmp_path / "d" / "part_1.parquet")
    with pytest.raises(DataError, match=r"part_1\.parquet: row groups \[0\] hold 40 rows, the footer read "
                                        r"when planning said 100"):
        read_all(ds)


def _criteo_like_tsv(path, rows=900, seed=0):
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"label": rng.integers(0, 2, rows), "I1": rng.integers(0, 50, rows),
                       "C1": [f"c{v:x}" for v in rng.integers(0, 40, rows)]})
    df.to_csv(path, sep="\t", header=False, index=False)
    return df


_TSV_KW = {"names": ["label", "I1", "C1"], "dtypes": {"label": "int64", "I1": "int64"}}


def test_raw_logs_are_parsed_once_by_default(tmp_path, monkeypatch):
    # Raw CSV/TSV is cached on local disk by default ("auto"), so the second pass
    # (export after fit) and reads of other columns map the cache, never parse again.
    expected = _criteo_like_tsv(tmp_path / "day_0.tsv")
    calls = []
    from tabstream.pipeline.csv_files import CsvFiles

    real = CsvFiles._parse_csv

    def counting(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(CsvFiles, "_parse_csv", counting)
    ds = ts.Dataset(str(tmp_path / "day_0.tsv"), part_size=4000, **_TSV_KW)
    assert ds.cache == "disk" and ds.npartitions > 2
    first = pa.concat_tables([ds.read_piece(p, ["C1"]) for p in ds.pieces])
    assert len(calls) == ds.npartitions
    second = pa.concat_tables([ds.read_piece(p) for p in ds.pieces])
    assert len(calls) == ds.npartitions
    assert first.column("C1").to_pylist() == expected["C1"].tolist()
    pd.testing.assert_frame_equal(second.to_pandas(), expected)
    # off when asked, and never for parquet or in-memory data
    assert ts.Dataset(str(tmp_path / "day_0.tsv"), cache=None, **_TSV_KW).cache is None
    expected.to_parquet(tmp_path / "day_0.parquet")
    assert ts.Dataset(str(tmp_path / "day_0.parquet")).cache is None
    assert ts.Dataset(expected).cache is None


_WRITE_FAILS = r"""
import json, os, resource, signal, sys, warnings
import pandas as pd, pyarrow as pa
import tabstream as ts
from tabstream.core.errors import CacheWarning
import tabstream.pipeline.partition_cache as partition_cache
partition_cache.CACHE_MIN_FREE_BYTES = partition_cache.CACHE_MAX_FREE_BYTES = 0  # whatever the disk
path, cache = sys.argv[1], sys.argv[2]
expected = pd.read_csv(path, sep="\t", header=None, names=["label", "I1", "C1"])
ds = ts.Dataset(path, cache_dir=cache, part_size=8000, names=["label", "I1", "C1"],
                dtypes={"label": "int64", "I1": "int64"})
# files past 4 KiB cannot be written from here on: EFBIG, not the signal
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for _ in range(2):
        got = pa.concat_tables([ds.read_piece(p) for p in ds.pieces]).to_pandas()
        pd.testing.assert_frame_equal(got, expected)
said = [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]
print(json.dumps([ds.npartitions, said, [f for _, _, files in os.walk(cache) for f in files]]))
"""


def test_auto_cache_whose_writes_fail_warns_once_and_parses_again(tmp_path):
    # A real failing write (the file size limit of the process), not a full disk:
    # the data are the same, nothing half-written is left, and the user is told once.
    import errno
    import subprocess
    import sys

    _criteo_like_tsv(tmp_path / "day_0.tsv", rows=3000)
    (tmp_path / "cache").mkdir()
    run = subprocess.run([sys.executable, "-c", _WRITE_FAILS, str(tmp_path / "day_0.tsv"),
                          str(tmp_path / "cache")], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    npartitions, said, left = json.loads(run.stdout.strip().splitlines()[-1])
    assert npartitions > 2 and len(said) == 1
    assert "could not keep a partition" in said[0] and f"[Errno {errno.EFBIG}]" in said[0]
    assert str(tmp_path / "cache") in said[0] and left == []  # no partial file left


def test_auto_cache_that_cannot_be_written_parses_again(tmp_path, monkeypatch):
    # A cache the disk cannot hold is not an error in "auto": the block is parsed
    # again on the next read and the data are the same.
    expected = _criteo_like_tsv(tmp_path / "day_0.tsv", rows=300)
    calls = []
    from tabstream.pipeline.csv_files import CsvFiles

    real = CsvFiles._parse_csv
    monkeypatch.setattr(CsvFiles, "_parse_csv",
                        lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    ds = ts.Dataset(str(tmp_path / "day_0.tsv"), cache_dir=str(tmp_path / "gone"), **_TSV_KW)
    assert ds.cache == "disk"
    with pytest.warns(CacheWarning, match="cache folder .*gone cannot be used"):
        for _ in range(2):
            got = pa.concat_tables([ds.read_piece(p) for p in ds.pieces]).to_pandas()
            pd.testing.assert_frame_equal(got, expected)
    assert len(calls) == 2 * ds.npartitions
    assert not (tmp_path / "gone").exists()

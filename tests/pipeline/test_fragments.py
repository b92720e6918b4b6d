"""``Dataset.fragments()``: the files, row groups and kept rows a reader reads,
checked against pyarrow's own listing of the files and its own filtering."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tabstream as ts


def _write_files(folder, seed):
    """Three files of different row-group sizes (one of them with no rows)."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    sizes = [(1000, 128), (0, 64), (777, 300)]
    for i, (rows, group) in enumerate(sizes):
        table = pa.table({"day": rng.integers(0, 7, rows), "x": rng.random(rows)})
        pq.write_table(table, folder / f"part_{i}.parquet", row_group_size=group)
    return sorted(str(p) for p in folder.glob("*.parquet"))


def _pyarrow_listing(files):
    out = []
    for path in files:
        md = pq.ParquetFile(path).metadata
        out.append((path, [md.row_group(g).num_rows for g in range(md.num_row_groups)]))
    return out


@pytest.mark.parametrize("seed", [0, 5])
def test_fragments_list_the_files_and_row_groups_pyarrow_lists(tmp_path, seed):
    files = _write_files(tmp_path / "data", seed)
    ds = ts.Dataset(str(tmp_path / "data"), engine="parquet")
    fragments = ds.fragments()
    got = [(f.path, [rg.stored_rows for rg in f.row_groups]) for f in fragments]
    assert got == _pyarrow_listing(files)
    for f in fragments:
        assert [rg.index for rg in f.row_groups] == list(range(len(f.row_groups)))
        assert all(rg.num_rows == rg.stored_rows and rg.mask is None for rg in f.row_groups)
        assert f.num_rows == pq.ParquetFile(f.path).metadata.num_rows
        assert f.metadata.num_rows == f.num_rows and f.partition_values == {}
    assert sum(f.num_rows for f in fragments) == ds.num_rows


def _kept_rows(fragments):
    """The rows the fragments keep, read back with pyarrow alone."""
    tables = []
    for f in fragments:
        pf = pq.ParquetFile(f.path)
        for rg in f.row_groups:
            table = pf.read_row_group(rg.index)
            if rg.mask is not None:
                assert len(rg.mask) == rg.stored_rows
                assert int(np.count_nonzero(rg.mask)) == rg.num_rows
                table = table.filter(pa.array(rg.mask))
            else:
                assert rg.num_rows == rg.stored_rows
            tables.append(table)
    return pa.concat_tables(tables).to_pandas()


@pytest.mark.parametrize("seed", [1, 9])
def test_fragments_of_splits_keep_each_row_once_and_the_rows_the_split_reads(tmp_path, seed):
    _write_files(tmp_path / "data", seed)
    ds = ts.Dataset(str(tmp_path / "data"), engine="parquet", part_size="4KB")
    splits = ds.split([0.3, 0.7], seed=seed)
    kept = [_kept_rows(s.fragments()) for s in splits]
    whole = pq.read_table(str(tmp_path / "data")).to_pandas()
    assert sum(len(k) for k in kept) == len(whole)
    for split, rows in zip(splits, kept):
        read = pd.concat(list(split.to_iter()), ignore_index=True)
        pd.testing.assert_frame_equal(rows.reset_index(drop=True), read, check_dtype=False)


def test_fragments_with_filters_keep_what_pyarrow_keeps(tmp_path):
    files = _write_files(tmp_path / "data", 3)
    ds = ts.Dataset(str(tmp_path / "data"), engine="parquet", filters=[("day", "<", 3)])
    got = _kept_rows(ds.fragments())
    expected = pa.concat_tables(
        [t.filter(pc.less(t["day"], 3)) for t in (pq.read_table(f) for f in files)]).to_pandas()
    pd.testing.assert_frame_equal(got.reset_index(drop=True), expected.reset_index(drop=True))


def test_fragments_carry_hive_partition_values(tmp_path):
    for day in (1, 2):
        folder = tmp_path / "data" / f"day={day}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"x": [0.5] * (day + 1)}), folder / "part.parquet")
    ds = ts.Dataset(str(tmp_path / "data"), engine="parquet")
    got = [(f.path.rsplit("/", 2)[-2], dict(f.partition_values), f.num_rows) for f in ds.fragments()]
    assert got == [("day=1", {"day": 1}, 2), ("day=2", {"day": 2}, 3)]


def test_fragments_of_a_csv_dataset_are_refused(tmp_path):
    path = tmp_path / "log.tsv"
    path.write_text("1\ta\n")
    ds = ts.Dataset(str(path), names=["label", "C1"], sep="\t")
    with pytest.raises(ValueError, match=r"fragments\(\) lists parquet files.*engine is 'csv'.*to_parquet"):
        ds.fragments()

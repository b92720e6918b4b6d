"""Parquet string columns that only Categorify reads are taken as dictionaries
(no string decoding); the ids equal those of plain reads, computed with pandas."""

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import CacheWarning


def _write(tmp_path, frame, name="part.parquet", row_group_size=50, **kwargs):
    path = tmp_path / name
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path,
                   row_group_size=row_group_size, **kwargs)
    return str(path)


@pytest.fixture
def frame():
    rng = np.random.default_rng(7)
    n = 400
    low = np.array(["a", "b", "c", "", "dd"], dtype=object)[rng.integers(0, 5, n)]
    low[rng.random(n) < 0.1] = None
    # row groups with different value sets: each row group's dictionary differs
    shifted = np.array([f"s{(i // 50) * 3 + x}" for i, x in enumerate(rng.integers(0, 6, n))], dtype=object)
    shifted[100:150] = None  # an all-null row group
    other = np.array([f"o{x}" for x in rng.integers(0, 30, n)], dtype=object)
    return pd.DataFrame({"low": pd.array(low, dtype="str"), "shifted": pd.array(shifted, dtype="str"),
                         "other": pd.array(other, dtype="str"), "x": rng.normal(size=n)})


def plain_type(ds, name):
    return ds.arrow_schema.field(name).type


def _ids_reference(values, freq_threshold):
    """Categorify's ids the documented way, with pandas."""
    counts = pd.Series(values).dropna().value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= max(freq_threshold, 1)),
                  key=lambda kv: (-kv[1], kv[0]))
    mapping = {v: 3 + i for i, (v, _) in enumerate(kept)}
    return [1 if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) else mapping.get(v, 2)
            for v in values]


def test_read_piece_gives_dictionaries_only_for_dictionary_pages(tmp_path, frame):
    path = _write(tmp_path, frame, use_dictionary=["low", "shifted"])  # "other" stored plain
    ds = ts.Dataset(path, part_size="1GB")
    (piece,) = ds.pieces
    table = ds.read_piece(piece, ["low", "shifted", "other", "x"], dictionary=["low", "shifted", "other"])
    assert pa.types.is_dictionary(table.schema.field("low").type)
    assert pa.types.is_dictionary(table.schema.field("shifted").type)
    assert table.schema.field("other").type == plain_type(ds, "other")
    assert table.column("shifted").num_chunks == 8  # one dictionary per row group
    plain = ds.read_piece(piece, ["low", "shifted", "other", "x"])
    assert table.schema.field("low").type.value_type == plain.schema.field("low").type
    for name in ["low", "shifted"]:
        decoded = [v for chunk in table.column(name).chunks
                   for v in chunk.cast(chunk.type.value_type).to_pylist()]
        assert decoded == plain.column(name).to_pylist()


def test_columns_used_by_filters_are_read_plain(tmp_path, frame):
    path = _write(tmp_path, frame)
    ds = ts.Dataset(path, filters=[("low", "==", "a")])
    table = ds.read_piece(ds.pieces[0], ["low", "shifted"], dictionary=["low", "shifted"])
    assert table.schema.field("low").type == plain_type(ds, "low")
    assert pa.types.is_dictionary(table.schema.field("shifted").type)
    assert set(table.column("low").to_pylist()) == {"a"}


def test_dictionary_columns_are_those_only_categorify_reads(tmp_path, frame):
    path = _write(tmp_path, frame)
    graph = ((["low", "shifted"] >> ops.Categorify()) + (["other"] >> ops.HashBucket(10))
             + (["shifted"] >> ops.Rename(postfix="_raw")) + ["x"])
    wf = ts.Workflow(graph)
    wf.fit_schema(ts.Dataset(path).schema)
    # "shifted" also feeds Rename, "other" only HashBucket; "x" is no string
    assert wf.dictionary_columns(ts.Dataset(path)) == ["low"]
    raw_out = ts.Workflow((["low"] >> ops.Categorify()) + ["shifted"])  # "shifted" is output as it is
    raw_out.fit_schema(ts.Dataset(path).schema)
    assert raw_out.dictionary_columns(ts.Dataset(path)) == ["low"]
    wf2 = ts.Workflow(["low", "shifted"] >> ops.Categorify())
    wf2.fit_schema(ts.Dataset(path).schema)
    assert wf2.dictionary_columns(ts.Dataset(path)) == ["low", "shifted"]
    assert wf2.dictionary_columns(ts.Dataset(frame)) == []  # in-memory data has no pages


@pytest.mark.parametrize("freq_threshold", [0, 12])
def test_fit_and_export_from_dictionary_pages_give_the_documented_ids(tmp_path, frame, freq_threshold,
                                                                     monkeypatch):
    files = [_write(tmp_path, frame.iloc[:200], "a.parquet"), _write(tmp_path, frame.iloc[200:], "b.parquet")]
    seen = []
    original = ops.Categorify.fit_partition

    def spy(self, table):
        seen.extend(table.schema.field(n).type for n in table.column_names)
        return original(self, table)

    monkeypatch.setattr(ops.Categorify, "fit_partition", spy)
    graph = (["low", "shifted"] >> ops.Categorify(freq_threshold=freq_threshold)) + ["x"]
    ds = ts.Dataset(files, part_size=3000)
    assert ds.npartitions > 2
    wf = ts.Workflow(graph).fit(ds)
    assert seen and all(pa.types.is_dictionary(t) for t in seen)
    out = wf.transform(ds).to_parquet(str(tmp_path / "out"))
    got = pd.read_parquet(out.path if hasattr(out, "path") else str(tmp_path / "out"))
    for name in ["low", "shifted"]:
        values = frame[name].astype(object).where(frame[name].notna(), None).tolist()
        assert got[name].tolist() == _ids_reference(values, freq_threshold)
        assert got[name].dtype == np.int64
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())


def test_dictionary_reads_equal_plain_reads_with_num_buckets(tmp_path, frame):
    path = _write(tmp_path, frame)
    op_dict = ops.Categorify(freq_threshold=20, num_buckets=4)
    wf = ts.Workflow(["low", "shifted"] >> op_dict).fit(ts.Dataset(path, part_size=3000))
    op_plain = ops.Categorify(freq_threshold=20, num_buckets=4)
    plain = ts.Workflow(["low", "shifted"] >> op_plain).fit(ts.Dataset(frame, part_size=3000))
    for name in ["low", "shifted"]:
        assert op_dict.tables[name].equals(op_plain.tables[name])
    from_parquet = wf.transform(ts.Dataset(path, part_size=3000)).compute()
    pd.testing.assert_frame_equal(from_parquet, plain.transform(frame))


@pytest.mark.parametrize("freq_threshold", [0, 12])
def test_disk_cache_keeps_dictionary_partitions_of_several_row_groups(tmp_path, frame, freq_threshold,
                                                                      monkeypatch):
    # a partition of several row groups read as dictionaries has one dictionary per
    # row group: the cache keeps them (the export maps it instead of reading parquet)
    path = _write(tmp_path, frame)
    reads = []
    original = ts.Dataset._read_piece_raw
    monkeypatch.setattr(ts.Dataset, "_read_piece_raw",
                        lambda self, piece, *a, **k: reads.append(piece) or original(self, piece, *a, **k))
    (tmp_path / "cache").mkdir()
    ds = ts.Dataset(path, part_size=10_000, cache="disk", cache_dir=str(tmp_path / "cache"))
    assert 1 < ds.npartitions < 8  # pieces of several row groups
    wf = ts.Workflow((["low", "shifted"] >> ops.Categorify(freq_threshold=freq_threshold)) + ["x"]).fit(ds)
    cached = ds.read_piece(ds.pieces[0], wf.input_columns, ["low", "shifted"])
    assert cached.column("shifted").num_chunks > 1 and pa.types.is_dictionary(cached.schema.field("shifted").type)
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert sorted(reads, key=ds.pieces.index) == ds.pieces  # each partition read from parquet once
    got = pd.read_parquet(tmp_path / "out")
    for name in ["low", "shifted"]:
        values = frame[name].astype(object).where(frame[name].notna(), None).tolist()
        assert got[name].tolist() == _ids_reference(values, freq_threshold)
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())


def _count_raw_reads(monkeypatch):
    reads = []
    original = ts.Dataset._read_piece_raw
    monkeypatch.setattr(ts.Dataset, "_read_piece_raw",
                        lambda self, piece, *a, **k: reads.append(piece) or original(self, piece, *a, **k))
    return reads


def test_default_cache_keeps_the_fit_partitions_of_parquet_for_the_export(tmp_path, frame, monkeypatch):
    import gc

    path = _write(tmp_path, frame)
    reads = _count_raw_reads(monkeypatch)
    ds = ts.Dataset(path, part_size=10_000)  # cache="auto"
    assert ds.npartitions > 1
    wf = ts.Workflow((["low", "shifted"] >> ops.Categorify(freq_threshold=12)) + ["other", "x"]).fit(ds)
    assert len(reads) == ds.npartitions  # the fit read parquet once per partition ...
    cache_dir = ds._cache.folder
    assert cache_dir is not None and len(os.listdir(cache_dir)) == ds.npartitions
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert len(reads) == ds.npartitions  # ... and the export read none again
    got = pd.read_parquet(tmp_path / "out")
    for name in ["low", "shifted"]:
        values = frame[name].astype(object).where(frame[name].notna(), None).tolist()
        assert got[name].tolist() == _ids_reference(values, 12)
    assert got["other"].tolist() == frame["other"].tolist()
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())
    del ds, wf
    gc.collect()
    assert not os.path.exists(cache_dir)  # removed with the Dataset


def test_default_cache_of_parquet_is_written_by_fits_only(tmp_path, frame, monkeypatch):
    path = _write(tmp_path, frame)
    reads = _count_raw_reads(monkeypatch)
    ds = ts.Dataset(path, part_size=10_000)
    read = ds.to_ddf().compute().reset_index(drop=True)
    assert read.astype(object).where(read.notna(), None).values.tolist() == \
        frame.astype(object).where(frame.notna(), None).values.tolist()
    ds.to_parquet(str(tmp_path / "copy"))
    # nothing kept: the export read every piece raw again (a piece whose rows go to
    # two writer groups' files is read by both)
    assert ds._cache.folder is None and set(reads[ds.npartitions:]) == set(ds.pieces)
    off = ts.Dataset(path, part_size=10_000, cache=None)
    ts.Workflow(["low"] >> ops.Categorify()).fit(off)
    assert off._cache.folder is None


def test_default_cache_of_parquet_that_cannot_be_written_reads_parquet_again(tmp_path, frame, monkeypatch):
    path = _write(tmp_path, frame)
    reads = _count_raw_reads(monkeypatch)
    ds = ts.Dataset(path, part_size=10_000, cache_dir=str(tmp_path / "missing"))  # no such folder
    with pytest.warns(CacheWarning, match="cache folder .*missing cannot be used"):
        wf = ts.Workflow((["low"] >> ops.Categorify()) + ["x"]).fit(ds)
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert len(reads) >= 2 * ds.npartitions and set(reads[ds.npartitions:]) == set(ds.pieces)
    got = pd.read_parquet(tmp_path / "out")
    values = frame["low"].astype(object).where(frame["low"].notna(), None).tolist()
    assert got["low"].tolist() == _ids_reference(values, 0)


@pytest.mark.real_disk_reserve
def test_default_cache_leaves_the_disk_a_reserve(tmp_path, frame, monkeypatch):
    import collections

    import tabstream.pipeline.partition_cache as partition_cache

    path = _write(tmp_path, frame)
    reads = _count_raw_reads(monkeypatch)
    usage = collections.namedtuple("usage", "total used free")
    free = {"bytes": 100 * 2**30}
    monkeypatch.setattr(partition_cache.shutil, "disk_usage",
                        lambda folder: usage(200 * 2**30, 0, free["bytes"]))
    ds = ts.Dataset(path, part_size=4_000)
    first = ds.read_piece(ds.pieces[0], ["low", "x"], keep=True)
    assert len(os.listdir(ds._cache.folder)) == 1  # room enough: kept
    assert first.nbytes > 100
    free["bytes"] = 10 * 2**30 + 100  # a tenth of the disk, at most 10 GiB, is its reserve
    with pytest.warns(CacheWarning) as caught:
        wf = ts.Workflow((["low"] >> ops.Categorify()) + ["x"]).fit(ds)
    # said once for the Dataset (several partitions were refused), naming the folder
    # and the space left
    said = [w for w in caught if issubclass(w.category, CacheWarning)]
    assert ds.npartitions > 2 and len(said) == 1
    assert ds._cache.folder in str(said[0].message)
    assert "nearly full disk (10.0 GiB free of 200 GiB, 10.0 GiB kept free" in str(said[0].message)
    assert len(os.listdir(ds._cache.folder)) == 1  # nothing more kept
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert len(reads) == 1 + 2 * ds.npartitions
    got = pd.read_parquet(tmp_path / "out")
    values = frame["low"].astype(object).where(frame["low"].notna(), None).tolist()
    assert got["low"].tolist() == _ids_reference(values, 0)
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())


@pytest.mark.real_disk_reserve
def test_no_cache_warning_where_nothing_would_be_kept_anyway(tmp_path, frame, monkeypatch):
    # On a nearly full disk: a parquet Dataset whose budget keeps nothing, and one
    # with cache=None, never consult the disk and say nothing.
    import collections
    import warnings

    import tabstream.pipeline.partition_cache as partition_cache

    path = _write(tmp_path, frame)
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(partition_cache.shutil, "disk_usage", lambda folder: usage(200 * 2**30, 0, 2**30))
    monkeypatch.setattr(partition_cache, "PARQUET_CACHE_MAX_BYTES", 1)
    values = frame["low"].astype(object).where(frame["low"].notna(), None).tolist()
    for cache in ("auto", None):
        ds = ts.Dataset(path, part_size=4_000, cache=cache)
        with warnings.catch_warnings():
            warnings.simplefilter("error", CacheWarning)
            wf = ts.Workflow((["low"] >> ops.Categorify()) + ["x"]).fit(ds)
            wf.transform(ds).to_parquet(str(tmp_path / f"out-{cache}"))
        got = pd.read_parquet(tmp_path / f"out-{cache}")
        assert got["low"].tolist() == _ids_reference(values, 0)


@pytest.mark.real_disk_reserve
@pytest.mark.parametrize("total_gib, reserve_gib", [(8, 2), (50, 5), (500, 10)])
def test_default_cache_reserve_is_a_tenth_of_the_disk_within_2_and_10_gib(total_gib, reserve_gib):
    import tabstream.pipeline.partition_cache as partition_cache

    assert partition_cache._disk_reserve(total_gib * 2**30) == reserve_gib * 2**30


def test_default_cache_of_parquet_keeps_at_most_its_budget(tmp_path, frame, monkeypatch):
    import tabstream.pipeline.partition_cache as partition_cache

    path = _write(tmp_path, frame)
    reads = _count_raw_reads(monkeypatch)
    ds = ts.Dataset(path, part_size=4_000)
    sizes = [ds.read_piece(p, ["low", "x"], ["low"]).nbytes for p in ds.pieces]
    assert len(sizes) >= 3
    reads.clear()
    values = frame["low"].astype(object).where(frame["low"].notna(), None).tolist()
    # a budget that holds two partitions of three or more: nothing is kept (all or nothing)
    monkeypatch.setattr(partition_cache, "PARQUET_CACHE_MAX_BYTES", sizes[0] + sizes[1])
    wf = ts.Workflow((["low"] >> ops.Categorify()) + ["x"]).fit(ds)
    assert not os.path.isdir(ds._cache.folder or "") or os.listdir(ds._cache.folder) == []
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    assert len(reads) == 2 * ds.npartitions  # every partition decoded twice
    got = pd.read_parquet(tmp_path / "out")
    assert got["low"].tolist() == _ids_reference(values, 0)
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())
    # a budget that holds them all (with room for partitions larger than the first)
    reads.clear()
    ds = ts.Dataset(path, part_size=4_000)
    monkeypatch.setattr(partition_cache, "PARQUET_CACHE_MAX_BYTES", 2 * max(sizes) * len(sizes))
    wf = ts.Workflow((["low"] >> ops.Categorify()) + ["x"]).fit(ds)
    assert len(os.listdir(ds._cache.folder)) == ds.npartitions
    wf.transform(ds).to_parquet(str(tmp_path / "out2"))
    assert len(reads) == ds.npartitions  # the export maps every kept partition
    got = pd.read_parquet(tmp_path / "out2")
    assert got["low"].tolist() == _ids_reference(values, 0)
    np.testing.assert_array_equal(got["x"].to_numpy(), frame["x"].to_numpy())

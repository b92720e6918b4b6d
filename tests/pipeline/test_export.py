import json
import os

import dask
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import ExportError


def fitted(df):
    node = (["C1"] >> ops.Categorify()) + (["I2"] >> ops.Normalize()) + ["row_id", "label"]
    return ts.Workflow(node).fit(ts.Dataset(df))


def read_export(path):
    with open(os.path.join(path, "_manifest.json")) as f:
        manifest = json.load(f)
    frames = [pq.read_table(os.path.join(path, f["path"])).to_pandas() for f in manifest["files"]]
    return manifest, frames


@pytest.mark.parametrize("shuffle", [None, "per_partition", "per_worker", "full"])
@pytest.mark.parametrize("files", [{"out_files_per_proc": 1}, {"out_files_per_proc": 3}, {"num_files": 5}])
def test_every_row_exactly_once(small_raw, tmp_path, shuffle, files):
    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    result = wf.transform(ts.Dataset(small_raw, part_size=4000)).to_parquet(out, shuffle=shuffle, seed=3, **files)
    manifest, frames = read_export(out)
    ids = np.concatenate([f["row_id"].to_numpy() for f in frames])
    assert sorted(ids.tolist()) == list(range(len(small_raw)))
    assert manifest["num_rows"] == len(small_raw) == result.num_rows
    assert [f["num_rows"] for f in manifest["files"]] == [len(f) for f in frames]
    if "num_files" in files:
        assert len(frames) <= 5
    if shuffle is None:
        assert ids.tolist() == list(range(len(small_raw)))
    else:
        assert ids.tolist() != list(range(len(small_raw)))
    # values are the transformed rows
    whole = pd.concat(frames).sort_values("row_id").reset_index(drop=True)
    pd.testing.assert_frame_equal(whole, wf.transform(small_raw), check_dtype=False)


def test_shuffle_is_reproducible_from_seed(small_raw, tmp_path):
    wf = fitted(small_raw)
    ds = ts.Dataset(small_raw, part_size=4000)
    orders = []
    for i, seed in enumerate([5, 5, 6]):
        wf.transform(ds).to_parquet(str(tmp_path / f"o{i}"), shuffle="per_worker", seed=seed, num_files=2)
        orders.append(np.concatenate([f["row_id"].to_numpy() for f in read_export(str(tmp_path / f"o{i}"))[1]]))
    assert orders[0].tolist() == orders[1].tolist()
    assert orders[0].tolist() != orders[2].tolist()


def test_sidecars_schema_metadata_and_dataset_roundtrip(small_raw, tmp_path):
    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    wf.transform(ts.Dataset(small_raw)).to_parquet(out, num_files=2)
    assert ts.Schema.from_json(os.path.join(out, "_schema.json")) == wf.output_schema
    assert sorted(n for n in os.listdir(out) if not n.endswith(".parquet")) == [
        "_manifest.json", "_metadata", "_schema.json"], "everything beside the data starts with _"
    md = pq.read_metadata(os.path.join(out, "_metadata"))
    assert md.num_rows == len(small_raw)
    back = ts.Dataset(out)
    assert back.schema["C1"].cardinality == wf.output_schema["C1"].cardinality
    assert ts.Tags.CATEGORICAL in back.schema["C1"].tags
    assert back.schema["I2"].dtype == "float32"
    assert not any(name.startswith(".") for name in os.listdir(tmp_path))


def test_export_folder_reads_as_is_with_pandas_and_pyarrow(small_raw, tmp_path):
    import pyarrow.dataset as pads

    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    wf.transform(ts.Dataset(small_raw, part_size=4000)).to_parquet(out, num_files=3)
    expected = wf.transform(small_raw).sort_values("row_id").reset_index(drop=True)
    for got in (pd.read_parquet(out), pads.dataset(out, format="parquet").to_table().to_pandas()):
        got = got.sort_values("row_id").reset_index(drop=True)
        pd.testing.assert_frame_equal(got, expected, check_dtype=False)


def test_schema_json_of_older_versions_is_still_read(small_raw, tmp_path):
    wf = fitted(small_raw)
    out = tmp_path / "out"
    wf.transform(ts.Dataset(small_raw)).to_parquet(str(out))
    (out / "_schema.json").rename(out / "schema.json")  # the layout older versions wrote
    back = ts.Dataset(str(out))
    assert back.schema["C1"].cardinality == wf.output_schema["C1"].cardinality
    assert ts.Tags.CATEGORICAL in back.schema["C1"].tags


def test_keysets_hold_each_files_unique_ids(small_raw, tmp_path):
    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    wf.transform(ts.Dataset(small_raw, part_size=4000)).to_parquet(out, num_files=3, write_keysets=True)
    manifest, frames = read_export(out)
    for entry, frame in zip(manifest["files"], frames):
        keys = pq.read_table(os.path.join(out, "_keysets", entry["path"])).to_pandas()
        assert set(keys["column"]) == {"C1"}
        assert sorted(keys["id"]) == sorted(frame["C1"].unique())


def test_failure_leaves_nothing_that_looks_finished(small_raw, tmp_path, monkeypatch):
    wf = fitted(small_raw)
    out = tmp_path / "out"
    import tabstream.pipeline.export as export_mod

    calls = {"n": 0}
    original = export_mod._Plan.read

    def failing_read(self, piece_index):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("disk on fire")
        return original(self, piece_index)

    monkeypatch.setattr(export_mod._Plan, "read", failing_read)
    with pytest.raises(ExportError, match="disk on fire"):
        wf.transform(ts.Dataset(small_raw, part_size=2000)).to_parquet(str(out), num_files=2)
    assert not out.exists()
    assert os.listdir(tmp_path) == []


def test_killed_export_leaves_only_a_hidden_temp_folder(small_raw, tmp_path):
    """Simulate a kill between writing files and publishing: only the hidden temp folder exists."""
    import tabstream.pipeline.export_folder as export_folder

    wf = fitted(small_raw)
    original = export_folder.publish

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    export_folder.publish = killed
    try:
        with pytest.raises(KeyboardInterrupt):
            wf.transform(ts.Dataset(small_raw)).to_parquet(str(tmp_path / "out"))
    finally:
        export_folder.publish = original
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError):
        ts.Dataset(str(tmp_path / "*.parquet"))


def test_existing_output_needs_overwrite(small_raw, tmp_path):
    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    wf.transform(ts.Dataset(small_raw)).to_parquet(out)
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        wf.transform(ts.Dataset(small_raw)).to_parquet(out)
    wf.transform(ts.Dataset(small_raw)).to_parquet(out, overwrite=True, num_files=2)
    assert read_export(out)[0]["num_rows"] == len(small_raw)
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_export_to_memory_filesystem(small_raw):
    wf = fitted(small_raw)
    wf.transform(ts.Dataset(small_raw)).to_parquet("memory://exp/out", num_files=2)
    back = ts.Dataset("memory://exp/out")
    assert back.num_rows == len(small_raw)


def test_dataset_export_without_workflow(small_raw, tmp_path):
    ts.Dataset(small_raw).to_parquet(str(tmp_path / "raw"), num_files=2)
    back = ts.Dataset(str(tmp_path / "raw"))
    assert back.num_rows == len(small_raw)


@pytest.mark.parametrize("kwargs, msg", [
    ({"shuffle": "sideways"}, "shuffle must be one of"),
    ({"num_files": 0}, "num_files must be a positive integer"),
    ({"num_files": 2, "out_files_per_proc": 2}, "not both"),
])
def test_bad_export_arguments(small_raw, tmp_path, kwargs, msg):
    with pytest.raises(ValueError, match=msg):
        fitted(small_raw).transform(ts.Dataset(small_raw)).to_parquet(str(tmp_path / "o"), **kwargs)


def test_keysets_stay_bounded_over_many_partitions(small_raw, tmp_path, monkeypatch):
    """A file's unique ids are merged as partitions arrive (at most _KEYSET_MERGE + 1
    arrays wait), so a file of many partitions holds about its distinct ids, not one
    array per partition; the keysets are those of the files all the same."""
    import tabstream.pipeline.export as export_mod

    longest = {"n": 0}
    original = export_mod._FileWriter.write

    def write(self, table):
        original(self, table)
        longest["n"] = max([longest["n"], *(len(found) for found in self.keys.values())])

    monkeypatch.setattr(export_mod._FileWriter, "write", write)
    monkeypatch.setattr(export_mod, "_KEYSET_MERGE", 2)
    wf = fitted(small_raw)
    out = str(tmp_path / "out")
    ds = ts.Dataset(small_raw, part_size=1000)
    assert ds.npartitions >= 8
    wf.transform(ds).to_parquet(out, num_files=1, write_keysets=True)
    assert 1 <= longest["n"] <= 3
    manifest, frames = read_export(out)
    keys = pq.read_table(os.path.join(out, "_keysets", manifest["files"][0]["path"])).to_pandas()
    assert sorted(keys["id"]) == sorted(frames[0]["C1"].unique())


def test_a_partition_is_dropped_before_the_next_is_read(small_raw, tmp_path, monkeypatch):
    """An export task holds one partition at a time: the table written is gone when
    the next partition is read (it refers to the input's buffers, a mapped cache
    file's pages among them); the output is every row all the same."""
    import weakref

    import tabstream.pipeline.export as export_mod

    alive: list[weakref.ref] = []
    held_during_read: list[bool] = []
    original = export_mod._Plan.read

    def read(self, piece_index):
        held_during_read.append(any(r() is not None for r in alive))
        table = original(self, piece_index)
        alive.append(weakref.ref(table))
        return table

    monkeypatch.setattr(export_mod._Plan, "read", read)
    wf = fitted(small_raw)
    ds = ts.Dataset(small_raw, part_size=2000)
    assert ds.npartitions >= 3
    with dask.config.set(num_workers=1):
        wf.transform(ds).to_parquet(str(tmp_path / "out"), num_files=1)
    assert len(held_during_read) == ds.npartitions and not any(held_during_read)
    manifest, frames = read_export(str(tmp_path / "out"))
    assert sum(len(f) for f in frames) == len(wf.transform(small_raw))


def test_categorical_ids_are_delta_packed_and_read_back_exactly(small_raw, tmp_path):
    # Categorify's and HashBucket's ids (known range) are written DELTA_BINARY_PACKED;
    # an integer column tagged categorical without a known range, the label and the
    # floats keep pyarrow's dictionary
    rng = np.random.default_rng(1)
    df = small_raw.assign(raw_id=rng.integers(0, 2**62, len(small_raw)),
                          tags=[list(rng.choice(["x", "y", "z"], rng.integers(0, 4))) for _ in range(len(small_raw))])
    node = ((["C1", "C2", "tags"] >> ops.Categorify())
            + (["C2"] >> ops.HashBucket(7) >> ops.Rename(postfix="_h"))
            + (["I2"] >> ops.Normalize()) + (["raw_id"] >> ops.AddTags(["categorical"])) + ["label"])
    wf = ts.Workflow(node).fit(ts.Dataset(df))
    wf.transform(ts.Dataset(df)).to_parquet(str(tmp_path / "out"), out_files_per_proc=1, shuffle=None)
    _, frames = read_export(str(tmp_path / "out"))
    got = pd.concat(frames, ignore_index=True)
    path = os.path.join(str(tmp_path / "out"), "part_00000.parquet")
    md = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {md.column(i).path_in_schema: md.column(i).encodings for i in range(md.num_columns)}
    for name in ("C1", "C2", "C2_h"):
        assert "DELTA_BINARY_PACKED" in encodings[name] and "RLE_DICTIONARY" not in encodings[name], name
    # a list column's ids (multi-hot) keep the dictionary: the writer names it by its leaf
    for name in ("raw_id", "label", "I2", "tags.list.element"):
        assert "RLE_DICTIONARY" in encodings[name] and "DELTA_BINARY_PACKED" not in encodings[name], name
    # the ids as pandas computes them: Categorify's by frequency, then by value
    for name in ("C1", "C2"):
        counts = df[name].value_counts(dropna=True)
        order = sorted(counts.index, key=lambda v: (-counts[v], v))
        expected = df[name].map({v: i + 3 for i, v in enumerate(order)}).fillna(1).astype("int64")
        np.testing.assert_array_equal(got[name].to_numpy(), expected.to_numpy())
    np.testing.assert_array_equal(got["raw_id"].to_numpy(), df["raw_id"].to_numpy())
    assert got["C2_h"].between(0, 6).all()
    tag_ids = {v: i + 3 for i, v in enumerate(sorted(["x", "y", "z"],
                                                      key=lambda v: (-sum(t.count(v) for t in df["tags"]), v)))}
    assert [list(v) for v in got["tags"]] == [[tag_ids[v] for v in t] for t in df["tags"]]
    assert wf.transform(ts.Dataset(df)).to_ddf().compute()["C2_h"].tolist() == got["C2_h"].tolist()


def test_delta_packed_only_for_scalar_categorical_ids_of_known_range():
    from tabstream.core.schema import ColumnSchema, Schema
    from tabstream.pipeline.export import delta_encoded_columns

    def col(name, dtype="int64", tags=("categorical",), low=0, high=99, is_list=False):
        domain = {} if low is None else {"domain": {"min": low, "max": high}}
        return ColumnSchema(name, dtype, frozenset(tags), domain, is_list)

    schema = Schema([col("ids"), col("ids32", "int32"), col("u", "uint64", high=2**32 - 1),
                     col("wide", high=2**32), col("negative", low=-1), col("unknown", low=None),
                     col("listed", is_list=True), col("untagged", tags=()), col("name", "string"),
                     col("f", "float32")])
    assert delta_encoded_columns(schema) == ["ids", "ids32", "u"]

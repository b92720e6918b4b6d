"""Object stores: a moto S3-protocol server on 127.0.0.1 (started here) serves raw
TSV and parquet; fit, export (plain and overwrite), Workflow.save/load and a Loader
all run against ``s3://``. Publishing writes ``_manifest.json`` last; readers refuse
tabstream files in a prefix without one; no stray keys after success, failure or
overwrite."""

from __future__ import annotations

import io
import json

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, ExportError
from tabstream.core.schema import Tags
from tabstream.testing import assert_tables_equal


def _frame(n: int = 3_000, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "label": rng.integers(0, 2, n),
        "I1": rng.normal(size=n),
        "C1": np.array(["a", "b", "c", "d", "e"])[rng.integers(0, 5, n)],
        "C2": rng.integers(0, 50, n),
    })


def _graph():
    return (["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.Normalize()) + (
        ["label"] >> ops.AddTags([Tags.TARGET]))


def _keys(fs, prefix: str) -> set[str]:
    fs.invalidate_cache()
    return {k for k in fs.find(prefix)}


def _read(fs, prefix: str) -> pa.Table:
    """The export's rows with plain pyarrow over s3fs, in manifest order."""
    import json

    manifest = json.loads(fs.cat_file(f"{prefix}/_manifest.json"))
    return pa.concat_tables([pq.read_table(io.BytesIO(fs.cat_file(f"{prefix}/{f['path']}")))
                             for f in manifest["files"]]).replace_schema_metadata(None)


def _expected(frame: pd.DataFrame) -> pa.Table:
    wf = ts.Workflow(_graph()).fit(ts.Dataset(frame))
    return pa.Table.from_pandas(wf.transform(frame), preserve_index=False).replace_schema_metadata(None)


@pytest.mark.parametrize("fmt", ["tsv", "parquet"])
def test_raw_from_s3_fit_and_export_to_s3(s3, fmt):
    fs, options = s3
    frame = _frame()
    prefix = f"bkt/raw-{fmt}"
    for i, part in enumerate(np.array_split(np.arange(len(frame)), 3)):
        chunk = frame.iloc[part]
        if fmt == "tsv":
            fs.pipe_file(f"{prefix}/part_{i}.tsv", chunk.to_csv(sep="\t", header=False, index=False).encode())
        else:
            buf = io.BytesIO()
            chunk.to_parquet(buf, index=False)
            fs.pipe_file(f"{prefix}/part_{i}.parquet", buf.getvalue())
    kwargs = ({"sep": "\t", "names": list(frame.columns),
               "dtypes": {"label": "int64", "I1": "float64", "C1": "str", "C2": "int64"}} if fmt == "tsv" else {})
    ds = ts.Dataset(f"s3://{prefix}", storage_options=options, **kwargs)
    wf = ts.Workflow(_graph()).fit(ds)
    out = f"bkt/out-{fmt}"
    result = wf.transform(ds).to_parquet(f"s3://{out}", storage_options=options)
    assert_tables_equal(_read(fs, out), _expected(frame), check_dtype=False)
    assert _keys(fs, out) == {f"{out}/{f}" for f in
                              [*result.files, "_manifest.json", "_schema.json", "_metadata"]}
    # the Dataset reads the export back, with its tags
    back = ts.Dataset(f"s3://{out}", storage_options=options)
    assert back.schema.select_by_tag(Tags.TARGET).column_names == ["label"]
    assert back.num_rows == len(frame)


def test_overwrite_on_s3_leaves_no_stray_keys(s3):
    fs, options = s3
    out = "bkt/over"
    first, second = _frame(seed=1), _frame(n=1_000, seed=2)
    wf = ts.Workflow(_graph()).fit(ts.Dataset(first))
    wf.transform(ts.Dataset(first, part_size=20_000)).to_parquet(f"s3://{out}", storage_options=options,
                                                                 write_keysets=True)
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        wf.transform(ts.Dataset(second)).to_parquet(f"s3://{out}", storage_options=options)
    result = wf.transform(ts.Dataset(second)).to_parquet(f"s3://{out}", storage_options=options,
                                                        overwrite=True, write_keysets=True)
    expected_keys = {f"{out}/{f}" for f in [*result.files, "_manifest.json", "_schema.json", "_metadata"]}
    expected_keys |= {f"{out}/_keysets/{f}" for f in result.files}
    assert _keys(fs, out) == expected_keys
    assert_tables_equal(_read(fs, out), pa.Table.from_pandas(wf.transform(second), preserve_index=False)
                        .replace_schema_metadata(None), check_dtype=False)
    assert not [k for k in fs.find("bkt") if ".over." in k]  # no .old-/.tmp- prefixes


def _failing(col):
    if (col > 0.5).any():
        raise RuntimeError("boom in a partition")
    return col


def test_failure_part_way_leaves_nothing_and_keeps_the_old_export(s3):
    fs, options = s3
    frame = _frame(seed=3)
    good = ts.Workflow(_graph()).fit(ts.Dataset(frame))
    bad = ts.Workflow(["I1"] >> ops.LambdaOp(_failing, dtype="float64")).fit(ts.Dataset(frame))
    # a first export that fails part-way: no key is left
    with pytest.raises(ExportError, match=r"export to 's3://bkt/fail' failed, nothing was written: boom"):
        bad.transform(ts.Dataset(frame, part_size=20_000)).to_parquet("s3://bkt/fail", storage_options=options)
    assert _keys(fs, "bkt/fail") == set()
    # an overwrite that fails part-way: the old export is whole again, key for key
    good.transform(ts.Dataset(frame)).to_parquet("s3://bkt/keep", storage_options=options)
    before = {k: fs.cat_file(k) for k in _keys(fs, "bkt/keep")}
    with pytest.raises(ExportError, match="failed, nothing was written: boom"):
        bad.transform(ts.Dataset(frame, part_size=20_000)).to_parquet(
            "s3://bkt/keep", storage_options=options, overwrite=True)
    assert {k: fs.cat_file(k) for k in _keys(fs, "bkt/keep")} == before
    assert ts.Dataset("s3://bkt/keep", storage_options=options).num_rows == len(frame)


def test_prefix_without_manifest_is_refused(s3):
    fs, options = s3
    frame = _frame(seed=4)
    wf = ts.Workflow(_graph()).fit(ts.Dataset(frame))
    result = wf.transform(ts.Dataset(frame)).to_parquet("s3://bkt/full", storage_options=options)
    # what an export still running (or killed) leaves: data files, no manifest yet
    fs.copy(f"bkt/full/{result.files[0]}", f"bkt/half/{result.files[0]}")
    with pytest.raises(DataError, match=r"s3://bkt/half/part_00000\.parquet: written by a tabstream "
                                        r"export, but its prefix has no _manifest\.json"):
        ts.Dataset("s3://bkt/half", storage_options=options)
    # plain parquet on the object store (not written by an export) is read as ever
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    fs.pipe_file("bkt/plain/x.parquet", buf.getvalue())
    assert ts.Dataset("s3://bkt/plain", storage_options=options).num_rows == len(frame)


def test_partition_on_export_on_s3_reads_back(s3):
    """An export with ``partition_on`` writes its files into hive folders under the
    prefix that gets the manifest: read back whole (it was refused as unpublished,
    the manifest being looked for beside each file), while the same hive folders
    without a manifest above them are still refused."""
    fs, options = s3
    frame = _frame(seed=6)
    wf = ts.Workflow(_graph()).fit(ts.Dataset(frame))
    wf.transform(ts.Dataset(frame)).to_parquet("s3://bkt/parted", partition_on=["label"],
                                               storage_options=options)
    assert {k.rsplit("/", 2)[-2] for k in _keys(fs, "bkt/parted") if k.endswith(".parquet")} == {
        "label=0", "label=1"}
    back = ts.Dataset("s3://bkt/parted", storage_options=options)
    got = pa.concat_tables([back.read_piece(p) for p in back.pieces])
    expected = _expected(frame)
    assert got.num_rows == len(frame)
    keys = [("C1", "ascending"), ("C2", "ascending"), ("I1", "ascending"), ("label", "ascending")]
    got = got.select(expected.column_names).cast(expected.schema).sort_by(keys)
    assert got.equals(expected.sort_by(keys))
    # a partitioned export still being written: its hive folders, no manifest yet
    for key in _keys(fs, "bkt/parted/label=1"):
        fs.copy(key, key.replace("bkt/parted/", "bkt/halfparted/"))
    with pytest.raises(DataError, match=r"s3://bkt/halfparted/label=1/part_00000\.parquet: written by "
                                        r"a tabstream export, but its prefix has no _manifest\.json"):
        ts.Dataset("s3://bkt/halfparted", storage_options=options)


def test_workflow_save_load_and_loader_on_s3(s3):
    fs, options = s3
    frame = _frame(seed=5)
    wf = ts.Workflow(_graph()).fit(ts.Dataset(frame))
    wf.save("s3://bkt/wf", storage_options=options)
    again = ts.Workflow.load("s3://bkt/wf", storage_options=options)
    pd.testing.assert_frame_equal(again.transform(frame), wf.transform(frame))
    again.transform(ts.Dataset(frame)).to_parquet("s3://bkt/train", storage_options=options)
    from tabstream.loaders import Loader

    loader = Loader("s3://bkt/train", batch_size=512, shuffle=False, storage_options=options)
    seen = []
    for batch in loader:
        features, labels = batch
        seen.append(np.asarray(labels["label"] if isinstance(labels, dict) else labels).reshape(-1))
    assert np.array_equal(np.concatenate(seen), wf.transform(frame)["label"].to_numpy())


def test_two_savers_on_s3_the_last_workflow_json_wins_whole(s3, monkeypatch):
    """The race of two ``Workflow.save`` to one s3 path, step by step: B has written its
    stats files but not yet its ``workflow.json`` when A's save runs to the end. A
    must leave B's fresh stats files alone, so that B's ``workflow.json``, written
    last, loads as B whole (A's cleanup removed them before: B's folder failed to
    load). Stats files no ``workflow.json`` names are removed once stale."""
    import tabstream.pipeline.workflow as workflow_module

    fs, options = s3
    frame_a, frame_b = _frame(seed=11), _frame(seed=12)
    a = ts.Workflow(_graph()).fit(ts.Dataset(frame_a))
    b = ts.Workflow(_graph()).fit(ts.Dataset(frame_b.assign(C1=frame_b["C1"] + "x")))
    b.save("s3://bkt/race-b", storage_options=options)
    # B, mid-save at bkt/race: its stats are there, its workflow.json not yet
    b_stats = fs.ls("bkt/race-b/stats", detail=False)
    for path in b_stats:
        fs.copy(path, "bkt/race/stats/" + path.rsplit("/", 1)[1])
    a.save("s3://bkt/race", storage_options=options)  # A's save, start to end
    fs.invalidate_cache()
    assert {p.rsplit("/", 1)[1] for p in b_stats} <= {p.rsplit("/", 1)[1] for p in fs.ls("bkt/race/stats")}
    fs.copy("bkt/race-b/workflow.json", "bkt/race/workflow.json")  # B's last step
    fs.invalidate_cache()
    again = ts.Workflow.load("s3://bkt/race", storage_options=options)
    pd.testing.assert_frame_equal(again.transform(frame_b), b.transform(frame_b))
    # a later save, with stats counted stale at once, keeps only its own files
    monkeypatch.setattr(workflow_module, "STALE_STATS_S", 0.0)
    a.save("s3://bkt/race", storage_options=options)
    fs.invalidate_cache()
    doc = json.loads(fs.cat_file("bkt/race/workflow.json"))
    named = {path.rsplit("/", 1)[1] for node in doc["nodes"] for path in node.get("tables", {}).values()}
    assert {p.rsplit("/", 1)[1] for p in fs.ls("bkt/race/stats")} == named
    again = ts.Workflow.load("s3://bkt/race", storage_options=options)
    pd.testing.assert_frame_equal(again.transform(frame_a), a.transform(frame_a))


def test_categorify_spills_to_s3_reads_buckets_back_and_removes_them(s3, monkeypatch):
    """``spill_dir`` on an object store: each spill one object, its buckets read back
    by ranged requests, every object removed after the merge."""
    import fsspec.config

    fs, options = s3
    monkeypatch.setitem(fsspec.config.conf, "s3", options)  # what spill_dir's s3:// URL connects with
    rng = np.random.default_rng(4)
    frame = pd.DataFrame({"c": [f"v{x:05d}" for x in rng.zipf(1.3, 6000) % 3000]})
    op = ops.Categorify(freq_threshold=2, spill_rows=50, spill_buckets=5, spill_dir="s3://bkt/spill")
    spills = []
    spill = ops.Categorify._spill

    def spy(self, *args):
        written = spill(self, *args)
        spills.append(written)
        assert written.path.removeprefix("s3://") in _keys(fs, "bkt/spill")
        return written

    monkeypatch.setattr(ops.Categorify, "_spill", spy)
    ts.Workflow(["c"] >> op).fit(ts.Dataset(frame, part_size=8000))
    assert len(spills) > 1 and all(s.path.startswith("s3://bkt/spill/") for s in spills)
    counts = frame["c"].value_counts()
    counts = counts[counts >= 2]
    expected = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"]["values"].to_pylist() == [v for v, _ in expected]
    assert op.tables["c"]["counts"].to_pylist() == [c for _, c in expected]
    assert _keys(fs, "bkt/spill") == set()

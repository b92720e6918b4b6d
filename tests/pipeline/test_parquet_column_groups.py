"""A parquet piece is decoded a few columns at a time (``column_groups``): Arrow's
reader keeps every column's buffers until its call returns, so one call for all
columns held about 2.5x the decoded table. The groups follow the footer's
uncompressed sizes; the table read in groups equals the file read whole by pyarrow."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.pipeline import parquet_files
from tabstream.pipeline.parquet_files import column_groups


def _mixed_table(n: int, seed: int = 3) -> pa.Table:
    """Flat, nested (struct of two leaves, list, map) and string columns, with nulls."""
    rng = np.random.default_rng(seed)
    ints = rng.integers(0, 1000, n)
    return pa.table({
        "label": pa.array(rng.integers(0, 2, n)),
        "i1": pa.array(ints, mask=rng.random(n) < 0.2),
        "point": pa.StructArray.from_arrays([pa.array(rng.normal(size=n)), pa.array(ints * 2)], ["x", "y"]),
        "tags": pa.array([list(rng.integers(0, 50, rng.integers(0, 4))) for _ in range(n)],
                         pa.list_(pa.int64())),
        "attrs": pa.array([[("k", int(v))] for v in ints], pa.map_(pa.string(), pa.int64())),
        "c1": pa.array([f"{v:08x}" if v % 7 else None for v in ints]),
        "c2": pa.array([f"v{v % 13}" for v in ints]),
        "f": pa.array(rng.normal(size=n).astype(np.float32)),
    })


def _column_sizes(md: pq.FileMetaData, row_groups: list[int]) -> dict[str, int]:
    """Uncompressed bytes of each top-level column in ``row_groups``, from the leaves'
    dotted paths (the names here hold no dots)."""
    sizes: dict[str, int] = {}
    for g in row_groups:
        rg = md.row_group(g)
        for i in range(rg.num_columns):
            name = rg.column(i).path_in_schema.split(".")[0]
            sizes[name] = sizes.get(name, 0) + rg.column(i).total_uncompressed_size
    return sizes


@pytest.mark.parametrize("group_bytes", [1, 2_000, 20_000, 10**9])
def test_groups_hold_the_columns_in_order_cut_once_they_reach_the_size(tmp_path, group_bytes):
    path = tmp_path / "mixed.parquet"
    pq.write_table(_mixed_table(3_000), path, row_group_size=1_000)
    pf = pq.ParquetFile(path)
    row_groups = [0, 2]
    columns = ["f", "point", "label", "attrs", "c1", "tags", "c2"]  # not the file's order
    groups = column_groups(pf.metadata, pf.schema_arrow, row_groups, columns, group_bytes)
    assert [c for g in groups for c in g] == columns
    sizes = _column_sizes(pf.metadata, row_groups)
    for group in groups[:-1]:  # each group closes at the first column reaching the size
        total = sum(sizes[c] for c in group)
        assert total >= group_bytes
        assert total - sizes[group[-1]] < group_bytes
    assert sum(sizes[c] for c in groups[-1]) > 0
    if group_bytes == 1:
        assert groups == [[c] for c in columns]
    if group_bytes == 10**9:
        assert groups == [columns]


def test_a_schema_that_does_not_match_the_leaves_gives_one_group(tmp_path):
    path = tmp_path / "mixed.parquet"
    pq.write_table(_mixed_table(500), path)
    pf = pq.ParquetFile(path)
    other = pf.schema_arrow.append(pa.field("extra", pa.int64()))  # one leaf too many
    assert column_groups(pf.metadata, other, [0], ["label", "c1", "f"], 1) == [["label", "c1", "f"]]


@pytest.fixture
def spied_reads(monkeypatch):
    """The column lists each ``read_row_groups`` call of the Dataset asked for."""
    calls: list[list[str]] = []
    original = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, columns=None, **kwargs):
        calls.append(list(columns) if columns is not None else None)
        return original(self, row_groups, columns=columns, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    return calls


@pytest.mark.parametrize("group_bytes", [1, 5_000, 10**9])
def test_a_piece_read_in_groups_equals_the_file_read_whole(tmp_path, monkeypatch, spied_reads, group_bytes):
    monkeypatch.setattr(parquet_files, "READ_GROUP_BYTES", group_bytes)
    table = _mixed_table(2_000)
    pq.write_table(table.slice(0, 1_200), tmp_path / "a.parquet", row_group_size=400)
    # the second file lacks "f": read as nulls, the files' schemas unified
    pq.write_table(table.slice(1_200).drop_columns(["f"]), tmp_path / "b.parquet", row_group_size=400)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the unified schemas' warning
        ds = ts.Dataset([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")], part_size="1GB")
    got = pa.concat_tables([ds.read_piece(p) for p in ds.pieces])
    expected = table.set_column(table.schema.get_field_index("f"), "f",
                                pa.concat_arrays([table["f"].combine_chunks().slice(0, 1_200),
                                                  pa.nulls(800, pa.float32())]))
    assert got.column_names == expected.column_names
    for name in expected.column_names:
        assert got[name].combine_chunks().equals(expected[name].combine_chunks().cast(got[name].type)), name
    per_file = [c for c in spied_reads if c is not None]
    if group_bytes == 1:  # a call per column
        assert per_file == [[c] for c in table.column_names] + [[c] for c in table.column_names if c != "f"]
    elif group_bytes == 10**9:
        assert per_file == [table.column_names, [c for c in table.column_names if c != "f"]]
    else:
        assert len(per_file) > 2
        assert all(len(c) < len(table.column_names) - 1 for c in per_file)


def test_dictionary_columns_read_in_groups_give_the_ids_of_a_plain_count(tmp_path, monkeypatch, spied_reads):
    # the low-cardinality string columns come as dictionaries (one per row group),
    # each in its own call; the ids are Categorify's documented ones, by pandas
    monkeypatch.setattr(parquet_files, "READ_GROUP_BYTES", 1)
    rng = np.random.default_rng(11)
    n = 1_500
    frame = pd.DataFrame({
        "a": pd.array(np.array(["x", "y", "z", "w"], dtype=object)[rng.integers(0, 4, n)], dtype="str"),
        "b": pd.array([f"b{v}" if v % 5 else None for v in rng.integers(0, 40, n)], dtype="str"),
        "v": rng.normal(size=n),
    })
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "d.parquet", row_group_size=300)
    ds = ts.Dataset(str(tmp_path / "d.parquet"), part_size="1GB")
    wf = ts.Workflow((["a", "b"] >> ops.Categorify(freq_threshold=2)) + (["v"] >> ops.Normalize()))
    wf.fit(ds)
    wf.transform(ds).to_parquet(str(tmp_path / "out"))
    out = pd.read_parquet(tmp_path / "out")
    calls = [c for c in spied_reads if c is not None]
    assert calls[:3] == [["a"], ["b"], ["v"]]  # the fit's read (the export maps its cached copy)
    assert all(len(c) == 1 for c in calls)
    for name in ("a", "b"):
        values = frame[name].astype(object).where(frame[name].notna(), None).tolist()
        counts = pd.Series(values).dropna().value_counts()
        kept = sorted(((v, c) for v, c in counts.items() if c >= 2), key=lambda kv: (-kv[1], kv[0]))
        mapping = {v: 3 + i for i, (v, _) in enumerate(kept)}
        expected = [1 if v is None else mapping.get(v, 2) for v in values]
        np.testing.assert_array_equal(out[name].to_numpy(), expected)
    v = frame["v"].to_numpy()
    np.testing.assert_allclose(out["v"].to_numpy(), (v - v.mean()) / v.std(ddof=1), rtol=1e-5, atol=1e-6)

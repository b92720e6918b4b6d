"""Fixed-length lists and lists of lists: dense blocks and nested offsets, checked
against the rows as plain pyarrow reads them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.loaders import Loader, pad_nested

FILE_ROWS = (310, 77, 401)
L, F = 3, 4


def _table(row_ids: np.ndarray) -> pa.Table:
    n = len(row_ids)
    rng = np.random.default_rng(int(row_ids[0]))
    # ids include 0: padding is told by the mask, never by the id
    fixed = rng.integers(0, 5, (n, L))
    fixed_nested = rng.integers(0, 5, (n, F, L))
    outer_len = row_ids % 3          # 0..2 inner lists per row
    nested = [[list(range(int(r) % 7, int(r) % 7 + (int(r) + j) % 4)) for j in range(int(k))]
              for r, k in zip(row_ids, outer_len, strict=True)]
    return pa.table({
        "row_id": pa.array(row_ids, pa.int64()),
        "fx": pa.FixedSizeListArray.from_arrays(pa.array(fixed.ravel()), L),
        "vc": pa.array(list(fixed[:, ::-1].tolist()), pa.list_(pa.int32())),
        "fxn": pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(fixed_nested.ravel().astype(np.float32)), L), F),
        "nested": pa.array(nested, pa.list_(pa.list_(pa.int64()))),
        "label": pa.array(row_ids % 2, pa.int64()),
    })


def _schema() -> Schema:
    return Schema([
        ColumnSchema("row_id", "int64", tags=[Tags.ID]),
        ColumnSchema("fx", "int64", is_list=True),
        ColumnSchema("vc", "int32", is_list=True, properties={"value_count": {"min": L, "max": L}}),
        ColumnSchema("fxn", "float32", is_list=True),
        ColumnSchema("nested", "int64", is_list=True, is_ragged=True),
        ColumnSchema("label", "int64", tags=[Tags.TARGET]),
    ])


def _write(path: Path, tables: list[pa.Table], schema: Schema, row_group: int = 100) -> Path:
    path.mkdir(parents=True)
    files = []
    for i, t in enumerate(tables):
        pq.write_table(t, path / f"part_{i}.parquet", row_group_size=row_group)
        files.append({"path": f"part_{i}.parquet", "num_rows": t.num_rows})
    schema.to_json(str(path / "_schema.json"))
    (path / "_manifest.json").write_text(json.dumps({"num_rows": sum(t.num_rows for t in tables),
                                                    "files": files}))
    return path


@pytest.fixture(scope="module")
def lists_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pa.Table]:
    start, tables = 0, []
    for n in FILE_ROWS:
        tables.append(_table(np.arange(start, start + n)))
        start += n
    path = _write(tmp_path_factory.mktemp("lists") / "export", tables, _schema())
    return path, pa.concat_tables(tables)


def _nested_rows(values: np.ndarray, outer: np.ndarray, inner: np.ndarray) -> list:
    return [[values[inner[j]:inner[j + 1]].tolist() for j in range(outer[i], outer[i + 1])]
            for i in range(len(outer) - 1)]


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("w,rank", [(1, 0), (2, 1)])
def test_fixed_and_nested_lists_match_pyarrow(lists_export: tuple[Path, pa.Table], seed: int,
                                             w: int, rank: int) -> None:
    path, expected = lists_export
    loader = Loader(path, 64, seed=seed, global_size=w, global_rank=rank, shuffle=True)
    assert loader.column_layout("fx").fixed == (L,)
    assert loader.column_layout("vc").fixed == (L,)       # from value_count min == max
    assert loader.column_layout("fxn").fixed == (F, L)
    assert loader.column_layout("nested").fixed is None
    seen = []
    for features, _ in loader:
        ids = features["row_id"]
        seen.append(ids)
        want = expected.take(ids)
        for name, shape, dtype in (("fx", (L,), np.int64), ("vc", (L,), np.int32),
                                   ("fxn", (F, L), np.float32)):
            dense, mask = features[name]
            assert dense.dtype == dtype and dense.shape == (len(ids), *shape)
            assert mask.dtype == np.bool_ and mask.all() and mask.shape == dense.shape
            assert np.array_equal(dense, np.array(want[name].to_pylist(), dtype=dtype))
        values, outer, inner = features["nested"]
        assert values.dtype == np.int64 and outer.dtype == inner.dtype == np.int64
        assert outer[0] == 0 and inner[0] == 0 and len(outer) == len(ids) + 1
        assert _nested_rows(values, outer, inner) == want["nested"].to_pylist()
    if w == 1:
        assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(sum(FILE_ROWS)))


def test_nested_padded_to_a_given_shape(lists_export: tuple[Path, pa.Table]) -> None:
    path, expected = lists_export
    loader = Loader(path, 50, shuffle=False, pad={"nested": (1, 2), "fx": 5})
    features, _ = next(iter(loader))
    want = expected.slice(0, 50)
    padded, mask = features["nested"]
    assert padded.shape == mask.shape == (50, 1, 2)
    for row, lists in enumerate(want["nested"].to_pylist()):
        got = [padded[row, j][mask[row, j]].tolist() for j in range(1)]
        assert got == [lst[:2] for lst in lists[:1]] + [[]] * (1 - len(lists[:1]))
        assert not padded[row][~mask[row]].any()
    fx, fx_mask = features["fx"]   # a fixed column padded beyond its length
    base = np.array(want["fx"].to_pylist())
    assert np.array_equal(fx[:, :L], base) and not fx[:, L:].any()
    assert fx_mask[:, :L].all() and not fx_mask[:, L:].any()


def test_pad_nested_matches_a_loop() -> None:
    rng = np.random.default_rng(1)
    rows = [[list(rng.integers(0, 9, rng.integers(0, 5))) for _ in range(rng.integers(0, 4))]
            for _ in range(40)]
    outer = np.cumsum([0] + [len(r) for r in rows])
    inner = np.cumsum([0] + [len(lst) for r in rows for lst in r])
    values = np.array([v for r in rows for lst in r for v in lst], dtype=np.int64)
    padded, mask = pad_nested(values, outer, inner, (2, 3))
    for i, r in enumerate(rows):
        for j in range(2):
            lst = r[j][:3] if j < len(r) else []
            assert padded[i, j, :len(lst)].tolist() == lst and mask[i, j].sum() == len(lst)
            assert not padded[i, j, len(lst):].any()


def test_nested_pad_needs_a_shape(lists_export: tuple[Path, pa.Table]) -> None:
    path, _ = lists_export
    with pytest.raises(ValueError, match=r"list column 'nested' has no fixed-size list type to "
                                         r"pad to; pass pad=\{'nested': \(inner lists, values\)\}"):
        Loader(path, 50, pad=True, shuffle=True)
    with pytest.raises(TypeError, match=r"pad for the list-of-lists column 'nested' must be a pair"):
        Loader(path, 50, pad={"nested": 3}, shuffle=True)


def test_value_count_fixed_but_data_ragged_is_an_error(tmp_path: Path) -> None:
    t = pa.table({"vc": pa.array([[1, 2, 3], [4, 5], [6, 7, 8]], pa.list_(pa.int64()))})
    schema = Schema([ColumnSchema("vc", "int64", is_list=True,
                                  properties={"value_count": {"min": 3, "max": 3}})])
    path = _write(tmp_path / "e", [t], schema)
    with pytest.raises(DataError, match=r"column 'vc': the schema says every list holds 3 values "
                                        r"\(value_count min == max, or shape\), but list 1 of row "
                                        r"group 0 of '.*part_0.parquet' holds 2 \(1 such\)"):
        list(Loader(path, 2, features=["vc"], shuffle=True))


def test_schema_shape_makes_plain_nested_lists_dense(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    ids = rng.integers(0, 9, (40, F, L))
    t = pa.table({"n": pa.array(ids.tolist(), pa.list_(pa.list_(pa.int64())))})
    schema = Schema([ColumnSchema("n", "int64", is_list=True, properties={"shape": [None, F, L]})])
    path = _write(tmp_path / "s", [t], schema, row_group=16)
    loader = Loader(path, 12, seed=1, features=["n"], shuffle=True)
    assert loader.column_layout("n").fixed == (F, L)
    rows = np.concatenate([f["n"][0] for f, _ in loader])
    assert rows.shape == (40, F, L)
    # each row once, as stored (rows are unique with probability ~1; compare sorted bytes)
    assert sorted(r.tobytes() for r in rows) == sorted(r.tobytes() for r in ids)

    bad = ids.tolist()
    bad[5][2] = bad[5][2][:1]
    t = pa.table({"n": pa.array(bad, pa.list_(pa.list_(pa.int64())))})
    path = _write(tmp_path / "b", [t], schema, row_group=16)
    with pytest.raises(DataError, match=rf"column 'n': the schema says every inner list holds {L} "
                                        r"values .* but inner list 22 of row group 0"):
        list(Loader(path, 40, features=["n"], shuffle=False))
    schema = Schema([ColumnSchema("n", "int64", is_list=True, properties={"shape": [3]})])
    path = _write(tmp_path / "c", [t], schema)
    with pytest.raises(SchemaError, match=r"column 'n': the schema's shape \[3\] does not fit its "
                                          r"type list<.*>: expected 2 dims"):
        Loader(path, 4, shuffle=True)


def test_three_levels_are_refused(tmp_path: Path) -> None:
    t = pa.table({"deep": pa.array([[[[1]]]], pa.list_(pa.list_(pa.list_(pa.int64()))))})
    pq.write_table(t, tmp_path / "d.parquet")
    with pytest.raises(TypeError, match=r"column 'deep' has type list<.*>; loaders deliver "
                                        r"numbers, lists of numbers and lists of lists"):
        Loader(tmp_path / "d.parquet", 1, shuffle=True)


def test_null_lists_in_nested_columns_are_empty(tmp_path: Path) -> None:
    rows = [[[1, 2], None, []], None, [[0]]]
    t = pa.table({"n": pa.array(rows, pa.list_(pa.list_(pa.int64())))})
    pq.write_table(t, tmp_path / "n.parquet")
    features, _ = next(iter(Loader(tmp_path / "n.parquet", 3, shuffle=False)))
    want = [[lst or [] for lst in r] if r is not None else [] for r in rows]
    assert _nested_rows(*features["n"]) == want


@pytest.mark.parametrize("shuffle", [False, True])
def test_list_values_are_writable_and_owned_by_their_batch(lists_export: tuple[Path, pa.Table],
                                                           shuffle: bool) -> None:
    path, _ = lists_export
    batches = [f["nested"] for f, _ in Loader(path, 64, shuffle=shuffle, seed=2)]
    sizes = [len(values) for values, _, _ in batches]
    for k, (values, _, _) in enumerate(batches):
        assert values.flags.writeable
        values[:] = 1000 + k   # each batch gets its own marker ...
    for k, (values, _, _) in enumerate(batches):
        # ... and keeps it: no batch shares memory with a later one
        assert (values == 1000 + k).all() and len(values) == sizes[k]


def _batches(loader: Loader) -> list:
    out = []
    for features, labels in loader:
        flat = {"label": labels}
        for name, col in features.items():
            flat.update({f"{name}.{i}": a for i, a in enumerate(col)} if isinstance(col, tuple)
                        else {name: col})
        out.append(flat)
    return out


@pytest.mark.parametrize("w,rank", [(1, 0), (2, 1)])
def test_large_row_groups_read_in_slices_give_the_same_batches(
        lists_export: tuple[Path, pa.Table], monkeypatch: pytest.MonkeyPatch, w: int,
        rank: int) -> None:
    """Row groups above _WHOLE_READ_BYTES are read a slice at a time into buffers
    allocated up front: the batches are those of a whole read, and the rows those
    pyarrow reads."""
    import tabstream.loaders.reading as reading

    path, expected = lists_export
    kw = {"seed": 4, "global_size": w, "global_rank": rank, "shuffle": True}
    whole = _batches(Loader(path, 64, **kw))
    monkeypatch.setattr(reading, "_WHOLE_READ_BYTES", 0)
    monkeypatch.setattr(reading, "_READ_BATCH_BYTES", 2000)   # a few rows per slice
    loader = Loader(path, 64, **kw)
    assert 1 < loader._reader.batch_rows(0) < 100
    sliced = _batches(loader)
    assert len(sliced) == len(whole)
    for a, b in zip(sliced, whole, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
        want = expected.take(a["row_id"])
        assert np.array_equal(a["fxn.0"], np.array(want["fxn"].to_pylist(), np.float32))
        assert _nested_rows(a["nested.0"], a["nested.1"], a["nested.2"]) == want["nested"].to_pylist()


def test_a_bad_row_in_a_later_slice_is_named_by_its_row_group_index(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tabstream.loaders.reading as reading

    ids = np.random.default_rng(7).integers(0, 9, (40, F, L)).tolist()
    ids[25][2] = ids[25][2][:1]
    t = pa.table({"n": pa.array(ids, pa.list_(pa.list_(pa.int64())))})
    schema = Schema([ColumnSchema("n", "int64", is_list=True, properties={"shape": [None, F, L]})])
    path = _write(tmp_path / "b", [t], schema, row_group=40)
    monkeypatch.setattr(reading, "_WHOLE_READ_BYTES", 0)
    monkeypatch.setattr(reading, "_READ_BATCH_BYTES", 8 * F * L * 4)  # 4 rows a slice
    with pytest.raises(DataError, match=rf"but inner list {25 * F + 2} of row group 0 of "):
        list(Loader(path, 40, features=["n"], shuffle=False))


@pytest.mark.parametrize("pad", [False, True])
def test_every_array_of_a_batch_is_64_byte_aligned(lists_export: tuple[Path, pa.Table],
                                                   pad: bool) -> None:
    """TensorFlow takes a numpy array over without a copy only when its data is
    64-byte aligned (numpy's own allocations are 16-byte aligned): offsets, masks and
    padded blocks come from arrow's pool like the batch columns."""
    path, _ = lists_export
    loader = Loader(path, 64, seed=2, pad={"nested": (2, 3)} if pad else False, shuffle=True)
    for features, labels in loader:
        arrays = [labels]
        for col in features.values():
            arrays.extend(col if isinstance(col, tuple) else [col])
        for a in arrays:
            assert a.ctypes.data % 64 == 0, (a.dtype, a.shape)
    assert np.array_equal(pad_nested(np.array([1, 2, 3]), np.array([0, 2, 3]),
                                     np.array([0, 1, 1, 3]), (2, 2))[0].ravel(),
                          [1, 0, 0, 0, 2, 3, 0, 0])


def _fixed_blocks(rows: int, high: int, seed: int) -> tuple[np.ndarray, pa.Table, Schema]:
    """``rows`` rows of a ``row_id`` and an ``(F, L)`` block ``n`` of random ids below
    ``high``, as numpy, as a table and with the schema giving the block's shape."""
    ids = np.random.default_rng(seed).integers(0, high, (rows, F, L))
    t = pa.table({"row_id": pa.array(np.arange(rows)),
                  "n": pa.array(ids.tolist(), pa.list_(pa.list_(pa.int64())))})
    schema = Schema([ColumnSchema("row_id", "int64"),
                     ColumnSchema("n", "int64", is_list=True, properties={"shape": [None, F, L]})])
    return ids, t, schema


@pytest.mark.parametrize("w", [1, 2])
def test_read_buffers_are_recycled_and_held_batches_keep_their_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, w: int) -> None:
    """Large row groups are read into buffers that are reused once a chunk is copied
    into its batches: a whole epoch held at once still has every row as pyarrow reads
    it, and far fewer buffers are allocated than row groups read."""
    import tabstream.loaders.memory as memory
    import tabstream.loaders.reading as reading

    ids, t, schema = _fixed_blocks(480, 50, seed=3)
    path = _write(tmp_path / "r", [t], schema, row_group=40)   # 12 equal row groups
    monkeypatch.setattr(reading, "_WHOLE_READ_BYTES", 0)
    monkeypatch.setattr(reading, "_READ_BATCH_BYTES", 8 * F * L * 16)  # 16 rows a slice
    fresh = []
    recycler_empty = memory.Recycler.empty

    def counting(self: memory.Recycler, shape: tuple[int, ...], dtype: np.dtype,
                 *args: Any) -> np.ndarray:
        free = len(self._free)
        out = recycler_empty(self, shape, dtype, *args)
        if len(self._free) == free:   # nothing taken from the free list: a fresh buffer
            fresh.append(shape)
        return out

    monkeypatch.setattr(memory.Recycler, "empty", counting)
    for rank in range(w):
        fresh.clear()
        loader = Loader(path, 30, seed=5, parts_per_chunk=1, global_size=w, global_rank=rank,
                        shuffle=True)
        held = list(loader)
        got_ids = np.concatenate([f["row_id"] for f, _ in held])
        assert len(got_ids) == loader.rows_per_epoch
        for features, _ in held:
            np.testing.assert_array_equal(features["n"][0], ids[features["row_id"]])
        # the row_id buffers and the id blocks: without reuse, 2 per row group read
        units = len(loader.pieces(0))
        assert 0 < len(fresh) <= 2 * 3 < 2 * units, fresh


def test_read_buffers_fit_the_largest_row_group_whatever_comes_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files of 100 rows in row groups of 40, 40 and 20: every fresh read buffer is
    sized for 40 rows, so a buffer first used by a 20-row group serves the next
    40-row one instead of a new buffer being allocated; the rows are still those
    numpy gives."""
    import tabstream.loaders.memory as memory
    import tabstream.loaders.reading as reading

    ids, t, schema = _fixed_blocks(300, 50, seed=8)
    path = _write(tmp_path / "u", [t.slice(0, 100), t.slice(100, 100), t.slice(200, 100)],
                  schema, row_group=40)
    monkeypatch.setattr(reading, "_WHOLE_READ_BYTES", 0)
    monkeypatch.setattr(reading, "_READ_BATCH_BYTES", 8 * F * L * 16)  # 16 rows a slice
    fresh: list[int] = []
    allocate = memory.empty

    def recording(size: int, dtype: np.dtype) -> np.ndarray:
        out = allocate(size, dtype)
        if np.dtype(dtype) == np.uint8:   # the recycler's buffers, nothing else
            fresh.append(size)
        return out

    monkeypatch.setattr(memory, "empty", recording)
    for seed in range(4):   # several row group orders, short groups first in some
        fresh.clear()
        loader = Loader(path, 30, seed=seed, parts_per_chunk=1, shuffle=True)
        got = {int(r): n for f, _ in loader for r, n in zip(f["row_id"], f["n"][0], strict=True)}
        assert sorted(got) == list(range(300))
        for r, block in got.items():
            np.testing.assert_array_equal(block, ids[r])
        assert fresh and all(size in (40 * 8, 40 * F * L * 8) for size in fresh), fresh


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("hold", ["numpy", "view", "torch"])
def test_pooled_batch_buffers_never_overwrite_a_held_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide: bool, hold: str) -> None:
    """Batch columns live in pooled buffers that return to the pool when the consumer
    drops the batch. Every other batch is kept (as the array, a slice of it, or a
    tensor over it) and compared at the end with a copy taken when it was handed
    out; the others are dropped at once, so their buffers are reused meanwhile."""
    import tabstream.loaders.batching as batching
    import tabstream.loaders.memory as memory

    ids, t, schema = _fixed_blocks(600, 1000, seed=11)
    path = _write(tmp_path / "p", [t], schema, row_group=100)
    if wide:   # every dense column is copied batch by batch
        monkeypatch.setattr(batching, "_WIDE_COLUMN_BYTES", 0)
    pools = []
    pool_class = memory.BatchPool

    def recording(keep: int) -> memory.BatchPool:
        pools.append(pool_class(keep))
        return pools[-1]

    monkeypatch.setattr(memory, "BatchPool", recording)
    loader = Loader(path, 32, seed=1, parts_per_chunk=2, shuffle=True)
    held, copies = [], []
    count = 0
    for features, _ in loader:
        count += 1
        # the batch's rows are those pyarrow reads, whatever buffer it was built in
        np.testing.assert_array_equal(features["n"][0], ids[features["row_id"]])
        if count % 2:
            continue   # dropped: its buffers go back to the pool
        dense, row_id = features["n"][0], features["row_id"]
        copies.append((dense.copy(), row_id.copy()))
        if hold == "view":
            held.append((dense[1:], row_id[::2]))
        elif hold == "torch":
            torch = pytest.importorskip("torch")
            held.append((torch.from_numpy(dense), torch.from_numpy(row_id)))
        else:
            held.append((dense, row_id))
        del features, dense, row_id
    assert count == len(loader) == -(-600 // 32)
    (pool,) = pools
    assert 0 < pool.allocated < 2 * count   # buffers were reused ...
    for (dense, row_id), (dense0, row_id0) in zip(held, copies, strict=True):
        # ... and never those of a batch still held
        if hold == "view":
            np.testing.assert_array_equal(dense, dense0[1:])
            np.testing.assert_array_equal(row_id, row_id0[::2])
        else:
            np.testing.assert_array_equal(np.asarray(dense), dense0)
            np.testing.assert_array_equal(np.asarray(row_id), row_id0)

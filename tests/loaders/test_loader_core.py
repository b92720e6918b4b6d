"""The numpy loader: exactly-once sharding, reproducible shuffles, values and dtypes
checked against plain pyarrow reads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tabstream
from tabstream.core.schema import Tags
from tabstream.loaders import Loader, pad_lists


def epoch_ids(loader: Loader) -> list[np.ndarray]:
    return [features["row_id"] for features, _ in loader]


def check_exactly_once(shared_export: Path, n: int, w: int, batch_size: int, seed: int,
                       shuffle: bool = True) -> None:
    per_rank = []
    for r in range(w):
        loader = Loader(shared_export, batch_size, shuffle=shuffle, seed=seed, global_size=w,
                        global_rank=r)
        batches = epoch_ids(loader)
        assert len(batches) == len(loader)
        assert all(1 <= len(b) <= batch_size for b in batches)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1, "ranks yield different batch counts"
    ids = np.concatenate([np.concatenate(b) for b in per_rank])
    assert len(ids) == n
    assert np.array_equal(np.sort(ids), np.arange(n))


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 11, 2024])
@pytest.mark.parametrize("batch_size", [64, 333])
def test_every_row_exactly_once_across_ranks(shared_export: Path, testdata: Any, w: int,
                                             seed: int, batch_size: int) -> None:
    check_exactly_once(shared_export, testdata.N, w, batch_size, seed)


@pytest.mark.parametrize("w", [1, 3, 5])
def test_every_row_exactly_once_without_shuffle(shared_export: Path, testdata: Any,
                                                w: int) -> None:
    check_exactly_once(shared_export, testdata.N, w, 100, seed=0, shuffle=False)


@pytest.mark.parametrize("w", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seed", [0, 5])
def test_drop_last_gives_full_equal_batches(shared_export: Path, testdata: Any, w: int,
                                            seed: int) -> None:
    batch_size, N = 128, testdata.N
    per_rank = [epoch_ids(Loader(shared_export, batch_size, seed=seed, global_size=w,
                                 global_rank=r, drop_last=True, shuffle=True)) for r in range(w)]
    expected = N // (w * batch_size)
    assert [len(b) for b in per_rank] == [expected] * w
    assert all(len(b) == batch_size for rank in per_rank for b in rank)
    ids = np.concatenate([b for rank in per_rank for b in rank])
    assert len(np.unique(ids)) == len(ids) == expected * w * batch_size


def test_same_seed_and_epoch_same_order_next_epoch_differs(shared_export: Path) -> None:
    a, b = (Loader(shared_export, 200, seed=3, shuffle=True),
            Loader(shared_export, 200, seed=3, shuffle=True))
    first = np.concatenate(epoch_ids(a))
    assert np.array_equal(first, np.concatenate(epoch_ids(b)))
    assert a.epoch == 1
    second = np.concatenate(epoch_ids(a))
    assert not np.array_equal(first, second)
    assert np.array_equal(np.sort(first), np.sort(second))
    other_seed = np.concatenate(epoch_ids(Loader(shared_export, 200, seed=4, shuffle=True)))
    assert not np.array_equal(first, other_seed)


def test_set_epoch_replays_an_epoch(shared_export: Path) -> None:
    loader = Loader(shared_export, 200, seed=1, shuffle=True)
    epochs = [np.concatenate(epoch_ids(loader)) for _ in range(3)]
    loader.set_epoch(1)
    assert loader.epoch == 1
    assert np.array_equal(np.concatenate(epoch_ids(loader)), epochs[1])
    assert np.array_equal(np.concatenate(epoch_ids(loader)), epochs[2])
    assert np.array_equal(np.concatenate(list(
        b["row_id"] for b, _ in loader.iter_epoch(0))), epochs[0])
    assert loader.epoch == 3, "iter_epoch leaves the counter alone"


def test_shuffle_mixes_row_groups_within_batches(shared_export: Path) -> None:
    loader = Loader(shared_export, 256, seed=0, parts_per_chunk=2, shuffle=True)
    features, _ = next(iter(loader))
    ids = np.sort(features["row_id"])
    assert not np.array_equal(ids, np.arange(ids[0], ids[0] + len(ids))), "not a plain slice"


def test_without_shuffle_rows_come_in_file_order(shared_export: Path, testdata: Any) -> None:
    N = testdata.N
    loader = Loader(shared_export, 128, shuffle=False)
    assert np.array_equal(np.concatenate(epoch_ids(loader)), np.arange(N))


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("w,rank", [(1, 0), (3, 2)])
def test_values_and_dtypes_match_pyarrow(shared_export: Path, testdata: Any, shuffle: bool,
                                         w: int, rank: int) -> None:
    expected = testdata.read_all(shared_export)
    loader = Loader(shared_export, 97, shuffle=shuffle, global_size=w, global_rank=rank)
    assert loader.feature_names == ["row_id", "C1", "I1", "tags", "weights"]
    assert loader.label_names == ["label"]
    for features, labels in loader:
        ids = features["row_id"]
        want = expected.take(ids)
        assert features["row_id"].dtype == np.int64
        assert features["C1"].dtype == np.int64 and features["I1"].dtype == np.float32
        assert labels.dtype == np.int64
        assert np.array_equal(features["C1"], want["C1"].to_numpy())
        assert np.array_equal(features["I1"], want["I1"].to_numpy())
        assert np.array_equal(labels, want["label"].to_numpy())
        for name, dtype in (("tags", np.int64), ("weights", np.float32)):
            values, offsets = features[name]
            assert values.dtype == dtype and offsets.dtype == np.int64
            assert offsets[0] == 0 and len(offsets) == len(ids) + 1
            rows = want[name].to_pylist()
            assert [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(ids))] == rows


def test_padded_lists_match_pyarrow(shared_export: Path, testdata: Any) -> None:
    expected, MAX_TAGS = testdata.read_all(shared_export), testdata.MAX_TAGS
    loader = Loader(shared_export, 300, pad=True, shuffle=True)
    for features, _ in loader:
        want = expected.take(features["row_id"])
        for name in ("tags", "weights"):
            padded, mask = features[name]
            assert padded.shape == mask.shape == (len(want), MAX_TAGS)
            assert mask.dtype == np.bool_
            for row, lst in enumerate(want[name].to_pylist()):
                assert padded[row][mask[row]].tolist() == lst
                assert not padded[row][~mask[row]].any()


def test_pad_lengths_given_truncate(shared_export: Path, testdata: Any) -> None:
    expected, MAX_TAGS = testdata.read_all(shared_export), testdata.MAX_TAGS
    features, _ = next(iter(Loader(shared_export, 300, pad={"tags": 2}, shuffle=True)))
    want = expected.take(features["row_id"])["tags"].to_pylist()
    padded, mask = features["tags"]
    assert padded.shape == (300, 2)
    assert [p[m].tolist() for p, m in zip(padded, mask, strict=True)] == [w[:2] for w in want]
    assert features["weights"][0].shape == (300, MAX_TAGS)


def test_pad_lists_example() -> None:
    padded, mask = pad_lists(np.array([4, 5, 6, 7]), np.array([0, 3, 3, 4]), 2)
    assert padded.tolist() == [[4, 5], [0, 0], [7, 0]]
    assert mask.tolist() == [[True, True], [False, False], [True, False]]


def test_columns_by_tag_and_name(shared_export: Path) -> None:
    loader = Loader(shared_export, 50, features=[Tags.CONTINUOUS, "C1"], labels="row_id",
                    shuffle=True)
    assert loader.feature_names == ["I1", "weights", "C1"]
    assert loader.label_names == ["row_id"]
    features, labels = next(iter(loader))
    assert set(features) == {"I1", "weights", "C1"} and labels.shape == (50,)


def test_several_labels_and_no_labels(shared_export: Path) -> None:
    _, labels = next(iter(Loader(shared_export, 10, labels=["label", "C1"], shuffle=True)))
    assert set(labels) == {"label", "C1"}
    features, labels = next(iter(Loader(shared_export, 10, labels=[], shuffle=True)))
    assert labels is None and "label" in features


def test_selector_objects(shared_export: Path) -> None:
    selector = tabstream.ColumnSelector(["C1"], tags=[Tags.CONTINUOUS])
    loader = Loader(shared_export, 10, features=selector, shuffle=True)
    assert set(loader.feature_names) == {"C1", "I1", "weights"}


@pytest.mark.parametrize("how", ["dataset", "glob", "list", "file"])
def test_inputs(shared_export: Path, testdata: Any, how: str) -> None:
    N = testdata.N
    files = sorted(str(p) for p in shared_export.glob("part_*.parquet"))
    data = {
        "dataset": lambda: tabstream.Dataset(str(shared_export)),
        "glob": lambda: str(shared_export / "part_*.parquet"),
        "list": lambda: files,
        "file": lambda: files[2],
    }[how]()
    loader = Loader(data, 128, seed=9, shuffle=True)
    ids = np.sort(np.concatenate(epoch_ids(loader)))
    want = pq.read_table(files[2])["row_id"].to_numpy() if how == "file" else np.arange(N)
    assert np.array_equal(ids, want)
    assert loader.label_names == ["label"], "schema.json is found beside the files"


def test_any_fsspec_filesystem(shared_export: Path, testdata: Any) -> None:
    N = testdata.N
    fs = fsspec.filesystem("memory")
    for p in shared_export.iterdir():
        fs.pipe(f"/loader-test/{p.name}", p.read_bytes())
    try:
        loader = Loader("memory://loader-test", 256, global_size=2, global_rank=1, shuffle=True)
        other = Loader(tabstream.Dataset("memory://loader-test"), 256, global_size=2,
                       global_rank=0, shuffle=True)
        ids = np.concatenate(epoch_ids(loader) + epoch_ids(other))
        assert np.array_equal(np.sort(ids), np.arange(N))
    finally:
        fs.rm("/loader-test", recursive=True)


def test_schema_inferred_without_schema_json(tmp_path: Path, testdata: Any) -> None:
    path = testdata.write_export(tmp_path / "bare", schema=False)
    loader = Loader(path, 100, shuffle=True)
    assert loader.label_names == [], "no tags without schema.json"
    assert loader.schema["tags"].is_list
    features, labels = next(iter(loader))
    assert labels is None and features["I1"].dtype == np.float32


def test_abandoned_iteration_stops_its_threads(shared_export: Path) -> None:
    before = set(threading.enumerate())
    loader = Loader(shared_export, 10, shuffle=True)
    for _ in loader:
        ours = [t for t in threading.enumerate()
                if t not in before and t.name.startswith("tabstream")]
        break
    names = sorted(t.name for t in ours)
    # many columns of similar size: parquet decodes them in parallel, one read thread
    assert names == ["tabstream-loader", "tabstream-read-0"], \
        "the loader reads and batches in background threads"
    for thread in ours:
        thread.join(timeout=10)
        assert not thread.is_alive(), f"{thread.name} still runs after the loop stopped"


def test_close_returns_once_its_threads_ended(shared_export: Path) -> None:
    # a thread still inside Arrow's reader when the interpreter exits aborts the
    # process, so close() waits for the loader's threads instead of only signalling
    for _ in range(3):
        before = set(threading.enumerate())
        batches = iter(Loader(shared_export, 10, shuffle=True))
        next(batches)
        ours = [t for t in threading.enumerate() if t not in before and t.name.startswith("tabstream")]
        assert len(ours) == 2
        batches.close()
        assert [t.name for t in ours if t.is_alive()] == []


def test_len_and_repr(shared_export: Path, testdata: Any) -> None:
    loader = Loader(shared_export, 1000, global_size=2, global_rank=0, shuffle=True)
    assert len(loader) == 2 and loader.num_rows == testdata.N
    assert "2 batches" in repr(loader)


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.tuples(st.integers(1, 120), st.integers(1, 50)), min_size=1, max_size=4),
       w=st.integers(1, 5), batch_size=st.integers(2, 40), seed=st.integers(0, 2**31),
       drop_last=st.booleans(), parts_per_chunk=st.integers(1, 3))
def test_exactly_once_for_any_layout(tmp_path_factory: pytest.TempPathFactory, testdata: Any,
                                     layout: list[tuple[int, int]], w: int, batch_size: int,
                                     seed: int, drop_last: bool, parts_per_chunk: int) -> None:
    path = testdata.write_export(tmp_path_factory.mktemp("layout"),
                                 file_rows=[n for n, _ in layout],
                                 row_groups=[g for _, g in layout], with_lists=False)
    n = sum(rows for rows, _ in layout)
    try:
        loaders = [Loader(path, batch_size, seed=seed, global_size=w, global_rank=r,
                          drop_last=drop_last, parts_per_chunk=parts_per_chunk, shuffle=True)
                   for r in range(w)]
    except ValueError as exc:  # the documented infeasible cases
        assert "rows" in str(exc) and (n < w or (drop_last and n < w * batch_size))
        return
    batches = [epoch_ids(loader) for loader in loaders]
    assert len({len(b) for b in batches}) == 1
    assert all(len(b) == len(loader) for b, loader in zip(batches, loaders, strict=True))
    ids = np.concatenate([x for b in batches for x in b])
    assert len(np.unique(ids)) == len(ids)
    if drop_last:
        assert all(len(x) == batch_size for b in batches for x in b)
        assert len(ids) == n // (w * batch_size) * w * batch_size
    else:
        assert np.array_equal(np.sort(ids), np.arange(n))


def _write_wide(path: Path, rows: int = 1200, row_group: int = 200) -> Path:
    import pyarrow as pa

    ids = np.arange(rows, dtype=np.int64)
    table = pa.table({"x": ids, "f": ids.astype(np.float32), "label": (ids % 2).astype(np.int32)})
    path.mkdir()
    pq.write_table(table, path / "part.parquet", row_group_size=row_group)
    return path


def test_unit_bytes_are_the_decoded_sizes(tmp_path: Path) -> None:
    data = _write_wide(tmp_path / "wide")
    loader = Loader(str(data), 64, labels=["label"], shuffle=True)
    # fixed-width columns: rows x item size (int64 + float32 + int32)
    row_bytes = sum(np.dtype(t).itemsize for t in (np.int64, np.float32, np.int32))
    assert loader._reader.unit_bytes() == [200.0 * row_bytes] * 6


def test_unit_bytes_of_lists_come_from_the_footer(tmp_path: Path) -> None:
    import pyarrow as pa

    # dictionary-encoded lists store far less than they decode to: the estimate is
    # at least the decoded values (150 int64 a row group here)
    table = pa.table({"tags": pa.array([[1, 2, 3]] * 100, pa.list_(pa.int64())),
                      "label": np.zeros(100, np.int64)})
    (tmp_path / "lists").mkdir()
    pq.write_table(table, tmp_path / "lists" / "part.parquet", row_group_size=50)
    loader = Loader(str(tmp_path / "lists"), 16, labels=["label"], shuffle=True)
    md = pq.ParquetFile(tmp_path / "lists" / "part.parquet").metadata
    decoded = table.column("tags").combine_chunks().slice(0, 50).flatten().nbytes
    assert decoded == 150 * 8
    expected = [max(md.row_group(g).column(0).total_uncompressed_size, decoded) + 50 * 8.0
                for g in range(2)]
    assert md.row_group(0).column(0).total_uncompressed_size < decoded
    assert loader._reader.unit_bytes() == expected


# A chunk of k row groups of 200 rows x 16 bytes costs 2 k x 3200 bytes (the data and
# its batch copies) plus 3200 read ahead: 3 fit exactly in 7 x 3200.
@pytest.mark.parametrize("chunk_bytes,parts", [(None, 2), (1, 1), (7 * 200 * 16, 3), (7 * 200 * 16 - 1, 2)])
def test_chunks_are_bounded_by_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     chunk_bytes: int | None, parts: int) -> None:
    import tabstream.loaders.batching as batching

    data = _write_wide(tmp_path / "wide")
    loader = Loader(str(data), 64, labels=["label"],
                    parts_per_chunk=parts if chunk_bytes is None else 4, shuffle=True)
    if chunk_bytes is not None:
        loader.chunk_bytes = chunk_bytes
    seen: list[int] = []
    init = batching.Chunk.__init__

    def spy(self: Any, pieces: list, sizes: list) -> None:
        seen.append(len(pieces))
        init(self, pieces, sizes)

    monkeypatch.setattr(batching.Chunk, "__init__", spy)
    ids = np.concatenate([f["x"] for f, _ in loader])
    assert np.array_equal(np.sort(ids), np.arange(1200))
    assert seen == [parts] * (6 // parts)


def test_chunk_bytes_count_the_copies_and_the_read_ahead(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import tabstream.loaders.batching as batching

    data = _write_wide(tmp_path / "wide")
    loader = Loader(str(data), 64, labels=["label"], parts_per_chunk=6, shuffle=True)
    group = loader._reader.unit_bytes()[0]
    sizes: list[int] = []
    init = batching.Chunk.__init__

    def spy(self: Any, pieces: list, rows: list) -> None:
        sizes.append(len(pieces))
        init(self, pieces, rows)

    monkeypatch.setattr(batching.Chunk, "__init__", spy)
    for chunk_bytes in range(int(group), int(12 * group), int(group // 2)):
        sizes.clear()
        loader.chunk_bytes = chunk_bytes
        ids = np.concatenate([f["x"] for f, _ in loader])
        assert np.array_equal(np.sort(ids), np.arange(1200))
        # the largest k with 2 k groups (data + batches) + 1 group read ahead <= bound
        fit = max(1, min(6, int((chunk_bytes - group) // (2 * group))))
        assert max(sizes) == fit, chunk_bytes


def _write_multi_hot(path: Path, rows: int = 400, row_group: int = 100) -> Path:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50, (rows, 4, 3))
    table = pa.table({"slots": pa.array(ids.tolist(), pa.list_(pa.list_(pa.int64()))),
                      "label": np.arange(rows) % 2})
    path.mkdir()
    pq.write_table(table, path / "part.parquet", row_group_size=row_group)
    return path


@pytest.mark.parametrize("wide,threads", [(False, 1), (True, 2)])
def test_row_groups_are_read_concurrently_only_when_one_column_dominates(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wide: bool, threads: int) -> None:
    import tabstream.loaders.reading as reading
    import tabstream.loaders.threads as loader_threads

    data = _write_multi_hot(tmp_path / "mh") if wide else _write_wide(tmp_path / "wide")
    loader = Loader(str(data), 64, labels=["label"], shuffle=True)
    md = pq.ParquetFile(next(data.glob("*.parquet"))).metadata.row_group(0)
    sizes = {}
    for i in range(md.num_columns):  # decoded bytes per top-level column, from the footer
        name = md.column(i).path_in_schema.split(".")[0]
        sizes[name] = sizes.get(name, 0) + md.column(i).total_uncompressed_size
    if not wide:
        sizes = {"x": 200 * 8, "f": 200 * 4, "label": 200 * 4}  # fixed width: from the types
    assert (max(sizes.values()) * 2 > sum(sizes.values())) == wide
    started: list[int] = []
    init = loader_threads.PieceReader.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        started.append(len(self._threads))

    monkeypatch.setattr(loader_threads.PieceReader, "__init__", spy)
    # Concurrent reads decode in their own threads, not in arrow's CPU pool: that
    # pool is one thread under OMP_NUM_THREADS=1, and two reads through it took
    # turns. A single read keeps the pool (its columns decode in parallel).
    calls: list[tuple[str, bool]] = []
    for method in ("iter_batches", "read_row_group"):
        original = getattr(pq.ParquetFile, method)

        def recording(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            calls.append((threading.current_thread().name, kwargs["use_threads"]))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(pq.ParquetFile, method, recording)
    if wide:   # read in slices too
        monkeypatch.setattr(reading, "_WHOLE_READ_BYTES", 0)
        monkeypatch.setattr(reading, "_READ_BATCH_BYTES", 1000)
    labels = np.concatenate([y for _, y in loader])
    assert len(labels) == loader.num_rows
    assert started == [threads]
    assert len(calls) == len(loader.source.units)
    assert all(name.startswith("tabstream-read-") and use == (threads == 1)
               for name, use in calls), calls
    if wide:   # every row once, as numpy reads it (the order is the shuffle's)
        ids = np.array(pq.read_table(data).column("slots").to_pylist())
        values = np.concatenate([f["slots"][0] for f, _ in Loader(str(data), 64,
                                                                 labels=["label"], shuffle=True)])
        got = values.reshape(-1, *ids.shape[1:])
        assert sorted(map(bytes, got)) == sorted(map(bytes, ids))


def test_numbers_match_pyarrow_to_numpy() -> None:
    import pyarrow as pa

    from tabstream.loaders.layout import numbers

    cases = [
        pa.array([1, 2, 3, 4, 5], pa.int64()).slice(1, 3),
        pa.array([1.5, None, 2.5, None], pa.float32()).slice(1),
        pa.array([True, False, True, True, False, True, False, False, True], pa.bool_()).slice(3),
        pa.array([], pa.int32()),
        pa.chunked_array([pa.array([1, 2], pa.int16()), pa.array([3], pa.int16())]),
        pa.array([[1, 2], [3], []], pa.list_(pa.int64())).slice(1).offsets,
    ]
    for arr in cases:
        got = numbers(arr)
        expected = arr.to_numpy(zero_copy_only=False)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)


def test_loading_does_not_import_pandas(tmp_path: Path) -> None:
    """pyarrow's to_numpy imports pandas (+45 MB per loader process); the loader
    reads its numbers without it."""
    import subprocess
    import sys

    data = _write_wide(tmp_path / "wide")
    script = (
        "import sys\n"
        "from tabstream.loaders import Loader\n"
        f"loader = Loader({str(data)!r}, 64, labels=['label'])\n"
        "rows = sum(len(y) for _, y in loader)\n"
        "print(rows, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, cwd=Path(tabstream.__file__).parents[1])
    assert out.stdout.split() == ["1200", "False"]


@pytest.mark.parametrize("n", [0, 1, 8191, 8192, 8193, 30011])
@pytest.mark.parametrize("seed", [0, 9])
def test_pool_permutation_and_sort_equal_numpys(n: int, seed: int) -> None:
    """The loader draws its shuffles into arrow's pool (not malloc); the numbers must
    be numpy's own ``Generator.permutation`` and ``np.sort``."""
    from tabstream.loaders.memory import permutation, sorted_copy

    got = permutation(np.random.default_rng([seed, 3]), n)
    expected = np.random.default_rng([seed, 3]).permutation(n)
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)
    part = expected[n // 3: n // 3 + n // 2]
    np.testing.assert_array_equal(sorted_copy(part), np.sort(part))
    for arr in (got, sorted_copy(part)):
        assert arr.flags.writeable and arr.__array_interface__["data"][0] % 64 == 0


def _expected_shuffled_batches(loader: Loader, epoch: int) -> list[np.ndarray]:
    """A rank's row ids per batch, computed from the plan's generators with plain numpy
    (one row group per chunk: ``parts_per_chunk=1`` and row groups far under
    ``chunk_bytes``): a split row group keeps its sorted share of the unit's epoch
    permutation; each batch takes the next entries of its chunk's permutation, sorted,
    then puts them in the order of its own permutation (batch_rows_rng)."""
    from tabstream.loaders import plan
    from tabstream.loaders.batching import batch_rows_rng

    stream = []
    for piece in loader.pieces(epoch):
        unit = loader.source.units[piece.unit]
        ids = pq.ParquetFile(loader.source.files[unit.file]).read_row_group(
            unit.row_group, columns=["row_id"]).column("row_id").to_numpy()
        if piece.num_rows < unit.num_rows:
            perm = plan.unit_rows_permutation(unit.num_rows, loader.seed, epoch, piece.unit)
            ids = ids[np.sort(perm[piece.start:piece.stop])]
        stream.append(ids)
    sizes = list(plan.split_rows(loader.num_rows, loader.batch_size, loader.global_size,
                                 False)[loader.global_rank].batch_sizes())
    batches: list[list[np.ndarray]] = [[]]
    for k, ids in enumerate(stream):
        order = plan.chunk_rng(loader.seed, epoch, loader.global_rank, k).permutation(len(ids))
        pos = 0
        while pos < len(ids):
            want = sizes[len(batches) - 1] - sum(len(p) for p in batches[-1])
            take = min(want, len(ids) - pos)
            batches[-1].append(ids[np.sort(order[pos:pos + take])])
            pos += take
            if take == want and len(batches) < len(sizes):
                batches.append([])
    return [ids[batch_rows_rng(loader.seed, epoch, loader.global_rank, i).permutation(len(ids))]
            for i, ids in enumerate(np.concatenate(b) for b in batches)]


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize(("w", "seed"), [(1, 0), (2, 5), (3, 11)])
def test_shuffled_batches_follow_the_plan(shared_export: Path, monkeypatch: pytest.MonkeyPatch,
                                          w: int, seed: int, wide: bool) -> None:
    """The batches are those the plan describes, rebuilt with plain numpy; also when
    every column is copied batch by batch (the order wide columns take)."""
    import tabstream.loaders.batching as batching

    if wide:
        monkeypatch.setattr(batching, "_WIDE_COLUMN_BYTES", 0)
    for rank in range(w):
        loader = Loader(shared_export, 97, seed=seed, parts_per_chunk=1, global_size=w,
                        global_rank=rank, features=["row_id"], shuffle=True)
        loader.set_epoch(1)
        expected = _expected_shuffled_batches(loader, 1)
        got = epoch_ids(loader)
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            np.testing.assert_array_equal(a, b)


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=st.lists(st.tuples(st.integers(1, 90), st.integers(1, 40)), min_size=1, max_size=3),
       w=st.integers(1, 3), batch_size=st.integers(1, 60), seed=st.integers(0, 2**31),
       wide=st.one_of(st.none(), st.integers(0, 320)), data=st.data())
def test_shuffled_batches_follow_the_plan_for_any_layout(
        tmp_path_factory: pytest.TempPathFactory, testdata: Any, layout: list[tuple[int, int]],
        w: int, batch_size: int, seed: int, wide: int | None, data: st.DataObject) -> None:
    """Every shuffled batch, rows and order, is the plan's (rebuilt with plain numpy)
    for any files, row groups and batch size: batches inside one chunk, across two,
    larger than a chunk; every dense column keeps its row (C1 and I1 against the
    data read by pyarrow), also when the columns are copied batch by batch (``wide``:
    the bytes past which a chunk's column is, 0 for every one), and when a column is
    wide in one chunk and narrow in the next (a threshold between two chunks' sizes;
    a batch across them once got other rows' values)."""
    import tabstream.loaders.batching as batching

    path = testdata.write_export(tmp_path_factory.mktemp("plan"), file_rows=[n for n, _ in layout],
                                 row_groups=[g for _, g in layout], with_lists=False)
    rank = data.draw(st.integers(0, w - 1))
    everything = testdata.read_all(path)
    old = batching._WIDE_COLUMN_BYTES
    batching._WIDE_COLUMN_BYTES = old if wide is None else wide
    try:
        try:
            loader = Loader(path, batch_size, seed=seed, parts_per_chunk=1, global_size=w,
                            global_rank=rank, features=["row_id", "C1", "I1"], shuffle=True)
        except ValueError as exc:  # the documented infeasible splits (too few rows)
            assert "rows" in str(exc) and (len(everything) < w or batch_size == 1)
            return
        loader.set_epoch(2)
        expected = _expected_shuffled_batches(loader, 2)
        got = list(loader)
    finally:
        batching._WIDE_COLUMN_BYTES = old
    _assert_planned_batches(got, expected, everything)


def _assert_planned_batches(got: list[Any], expected: list[np.ndarray], everything: pa.Table) -> None:
    """Each batch holds the planned rows, in order, with the values pyarrow reads."""
    assert len(got) == len(expected)
    for (features, labels), ids in zip(got, expected, strict=True):
        np.testing.assert_array_equal(features["row_id"], ids)
        want = everything.take(pa.array(ids))
        np.testing.assert_array_equal(features["C1"], want["C1"].to_numpy())
        np.testing.assert_array_equal(features["I1"], want["I1"].to_numpy())
        np.testing.assert_array_equal(labels, want["label"].to_numpy())


@pytest.mark.parametrize("block", [None, 24])
@pytest.mark.parametrize("files", [[40, 20], [20, 40]])
@pytest.mark.parametrize("threshold", [0, 200, 2**40])
def test_a_column_wide_in_one_chunk_and_narrow_in_the_next(
        tmp_path: Path, testdata: Any, monkeypatch: pytest.MonkeyPatch, threshold: int,
        files: list[int], block: int | None) -> None:
    """Chunks of 40 and 20 rows: C1 takes 320 and 160 bytes in them, so with a
    threshold of 200 it is copied batch by batch in the first chunk and column by
    column in the second (or the other way round, chunks of 20 then 40). The
    batches across the two keep every row's own values (they came out with other
    rows' values once), and every threshold gives the same batches, as planned;
    also when rows put straight to their places go 3 at a time (``block``, bytes)."""
    import tabstream.loaders.batching as batching

    path = testdata.write_export(tmp_path, file_rows=files, row_groups=files, with_lists=False)
    everything = testdata.read_all(path)
    monkeypatch.setattr(batching, "_WIDE_COLUMN_BYTES", threshold)
    if block is not None:
        monkeypatch.setattr(batching, "_SCATTER_BLOCK_BYTES", block)
    for seed in range(6):
        loader = Loader(path, 25, seed=seed, parts_per_chunk=1, features=["row_id", "C1", "I1"], shuffle=True)
        expected = _expected_shuffled_batches(loader, 0)
        assert len(expected) == 3
        _assert_planned_batches(list(loader), expected, everything)


def test_huge_pages_are_off_while_an_epoch_is_read(shared_export: Path, testdata: Any,
                                                   huge_pages: Any) -> None:
    """The loader's reading and batching threads run with the process's transparent
    huge pages off (tabstream.core.pages), read from the kernel's /proc/self/status;
    once the epoch ends the process has them back."""
    loader = Loader(shared_export, 64, shuffle=True, seed=1)
    assert len(loader) > 8
    seen, rows = [], 0
    for features, _ in loader:
        if not seen:  # the producer has batches left to make: its threads still run
            seen.append(huge_pages.enabled())
        rows += len(features["row_id"])
    assert rows == testdata.N
    assert seen == [0]
    assert huge_pages.enabled() == 1


@pytest.mark.parametrize("keep", [True, False])
def test_threads_of_an_unfinished_epoch_end_before_the_interpreter_does(shared_export: Path,
                                                                        tmp_path: Path, keep: bool) -> None:
    # a script that stops after one batch, holding its iterator (keep) or dropping it:
    # the loader's threads are stopped and waited for at exit, before the process
    # tears down Arrow (a thread caught inside Arrow's reader then aborts it)
    import subprocess
    import sys

    script = tmp_path / "one_batch.py"
    script.write_text(
        "import atexit, threading\n"
        "def report():  # registered first, so it runs after tabstream's exit handler\n"
        "    alive = sorted(t.name for t in threading.enumerate() if t.name.startswith('tabstream'))\n"
        "    print('alive at exit:', alive)\n"
        "atexit.register(report)\n"
        "from tabstream.loaders import Loader\n"
        f"batches = iter(Loader({str(shared_export)!r}, 10))\n"
        "next(batches)\n"
        + ("" if keep else "del batches\n")
    )
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "alive at exit: []" in done.stdout, done.stdout + done.stderr[-2000:]


@pytest.mark.parametrize("shuffle", [True, False])
def test_column_blocks_are_rows_of_one_buffer_with_the_same_values(shared_export: Path,
                                                                   testdata: Any,
                                                                   shuffle: bool) -> None:
    from tabstream.loaders.core import column_block

    plain = Loader(shared_export, 97, shuffle=shuffle, seed=4)
    blocked = Loader(shared_export, 97, shuffle=shuffle, seed=4)
    blocked.set_column_blocks([["label", "row_id", "C1"]])
    rows = 0
    for (f, lab), (g, m) in zip(plain, blocked, strict=True):
        for name in ("row_id", "C1", "I1"):
            assert np.array_equal(f[name], g[name]) and f[name].dtype == g[name].dtype
        assert np.array_equal(lab, m)
        block = column_block([m, g["row_id"], g["C1"]])
        assert block is not None and block.shape == (3, len(m)) and block.dtype == np.int64
        np.testing.assert_array_equal(block, np.stack([lab, f["row_id"], f["C1"]]))
        assert np.shares_memory(block, g["C1"]) and np.shares_memory(block, m)
        assert column_block([g["row_id"], m, g["C1"]]) is None  # not the block's order
        assert column_block([m, g["row_id"]]) is not None  # a leading part is rows too
        assert column_block([f["row_id"], f["C1"]]) is None  # separate buffers
        rows += len(lab)
    assert rows == testdata.N


def test_held_columns_of_a_block_keep_its_buffer(shared_export: Path, testdata: Any) -> None:
    """A block's buffer goes back to the pool only once none of its rows is held:
    keep two of its three columns of every other batch, then check them."""
    expected = testdata.read_all(shared_export)
    loader = Loader(shared_export, 100, seed=3, shuffle=True)
    loader.set_column_blocks([["row_id", "C1", "label"]])
    held = []
    for k, (features, labels) in enumerate(loader):
        if k % 2 == 0:
            held.append((features["C1"], labels, features["row_id"].copy()))
        del features, labels
    for c1, labels, ids in held:
        np.testing.assert_array_equal(c1, expected["C1"].to_numpy()[ids])
        np.testing.assert_array_equal(labels, expected["label"].to_numpy()[ids])


def test_column_blocks_are_checked(shared_export: Path) -> None:
    loader = Loader(shared_export, 100, shuffle=True)
    with pytest.raises(ValueError, match="'tags' is not a selected scalar column"):
        loader.set_column_blocks([["C1", "tags"]])
    with pytest.raises(ValueError, match="'nope' is not a selected scalar column"):
        loader.set_column_blocks([["nope"]])
    with pytest.raises(ValueError, match=r"mixes dtypes \['float32', 'int64'\]"):
        loader.set_column_blocks([["C1", "I1"]])
    with pytest.raises(ValueError, match="'C1' is in two column blocks"):
        loader.set_column_blocks([["C1", "row_id"], ["C1"]])


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("blocks", [False, True])
def test_columns_copied_on_several_threads_keep_their_rows(shared_export: Path, testdata: Any,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           shuffle: bool, blocks: bool) -> None:
    """With the chunk's columns copied on several threads (machines of 4 cores or
    more), every batch's columns hold the rows of its ``row_id`` (against pyarrow),
    also when scalar columns share one buffer per batch (allocated by whichever
    thread comes first), and the epoch is the one a single thread delivers."""
    import tabstream.loaders.batching as batching

    original = batching._copy_rows
    copiers: set[str] = set()

    def copy_rows(*args: Any, **kwargs: Any) -> None:
        copiers.add(threading.current_thread().name)
        original(*args, **kwargs)

    monkeypatch.setattr(batching, "_copy_rows", copy_rows)

    def epoch(threads: int) -> list[tuple[dict[str, Any], Any]]:
        monkeypatch.setattr(batching, "_FILL_THREADS", threads)
        copiers.clear()
        loader = Loader(shared_export, 97, shuffle=shuffle, seed=3, parts_per_chunk=3)
        if blocks:
            loader.set_column_blocks([["row_id", "C1"]])
        loader.set_epoch(1)
        out = list(loader)
        on_fill_threads = {name for name in copiers if name.startswith("tabstream-fill")}
        assert bool(on_fill_threads) == (threads > 1)
        return out

    expected = testdata.read_all(shared_export)
    several, one = epoch(3), epoch(1)
    assert len(several) == len(one) == len(Loader(shared_export, 97))
    seen = []
    for (features, labels), (features1, labels1) in zip(several, one, strict=True):
        ids = features["row_id"]
        seen.append(ids)
        want = expected.take(pa.array(ids))
        np.testing.assert_array_equal(features["C1"], want["C1"].to_numpy())
        np.testing.assert_array_equal(features["I1"], want["I1"].to_numpy())
        np.testing.assert_array_equal(labels, want["label"].to_numpy())
        values, offsets = features["tags"]
        assert [values[offsets[i]:offsets[i + 1]].tolist() for i in range(len(ids))] == \
            want["tags"].to_pylist()
        np.testing.assert_array_equal(ids, features1["row_id"])
        np.testing.assert_array_equal(labels, labels1)
    assert np.array_equal(np.sort(np.concatenate(seen)), np.arange(testdata.N))


def test_a_failed_column_copy_is_raised_once_no_copy_runs(shared_export: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On several threads, an error of one column's copy reaches the consumer only once
    no other copy of the chunk still runs: none is left writing into a batch that is
    being dropped."""
    import time

    import tabstream.loaders.batching as batching

    monkeypatch.setattr(batching, "_FILL_THREADS", 3)
    original = batching._copy_rows
    running: list[int] = [0]
    lock = threading.Lock()

    def copy_rows(col: Any, builder: Any, name: str, *args: Any, **kwargs: Any) -> None:
        with lock:
            running[0] += 1
        try:
            if name == "I1":
                raise ValueError(f"column {name}")
            time.sleep(0.01)
            original(col, builder, name, *args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(batching, "_copy_rows", copy_rows)
    loader = Loader(shared_export, 97, shuffle=False, parts_per_chunk=3)
    with pytest.raises(ValueError, match="column I1"):
        list(loader)
    assert running[0] == 0

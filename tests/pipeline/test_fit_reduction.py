"""The tree reduction of a fit: its last combination and Categorify's use of it."""

import threading

import dask
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from dask import delayed

import tabstream as ts
from tabstream import ops
from tabstream.pipeline.execution import tree_reduce


@pytest.mark.parametrize("n", [1, 2, 8, 9, 20, 64, 65])
def test_tree_reduce_uses_root_for_the_last_combination_only(n):
    calls = []

    def combine(parts):
        calls.append(("combine", len(parts)))
        return sum(parts)

    def root(parts):
        calls.append(("root", len(parts)))
        return -sum(parts)

    items = [delayed(lambda i=i: i)() for i in range(n)]
    (result,) = dask.compute(tree_reduce(items, combine, fan_in=8, root=root), scheduler="sync")
    total = sum(range(n))
    if n == 1:  # nothing to combine: the single partial is the result
        assert calls == [] and result == 0
        return
    assert result == -total
    assert [kind for kind, _ in calls].count("root") == 1
    assert calls[-1][0] == "root"
    assert all(size <= 8 for _, size in calls)


def _partitioned_values(rows_per_part, parts, distinct_per_part, shift):
    """Partition k holds values ``v{k*shift} .. v{k*shift + distinct - 1}``, repeated."""
    values = []
    for k in range(parts):
        block = [f"v{k * shift + i % distinct_per_part}" for i in range(rows_per_part)]
        values += block
    return values


def test_last_combination_keeps_counts_in_memory_and_thresholds(tmp_path, monkeypatch):
    values = _partitioned_values(rows_per_part=120, parts=4, distinct_per_part=30, shift=20)
    values[5] = None
    table = pa.table({"c": pa.array(values, pa.string())})
    ds = ts.Dataset(table, part_size=table.nbytes // 4 + 1)
    per_part = [pa.compute.count_distinct(ds.read_piece(p)["c"]).as_py() for p in ds.pieces]
    spill_rows = max(per_part)
    expected_counts = pd.Series(values).dropna().value_counts()
    assert 2 <= ds.npartitions <= 8 and len(expected_counts) > spill_rows  # merged, they would spill

    spilled = []
    original = ops.Categorify._spill
    monkeypatch.setattr(ops.Categorify, "_spill", lambda self, t, offsets=None: spilled.append(t.num_rows) or original(self, t, offsets))
    op = ops.Categorify(freq_threshold=5, spill_rows=spill_rows, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds)

    assert spilled == []
    kept = sorted(((v, c) for v, c in expected_counts.items() if c >= 5), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_last_combination_merges_spilled_partials_like_before(tmp_path):
    # more partitions than one combination takes, each beyond spill_rows: the levels
    # below the last spill, and the last merges the spilled folders
    rng = np.random.default_rng(4)
    values = [f"v{x}" for x in rng.integers(0, 400, 6000)]
    table = pa.table({"c": values})
    ds = ts.Dataset(table, part_size=table.nbytes // 20 + 1)
    assert ds.npartitions > 8
    op = ops.Categorify(freq_threshold=3, spill_rows=10, spill_buckets=4, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds)
    counts = pd.Series(values).value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 3), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_final_merge_splits_held_counts_without_writing_them(tmp_path, monkeypatch):
    # the last merge gets one spilled partial and one still in memory: the spilled one is
    # read back by bucket, the held one is split by bucket in memory (never written out)
    big = pa.table({"c": pa.array([f"v{i % 40}" for i in range(200)] + [None, "w"], pa.string())})
    small = pa.table({"c": pa.array(["v1", "v1", "x", None, "w", "w"], pa.string())})
    op = ops.Categorify(freq_threshold=3, max_size=20, spill_rows=10, spill_buckets=3, spill_dir=str(tmp_path))
    spilled_big = op.fit_partition(big)
    held_small = op.fit_partition(small)
    assert spilled_big["c"].spilled and held_small["c"].table is not None

    written = []
    original = ops.Categorify._spill
    monkeypatch.setattr(ops.Categorify, "_spill", lambda self, t, offsets=None: written.append(t.num_rows) or original(self, t, offsets))
    op.finalize(op.combine_root([spilled_big, held_small]))
    assert written == []

    counts = pd.concat([big.to_pandas(), small.to_pandas()])["c"].value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 3), key=lambda kv: (-kv[1], kv[0]))[:20 - 3]
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_partials_that_would_spill_merged_are_spilled_unmerged(tmp_path, monkeypatch):
    # four partials of 8 distinct values each (2 rows per value, below freq_threshold=3
    # in every partial), overlapping: together more than twice spill_rows, so a merge
    # spills them as they are and the final merge sums each value's counts per bucket
    frames = [pa.table({"c": pa.array([f"v{2 * k + i % 8}" for i in range(16)] + [None], pa.string())})
              for k in range(4)]
    op = ops.Categorify(freq_threshold=3, spill_rows=10, spill_buckets=3, spill_dir=str(tmp_path))
    partials = [op.fit_partition(t) for t in frames]
    assert all(p["c"].table is not None and p["c"].table.num_rows == 8 for p in partials)

    written = []
    original = ops.Categorify._spill
    monkeypatch.setattr(ops.Categorify, "_spill", lambda self, t, offsets=None: written.append(t.num_rows) or original(self, t, offsets))
    level = op.combine(partials)
    assert level["c"].table is None and written == [4 * 8]  # the partials' rows, not the merged ones

    op.finalize(op.combine_root([level]))
    counts = pa.concat_tables(frames).to_pandas()["c"].value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 3), key=lambda kv: (-kv[1], kv[0]))
    assert len(kept) > 0 and len(counts) > 10
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_unmerged_spill_alone_in_its_buckets_is_still_summed(tmp_path):
    # one spilled folder of unmerged partials, next to an empty in-memory remainder:
    # every bucket holds repeated values that must be summed before the threshold
    frames = [pa.table({"c": pa.array(["a", "b", "b"] + [f"u{k}-{i}" for i in range(8)], pa.string())})
              for k in range(3)]
    op = ops.Categorify(freq_threshold=4, spill_rows=10, spill_buckets=2, spill_dir=str(tmp_path))
    level = op.combine([op.fit_partition(t) for t in frames])
    assert level["c"].table is None and len(level["c"].spilled) == 1
    empty = op.fit_partition(pa.table({"c": pa.array([None], pa.string())}))
    op.finalize(op.combine_root([level, empty]))
    counts = pa.concat_tables(frames).to_pandas()["c"].value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 4), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}


@pytest.mark.parametrize("n", [1, 2, 8, 9, 20])
@pytest.mark.parametrize("shards", [2, 3])
def test_tree_reduce_splits_the_last_combination_into_shards(n, shards):
    roots = []

    def combine(parts):
        return sum(parts)

    def root(parts, shard, k):
        roots.append((shard, k, len(parts)))
        return [shard, sum(parts)]

    def join(results):
        assert [r[0] for r in results] == list(range(shards))  # in shard order
        assert len({r[1] for r in results}) == 1  # every shard saw the same partials
        return results[0][1] * 10

    items = [delayed(lambda i=i: i)() for i in range(n)]
    (result,) = dask.compute(tree_reduce(items, combine, fan_in=8, root=root, shards=shards, join=join),
                             scheduler="sync")
    if n == 1:
        assert roots == [] and result == 0
        return
    assert result == sum(range(n)) * 10
    assert sorted(s for s, _, _ in roots) == list(range(shards)) and {k for _, k, _ in roots} == {shards}
    with pytest.raises(ValueError, match="shards > 1 needs both root and join"):
        tree_reduce(items, combine, shards=2)


@pytest.mark.parametrize("shards", [2, 3, 7])
def test_categorify_root_shards_merge_each_vocabulary_once(shards):
    rng = np.random.default_rng(shards)
    # columns of very different cardinality, so that the split by size matters
    frame = pd.DataFrame({f"c{k}": [f"v{x}" for x in rng.integers(0, 3 + 40 * k, 600)] for k in range(6)})
    frame.loc[::7, "c2"] = None
    op = ops.Categorify(freq_threshold=2)
    partials = [op.fit_partition(pa.Table.from_pandas(frame.iloc[i::4], preserve_index=False))
                for i in range(4)]
    parts = [op.combine_root(partials, shard, shards) for shard in range(shards)]
    names = [n for part in parts for n in part]
    assert sorted(names) == sorted(frame.columns)  # each vocabulary in exactly one part
    sizes = [sum(p.table.num_rows for name in part for p in [pp[name] for pp in partials]) for part in parts]
    if shards == 2:  # the largest vocabularies are not all in one part
        assert max(sizes) < sum(sizes)
    op.finalize(op.join_root(parts))
    for col in frame.columns:
        counts = frame[col].dropna().value_counts()
        kept = sorted(((v, c) for v, c in counts.items() if c >= 2), key=lambda kv: (-kv[1], kv[0]))
        assert op.tables[col].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_fit_with_sharded_root_equals_pandas(workers, tmp_path):
    rng = np.random.default_rng(workers)
    frame = pd.DataFrame({f"c{k}": [f"v{x}" for x in rng.integers(0, 5 + 30 * k, 900)] for k in range(5)})
    frame["x"] = rng.normal(size=900)
    frame.to_parquet(tmp_path / "a.parquet", row_group_size=100)
    ds = ts.Dataset(str(tmp_path / "a.parquet"), part_size=1)  # one partition per row group
    assert ds.npartitions == 9
    op = ops.Categorify(freq_threshold=3)
    with dask.config.set(num_workers=workers):
        ts.Workflow([f"c{k}" for k in range(5)] >> op).fit(ds)
    for k in range(5):
        counts = frame[f"c{k}"].value_counts()
        kept = sorted(((v, c) for v, c in counts.items() if c >= 3), key=lambda kv: (-kv[1], kv[0]))
        assert op.tables[f"c{k}"].to_pydict() == {"values": [v for v, _ in kept],
                                                   "counts": [int(c) for _, c in kept]}


def test_fit_hands_the_allocators_unused_memory_back(tmp_path, monkeypatch):
    calls = []
    pool = pa.default_memory_pool()

    class Spy:
        def release_unused(self):
            calls.append(threading.current_thread())
            pool.release_unused()

    frame = pd.DataFrame({"c": ["a", "b", "a"] * 50})
    frame.to_parquet(tmp_path / "a.parquet")
    monkeypatch.setattr(pa, "default_memory_pool", lambda: Spy())
    op = ops.Categorify()
    ts.Workflow(["c"] >> op).fit(ts.Dataset(str(tmp_path / "a.parquet")))
    # once by the fit's end, in the main thread and in each thread of the shared pool
    # (each thread's heap keeps its own freed pages)
    from tabstream.core.threads import local_workers, shared_pool

    fit_threads = set(shared_pool()._threads)  # the pool the fit ran on
    assert len(fit_threads) == local_workers()
    assert calls[0] is threading.main_thread()
    # once in each thread (other tests' pools of other sizes included)
    assert fit_threads <= set(calls[1:]) and len(set(calls[1:])) == len(calls) - 1
    assert op.tables["c"].to_pydict() == {"values": ["a", "b"], "counts": [100, 50]}


@pytest.mark.parametrize("spill_rows", [1_000_000, 60])
def test_large_partials_are_merged_bucket_by_bucket(tmp_path, monkeypatch, spill_rows):
    # partials above _BUCKETED_ROWS distinct values are kept ordered by spill bucket and
    # merged bucket by bucket (through every level of the tree, with and without spills);
    # the vocabulary is the one pandas counts, and small partials next to them are merged too
    from tabstream.ops import categorify

    monkeypatch.setattr(categorify, "_BUCKETED_ROWS", 20)
    rng = np.random.default_rng(9)
    values = [f"v{x}" for x in rng.zipf(1.3, 12_000) % 3000]
    values[7] = None
    small = [f"s{x}" for x in rng.integers(0, 15, len(values))]  # under 20 distinct: never bucketed
    table = pa.table({"c": pa.array(values, pa.string()), "s": small})
    ds = ts.Dataset(table, part_size=table.nbytes // 40 + 1)
    assert ds.npartitions > 16  # more partials than one combination takes

    orders = []
    original = ops.Categorify._bucket_order
    monkeypatch.setattr(ops.Categorify, "_bucket_order",
                        lambda self, t: orders.append(t.num_rows) or original(self, t))
    op = ops.Categorify(freq_threshold=2, spill_rows=spill_rows, spill_buckets=5, spill_dir=str(tmp_path))
    ts.Workflow(["c", "s"] >> op).fit(ds)

    assert len(orders) >= ds.npartitions  # each partition's large partial, at least
    for name, column in (("c", values), ("s", small)):
        counts = pd.Series(column).dropna().value_counts()
        kept = sorted(((v, c) for v, c in counts.items() if c >= 2), key=lambda kv: (-kv[1], kv[0]))
        assert op.tables[name].to_pydict() == {"values": [v for v, _ in kept],
                                                "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("parts", [12, 40])
def test_fit_combines_up_to_16_partitions_at_once_and_8_beyond(parts, monkeypatch):
    """A fit of up to FIT_FAN_IN_MAX partitions merges them in one combination; a
    larger one combines FIT_FAN_IN at a time (fewer partials held at once); the
    vocabulary is pandas' either way."""
    import tabstream.pipeline.workflow as workflow_mod

    sizes: list[int] = []
    original = workflow_mod._Combine.__call__

    def combine(self, partial_lists, *args, **kwargs):
        sizes.append(len(partial_lists))
        return original(self, partial_lists, *args, **kwargs)

    monkeypatch.setattr(workflow_mod._Combine, "__call__", combine)
    rng = np.random.default_rng(parts)
    df = pd.DataFrame({"c": rng.integers(0, 50, parts * 100).astype(str)})
    ds = ts.Dataset(df, part_size=int(df.memory_usage(deep=True).sum()) // parts + 1)
    n = ds.npartitions
    assert (n <= workflow_mod.FIT_FAN_IN_MAX) == (parts == 12) and n > 1
    op = ops.Categorify()
    ts.Workflow(["c"] >> op).fit(ds, progress=False)
    if n <= workflow_mod.FIT_FAN_IN_MAX:
        assert set(sizes) == {n}  # one combination (its shards each take every partial)
    else:
        assert max(sizes) == workflow_mod.FIT_FAN_IN == 8 and len(sizes) > 1
    counts = df["c"].value_counts()
    got = dict(zip(op.tables["c"]["values"].to_pylist(), op.tables["c"]["counts"].to_pylist()))
    assert got == counts.to_dict()


def _two_level_fit_data(seed, spread, rows, parts):
    """Random values of one column in about ``parts`` partitions: more than 16, so a
    fit combines them in two levels."""
    rng = np.random.default_rng(seed)
    values = [f"v{x}" for x in rng.integers(0, spread, rows)]
    frame = pd.DataFrame({"c": values})
    ds = ts.Dataset(frame, part_size=int(frame.memory_usage(deep=True).sum()) // parts + 1)
    assert ds.npartitions > 16  # two levels
    return values, ds


def test_combinations_short_of_the_last_keep_a_share_of_spill_rows(tmp_path, monkeypatch):
    # a fit in two levels: each first-level result waits for the last combination beside
    # the others, so it keeps at most spill_rows / 16 distinct values of a vocabulary in
    # memory (the rest spilled); the vocabulary is still pandas' count
    from tabstream.ops import categorify

    values, ds = _two_level_fit_data(seed=4, spread=3000, rows=24_000, parts=40)
    held: list[tuple[int, int]] = []
    original = categorify.Categorify._combine
    monkeypatch.setattr(categorify.Categorify, "_combine",
                        lambda self, partials, rows: held.append((len(partials), rows)) or original(self, partials, rows))
    spills: list[int] = []
    spill = categorify.Categorify._spill
    monkeypatch.setattr(categorify.Categorify, "_spill",
                        lambda self, table, offsets=None: spills.append(table.num_rows) or spill(self, table, offsets))
    op = ops.Categorify(freq_threshold=2, spill_rows=1600, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds, progress=False)
    assert (8, 100) in held  # the first level: 1600 / 16
    assert spills and min(spills) > 100  # first-level results past 100 values went to disk
    counts = pd.Series(values).value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 2), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_partials_a_combination_would_spill_unmerged_are_spilled_by_their_partition(tmp_path, monkeypatch):
    # a fit in two levels whose combinations of 8 would pass twice spill_rows: each
    # partition's task spills its own partial (nothing waits in memory for the
    # combination); each partial alone is under spill_rows. The vocabulary is pandas'.
    from tabstream.ops import categorify

    values, ds = _two_level_fit_data(seed=7, spread=5000, rows=12_000, parts=24)
    per_part = [pa.compute.count_distinct(ds.read_piece(p)["c"]).as_py() for p in ds.pieces]
    spill_rows = max(per_part) + 1  # no partial passes it alone
    assert 8 * min(per_part) > 2 * spill_rows  # eight of them together pass twice

    spilled_in: list[str] = []
    spill = categorify.Categorify._spill

    def record(self, table, offsets=None):
        import inspect

        spilled_in.append(inspect.stack()[1].function)
        return spill(self, table, offsets)

    monkeypatch.setattr(categorify.Categorify, "_spill", record)
    op = ops.Categorify(freq_threshold=2, spill_rows=spill_rows, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds, progress=False)
    assert spilled_in.count("fit_partition") == ds.npartitions
    assert "_spill_parts" not in spilled_in  # no combination had partials left to spill
    assert op.partials_per_combination is None  # the fit's setting is not kept
    counts = pd.Series(values).value_counts()
    kept = sorted(((v, c) for v, c in counts.items() if c >= 2), key=lambda kv: (-kv[1], kv[0]))
    assert op.tables["c"].to_pydict() == {"values": [v for v, _ in kept], "counts": [int(c) for _, c in kept]}
    assert list(tmp_path.iterdir()) == []


def test_partials_are_not_spilled_early_where_the_last_combination_takes_them(tmp_path, monkeypatch):
    # up to 16 partitions go straight to the last combination, which merges them in
    # memory: a partition's partial is kept, however large the combination
    from tabstream.ops import categorify

    values = [f"v{i}" for i in range(4000)]
    frame = pd.DataFrame({"c": values})
    ds = ts.Dataset(frame, part_size=int(frame.memory_usage(deep=True).sum()) // 10 + 1)
    assert 8 < ds.npartitions <= 16
    spills: list[int] = []
    spill = categorify.Categorify._spill
    monkeypatch.setattr(categorify.Categorify, "_spill",
                        lambda self, table, offsets=None: spills.append(table.num_rows) or spill(self, table, offsets))
    op = ops.Categorify(spill_rows=1000, spill_dir=str(tmp_path))
    ts.Workflow(["c"] >> op).fit(ds, progress=False)
    assert spills == []
    assert op.tables["c"]["values"].to_pylist() == sorted(values)


_EXPORT_RSS = r"""
import sys
import numpy as np, pandas as pd, pyarrow as pa
import tabstream as ts
from tabstream import ops

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10

rng = np.random.default_rng(0)
frame = pd.DataFrame({f"c{i}": rng.integers(0, 1000, 400_000).astype(str) for i in range(4)})
frame["x"] = rng.random(400_000)
ds = ts.Dataset(frame, part_size=int(frame.memory_usage(deep=True).sum()) // 8)
wf = ts.Workflow(([f"c{i}" for i in range(4)] >> ops.Categorify()) + (["x"] >> ops.Normalize()))
wf.fit(ds, progress=False)
before = anon()
wf.transform(ds).to_parquet(sys.argv[1], progress=False)
held = pa.default_memory_pool().bytes_allocated()
print(anon() - before, held)
"""


def test_export_hands_the_allocators_unused_memory_back(tmp_path):
    # measured in a fresh process: what the export leaves in anonymous memory beyond
    # what it started with stays within what Arrow still holds and a margin, and is
    # larger when the release at the export's end is skipped
    import subprocess
    import sys

    def grown(release: bool) -> tuple[int, int]:
        code = "" if release else (
            "import tabstream.pipeline.export as e\n"
            "e.release_freed_memory = lambda: None\n")
        path = tmp_path / f"run{int(release)}.py"
        path.write_text(code + _EXPORT_RSS)
        out = subprocess.run([sys.executable, str(path), str(tmp_path / f"out{int(release)}")],
                             capture_output=True, text=True, check=True).stdout.split()
        return int(out[-2]), int(out[-1])

    kept, _ = grown(release=False)
    released, held_after = grown(release=True)
    assert released < kept - (16 << 20), (released, kept)
    assert released < held_after + (32 << 20)

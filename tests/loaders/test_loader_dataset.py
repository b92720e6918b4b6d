"""One Dataset, one set of rows: a loader yields exactly the rows of the Dataset it
is given (path, glob, folder, list, random split, value split, filters), checked
against the rows plain pandas/numpy select, on one and on several ranks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.loaders import Loader


def all_ids(data: Any, w: int = 1, batch_size: int = 97, seed: int = 3) -> np.ndarray:
    """Every row id the loaders of ``w`` ranks yield in one epoch; checks that the
    ranks yield equal batch counts and no row twice."""
    per_rank = []
    for r in range(w):
        loader = Loader(data, batch_size, seed=seed, global_size=w, global_rank=r, shuffle=True)
        batches = [features["row_id"] for features, _ in loader]
        assert len(batches) == len(loader)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1, "ranks yield different batch counts"
    ids = np.concatenate([np.concatenate(b) for b in per_rank])
    assert len(np.unique(ids)) == len(ids), "a row was delivered twice"
    return np.sort(ids)


def frame(export: Path) -> pd.DataFrame:
    return pd.concat([pd.read_parquet(p, columns=["row_id", "C1", "label"])
                      for p in sorted(export.glob("part_*.parquet"))], ignore_index=True)


def random_split_ids(ds: ts.Dataset, fractions: list[float], seed: int, k: int) -> np.ndarray:
    """The documented split, recomputed with numpy: one uniform draw per stored row
    of partition ``i`` from ``default_rng([seed, i])``."""
    bounds = np.cumsum(fractions)
    ids = []
    for i, piece in enumerate(ds.pieces):
        u = np.random.default_rng([seed, i]).random(piece.num_rows)
        part = np.searchsorted(bounds, u, side="right")
        part = np.minimum(part, len(fractions) - 1)
        rows = pq.ParquetFile(piece.path).read_row_groups(list(piece.row_groups), columns=["row_id"])
        ids.append(rows["row_id"].to_numpy()[part == k])
    return np.sort(np.concatenate(ids))


@pytest.mark.parametrize("how", ["path", "glob", "folder", "list"])
def test_path_forms_give_every_row(shared_export: Path, testdata: Any, how: str) -> None:
    files = sorted(str(p) for p in shared_export.glob("part_*.parquet"))
    data = {"path": files[2], "glob": str(shared_export / "part_*.parquet"),
            "folder": ts.Dataset(str(shared_export)), "list": files[1:4]}[how]
    expected = {"path": pq.read_table(files[2])["row_id"].to_numpy(),
                "glob": np.arange(testdata.N), "folder": np.arange(testdata.N),
                "list": np.sort(np.concatenate([pq.read_table(f)["row_id"].to_numpy()
                                                for f in files[1:4]]))}[how]
    assert np.array_equal(all_ids(data), expected)
    assert np.array_equal(all_ids(data, w=3), expected)


@pytest.mark.parametrize("seed", [0, 7])
@pytest.mark.parametrize("w", [1, 2, 3])
def test_random_split_yields_only_its_rows(shared_export: Path, seed: int, w: int) -> None:
    # Before: Loader(train) re-read the folder and yielded the validation rows too.
    ds = ts.Dataset(str(shared_export), part_size=20_000)
    assert ds.npartitions > 1
    train, valid = ds.split([0.8, 0.2], seed=seed)
    want_train = random_split_ids(ds, [0.8, 0.2], seed, 0)
    want_valid = random_split_ids(ds, [0.8, 0.2], seed, 1)
    assert np.array_equal(all_ids(train, w=w, seed=seed), want_train)
    assert np.array_equal(all_ids(valid, w=w, seed=seed), want_valid)
    batches = len(Loader(train, 50, shuffle=True))
    assert batches * 50 >= len(want_train) > (batches - 1) * 50
    assert Loader(train, 10, shuffle=True).num_rows == train.num_rows == len(want_train)


@pytest.mark.parametrize("w", [1, 2])
def test_value_split_yields_only_its_rows(shared_export: Path, w: int) -> None:
    df = frame(shared_export)
    low, high = ts.Dataset(str(shared_export)).split_by_value("C1", [range(0, 30), range(30, 100)])
    assert np.array_equal(all_ids(low, w=w), np.sort(df.loc[df["C1"] < 30, "row_id"].to_numpy()))
    assert np.array_equal(all_ids(high, w=w), np.sort(df.loc[df["C1"] >= 30, "row_id"].to_numpy()))


@pytest.mark.parametrize("form", ["dnf", "dnf_or", "expression"])
@pytest.mark.parametrize("w", [1, 3])
def test_filtered_dataset_yields_only_its_rows(shared_export: Path, form: str, w: int) -> None:
    df = frame(shared_export)
    filters, keep = {
        "dnf": ([("C1", "<", 40), ("label", "==", 1)], (df["C1"] < 40) & (df["label"] == 1)),
        "dnf_or": ([[("row_id", "<", 300)], [("row_id", ">=", 2500)]],
                   (df["row_id"] < 300) | (df["row_id"] >= 2500)),
        "expression": ((pc.field("C1") > 10) & ~pc.field("label").isin([1]),
                       (df["C1"] > 10) & (df["label"] != 1)),
    }[form]
    ds = ts.Dataset(str(shared_export), filters=filters)
    want = np.sort(df.loc[keep, "row_id"].to_numpy())
    assert ds.num_rows == len(want)
    assert np.array_equal(all_ids(ds, w=w), want)


def test_a_filter_that_keeps_nothing(shared_export: Path) -> None:
    ds = ts.Dataset(str(shared_export), filters=[("row_id", "<", 0)])
    assert ds.num_rows == 0
    with pytest.raises(DataError, match=r"the dataset is empty: its 5 file\(s\) hold no rows that "
                                        "this split or filter keeps"):
        Loader(ds, 10, shuffle=True)


def test_split_of_a_filtered_dataset(shared_export: Path) -> None:
    df = frame(shared_export)
    ds = ts.Dataset(str(shared_export), filters=[("C1", ">=", 50)], part_size=20_000)
    train, valid = ds.split([0.5, 0.5], seed=4)
    train_ids, valid_ids = all_ids(train, w=2), all_ids(valid)
    # the filter's rows, and among them the random split's (drawn over stored rows)
    unfiltered = ts.Dataset(str(shared_export), part_size=20_000)
    want = [np.intersect1d(random_split_ids(unfiltered, [0.5, 0.5], 4, k),
                           df.loc[df["C1"] >= 50, "row_id"].to_numpy()) for k in (0, 1)]
    assert np.array_equal(train_ids, want[0]) and np.array_equal(valid_ids, want[1])
    assert train.num_rows + valid.num_rows == (df["C1"] >= 50).sum()
    # a value split of a filtered dataset composes too
    a, b = ds.split_by_value("label", [[0], [1]])
    assert np.array_equal(all_ids(a), np.sort(df.loc[(df["C1"] >= 50) & (df["label"] == 0), "row_id"]))
    with pytest.raises(ValueError, match="splitting an already split dataset is not supported"):
        train.split([0.5, 0.5])


def test_random_split_counts_rows_without_reading(tmp_path: Path, testdata: Any) -> None:
    # The planned rows of a random split come from the generator alone: with the
    # files gone after planning, counting still works (reading would fail).
    export = testdata.write_export(tmp_path / "e")
    ds = ts.Dataset(str(export), part_size=20_000)
    want = random_split_ids(ds, [0.3, 0.7], 1, 0)
    train, _ = ds.split([0.3, 0.7], seed=1)
    for p in export.glob("part_*.parquet"):
        p.unlink()
    assert train.num_rows == len(want)


def test_filters_apply_to_fit_and_export(tmp_path: Path, shared_export: Path) -> None:
    df = frame(shared_export)
    ds = ts.Dataset(str(shared_export), filters=[("label", "==", 0)])
    ds.to_parquet(str(tmp_path / "out"))
    out = pd.concat([pd.read_parquet(p) for p in (tmp_path / "out").glob("*.parquet")])
    assert out["row_id"].tolist() == df.loc[df["label"] == 0, "row_id"].sort_values().tolist()
    from tabstream import ops

    wf = ts.Workflow(["C1"] >> ops.Categorify()).fit(ds)
    card = wf.output_schema["C1"].properties["embedding_sizes"]["cardinality"]
    # padding, null, one out-of-vocabulary index, then the filtered rows' distinct values
    assert card == 3 + df.loc[df["label"] == 0, "C1"].nunique()


@pytest.mark.parametrize("how", ["deleted", "smaller", "extra"])
@pytest.mark.parametrize("form", ["folder", "dataset", "glob"])
def test_loader_refuses_an_export_that_disagrees_with_its_manifest(tmp_path: Path, testdata: Any,
                                                                   how: str, form: str) -> None:
    # Before: the loader silently delivered fewer (or more) rows than exported.
    export = testdata.write_export(tmp_path / "e")
    rows = dict(zip([f"part_{i:05d}.parquet" for i in range(5)], testdata.FILE_ROWS, strict=True))
    if how == "deleted":
        (export / "part_00002.parquet").unlink()
        msg = rf"part_00002.parquet: listed in .*with {rows['part_00002.parquet']} rows, but the file is missing"
    elif how == "smaller":
        pq.write_table(pq.read_table(export / "part_00000.parquet").slice(0, 10), export / "part_00000.parquet")
        msg = rf"part_00000.parquet: .*_manifest.json lists {rows['part_00000.parquet']} rows, found 10 rows"
    else:
        pq.write_table(pq.read_table(export / "part_00000.parquet").slice(0, 4), export / "part_00042.parquet")
        msg = r"part_00042.parquet: not listed in .*_manifest.json \(found 4 rows"
    # a glob must find every manifest entry it matches: a deleted file fails there too
    data = {"folder": lambda: export, "dataset": lambda: ts.Dataset(str(export)),
            "glob": lambda: str(export / "part_*.parquet")}[form]
    with pytest.raises(DataError, match=msg):
        Loader(data(), 100, shuffle=True)


def test_loader_plans_from_footers_without_decoding(tmp_path: Path, monkeypatch: Any) -> None:
    # Sizing a Dataset's pieces decodes a sample of the first file; a loader over a
    # whole dataset reads row groups and never needs it, so it is done on first use.
    import tabstream.pipeline.parquet_files as parquet_files
    from tabstream.loaders import open_source

    for f in range(3):
        ids = np.arange(f * 1000, f * 1000 + 700 + 100 * f, dtype=np.int64)
        pq.write_table(pa.table({"id": ids}), tmp_path / f"part_{f}.parquet", row_group_size=250)
    calls: list[str] = []
    real = parquet_files._parquet_row_bytes

    def counting(fs: Any, path: str, md: Any, *args: Any) -> float:
        calls.append(path)
        return real(fs, path, md, *args)

    monkeypatch.setattr(parquet_files, "_parquet_row_bytes", counting)
    files = sorted(tmp_path.glob("*.parquet"))
    expected = [(i, g, pq.ParquetFile(p).metadata.row_group(g).num_rows)
                for i, p in enumerate(files) for g in range(pq.ParquetFile(p).num_row_groups)]
    ds = ts.Dataset(str(tmp_path), part_size=1)
    source = open_source(ds)
    assert [(u.file, u.row_group, u.num_rows) for u in source.units] == expected
    assert all(u.mask is None and u.stored_rows == u.num_rows for u in source.units)
    assert ds.num_rows == sum(pq.ParquetFile(p).metadata.num_rows for p in files)
    assert calls == []
    seen = np.concatenate([b["id"] for b, _ in Loader(ds, 128, shuffle=True, seed=1)])
    assert np.array_equal(np.sort(seen), pa.concat_tables([pq.read_table(p) for p in files])["id"])
    assert calls == []
    # first use by fit/export: one sample of the first file; tiny pieces = row groups
    assert ds.npartitions == len(expected)
    assert len(calls) == 1 and calls[0].endswith("part_0.parquet")
    assert ts.Dataset(str(tmp_path), part_size="1GB").npartitions == len(files)

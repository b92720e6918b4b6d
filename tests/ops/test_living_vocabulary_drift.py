"""The synthetic generators' drift option (issue 33 item 2): daily file lists whose
popular ids move on, the input a living vocabulary is for."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tabstream.datasets.synthetic import generate_data, write_data


@pytest.mark.parametrize("drift", [0.5, 7.0])
def test_multi_hot_ids_shift_by_the_stated_amount(drift: float) -> None:
    """Multi-hot ids are popularity ranks: with drift, row i's id is the undrifted
    id plus floor(i * drift / 1000), modulo the vocabulary."""
    kw = {"slots": 2, "nnz": 3, "vocabulary": 50}
    plain = generate_data("multi-hot", 3000, seed=1, **kw)["multi_hot"]
    moved = generate_data("multi-hot", 3000, seed=1, drift=drift, **kw)["multi_hot"]
    a = np.stack([np.stack(r) for r in plain])
    b = np.stack([np.stack(r) for r in moved])
    shift = np.floor(np.arange(3000) * drift / 1000).astype(np.int64)
    np.testing.assert_array_equal(b, (a + shift[:, None, None]) % 50)


def test_criteo_drift_moves_popular_values_and_keeps_row_independence() -> None:
    no_drift = generate_data("criteo", 4000, seed=2)
    pd.testing.assert_frame_equal(generate_data("criteo", 4000, seed=2, drift=0), no_drift)
    moved = generate_data("criteo", 4000, seed=2, drift=20.0)
    # labels and continuous columns are untouched; categoricals move
    pd.testing.assert_series_equal(moved["I1"], no_drift["I1"])
    first, last = moved.iloc[:1000], moved.iloc[3000:]
    overlap = len(set(first["C3"].dropna()) & set(last["C3"].dropna())) / len(set(last["C3"].dropna()))
    base = len(set(no_drift.iloc[:1000]["C3"].dropna()) & set(no_drift.iloc[3000:]["C3"].dropna())) \
        / len(set(no_drift.iloc[3000:]["C3"].dropna()))
    assert overlap < base
    # rows depend on their index only: a later slice equals the same rows of a longer call
    tail = generate_data("criteo", 1000, seed=2, drift=20.0, start_row=3000)
    pd.testing.assert_frame_equal(tail, moved.iloc[3000:].reset_index(drop=True))


def test_write_data_days_and_bad_drift(tmp_path) -> None:
    files = write_data("e-commerce", tmp_path, 3000, num_files=3, seed=0, drift=30.0)
    frames = [pd.read_parquet(f) for f in files]
    whole = generate_data("e-commerce", 3000, seed=0, drift=30.0)
    pd.testing.assert_frame_equal(pd.concat(frames, ignore_index=True), whole, check_dtype=False)
    with pytest.raises(ValueError, match=r"drift must be a finite number >= 0 .*got -1"):
        generate_data("criteo", 10, drift=-1)

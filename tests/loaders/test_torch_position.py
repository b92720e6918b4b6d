"""The torch loader's ``position`` / ``set_position`` (the core's, without
``loader.core``): an epoch stopped on W ranks resumes on W' ranks with exactly the
rows not delivered yet, each once; the next epoch is the usual one. Rows are
checked by id against plain Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabstream.loaders.torch import Loader  # noqa: E402

pytestmark = pytest.mark.torch

FILES, GROUPS = (300, 1, 170, 90), (40, 1, 60, 25)   # 561 rows in 14 row groups


def _loaders(export: Path, w: int, b: int, shuffle: bool) -> list[Loader]:
    return [Loader(str(export), b, shuffle=shuffle, seed=5, global_size=w, global_rank=r,
                   features=["row_id"], labels=["label"]) for r in range(w)]


def _epoch(loaders: list[Loader], steps: int | None = None) -> list[int]:
    rows, counts = [], set()
    for loader in loaders:
        expected, n = len(loader), 0
        for features, labels in loader:
            assert torch.equal(labels, features["row_id"] % 2)
            rows += features["row_id"].tolist()
            n += 1
            if n == steps:
                break
        assert steps is not None or n == expected
        counts.add(n)
        loader.stop()
    assert len(counts) == 1, f"ranks yielded {counts} batches"
    return rows


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize(("w", "w2"), [(1, 2), (3, 2)])
def test_torch_loader_resumes_on_another_world_size(testdata: Any, tmp_path: Path, w: int,
                                                    w2: int, shuffle: bool) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    before = _loaders(export, w, 24 // w, shuffle)
    steps = len(before[0]) // 2
    seen = _epoch(before, steps)
    state = before[-1].position(0, steps)
    assert state == before[0].core.position(0, steps)
    assert state["rows_delivered"] == len(seen)
    after = _loaders(export, w2, 24 // w2, shuffle)
    for loader in after:
        loader.set_position(state)
    assert {len(loader) for loader in after} == {-(-(561 - len(seen)) // 24)}
    rest = _epoch(after)
    assert sorted(seen + rest) == list(range(561))
    fresh = _loaders(export, w2, 24 // w2, shuffle)
    for loader in fresh:
        loader.set_epoch(1)
    assert _epoch(after) == _epoch(fresh)


def test_set_position_refuses_another_seed(testdata: Any, tmp_path: Path) -> None:
    export = testdata.write_export(tmp_path / "e", FILES, GROUPS)
    state = _loaders(export, 2, 8, True)[0].position(0, 2)
    other = Loader(str(export), 8, shuffle=True, seed=6, features=["row_id"], labels=["label"])
    with pytest.raises(ValueError, match=r"taken with seed 5, this loader has 6: build the "
                                         r"loader with seed=5"):
        other.set_position(state)
    np.testing.assert_array_equal(
        np.sort(np.concatenate([f["row_id"].numpy() for f, _ in other])), np.arange(561))

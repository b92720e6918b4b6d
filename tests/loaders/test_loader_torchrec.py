"""The torch loader's TorchRec interop: categorical features as one KeyedJaggedTensor.

torchrec is optional (not installed by ``make test``): the values and lengths the
loader hands to ``KeyedJaggedTensor.from_lengths_sync`` are checked against the
export read with plain pyarrow in every environment; the real KeyedJaggedTensor
is checked where torchrec imports."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

torch = pytest.importorskip("torch")

import tabstream.loaders.torch as tl  # noqa: E402
from tabstream.loaders.torch import SPARSE_FEATURES, Loader, jagged_parts  # noqa: E402

pytestmark = pytest.mark.torch


class _Recorder:
    """Stands in for KeyedJaggedTensor: keeps what the loader hands over."""

    def __init__(self, keys: list[str], values: Any, lengths: Any) -> None:
        self.keys, self.values, self.lengths = keys, values, lengths

    @classmethod
    def from_lengths_sync(cls, keys: list[str], values: Any, lengths: Any) -> _Recorder:
        return cls(keys, values, lengths)


def expected_parts(table: Any, row_ids: np.ndarray, keys: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Key-major values and lengths of the rows ``row_ids``, by plain pyarrow."""
    rows = table.take(row_ids)  # the table is sorted by row id, so id == position
    values, lengths = [], []
    for key in keys:
        col = rows[key]
        if pa.types.is_list(col.type):
            values.append(pc.list_flatten(col).to_numpy())
            lengths.append(pc.list_value_length(col).to_numpy())
        else:
            values.append(col.to_numpy())
            lengths.append(np.ones(len(col), np.int64))
    return np.concatenate(values), np.concatenate(lengths)


@pytest.mark.parametrize("pad", [False, True])
def test_handed_over_values_and_lengths_equal_the_rows(shared_export: Path, testdata: Any,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       pad: bool) -> None:
    monkeypatch.setattr(tl, "_keyed_jagged_class", lambda: _Recorder)
    table = testdata.read_all(shared_export)
    loader = Loader(shared_export, 300, seed=4, keyed_jagged=True, pad=pad, shuffle=True)
    assert loader.keyed_jagged_keys == ["C1", "tags"]  # the CATEGORICAL features, schema order
    n = 0
    for features, labels in loader:
        kjt = features[SPARSE_FEATURES]
        assert sorted(features) == ["I1", "row_id", SPARSE_FEATURES, "weights"]
        assert kjt.keys == ["C1", "tags"]
        want_values, want_lengths = expected_parts(table, features["row_id"].numpy(), ["C1", "tags"])
        assert kjt.values.dtype == torch.int64 and kjt.lengths.dtype == torch.int32
        np.testing.assert_array_equal(kjt.values.numpy(), want_values)
        np.testing.assert_array_equal(kjt.lengths.numpy(), want_lengths)
        n += len(labels)
    assert n == testdata.N


def test_named_keys_and_the_rest_unchanged(shared_export: Path, testdata: Any,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tl, "_keyed_jagged_class", lambda: _Recorder)
    table = testdata.read_all(shared_export)
    plain = Loader(shared_export, 500, seed=1, shuffle=True)
    keyed = Loader(shared_export, 500, seed=1, keyed_jagged=["tags"], shuffle=True)
    for (f0, l0), (f1, l1) in zip(plain, keyed, strict=True):
        assert torch.equal(f0["C1"], f1["C1"]) and torch.equal(l0, l1)
        want_values, want_lengths = expected_parts(table, f1["row_id"].numpy(), ["tags"])
        np.testing.assert_array_equal(f1[SPARSE_FEATURES].values.numpy(), want_values)
        np.testing.assert_array_equal(f1[SPARSE_FEATURES].lengths.numpy(), want_lengths)


def test_jagged_parts_of_each_layout() -> None:
    features = {"a": torch.tensor([7, 3, 9]),
                "r": (torch.tensor([4, 5, 6]), torch.tensor([0, 2, 2, 3])),
                "p": (torch.tensor([[4, 5], [0, 0], [6, 0]]),
                      torch.tensor([[True, True], [False, False], [True, False]]))}
    values, lengths = jagged_parts(features, ["a", "r", "p"])
    assert values.tolist() == [7, 3, 9] + [4, 5, 6] + [4, 5, 6]
    assert lengths.tolist() == [1, 1, 1] + [2, 0, 1] + [2, 0, 1]


def test_bad_requests(shared_export: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tl, "_keyed_jagged_class", lambda: _Recorder)
    with pytest.raises(ValueError, match=r"keyed_jagged=\['C9'\]: \['C9'\] not among the "
                                         r"loader's features \['row_id', 'C1', 'I1'"):
        Loader(shared_export, 10, keyed_jagged=["C9"], shuffle=True)
    with pytest.raises(TypeError, match="keyed_jagged must be a bool or a list of feature "
                                        "names, got str"):
        Loader(shared_export, 10, keyed_jagged="C1", shuffle=True)
    with pytest.raises(ValueError, match=r"keyed_jagged=True but none of the features \['I1'\] "
                                         "is tagged CATEGORICAL"):
        Loader(shared_export, 10, keyed_jagged=True, features=["I1"], shuffle=True)
    with pytest.raises(ValueError, match=r"keyed_jagged: feature 'n' is a list of lists"):
        jagged_parts({"n": (torch.tensor([1]), torch.tensor([0, 1]), torch.tensor([0, 1]))}, ["n"])
    with pytest.raises(ValueError, match=r"keyed_jagged: feature 'x' has shape \(2, 3\)"):
        jagged_parts({"x": torch.zeros((2, 3), dtype=torch.int64)}, ["x"])


def test_without_torchrec_the_error_says_how_to_install(shared_export: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchrec.sparse.jagged_tensor", None)
    with pytest.raises(ImportError, match=r"keyed_jagged=True needs torchrec \(not a tabstream "
                                          r"dependency\).*fbgemm-gpu-cpu==1.8.0"):
        Loader(shared_export, 10, keyed_jagged=True, shuffle=True)


def test_real_keyed_jagged_tensor(shared_export: Path, testdata: Any) -> None:
    jt = pytest.importorskip("torchrec.sparse.jagged_tensor")
    table = testdata.read_all(shared_export)
    loader = Loader(shared_export, 400, seed=7, keyed_jagged=True, shuffle=True)
    for features, _ in loader:
        kjt = features[SPARSE_FEATURES]
        assert isinstance(kjt, jt.KeyedJaggedTensor)
        assert kjt.keys() == ["C1", "tags"] and kjt.stride() == len(features["row_id"])
        rows = table.take(features["row_id"].numpy())
        per_key = kjt.to_dict()
        np.testing.assert_array_equal(per_key["C1"].values().numpy(), rows["C1"].to_numpy())
        np.testing.assert_array_equal(per_key["tags"].values().numpy(),
                                      pc.list_flatten(rows["tags"]).to_numpy())
        want_offsets = np.concatenate([[0], np.cumsum(pc.list_value_length(rows["tags"]).to_numpy())])
        np.testing.assert_array_equal(per_key["tags"].offsets().numpy(), want_offsets)

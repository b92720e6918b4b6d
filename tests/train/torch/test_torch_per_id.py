"""Per-id lookups (combiner=None) and pooled lists of lists, against a numpy gather."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tabstream.train.tables import TableConfig  # noqa: E402
from tabstream.train.torch import EmbeddingTables  # noqa: E402


def _tables(combiner, sparse=False):
    return EmbeddingTables([TableConfig("t", 30, 4, ("x",), is_list=True, combiner=combiner),
                            TableConfig("u", 9, 4, ("y",))], sparse=sparse)


def _ragged(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 5, 7)
    lengths[2] = 0
    values = rng.integers(0, 30, lengths.sum())   # id 0 is a real id
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return values, offsets, lengths


@pytest.mark.parametrize("seed", [0, 1])
def test_ragged_per_id_matches_numpy_gather(seed):
    tables = _tables(None)
    values, offsets, lengths = _ragged(seed)
    out = tables({"x": (torch.from_numpy(values), torch.from_numpy(offsets)),
                  "y": torch.tensor([1, 2, 3, 4, 5, 6, 0])})
    vectors, mask = out["x"]
    table = tables["t"].weight.detach().numpy()
    width = lengths.max()
    assert vectors.shape == (7, width, 4) and mask.shape == (7, width)
    for row in range(7):
        ids = values[offsets[row]:offsets[row + 1]]
        assert mask[row].tolist() == [True] * len(ids) + [False] * (width - len(ids))
        np.testing.assert_allclose(vectors[row, :len(ids)].detach().numpy(), table[ids])
        assert not vectors[row, len(ids):].detach().numpy().any()
    assert out["y"].shape == (7, 4)   # single-hot stays (B, dim)


def test_padded_and_nested_per_id_match_numpy_and_padding_gets_no_gradient():
    tables = _tables(None, sparse=True)
    rng = np.random.default_rng(3)
    ids = rng.integers(0, 30, (5, 3, 4))
    mask = rng.random((5, 3, 4)) < 0.6
    ids[~mask] = 29   # a padded slot's id must not be looked up
    vectors, got_mask = tables({"x": (torch.from_numpy(ids), torch.from_numpy(mask)),
                                "y": torch.zeros(5, dtype=torch.long)})["x"]
    table = tables["t"].weight.detach().numpy()
    want = np.where(mask[..., None], table[ids], 0.0)
    np.testing.assert_allclose(vectors.detach().numpy(), want, rtol=1e-6)
    assert torch.equal(got_mask, torch.from_numpy(mask))
    vectors.sum().backward()
    grad = tables["t"].weight.grad.coalesce()
    touched = set(grad.indices()[0].tolist())
    assert touched == set(ids[mask].tolist())


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_nested_padded_pools_each_inner_list(combiner):
    tables = _tables(combiner)
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 30, (6, 2, 3))
    mask = rng.random((6, 2, 3)) < 0.5
    pooled = tables({"x": (torch.from_numpy(ids), torch.from_numpy(mask)),
                     "y": torch.zeros(6, dtype=torch.long)})["x"].detach().numpy()
    table = tables["t"].weight.detach().numpy()
    assert pooled.shape == (6, 2, 4)
    for b in range(6):
        for f in range(2):
            rows = table[ids[b, f][mask[b, f]]]
            want = rows.sum(0) if combiner == "sum" else (
                rows.mean(0) if len(rows) else np.zeros(4))
            np.testing.assert_allclose(pooled[b, f], want, rtol=1e-5, atol=1e-7)


def test_nested_ragged_input_is_refused_with_a_hint():
    tables = _tables("sum")
    x = (torch.tensor([1, 2]), torch.tensor([0, 1]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"feature 'x': a tuple input must be \(values, "
                                         r"offsets\) or \(padded, mask\), got 3 items; for a "
                                         r"list of lists .*pad=\{'x': \(F, L\)\}"):
        tables({"x": x, "y": torch.zeros(1, dtype=torch.long)})


def test_bad_combiner_names_the_choices():
    with pytest.raises(ValueError, match=r"table 't': combiner must be 'sum', 'mean' or None "
                                         r"\(one vector per id\), got 'max'"):
        TableConfig("t", 3, 4, ("x",), combiner="max")

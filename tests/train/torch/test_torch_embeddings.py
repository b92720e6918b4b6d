import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch_data import categorical, continuous  # noqa: E402

from tabstream.core.errors import SchemaError  # noqa: E402
from tabstream.core.schema import Schema, Tags  # noqa: E402
from tabstream.train.tables import table_configs_from_schema  # noqa: E402
from tabstream.train.torch import (  # noqa: E402
    EmbeddingTables,
    embedding_tables_from_schema,
    split_embeddings_on_size,
)


def expected_dim(cardinality, multiplier=2.0):
    # the formula, spelled out a second way: grow the floored value to a multiple of 8
    d = int(cardinality**0.25 * multiplier)
    while d % 8:
        d += 1
    return max(d, 8)


@pytest.mark.parametrize("multiplier", [2.0, 4.0])
def test_inferred_dims_follow_the_formula(multiplier):
    cards = {"a": 5, "b": 100, "c": 12_345, "d": 50_000, "e": 4096}
    schema = Schema([categorical(n, c) for n, c in cards.items()] + [continuous("x")])
    tables = embedding_tables_from_schema(schema, multiplier=multiplier)
    assert sorted(tables.keys()) == sorted(cards)
    for name, card in cards.items():
        assert tables[name].num_embeddings == card
        assert tables[name].embedding_dim == expected_dim(card, multiplier)
    assert expected_dim(1_000_000) == 64  # floor(31.6 * 2) = 63 -> 64


def test_fixed_dim_targets_left_out_and_configs_untouched():
    label = categorical("label", 2, [Tags.TARGET])
    schema = Schema([categorical("a", 50), categorical("b", 70), label])
    tables = embedding_tables_from_schema(schema, dim=12)
    assert sorted(tables.keys()) == ["a", "b"]
    assert {tables[k].embedding_dim for k in tables} == {12}
    configs = table_configs_from_schema(schema.without(["label"]), dim=12)
    assert list(tables.configs) == configs


def test_sparse_threshold_and_overrides():
    schema = Schema([categorical("small", 999), categorical("large", 1000)])
    auto = embedding_tables_from_schema(schema, dim=8, sparse_threshold=1000)
    assert (auto["small"].sparse, auto["large"].sparse) == (False, True)
    assert all(t.sparse for t in embedding_tables_from_schema(schema, dim=8, sparse=True).values())
    assert not any(t.sparse for t in embedding_tables_from_schema(schema, dim=8, sparse=False).values())


def _ragged(rng, batch, card, max_len):
    lengths = rng.integers(0, max_len + 1, batch)
    lengths[0] = 0  # always one empty row
    values = rng.integers(0, card, lengths.sum())
    values[:2] = 0  # id 0 is a real id: it must be looked up wherever it occurs
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return values, offsets


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("seed", [0, 1])
def test_pooled_multi_hot_equals_numpy(combiner, seed):
    rng = np.random.default_rng(seed)
    schema = Schema([categorical("tags", 30, is_list=True), categorical("item", 40)])
    tables = embedding_tables_from_schema(schema, dim=8, combiner=combiner)
    values, offsets = _ragged(rng, 16, 30, 5)
    items = rng.integers(0, 40, 16)
    out = tables({
        "tags": (torch.as_tensor(values), torch.as_tensor(offsets)),
        "item": torch.as_tensor(items),
    })
    w_tags = tables["tags"].weight.detach().numpy()
    expected = np.zeros((16, 8), dtype=np.float64)
    for row in range(16):
        rows = w_tags[values[offsets[row]:offsets[row + 1]]]
        if len(rows):
            expected[row] = rows.sum(0) if combiner == "sum" else rows.mean(0)
    np.testing.assert_allclose(out["tags"].detach().numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(out["item"].detach().numpy(), tables["item"].weight.detach().numpy()[items])

    # the same lists padded with 0 plus their mask (as a tuple, as the key tags__mask,
    # as 0/1), and as name__values/name__offsets
    width = int(np.diff(offsets).max()) + 1
    padded = np.zeros((16, width), dtype=np.int64)
    mask = np.zeros((16, width), dtype=bool)
    for row in range(16):
        seg = values[offsets[row]:offsets[row + 1]]
        padded[row, :len(seg)] = seg
        mask[row, :len(seg)] = True
    assert (padded[mask] == 0).any() and (padded[~mask] == 0).all()
    padded_t, mask_t = torch.as_tensor(padded), torch.as_tensor(mask)
    for form in (
        {"tags": (padded_t, mask_t)},
        {"tags": (padded_t, mask_t.to(torch.int32))},
        {"tags": padded_t, "tags__mask": mask_t},
        {"tags__values": torch.as_tensor(values), "tags__offsets": torch.as_tensor(offsets)},
    ):
        got = tables({**form, "item": torch.as_tensor(items)})["tags"]
        np.testing.assert_allclose(got.detach().numpy(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sparse", [True, False])
def test_gradients_count_occurrences(sparse):
    rng = np.random.default_rng(3)
    schema = Schema([categorical("tags", 20, is_list=True), categorical("item", 20)])
    tables = embedding_tables_from_schema(schema, dim=8, sparse=sparse)
    values, offsets = _ragged(rng, 32, 20, 6)
    items = rng.integers(0, 20, 32)
    out = tables({"tags": (torch.as_tensor(values), torch.as_tensor(offsets)),
                  "item": torch.as_tensor(items).reshape(-1, 1)})
    (out["tags"].sum() + out["item"].sum()).backward()
    for name, ids in (("tags", values), ("item", items)):
        grad = tables[name].weight.grad
        assert grad.is_sparse == sparse
        dense = grad.to_dense() if sparse else grad
        # d(sum of pooled sums)/d(row r) = (number of times r was looked up) in every column
        expected = np.repeat(np.bincount(ids, minlength=20)[:, None], 8, axis=1)
        np.testing.assert_array_equal(dense.numpy(), expected)


@pytest.mark.parametrize("combiner", ["sum", "mean"])
def test_padded_positions_get_no_gradient_and_real_zero_ids_do(combiner):
    # A sparse gradient with (zero-valued) entries for the padded slots would still move
    # row 0 under a lazy Adam (momentum); only the real positions may appear in it.
    schema = Schema([categorical("tags", 10, is_list=True)])
    tables = embedding_tables_from_schema(schema, dim=4, sparse=True, combiner=combiner)
    # the masked-out slots hold 7, which must not show up anywhere (value or gradient)
    padded = torch.tensor([[3, 7, 7], [0, 5, 7], [7, 7, 7]])
    mask = torch.tensor([[True, False, False], [True, True, False], [False, False, False]])
    out = tables({"tags": (padded, mask)})["tags"]
    weights = tables["tags"].weight.detach().numpy()
    per_row = [[3], [0, 5], []]
    expected = np.zeros((3, 4))
    for i, ids in enumerate(per_row):
        if ids:
            expected[i] = weights[ids].sum(0) if combiner == "sum" else weights[ids].mean(0)
    np.testing.assert_allclose(out.detach().numpy(), expected, rtol=1e-6)  # empty row: zeros
    out.sum().backward()
    grad = tables["tags"].weight.grad.coalesce()
    assert sorted(grad.indices()[0].tolist()) == [0, 3, 5]
    scale = {"sum": [1.0, 1.0, 1.0], "mean": [0.5, 1.0, 0.5]}[combiner]  # rows 0, 3, 5
    np.testing.assert_allclose(grad.values().numpy(), np.repeat(np.array(scale)[:, None], 4, 1))


def test_scalar_id_zero_is_a_real_row():
    tables = embedding_tables_from_schema(Schema([categorical("item", 6)]), dim=4)
    ids = np.array([0, 2, 0, 5])
    for x in (torch.as_tensor(ids), torch.as_tensor(ids).reshape(-1, 1)):
        out = tables({"item": x})["item"].detach().numpy()
        np.testing.assert_array_equal(out, tables["item"].weight.detach().numpy()[ids])
        assert np.abs(out[0]).sum() > 0


def test_shared_vocabulary_is_one_table():
    a = categorical("src", 10).with_properties(domain={"min": 0, "max": 9, "name": "station"})
    b = categorical("dst", 12).with_properties(domain={"min": 0, "max": 11, "name": "station"})
    tables = embedding_tables_from_schema(Schema([a, b]), dim=8)
    assert list(tables.keys()) == ["station"]
    assert tables["station"].num_embeddings == 12
    out = tables({"src": torch.tensor([3]), "dst": torch.tensor([3])})
    assert torch.equal(out["src"], out["dst"])


def test_missing_and_misshapen_features_raise():
    tables = embedding_tables_from_schema(Schema([categorical("a", 10), categorical("b", 10)]), dim=8)
    with pytest.raises(SchemaError, match=r"categorical feature 'b' .* missing .* \['a'\]"):
        tables({"a": torch.tensor([1])})
    with pytest.raises(ValueError, match=r"'b' is not a list column .* shape \(2, 3\)"):
        tables({"a": torch.tensor([1, 2]), "b": torch.ones(2, 3, dtype=torch.long)})
    lists = embedding_tables_from_schema(Schema([categorical("tags", 10, is_list=True)]), dim=8)
    with pytest.raises(ValueError, match=r"list feature 'tags' arrived as padded ids of shape "
                       r"\(2, 3\) without a mask; id 0 is a real id.*'tags__mask'"):
        lists({"tags": torch.tensor([[1, 0, 0], [2, 3, 0]])})
    with pytest.raises(ValueError, match=r"'tags': padded ids \(2, 3\) and mask \(2, 2\) differ"):
        lists({"tags": (torch.ones(2, 3, dtype=torch.long), torch.ones(2, 2, dtype=torch.bool))})
    with pytest.raises(TypeError, match="expected an int64 tensor"):
        tables({"a": torch.tensor([1]), "b": [1]})


def test_split_embeddings_on_size():
    cards = {"a": 10, "b": 1000, "c": 1001, "d": 50_000}
    schema = Schema([categorical(n, c) for n, c in cards.items()])
    configs = table_configs_from_schema(schema, dim=8)
    large, small = split_embeddings_on_size(configs, threshold=1000)
    assert [c.name for c in large] == [n for n, c in cards.items() if c >= 1000]
    assert [c.name for c in small] == [n for n, c in cards.items() if c < 1000]

    tables = EmbeddingTables(configs)
    model = torch.nn.Sequential(tables, torch.nn.Linear(3, 1))
    for container in (tables, model, list(tables.values())):
        large_m, small_m = split_embeddings_on_size(container, threshold=1000)
        assert large_m == [tables["b"], tables["c"], tables["d"]]
        assert small_m == [tables["a"]]
    with pytest.raises(TypeError, match="threshold must be an int"):
        split_embeddings_on_size(configs, threshold=1e3)
    with pytest.raises(TypeError, match="got Linear"):
        split_embeddings_on_size([torch.nn.Linear(2, 2)], threshold=10)


def test_table_names_that_clash_with_module_attributes():
    schema = Schema([categorical("items", 10), categorical("type", 12), categorical("user", 5)])
    tables = embedding_tables_from_schema(schema, dim=8)
    assert tables.table_names == ["items", "type", "user"]
    assert [tables[n].num_embeddings for n in tables.table_names] == [10, 12, 5]
    assert "items" in tables and "nope" not in tables
    assert sorted(tables.state_dict()) == ["items_.weight", "type_.weight", "user.weight"]
    out = tables({"items": torch.tensor([1]), "type": torch.tensor([2]), "user": torch.tensor([3])})
    assert torch.equal(out["items"][0], tables["items"].weight[1])

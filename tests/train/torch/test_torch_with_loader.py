"""fit and the models on batches from the real tabstream torch loader."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
loaders = pytest.importorskip("tabstream.loaders.torch")

from torch_data import ranking_rows, ranking_schema, target  # noqa: E402

from tabstream.train.torch import DLRM, LazyAdam, fit  # noqa: E402


def write_export(path, columns, values, lengths, y):
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    table = pa.table({
        **{k: pa.array(v) for k, v in columns.items()},
        "tags": pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)),
        "click": pa.array(y.astype(np.int64)),
    })
    path.mkdir()
    pq.write_table(table, path / "part_0.parquet", row_group_size=1024)
    # int64 labels, as a Categorify'd or raw click column would be
    ranking_schema().replace(target().with_dtype("int64")).to_json(str(path / "schema.json"))
    return path


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """8,192 training and 4,096 validation rows of one hidden model."""
    root = tmp_path_factory.mktemp("export")
    columns, (values, lengths), y, _ = ranking_rows(0, 12_288)
    offsets = np.r_[0, np.cumsum(lengths)]

    def rows(lo, hi):
        cols = {k: c[lo:hi] for k, c in columns.items()}
        return cols, values[offsets[lo]:offsets[hi]], lengths[lo:hi], y[lo:hi]

    return (write_export(root / "train", *rows(0, 8192)),
            write_export(root / "valid", *rows(8192, 12_288)))


def test_dlrm_trains_from_the_loader(export):
    train, valid = export
    torch.manual_seed(0)
    model = DLRM(ranking_schema(), embedding_dim=8)
    history = fit(model, loaders.Loader(str(train), batch_size=256, seed=0, shuffle=True),
                  LazyAdam(model.parameters(), lr=5e-3), epochs=2,
                  valid_loader=loaders.Loader(str(valid), batch_size=1024, shuffle=False),
                  progress=False)
    assert history["samples"] == [8192, 8192]
    assert history["val_auc"][-1] >= 0.70  # constant predictor: 0.5; true probabilities: ~0.83


def test_ragged_and_padded_lists_give_the_same_logits(export):
    _, valid = export
    torch.manual_seed(0)
    model = DLRM(ranking_schema(), embedding_dim=8)
    ragged = loaders.Loader(str(valid), batch_size=512, shuffle=False)
    padded = loaders.Loader(str(valid), batch_size=512, shuffle=False, pad={"tags": 3})
    (f_ragged, _), (f_padded, _) = next(iter(ragged)), next(iter(padded))
    assert isinstance(f_ragged["tags"], tuple) and f_padded["tags"][0].dim() == 2
    with torch.no_grad():
        torch.testing.assert_close(model(f_ragged), model(f_padded))


@pytest.mark.parametrize("combiner", ["sum", "mean"])
@pytest.mark.parametrize("pad", [None, {"tags": 3}, {"tags": 2}], ids=["ragged", "padded", "cut"])
def test_pooled_tables_on_loader_batches_equal_numpy(export, pad, combiner):
    """Id 0 is a real id in every column here; only the loader's mask (or the ragged
    offsets) says what is padding. pad={"tags": 2} cuts lists to their first 2 ids."""
    from tabstream.train.torch import embedding_tables_from_schema

    _, valid = export
    table = pq.read_table(valid / "part_0.parquet")
    lists = [row[:pad["tags"]] if pad else row for row in table["tags"].to_pylist()]
    c_small = table["c_small"].to_numpy()
    assert any(0 in row for row in lists) and (c_small == 0).any()
    torch.manual_seed(0)
    tables = embedding_tables_from_schema(ranking_schema(), dim=8, combiner=combiner)
    w_tags = tables["tags"].weight.detach().numpy().astype(np.float64)
    w_small = tables["c_small"].weight.detach().numpy()
    expected = np.zeros((len(lists), 8))
    for i, row in enumerate(lists):
        if row:
            expected[i] = w_tags[row].sum(0) if combiner == "sum" else w_tags[row].mean(0)
    loader = loaders.Loader(str(valid), batch_size=500, shuffle=False, pad=pad or False)
    seen = 0
    with torch.no_grad():
        for features, _ in loader:
            out = tables(features)
            n = out["tags"].shape[0]
            np.testing.assert_allclose(out["tags"].numpy(), expected[seen:seen + n],
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_array_equal(out["c_small"].numpy(), w_small[c_small[seen:seen + n]])
            seen += n
    assert seen == len(lists)


@pytest.mark.parametrize("name", ["DLRM", "DCN", "WideAndDeep"])
def test_models_train_on_padded_loader_batches(export, name):
    from tabstream.train import torch as ttorch

    train, valid = export
    torch.manual_seed(0)
    model = getattr(ttorch, name)(ranking_schema())
    ragged = loaders.Loader(str(valid), batch_size=1024, shuffle=False)
    padded = loaders.Loader(str(valid), batch_size=1024, shuffle=False, pad={"tags": 3})
    with torch.no_grad():
        for (f_ragged, _), (f_padded, _) in zip(ragged, padded, strict=True):
            torch.testing.assert_close(model(f_ragged), model(f_padded))
    history = fit(model, loaders.Loader(str(train), batch_size=512, seed=0, pad={"tags": 3},
                                        shuffle=True),
                  LazyAdam(model.parameters(), lr=5e-3), progress=False)
    assert history["samples"] == [8192] and np.isfinite(history["loss"][0])


def test_two_tower_with_a_list_feature_on_padded_loader_batches(export):
    from tabstream.core.schema import Tags
    from tabstream.train.torch import TwoTower

    train, valid = export
    base = ranking_schema()
    schema = base
    for name, tag in (("c_small", Tags.USER), ("tags", Tags.USER), ("c_mid", Tags.ITEM_ID)):
        schema = schema.replace(base[name].with_tags([*base[name].tags, tag]))
    torch.manual_seed(0)
    model = TwoTower(schema, output_dim=8, embedding_dim=8)
    ragged = loaders.Loader(str(valid), batch_size=1024, shuffle=False)
    padded = loaders.Loader(str(valid), batch_size=1024, shuffle=False, pad={"tags": 3})
    with torch.no_grad():
        for (f_ragged, _), (f_padded, _) in zip(ragged, padded, strict=True):
            torch.testing.assert_close(model.query_embeddings(f_ragged),
                                       model.query_embeddings(f_padded))
    history = fit(model, loaders.Loader(str(train), batch_size=512, seed=0, pad={"tags": 3},
                                        shuffle=True),
                  LazyAdam(model.parameters(), lr=5e-3), progress=False)
    assert history["samples"] == [8192] and np.isfinite(history["loss"][0])

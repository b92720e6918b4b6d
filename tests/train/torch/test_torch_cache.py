"""CachedEmbeddings: same results as in-memory tables, bounded cache, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_data import categorical, continuous, target

from tabstream.core.errors import DataError, SchemaError
from tabstream.core.schema import Schema, Tags
from tabstream.train.tables import TableConfig
from tabstream.train.torch import (
    DCN,
    DLRM,
    CachedEmbeddings,
    EmbeddingTables,
    LazyAdam,
    ParameterServer,
    TwoTower,
    WideAndDeep,
    fit,
    table_configs_from_schema,
)


def schema():
    return Schema([categorical("C1", 40), categorical("C2", 25, is_list=True), continuous("I1"),
                   target()])


def make_batches(seed, n_batches=6, batch=16, layout="ragged"):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        lengths = rng.integers(0, 4, batch)
        values = torch.as_tensor(rng.integers(0, 25, lengths.sum()))
        offsets = torch.as_tensor(np.concatenate([[0], np.cumsum(lengths)]))
        features = {"C1": torch.as_tensor(rng.integers(0, 40, batch)),
                    "I1": torch.as_tensor(rng.normal(size=batch), dtype=torch.float32)}
        if layout == "ragged":
            features["C2"] = (values, offsets)
        else:
            width = 3
            padded = torch.zeros((batch, width), dtype=torch.long)
            mask = torch.arange(width)[None, :] < torch.as_tensor(lengths)[:, None]
            padded[mask] = values
            features["C2"] = (padded, mask)
        labels = torch.as_tensor(rng.integers(0, 2, batch), dtype=torch.float32)
        out.append((features, labels))
    return out


def twin_models(tmp_path, optimizer, storage, cache_rows, combiner="sum", model_cls=DLRM,
                schema=schema, **kw):
    """A cached model and an in-memory model with the same initial parameters."""
    if model_cls is WideAndDeep:  # its wide tables train from the server too
        configs = WideAndDeep.table_configs(schema().without(["click"]), 8, combiner=combiner)
    else:
        configs = table_configs_from_schema(schema().without(["click"]), dim=8, combiner=combiner)
    ps = ParameterServer(tmp_path / "ps", configs, storage=storage, optimizer=optimizer, lr=0.1)
    torch.manual_seed(0)
    cached = model_cls(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps, cache_rows), **kw)
    torch.manual_seed(1)
    plain = model_cls(schema(), embedding_dim=8, sparse=True, combiner=combiner, **kw)
    dense = {k: v for k, v in cached.state_dict().items() if not k.endswith("ps_version")}
    missing, _ = plain.load_state_dict(dense, strict=False)
    # the tables the cached model serves from the server (WideAndDeep's 1-wide
    # wide tables are <table>_wide there)
    tables = [(m, "_wide" if name.startswith("wide_inputs") else "")
              for name, m in plain.named_modules() if isinstance(m, EmbeddingTables)
              and f"{name}.{m.table_names[0]}.weight" in missing]
    with torch.no_grad():
        for t, suffix in tables:
            for cfg in t.configs:
                rows = ps.lookup(cfg.name + suffix, np.arange(cfg.cardinality))
                t[cfg.name].weight.copy_(torch.from_numpy(rows))
    return ps, cached, plain, [t for t, _ in tables]


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
@pytest.mark.parametrize("storage,cache_rows,layout", [("memory", 1000, "ragged"),
                                                       ("disk", 5, "padded")])
def test_training_through_the_cache_equals_training_in_memory(tmp_path, optimizer, storage,
                                                               cache_rows, layout):
    ps, cached, plain, tables = twin_models(tmp_path, optimizer, storage, cache_rows)
    table_params = [t[c.name].weight for t in tables for c in t.configs]
    table_ids = {id(p) for p in table_params}
    if optimizer == "adagrad":
        sparse_opt = torch.optim.Adagrad(table_params, lr=0.1)
    else:
        sparse_opt = LazyAdam(table_params, lr=0.1)
    dense_plain = torch.optim.SGD([p for p in plain.parameters() if id(p) not in table_ids], lr=0.05)
    dense_cached = torch.optim.SGD(cached.parameters(), lr=0.05)
    for features, labels in make_batches(0, layout=layout):
        for model, opts in ((cached, [dense_cached]), (plain, [dense_plain, sparse_opt])):
            for o in opts:
                o.zero_grad()
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(features), labels)
            loss.backward()
            with torch.sparse.check_sparse_tensor_invariants(enable=True):  # torch's Adagrad warns otherwise
                for o in opts:
                    o.step()
    for t in tables:
        for cfg in t.configs:
            np.testing.assert_allclose(ps.lookup(cfg.name, np.arange(cfg.cardinality)),
                                       t[cfg.name].weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    plain_state = plain.state_dict()
    for k, v in cached.state_dict().items():
        if not k.endswith("ps_version"):
            torch.testing.assert_close(v, plain_state[k], rtol=1e-5, atol=1e-6)
    # the cache held no more rows than allowed; adam/adagrad state only for touched rows
    emb = cached.inputs.embeddings
    assert all(n <= cache_rows for n in emb.cached_rows.values())
    touched = ps.touched("C1")
    assert len(touched) < 40
    untouched = np.setdiff1d(np.arange(40), touched)
    assert not ps.optimizer_state("C1", untouched).any()


@pytest.mark.parametrize("model_cls,kw", [(DCN, {"deep": (8,)}), (WideAndDeep, {"deep": (8,)})])
def test_other_bundled_models_take_cached_embeddings(tmp_path, model_cls, kw):
    ps, cached, plain, tables = twin_models(tmp_path, "adagrad", "memory", 100,
                                            combiner="mean", model_cls=model_cls, **kw)
    features, _ = make_batches(1, n_batches=1)[0]
    with torch.no_grad():
        torch.testing.assert_close(cached(features), plain(features))


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_wide_and_deep_trains_its_wide_tables_in_the_server(tmp_path, optimizer):
    """Deep and wide tables of one feature live in one server; training equals the
    in-memory model and export_delta holds the wide rows too."""
    ps, cached, plain, tables = twin_models(tmp_path, optimizer, "disk", 6, combiner="mean",
                                            model_cls=WideAndDeep, deep=(8,))
    assert {c.name for c in ps.configs} == {"C1", "C2", "C1_wide", "C2_wide"}
    by_module = {}
    for name, m in plain.named_modules():
        if isinstance(m, EmbeddingTables) and m in tables:
            by_module[name] = m
    assert sorted(by_module) == ["deep_inputs.embeddings", "wide_inputs.embeddings"]
    table_params = [t[c.name].weight for t in tables for c in t.configs]
    table_ids = {id(p) for p in table_params}
    sparse_opt = (torch.optim.Adagrad if optimizer == "adagrad" else LazyAdam)(table_params, lr=0.1)
    dense_plain = torch.optim.SGD([p for p in plain.parameters() if id(p) not in table_ids], lr=0.05)
    dense_cached = torch.optim.SGD(cached.parameters(), lr=0.05)
    for features, labels in make_batches(4, n_batches=4):
        for model, opts in ((cached, [dense_cached]), (plain, [dense_plain, sparse_opt])):
            for o in opts:
                o.zero_grad()
            torch.nn.functional.binary_cross_entropy_with_logits(model(features), labels).backward()
            with torch.sparse.check_sparse_tensor_invariants(enable=True):
                for o in opts:
                    o.step()
    for name, t in by_module.items():
        suffix = "_wide" if name.startswith("wide") else ""
        for cfg in t.configs:
            np.testing.assert_allclose(ps.lookup(cfg.name + suffix, np.arange(cfg.cardinality)),
                                       t[cfg.name].weight.detach().numpy(), rtol=1e-5, atol=1e-6)
    counts = ps.export_delta(tmp_path / "delta")
    assert counts["C1_wide"] == len(ps.touched("C1_wide")) > 0
    assert counts["C1_wide"] == counts["C1"]  # one lookup per id in each part
    # a server without the wide tables is refused: they would train outside it
    deep_only = ParameterServer(tmp_path / "ps2", table_configs_from_schema(
        schema().without(["click"]), dim=8), storage="memory")
    with pytest.raises(SchemaError, match=r"WideAndDeep: embeddings= serves the deep tables from "
                                          r"parameter server .*ps2, which has no wide tables "
                                          r"\['C1_wide', 'C2_wide'\].*WideAndDeep.table_configs"):
        WideAndDeep(schema(), embedding_dim=8, embeddings=CachedEmbeddings(deep_only, 10))


def two_tower_schema():
    return Schema([categorical("C1", 40, [Tags.USER_ID]), categorical("C2", 25, [Tags.USER], is_list=True),
                   continuous("I1", [Tags.USER]), categorical("item", 30, [Tags.ITEM_ID]), target()])


@pytest.mark.parametrize("optimizer,storage,cache_rows", [("adagrad", "memory", 1000),
                                                          ("adam", "disk", 5)])
def test_two_tower_trained_through_the_cache_equals_training_in_memory(tmp_path, optimizer,
                                                                        storage, cache_rows):
    ps, cached, plain, tables = twin_models(tmp_path, optimizer, storage, cache_rows,
                                            model_cls=TwoTower, schema=two_tower_schema,
                                            query_tower=(8,), item_tower=(8,), output_dim=4)
    assert {c.name for t in tables for c in t.configs} == {"C1", "C2", "item"}
    table_params = [t[c.name].weight for t in tables for c in t.configs]
    table_ids = {id(p) for p in table_params}
    sparse_opt = (torch.optim.Adagrad if optimizer == "adagrad" else LazyAdam)(table_params, lr=0.1)
    dense_plain = torch.optim.SGD([p for p in plain.parameters() if id(p) not in table_ids], lr=0.05)
    dense_cached = torch.optim.SGD(cached.parameters(), lr=0.05)
    rng = np.random.default_rng(3)
    for features, labels in make_batches(0, n_batches=4):
        features["item"] = torch.as_tensor(rng.integers(0, 30, len(labels)))
        for model, opts in ((cached, [dense_cached]), (plain, [dense_plain, sparse_opt])):
            for o in opts:
                o.zero_grad()
            model.compute_loss(features, labels).backward()
            with torch.sparse.check_sparse_tensor_invariants(enable=True):
                for o in opts:
                    o.step()
    # atol 1e-5: Adam's g / sqrt(v) step (0.1 per step here) turns float rounding in
    # the normalized towers' gradients into differences of about 1e-6
    for t in tables:
        for cfg in t.configs:
            np.testing.assert_allclose(ps.lookup(cfg.name, np.arange(cfg.cardinality)),
                                       t[cfg.name].weight.detach().numpy(), rtol=1e-5, atol=1e-5)
    plain_state = plain.state_dict()
    for k, v in cached.state_dict().items():
        if not k.endswith("ps_version"):
            torch.testing.assert_close(v, plain_state[k], rtol=1e-5, atol=1e-5)
    # one module holds the rows for both towers, each tower looks up only its own features
    assert [k for k in cached.state_dict() if k.endswith("ps_version")] == ["embeddings.ps_version"]
    assert cached.query_tower.inputs.embeddings.feature_names == ["C1", "C2"]
    assert cached.item_tower.inputs.embeddings.feature_names == ["item"]
    assert all(n <= cache_rows for n in cached.embeddings.cached_rows.values())


def test_two_tower_refuses_embeddings_it_cannot_split(tmp_path):
    configs = table_configs_from_schema(two_tower_schema().without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    with pytest.raises(TypeError, match=r"TwoTower: embeddings= must offer subset\(feature_names\).*"
                                        r"got EmbeddingTables"):
        TwoTower(two_tower_schema(), embedding_dim=8,
                 embeddings=EmbeddingTables(configs))
    with pytest.raises(SchemaError, match=r"CachedEmbeddings.subset: features \['item'\] are not served"):
        TwoTower(two_tower_schema(), embedding_dim=8,
                 embeddings=CachedEmbeddings(ParameterServer(tmp_path / "ps2", configs[:2]), 10))
    # one vocabulary for a user and an item feature: two towers would step it twice
    shared = [TableConfig("ids", 40, 8, ("C1", "item")),
              *[c for c in configs if c.name == "C2"]]
    with pytest.raises(ValueError, match=r"TwoTower: embeddings= tables \['ids'\] serve both USER "
                                         r"and ITEM features"):
        TwoTower(two_tower_schema(), embedding_dim=8,
                 embeddings=CachedEmbeddings(ParameterServer(tmp_path / "ps3", shared), 10))
    del ps


def test_hit_rate_counts_cache_hits(tmp_path):
    configs = table_configs_from_schema(schema().without(["click"]), dim=4)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    emb = CachedEmbeddings(ps, cache_rows=3)
    emb({"C1": torch.tensor([1, 2, 1]), "C2": (torch.tensor([0]), torch.tensor([0, 1, 1, 1]))})
    emb({"C1": torch.tensor([2, 5]), "C2": (torch.tensor([0]), torch.tensor([0, 1]))})
    # distinct ids per batch and table: C1 {1,2} then {2,5}; C2 {0} then {0}
    assert emb.hit_rate == pytest.approx(2 / 6)
    out = emb({"C1": torch.tensor([7]), "C2": (torch.tensor([3, 4]), torch.tensor([0, 2]))})
    np.testing.assert_array_equal(out["C2"].detach().numpy()[0], ps.lookup("C2", [3, 4]).sum(0))
    np.testing.assert_array_equal(out["C1"].detach().numpy(), ps.lookup("C1", [7]))


def test_prefetch_fills_the_cache(tmp_path):
    configs = table_configs_from_schema(schema().without(["click"]), dim=4)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    emb = CachedEmbeddings(ps, cache_rows=4)
    ps.prefetch({"C1": [9, 3, 3, 30, 31, 32]})
    assert emb.cached_rows["C1"] == 4
    emb({"C1": torch.tensor([3, 9]), "C2": (torch.tensor([0]), torch.tensor([0, 1, 1]))})
    assert emb._caches["C1"].hits == 2


def test_bad_inputs(tmp_path):
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    with pytest.raises(TypeError, match="ps must be a ParameterServer, got dict"):
        CachedEmbeddings({})
    with pytest.raises(ValueError, match="cache_rows must be an int >= 1, got 0"):
        CachedEmbeddings(ps, cache_rows=0)
    emb = CachedEmbeddings(ps, 10)
    with pytest.raises(SchemaError, match="categorical feature 'C1' .* is missing from the batch"):
        emb({"C2": (torch.tensor([0]), torch.tensor([0, 1]))})
    with pytest.raises(ValueError, match="'C2' arrived as padded ids of shape \\(1, 2\\) without a mask"):
        emb({"C1": torch.tensor([1]), "C2": torch.tensor([[1, 2]])})
    with pytest.raises(ValueError, match="table 'C1': id 40 is out of range"):
        emb({"C1": torch.tensor([40]), "C2": (torch.tensor([0]), torch.tensor([0, 1]))})
    other = Schema([categorical("C1", 40), categorical("C9", 5), target()])
    with pytest.raises(SchemaError, match=r"missing \['C9'\], extra \['C2'\]"):
        DLRM(other, embedding_dim=8, embeddings=emb)
    with pytest.raises(ValueError, match="every embedding must be embedding_dim=16 wide"):
        DLRM(schema(), embedding_dim=16, embeddings=emb)


def test_fit_checkpoint_and_server_stay_together(tmp_path):
    """A checkpoint written just before the server's last commit rolls it back."""
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="disk", optimizer="adagrad", lr=0.1)
    torch.manual_seed(0)
    model = DLRM(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps, 100))
    data = make_batches(2, n_batches=4)
    fit(model, data, torch.optim.SGD(model.parameters(), lr=0.05), checkpoint_dir=tmp_path / "ck",
        progress=False)
    after_fit = ps.lookup("C1", np.arange(40))
    version = ps.version
    # more training, committed (as if a later checkpoint was about to be written)
    fit(model, data[:2], torch.optim.SGD(model.parameters(), lr=0.05), progress=False)
    ps.flush()
    assert ps.version > version
    ps.close()
    ps2 = ParameterServer.open(tmp_path / "ps")
    torch.manual_seed(0)
    model2 = DLRM(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps2, 100))
    ckpt = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    model2.load_state_dict(ckpt["model"])
    assert ps2.version == version
    np.testing.assert_array_equal(ps2.lookup("C1", np.arange(40)), after_fit)
    # a checkpoint from further back cannot be matched
    ckpt["model"]["inputs.embeddings.ps_version"] = torch.tensor(1)
    with pytest.raises(DataError, match="cannot go back to version 1"):
        model2.load_state_dict(ckpt["model"])


class Batches(list):
    """A list of batches that names its data, as a file list would."""

    def __init__(self, batches, data_id):
        super().__init__(batches)
        self.data_id = data_id


def test_fit_trains_each_new_file_list_as_a_new_pass(tmp_path):
    import warnings

    torch.manual_seed(0)
    model = DLRM(schema(), embedding_dim=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    days = [Batches(make_batches(s, n_batches=2), f"day{s}") for s in range(3)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NothingToTrainWarning
        for day in days:
            history = fit(model, day, opt, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)
    ckpt = torch.load(tmp_path / "ck" / "checkpoint.pt", weights_only=True)
    assert ckpt["data_pass"] == 2 and ckpt["data_id"] == "day2" and ckpt["global_step"] == 6
    assert len(history["loss"]) == 3
    # the same as training the three lists one after the other without checkpoints
    torch.manual_seed(0)
    reference = DLRM(schema(), embedding_dim=8)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    for day in days:
        fit(reference, day, ref_opt, progress=False)
    for k, v in reference.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v)
    # the same list again: already trained
    with pytest.warns(UserWarning, match="nothing to train"):
        fit(model, days[2], opt, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)


class Crashing(Batches):
    """Yields its batches, then fails before batch ``at`` (a crash mid-list)."""

    def __init__(self, batches, data_id, at):
        super().__init__(batches, data_id)
        self.at = at

    def __iter__(self):
        for i, batch in enumerate(list.__iter__(self)):
            if i == self.at:
                raise KeyboardInterrupt("crash")
            yield batch


def test_fit_refuses_another_file_list_while_one_is_unfinished(tmp_path):
    torch.manual_seed(0)
    model = DLRM(schema(), embedding_dim=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with pytest.raises(KeyboardInterrupt):
        fit(model, Crashing(make_batches(0, n_batches=4), "day0", at=3), opt,
            checkpoint_dir=tmp_path / "ck", checkpoint_every=1, progress=False)
    with pytest.raises(DataError, match=r"stopped inside another file list \(epoch 1, after 3 batches; "
                                        r"data day0, this loader's data day1\)"):
        fit(model, Batches(make_batches(1), "day1"), opt, checkpoint_dir=tmp_path / "ck",
            resume=True, progress=False)


@pytest.mark.parametrize("storage", ["disk", "memory"])
def test_resume_inside_a_file_list_through_the_server_equals_an_uninterrupted_run(tmp_path, storage):
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    day0, day1 = make_batches(0, n_batches=3), make_batches(1, n_batches=5)

    def build(folder, reopen=False):
        ps = (ParameterServer.open(folder) if reopen else
              ParameterServer(folder, configs, storage=storage, optimizer="adam", lr=0.05))
        torch.manual_seed(0)
        model = DLRM(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps, 7))
        return ps, model, torch.optim.Adam(model.parameters(), lr=0.01)

    ps, model, opt = build(tmp_path / "ref")
    for i, day in enumerate((day0, day1)):
        fit(model, Batches(day, f"d{i}"), opt, progress=False)
    expected = ps.lookup("C2", np.arange(25)), {k: v.clone() for k, v in model.state_dict().items()}

    ps, model, opt = build(tmp_path / "ps")
    fit(model, Batches(day0, "d0"), opt, checkpoint_dir=tmp_path / "ck", progress=False)
    with pytest.raises(KeyboardInterrupt):
        fit(model, Crashing(day1, "d1", at=4), opt, checkpoint_dir=tmp_path / "ck", resume=True,
            checkpoint_every=2, progress=False)
    ps.close()  # batch 3 was applied to the server after the last checkpoint: rolled back
    ps, model, opt = build(tmp_path / "ps", reopen=True)
    fit(model, Batches(day1, "d1"), opt, checkpoint_dir=tmp_path / "ck", resume=True, progress=False)
    np.testing.assert_allclose(ps.lookup("C2", np.arange(25)), expected[0], rtol=1e-6, atol=1e-7)
    for k, v in expected[1].items():
        torch.testing.assert_close(model.state_dict()[k], v)


def test_data_identity_of_a_loader_is_its_file_list(tmp_path):
    import pandas as pd

    import tabstream as ts
    from tabstream.loaders.torch import Loader
    from tabstream.train.torch.fit import data_identity

    for day in ("a", "b"):
        (tmp_path / day).mkdir()
        pd.DataFrame({"x": np.arange(4.0), "y": np.zeros(4)}).to_parquet(tmp_path / day / "p.parquet")
    ids = [data_identity(Loader(ts.Dataset(str(tmp_path / d / "p.parquet")), batch_size=2,
                                labels=["y"], shuffle=True)) for d in ("a", "b", "a")]
    assert ids[0] == ids[2] != ids[1] and ids[0].startswith("files:")
    assert data_identity([1, 2]) is None
    assert data_identity(Batches([], "day7")) == "day7"


def test_a_dropped_cache_is_not_kept_alive_by_its_server(tmp_path):
    import gc
    import weakref

    configs = table_configs_from_schema(schema().without(["click"]), dim=4)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    emb = CachedEmbeddings(ps, cache_rows=4)
    ref = weakref.ref(emb)
    del emb
    gc.collect()
    assert ref() is None
    assert ps.prefetch({"C1": [1, 2]}) == {"C1": 2}


def test_hybrid_parallel_refuses_a_model_trained_through_a_server(tmp_path):
    from tabstream.train.torch.distributed import HybridParallel

    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    ps = ParameterServer(tmp_path / "ps", configs, storage="memory")
    model = DLRM(schema(), embedding_dim=8, embeddings=CachedEmbeddings(ps, 10))
    with pytest.raises(ValueError, match=r"HybridParallel: the model trains \['inputs.embeddings'\] "
                                         r"through a ParameterServer, whose rows CachedEmbeddings "
                                         r"shards over the ranks itself; HybridParallel does not "
                                         r"shard them. Wrap the model in torch's "
                                         r"DistributedDataParallel instead"):
        HybridParallel(model)

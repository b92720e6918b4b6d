"""Keras CachedEmbeddings: training through the cache equals in-memory Keras
training with the same sparse optimizer; checkpoints, resume and refusals."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf
from tf_synthetic import categorical

from tabstream.core.errors import SchemaError
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train import ParameterServer, TableConfig, table_configs_from_schema
from tabstream.train.tensorflow import (
    DCN,
    DLRM,
    CachedEmbeddings,
    EmbeddingTables,
    LazyAdam,
    MultiOptimizer,
    TwoTower,
    WideAndDeep,
    fit,
)

# see sparse_optimizer; Adam: tiny gradients (1e-9) give second moments where 1e-12 counts
EPS = {"adagrad": 1e-12, "adam": 1e-20}
LAYOUTS = ("ragged", "padded", "keys", "mask_key")


def schema():
    return Schema([categorical("C1", 200), categorical("C2", 60, is_list=True),
                   ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def two_tower_schema():
    return Schema([categorical("C1", 200, [Tags.USER_ID]),
                   categorical("C2", 60, [Tags.USER], is_list=True),
                   categorical("item", 80, [Tags.ITEM_ID]),
                   ColumnSchema("click", "float32", tags=[Tags.TARGET])])


def make_batches(seed, layout, n_batches=10, batch=8, item=False):
    """Batches of distinct C1 ids per batch <= 8 and C2 ids <= 16 (two per row)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        lengths = rng.integers(0, 3, batch)
        values = rng.integers(0, 60, lengths.sum())
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        features = {"C1": tf.constant(rng.integers(0, 200, batch), tf.int64),
                    "I1": tf.constant(rng.normal(size=batch), tf.float32)}
        if item:
            features["item"] = tf.constant(rng.integers(0, 80, batch), tf.int64)
            del features["I1"]
        if layout in ("ragged", "keys"):
            pair = (tf.constant(values, tf.int64), tf.constant(offsets, tf.int64))
            if layout == "ragged":
                features["C2"] = pair
            else:
                features["C2__values"], features["C2__offsets"] = pair
        else:
            padded = np.zeros((batch, 2), np.int64)
            mask = np.arange(2)[None, :] < lengths[:, None]
            padded[mask] = values
            if layout == "padded":
                features["C2"] = (tf.constant(padded), tf.constant(mask))
            else:
                features["C2"], features["C2__mask"] = tf.constant(padded), tf.constant(mask)
        labels = tf.constant(rng.integers(0, 2, batch), tf.float32)
        out.append((features, labels))
    return out


class DenseGradientAdagrad(keras.optimizers.Adagrad):
    """Keras' Adagrad on the table's dense gradient. Given an ``IndexedSlices`` with
    a repeated id it adds the square of each repeat to the accumulator instead of
    the square of their sum; on the dense gradient rows without ids do not move
    (their gradient and accumulator stay 0), so this is sparse Adagrad."""

    def apply(self, grads, trainable_variables=None):
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        return super().apply(grads, trainable_variables)


def sparse_optimizer(optimizer):
    """The in-memory twin of the server's rule. Keras' Adagrad and LazyAdam put
    epsilon elsewhere than the server (torch's rules: ``g / (sqrt(s) + eps)``, and
    Adam's eps outside the bias correction): with eps negligible against the
    rows' second moments both are the same arithmetic."""
    if optimizer == "adagrad":
        return DenseGradientAdagrad(0.1, initial_accumulator_value=0.0, epsilon=EPS["adagrad"] ** 2)
    return LazyAdam(0.1, epsilon=EPS["adam"])


def server(tmp_path, optimizer, storage, configs):
    return ParameterServer(tmp_path / "ps", configs, storage=storage, optimizer=optimizer,
                           lr=0.1, eps=EPS[optimizer])


def twin_models(tmp_path, optimizer, storage, cache_rows, model_cls=DLRM, schema_fn=schema,
                **kw):
    """A model over the server through the cache, and its in-memory twin: the same
    dense part (same seeds) and tables holding the server's initial rows."""
    s = schema_fn()
    cats = s.without(["click"])
    if model_cls is WideAndDeep:
        configs = WideAndDeep.table_configs(s, 8)
    else:
        configs = table_configs_from_schema(cats, dim=8)
    ps = server(tmp_path, optimizer, storage, configs)
    cached = model_cls(s, embedding_dim=8, seed=0,
                       embeddings=CachedEmbeddings(ps, cache_rows), **kw)
    plain = model_cls(s, embedding_dim=8, seed=0, **kw)
    tables = in_memory_tables(plain)
    for layer, prefix, suffix in tables:
        for name, table in layer.tables.items():
            server_name = name.removeprefix(prefix) + suffix
            table.embeddings.assign(ps.lookup(server_name, np.arange(table.cardinality)))
    return ps, cached, plain, tables


def in_memory_tables(model):
    """(EmbeddingTables layer, its name prefix, the server table's suffix) of a model."""
    found = []
    for attr, prefix, suffix in (("embeddings", "", ""), ("wide_tables", "wide_", "_wide"),
                                 ("user_embeddings", "", ""), ("item_embeddings", "", "")):
        layer = getattr(model, attr, None)
        if isinstance(layer, EmbeddingTables):
            found.append((layer, prefix, suffix))
    return found


def train_both(ps, cached, plain, tables, optimizer, batches, **fit_kw):
    layers = [layer for layer, _, _ in tables]
    got = fit(cached, batches, keras.optimizers.SGD(0.05), progress=False, **fit_kw)
    expected = fit(plain, batches, MultiOptimizer(keras.optimizers.SGD(0.05),
                                                  [(sparse_optimizer(optimizer), layers)]),
                   progress=False, **fit_kw)
    for key in ("loss", "val_loss", "val_auc"):  # evaluate looks up through the cache too
        if key in expected:
            np.testing.assert_allclose(got[key], expected[key], rtol=1e-5, err_msg=key)


def assert_same_training(ps, cached, plain, tables):
    for layer, prefix, suffix in tables:
        for name, table in layer.tables.items():
            np.testing.assert_allclose(
                ps.lookup(name.removeprefix(prefix) + suffix, np.arange(table.cardinality)),
                table.embeddings.numpy(), rtol=1e-5, atol=1e-5, err_msg=name)
    dense_plain = {v.path.split("/", 1)[1]: v.numpy() for v in plain.trainable_variables
                   if not v.path.endswith("/embeddings")}
    dense_cached = {v.path.split("/", 1)[1]: v.numpy() for v in cached.trainable_variables}
    assert sorted(dense_plain) == sorted(dense_cached)
    for name, value in dense_cached.items():
        np.testing.assert_allclose(value, dense_plain[name], rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("optimizer,storage,layout", [
    ("adagrad", "memory", "ragged"), ("adam", "disk", "padded"),
    pytest.param("adam", "memory", "keys", marks=pytest.mark.slow),
    pytest.param("adagrad", "disk", "mask_key", marks=pytest.mark.slow)])
def test_training_through_the_cache_equals_training_in_memory(tmp_path, optimizer, storage, layout):
    cache_rows = 16  # the rows touched: ~70 of C1, ~55 of C2
    ps, cached, plain, tables = twin_models(tmp_path, optimizer, storage, cache_rows)
    batches = make_batches(0, layout)
    train_both(ps, cached, plain, tables, optimizer, batches, epochs=2,
               valid_loader=batches[:2])
    assert len(ps.touched("C1")) > 4 * cache_rows and len(ps.touched("C2")) > 2 * cache_rows
    assert_same_training(ps, cached, plain, tables)
    emb = cached.embeddings
    assert all(n <= cache_rows for n in emb.cached_rows.values())
    # each cached row is the server's row, in the slot the cache says
    for name, cache in emb._caches.items():
        ids = np.array(sorted(cache.slot), np.int64)
        slots = [cache.slot[i] for i in ids.tolist()]
        np.testing.assert_array_equal(emb.cache_variables[name].numpy()[slots],
                                      ps.lookup(name, ids))
    # optimizer state only for the rows touched
    untouched = np.setdiff1d(np.arange(200), ps.touched("C1"))
    assert not ps.optimizer_state("C1", untouched).any()


@pytest.mark.slow
@pytest.mark.parametrize("model_cls,kw,schema_fn", [
    (DCN, {"deep": (8,)}, schema), (WideAndDeep, {"deep": (8,)}, schema),
    (TwoTower, {"tower": (8, 4)}, two_tower_schema)])
def test_the_other_bundled_models_train_through_the_cache_as_in_memory(tmp_path, model_cls, kw,
                                                                       schema_fn):
    ps, cached, plain, tables = twin_models(tmp_path, "adam", "disk", 16, model_cls=model_cls,
                                            schema_fn=schema_fn, **kw)
    batches = make_batches(1, "ragged", n_batches=6, item=model_cls is TwoTower)
    if model_cls is TwoTower:
        assert sorted(c.name for layer, _, _ in tables for c in layer.configs) == [
            "C1", "C2", "item"]
    if model_cls is WideAndDeep:
        assert {c.name for c in ps.configs} == {"C1", "C2", "C1_wide", "C2_wide"}
    train_both(ps, cached, plain, tables, "adam", batches)
    assert_same_training(ps, cached, plain, tables)
    if model_cls is WideAndDeep:
        counts = ps.export_delta(tmp_path / "delta")
        assert counts["C1_wide"] == counts["C1"] == len(ps.touched("C1")) > 0


@pytest.mark.slow
def test_a_checkpoint_resumes_through_the_server_as_an_uninterrupted_run(tmp_path):
    """Epoch 1 is checkpointed (the server commits with it); the process then dies
    in epoch 2 after some steps were applied to the server; a new process reopens
    the server (back at the commit), resumes, and ends where one run ends."""
    batches = make_batches(2, "padded", n_batches=6)
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)

    def model_over(ps):
        return DLRM(schema(), embedding_dim=8, seed=0, embeddings=CachedEmbeddings(ps, 16))

    (tmp_path / "a").mkdir()
    ps_a = server(tmp_path / "a", "adam", "disk", configs)
    whole = model_over(ps_a)
    fit(whole, batches, keras.optimizers.Adam(0.01), epochs=2, progress=False)

    (tmp_path / "b").mkdir()
    ps = server(tmp_path / "b", "adam", "disk", configs)
    first = model_over(ps)
    fit(first, batches, keras.optimizers.Adam(0.01), epochs=1, checkpoint_dir=tmp_path / "ck",
        progress=False)
    committed = ps.version
    fit(first, batches[:3], keras.optimizers.Adam(0.01), epochs=1, progress=False)
    assert ps.version > committed == ps.mark
    ps.close()  # the crash: nothing after the commit survives
    ps = ParameterServer.open(tmp_path / "b" / "ps")
    assert ps.version == committed
    again = model_over(ps)
    fit(again, batches, keras.optimizers.Adam(0.01), epochs=2, checkpoint_dir=tmp_path / "ck",
        resume=True, progress=False)
    for name in ("C1", "C2"):
        card = 200 if name == "C1" else 60
        np.testing.assert_allclose(ps.lookup(name, np.arange(card)),
                                   ps_a.lookup(name, np.arange(card)), rtol=1e-5, atol=1e-6)
    for a, b in zip(whole.trainable_variables, again.trainable_variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_loading_a_checkpoint_rolls_the_server_back_to_it(tmp_path):
    configs = table_configs_from_schema(schema().without(["click"]), dim=8)
    ps = server(tmp_path, "adagrad", "disk", configs)
    model = DLRM(schema(), embedding_dim=8, seed=0, embeddings=CachedEmbeddings(ps, 16))
    batches = make_batches(3, "ragged", n_batches=2)
    sgd = keras.optimizers.SGD(0.1)  # one optimizer: fit compiles its step once
    fit(model, batches[:1], sgd, progress=False)
    model.save_weights(tmp_path / "m.weights.h5")  # commits the server
    saved, rows = ps.version, ps.lookup("C1", np.arange(200))
    fit(model, batches[1:], sgd, progress=False)
    ps.flush()
    assert not np.array_equal(ps.lookup("C1", np.arange(200)), rows)
    model.load_weights(tmp_path / "m.weights.h5")
    assert ps.version == saved
    np.testing.assert_array_equal(ps.lookup("C1", np.arange(200)), rows)
    assert model.embeddings.cached_rows == {"C1": 0, "C2": 0}  # the cache starts over
    # updates not committed since are refused: the checkpoint cannot tell them apart
    fit(model, batches[1:], sgd, progress=False)
    fit(model, batches[1:], sgd, progress=False)
    with pytest.raises(ValueError, match=r"holds uncommitted updates \(version \d+, last commit "
                                          r"\d+\); reopen it with ParameterServer.open"):
        model.load_weights(tmp_path / "m.weights.h5")


def test_a_step_whose_ids_do_not_fit_the_cache_is_refused(tmp_path):
    ps = server(tmp_path, "adagrad", "memory", table_configs_from_schema(
        schema().without(["click"]), dim=8))
    model = DLRM(schema(), embedding_dim=8, seed=0, embeddings=CachedEmbeddings(ps, 4))
    batches = make_batches(4, "ragged", n_batches=1)
    with pytest.raises(tf.errors.OpError, match=r"CachedEmbeddings: table 'C1' needs \d+ rows in "
                                                r"its cache in one step .* more than "
                                                r"cache_rows=4 holds; raise cache_rows"):
        fit(model, batches, keras.optimizers.SGD(0.1), progress=False)


def test_refusals(tmp_path):
    ps = server(tmp_path, "adagrad", "memory", table_configs_from_schema(
        schema().without(["click"]), dim=8))
    with pytest.raises(TypeError, match="CachedEmbeddings: ps must be a ParameterServer, got str"):
        CachedEmbeddings("ps/", 10)
    with pytest.raises(ValueError, match=r"CachedEmbeddings: cache_rows must be an int >= 1, got 0"):
        CachedEmbeddings(ps, 0)
    with pytest.raises(SchemaError, match=r"CachedEmbeddings: parameter server .* has no tables "
                                          r"\['C9'\]; it has \['C1', 'C2'\]"):
        CachedEmbeddings(ps, 10, tables=["C9"])
    emb = CachedEmbeddings(ps, 10)
    with pytest.raises(SchemaError, match=r"DLRM: embeddings= must serve the schema's categorical "
                                          r"features \['C1', 'C2', 'C3'\]"):
        DLRM(Schema([*schema(), categorical("C3", 5)]), embedding_dim=8, embeddings=emb)
    with pytest.raises(ValueError, match=r"DLRM: every embedding must be embedding_dim=16 wide"):
        DLRM(schema(), embedding_dim=16, embeddings=emb)
    with pytest.raises(SchemaError, match=r"WideAndDeep: embeddings= serves the deep tables from "
                                          r"parameter server .*, which has no wide tables "
                                          r"\['C1_wide', 'C2_wide'\].*WideAndDeep.table_configs"):
        WideAndDeep(schema(), embedding_dim=8, embeddings=emb)
    model = DLRM(schema(), embedding_dim=8, embeddings=emb)
    model.compile(keras.optimizers.SGD(0.1), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    features, labels = make_batches(5, "ragged", n_batches=1)[0]
    with pytest.raises(RuntimeError, match=r"DLRM.fit \(Keras' own training loop\) cannot train "
                                           r"tables served by CachedEmbeddings.*"
                                           r"tabstream.train.tensorflow.fit"):
        model.fit(tf.data.Dataset.from_tensors((features, labels)), verbose=0)
    with pytest.raises(TypeError, match=r"DLRM.get_config: the embeddings= given, a CachedEmbeddings, "
                                        r"cannot be saved with the model .*ParameterServer.*same "
                                        r"embeddings="):
        model.get_config()
    one_table = Schema([categorical("C1", 200, [Tags.USER_ID]), categorical("item", 200, [Tags.ITEM_ID]),
                        ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    shared = ParameterServer(tmp_path / "shared", [TableConfig("t", 200, 8, ("C1", "item"))],
                             storage="memory")
    with pytest.raises(ValueError, match=r"TwoTower: embeddings= tables \['t'\] serve both USER "
                                         r"and ITEM features"):
        TwoTower(one_table, embeddings=CachedEmbeddings(shared, 10))


@pytest.mark.slow
def test_several_replicas_are_refused(tmp_path):
    """Under a strategy of two replicas (two logical CPUs, a fresh process)."""
    script = textwrap.dedent(f"""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from tabstream.train import ParameterServer, TableConfig
        from tabstream.train.tensorflow import CachedEmbeddings
        ps = ParameterServer({str(tmp_path / "ps")!r}, [TableConfig("C1", 10, 4, ("C1",))])
        with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
            try:
                CachedEmbeddings(ps, 16)
            except ValueError as exc:
                print("REFUSED:", exc)
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=300)
    assert "REFUSED: CachedEmbeddings: tables served through a ParameterServer " \
           "(CachedEmbeddings) train on one replica; the strategy MirroredStrategy runs 2. " \
           "Train on one process and device" in result.stdout, result.stdout + result.stderr[-3000:]

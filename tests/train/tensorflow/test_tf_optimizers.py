import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from tf_synthetic import ranking_data  # noqa: E402

from tabstream.train.tables import TableConfig  # noqa: E402
from tabstream.train.tensorflow import (  # noqa: E402
    DLRM,
    EmbeddingTables,
    LazyAdam,
    MultiOptimizer,
    split_embeddings_on_size,
)

# The optimizer computes in float32; the references use the same float32-rounded
# hyperparameters (1 - 0.999 differs by 1e-5 relative between float32 and float64).
LR, B1, B2, EPS = (float(np.float32(x)) for x in (0.05, 0.9, 0.999, 1e-7))


def lazy_adam_reference(w, steps, lr=LR, b1=B1, b2=B2, eps=EPS):
    """Plain-numpy lazy Adam: ``steps`` is a list of (row ids, gradient rows)."""
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, (ids, rows) in enumerate(steps, start=1):
        summed = {}
        for i, g in zip(ids, rows, strict=True):
            summed[i] = summed.get(i, 0.0) + g.astype(np.float64)
        alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
        for i, g in summed.items():
            m[i] = b1 * m[i] + (1 - b1) * g
            v[i] = b2 * v[i] + (1 - b2) * g * g
            w[i] -= alpha * m[i] / (np.sqrt(v[i]) + eps)
    return w, m, v


def dense_adam_reference(w, grads, lr=LR, b1=B1, b2=B2, eps=EPS):
    w = w.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        w -= lr * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


def sparse_steps(seed, rows=40, dim=4, steps=4, batch=12):
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        # few distinct ids per step, so duplicates are certain; step 2 skips rows >= 20
        high = 20 if s == 2 else rows
        ids = rng.integers(0, high, batch)
        ids[1] = ids[0]
        out.append((ids, rng.normal(size=(batch, dim)).astype(np.float32)))
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_lazy_adam_matches_numpy_reference_with_duplicate_ids(seed):
    rng = np.random.default_rng(seed + 100)
    init = rng.normal(size=(40, 4)).astype(np.float32)
    steps = sparse_steps(seed)
    var = keras.Variable(init)
    opt = LazyAdam(LR, beta_1=B1, beta_2=B2, epsilon=EPS)
    for ids, rows in steps:
        grad = tf.IndexedSlices(tf.constant(rows), tf.constant(ids), tf.constant([40, 4]))
        opt.apply([grad], [var])
    w, m, v = lazy_adam_reference(init, steps)
    np.testing.assert_allclose(var.numpy(), w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(opt._momentums[0].numpy(), m, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(opt._velocities[0].numpy(), v, rtol=1e-5, atol=1e-9)


def test_lazy_adam_in_a_tf_function_through_the_embedding_lookup():
    tables = EmbeddingTables([TableConfig("t", 40, 4, ("t",))], seed=3)
    init = tables.tables["t"].embeddings.numpy()
    steps = sparse_steps(7)
    opt = LazyAdam(LR)

    @tf.function
    def step(ids, coef):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tables({"t": ids})["t"] * coef)  # d loss / d row = coef
        opt.apply(tape.gradient(loss, tables.trainable_variables), tables.trainable_variables)

    for ids, coef in steps:
        step(tf.constant(ids), tf.constant(coef))
    expected, _, _ = lazy_adam_reference(init, steps)
    np.testing.assert_allclose(tables.tables["t"].embeddings.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_only_rows_in_the_batch_change():
    rng = np.random.default_rng(0)
    init = rng.normal(size=(30, 4)).astype(np.float32)
    lazy_var, adam_var = keras.Variable(init), keras.Variable(init)
    lazy, adam = LazyAdam(LR), keras.optimizers.Adam(LR)
    batches = [np.array([1, 2, 2]), np.array([3, 4])]
    snapshots = []
    for ids in batches:
        grad = tf.IndexedSlices(tf.ones((len(ids), 4)), tf.constant(ids), tf.constant([30, 4]))
        lazy.apply([grad], [lazy_var])
        adam.apply([grad], [adam_var])
        snapshots.append(
            (lazy_var.numpy().copy(), lazy._momentums[0].numpy().copy(), adam_var.numpy().copy())
        )
    (w1, m1, a1), (w2, m2, a2) = snapshots
    untouched = np.setdiff1d(np.arange(30), [1, 2, 3, 4])
    np.testing.assert_array_equal(w2[untouched], init[untouched])
    assert not m2[untouched].any()
    # rows 1, 2 (first batch only) keep weights and moments through the second step
    np.testing.assert_array_equal(w2[[1, 2]], w1[[1, 2]])
    np.testing.assert_array_equal(m2[[1, 2]], m1[[1, 2]])
    assert not np.allclose(w2[[3, 4]], w1[[3, 4]])
    # Keras Adam, given the same gradients, keeps moving rows 1 and 2 (dense update)
    assert not np.allclose(a2[[1, 2]], a1[[1, 2]])


def test_dense_gradients_get_plain_adam():
    rng = np.random.default_rng(1)
    init = rng.normal(size=(5, 3)).astype(np.float32)
    grads = [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(4)]
    lazy_var, keras_var = keras.Variable(init), keras.Variable(init)
    lazy, adam = LazyAdam(LR), keras.optimizers.Adam(LR)
    for g in grads:
        lazy.apply([tf.constant(g)], [lazy_var])
        adam.apply([tf.constant(g)], [keras_var])
    np.testing.assert_allclose(lazy_var.numpy(), dense_adam_reference(init, grads), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(lazy_var.numpy(), keras_var.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "clip", [{"clipvalue": 0.7}, {"clipnorm": 1.5}, {"global_clipnorm": 2.0}]
)
def test_clipping_applies_to_summed_rows_like_a_dense_gradient(clip):
    rng = np.random.default_rng(2)
    init = rng.normal(size=(20, 3)).astype(np.float32)
    steps = [(np.array([1, 1, 4, 9]), rng.normal(size=(4, 3)).astype(np.float32)) for _ in range(3)]
    var = keras.Variable(init)
    opt = LazyAdam(LR, **clip)
    clipped_steps = []
    for ids, rows in steps:
        opt.apply([tf.IndexedSlices(tf.constant(rows), tf.constant(ids), tf.constant([20, 3]))], [var])
        dense = np.zeros((20, 3), np.float64)
        np.add.at(dense, ids, rows)
        if "clipvalue" in clip:
            dense = np.clip(dense, -0.7, 0.7)
        else:
            limit = clip.get("clipnorm", clip.get("global_clipnorm"))
            dense *= limit / max(np.linalg.norm(dense), limit)
        touched = np.unique(ids)
        clipped_steps.append((touched, dense[touched]))
    expected, _, _ = lazy_adam_reference(init, clipped_steps)
    np.testing.assert_allclose(var.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_lazy_adam_config_round_trip():
    opt = LazyAdam(0.01, beta_1=0.8, beta_2=0.99, epsilon=1e-6, clipnorm=1.0)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(restored, LazyAdam)
    config = restored.get_config()
    assert (config["beta_1"], config["beta_2"], config["epsilon"], config["clipnorm"]) == (0.8, 0.99, 1e-6, 1.0)
    assert config["learning_rate"] == pytest.approx(0.01)
    assert LazyAdam.from_config(opt.get_config()).get_config() == opt.get_config()
    with pytest.raises(ValueError, match="does not support weight_decay"):
        LazyAdam(weight_decay=0.01)


# -- MultiOptimizer ------------------------------------------------------------------

def small_setup(seed=0, rows=1024, batch=128):
    schema, features, labels, _ = ranking_data(seed, rows=rows)
    batches = [
        ({k: tf.constant(v[i : i + batch]) for k, v in features.items()}, tf.constant(labels[i : i + batch]))
        for i in range(0, rows, batch)
    ]
    return schema, batches


def multi_for(model, lr=LR):
    large, _ = split_embeddings_on_size(model.embeddings, threshold=100)
    return MultiOptimizer(keras.optimizers.Adam(lr), [(LazyAdam(lr), large)])


def make_step(model, opt, traced=False):
    """A custom training step; eager by default (tracing costs more than these few
    steps on a busy 2-core machine; the traced path has its own test)."""
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[:, None], model(features, training=True))
        opt.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)

    return tf.function(step) if traced else step


def tiny_dlrm(schema, seed):
    return DLRM(schema, embedding_dim=8, bottom_mlp=(8,), top_mlp=(16,), seed=seed)


def weights(model):
    return {v.path: v.numpy() for v in model.trainable_variables}


def test_multi_optimizer_routes_each_variable():
    schema, batches = small_setup()
    model = tiny_dlrm(schema, seed=0)
    model(batches[0][0])
    opt = multi_for(model)
    opt.build(model.trainable_variables)
    lazy, adam = opt.optimizers[1], opt.optimizers[0]
    routed = {v.path: type(opt.optimizer_for(v)).__name__ for v in model.trainable_variables}
    assert routed.pop("cat_1/embeddings") == "LazyAdam"  # cardinality 100
    assert routed.pop("cat_2/embeddings") == "LazyAdam"  # cardinality 300
    assert set(routed.values()) == {"Adam"}
    assert len(lazy.variables) == 2 + 2 * 2  # iteration, lr, m and v of two tables
    assert len(opt.variables) == len(opt._variables) + len(adam.variables) + len(lazy.variables)


def test_multi_optimizer_equals_separate_optimizers():
    schema, batches = small_setup()
    multi_model = tiny_dlrm(schema, seed=0)
    split_model = tiny_dlrm(schema, seed=0)
    split_model(batches[0][0])  # build, so that trainable_variables lists every weight
    multi_step = make_step(multi_model, multi_for(multi_model))
    large, _ = split_embeddings_on_size(split_model.embeddings, threshold=100)
    large_vars = [t.embeddings for t in large]
    large_ids = {id(v) for v in large_vars}
    rest = [v for v in split_model.trainable_variables if id(v) not in large_ids]
    lazy, adam = LazyAdam(LR), keras.optimizers.Adam(LR)
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    def split_step(features, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels[:, None], split_model(features, training=True))
        g_large, g_rest = tape.gradient(loss, [large_vars, rest])
        lazy.apply(g_large, large_vars)
        adam.apply(g_rest, rest)

    for features, labels in batches:
        multi_step(features, labels)
        split_step(features, labels)
    expected = weights(split_model)
    for path, value in weights(multi_model).items():
        np.testing.assert_allclose(value, expected[path], rtol=1e-5, atol=1e-6, err_msg=path)
    # the lazily updated table kept the rows no batch used
    seen = np.unique(np.concatenate([f["cat_2"].numpy() for f, _ in batches]))
    unseen = np.setdiff1d(np.arange(300), seen)
    assert len(unseen) > 0
    fresh = tiny_dlrm(schema, seed=0).embeddings.tables["cat_2"].embeddings.numpy()
    np.testing.assert_array_equal(weights(multi_model)["cat_2/embeddings"][unseen], fresh[unseen])


def test_multi_optimizer_in_a_tf_function_builds_on_first_trace():
    tables = EmbeddingTables(
        [TableConfig("big", 1000, 4, ("big",)), TableConfig("small", 10, 4, ("small",))], seed=0
    )
    init = {n: t.embeddings.numpy() for n, t in tables.tables.items()}
    large, _ = split_embeddings_on_size(tables, 100)
    opt = MultiOptimizer(keras.optimizers.SGD(1.0), [(LazyAdam(LR), large)])

    @tf.function
    def step(big, small):
        with tf.GradientTape() as tape:
            out = tables({"big": big, "small": small})
            loss = tf.reduce_sum(out["big"]) + tf.reduce_sum(out["small"])
        opt.apply(tape.gradient(loss, tables.trainable_variables), tables.trainable_variables)

    big_steps = [np.array([5, 5, 7]), np.array([7, 9, 9])]
    for big in big_steps:
        step(tf.constant(big), tf.constant([1, 1, 2]))
    assert int(opt.iterations) == 2
    # SGD with lr 1 on a sum: each row drops by its id's count per step
    expected_small = init["small"].copy()
    expected_small[1] -= 4.0
    expected_small[2] -= 2.0
    np.testing.assert_allclose(tables.tables["small"].embeddings.numpy(), expected_small, rtol=1e-6)
    expected_big, _, _ = lazy_adam_reference(
        init["big"], [(ids, np.ones((3, 4), np.float32)) for ids in big_steps]
    )
    np.testing.assert_allclose(tables.tables["big"].embeddings.numpy(), expected_big, rtol=1e-5, atol=1e-6)


def test_a_variable_claimed_twice_is_rejected():
    tables = EmbeddingTables([TableConfig("big", 1000, 8, ("big",)), TableConfig("s", 10, 8, ("s",))])
    large, small = split_embeddings_on_size(tables, 100)
    with pytest.raises(ValueError, match=r"'big/embeddings' is claimed by two optimizers: LazyAdam.*SGD"):
        MultiOptimizer(keras.optimizers.Adam(), [(LazyAdam(), large), (keras.optimizers.SGD(), tables)])
    # path claims are resolved when the optimizer is built
    opt = MultiOptimizer(
        keras.optimizers.Adam(), [(LazyAdam(), "big/embeddings"), (keras.optimizers.SGD(), ["big"])]
    )
    with pytest.raises(ValueError, match="'big/embeddings' is claimed by two optimizers"):
        opt.build(tables.trainable_variables)
    # one optimizer listed twice for the same table is not ambiguous
    lazy = LazyAdam()
    opt = MultiOptimizer(keras.optimizers.Adam(), [(lazy, large), (lazy, "big/embeddings")])
    opt.build(tables.trainable_variables)
    assert opt.optimizer_for(tables.tables["big"].embeddings) is lazy
    assert opt.optimizer_for(tables.tables["s"].embeddings) is opt.default_optimizer


def test_bad_claims_are_explained():
    tables = EmbeddingTables([TableConfig("big", 1000, 8, ("big",))])
    opt = MultiOptimizer("adam", [(LazyAdam(), "missing/embeddings")])
    with pytest.raises(ValueError, match="entry 0 .*claims none of the variables"):
        opt.build(tables.trainable_variables)
    with pytest.raises(TypeError, match="claims must be Keras layers"):
        MultiOptimizer("adam", [(LazyAdam(), 42)])
    with pytest.raises(TypeError, match="must be a pair"):
        MultiOptimizer("adam", [LazyAdam()])
    with pytest.raises(TypeError, match="cannot be a MultiOptimizer"):
        MultiOptimizer(MultiOptimizer("adam"))
    with pytest.raises(ValueError, match="set them on the sub-optimizers"):
        MultiOptimizer("adam", clipnorm=1.0)


def test_table_config_claims_route_the_table():
    tables = EmbeddingTables([TableConfig("big", 1000, 8, ("big",)), TableConfig("s", 10, 8, ("s",))])
    lazy = LazyAdam()
    opt = MultiOptimizer("adam", [(lazy, [tables.configs[0]])])
    opt.build(tables.trainable_variables)
    assert opt.optimizer_for(tables.tables["big"].embeddings) is lazy
    assert opt.optimizer_for(tables.tables["s"].embeddings) is opt.default_optimizer


def test_multi_optimizer_config_round_trip_routes_by_path():
    schema, batches = small_setup()
    model = tiny_dlrm(schema, seed=0)
    model(batches[0][0])
    opt = multi_for(model, lr=0.02)
    opt.build(model.trainable_variables)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert isinstance(restored, MultiOptimizer)
    assert [type(o).__name__ for o in restored.optimizers] == ["Adam", "LazyAdam"]
    assert float(restored.optimizers[1].learning_rate) == pytest.approx(0.02)
    restored.build(model.trainable_variables)
    for v in model.trainable_variables:
        assert type(restored.optimizer_for(v)) is type(opt.optimizer_for(v)), v.path


def test_checkpoint_restore_continues_like_uninterrupted_training(tmp_path):
    schema, batches = small_setup()
    half = len(batches) // 2

    straight = tiny_dlrm(schema, seed=0)
    straight_opt = multi_for(straight)
    step = make_step(straight, straight_opt)
    for features, labels in batches:
        step(features, labels)

    first = tiny_dlrm(schema, seed=0)
    first_opt = multi_for(first)
    step = make_step(first, first_opt)
    for features, labels in batches[:half]:
        step(features, labels)
    path = tf.train.Checkpoint(model=first, optimizer=first_opt).write(str(tmp_path / "ckpt"))

    resumed = tiny_dlrm(schema, seed=1)  # different initial weights
    resumed(batches[0][0])
    resumed_opt = multi_for(resumed)
    resumed_opt.build(resumed.trainable_variables)
    tf.train.Checkpoint(model=resumed, optimizer=resumed_opt).read(path).assert_consumed()
    step = make_step(resumed, resumed_opt)
    for features, labels in batches[half:]:
        step(features, labels)

    expected = weights(straight)
    for p, value in weights(resumed).items():
        np.testing.assert_allclose(value, expected[p], rtol=1e-5, atol=1e-6, err_msg=p)
    assert len(resumed_opt.variables) == len(straight_opt.variables)
    for a, b in zip(resumed_opt.variables, straight_opt.variables, strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)
    assert [int(o.iterations) for o in resumed_opt.optimizers] == [len(batches)] * 2


def compiled_dlrm(schema, seed):
    model = tiny_dlrm(schema, seed=seed)
    model.compile(optimizer=multi_for(model), loss=keras.losses.BinaryCrossentropy(from_logits=True))
    return model


@pytest.mark.slow
def test_fit_with_save_weights_resumes_like_uninterrupted_training(tmp_path):
    schema, batches = small_setup()
    data = tf.data.Dataset.from_tensor_slices(
        ({k: tf.concat([f[k] for f, _ in batches], 0) for k in batches[0][0]},
         tf.concat([y for _, y in batches], 0))
    ).batch(128)

    straight = compiled_dlrm(schema, 0)
    straight.fit(data, epochs=2, shuffle=False, verbose=0)

    first = compiled_dlrm(schema, 0)
    first.fit(data, epochs=1, shuffle=False, verbose=0)
    first.save_weights(str(tmp_path / "model.weights.h5"))

    resumed = compiled_dlrm(schema, 1)
    resumed(batches[0][0])
    resumed.optimizer.build(resumed.trainable_variables)
    resumed.load_weights(str(tmp_path / "model.weights.h5"))
    assert [int(o.iterations) for o in resumed.optimizer.optimizers] == [len(batches)] * 2
    resumed.fit(data, epochs=1, shuffle=False, verbose=0)

    expected = weights(straight)
    for p, value in weights(resumed).items():
        np.testing.assert_allclose(value, expected[p], rtol=1e-5, atol=1e-6, err_msg=p)
    lazy = resumed.optimizer.optimizers[1]
    assert isinstance(lazy, LazyAdam) and int(lazy.iterations) == 2 * len(batches)

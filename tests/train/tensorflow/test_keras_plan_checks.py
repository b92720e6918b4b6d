"""Keras HybridParallel (one worker, the default strategy) checks its plan against
the model at construction, as the torch one does: a ready ShardingPlan made for
other table sizes, and two EmbeddingTables layers with one table name, are refused
with errors naming them; a plan made for the model gives the plain model's logits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

pytest.importorskip("tensorflow")

pytestmark = [pytest.mark.tensorflow]


def _two_towers(names=("cat", "cat")):
    import keras

    from tabstream.train.tables import TableConfig
    from tabstream.train.tensorflow import EmbeddingTables

    class TwoTowers(keras.Model):
        def __init__(self):
            super().__init__()
            self.a = EmbeddingTables([TableConfig(names[0], 10, 4, ("a_cat",))], seed=0,
                                     name="tower_a")
            self.b = EmbeddingTables([TableConfig(names[1], 10, 6, ("b_cat",))], seed=1,
                                     name="tower_b")

        def call(self, features):
            import tensorflow as tf

            return tf.concat([self.a(features)["a_cat"], self.b(features)["b_cat"]], 1)

    return TwoTowers()


def test_a_plan_for_other_table_sizes_is_refused():
    from hybrid_worker import make_model

    from tabstream.train.sharding import plan_sharding
    from tabstream.train.tensorflow.distributed import HybridParallel

    configs = list(make_model(0).embeddings.configs)
    cat_1 = next(c for c in configs if c.name == "cat_1")
    smaller = [c if c.name != "cat_1" else dataclasses.replace(c, cardinality=60)
               for c in configs]
    plan = plan_sharding(smaller, 1, strategy="row_wise")
    with pytest.raises(ValueError, match=rf"HybridParallel: table 'cat_1' is 60 x {cat_1.dim} "
                       rf"\(rows x dim\) in the plan but 100 x {cat_1.dim} in the model; plan "
                       r"with plan_sharding\(model, world_size=1\) for this model"):
        HybridParallel(make_model(0), plan=plan)


def test_a_plan_made_for_the_model_gives_the_plain_logits():
    from hybrid_worker import as_tf, global_batches, make_model

    from tabstream.train.sharding import plan_sharding
    from tabstream.train.tensorflow.distributed import HybridParallel

    plan = plan_sharding(make_model(0), 1, strategy="row_wise")
    hp = HybridParallel(make_model(0), plan=plan, exchange="all_gather")
    batch = as_tf(global_batches()[0][0])
    np.testing.assert_allclose(hp.predict(batch), make_model(0)(batch).numpy(), rtol=0,
                               atol=1e-6)


@pytest.mark.parametrize("plan", [{"cat": "column_wise"}, "row_wise", None])
def test_two_layers_with_one_table_name_are_refused(plan):
    from tabstream.train.tensorflow.distributed import HybridParallel

    with pytest.raises(ValueError, match=r"HybridParallel: table 'cat' is in two embedding "
                       r"modules, 'tower_a' and 'tower_b' \(10 x 4 and 10 x 6\); a sharding "
                       "plan keys tables by name"):
        HybridParallel(_two_towers(), plan=plan)


def test_two_layers_with_their_own_names_are_sharded_apart():
    from tabstream.train.tensorflow.distributed import HybridParallel

    hp = HybridParallel(_two_towers(("cat_a", "cat_b")), plan="column_wise")
    assert dict(hp.plan) == {"cat_a": "column_wise", "cat_b": "column_wise"}
    assert [(c.cardinality, c.dim) for c in hp.plan.configs.values()] == [(10, 4), (10, 6)]

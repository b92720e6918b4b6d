"""One feature spec, two frameworks: the torch and Keras training packages read a
schema the same way, refuse the same bad settings with the same errors, and their
models give outputs of the same shapes."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train.spec import FeatureSpec, check_positive, check_threshold, feature_spec

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")


def cat(name: str, card: int, tags=(), is_list: bool = False) -> ColumnSchema:
    return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL, *tags],
                        properties={"domain": {"min": 0, "max": card - 1}}, is_list=is_list)


def cont(name: str, tags=(), is_list: bool = False) -> ColumnSchema:
    return ColumnSchema(name, "float32", tags=[Tags.CONTINUOUS, *tags], is_list=is_list)


TARGET = ColumnSchema("click", "float32", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])


def mixed_schema() -> Schema:
    # "hour" is tagged both categorical and continuous: its values are ids
    both = ColumnSchema("hour", "int64", tags=[Tags.CATEGORICAL, Tags.CONTINUOUS],
                        properties={"domain": {"min": 0, "max": 23}})
    return Schema([cat("C1", 1000), both, cat("tags", 50, is_list=True), cont("x"), cont("y"),
                   TARGET])


# -- the spec itself -----------------------------------------------------------------

def test_feature_spec_reads_the_schema_by_its_rules():
    spec = feature_spec(mixed_schema())
    assert spec.categorical == ("C1", "hour", "tags")
    assert spec.lists == ("tags",)
    assert spec.continuous == ("x", "y")          # "hour" is embedded, not a float
    assert spec.targets == ("click",)
    assert spec.layouts == {"C1": "single-hot", "hour": "single-hot", "tags": "list",
                            "x": "continuous", "y": "continuous"}
    # dims: floor(card ** 0.25 * 2) rounded up to a multiple of 8 (at least 8)
    expected = {n: max(8, math.ceil(math.floor(c ** 0.25 * 2) / 8) * 8)
                for n, c in (("C1", 1000), ("hour", 24), ("tags", 50))}
    assert spec.output_dims == expected
    assert spec.concat_dim == sum(expected.values()) + 2
    assert [(t.name, t.cardinality) for t in spec.tables] == [("C1", 1000), ("hour", 24),
                                                             ("tags", 50)]
    assert spec.select(["C1", "x"]) == FeatureSpec(
        tables=spec.tables[:1], categorical=("C1",), lists=(), continuous=("x",),
        targets=("click",))


@pytest.mark.parametrize("layout", ["ragged", "padded"])
def test_example_batch_has_the_loader_layout_and_valid_ids(layout):
    spec = feature_spec(mixed_schema())
    batch = spec.example_batch(6, list_layout=layout, seed=1)
    assert batch["C1"].shape == (6,) and batch["C1"].dtype == np.int64
    assert 0 <= batch["hour"].min() and batch["hour"].max() < 24
    assert batch["x"].shape == (6,) and batch["x"].dtype == np.float32
    if layout == "ragged":
        offsets = batch["tags__offsets"]
        assert offsets.shape == (7,) and offsets[0] == 0
        assert offsets[-1] == len(batch["tags__values"])
        assert np.all(np.diff(offsets) >= 0)
    else:
        assert batch["tags"].shape == batch["tags__mask"].shape == (6, 3)
        assert batch["tags__mask"].dtype == bool


@pytest.mark.parametrize("value", [0, -2])
def test_check_threshold_refuses_values_below_one(value):
    with pytest.raises(ValueError, match=rf"threshold must be >= 1, got {value}"):
        check_threshold(value)


@pytest.mark.parametrize("value", [1.5, "10", True, None])
def test_check_threshold_refuses_non_ints(value):
    with pytest.raises(TypeError, match=r"threshold must be an int, got"):
        check_threshold(value)


def test_check_positive():
    assert check_positive(np.float32(0.5), "t") == 0.5
    with pytest.raises(ValueError, match=r"t must be > 0 and finite, got inf"):
        check_positive(float("inf"), "t")
    with pytest.raises(TypeError, match=r"t must be a number, got '1'"):
        check_positive("1", "t")


# -- both frameworks -------------------------------------------------------------------


class TorchSide:
    name = "torch"

    def __init__(self) -> None:
        import torch

        import tabstream.train.torch as pkg

        self.torch, self.pkg = torch, pkg

    def batch(self, arrays):
        return {k: self.torch.from_numpy(np.asarray(v)) for k, v in arrays.items()}

    def run(self, model, arrays) -> np.ndarray:
        with self.torch.no_grad():
            return model(self.batch(arrays)).numpy()

    def tables_out(self, tables, arrays):
        return {k: v.detach().numpy() for k, v in tables(self.batch(arrays)).items()}

    def inputs_of(self, model):
        """(embedded feature names, continuous feature names) of a ranking model."""
        return list(model.inputs.embeddings.feature_names), list(model.inputs.continuous_names)

    def models(self):
        return {"DLRM": lambda s: self.pkg.DLRM(s, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,)),
                "DCN": lambda s: self.pkg.DCN(s, embedding_dim=8, deep=(8,)),
                "WideAndDeep": lambda s: self.pkg.WideAndDeep(s, embedding_dim=8, deep=(8,))}


class KerasSide:
    name = "keras"

    def __init__(self) -> None:
        import tensorflow as tf

        import tabstream.train.tensorflow as pkg

        self.tf, self.pkg = tf, pkg

    def batch(self, arrays):
        return {k: self.tf.constant(v) for k, v in arrays.items()}

    def run(self, model, arrays) -> np.ndarray:
        return np.asarray(model(self.batch(arrays)))

    def tables_out(self, tables, arrays):
        return {k: np.asarray(v) for k, v in tables(self.batch(arrays)).items()}

    def inputs_of(self, model):
        return list(model.embeddings.feature_names), list(model.continuous.names)

    def models(self):
        return {"DLRM": lambda s: self.pkg.DLRM(s, embedding_dim=8, bottom_mlp=(8,), top_mlp=(8,),
                                                seed=0),
                "DCN": lambda s: self.pkg.DCN(s, embedding_dim=8, deep=(8,), seed=0),
                "WideAndDeep": lambda s: self.pkg.WideAndDeep(s, embedding_dim=8, deep=(8,),
                                                              seed=0)}


@pytest.fixture(params=["torch", "keras"])
def side(request):
    if request.param == "torch":
        pytest.importorskip("torch")
        return TorchSide()
    pytest.importorskip("tensorflow")
    return KerasSide()


def test_a_column_tagged_categorical_and_continuous_is_embedded_only(side):
    model = side.models()["DLRM"](mixed_schema())
    embedded, continuous = side.inputs_of(model)
    spec = feature_spec(mixed_schema())
    assert sorted(embedded) == sorted(spec.categorical) == ["C1", "hour", "tags"]
    assert continuous == list(spec.continuous) == ["x", "y"]


@pytest.mark.parametrize("model_name", ["DLRM", "DCN", "WideAndDeep"])
@pytest.mark.parametrize("layout", ["ragged", "padded"])
def test_ranking_models_return_one_logit_per_row(side, model_name, layout):
    model = side.models()[model_name](mixed_schema())
    batch = feature_spec(mixed_schema()).example_batch(5, list_layout=layout)
    out = side.run(model, batch)
    assert out.shape == (5,)
    assert np.isfinite(out).all()


@pytest.mark.parametrize("column", ["C1", "x"])
def test_a_feature_missing_from_the_batch_is_a_schema_error(side, column):
    from tabstream.core.errors import SchemaError

    model = side.models()["DLRM"](mixed_schema())
    batch = feature_spec(mixed_schema()).example_batch(3)
    side.run(model, batch)  # built on a whole batch first
    del batch[column]
    with pytest.raises(SchemaError, match=rf"'{column}'.* missing from the (batch|input)"):
        side.run(model, batch)


def test_embedding_tables_follow_the_spec(side):
    schema = mixed_schema()
    spec = feature_spec(schema)
    tables = side.pkg.embedding_tables_from_schema(schema)
    out = side.tables_out(tables, spec.example_batch(4))
    assert {k: v.shape for k, v in out.items()} == {k: (4, d) for k, d in spec.output_dims.items()}


@pytest.mark.parametrize("threshold", [0, -1])
def test_split_embeddings_refuses_a_threshold_below_one(side, threshold):
    tables = side.pkg.embedding_tables_from_schema(mixed_schema())
    with pytest.raises(ValueError, match=rf"threshold must be >= 1, got {threshold}"):
        side.pkg.split_embeddings_on_size(tables, threshold)


@pytest.mark.parametrize("threshold", [100.0, "100", True])
def test_split_embeddings_refuses_a_threshold_that_is_not_an_int(side, threshold):
    tables = side.pkg.embedding_tables_from_schema(mixed_schema())
    with pytest.raises(TypeError, match=r"threshold must be an int, got"):
        side.pkg.split_embeddings_on_size(tables, threshold)


def test_split_embeddings_splits_on_the_same_sizes(side):
    configs = feature_spec(mixed_schema()).tables   # 1000, 24 and 50 rows
    large, small = side.pkg.split_embeddings_on_size(list(configs), 50)
    assert [c.name for c in large] == ["C1", "tags"] and [c.name for c in small] == ["hour"]


def test_a_continuous_list_column_is_refused(side):
    schema = Schema([cat("C1", 10), cat("C2", 10), cont("scores", is_list=True), TARGET])
    with pytest.raises(ValueError, match=r"continuous list columns \['scores'\] are not supported"):
        side.models()["DLRM"](schema)


def test_a_categorical_column_without_a_domain_is_refused(side):
    schema = Schema([cat("C1", 10), ColumnSchema("C2", "int64", tags=[Tags.CATEGORICAL]), TARGET])
    with pytest.raises(ValueError, match=r"categorical column 'C2' has no domain"):
        side.pkg.embedding_tables_from_schema(schema)


def test_no_categorical_column_to_embed_is_refused(side):
    schema = Schema([cont("x"), TARGET])
    with pytest.raises(ValueError, match=r"no categorical feature columns to embed; columns: "
                                         r"\['x', 'click'\]"):
        side.pkg.embedding_tables_from_schema(schema)


def test_a_schema_that_is_not_a_schema_is_a_type_error(side):
    with pytest.raises(TypeError, match=r"schema must be a tabstream Schema, got list"):
        side.models()["DLRM"](["C1", "C2"])


def two_tower_schema() -> Schema:
    return Schema([cat("user_id", 20, tags=[Tags.USER, Tags.USER_ID, Tags.ID]),
                   cat("item_id", 30, tags=[Tags.ITEM, Tags.ITEM_ID, Tags.ID]), TARGET])


@pytest.mark.parametrize("temperature", [0.0, -1.0, float("nan")])
def test_two_tower_temperature_must_be_positive(side, temperature):
    with pytest.raises(ValueError, match=r"TwoTower: temperature must be > 0 and finite"):
        side.pkg.TwoTower(two_tower_schema(), temperature=temperature)


def test_two_tower_temperature_must_be_a_number(side):
    with pytest.raises(TypeError, match=r"TwoTower: temperature must be a number, got '0.1'"):
        side.pkg.TwoTower(two_tower_schema(), temperature="0.1")


def test_two_tower_vectors_have_the_same_names_and_shapes(side):
    schema = two_tower_schema()
    model = side.pkg.TwoTower(schema)
    batch = feature_spec(schema).example_batch(5)
    if side.name == "torch":
        with side.torch.no_grad():
            q = model.query_embeddings(side.batch(batch)).numpy()
            c = model.candidate_embeddings(side.batch(batch)).numpy()
    else:
        q = np.asarray(model.query_embeddings(side.batch(batch)))
        c = np.asarray(model.candidate_embeddings(side.batch(batch)))
    assert q.shape == c.shape == (5, 32)  # both default to 32-wide, L2-normalized vectors
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), 1.0, rtol=1e-5)


def test_cross_network_has_one_name(side):
    block = side.pkg.CrossNetwork
    assert block.__name__ in ("CrossNetwork", "CrossNetV2")
    assert "CrossNetwork" in side.pkg.__all__

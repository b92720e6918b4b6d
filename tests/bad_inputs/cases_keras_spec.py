"""The shared training spec: schemas the models cannot read, bad settings (the same
errors in torch and Keras; the framework-neutral checks run here without either)."""

from __future__ import annotations

from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.train.spec import check_positive, check_threshold, feature_spec


def _cat(name: str, card: int | None, is_list: bool = False) -> ColumnSchema:
    props = {} if card is None else {"domain": {"min": 0, "max": card - 1}}
    return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], properties=props, is_list=is_list)


_TARGET = ColumnSchema("click", "float32", tags=[Tags.TARGET])


def _continuous_list(tmp):
    feature_spec(Schema([_cat("C1", 10), ColumnSchema("hist", "float32", tags=[Tags.CONTINUOUS],
                                                      is_list=True), _TARGET]))


def _no_domain(tmp):
    feature_spec(Schema([_cat("C1", 10), _cat("C2", None), _TARGET]))


def _not_a_schema(tmp):
    feature_spec(["C1", "C2"])


def _threshold_float(tmp):
    check_threshold(1e5)


def _threshold_zero(tmp):
    check_threshold(0)


def _temperature_string(tmp):
    check_positive("0.1", "TwoTower: temperature")


def _temperature_negative(tmp):
    check_positive(-0.5, "TwoTower: temperature")


def _both_tags_is_categorical(tmp):
    # not an error: a column tagged categorical and continuous is embedded only
    both = ColumnSchema("hour", "int64", tags=[Tags.CATEGORICAL, Tags.CONTINUOUS],
                        properties={"domain": {"min": 0, "max": 23}})
    spec = feature_spec(Schema([both, ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
                                _TARGET]))
    assert spec.categorical == ("hour",) and spec.continuous == ("x",), spec


CASES = [
    ("continuous list column", _continuous_list, ValueError,
     r"continuous list columns \['hist'\] are not supported"),
    ("categorical column without a domain", _no_domain, ValueError,
     r"categorical column 'C2' has no domain"),
    ("schema is a list of names", _not_a_schema, TypeError,
     r"schema must be a tabstream Schema, got list"),
    ("split threshold as a float", _threshold_float, TypeError,
     r"threshold must be an int, got 100000\.0 \(float\)"),
    ("split threshold zero", _threshold_zero, ValueError, r"threshold must be >= 1, got 0"),
    ("temperature as a string", _temperature_string, TypeError,
     r"TwoTower: temperature must be a number, got '0\.1'"),
    ("negative temperature", _temperature_negative, ValueError,
     r"TwoTower: temperature must be > 0 and finite, got -0\.5"),
    ("column tagged categorical and continuous", _both_tags_is_categorical, None, None),
]

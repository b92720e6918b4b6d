import pytest

from tabstream import ColumnSchema, ColumnSelector, Schema, Tags
from tabstream.core.errors import SchemaError


def make_schema() -> Schema:
    return Schema([
        ColumnSchema("user", "int64", tags=[Tags.USER_ID, Tags.CATEGORICAL],
                     properties={"domain": {"min": 0, "max": 99}}),
        ColumnSchema("price", "float32", tags=["continuous"]),
        ColumnSchema("hist", "int64", tags=[Tags.CATEGORICAL], is_list=True, is_ragged=True,
                     properties={"value_count": {"min": 0, "max": 5}}),
        ColumnSchema("label", "int64", tags=[Tags.TARGET]),
    ])


def test_json_round_trip_keeps_everything():
    schema = make_schema()
    again = Schema.from_json(schema.to_json())
    assert again == schema
    assert again["user"].cardinality == 100
    # a list column's tags are the ones given (Merlin's): LIST is not added by itself
    assert again["hist"].is_list and again["hist"].tags == frozenset({Tags.CATEGORICAL})


def test_json_file_round_trip(tmp_path):
    path = str(tmp_path / "schema.json")
    make_schema().to_json(path)
    assert Schema.from_json(path) == make_schema()


def test_composite_tags_expand():
    col = make_schema()["user"]
    assert {Tags.USER, Tags.ID, Tags.USER_ID} <= col.tags


def test_select_by_tag_and_name():
    schema = make_schema()
    assert schema.select_by_tag(Tags.CATEGORICAL).column_names == ["user", "hist"]
    assert schema.select_by_tag([Tags.CATEGORICAL, Tags.USER]).column_names == ["user"]
    assert schema.select_by_tag([Tags.TARGET, Tags.CONTINUOUS], any_=True).column_names == ["price", "label"]
    assert schema.select_by_name(["label", "user"]).column_names == ["label", "user"]
    assert schema.without(["price"]).column_names == ["user", "hist", "label"]


def test_missing_column_error_lists_available():
    with pytest.raises(KeyError, match=r"\['nope'\].*available.*'user', 'price', 'hist', 'label'"):
        make_schema().select_by_name(["nope"])


def test_misspelt_tag_is_rejected_and_free_form_tags_are_kept():
    with pytest.raises(ValueError, match="unknown tag 'categorial'; did you mean 'categorical'"):
        ColumnSchema("x", tags=["categorial"])
    col = ColumnSchema("x", tags=["colour", Tags.CATEGORICAL])  # free-form beside the members
    assert sorted(t.value for t in col.tags) == ["categorical", "colour"]
    assert ColumnSchema.from_dict(col.to_dict()) == col


def test_selector_by_tag_resolves_and_reports_missing():
    schema = make_schema()
    assert ColumnSelector(tags=[Tags.CATEGORICAL]).resolve(schema) == ["user", "hist"]
    with pytest.raises(SchemaError, match="no column carries tags"):
        ColumnSelector(tags=[Tags.ITEM]).resolve(schema)
    with pytest.raises(SchemaError, match=r"\['missing'\] do not exist; available columns"):
        ColumnSelector(["missing"]).resolve(schema)


def test_bad_schema_json_is_reported(tmp_path):
    bad = tmp_path / "schema.json"
    bad.write_text('{"cols": []}')
    with pytest.raises(ValueError, match="not a tabstream schema"):
        Schema.from_json(str(bad))

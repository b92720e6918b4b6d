"""``Schema.from_dict`` / ``ColumnSchema.from_dict`` (the readers of ``_schema.json``,
a saved workflow's schemas, a data file's ``tabstream.schema`` metadata) check every
field's type and the ``domain``, and refuse a newer ``version``; free-form tags
(``CustomTag``) survive ``schema.pbtxt`` both ways. (Schema tests live beside
test_schema.py: the module was tabstream.pipeline.schema.)"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.core.schema import ColumnSchema, CustomTag, Schema, Tags

GOOD = {"name": "C1", "dtype": "int64", "tags": ["categorical"], "is_list": False, "is_ragged": False,
        "properties": {"domain": {"min": 0, "max": 41, "name": "C1"},
                       "embedding_sizes": {"cardinality": 42, "dimension": 16}}}


def with_(**fields):
    return {**GOOD, **fields}


def test_a_good_column_round_trips_and_its_cardinality_is_max_plus_one():
    col = ColumnSchema.from_dict(GOOD)
    assert col.to_dict() == GOOD
    assert col.cardinality == GOOD["properties"]["domain"]["max"] + 1


@pytest.mark.parametrize("column, said", [
    ("x", r"^columns\[0\]: expected an object with a 'name'.*got 'x' \(a string\)$"),
    (with_(name=""), r"^columns\[0\]: field 'name' is '' \(a string\); expected the column's name"),
    (with_(name=3), r"^columns\[0\]: field 'name' is 3 \(an integer\)"),
    (with_(dtype=None), r"^schema column 'C1' \(columns\[0\]\): field 'dtype' is None \(null\)"),
    (with_(tags=5), r"^schema column 'C1' \(columns\[0\]\): field 'tags' is 5 \(an integer\); expected a list"),
    (with_(tags="categorical"), r"field 'tags' is 'categorical' \(a string\); expected a list"),
    (with_(tags=["categorical", 4]), r"field 'tags' is \['categorical', 4\] \(a list\)"),
    (with_(is_list="no"), r"field 'is_list' is 'no' \(a string\); expected true or false"),
    (with_(is_ragged=1), r"field 'is_ragged' is 1 \(an integer\); expected true or false"),
    (with_(properties=[]), r"field 'properties' is \[\] \(a list\); expected an object"),
    (with_(properties={"domain": 7}), r"properties.domain is 7 \(an integer\); expected an object "
                                      r"\{\"min\": \.\.\., \"max\": \.\.\.\} of integers"),
    (with_(properties={"domain": {"min": 0, "max": "x"}}), r"properties.domain.max is 'x' \(a string\); "
                                                           r"expected an integer"),
    (with_(properties={"domain": {"min": 0, "max": 4.5}}), r"properties.domain.max is 4.5 \(a number\); "
                                                           r"expected an integer"),
    (with_(properties={"domain": {"min": 0, "max": True}}), r"properties.domain.max is True"),
    (with_(properties={"domain": {"min": 0, "max": -5}}), r"properties.domain is \{'min': 0, 'max': -5\}: "
                                                          r"min 0 is above max -5; expected min <= max"),
    (with_(properties={"value_count": {"min": 3, "max": 1}}), r"properties.value_count is .*min 3 is above "
                                                              r"max 1"),
    (with_(properties={"merlin_tags": "session"}), r"properties.merlin_tags is 'session' \(a string\)"),
])
def test_a_bad_column_names_column_field_and_value(column, said):
    doc = {"columns": [column]}
    with pytest.raises(DataError, match=said):
        Schema.from_dict(doc)
    # and through from_json, the same words after the source
    with pytest.raises(DataError, match=r"^schema text: (.*: )?" + said.lstrip("^")):
        Schema.from_json(json.dumps(doc))


@pytest.mark.parametrize("doc, said", [
    ([], r"not a tabstream schema: expected an object with a 'columns' list, got \[\] \(a list\)"),
    ({}, r"not a tabstream schema: field 'columns' is None \(null\); expected a list"),
    ({"columns": {"C1": GOOD}}, r"field 'columns' is \{'C1'.* \(an object\); expected a list"),
    ({"columns": [GOOD, GOOD]}, r"columns\[1\]: column 'C1' is listed twice"),
    ({"version": 2, "columns": [GOOD]}, r"schema version 2: this tabstream reads versions 1 to 1; it was "
                                        r"written by a newer tabstream: upgrade tabstream"),
    ({"format": "tabstream.schema/3", "columns": [GOOD]}, r"schema format 'tabstream.schema/3'.*newer"),
    ({"format": "merlin", "columns": [GOOD]}, r"field 'format' is 'merlin' \(a string\)"),
    ({"version": 0, "columns": [GOOD]}, r"field 'version' is 0 \(an integer\); expected a version number"),
])
def test_a_bad_schema_document_is_refused(doc, said):
    with pytest.raises(DataError, match=said):
        Schema.from_dict(doc)


def test_what_older_files_hold_still_reads():
    # no version (every _schema.json before), format/version 1 spelt out, a float
    # domain of a continuous column (Merlin's float_domain), a domain of whole floats
    # (JSON from other tools), and no properties at all
    cont = {"name": "price", "dtype": "float32", "tags": ["continuous"],
            "properties": {"domain": {"min": -1.5, "max": 999.5}}}
    whole = with_(name="C2", properties={"domain": {"min": 0.0, "max": 9.0}})
    bare = {"name": "raw"}
    for doc in ({"columns": [GOOD, cont, whole, bare]},
                {"format": "tabstream.schema/1", "version": 1, "columns": [GOOD, cont, whole, bare]}):
        schema = Schema.from_dict(doc)
        assert schema.column_names == ["C1", "price", "C2", "raw"]
        assert schema["price"].properties["domain"] == cont["properties"]["domain"]
        assert schema["C2"].cardinality == int(whole["properties"]["domain"]["max"]) + 1
        assert schema["raw"] == ColumnSchema("raw")


def test_to_json_writes_the_version_and_reads_back():
    schema = Schema([ColumnSchema.from_dict(GOOD)])
    doc = json.loads(schema.to_json())
    assert doc == {"version": 1, **schema.to_dict()}
    assert Schema.from_json(schema.to_json()) == schema


def test_a_schema_file_read_by_from_json_is_named(tmp_path):
    path = tmp_path / "schema.json"
    path.write_text(json.dumps({"columns": [with_(tags=5)]}))
    with pytest.raises(DataError, match=rf"^{path}: schema column 'C1' \(columns\[0\]\): field 'tags' is 5"):
        Schema.from_json(str(path))


def test_cardinality_of_a_bad_domain_built_in_code_is_a_clear_error():
    # from_dict checks files; a column built in code with a broken domain says so when asked
    for domain in (7, {"min": 0, "max": "x"}, {"min": 0}):
        col = ColumnSchema("C1", "int64", [Tags.CATEGORICAL], {"domain": domain})
        with pytest.raises(DataError, match=r"column 'C1': properties\['domain'\] is .*; expected "
                                            r"\{\"min\": <int>, \"max\": <int>\}"):
            col.cardinality  # noqa: B018


# -- free-form tags ----------------------------------------------------------------
def test_merlin_tags_property_of_older_files_becomes_tags():
    doc = with_(properties={**GOOD["properties"], "merlin_tags": ["session_id", "Sequence"]})
    col = ColumnSchema.from_dict(doc)
    assert col.tags == {Tags.CATEGORICAL, CustomTag("session_id"), CustomTag("Sequence")}
    assert "merlin_tags" not in col.properties
    assert Schema([col]).select_by_tag("session_id").column_names == ["C1"]
    # a member's name among them is that member
    assert ColumnSchema("c", tags=[], properties={"merlin_tags": ["item"]}).tags == {Tags.ITEM}


def _custom_schema() -> Schema:
    # (pbtxt writes a domain's name, the column's by default: given here, so == holds)
    return Schema([ColumnSchema("session", "int64", [Tags.CATEGORICAL, "session_id"],
                                {"domain": {"min": 0, "max": 9, "name": "session"}}),
                   ColumnSchema("hist", "int64", [Tags.CATEGORICAL, Tags.LIST, "sequence"],
                                {"domain": {"min": 0, "max": 9, "name": "hist"}}, is_list=True, is_ragged=True),
                   ColumnSchema("y", "int64", [Tags.TARGET])])


def tagged(schema: Schema, tag: str) -> list[str]:
    """The columns tagged ``tag``, by the tags' plain names (a second way)."""
    return [c.name for c in schema if tag in {str(t.value) for t in c.tags}]


def test_custom_tags_survive_the_pbtxt_round_trip():
    schema = _custom_schema()
    back = Schema.from_merlin_pbtxt(schema.to_merlin_pbtxt())
    assert back == schema
    for tag in ("session_id", "sequence"):
        assert back.select_by_tag(tag).column_names == tagged(schema, tag) != []
        assert all("merlin_tags" not in c.properties for c in back)
    assert isinstance(next(t for t in back["session"].tags if t == "session_id"), CustomTag)


def test_pbtxt_tags_close_to_a_member_are_read_as_written():
    # a file's tag is never judged a misspelling (normalize_tags would refuse "categorial")
    text = 'feature {\n  name: "c"\n  type: INT\n  annotation {\n    tag: "categorial"\n  }\n}\n'
    assert Schema.from_merlin_pbtxt(text)["c"].tags == {CustomTag("categorial")}


def test_nvtabular_folder_read_by_dataset_keeps_custom_tags(tmp_path: Path):
    schema = _custom_schema()
    pd.DataFrame({"session": [1, 2, 3], "hist": [[1], [2, 3], []], "y": [0, 1, 0]}).to_parquet(
        tmp_path / "part_0.parquet")
    (tmp_path / "schema.pbtxt").write_text(schema.to_merlin_pbtxt())
    ds = ts.Dataset(str(tmp_path), engine="parquet")
    assert ds.schema.select_by_tag("session_id").column_names == tagged(schema, "session_id")
    assert ds.schema.select_by_tag("sequence").column_names == tagged(schema, "sequence")


def test_what_tabstream_writes_reads_back():
    """Free-form tags close to a Tags member ("items", "users") and a categorical
    domain from -1 (raw ids with a sentinel, as Merlin files have): written by
    to_json, read back the same (they were refused on reading)."""
    cols = [ColumnSchema("c", "int64", tags=[Tags.CATEGORICAL, CustomTag("items"), CustomTag("users")],
                         properties={"domain": {"min": -1, "max": 100}}),
            ColumnSchema("g", "int64", tags=[CustomTag("categorial")])]
    back = Schema.from_json(Schema(cols).to_json())
    assert back["c"].tags == {Tags.CATEGORICAL, CustomTag("items"), CustomTag("users")}
    assert back["c"].properties["domain"] == {"min": -1, "max": 100}
    assert back["c"].cardinality == 101
    assert back["g"].tags == {CustomTag("categorial")}
    assert back.select_by_tag(CustomTag("items")).column_names == ["c"]

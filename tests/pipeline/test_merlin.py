"""NVTabular/Merlin schema interop: ``schema.pbtxt`` and ``.merlin/schema.json``.

The fixture ``data/nvtabular_schema.pbtxt`` is in NVTabular's format: its
``extra_metadata`` values were serialized by Google's own protobuf library, not
by tabstream, and the expected columns below are written out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError
from tabstream.core.merlin import schema_from_merlin_json
from tabstream.core.schema import ColumnSchema, Schema, Tags

FIXTURE = Path(__file__).parent / "data" / "nvtabular_schema.pbtxt"

EXPECTED = Schema([
    ColumnSchema("user_id", "int64", [Tags.CATEGORICAL, Tags.USER_ID],
                 {"domain": {"min": 0, "max": 999, "name": "user_id"}, "num_buckets": None, "freq_threshold": 0,
                  "max_size": 0, "start_index": 0,
                  "cat_path": ".//categories/unique.user_id.parquet",
                  "embedding_sizes": {"cardinality": 1000, "dimension": 64}}),
    ColumnSchema("item_category_list", "int32", [Tags.CATEGORICAL, Tags.ITEM, Tags.LIST],
                 {"domain": {"min": 0, "max": 49, "name": "item_category_list"}, "value_count": {"min": 1, "max": 20},
                  "embedding_sizes": {"cardinality": 50, "dimension": 16},
                  "merlin_tags": ["sequence"]}, is_list=True, is_ragged=True),
    ColumnSchema("price", "float32", [Tags.CONTINUOUS, Tags.ITEM],
                 {"domain": {"min": 0.0, "max": 999.5, "name": "price"}}),
    ColumnSchema("session_vec", "float32", [Tags.EMBEDDING],
                 {"value_count": {"min": 4, "max": 4}, "merlin_tags": ["session"]},
                 is_list=True, is_ragged=False),
    ColumnSchema("click", "int8", [Tags.BINARY_CLASSIFICATION, Tags.TARGET]),
])


def test_reads_nvtabular_pbtxt_with_tags_domains_and_properties():
    schema = Schema.from_merlin_pbtxt(FIXTURE.read_text())
    assert schema.column_names == EXPECTED.column_names
    for got, want in zip(schema, EXPECTED):
        assert got == want, got.name
    assert schema["user_id"].cardinality == 1000
    assert schema.select_by_tag(Tags.CATEGORICAL).column_names == ["user_id", "item_category_list"]


def test_round_trips_through_pbtxt():
    schema = Schema.from_merlin_pbtxt(FIXTURE.read_text())
    again = Schema.from_merlin_pbtxt(schema.to_merlin_pbtxt())
    assert again == schema
    # and a tabstream schema with every kind of column
    wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.Normalize()) + ["y"])
    wf.fit(ts.Dataset(pd.DataFrame({"c": ["a", "b", "a"], "x": [1.0, 2.0, 4.0], "y": [0, 1, 0]})))
    assert Schema.from_merlin_pbtxt(wf.output_schema.to_merlin_pbtxt()) == wf.output_schema


def test_written_metadata_is_a_protobuf_struct_google_can_read():
    struct_pb2 = pytest.importorskip("google.protobuf.struct_pb2")
    text_encoding = pytest.importorskip("google.protobuf.text_encoding")
    text = EXPECTED.to_merlin_pbtxt()
    values = [line.split("value: ", 1)[1] for line in text.splitlines() if "value: " in line]
    assert len(values) == len(EXPECTED)
    first = struct_pb2.Struct()
    first.ParseFromString(text_encoding.CUnescape(values[0][1:-1]))
    from google.protobuf.json_format import MessageToDict

    got = MessageToDict(first)
    assert got["embedding_sizes"] == {"cardinality": 1000.0, "dimension": 64.0}
    assert got["dtype_item_size"] == 64.0 and got["is_list"] is False
    assert got["cat_path"] == ".//categories/unique.user_id.parquet"
    assert "domain" not in got  # the domain lives in int_domain
    assert 'int_domain {\n    name: "user_id"\n    min: 0\n    max: 999\n    is_categorical: true' in text
    assert 'value_count {\n    min: 1\n    max: 20' in text and "dim { size: 4 }" in text
    assert 'tag: "sequence"' in text


def _nvtabular_folder(tmp_path: Path, schema_file: str, content: str) -> tuple[Path, pd.DataFrame]:
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"user_id": rng.integers(0, 1000, 50), "price": rng.random(50).astype("float32"),
                       "click": rng.integers(0, 2, 50).astype("int8")})
    out = tmp_path / "nvt_export"
    out.mkdir()
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table.slice(0, 25), out / "part_0.parquet")
    pq.write_table(table.slice(25), out / "part_1.parquet")
    (out / "_file_list.txt").write_text("2\npart_0.parquet\npart_1.parquet\n")
    metadata = pq.read_metadata(out / "part_0.parquet")  # NVTabular's _metadata: all footers
    metadata.set_file_path("part_0.parquet")
    second = pq.read_metadata(out / "part_1.parquet")
    second.set_file_path("part_1.parquet")
    metadata.append_row_groups(second)
    metadata.write_metadata_file(str(out / "_metadata"))
    (out / "_metadata.json").write_text('{"data_paths": ["part_0.parquet", "part_1.parquet"]}')
    (out / schema_file).parent.mkdir(exist_ok=True)
    (out / schema_file).write_text(content)
    return out, df


def test_dataset_reads_an_nvtabular_export_keeping_tags(tmp_path):
    out, df = _nvtabular_folder(tmp_path, "schema.pbtxt", FIXTURE.read_text())
    ds = ts.Dataset(str(out))
    assert ds.schema.column_names == list(df.columns)
    assert ds.schema["user_id"].tags == EXPECTED["user_id"].tags
    assert ds.schema["user_id"].properties["embedding_sizes"] == {"cardinality": 1000, "dimension": 64}
    assert ds.schema["click"].tags == frozenset({Tags.TARGET, Tags.BINARY_CLASSIFICATION})
    assert ds.num_rows == len(df)


def test_dataset_reads_merlin_json_schema(tmp_path):
    doc = {"feature": [
        {"name": "user_id", "type": "INT",
         "intDomain": {"name": "user_id", "min": "0", "max": "999", "isCategorical": True},
         "annotation": {"tag": ["categorical", "user_id"], "extraMetadata": [
             {"@type": "type.googleapis.com/google.protobuf.Struct",
              "value": {"embedding_sizes": {"cardinality": 1000.0, "dimension": 64.0},
                        "dtype_item_size": 64.0, "is_list": False, "is_ragged": False}}]}},
        {"name": "price", "type": "FLOAT", "annotation": {"tag": ["continuous"]}},
    ]}
    out, _ = _nvtabular_folder(tmp_path, ".merlin/schema.json", json.dumps(doc))
    ds = ts.Dataset(str(out))
    assert ds.schema["user_id"] == ColumnSchema(
        "user_id", "int64", [Tags.CATEGORICAL, Tags.USER_ID],
        {"domain": {"min": 0, "max": 999, "name": "user_id"}, "embedding_sizes": {"cardinality": 1000, "dimension": 64}})
    assert ds.schema["price"].tags == frozenset({Tags.CONTINUOUS})
    assert ds.schema["click"].tags == frozenset()


@pytest.mark.parametrize("text, match", [
    ('feature {\n  name: "a"\n  type: INT\n', r"schema\.pbtxt: a message is not closed \(missing '}'\)"),
    ('feature {\n  name: "a"\n  type: TEXT\n}\n', r"feature 'a': unknown feature type 'TEXT'"),
    ('feature {\n  name: "a"\n  int_domain { max: many }\n}\n',
     r"feature 'a', int_domain\.max: expected an integer, got 'many'"),
    ('feature {\n  name: "a"\n  }\n}\n', r"schema\.pbtxt, line 4: expected a field name, got '}'"),
    ('feature {\n  name: "a\\q"\n}\n', r"schema\.pbtxt, line 2: unknown escape \\q"),
    ('feature {\n  name: "a"\n  annotation { extra_metadata { type_url: "x.Any" value: "" } }\n}\n',
     r"feature 'a': extra_metadata of type 'x\.Any'; expected .*google\.protobuf\.Struct"),
    ('feature {\n  name: "a"\n  annotation { extra_metadata { value: "\\n\\005\\n\\001a" } }\n}\n',
     r"feature 'a': extra_metadata is truncated"),
    ('feature {\n  name: "a"\n  annotation { extra_metadata { value: "\\n\\010\\n\\001a\\022\\003\\021\\000\\000" } }\n}\n',
     r"feature 'a': extra_metadata is truncated"),
    ('feature {\n  name: "a"\n  annotation { extra_metadata { value: "\\n\\005\\n\\003\\377ab" } }\n}\n',
     r"feature 'a': extra_metadata holds text that is not UTF-8 \(byte 0"),
])
def test_bad_pbtxt(text, match):
    with pytest.raises(DataError, match=match):
        Schema.from_merlin_pbtxt(text)


def test_bad_merlin_json():
    with pytest.raises(DataError, match=r"schema\.json: not JSON"):
        schema_from_merlin_json("{nope")
    with pytest.raises(DataError, match=r"feature 'a', domain\.max: expected an integer, got 'x'"):
        schema_from_merlin_json('{"feature": [{"name": "a", "intDomain": {"max": "x"}}]}')


def test_unsupported_property_value_is_a_type_error():
    col = ColumnSchema("a", "int64", properties={"when": object()})
    with pytest.raises(TypeError, match=r"cannot write property value .*object.* into a Merlin schema"):
        Schema([col]).to_merlin_pbtxt()

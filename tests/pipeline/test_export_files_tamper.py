"""An export's own files, edited or written by a newer tabstream: ``_manifest.json``
of another ``format`` or a newer version, ``_schema.json`` of a newer ``version`` or
holding values of the wrong type, are refused with a DataError naming the file (and
the column, field and value), never read as if they were today's format."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    df = pd.DataFrame({"s": list("abcdefghij") * 4, "x": [float(i) for i in range(40)], "y": [0, 1] * 20})
    wf = ts.Workflow((["s"] >> ops.Categorify()) + (["x"] >> ops.Normalize())
                     + (["y"] >> ops.AddTags(["target"])))
    wf.fit(ts.Dataset(df))
    out = tmp_path_factory.mktemp("tamper") / "exp"
    wf.transform(ts.Dataset(df)).to_parquet(str(out))
    return out


def edited(export: Path, tmp_path: Path, name: str, edit) -> Path:
    """A copy of ``export`` whose JSON file ``name`` went through ``edit(doc)``."""
    copy = tmp_path / "copy"
    shutil.copytree(export, copy)
    doc = json.loads((copy / name).read_text())
    edit(doc)
    (copy / name).write_text(json.dumps(doc))
    return copy


def rows_in_parts(folder: Path) -> int:
    return sum(len(pd.read_parquet(p)) for p in folder.glob("part_*.parquet"))


# -- _manifest.json ---------------------------------------------------------------
def test_manifest_as_written_is_read(export):
    manifest = json.loads((export / "_manifest.json").read_text())
    assert manifest["format"] == "tabstream.export"
    assert ts.Dataset(str(export)).num_rows == rows_in_parts(export) == manifest["num_rows"]


@pytest.mark.parametrize("edit", [
    pytest.param(lambda d: d.__setitem__("format", "tabstream.export/2"), id="format/2"),
    pytest.param(lambda d: d.__setitem__("version", 2), id="version-2"),
])
def test_manifest_of_a_newer_tabstream_is_refused(export, tmp_path, edit):
    folder = edited(export, tmp_path, "_manifest.json", edit)
    with pytest.raises(DataError, match=r"_manifest\.json: export manifest of version 2 .*written by a "
                                        r"newer tabstream.*upgrade tabstream") as info:
        ts.Dataset(str(folder))
    assert info.value.hint == "upgrade tabstream"


@pytest.mark.parametrize("fmt", ["garbage", "tabstream.export/x", 7, "parquet.export"])
def test_manifest_of_another_format_is_refused(export, tmp_path, fmt):
    folder = edited(export, tmp_path, "_manifest.json", lambda d: d.__setitem__("format", fmt))
    with pytest.raises(DataError, match=r"_manifest\.json: not a tabstream export manifest \(field "
                                        rf"'format' is {repr(fmt)!s}; expected 'tabstream.export'\)"):
        ts.Dataset(str(folder))


@pytest.mark.parametrize("version", ["2", None, 0, True])
def test_manifest_version_not_a_version_is_refused(export, tmp_path, version):
    folder = edited(export, tmp_path, "_manifest.json", lambda d: d.__setitem__("version", version))
    with pytest.raises(DataError, match=rf"_manifest\.json: not a valid export manifest \(field "
                                        rf"'version' is {version!r}; expected 1\)"):
        ts.Dataset(str(folder))


def test_manifest_of_version_1_spelt_out_or_without_format_is_read(export, tmp_path):
    # "tabstream.export/1" and "version": 1 are today's format; a manifest made by hand
    # (no "format") is read as it always was
    for n, edit in enumerate([lambda d: d.update(format="tabstream.export/1", version=1),
                              lambda d: d.pop("format")]):
        folder = edited(export, tmp_path / str(n), "_manifest.json", edit)
        assert ts.Dataset(str(folder)).num_rows == rows_in_parts(folder)


def test_newer_export_is_still_an_export_to_the_writer(export, tmp_path):
    # exporting over it needs overwrite (it holds an export), and overwrite replaces it
    folder = edited(export, tmp_path, "_manifest.json", lambda d: d.__setitem__("format", "tabstream.export/2"))
    df = pd.DataFrame({"a": [1, 2, 3]})
    with pytest.raises(FileExistsError, match="holds a tabstream export"):
        ts.Dataset(df).to_parquet(str(folder))
    ts.Dataset(df).to_parquet(str(folder), overwrite=True)
    assert ts.Dataset(str(folder)).to_ddf().compute()["a"].tolist() == df["a"].tolist()


# -- _schema.json: version ------------------------------------------------------------
def test_schema_file_carries_its_version(export):
    doc = json.loads((export / "_schema.json").read_text())
    assert doc["version"] == 1
    assert [c["name"] for c in doc["columns"]] == ts.Dataset(str(export)).schema.column_names


def test_schema_file_without_version_still_loads(export, tmp_path):
    # as exports of older tabstreams wrote it
    folder = edited(export, tmp_path, "_schema.json", lambda d: d.pop("version", None))
    want = json.loads((export / "_schema.json").read_text())
    got = ts.Dataset(str(folder)).schema
    assert got.to_dict() == {"columns": want["columns"]}


@pytest.mark.parametrize("edit, said", [
    (lambda d: d.__setitem__("version", 2), r"schema version 2: this tabstream reads versions 1 to 1"),
    (lambda d: d.__setitem__("format", "tabstream.schema/2"), r"schema format 'tabstream.schema/2'"),
])
def test_schema_file_of_a_newer_tabstream_is_refused(export, tmp_path, edit, said):
    folder = edited(export, tmp_path, "_schema.json", edit)
    with pytest.raises(DataError, match=rf"_schema\.json: {said}.*written by a newer tabstream: upgrade"):
        ts.Dataset(str(folder))


@pytest.mark.parametrize("edit, said", [
    (lambda d: d.__setitem__("version", "one"), r"field 'version' is 'one' \(a string\)"),
    (lambda d: d.__setitem__("format", "garbage"), r"field 'format' is 'garbage' \(a string\); expected "
                                                   r"'tabstream.schema'"),
])
def test_schema_file_version_or_format_not_ours_is_refused(export, tmp_path, edit, said):
    folder = edited(export, tmp_path, "_schema.json", edit)
    with pytest.raises(DataError, match=rf"_schema\.json: not a tabstream schema: {said}"):
        ts.Dataset(str(folder))


# -- _schema.json: values -------------------------------------------------------------
def _col(doc, name="s"):
    return next(c for c in doc["columns"] if c["name"] == name)


BAD_VALUES = [
    ("tags-5", lambda d: _col(d).__setitem__("tags", 5), r"schema column 's' \(columns\[0\]\): field 'tags' is 5"),
    ("column-a-string", lambda d: d["columns"].__setitem__(0, "x"),
     r"columns\[0\]: expected an object with a 'name'.*got 'x' \(a string\)"),
    ("columns-an-object", lambda d: d.__setitem__("columns", {}), r"field 'columns' is \{\} \(an object\)"),
    ("properties-a-list", lambda d: _col(d).__setitem__("properties", []), r"field 'properties' is \[\]"),
    ("domain-max-a-string", lambda d: _col(d)["properties"]["domain"].__setitem__("max", "x"),
     r"schema column 's' \(columns\[0\]\): properties.domain.max is 'x' \(a string\); expected an integer"),
    ("domain-a-number", lambda d: _col(d)["properties"].__setitem__("domain", 7),
     r"properties.domain is 7 \(an integer\); expected an object"),
    ("domain-max-negative", lambda d: _col(d)["properties"]["domain"].__setitem__("max", -5),
     r"properties.domain is .*min 0 is above max -5; expected min <= max"),
    ("is-list-a-string", lambda d: _col(d).__setitem__("is_list", "no"),
     r"field 'is_list' is 'no' \(a string\); expected true or false"),
    ("name-missing", lambda d: _col(d).pop("name"), r"columns\[0\]: field 'name' is None"),
    ("listed-twice", lambda d: d["columns"].append(dict(_col(d))), r"column 's' is listed twice"),
]


@pytest.mark.parametrize("edit, said", [(e, s) for _, e, s in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES])
def test_bad_values_in_schema_file_name_file_column_field_and_value(export, tmp_path, edit, said):
    folder = edited(export, tmp_path, "_schema.json", edit)
    with pytest.raises(DataError, match=rf"^{str(folder / '_schema.json')}: .*{said}") as info:
        ts.Dataset(str(folder)).schema["s"].cardinality  # noqa: B018 - the old code failed only here
    assert info.value.hint  # says what to do


def test_domain_read_from_the_file_is_the_cardinality(export, tmp_path):
    # a domain edited to another valid one is read as written (max + 1 ids)
    folder = edited(export, tmp_path, "_schema.json", lambda d: _col(d)["properties"]["domain"].update(max=40))
    assert ts.Dataset(str(folder)).schema["s"].cardinality == 40 + 1

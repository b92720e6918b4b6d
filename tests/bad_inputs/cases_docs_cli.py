"""The command line's raw-log options and output folder, and inspect's hint for
headerless logs: one line plus a hint each."""

from __future__ import annotations

import json

import pandas as pd
from _corpus import CliFailed, cli


def _csv(tmp, header: bool = False) -> str:
    path = tmp / "log.csv"
    pd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "x"]}).to_csv(path, header=header, index=False)
    return str(path)


def _headerless_tsv_without_names(tmp):
    cli("synth", "criteo", tmp / "raw", "--rows", 50, "--format", "tsv")
    cli("inspect", tmp / "raw" / "part_00000.tsv", "--quiet")


def _headerless_csv_with_names_reads(tmp):
    report = json.loads(cli("inspect", _csv(tmp), "--names", "a,b", "--dtypes", "a=int64",
                            "--json", "--quiet"))
    cols = {c["name"]: c for c in report["columns"]}
    assert report["num_rows"] == 3 and cols["a"]["max"] == 3 and cols["b"]["distinct"] == 2


def _long_sep(tmp):
    cli("inspect", _csv(tmp), "--sep", "::", "--names", "a,b", "--quiet")


def _empty_name(tmp):
    cli("inspect", _csv(tmp), "--names", "a,,b", "--quiet")


def _repeated_name(tmp):
    cli("inspect", _csv(tmp), "--names", "a,a", "--quiet")


def _dtypes_without_equals(tmp):
    cli("inspect", _csv(tmp), "--names", "a,b", "--dtypes", "a", "--quiet")


def _unknown_dtype(tmp):
    cli("inspect", _csv(tmp), "--names", "a,b", "--dtypes", "a=int99", "--quiet")


def _dtype_of_unknown_column(tmp):
    cli("inspect", _csv(tmp), "--names", "a,b", "--dtypes", "z=int64", "--quiet")


def _an_export_in(folder):
    import tabstream as ts

    ts.Dataset(pd.DataFrame({"a": [1, 2]})).to_parquet(str(folder))


def _fit_into_existing_output(tmp):
    _an_export_in(tmp / "out")
    cli("fit", _csv(tmp), "--names", "label,C1", "--output", tmp / "out", "--quiet")


def _transform_into_existing_output(tmp):
    _an_export_in(tmp / "out")
    cli("transform", tmp / "wf", _csv(tmp), tmp / "out", "--names", "a,b", "--quiet")


def _nvt_folder(tmp, schema_text: str, name: str = "schema.pbtxt") -> str:
    out = tmp / "nvt"
    (out / ".merlin").mkdir(parents=True)
    pd.DataFrame({"user_id": [3, 1, 2], "click": [0, 1, 0]}).to_parquet(out / "part_0.parquet")
    (out / name).write_text(schema_text)
    return str(out)


_PBTXT = """feature {
  name: "user_id"
  type: INT
  int_domain { name: "user_id" min: 0 max: 9 is_categorical: true }
  annotation { tag: "categorical" tag: "user_id" }
}
feature {
  name: "click"
  type: INT
  annotation { tag: "target" tag: "binary_classification" }
}
"""


def _inspect_nvtabular_export_keeps_tags(tmp):
    report = json.loads(cli("inspect", _nvt_folder(tmp, _PBTXT), "--json", "--quiet"))
    cols = {c["name"]: c for c in report["columns"]}
    assert cols["user_id"]["tags"] == ["categorical", "id", "user", "user_id"]
    assert cols["user_id"]["cardinality"] == 10 and cols["user_id"]["distinct"] == 3
    assert cols["click"]["tags"] == ["binary_classification", "target"]


def _unclosed_pbtxt(tmp):
    cli("inspect", _nvt_folder(tmp, _PBTXT.rsplit("}", 1)[0]), "--quiet")


def _pbtxt_bad_domain(tmp):
    cli("inspect", _nvt_folder(tmp, _PBTXT.replace("max: 9", "max: nine")), "--quiet")


def _merlin_json_not_json(tmp):
    cli("inspect", _nvt_folder(tmp, "{not json", ".merlin/schema.json"), "--quiet")


def _plots_without_matplotlib(tmp):
    import sys

    saved = {k: v for k, v in sys.modules.items() if k == "matplotlib" or k.startswith("matplotlib.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["matplotlib"] = None  # import matplotlib now raises ImportError
    try:
        cli("inspect", _csv(tmp, header=True), "--plots", tmp / "plots", "--quiet")
    except CliFailed:
        assert not (tmp / "plots").exists()  # refused before any work
        raise
    finally:
        del sys.modules["matplotlib"]
        sys.modules.update(saved)


CASES = [
    ("--plots without matplotlib", _plots_without_matplotlib, CliFailed,
     r"ImportError: plots need matplotlib: pip install 'tabstream\[plots\]'"
     r"(.|\n)*hint: install the optional dependency"),
    ("inspect an NVTabular export keeps its tags", _inspect_nvtabular_export_keeps_tags, None, None),
    ("schema.pbtxt not closed", _unclosed_pbtxt, CliFailed,
     r"DataError: .*nvt/schema\.pbtxt: a message is not closed \(missing '}'\)"
     r"(.|\n)*hint: fix or remove schema\.pbtxt: tabstream reads it only for"),
    ("schema.pbtxt domain not a number", _pbtxt_bad_domain, CliFailed,
     r"DataError: .*nvt/schema\.pbtxt, feature 'user_id', int_domain\.max: expected an integer, got 'nine'"),
    (".merlin/schema.json not JSON", _merlin_json_not_json, CliFailed,
     r"DataError: .*nvt/\.merlin/schema\.json: not JSON"),
    ("inspect headerless TSV without names", _headerless_tsv_without_names, CliFailed,
     r"DataError: .*part_00000\.tsv, line 1 holds (the number|an empty field) .*not column names"
     r"(.|\n)*hint: pass --names .*--criteo-tsv.*--header"),
    ("headerless CSV with --names reads", _headerless_csv_with_names_reads, None, None),
    ("--sep of two characters", _long_sep, CliFailed, r"ValueError: --sep '::': expected one character"),
    ("--names with an empty name", _empty_name, CliFailed, r"ValueError: --names 'a,,b': name 2 is empty"),
    ("--names repeated", _repeated_name, CliFailed, r"ValueError: --names 'a,a': \['a'\] given more than once"),
    ("--dtypes without =", _dtypes_without_equals, CliFailed,
     r"ValueError: --dtypes 'a': 'a' is not NAME=DTYPE"),
    ("--dtypes unknown type", _unknown_dtype, CliFailed,
     r"TypeError: --dtypes: column 'a': unsupported dtype 'int99'"),
    ("--dtypes for a column not in --names", _dtype_of_unknown_column, CliFailed,
     r"SchemaError: dtypes given for columns \['z'\] that are not in names"),
    ("fit into an existing output", _fit_into_existing_output, CliFailed,
     r"FileExistsError: output folder '.*out' already exists; pass overwrite=True to replace it: "
     r"it holds a tabstream export .*; nothing was fitted or written"
     r"(.|\n)*hint: pass --overwrite"),
    ("transform into an existing output", _transform_into_existing_output, CliFailed,
     r"FileExistsError: output folder '.*out' already exists"),
]

"""Writers (export, Categorify spills) meeting odd targets: a file where a folder is
to be made, a full disk, a path another export took first, partition folder names
that would make paths, more files than rows, one partition split in two."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError, ExportError

ROOT = Path(__file__).resolve().parents[2]


def _frame(n: int = 100) -> pd.DataFrame:
    return pd.DataFrame({"k": np.arange(n) % 3, "v": np.arange(n, dtype=np.float64)})


def _nothing_but(tmp, *names: str) -> None:
    assert sorted(os.listdir(tmp)) == sorted(names), f"left behind: {sorted(os.listdir(tmp))}"


def _file_in_the_way_export(tmp):
    (tmp / "afile").write_text("x")
    try:
        ts.Dataset(_frame()).to_parquet(str(tmp / "afile" / "out"))
    finally:
        _nothing_but(tmp, "afile")


def _file_in_the_way_spill(tmp):
    (tmp / "afile").write_text("x")
    wf = ts.Workflow(["k"] >> ops.Categorify(spill_rows=1, spill_dir=str(tmp / "afile")))
    try:
        wf.fit(ts.Dataset(_frame()))
    finally:
        _nothing_but(tmp, "afile")


FULL_DISK = """
    import resource, signal, sys
    import numpy as np, pandas as pd
    import tabstream as ts
    df = pd.DataFrame({"x": np.random.default_rng(0).random(300_000)})
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    ts.Dataset(df).to_parquet(sys.argv[1], num_files=2)
"""


def _full_disk_export(tmp):
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(FULL_DISK), str(tmp / "out")], env=env,
                          capture_output=True, text=True, timeout=120)
    _nothing_but(tmp)
    last = proc.stderr.strip().splitlines()[-1] if proc.returncode else "(exported)"
    raise ExportError(last)


def _taken_first(tmp):
    ts.Dataset(_frame(10)).to_parquet(str(tmp / "out"))
    ts.Dataset(_frame(20)).to_parquet(str(tmp / "out"))


def _partition_name(name):
    def run(tmp):
        df = _frame().rename(columns={"k": name})
        try:
            ts.Dataset(df).to_parquet(str(tmp / "out"), partition_on=[name])
        finally:
            _nothing_but(tmp)
    return run


def _hive_null_value(tmp):
    df = pd.DataFrame({"k": ["a", "__HIVE_DEFAULT_PARTITION__"], "v": [1.0, 2.0]})
    try:
        ts.Dataset(df).to_parquet(str(tmp / "out"), partition_on=["k"])
    finally:
        _nothing_but(tmp)


def _path_like_values(tmp):
    df = pd.DataFrame({"k": ["..", "../x", "a/b", "k=v", "%2F"], "v": np.arange(5.0)})
    ts.Dataset(df).to_parquet(str(tmp / "out"), partition_on=["k"])
    assert sorted(p.name for p in (tmp / "out").iterdir() if p.is_dir()) == sorted(
        f"k={v}" for v in ["..", "..%2Fx", "a%2Fb", "k%3Dv", "%252F"])
    back = ts.Dataset(str(tmp / "out")).to_ddf().compute().sort_values("v").reset_index(drop=True)
    pd.testing.assert_frame_equal(back[["k", "v"]], df, check_dtype=False)


def _counts(out: Path) -> list[int]:
    manifest = json.loads((out / "_manifest.json").read_text())
    counts = [e["num_rows"] for e in manifest["files"]]
    assert counts == [pq.read_metadata(out / e["path"]).num_rows for e in manifest["files"]]
    return counts


def _one_partition_two_files(tmp):
    df = _frame(1001)
    ds = ts.Dataset(df)
    assert ds.npartitions == 1
    ds.to_parquet(str(tmp / "out"), num_files=2)
    assert _counts(tmp / "out") == [501, 500]
    got = pd.read_parquet(tmp / "out")
    pd.testing.assert_frame_equal(got.reset_index(drop=True), df, check_dtype=False)


def _more_files_than_rows(tmp):
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ts.Dataset(_frame(3)).to_parquet(str(tmp / "out"), num_files=5)
    assert any("5 files were asked for, but the data has 3 rows" in str(w.message) for w in caught)
    assert _counts(tmp / "out") == [1, 1, 1]


def _filter_then_split(tmp):
    df = _frame(3000)
    ds = ts.Dataset(df, part_size=8000)
    wf = ts.Workflow(["k", "v"] >> ops.Filter(lambda f: f["v"] < 700)).fit(ds)
    wf.transform(ds).to_parquet(str(tmp / "out"), num_files=3)
    assert _counts(tmp / "out") == [234, 233, 233]


CASES = [
    ("export below a file", _file_in_the_way_export, ExportError,
     r"export to '.*afile/out' failed, nothing was written: '.*afile' is not a folder one can write in "
     r"\(\[Errno 20\] Not a directory.*give output_path a folder"),
    ("spill_dir is a file", _file_in_the_way_spill, OSError,
     r"Categorify: a spill of partial counts .* '.*afile' is not a folder .*give spill_dir a folder .*"
     r"\(now spill_dir='.*afile'\)"),
    ("export on a full disk", _full_disk_export, ExportError,
     r"ExportError: export to '.*out' failed, nothing was written: the filesystem of '.*' is full "
     r"\(\[Errno 27\] File too large\): free space there, or give output_path a folder on another disk"),
    ("export to a path another export took", _taken_first, FileExistsError,
     r"'.*out' already exists; pass overwrite=True"),
    ("partition_on column with '/'", _partition_name("a/b"), ValueError,
     r"partition_on: column name 'a/b' holds '/'.*rename the column first"),
    ("partition_on column '..'", _partition_name(".."), ValueError,
     r"partition_on: column name '\.\.' holds '\.\.'"),
    ("partition_on column with '='", _partition_name("k=1"), ValueError,
     r"partition_on: column name 'k=1' holds '='"),
    ("partition_on column starting with '_'", _partition_name("_k"), ValueError,
     r"partition_on: column name '_k' starts with '_'.*a hidden folder readers skip"),
    ("partition_on value named as the null folder", _hive_null_value, DataError,
     r"column 'k' holds the value '__HIVE_DEFAULT_PARTITION__'"),
    ("partition_on values that look like paths", _path_like_values, None, None),
    ("one partition, two files", _one_partition_two_files, None, None),
    ("more files than rows", _more_files_than_rows, None, None),
    ("a Filter, then equal files", _filter_then_split, None, None),
]

"""Groupby: parameters, graphs and data a user gets wrong, and sessions that span
files (read correctly)."""

from __future__ import annotations

import textwrap

import numpy as np
import pandas as pd
from _corpus import CliFailed, cli

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import SchemaError


def _events(tmp, files=3, n=300):
    """Parquet files of (session, ts, item); every session appears in every file."""
    rng = np.random.default_rng(5)
    frames = []
    for i in range(files):
        df = pd.DataFrame({"session": rng.integers(0, 20, n), "ts": rng.permutation(n) + i * n,
                           "item": rng.integers(0, 50, n)})
        df.to_parquet(tmp / f"day_{i}.parquet")
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def _fit(tmp, op, columns=("session", "ts", "item")):
    _events(tmp)
    wf = ts.Workflow(list(columns) >> op)
    wf.fit(ts.Dataset(str(tmp / "day_*.parquet")))


def _unknown_agg(tmp):
    ops.Groupby("session", aggs=["list", "mode"])


def _no_groupby_cols(tmp):
    ops.Groupby(aggs="list")


def _key_not_selected(tmp):
    _fit(tmp, ops.Groupby("user"))


def _sort_missing(tmp):
    _fit(tmp, ops.Groupby("session", sort_cols=["timestamp"]))


def _mean_of_strings(tmp):
    rng = np.random.default_rng(0)
    pd.DataFrame({"session": rng.integers(0, 5, 20), "name": ["a", "b"] * 10}).to_parquet(tmp / "s.parquet")
    wf = ts.Workflow(["session", "name"] >> ops.Groupby("session", aggs={"name": "mean"}))
    wf.fit(ts.Dataset(str(tmp / "s.parquet")))


def _stat_after_groupby(tmp):
    _fit(tmp, ops.Groupby("session", aggs="count"))  # fine alone
    wf = ts.Workflow(["session", "item"] >> ops.Groupby("session", aggs="count") >> ops.Normalize())
    wf.fit(ts.Dataset(str(tmp / "day_*.parquet")))


_WORKFLOW_FILE = textwrap.dedent("""
    import tabstream as ts
    from tabstream import ops
    workflow = ts.Workflow(["session", "ts", "item"] >> ops.Groupby("session", sort_cols={sort!r},
                                                                    aggs={{"item": ["list", "count"]}}))
""")


def _cli_sort_missing(tmp):
    _events(tmp)
    (tmp / "wf.py").write_text(_WORKFLOW_FILE.format(sort="when"))
    try:
        cli("fit", str(tmp / "day_*.parquet"), "--workflow-file", str(tmp / "wf.py"), "--quiet")
    except CliFailed as exc:
        raise SchemaError(str(exc)) from exc


def _sessions_span_files(tmp):
    """Every session is in all three files: the export has one row per session, its
    items in ts order, equal to pandas on the concatenated files."""
    raw = _events(tmp)
    (tmp / "wf.py").write_text(_WORKFLOW_FILE.format(sort="ts"))
    cli("fit", str(tmp / "day_*.parquet"), "--workflow-file", str(tmp / "wf.py"),
        "--output", str(tmp / "out"), "--quiet")
    got = ts.Dataset(str(tmp / "out")).to_ddf().compute().sort_values("session").reset_index(drop=True)
    ordered = raw.sort_values("ts", kind="stable").groupby("session")["item"]
    assert got["session"].tolist() == sorted(raw["session"].unique())
    assert [list(v) for v in got["item-list"]] == [list(v) for v in ordered.agg(list)]
    assert got["item-count"].tolist() == ordered.count().tolist()


CASES = [
    ("unknown aggregation", _unknown_agg, ValueError, r"unknown aggregation 'mode'.*supported: \['count'"),
    ("no groupby_cols", _no_groupby_cols, ValueError, r"groupby_cols is required"),
    # the keys join the selection (NVTabular's dependencies): a key the data lacks is named
    ("key column not selected", _key_not_selected, SchemaError,
     r"selected columns \['user'\] do not exist; available columns: \['session', 'ts', 'item'\]"),
    ("sort on a missing column", _sort_missing, SchemaError, r"sort_cols \['timestamp'\] are not among"),
    ("mean of a string column", _mean_of_strings, TypeError, r"'mean' needs a numeric column, but 'name' is string"),
    ("statistics op after Groupby", _stat_after_groupby, ValueError, r"Normalize\(.*\) comes after Groupby"),
    ("cli: sort on a missing column", _cli_sort_missing, SchemaError,
     r"tabstream fit: SchemaError: Groupby: sort_cols \['when'\] are not among.*\n  hint: check the column names"),
    ("sessions spanning files", _sessions_span_files, None, None),
]

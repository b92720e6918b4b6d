"""The workflow and raw rows the artifact parity tests serve (both frameworks).

Rows are drawn so that every rule of the in-graph ops is met: unseen strings and
numbers, nulls, NaN, -0.0 and 0.0, inf, the empty string, strings of every byte
width from 0 to 40 (ASCII and multi-byte UTF-8), values below Clip's bound and
LogOp's domain, values on Bucketize's boundaries.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd
import pyarrow as pa

import tabstream as ts
from tabstream import ops
from tabstream.core.schema import Tags

ALPHABET = list("abcdefghij") + ["é", "ß", "日", "🙂"]


def _strings(rng: np.random.Generator, n: int, pool: int) -> np.ndarray:
    """``pool`` distinct strings of 0..40 characters (1-4 UTF-8 bytes each), drawn ``n`` times."""
    words = {""}
    while len(words) < pool:
        length = int(rng.integers(0, 41))
        words.add("".join(rng.choice(ALPHABET, length)))
    words = np.array(sorted(words), dtype=object)
    # skewed: a few frequent values, a long tail below freq_threshold
    p = 1.0 / np.arange(1, pool + 1)
    return words[rng.choice(pool, n, p=p / p.sum())]


def frame(seed: int, n: int, pool: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    s = pd.Series(_strings(rng, n, pool), dtype=object)
    s[rng.random(n) < 0.1] = None
    i = pd.Series(rng.integers(-50, 200, n), dtype="Int64")
    i[rng.random(n) < 0.1] = pd.NA
    f = rng.normal(0, 3, n)
    f[rng.random(n) < 0.05] = 0.0
    f[rng.random(n) < 0.05] = -0.0
    f[rng.random(n) < 0.02] = np.inf
    f[rng.random(n) < 0.02] = -5.0  # below LogOp's domain once clipping is off
    g = np.round(rng.normal(0, 2, n), 1)  # a few values, on bucket boundaries too
    return pd.DataFrame({"s": s, "t": pd.Series(_strings(rng, n, 30), dtype=object), "i": i, "f": f,
                         "g": g, "label": rng.integers(0, 2, n)})


def arrow_rows(df: pd.DataFrame, seed: int) -> pa.Table:
    """``df`` as Arrow, with NaN (not null) in some float rows: a NaN value, as parquet keeps it."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    rng = np.random.default_rng(seed)
    for name in ("f", "g"):
        x = table.column(name).to_numpy()
        x = np.where(rng.random(len(x)) < 0.05, np.nan, x)
        nulls = rng.random(len(x)) < 0.05
        table = table.set_column(table.column_names.index(name), name, pa.array(x, mask=nulls))
    return table


def workflow() -> ts.Workflow:
    cats = ["s", "t"] >> ops.Categorify(freq_threshold=3)
    ints = ["i"] >> ops.Categorify(num_buckets=7, max_size=60) >> ops.Rename(postfix="_cat")
    floats = ["g"] >> ops.Categorify(dtype="int32") >> ops.Rename(postfix="_cat")
    single = ["t", "s"] >> ops.Categorify(single_table=True, max_size=40) >> ops.Rename(postfix="_one")
    hashed = ["s", "i", "f"] >> ops.HashBucket({"s": 101, "i": 13, "f": 29}) >> ops.Rename(postfix="_h")
    cross = [["s", "i"], ["t", "f", "g"]] >> ops.HashedCross({"s_X_i": 1000, "t_X_f_X_g": 97})
    conts = ["f"] >> ops.FillMissing(0) >> ops.Clip(min_value=-1, max_value=50) >> ops.LogOp() >> ops.Normalize()
    minmax = ["g"] >> ops.FillMissing(-1.5, add_binary_cols=True) >> ops.NormalizeMinMax()
    buckets = ["g"] >> ops.Bucketize([-1.0, 0.0, 0.5, 2.0]) >> ops.Rename(postfix="_b")
    median = ["i"] >> ops.FillMedian() >> ops.Clip(max_value=100.5) \
        >> ops.Rename(postfix="_m") >> ops.AddTags([Tags.CONTINUOUS])
    label = ["label"] >> ops.AddTags([Tags.TARGET])
    return ts.Workflow(cats + ints + floats + single + hashed + cross + conts + minmax + buckets
                       + median + label)


def fitted() -> ts.Workflow:
    return workflow().fit(ts.Dataset(frame(0, 4000, 300)))


def expected_features(wf: ts.Workflow, rows: pa.Table, names: list[str]) -> dict[str, np.ndarray]:
    """``Workflow.transform``'s columns as the artifact returns them: floats left
    null are NaN, integers left null are -1."""
    out = wf.transform(rows)
    expected = {}
    for name in names:
        col = out.column(name).combine_chunks()
        if pa.types.is_floating(col.type):
            expected[name] = col.to_numpy(zero_copy_only=False).astype(col.type.to_pandas_dtype())
        elif pa.types.is_boolean(col.type):
            expected[name] = np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
        else:
            expected[name] = col.fill_null(-1).to_numpy()
    return expected


def assert_same(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        have = got[name]
        assert have.dtype == want.dtype, (name, have.dtype, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(have, want, rtol=0, atol=1e-6, equal_nan=True, err_msg=name)
        else:
            np.testing.assert_array_equal(have, want, err_msg=name)


def run_fresh(script: str, cwd: str) -> str:
    """Run ``script`` in a new interpreter whose path holds neither this checkout nor
    PYTHONPATH; it must not import tabstream (asserted at its end)."""
    code = textwrap.dedent(script) + "\nassert 'tabstream' not in sys.modules, sorted(sys.modules)\nprint('ok')\n"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = ""
    proc = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout

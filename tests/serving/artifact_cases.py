"""The workflow and raw rows the artifact parity tests serve (both frameworks).

Rows are drawn so that every rule of the in-graph ops is met: unseen strings and
numbers, nulls, NaN, -0.0 and 0.0, inf, the empty string, strings of every byte
width from 0 to 40 (ASCII and multi-byte UTF-8), values below Clip's bound and
LogOp's domain, values on Bucketize's boundaries; list columns (strings, integers,
floats) with null and empty lists, null elements, unseen elements and long lists
(30-60 elements).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

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


def _lists(rng: np.random.Generator, n: int, draw) -> list:
    """``n`` Python lists (or None): 0-7 elements, 2% of them 30-60, 5% null lists;
    ``draw(k)`` gives ``k`` elements (None for a null element)."""
    lengths = rng.integers(0, 8, n)
    long = rng.random(n) < 0.02
    lengths[long] = rng.integers(30, 61, int(long.sum()))
    rows: list = [list(draw(int(k))) for k in lengths]
    for i in np.flatnonzero(rng.random(n) < 0.05):
        rows[i] = None
    return rows


def _with_nulls(rng: np.random.Generator, values: np.ndarray, share: float) -> list:
    return [None if r < share else v for v, r in zip(values.tolist(), rng.random(len(values)))]


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
    tags = _lists(rng, n, lambda k: _with_nulls(rng, _strings(rng, k, 40), 0.1))
    ids = _lists(rng, n, lambda k: _with_nulls(rng, rng.integers(-10, 60, k), 0.1))
    special = np.array([np.nan, -0.0, 0.0, np.inf, -5.0])
    nums = _lists(rng, n, lambda k: _with_nulls(
        rng, np.where(rng.random(k) < 0.2, special[rng.integers(0, 5, k)], rng.exponential(3, k)), 0.1))
    return pd.DataFrame({"s": s, "t": pd.Series(_strings(rng, n, 30), dtype=object), "i": i, "f": f,
                         "g": g, "tags": pd.Series(tags, dtype=object), "ids": pd.Series(ids, dtype=object),
                         "nums": pd.Series(nums, dtype=object), "label": rng.integers(0, 2, n)})


def arrow_rows(df: pd.DataFrame, seed: int) -> pa.Table:
    """``df`` as Arrow, with NaN (not null) in some float rows: a NaN value, as parquet keeps it."""
    table = pa.Table.from_pandas(df, preserve_index=False)
    rng = np.random.default_rng(seed)
    for name in ("f", "g"):
        x = table.column(name).to_numpy()
        x = np.where(rng.random(len(x)) < 0.05, np.nan, x)
        nulls = rng.random(len(x)) < 0.05
        table = table.set_column(table.column_names.index(name), name, pa.array(x, mask=nulls))
    if "nums" in table.column_names:  # NaN elements too (pandas' lists give nulls only)
        col = table.column("nums").combine_chunks()
        x = col.values.to_numpy(zero_copy_only=False)
        x = np.where(rng.random(len(x)) < 0.05, np.nan, x)
        values = pa.array(x, mask=~col.values.is_valid().to_numpy(zero_copy_only=False))
        nums = pa.ListArray.from_arrays(col.offsets, values, mask=col.is_null())
        table = table.set_column(table.column_names.index("nums"), "nums", nums)
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
    # list columns: element-wise encoders, ListSlice ragged and padded (fixed-length outputs)
    tags = ["tags"] >> ops.Categorify(freq_threshold=2)
    tags_h = ["tags"] >> ops.HashBucket(50) >> ops.Rename(postfix="_h")
    tags_last = ["tags"] >> ops.ListSlice(-3) >> ops.Categorify(num_buckets=5, max_size=40) \
        >> ops.Rename(postfix="_last")
    ids = ["ids"] >> ops.Categorify() >> ops.ListSlice(0, 4, pad=True) >> ops.Rename(postfix="_p")
    ids_mid = ["ids"] >> ops.ListSlice(1, 5) >> ops.Rename(postfix="_s")
    nums = ["nums"] >> ops.LogOp() >> ops.Normalize()
    nums_tail = ["nums"] >> ops.ListSlice(-2, pad=True, pad_value=0.5) >> ops.Rename(postfix="_t")
    return ts.Workflow(cats + ints + floats + single + hashed + cross + conts + minmax + buckets
                       + median + label + tags + tags_h + tags_last + ids + ids_mid + nums + nums_tail)


def fitted() -> ts.Workflow:
    return workflow().fit(ts.Dataset(frame(0, 4000, 300)))


def _numbers(col: pa.Array) -> np.ndarray:
    if pa.types.is_floating(col.type):
        return col.to_numpy(zero_copy_only=False).astype(col.type.to_pandas_dtype())
    if pa.types.is_boolean(col.type):
        return np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    if col.null_count:
        # a missing integer is -1; an unsigned dtype holds its bits (all ones)
        missing = -1 if pa.types.is_signed_integer(col.type) else (1 << col.type.bit_width) - 1
        col = col.fill_null(missing)
    return col.to_numpy()


def expected_features(wf: ts.Workflow, rows: pa.Table, names: list[str]) -> dict[str, Any]:
    """``Workflow.transform``'s columns as the artifact returns them: floats left
    null are NaN, integers left null are -1; list columns as the loader delivers
    them (its own layout functions): ``(values, offsets)``, or ``(dense, mask)`` for
    a schema of fixed length."""
    from tabstream.loaders.layout import column_layout, pad_lists

    out = wf.transform(rows)
    expected: dict[str, Any] = {}
    for name in names:
        col = out.column(name).combine_chunks()
        if not pa.types.is_list(col.type):
            expected[name] = _numbers(col)
            continue
        lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        values = _numbers(pc.list_flatten(col))
        layout = column_layout(name, col.type, wf.output_schema[name].properties)
        expected[name] = (values, offsets) if layout.fixed is None else pad_lists(values, offsets, layout.fixed[0])
    return expected


def assert_same(got: dict[str, Any], expected: dict[str, Any]) -> None:
    assert sorted(got) == sorted(expected)
    for name, want in expected.items():
        have = got[name]
        if isinstance(want, tuple):
            assert isinstance(have, tuple) and len(have) == len(want), (name, type(have))
            pairs = [(f"{name}[{i}]", h, w) for i, (h, w) in enumerate(zip(have, want))]
        else:
            pairs = [(name, have, want)]
        for label, h, w in pairs:
            assert h.dtype == w.dtype, (label, h.dtype, w.dtype)
            if w.dtype.kind == "f":
                np.testing.assert_allclose(h, w, rtol=0, atol=1e-6, equal_nan=True, err_msg=label)
            else:
                np.testing.assert_array_equal(h, w, err_msg=label)


def flat_outputs(out: dict[str, Any], to_numpy) -> dict[str, np.ndarray]:
    """Outputs as named arrays (``name.0``, ``name.1`` for a list's pair), for np.savez."""
    flat = {}
    for name, value in out.items():
        if isinstance(value, tuple):
            flat.update({f"{name}.{i}": to_numpy(v) for i, v in enumerate(value)})
        else:
            flat[name] = to_numpy(value)
    return flat


def nested_outputs(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """:func:`flat_outputs` undone."""
    out: dict[str, Any] = {}
    for key in sorted(flat):
        name, _, part = key.partition(".")
        if part:
            out[name] = (*out.get(name, ()), flat[key])
        else:
            out[name] = flat[key]
    return out


def signature_pairs(flat: dict[str, np.ndarray]) -> dict[str, Any]:
    """A SavedModel's flat outputs (``NAME__values``/``NAME__offsets``, ``NAME``/``NAME__mask``)
    as the layer's pairs."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key.endswith("__values"):
            name = key[:-len("__values")]
            out[name] = (value, flat[f"{name}__offsets"])
        elif f"{key}__mask" in flat:
            out[key] = (value, flat[f"{key}__mask"])
        elif not key.endswith(("__offsets", "__mask")):
            out[key] = value
    return out


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

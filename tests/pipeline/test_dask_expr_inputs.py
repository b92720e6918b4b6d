"""A dask DataFrame given as input, whatever its graph (a shuffle, a filter, a
repartition, a merge), fits and transforms: every task computes its partition of
the input in its own thread while others do the same, so building those graphs must
not deadlock (dask-expr's cached properties under Python 3.11's per-property
locks). Runs in a subprocess under a timeout, so a hang fails the test instead of
stopping the suite."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pandas as pd

_SCRIPT = textwrap.dedent("""
    import sys
    import dask
    import dask.dataframe as dd
    import numpy as np
    import pandas as pd
    import tabstream as ts
    from tabstream import ops

    out = sys.argv[1]
    rng = np.random.default_rng(int(sys.argv[2]))
    n = 3000
    df = pd.DataFrame({"a": rng.integers(0, 40, n), "b": np.arange(n),
                       "x": rng.normal(size=n)})
    side = pd.DataFrame({"a": np.arange(40), "s": np.arange(40) * 10})
    base = dd.from_pandas(df, npartitions=6)
    graphs = {
        "shuffle": base.shuffle("a"),
        "shuffle_npartitions": base.shuffle("a", npartitions=4),
        "filter": base[base.x > 0],
        "repartition": base.repartition(npartitions=3),
        "merge": base.merge(dd.from_pandas(side, npartitions=2), on="a", how="left"),
        "assign": base.assign(x=base.x * 2).shuffle("b"),
    }
    with dask.config.set(num_workers=4):  # several threads, also on a small machine
        for name, ddf in graphs.items():
            wf = ts.Workflow((["a"] >> ops.Categorify()) + ["b"])
            wf.fit(ts.Dataset(ddf))
            wf.transform(ts.Dataset(ddf)).to_ddf().compute().to_parquet(f"{out}/{name}.parquet")
    print("done")
""")


def _expected_ids(values: pd.Series) -> dict[int, int]:
    """Categorify's rule in plain pandas: vocabulary by descending count, ties by
    value, ids from 3 (0 padding, 1 null, 2 out-of-vocabulary)."""
    counts = values.value_counts()
    order = sorted(counts.index, key=lambda v: (-counts[v], v))
    return {int(v): 3 + i for i, v in enumerate(order)}


def test_dask_expr_graphs_fit_and_transform_without_hanging(tmp_path):
    seed = 7
    paths = [os.getcwd(), os.environ.get("PYTHONPATH")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), str(seed)], env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    rng = np.random.default_rng(seed)
    n = 3000
    df = pd.DataFrame({"a": rng.integers(0, 40, n), "b": np.arange(n), "x": rng.normal(size=n)})
    inputs = {"shuffle": df, "shuffle_npartitions": df, "filter": df[df.x > 0],
              "repartition": df, "merge": df, "assign": df}
    for name, rows in inputs.items():
        got = pd.read_parquet(tmp_path / f"{name}.parquet").sort_values("b")
        ids = _expected_ids(rows["a"])
        assert got["b"].tolist() == rows["b"].tolist(), name
        assert got["a"].tolist() == [ids[int(v)] for v in rows["a"]], name
    assert done.stdout.strip() == "done"

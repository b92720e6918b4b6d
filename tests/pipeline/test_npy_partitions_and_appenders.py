"""to_npy: (1) a list column's width comes from the partitions that have rows, so a
dataset whose first partitions are empty (filtered out) writes the rows of the
others; (2) appenders of one file take turns, so two ``append=True`` writers at once
(two processes, both held inside the append until both are there) add all their
rows. References: arrays built by hand with pandas/numpy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.core.errors import DataError

ROOT = Path(__file__).resolve().parents[2]


def _by_hand(frame: pd.DataFrame, scalars: list[str], lists: list[str]) -> np.ndarray:
    """Merlin's layout: the scalar columns, then each list column spread as name_i."""
    parts = [frame[scalars].to_numpy()] + [np.array(frame[c].tolist()).reshape(len(frame), -1) for c in lists]
    return np.concatenate(parts, axis=1)


@pytest.mark.parametrize("empty", [[0], [0, 1], [1], [0, 2]])
def test_empty_partitions_do_not_fix_a_list_width(tmp_path, empty):
    parts = []
    for i in range(3):
        part = pd.DataFrame({"k": [i * 10 + j for j in range(4)],
                             "keep": [i not in empty] * 4,
                             "L": [[i, j, -j] for j in range(4)]})
        parts.append(part)
        part.to_parquet(tmp_path / f"p{i}.parquet")
    ds = ts.Dataset([str(tmp_path / f"p{i}.parquet") for i in range(3)])
    wf = ts.Workflow(["k", "L", "keep"] >> ops.Filter(lambda t: t["keep"])).fit(ds)
    got = np.load(wf.transform(ds).to_npy(tmp_path / "f.npy"), allow_pickle=False)
    frame = pd.concat(parts, ignore_index=True)
    kept = frame[frame["keep"]].reset_index(drop=True)
    want = _by_hand(kept.assign(keep=kept["keep"].astype(np.int64)), ["k", "keep"], ["L"])
    assert got.shape == (4 * (3 - len(empty)), 5)
    np.testing.assert_array_equal(got, want)


def test_a_later_partition_of_another_list_width_is_still_refused(tmp_path):
    for i, width in enumerate([5, 2, 3]):  # the first partition is filtered out
        pd.DataFrame({"keep": [i > 0] * 2, "L": [[1] * width] * 2}).to_parquet(tmp_path / f"p{i}.parquet")
    ds = ts.Dataset([str(tmp_path / f"p{i}.parquet") for i in range(3)])
    wf = ts.Workflow(["L", "keep"] >> ops.Filter(lambda t: t["keep"])).fit(ds)
    with pytest.raises(DataError, match=r"list column 'L' has 3 values per row in one partition and 2 "
                                        r"in an earlier one"):
        wf.transform(ds).to_npy(tmp_path / "r.npy")


APPENDER = """
    import json, os, sys, time
    import numpy as np, pandas as pd
    import tabstream as ts
    from tabstream.pipeline import npy

    path, meet, me, other, start = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])

    def wait_for(name, seconds):
        deadline = time.monotonic() + seconds
        while not os.path.exists(os.path.join(meet, name)) and time.monotonic() < deadline:
            time.sleep(0.001)

    # both start together ...
    open(os.path.join(meet, me + ".ready"), "w").close()
    wait_for(other + ".ready", 120)
    existing_rows = npy._existing_rows

    def held(*args):
        # ... and each, having read the old file's rows, waits for the other to have
        # read them too (for at most 3 s: an appender that waits for its turn never
        # gets here meanwhile)
        rows = existing_rows(*args)
        open(os.path.join(meet, me + ".read"), "w").close()
        wait_for(other + ".read", 3)
        return rows

    npy._existing_rows = held
    frame = pd.DataFrame({"a": np.arange(start, start + 50, dtype="int64"),
                          "e": [[i, -i] for i in range(start, start + 50)]})
    ts.Dataset(frame, part_size="1KB").to_npy(path, append=True)
    print(json.dumps({"ok": True}))
"""


def test_two_appenders_at_once_add_both_their_rows(tmp_path):
    path, meet = tmp_path / "x.npy", tmp_path / "meet"
    meet.mkdir()
    first = pd.DataFrame({"a": np.arange(5, dtype=np.int64), "e": [[i, -i] for i in range(5)]})
    ts.Dataset(first).to_npy(path)
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(APPENDER), str(path), str(meet),
                               me, other, str(start)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for me, other, start in (("A", "B", 100), ("B", "A", 200))]
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, stderr
        assert json.loads(stdout.strip().splitlines()[-1]) == {"ok": True}
    got = np.load(path, allow_pickle=False)
    blocks = {start: _by_hand(pd.DataFrame({"a": np.arange(start, start + 50),
                                            "e": [[i, -i] for i in range(start, start + 50)]}), ["a"], ["e"])
              for start in (100, 200)}
    head = _by_hand(first, ["a"], ["e"])
    # the first file, then each appender's rows whole, in the order they took turns
    orders = [np.concatenate([head, blocks[s], blocks[t]]) for s, t in ((100, 200), (200, 100))]
    assert got.shape == (105, 3)
    assert any(np.array_equal(got, want) for want in orders), got[:, 0].tolist()
    assert sorted(os.listdir(tmp_path)) == ["meet", "x.npy"]  # no lock or temporary file left

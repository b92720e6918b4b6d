"""Reading from an object store (issue 27), on a moto S3-protocol server started here
on 127.0.0.1: a Dataset sees the store as it is now (an export another process
overwrote reads as the new one, not through this process's cached listing); a file
replaced after the Dataset was opened is refused by name; an unreachable store, a
refused request and a missing bucket are errors naming the URL, within seconds."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream.core.errors import DataError
from tabstream.pipeline import stores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _options(port: int, key: str = "testing") -> dict:
    return {"key": key, "secret": "testing", "client_kwargs": {
        "endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}


def _frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"row": np.arange(n), "x": rng.normal(size=n)})


def _read_back(fs, prefix: str) -> pd.DataFrame:
    """The export's rows with plain pyarrow over a fresh listing, in manifest order."""
    fs.invalidate_cache()
    manifest = json.loads(fs.cat_file(f"{prefix}/_manifest.json"))
    return pd.concat([pq.read_table(io.BytesIO(fs.cat_file(f"{prefix}/{e['path']}"))).to_pandas()
                      for e in manifest["files"]], ignore_index=True)


_OVERWRITE = textwrap.dedent("""
    import json, sys
    import numpy as np, pandas as pd
    import tabstream as ts
    options, n, seed, path = json.loads(sys.argv[1])
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"row": np.arange(n), "x": rng.normal(size=n)})
    ts.Dataset(frame, part_size=n * 4).to_parquet(path, storage_options=options, overwrite=True)
""")


def _overwrite_elsewhere(options: dict, n: int, seed: int, path: str) -> None:
    subprocess.run([sys.executable, "-c", _OVERWRITE, json.dumps([options, n, seed, path])],
                   check=True, timeout=120, env=dict(os.environ))


def _rows(ds: ts.Dataset) -> pd.DataFrame:
    return pd.concat(list(ds.to_iter()), ignore_index=True)


def test_an_export_overwritten_by_another_process_reads_as_the_new_one(moto):
    # before: this process's s3fs kept the first listing, and the second Dataset failed
    # with FileExpired or "not a readable parquet file"
    fs, options, _ = moto
    path = "s3://bkt/exp"
    first = _frame(3_000, seed=1)
    ts.Dataset(first, part_size=40_000).to_parquet(path, storage_options=options)
    before = ts.Dataset(path, storage_options=options)
    pd.testing.assert_frame_equal(_rows(before), first, check_dtype=False)

    _overwrite_elsewhere(options, 1_000, 2, path)
    again = ts.Dataset(path, storage_options=options)
    expected = _read_back(fs, "bkt/exp")
    assert len(expected) == 1_000
    pd.testing.assert_frame_equal(_rows(again), expected, check_dtype=False)
    pd.testing.assert_frame_equal(expected, _frame(1_000, seed=2), check_dtype=False)

    # the Dataset opened before the overwrite refuses to read the replaced files
    with pytest.raises(DataError, match=r"bkt/exp/part_\d+.*\.parquet: the file was replaced \(or deleted\) "
                                        r"after the Dataset was opened"):
        _rows(before)


def test_a_file_replaced_in_place_after_opening(moto):
    fs, options, _ = moto
    buf = io.BytesIO()
    _frame(500, seed=3).to_parquet(buf, index=False)
    fs.pipe_file("bkt/one/a.parquet", buf.getvalue())
    ds = ts.Dataset("s3://bkt/one/a.parquet", storage_options=options)
    buf = io.BytesIO()
    _frame(700, seed=4).to_parquet(buf, index=False)
    fs.pipe_file("bkt/one/a.parquet", buf.getvalue())
    with pytest.raises(DataError, match=r"bkt/one/a\.parquet: the file was replaced"):
        _rows(ds)
    # opened again: the new rows
    pd.testing.assert_frame_equal(_rows(ts.Dataset("s3://bkt/one/a.parquet", storage_options=options)),
                                  _frame(700, seed=4), check_dtype=False)


def test_unreachable_store_fails_fast_naming_the_url():
    port = _free_port()  # nothing listens there
    start = time.monotonic()
    with pytest.raises(DataError, match=rf"s3://bkt/data: the object store at http://127\.0\.0\.1:{port}/bkt "
                                        r"cannot be reached \(EndpointConnectionError") as err:
        ts.Dataset("s3://bkt/data", storage_options=_options(port))
    assert time.monotonic() - start < 8  # botocore's legacy retries took 10-26 s
    assert "endpoint_url" in err.value.hint


def test_store_options_keep_what_the_user_set(monkeypatch):
    monkeypatch.delenv("AWS_MAX_ATTEMPTS", raising=False)
    monkeypatch.delenv("AWS_RETRY_MODE", raising=False)
    given = {"key": "k", "config_kwargs": {"connect_timeout": 2}}
    got = stores.store_options("s3://b/x", given)
    assert got == {"key": "k", "config_kwargs": {"connect_timeout": 2, "retries": stores.S3_RETRIES}}
    assert given == {"key": "k", "config_kwargs": {"connect_timeout": 2}}  # not changed
    mine = {"config_kwargs": {"retries": {"max_attempts": 10}}}
    assert stores.store_options("s3://b/x", mine) is mine
    assert stores.store_options("gs://b/x", {}) == {}
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "7")
    assert stores.store_options("s3://b/x", {}) == {}


def test_missing_bucket_is_named(moto):
    _, options, _ = moto
    with pytest.raises(FileNotFoundError, match=r"no such file or folder: 's3://nobucket/data' \(the bucket "
                                                r"'nobucket' does not exist"):
        ts.Dataset("s3://nobucket/data", storage_options=options)


@pytest.fixture
def authenticating(moto):
    """The moto server checking credentials (as S3 does) for the test's duration."""
    _, _, port = moto

    def reset(count: str) -> None:
        request = urllib.request.Request(f"http://127.0.0.1:{port}/moto-api/reset-auth", data=count.encode(),
                                         headers={"Content-Type": "text/plain"}, method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            assert json.loads(response.read())["status"] == "ok"

    reset("0")
    try:
        yield port
    finally:
        reset("inf")


def test_refused_credentials_name_the_url(moto, authenticating):
    fs, _, port = moto
    start = time.monotonic()
    with pytest.raises(DataError, match=r"s3://bkt/exp: the object store refused access \(PermissionError: "
                                        r".*\); the credentials were rejected") as err:
        ts.Dataset("s3://bkt/exp", storage_options=_options(port, key="AKIDONTEXIST"))
    assert time.monotonic() - start < 8
    assert "bucket's policy" in err.value.hint

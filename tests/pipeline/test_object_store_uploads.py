"""An export killed while uploading a large file leaves an unfinished S3 multipart
upload under its prefix (stored, billed, invisible to listings); the next export to
that prefix aborts it. On a moto server started here on 127.0.0.1, with a real
export killed by SIGKILL mid-upload."""

from __future__ import annotations

import io
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts

ROOT = Path(__file__).resolve().parents[2]


def _uploads(fs, prefix: str) -> list[str]:
    return [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket="bkt", Prefix=prefix).get("Uploads", [])]


KILLED = """
    import json, sys, time
    import numpy as np, pandas as pd
    import tabstream as ts
    import tabstream.pipeline.export as export_mod

    def blocked(self):  # the file is mostly uploaded, in 5 MiB parts; stop before completing it
        print("ready", flush=True)
        time.sleep(600)

    export_mod._FileWriter.close = blocked
    options = {**json.loads(sys.argv[2]), "default_block_size": 5 * 2**20}
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"a": rng.random(1_000_000), "b": rng.random(1_000_000)})
    ts.Dataset(df).to_parquet(sys.argv[1], num_files=1, storage_options=options)
"""


def test_next_export_aborts_the_uploads_a_killed_one_left(s3):
    fs, options = s3
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED), "s3://bkt/killed", json.dumps(options)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 120)
    line = proc.stdout.readline() if ready else "(no output in 120 s)"
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(f"the export did not start: {line!r} {proc.stderr.read()}")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    assert _uploads(fs, "killed/") == ["killed/part_00000.parquet"], "the killed export's unfinished upload"
    # an unfinished upload elsewhere in the bucket is not this export's business
    other = fs.call_s3("create_multipart_upload", Bucket="bkt", Key="killed-not/x.bin")["UploadId"]

    frame = pd.DataFrame({"a": np.arange(5000), "b": np.arange(5000) * 0.5})
    result = ts.Dataset(frame).to_parquet("s3://bkt/killed", num_files=2, storage_options=options)
    assert _uploads(fs, "killed/") == []
    assert [u["UploadId"] for u in fs.call_s3("list_multipart_uploads", Bucket="bkt",
                                               Prefix="killed-not/")["Uploads"]] == [other]
    fs.invalidate_cache()
    got = pa.concat_tables([pq.read_table(io.BytesIO(fs.cat_file(f"bkt/killed/{f}"))) for f in result.files])
    pd.testing.assert_frame_equal(got.to_pandas(), frame, check_dtype=False)
    fs.call_s3("abort_multipart_upload", Bucket="bkt", Key="killed-not/x.bin", UploadId=other)


def test_a_store_that_refuses_the_listing_gets_a_warning_naming_the_lifecycle_rule(s3, monkeypatch):
    fs, options = s3
    import s3fs

    def refused(self, method, *args, **kwargs):
        if method == "list_multipart_uploads":
            raise PermissionError("Access Denied")
        return original(self, method, *args, **kwargs)

    original = s3fs.S3FileSystem.call_s3
    monkeypatch.setattr(s3fs.S3FileSystem, "call_s3", refused)
    frame = pd.DataFrame({"a": np.arange(100)})
    with pytest.warns(UserWarning, match=r"export to 's3://bkt/denied': unfinished multipart uploads .* could "
                                         r"not be listed or aborted \(Access Denied\).*AbortIncompleteMultipartUpload"
                                         r".*docs/scaling-out.md"):
        ts.Dataset(frame).to_parquet("s3://bkt/denied", storage_options=options)
    monkeypatch.undo()
    fs.invalidate_cache()
    assert pq.read_table(io.BytesIO(fs.cat_file("bkt/denied/part_00000.parquet")))["a"].to_pylist() == list(range(100))

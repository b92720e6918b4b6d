"""Shared pieces of the pipeline tests: a real S3-protocol server (moto) on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def s3_options(port: int, key: str = "testing") -> dict:
    return {"key": key, "secret": "testing", "client_kwargs": {
        "endpoint_url": f"http://127.0.0.1:{port}", "region_name": "us-east-1"}}


@contextlib.contextmanager
def moto_server() -> Iterator[tuple[Any, dict, int]]:
    """``(filesystem, storage_options, port)`` of a fresh moto server with bucket ``bkt``."""
    import s3fs

    port = free_port()
    env = dict(os.environ, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        options = s3_options(port)
        fs = s3fs.S3FileSystem(**options)
        fs.call_s3("create_bucket", Bucket="bkt")
        yield fs, options, port
    finally:
        server.terminate()
        server.wait(timeout=20)


@pytest.fixture(scope="module")
def s3():
    """``(filesystem, storage_options)`` of a fresh moto server with bucket ``bkt``."""
    with moto_server() as (fs, options, _):
        yield fs, options


@pytest.fixture(scope="module")
def moto():
    """``(filesystem, storage_options, port)`` of a fresh moto server with bucket ``bkt``."""
    with moto_server() as server:
        yield server

import os

import numpy as np
import pandas as pd
import pytest

from tabstream.testing import huge_pages_enabled

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


@pytest.fixture
def small_raw() -> pd.DataFrame:
    """A small Criteo-like frame with nulls, negatives and repeated categories."""
    rng = np.random.default_rng(7)
    n = 2_000
    cats = np.array(["a", "b", "c", "d", "e", "f", "g", "h"])
    c1 = cats[np.minimum(rng.geometric(0.35, n) - 1, len(cats) - 1)].astype(object)
    c1[rng.random(n) < 0.1] = None
    c2 = np.array([f"{v:08x}" for v in rng.integers(0, 300, n)], dtype=object)
    i1 = rng.geometric(0.1, n).astype("float64") - 3
    i1[rng.random(n) < 0.2] = np.nan
    return pd.DataFrame({
        "label": rng.integers(0, 2, n),
        "I1": pd.array(np.where(np.isnan(i1), None, i1), dtype="Int64"),
        "I2": rng.lognormal(1.0, 1.0, n),
        "C1": pd.array(c1, dtype="str"),
        "C2": pd.array(c2, dtype="str"),
        "row_id": np.arange(n),
    })


DASK_DASHBOARD_PORT = 8787


@pytest.fixture(scope="session", autouse=True)
def dask_dashboard_port_taken():
    """Hold dask's well-known dashboard port for the whole run, as an unrelated
    dashboard on a developer's machine would: a test that starts a cluster on a
    fixed port fails here instead of on somebody else's machine. Clusters in
    tests use ``dashboard_address="127.0.0.1:0"`` (a free port chosen by the OS)."""
    import socket

    holder = socket.socket()
    try:
        holder.bind(("127.0.0.1", DASK_DASHBOARD_PORT))
        holder.listen(1)
    except OSError:  # already taken by another process: the condition holds anyway
        holder.close()
        yield DASK_DASHBOARD_PORT
        return
    try:
        yield DASK_DASHBOARD_PORT
    finally:
        holder.close()


@pytest.fixture
def dask_client(dask_dashboard_port_taken):
    """A small in-process dask cluster whose dashboard listens on a port the OS picks.
    Tests that need a ``distributed.Client`` take this fixture rather than building
    one: ``Client()``'s defaults want port 8787 (held above)."""
    import distributed

    with distributed.Client(n_workers=2, threads_per_worker=1, processes=False,
                            dashboard_address="127.0.0.1:0") as client:
        yield client


class _HugePages:
    """The process's transparent huge pages as the kernel reports them, and
    ``PR_SET_THP_DISABLE`` to change them."""

    enabled = staticmethod(huge_pages_enabled)

    @staticmethod
    def set_disabled(value: int) -> None:
        from tabstream.core import pages

        assert pages._libc_prctl()(pages._PR_SET_THP_DISABLE, value, 0, 0, 0) == 0


@pytest.fixture
def huge_pages():
    """Huge pages allowed for the test (checked), the state found put back after."""
    found = _HugePages.enabled()
    _HugePages.set_disabled(0)
    assert _HugePages.enabled() == 1
    yield _HugePages
    _HugePages.set_disabled(1 - found)


@pytest.fixture(autouse=True)
def disk_reserve_off(request, monkeypatch):
    """The default cache ("auto") leaves its disk no reserve in tests: what "auto"
    keeps must not depend on how full the test machine's disk is (a tenth of it, at
    most 10 GiB, is kept free otherwise, and a CacheWarning, an error under pytest's
    filters, says so). Tests of the reserve itself are marked ``real_disk_reserve``."""
    if request.node.get_closest_marker("real_disk_reserve"):
        return
    import tabstream.pipeline.partition_cache as partition_cache

    monkeypatch.setattr(partition_cache, "CACHE_MIN_FREE_BYTES", 0)
    monkeypatch.setattr(partition_cache, "CACHE_MAX_FREE_BYTES", 0)

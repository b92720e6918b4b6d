"""Fixtures for the torch training tests; the data helpers live in torch_data.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    import torch
except ImportError:  # the suite runs without torch: skip this folder
    torch = None
    collect_ignore_glob = ["test_*.py"]

# torch_data.py sits beside this file; make it importable under any --import-mode
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(autouse=True)
def _one_thread():
    # the machine has 2 cores shared with other processes
    if torch is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def one_rank():
    """A torch.distributed group of this process alone (gloo on 127.0.0.1)."""
    import torch.distributed as dist
    from dist_helpers import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def ranking_data():
    from torch_data import make_ranking_data

    return make_ranking_data()


@pytest.fixture(scope="session")
def retrieval_data():
    from torch_data import make_retrieval_data

    return make_retrieval_data()

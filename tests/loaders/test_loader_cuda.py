"""Loaders delivering to a GPU (issue 9 item 5): torch ``device="cuda"`` (pinned host
batches, non-blocking copies) and TensorFlow ``device="/GPU:0"`` give exactly the
CPU loader's batches, in the same order, epoch after epoch.

Every test here carries the ``gpu`` marker (``make test`` deselects them) and skips
with the reason where the framework sees no GPU. The references are the CPU
loaders, themselves checked against plain pyarrow in test_loader_torch.py and
test_loader_tensorflow.py."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _torch_cuda() -> Any:
    if importlib.util.find_spec("torch") is None:
        pytest.skip("needs PyTorch")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def _tf_gpu() -> Any:
    if importlib.util.find_spec("tensorflow") is None:
        pytest.skip("needs TensorFlow")
    import tensorflow as tf

    if not tf.config.list_logical_devices("GPU"):
        pytest.skip("TensorFlow sees no GPU (a CPU-only build, e.g. tensorflow-cpu, or no driver)")
    return tf


def _epochs(loader: Any, n: int) -> list[list[Any]]:
    return [list(loader) for _ in range(n)]


def _tensor_pairs(cpu_batch: Any, gpu_batch: Any) -> Iterator[tuple[Any, Any]]:
    """Each (CPU tensor, GPU tensor) of two ``(features, label)`` batches, list
    columns' parts one by one; the two batches must have the same columns."""
    (cf, cy), (gf, gy) = cpu_batch, gpu_batch
    assert sorted(cf) == sorted(gf)
    for c, g in [(cy, gy)] + [(cf[k], gf[k]) for k in cf]:
        cs, gs = (c, g) if isinstance(c, tuple) else ((c,), (g,))
        assert len(cs) == len(gs)
        yield from zip(cs, gs, strict=True)


def _torch_equal(cpu_batch: Any, gpu_batch: Any, device_index: int = 0) -> None:
    torch = _torch_cuda()
    for a, b in _tensor_pairs(cpu_batch, gpu_batch):
        assert b.is_cuda and b.device.index == device_index
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(b.cpu(), a)


def test_torch_cuda_ragged_lists_equal_cpu_for_two_epochs(shared_export: Path, testdata: Any) -> None:
    torch = _torch_cuda()
    from tabstream.loaders.torch import Loader

    cpu = _epochs(Loader(shared_export, 256, seed=11, shuffle=True), 2)
    gpu = _epochs(Loader(shared_export, 256, seed=11, device="cuda", shuffle=True), 2)
    for cpu_epoch, gpu_epoch in zip(cpu, gpu, strict=True):
        assert len(cpu_epoch) == len(gpu_epoch)
        for c, g in zip(cpu_epoch, gpu_epoch, strict=True):
            _torch_equal(c, g)
        ids = torch.cat([f["row_id"] for f, _ in gpu_epoch]).cpu().sort().values
        assert torch.equal(ids, torch.arange(testdata.N))  # every row once per epoch
    first, second = (torch.cat([f["row_id"] for f, _ in e]).cpu() for e in gpu)
    assert not torch.equal(first, second), "each epoch is a new shuffle"


def test_torch_cuda_device_forms_ranks_and_dataloader(shared_export: Path) -> None:
    torch = _torch_cuda()
    from tabstream.loaders.torch import Loader

    for rank in range(2):
        cpu = list(Loader(shared_export, 300, seed=2, global_size=2, global_rank=rank, pad=True,
                          shuffle=True))
        gpu = list(Loader(shared_export, 300, seed=2, global_size=2, global_rank=rank, pad=True,
                          device=torch.device("cuda", 0), shuffle=True))
        assert len(cpu) == len(gpu)
        for c, g in zip(cpu, gpu, strict=True):
            _torch_equal(c, g)
    cpu = list(Loader(shared_export, 300, seed=6, shuffle=False))
    wrapped = torch.utils.data.DataLoader(Loader(shared_export, 300, seed=6, shuffle=False, device="cuda:0"),
                                          batch_size=None)
    gpu = list(wrapped)
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu, strict=True):
        _torch_equal(c, g)


def test_torch_cuda_from_a_dataset_on_the_cudf_backend(shared_export: Path) -> None:
    _torch_cuda()
    import tabstream as ts
    import tabstream.backends as backends
    from tabstream.loaders.torch import Loader

    if backends.gpu_status() is not None:
        pytest.skip(f"needs the cudf backend: {backends.gpu_status()}")
    on_gpu = ts.Dataset(str(shared_export), cpu=False)
    assert on_gpu.backend_name == "cudf"
    cpu = list(Loader(ts.Dataset(str(shared_export), cpu=True), 200, seed=9, shuffle=True))
    gpu = list(Loader(on_gpu, 200, seed=9, device="cuda", shuffle=True))
    assert len(cpu) == len(gpu)
    for c, g in zip(cpu, gpu, strict=True):
        _torch_equal(c, g)


def _tf_equal(cpu_batch: Any, gpu_batch: Any) -> None:
    for a, b in _tensor_pairs(cpu_batch, gpu_batch):
        assert "GPU:0" in b.device
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(b.numpy(), a.numpy())


@pytest.mark.parametrize("pad", [False, True])
def test_tensorflow_gpu_batches_equal_cpu_batches_for_two_epochs(shared_export: Path, testdata: Any,
                                                                  pad: bool) -> None:
    _tf_gpu()
    from tabstream.loaders.tensorflow import Loader

    cpu = _epochs(Loader(shared_export, 256, seed=4, pad=pad, shuffle=True), 2)
    gpu = _epochs(Loader(shared_export, 256, seed=4, pad=pad, device="/GPU:0", shuffle=True), 2)
    for cpu_epoch, gpu_epoch in zip(cpu, gpu, strict=True):
        assert len(cpu_epoch) == len(gpu_epoch) == -(-testdata.N // 256)
        for c, g in zip(cpu_epoch, gpu_epoch, strict=True):
            _tf_equal(c, g)
        ids = np.sort(np.concatenate([f["row_id"].numpy() for f, _ in gpu_epoch]))
        np.testing.assert_array_equal(ids, np.arange(testdata.N))
    first, second = (np.concatenate([f["row_id"].numpy() for f, _ in e]) for e in gpu)
    assert not np.array_equal(first, second), "each epoch is a new shuffle"

"""The PyTorch adapter: tensors, DataLoader wrapping, process-group defaults."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from tabstream.loaders.torch import Loader  # noqa: E402

pytestmark = pytest.mark.torch


def test_yields_tensor_dicts_with_preserved_dtypes(shared_export: Path, testdata: Any) -> None:
    expected = testdata.read_all(shared_export)
    loader = Loader(shared_export, 128, seed=2, shuffle=True)
    n = 0
    for features, labels in loader:
        assert features["row_id"].dtype == torch.int64
        assert features["C1"].dtype == torch.int64
        assert features["I1"].dtype == torch.float32
        assert labels.dtype == torch.int64
        values, offsets = features["tags"]
        assert values.dtype == torch.int64 and offsets.dtype == torch.int64
        assert features["weights"][0].dtype == torch.float32
        want = expected.take(features["row_id"].numpy())
        assert torch.equal(features["I1"], torch.tensor(want["I1"].to_numpy()))
        assert torch.equal(labels, torch.tensor(want["label"].to_numpy()))
        n += len(labels)
    assert n == testdata.N


@pytest.mark.parametrize("shuffle", [True, False])
def test_scalar_features_of_one_dtype_share_a_buffer_labels_do_not(
        shared_export: Path, testdata: Any, shuffle: bool) -> None:
    """row_id and C1 (both int64 features) are consecutive rows of one buffer per
    batch, with the right values; the label lies outside it (its own buffer)."""
    expected = testdata.read_all(shared_export)
    loader = Loader(shared_export, 97, seed=3, shuffle=shuffle)
    seen = 0
    for features, labels in loader:
        ids, c1 = features["row_id"], features["C1"]
        n = len(ids)
        assert c1.data_ptr() == ids.data_ptr() + 8 * n
        block = range(ids.data_ptr(), ids.data_ptr() + 16 * n)
        assert labels.data_ptr() not in block and labels.data_ptr() + 8 * n - 1 not in block
        want = expected.take(ids.numpy())
        assert torch.equal(c1, torch.tensor(want["C1"].to_numpy()))
        assert torch.equal(labels, torch.tensor(want["label"].to_numpy()))
        seen += n
    assert seen == testdata.N


def test_exactly_once_across_ranks(shared_export: Path, testdata: Any) -> None:
    loaders = [Loader(shared_export, 100, global_size=3, global_rank=r, shuffle=True)
               for r in range(3)]
    batches = [[f["row_id"] for f, _ in loader] for loader in loaders]
    assert len({len(b) for b in batches}) == 1 and len(batches[0]) == len(loaders[0])
    ids = torch.cat([t for b in batches for t in b]).sort().values
    assert torch.equal(ids, torch.arange(testdata.N))


def test_dataloader_batch_size_none(shared_export: Path) -> None:
    loader = Loader(shared_export, 256, seed=5, shuffle=True)
    wrapped = torch.utils.data.DataLoader(loader, batch_size=None)
    assert len(wrapped) == len(loader)
    first = [f["row_id"] for f, _ in wrapped]
    second = [f["row_id"] for f, _ in wrapped]
    assert loader.epoch == 2
    loader.set_epoch(0)
    direct = [f["row_id"] for f, _ in loader]
    assert all(torch.equal(a, b) for a, b in zip(first, direct, strict=True))
    assert not torch.equal(torch.cat(first), torch.cat(second)), "each pass is a new epoch"


def test_dataloader_with_worker_processes_is_refused(shared_export: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # What a DataLoader worker process sees (forking real workers here is slow and
    # deadlock-prone with the threads other tests leave behind).
    info = torch.utils.data._utils.worker.WorkerInfo(id=0, num_workers=2, seed=0, dataset=None)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: info)
    with pytest.raises(RuntimeError, match="num_workers=0"):
        iter(Loader(shared_export, 256, shuffle=True))


def test_padded_lists_are_tensors(shared_export: Path, testdata: Any) -> None:
    features, _ = next(iter(Loader(shared_export, 64, pad=True, shuffle=True)))
    padded, mask = features["tags"]
    assert padded.shape == (64, testdata.MAX_TAGS) and mask.dtype == torch.bool
    # An EmbeddingBag takes (values, offsets) as they come.
    values, offsets = next(iter(Loader(shared_export, 64, shuffle=True)))[0]["tags"]
    bag = torch.nn.EmbeddingBag(10_000, 4, mode="sum")
    assert bag(values, offsets[:-1]).shape == (64, 4)


def test_device_argument(shared_export: Path) -> None:
    loader = Loader(shared_export, 64, device="cpu", shuffle=True)
    features, labels = next(iter(loader))
    assert features["C1"].device.type == "cpu" and labels.device.type == "cpu"


def test_tensors_share_memory_with_numpy(shared_export: Path) -> None:
    loader = Loader(shared_export, 64, shuffle=True)
    batches = loader.core.iter_epoch(0, lambda b: (b, loader._to_tensors(b)))
    (arrays, _), (tensors, _) = next(batches)
    batches.close()
    for name in ("C1", "I1"):  # no copy between the numpy batch and the tensor
        assert tensors[name].data_ptr() == arrays[name].ctypes.data
    values, offsets = tensors["tags"]
    assert values.data_ptr() == arrays["tags"][0].ctypes.data


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_defaults_come_from_the_process_group(shared_export: Path) -> None:
    assert not dist.is_initialized()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                            world_size=1)
    try:
        loader = Loader(shared_export, 64, shuffle=True)
        assert (loader.global_size, loader.global_rank) == (1, 0)
        loader = Loader(shared_export, 64, global_size=3, global_rank=2, shuffle=True)
        assert loader.global_rank == 2
    finally:
        dist.destroy_process_group()


def test_size_without_rank_is_refused(shared_export: Path) -> None:
    with pytest.raises(ValueError, match="global_size=2 needs global_rank"):
        Loader(shared_export, 64, global_size=2, shuffle=True)


def test_training_step(shared_export: Path) -> None:
    model = torch.nn.Linear(2, 1)  # plain SGD by hand: torch.optim takes seconds to import
    for features, labels in Loader(shared_export, 512, features=["I1", "C1"], shuffle=True):
        x = torch.stack([features["I1"], features["C1"].float() / 100], dim=1)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x)[:, 0],
                                                                     labels.float())
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad
    assert np.isfinite(loss.item())


def test_online_transforms_and_fixed_lists_as_tensors(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    import tabstream as ts
    from tabstream import ops
    from tabstream.loaders import core

    n = 50
    table = pa.table({
        "city": pa.array([f"c{i % 7}" for i in range(n)]),
        "ids": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(3 * n)), 3),
        "label": np.arange(n) % 2,
    })
    pq.write_table(table, tmp_path / "raw.parquet", row_group_size=20)
    ds = ts.Dataset(str(tmp_path / "raw.parquet"), engine="parquet")
    wf = ts.Workflow((["city"] >> ops.HashBucket(5)) + ["ids", "label"]).fit(ds)
    kw = {"seed": 1, "labels": ["label"], "shuffle": True}
    for (features, labels), (want, want_labels) in zip(
            Loader(wf.transform(ds), 16, **kw), core.Loader(ds, 16, transforms=wf, **kw),
            strict=True):
        assert torch.equal(features["city"], torch.from_numpy(want["city"]))
        dense, mask = features["ids"]
        assert dense.shape == (len(labels), 3) and bool(mask.all())
        assert torch.equal(dense, torch.from_numpy(want["ids"][0]))
        assert torch.equal(labels, torch.from_numpy(want_labels))


def test_devices_are_checked(shared_export: Path) -> None:
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"device='cuda' but torch sees no CUDA GPU"):
            Loader(shared_export, 10, device="cuda", shuffle=True)
    with pytest.raises(ValueError, match=r"device 'meta': the loader delivers to 'cpu' or 'cuda'"):
        Loader(shared_export, 10, device="meta", shuffle=True)
    with pytest.raises(TypeError, match=r"device must be a str or torch.device, got int"):
        Loader(shared_export, 10, device=0, shuffle=True)


def test_dlpack_arrays_are_taken_over_without_a_copy() -> None:
    from tabstream.loaders.torch import _tensor

    class OnDevice:  # stands for a cupy/cudf array: DLPack, not numpy
        def __init__(self, a: np.ndarray) -> None:
            self.a = a

        def __dlpack__(self, **kwargs: Any) -> Any:
            return self.a.__dlpack__(**kwargs)

        def __dlpack_device__(self) -> Any:
            return self.a.__dlpack_device__()

    a = np.arange(6, dtype=np.int64)
    t = _tensor(OnDevice(a), pin=False)
    assert t.tolist() == a.tolist() and t.data_ptr() == a.ctypes.data
    with pytest.raises(TypeError, match=r"the loader produced a list, which is neither a numpy"):
        _tensor([1, 2], pin=False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU")
def test_cuda_batches_equal_cpu_batches_in_order(shared_export: Path) -> None:
    cpu = list(Loader(shared_export, 300, seed=3, pad=True, shuffle=True))
    gpu = list(Loader(shared_export, 300, seed=3, pad=True, device="cuda", shuffle=True))
    assert len(cpu) == len(gpu)
    for (cf, cy), (gf, gy) in zip(cpu, gpu, strict=True):
        assert gy.is_cuda and torch.equal(gy.cpu(), cy)
        for name, value in cf.items():
            got = gf[name]
            if isinstance(value, tuple):
                for c, g in zip(value, got, strict=True):
                    assert g.is_cuda and torch.equal(g.cpu(), c)
            else:
                assert got.is_cuda and torch.equal(got.cpu(), value)

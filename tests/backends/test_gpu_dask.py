"""Where a Dataset's tasks run (threads, a given client, dask-cuda's LocalCUDACluster
for several GPUs), dask-cudf in and out of a Dataset, and cudf's parquet reader.

The decision and the import guards run everywhere; the tests that need cudf, a GPU
or several GPUs carry the ``gpu`` marker and skip with the reason elsewhere."""

import importlib.util
import sys

import dask.dataframe as dd
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import tabstream as ts
import tabstream.backends as backends
import tabstream.backends.cudf as cudf_backend
from tabstream import ops
from tabstream.core.errors import BackendUnavailableError
from tabstream.pipeline.dataset import DatasetWarning
from tabstream.testing import assert_tables_equal


# -- the decision: a pure function ---------------------------------------------------
@pytest.mark.parametrize(("backend", "gpus", "client_given", "expected"), [
    ("arrow", 0, False, "threads"),
    ("arrow", 1, False, "threads"),
    ("arrow", 8, False, "threads"),      # several GPUs, but the CPU backend
    ("arrow", 0, True, "client"),
    ("arrow", 8, True, "client"),
    ("cudf", 0, False, "threads"),
    ("cudf", 1, False, "threads"),       # one GPU: threads share it
    ("cudf", 2, False, "local-cuda-cluster"),
    ("cudf", 8, False, "local-cuda-cluster"),
    ("cudf", 1, True, "client"),
    ("cudf", 8, True, "client"),         # a given client always wins
])
def test_scheduler_for_every_case(backend, gpus, client_given, expected):
    assert backends.scheduler_for(backend, gpus, client_given) == expected
    assert expected in backends.SCHEDULERS


def test_scheduler_for_refuses_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown backend 'polars'; registered backends: \['arrow', 'cudf'\]"):
        backends.scheduler_for("polars", 2, False)
    with pytest.raises(TypeError, match=r"backend must be a backend name.*got None"):
        backends.scheduler_for(None, 2, False)
    with pytest.raises(TypeError, match=r"gpus must be an int \(the number of visible GPUs\), got str '2'"):
        backends.scheduler_for("cudf", "2", False)
    with pytest.raises(TypeError, match=r"gpus must be an int .*got bool True"):
        backends.scheduler_for("cudf", True, False)
    with pytest.raises(ValueError, match="gpus must be 0 or more, got -1"):
        backends.scheduler_for("cudf", -1, False)
    with pytest.raises(TypeError, match="client_given must be True or False, got NoneType None"):
        backends.scheduler_for("cudf", 2, None)


def test_a_given_client_is_used_on_either_backend(dask_client):
    assert backends.execution_client("arrow", dask_client) is dask_client
    assert backends.execution_client("cudf", dask_client) is dask_client
    assert backends.execution_client("arrow") is None


def test_a_workflow_fits_on_its_given_client_and_keeps_it(small_raw, dask_client):
    from distributed import get_task_stream

    data = ts.Dataset(small_raw, cpu=True, part_size=16384)
    assert data.npartitions > 1
    wf = ts.Workflow(["C1"] >> ops.Categorify(), client=dask_client)
    with get_task_stream(client=dask_client) as stream:
        wf.fit(data)
    assert len(stream.data) >= data.npartitions  # the partials ran on the client's workers
    assert wf.client is dask_client
    plain = ts.Workflow(["C1"] >> ops.Categorify()).fit(data)
    assert plain.client is None  # threads: no client appears after a fit
    frame = small_raw[["C1"]]
    assert wf.transform(frame)["C1"].tolist() == plain.transform(frame)["C1"].tolist()


# -- without cudf / dask-cuda: clear errors, and the CPU path unchanged ----------------
@pytest.fixture
def without(monkeypatch):
    """Make modules unimportable for one test (``sys.modules[name] = None`` makes
    ``import name`` raise ImportError) and forget the cached GPU probe around it."""
    def block(*names):
        for name in names:
            monkeypatch.setitem(sys.modules, name, None)
        cudf_backend.gpu_status.cache_clear()
        cudf_backend.gpu_count.cache_clear()

    yield block
    cudf_backend.gpu_status.cache_clear()
    cudf_backend.gpu_count.cache_clear()


def test_without_cudf_no_gpu_is_counted_and_tasks_run_on_threads(without):
    without("cudf", "cupy")
    assert backends.gpu_status().startswith("cudf/cupy do not import")
    assert backends.gpu_count() == 0
    assert backends.execution_client("cudf") is None


def test_several_gpus_without_dask_cuda_say_what_to_do(without, monkeypatch):
    without("dask_cuda")
    monkeypatch.setattr(cudf_backend, "_CLUSTER", {})  # no cluster of an earlier test
    with pytest.raises(BackendUnavailableError,
                       match=r"several GPUs are visible and no dask client was given.*LocalCUDACluster "
                             r"\(one worker per GPU\), but dask_cuda does not import") as info:
        cudf_backend.local_cuda_client()
    assert "pip install 'tabstream[gpu]'" in info.value.hint
    assert "client=Client(" in info.value.hint and "CUDA_VISIBLE_DEVICES=0" in info.value.hint


def test_gpu_helpers_without_cudf_say_what_to_install(without, tmp_path):
    without("cudf", "cupy")
    path = tmp_path / "x.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), path)
    with pytest.raises(BackendUnavailableError, match="the cudf backend cannot run here: cudf/cupy do not import") \
            as info:
        cudf_backend.read_parquet_row_groups(str(path), [0], ["a"])
    assert "tabstream[gpu]" in info.value.hint
    with pytest.raises(BackendUnavailableError, match="the cudf backend cannot run here"):
        cudf_backend.dask_gpu_frame(lambda piece: pa.table({"a": [1]}), [0], pa.schema([("a", pa.int64())]))


def test_gpu_frames_are_told_apart_without_importing_cudf():
    frame = pd.DataFrame({"a": [1]})
    assert not cudf_backend.is_gpu_frame(frame)
    assert not cudf_backend.is_gpu_frame(pa.table({"a": [1]}))
    with pytest.raises(TypeError, match="expected a cudf DataFrame, got pandas.*DataFrame"):
        cudf_backend.frame_to_arrow(frame)


@pytest.fixture
def parquet_days(tmp_path):
    """Two parquet files of several row groups, with nulls."""
    rng = np.random.default_rng(3)
    tables = []
    for day in range(2):
        n = 700
        table = pa.table({
            "day": pa.array(np.full(n, day), pa.int64()),
            "x": pa.array(rng.integers(0, 10, n), pa.int64()),
            "f": pa.array(np.where(rng.random(n) < 0.1, np.nan, rng.random(n))),
            "s": pa.array([None if i % 7 == 0 else f"v{i % 13}" for i in range(n)], pa.string()),
        })
        pq.write_table(table, tmp_path / f"day_{day}.parquet", row_group_size=100)
        tables.append(table)
    return tmp_path, pa.concat_tables(tables)


def test_a_cudf_dataset_reads_parquet_with_cudf_or_refuses(parquet_days, without):
    # On a GPU machine Dataset(cpu=None) picks cudf and reads row groups with cudf's
    # reader; here cudf does not import, so such a Dataset refuses to read rather
    # than silently reading on the CPU.
    path, _ = parquet_days
    without("cudf", "cupy")
    ds = ts.Dataset(str(path / "*.parquet"), cpu=True)
    ds.backend_name = "cudf"  # what backends.choose gives on a machine with a GPU
    with pytest.raises(BackendUnavailableError, match="the cudf backend cannot run here"):
        ds.read_piece(ds.pieces[0], ["x"])
    with pytest.raises(BackendUnavailableError, match="the cudf backend cannot run here"):
        ds.to_ddf()


def test_to_ddf_on_the_arrow_backend_is_pandas_and_keeps_the_dataset_rows(parquet_days):
    path, table = parquet_days
    ds = ts.Dataset(str(path / "*.parquet"), part_size=4096, cpu=True, filters=[("x", ">", 3)])
    assert ds.npartitions > 2
    ddf = ds.to_ddf(["x", "s"])
    assert isinstance(ddf._meta, pd.DataFrame) and ddf.npartitions == ds.npartitions
    got = ddf.compute().reset_index(drop=True)
    want = table.to_pandas()
    want = want[want["x"] > 3][["x", "s"]].reset_index(drop=True)
    assert got["x"].tolist() == want["x"].tolist()
    assert got["s"].isna().tolist() == want["s"].isna().tolist()
    assert got["s"].dropna().tolist() == want["s"].dropna().tolist()


def test_a_pandas_dask_frame_round_trips_unchanged(small_raw):
    ddf = dd.from_pandas(small_raw, npartitions=3)
    ds = ts.Dataset(ddf, cpu=True)
    assert ds.to_ddf() is ddf
    assert ds.num_rows == len(small_raw)
    first = ds.read_piece(ds.pieces[0])
    assert first.column("row_id").to_pylist() == ddf.get_partition(0).compute()["row_id"].tolist()


def test_a_filtered_or_split_dask_frame_gives_only_its_rows_from_to_ddf(small_raw):
    ddf = dd.from_pandas(small_raw, npartitions=3)
    want = small_raw[small_raw["row_id"] < 500]["row_id"].tolist()
    filtered = ts.Dataset(ddf, cpu=True, filters=[("row_id", "<", 500)])
    assert filtered.to_ddf().compute()["row_id"].tolist() == want
    parts = ts.Dataset(ddf, cpu=True).split([0.5, 0.5], seed=1)
    got = [p.to_ddf().compute()["row_id"].tolist() for p in parts]
    assert [len(g) for g in got] == [p.num_rows for p in parts]
    assert sorted(got[0] + got[1]) == small_raw["row_id"].tolist()


# -- on a GPU --------------------------------------------------------------------------
def _cudf_or_skip():
    reason = backends.gpu_status()
    if reason is not None:
        pytest.skip(f"needs the cudf backend: {reason}")
    import cudf

    return cudf


@pytest.mark.gpu
@pytest.mark.parametrize("filters", [None, [("x", ">", 3)]])
def test_cudf_reader_gives_every_piece_as_the_arrow_reader(parquet_days, filters):
    _cudf_or_skip()
    path, _ = parquet_days
    # a third file without column "s": unified, null there
    pq.write_table(pa.table({"day": [2, 2, 2], "x": [5, 1, 9], "f": [0.5, None, 1.5]}), path / "day_2.parquet")
    # the Dataset says so (tests/pipeline covers the message), on either backend
    with pytest.warns(DatasetWarning, match="columns differ"):
        gpu = ts.Dataset(str(path / "*.parquet"), part_size=4096, cpu=False, filters=filters)
    with pytest.warns(DatasetWarning, match="columns differ"):
        cpu = ts.Dataset(str(path / "*.parquet"), part_size=4096, cpu=True, filters=filters)
    assert gpu.backend_name == "cudf" and gpu.pieces == cpu.pieces and len(gpu.pieces) > 3
    for piece in gpu.pieces:
        assert_tables_equal(gpu.read_piece(piece), cpu.read_piece(piece))
        assert_tables_equal(gpu.read_piece(piece, ["s", "x"]), cpu.read_piece(piece, ["s", "x"]))
    for g, c in zip(gpu.split([0.3, 0.7], seed=5), cpu.split([0.3, 0.7], seed=5), strict=True):
        assert g.num_rows == c.num_rows
        for piece in g.pieces:
            assert_tables_equal(g.read_piece(piece), c.read_piece(piece))


@pytest.mark.gpu
def test_to_ddf_on_the_cudf_backend_is_dask_cudf(parquet_days):
    cudf = _cudf_or_skip()
    path, table = parquet_days
    gpu = ts.Dataset(str(path / "*.parquet"), part_size=4096, cpu=False, filters=[("x", ">", 3)])
    ddf = gpu.to_ddf(["x", "f", "s"])
    assert isinstance(ddf._meta, cudf.DataFrame) and ddf.npartitions == gpu.npartitions
    got = ddf.compute()
    assert isinstance(got, cudf.DataFrame)
    # the files' rows, filtered by Arrow: NaN and null kept apart (a pandas frame on
    # the CPU would merge them, so the reference is Arrow's); types are cudf's own
    want = table.filter(pc.greater(table["x"], 3)).select(["x", "f", "s"])
    assert_tables_equal(got.to_arrow(preserve_index=False), want, check_dtype=False)


@pytest.mark.gpu
def test_a_dask_cudf_frame_is_a_dataset_and_a_workflow_input(small_raw):
    cudf = _cudf_or_skip()
    import dask_cudf

    gddf = dask_cudf.from_cudf(cudf.DataFrame.from_arrow(pa.Table.from_pandas(small_raw, preserve_index=False)),
                               npartitions=3)
    ds = ts.Dataset(gddf)
    assert ds.backend_name == "cudf" and ds.num_rows == len(small_raw)
    assert ds.to_ddf() is gddf
    graph = (["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.FillMissing(0) >> ops.Normalize()) + ["row_id"]
    gpu_out = ts.Workflow(graph).fit(gddf).transform(gddf).compute()
    graph = (["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.FillMissing(0) >> ops.Normalize()) + ["row_id"]
    cpu_data = ts.Dataset(small_raw, cpu=True)
    cpu_out = ts.Workflow(graph).fit(cpu_data).transform(cpu_data).compute()
    gpu_out = gpu_out.sort_values("row_id").reset_index(drop=True)
    cpu_out = cpu_out.sort_values("row_id").reset_index(drop=True)
    for name in ("C1", "C2", "row_id"):
        assert gpu_out[name].tolist() == cpu_out[name].tolist()
    np.testing.assert_allclose(gpu_out["I1"].to_numpy(), cpu_out["I1"].to_numpy(), rtol=1e-6, atol=1e-6)
    tds = ts.Workflow(["C1", "row_id"]).fit(gddf).transform(gddf)
    assert isinstance(tds.to_ddf()._meta, cudf.DataFrame)


@pytest.mark.gpu
def test_one_gpu_runs_on_threads():
    _cudf_or_skip()
    if backends.gpu_count() != 1:
        pytest.skip(f"needs exactly one visible GPU, {backends.gpu_count()} here")
    assert backends.execution_client("cudf") is None


@pytest.mark.gpu
def test_several_gpus_run_on_one_local_cuda_cluster(small_raw, tmp_path):
    _cudf_or_skip()
    if backends.gpu_count() < 2:
        pytest.skip(f"needs two or more visible GPUs, {backends.gpu_count()} here")
    if importlib.util.find_spec("dask_cuda") is None:
        pytest.skip("needs dask-cuda (pip install 'tabstream[gpu]')")
    from distributed import get_task_stream

    client = backends.execution_client("cudf")
    assert backends.execution_client("cudf") is client  # one cluster per process
    devices = client.run(lambda: __import__("os").environ["CUDA_VISIBLE_DEVICES"])
    assert len(devices) == backends.gpu_count()
    # dask-cuda's documented layout: each worker its own GPU first in CUDA_VISIBLE_DEVICES
    assert len({d.split(",")[0] for d in devices.values()}) == len(devices)

    small_raw.to_parquet(tmp_path / "raw.parquet", row_group_size=250)
    outputs = []
    for cpu in (False, True):
        data = ts.Dataset(str(tmp_path / "raw.parquet"), part_size=8192, cpu=cpu)
        graph = (["C1", "C2"] >> ops.Categorify()) + (["I1"] >> ops.FillMissing(0) >> ops.Normalize()) + ["row_id"]
        with get_task_stream(client=client) as stream:
            wf = ts.Workflow(graph).fit(data)
            wf.transform(data).to_parquet(str(tmp_path / f"out_{cpu}"))
        assert (len(stream.data) > 0) == (not cpu)  # the cluster ran the cudf run only
        outputs.append(pd.read_parquet(tmp_path / f"out_{cpu}").sort_values("row_id").reset_index(drop=True))
    gpu_out, cpu_out = outputs
    for name in ("C1", "C2", "row_id"):
        assert gpu_out[name].tolist() == cpu_out[name].tolist()
    np.testing.assert_allclose(gpu_out["I1"].to_numpy(), cpu_out["I1"].to_numpy(), rtol=1e-6, atol=1e-6)

"""Fit and export on real dask clusters: a ``dask scheduler`` and two ``dask worker``
processes started here on 127.0.0.1 (each with its own local directory and TMPDIR,
so nothing private is shared by accident), and ``LocalCluster(processes=True)``.
Outputs are compared with the threaded run's, read back with plain pyarrow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import tabstream as ts
from tabstream import ops
from tabstream.datasets.synthetic import CRITEO_CATEGORICAL, write_data
from tabstream.recipes import criteo_graph
from tabstream.testing import CONTRACT_EXAMPLES, assert_tables_equal, contract_frame

ROOT = Path(__file__).resolve().parents[2]
CATS = CRITEO_CATEGORICAL[:6]


def _wait_for(path: Path, procs: list[subprocess.Popen], seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"{p.args} exited with {p.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {seconds} s")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory, dask_dashboard_port_taken):
    """A scheduler and two single-threaded worker processes, shared by this module."""
    import distributed

    base = tmp_path_factory.mktemp("cluster")
    scheduler_file = base / "scheduler.json"
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(scheduler_file)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    worker_tmps = []
    try:
        _wait_for(scheduler_file, procs)
        for i in range(2):
            local, tmp = base / f"w{i}-local", base / f"w{i}-tmp"
            local.mkdir()
            tmp.mkdir()
            worker_tmps.append(tmp)
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file",
                 str(scheduler_file), "--host", "127.0.0.1", "--nthreads", "1", "--nworkers", "1",
                 "--no-dashboard", "--local-directory", str(local)],
                env=dict(env, TMPDIR=str(tmp)), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        with distributed.Client(scheduler_file=str(scheduler_file), timeout=60,
                                set_as_default=False) as client:
            client.wait_for_workers(2, timeout=60)
            client.worker_tmps = worker_tmps
            yield client
            client.shutdown()  # the scheduler closes the workers: quicker than signals
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def raw_tsv(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("raw")
    write_data("criteo", folder, 6_000, num_files=4, fmt="tsv", seed=3)
    return str(folder)


def _criteo_dataset(path: str) -> ts.Dataset:
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES

    return ts.Dataset(path, sep="\t", names=CRITEO_COLUMNS, dtypes=CRITEO_DTYPES)


def _read_export(path: str) -> pa.Table:
    """The rows of an export in manifest order, with plain pyarrow."""
    manifest = json.loads(Path(path, "_manifest.json").read_text())
    return pa.concat_tables([pq.read_table(Path(path, f["path"])) for f in manifest["files"]])


def _fit_export(client, raw: str, out: str, **kwargs) -> pa.Table:
    graph = criteo_graph(freq_threshold=2, categorical=CATS)
    wf = ts.Workflow(graph, client=client).fit(_criteo_dataset(raw))
    wf.transform(_criteo_dataset(raw)).to_parquet(out, **kwargs)
    return _read_export(out)


def test_criteo_fit_and_export_on_real_cluster_equal_threaded(real_cluster, raw_tsv, tmp_path):
    on_cluster = _fit_export(real_cluster, raw_tsv, str(tmp_path / "cluster"))
    threaded = _fit_export(None, raw_tsv, str(tmp_path / "threaded"))
    assert on_cluster.num_rows == 6_000
    assert on_cluster.equals(threaded)  # ids exact, floats bit-equal, same order
    # the files were written by the workers, none in their private temporary folders
    for tmp in real_cluster.worker_tmps:
        assert not [p for p in tmp.rglob("*") if "tabstream" in p.name]


def test_export_out_files_per_proc_counts_workers(real_cluster, raw_tsv, tmp_path):
    out = tmp_path / "out"
    _fit_export(real_cluster, raw_tsv, str(out), out_files_per_proc=2)
    manifest = json.loads((out / "_manifest.json").read_text())
    assert len(real_cluster.scheduler_info()["workers"]) == 2
    assert len(manifest["files"]) == 2 * 2


@pytest.mark.parametrize("shuffle", ["per_worker", "full"])
def test_shuffled_exports_on_cluster_keep_every_row(real_cluster, raw_tsv, tmp_path, shuffle):
    on_cluster = _fit_export(real_cluster, raw_tsv, str(tmp_path / "c"), shuffle=shuffle, seed=5)
    threaded = _fit_export(None, raw_tsv, str(tmp_path / "t"), shuffle=None)
    keys = [(c, "ascending") for c in threaded.column_names]
    assert on_cluster.sort_by(keys).equals(threaded.sort_by(keys))
    assert not on_cluster.equals(threaded)  # the rows were moved


def _spill_graph(spill_dir):
    return ["C1", "C2"] >> ops.Categorify(freq_threshold=1, spill_rows=50, spill_buckets=3,
                                           spill_dir=spill_dir)


def test_categorify_spill_goes_through_shared_dir_on_cluster(real_cluster, raw_tsv, tmp_path):
    """Partials spilled by one worker are merged by the client: through ``spill_dir``
    (a folder every process sees), and the vocabulary equals the threaded one's."""
    shared = tmp_path / "shared-spill"
    shared.mkdir()
    ds = _criteo_dataset(raw_tsv)
    wf = ts.Workflow(_spill_graph(str(shared)), client=real_cluster).fit(ds)
    local = ts.Workflow(_spill_graph(None)).fit(ds)
    frame = _criteo_dataset(raw_tsv).to_ddf().compute()
    for col in ("C1", "C2"):
        expected = frame[col].dropna().value_counts()
        vocab = wf.output_node.op.tables[col].to_pydict()
        assert dict(zip(vocab["values"], vocab["counts"])) == {str(k): int(v) for k, v in expected.items()}
    pd_left, pd_right = wf.transform(frame), local.transform(frame)
    assert pd_left.equals(pd_right)
    assert list(shared.iterdir()) == []  # spill files removed after the merge


def test_categorify_spill_without_spill_dir_on_one_host_uses_a_fit_folder(real_cluster, raw_tsv,
                                                                         tmp_path, monkeypatch):
    """Workers on the client's machine spill into a folder the client made for this
    fit (removed afterwards), never into their own temporary folders."""
    import tempfile

    client_tmp = tmp_path / "client-tmp"
    client_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(client_tmp))
    ds = _criteo_dataset(raw_tsv)
    graph = _spill_graph(None)
    wf = ts.Workflow(graph, client=real_cluster).fit(ds)
    assert graph.op.spill_dir is None  # the fit's folder is not kept in the params
    local = ts.Workflow(_spill_graph(None)).fit(ds)
    for col in ("C1", "C2"):
        assert wf.output_node.op.tables[col].equals(local.output_node.op.tables[col])
    # (the raw log's parse cache of the threaded fit lives as long as ``ds``)
    assert [p for p in client_tmp.iterdir() if not p.name.startswith("tabstream-cache-")] == []
    for tmp in real_cluster.worker_tmps:
        assert not [p for p in tmp.rglob("*") if "tabstream" in p.name]


def test_categorify_spill_on_workers_of_other_hosts_without_spill_dir_is_refused(
        real_cluster, raw_tsv, monkeypatch):
    import tabstream.pipeline.execution as execution_module

    monkeypatch.setattr(execution_module, "workers_share_this_host", lambda client: False)
    ds = _criteo_dataset(raw_tsv)
    with pytest.raises(ValueError, match=r"spill_rows=50 .*dask worker.*spill_dir is None.*share"):
        ts.Workflow(_spill_graph(None), client=real_cluster).fit(ds)


def test_local_cluster_processes_equals_threaded(raw_tsv, tmp_path, dask_dashboard_port_taken):
    import distributed

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address="127.0.0.1:0") as cluster, \
            distributed.Client(cluster, set_as_default=False) as client:
        on_cluster = _fit_export(client, raw_tsv, str(tmp_path / "cluster"))
    threaded = _fit_export(None, raw_tsv, str(tmp_path / "threaded"))
    assert on_cluster.equals(threaded)




@pytest.fixture(scope="module")
def contract_parquet(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("contract")
    table = contract_frame()
    for i, start in enumerate(range(0, table.num_rows, 200)):
        pq.write_table(table.slice(start, 200), folder / f"part_{i}.parquet")
    return str(folder)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONTRACT_EXAMPLES))
def test_every_op_fits_and_transforms_on_cluster(real_cluster, contract_parquet, tmp_path, name):
    factory, columns = CONTRACT_EXAMPLES[name]
    outputs = []
    for client, out in ((real_cluster, tmp_path / "cluster"), (None, tmp_path / "threaded")):
        wf = ts.Workflow(columns >> factory(), client=client).fit(ts.Dataset(contract_parquet))
        wf.transform(ts.Dataset(contract_parquet)).to_parquet(str(out))
        outputs.append(_read_export(str(out)))
    assert outputs[0].num_rows > 0
    assert_tables_equal(outputs[0], outputs[1])  # exact; NaN equals NaN


def test_partition_on_export_on_cluster_equals_threaded(real_cluster, raw_tsv, tmp_path):
    """Hive folders written by the workers hold the same rows as the threaded run's."""
    tables = []
    for client, out in ((real_cluster, tmp_path / "c"), (None, tmp_path / "t")):
        wf = ts.Workflow(criteo_graph(freq_threshold=2, categorical=CATS), client=client)
        wf.fit(_criteo_dataset(raw_tsv))
        wf.transform(_criteo_dataset(raw_tsv)).to_parquet(str(out), partition_on=["label"])
        back = ts.Dataset(str(out))
        assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["label=0", "label=1"]
        tables.append(pa.concat_tables([back.read_piece(p) for p in back.pieces]))
    keys = [(c, "ascending") for c in tables[1].column_names]
    assert tables[0].sort_by(keys).equals(tables[1].sort_by(keys))


def _groupby_case(contract_parquet, client):
    factory, columns = CONTRACT_EXAMPLES["Groupby"]
    wf = ts.Workflow(columns >> factory(), client=client).fit(ts.Dataset(contract_parquet))
    return wf.transform(ts.Dataset(contract_parquet))


def test_groupby_in_memory_on_one_host_cluster_equals_threaded(real_cluster, contract_parquet):
    on_cluster = _groupby_case(contract_parquet, real_cluster).compute()
    threaded = _groupby_case(contract_parquet, None).compute()
    assert_tables_equal(on_cluster, threaded)


def test_groupby_in_memory_on_other_hosts_is_refused(real_cluster, contract_parquet, monkeypatch):
    import tabstream.pipeline.execution as execution_module

    monkeypatch.setattr(execution_module, "workers_share_this_host", lambda client: False)
    with pytest.raises(ValueError, match=r"Groupby: to_iter/compute/to_ddf regroup rows through a "
                                         r"folder of this machine.*use to_parquet\(path\)"):
        _groupby_case(contract_parquet, real_cluster).compute()


def test_workers_fit_and_export_with_small_pages(real_cluster, tmp_path):
    """The fit's partitions and combinations and the export's writes run with huge
    pages off in the worker processes too (tabstream.core.pages), where the client's
    own setting does not reach."""
    # the probe op travels by name: the workers import it from this checkout (ROOT)
    from tests.pipeline.test_small_pages import check_fit_and_export

    check_fit_and_export(tmp_path, client=real_cluster)


def _record_spills_into(path: str) -> None:
    """Run on each worker: Categorify's spills append the caller's name to ``path``."""
    import inspect

    from tabstream.ops import categorify

    original = categorify.Categorify.__dict__["_spill"]

    def recording(self, table, offsets=None):
        with open(path, "a") as f:
            f.write(inspect.stack()[1].function + "\n")
        return original(self, table, offsets)

    recording.original = original
    categorify.Categorify._spill = recording


def _stop_recording_spills() -> None:
    from tabstream.ops import categorify

    current = categorify.Categorify.__dict__["_spill"]
    categorify.Categorify._spill = getattr(current, "original", current)


def test_partials_spilled_by_their_partition_on_cluster_workers(real_cluster, raw_tsv, tmp_path):
    """A fit of more than 16 partitions on the cluster: each worker spills the partials
    its combination would have spilled unmerged from the partition's own task, into the
    shared spill folder; the vocabulary is the threaded fit's and pandas'."""
    from tabstream.datasets.synthetic import CRITEO_COLUMNS, CRITEO_DTYPES

    def dataset() -> ts.Dataset:
        return ts.Dataset(raw_tsv, sep="\t", names=CRITEO_COLUMNS, dtypes=CRITEO_DTYPES, part_size="40KiB")

    def graph(spill_dir):
        return ["C1", "C2"] >> ops.Categorify(spill_rows=20, spill_buckets=3, spill_dir=spill_dir)

    ds = dataset()
    assert ds.npartitions > 16
    shared = tmp_path / "shared-spill"
    shared.mkdir()
    log = tmp_path / "spills.log"
    real_cluster.run(_record_spills_into, str(log))
    try:
        wf = ts.Workflow(graph(str(shared)), client=real_cluster).fit(ds)
    finally:
        real_cluster.run(_stop_recording_spills)
    callers = log.read_text().split()
    assert callers.count("fit_partition") >= ds.npartitions // 2  # the partitions' own tasks
    assert "_spill_parts" not in callers  # no combination was left partials to spill
    local = ts.Workflow(graph(None)).fit(dataset())
    frame = dataset().to_ddf().compute()
    for col in ("C1", "C2"):
        assert wf.output_node.op.tables[col].equals(local.output_node.op.tables[col])
        expected = frame[col].dropna().value_counts()
        vocab = wf.output_node.op.tables[col].to_pydict()
        assert dict(zip(vocab["values"], vocab["counts"])) == {str(k): int(v) for k, v in expected.items()}
    assert list(shared.iterdir()) == []  # spill files removed after the merge

"""Loader throughput: one shuffled epoch of a Criteo-like export into tensors.

    python benchmarks/loader.py                       # 10M rows, batch 8192 and 65536
    python benchmarks/loader.py --rows 1000000 --repeats 1 --cases raw torch

Writes (once, under --data-dir) a Criteo-like export: ``label`` int64, ``I1..I13``
float32, ``C1..C26`` int64, in files of --rows-per-file rows with row groups of
--row-group-size rows, plus ``schema.json`` and ``_manifest.json`` (the layout of
``to_parquet``). Then, for each batch size, runs each case --repeats times, each run
in a fresh process (so peak RSS is the case's own, from the kernel's ``ru_maxrss``):

* ``raw``: ``pyarrow.parquet.ParquetFile.iter_batches`` to numpy, file by file, no
  shuffle: the floor of the cost of reading the data.
* ``torch``: ``tabstream.loaders.torch.Loader`` with shuffle, into torch tensors.
* ``tf``: ``tabstream.loaders.tensorflow.Loader`` with shuffle, into TF tensors.
* ``handwritten``: what users write by hand: ``pandas.read_parquet``, numpy arrays
  per column, a map-style ``torch.utils.data.Dataset`` returning one row, and
  ``DataLoader(batch_size=B, shuffle=True)``. It holds the whole frame in memory and
  is slow, so it runs on the first --handwritten-rows rows; its rate is compared.

One-process mode (``--one-process``, issue 34 item 5): ``raw``, ``torch``
(shuffled) and ``ordered`` (the torch loader with ``shuffle=False``) alternately
in this process, ``--repeats`` times each after one warm-up of each,
the ``Dataset`` and ``Loader`` built inside the timing (as a user's epoch loop
does); medians of wall and CPU seconds and the torch/raw rate ratio. A fresh
process per run (the default mode) charges the raw read with its first-touch page
faults; a warm process does not, which is the comparison a training loop sees::

    python benchmarks/loader.py --rows 2000000 --batch-sizes 65536 --one-process --repeats 5

On 4 cores or more the loader copies columns into batches on several threads
(``tabstream.loaders.batching``); ``torch-1t`` then runs the shuffled epoch with
one beside it (``--fill-threads N`` sets the count, e.g. 2 on a 2-core machine).

Multi-hot mode (``--multi-hot``, issue 14): ``generate_data("multi-hot", rows,
slots=100, nnz=10, vocabulary=8192)`` written once as plain ``list<list<int64>>``
parquet, seen through two schemas: one giving the shape ``[None, 100, 10]``
(delivered dense ``(B, 100, 10)``), one without (delivered ragged: values and two
offset levels).
Cases: ``tfdata``, ``tf.data.Dataset.from_tensor_slices((ids, label)).shuffle(buffer)
.batch(B)`` over the same rows held in memory as numpy, its setup time (reading the
parquet into numpy and building the pipeline) reported apart and not in its rate
(likewise the tabstream loaders' construction: planning the row groups);
``torch_dense``/``tf_dense`` and ``torch_ragged``/``tf_ragged``, the tabstream loaders
(shuffled) into torch and TF tensors. Ratios are to ``tfdata`` measured in the same
run. Targets (issue 34, item 4): dense >= 1.3x, ragged >= 1.0x.

    python benchmarks/loader.py --multi-hot --rows 250000 --batch-sizes 8192

(files of 62,500 rows in row groups of 16,384 unless --rows-per-file and
--row-group-size say otherwise: 131 MB decoded per row group).

Rates are rows per second over the whole epoch, reading included; time to first
batch counts from building the loader (imports excluded). Medians are printed, with
the tabstream loaders' ratios to ``raw`` and to ``handwritten``, and the peak RSS
reached by the imports alone (torch and tabstream: about 300 MB of the total).
Targets (2-core machine, torch at batch 65536): >= 0.8x raw, >= 20x handwritten,
peak RSS < 500 MB, first batch < 0.5 s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import emit_result, format_table, machine_note, median, run_child  # noqa: E402

CONTINUOUS = [f"I{i}" for i in range(1, 14)]
CATEGORICAL = [f"C{i}" for i in range(1, 27)]
CASES = ("raw", "torch", "tf", "handwritten")
MH_CASES = ("tfdata", "torch_dense", "tf_dense", "torch_ragged", "tf_ragged")
MH_SLOTS, MH_NNZ, MH_VOCAB = 100, 10, 8192
ROWS_PER_FILE, ROW_GROUP_SIZE = 1_000_000, 100_000
# Multi-hot rows are 8 KB decoded (100 x 10 int64 ids), 30 times a Criteo row: 16,384
# rows make a 131 MB row group (about 27 MB on disk), in the range parquet writers
# aim for by bytes; 100,000 rows would be 800 MB groups, three to a 250k-row epoch.
# Every multi-hot figure in benchmarks/RESULTS.md since session 4 used this layout.
MH_ROWS_PER_FILE, MH_ROW_GROUP_SIZE = 62_500, 16_384


def generate(path: str, rows: int, rows_per_file: int, row_group_size: int, seed: int = 0,
             dictionary_ids: bool = False) -> None:
    """A Criteo-like export written directly (no workflow), atomically, its id columns
    encoded as ``to_parquet`` writes them (delta-packed; ``dictionary_ids``: as pyarrow's
    default writer does, the layout of exports before session 23)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tabstream.core.schema import ColumnSchema, Schema, Tags
    from tabstream.pipeline.export import delta_encoded_columns, parquet_encodings

    vocab = {c: 10 ** (1 + j % 7) for j, c in enumerate(CATEGORICAL)}
    schema = Schema(
        [ColumnSchema("label", "int64", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])]
        + [ColumnSchema(c, "float32", tags=[Tags.CONTINUOUS]) for c in CONTINUOUS]
        + [ColumnSchema(c, "int64", tags=[Tags.CATEGORICAL],
                        properties={"domain": {"min": 0, "max": vocab[c] - 1}}) for c in CATEGORICAL]
    )
    delta = [] if dictionary_ids else delta_encoded_columns(schema)

    tmp = path + ".tmp"
    os.makedirs(tmp, exist_ok=True)
    rng = np.random.default_rng(seed)
    files = []
    for i, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        cols: dict[str, pa.Array] = {"label": pa.array(rng.integers(0, 2, n))}
        for c in CONTINUOUS:
            cols[c] = pa.array(rng.standard_normal(n, dtype=np.float32))
        for c in CATEGORICAL:
            # Zipf-like ids over vocabularies from 10 to 10M, as in Criteo
            cols[c] = pa.array(np.minimum(rng.zipf(1.2, n), vocab[c]) - 1)
        name = f"part_{i:05d}.parquet"
        table = pa.table(cols)
        pq.write_table(table, os.path.join(tmp, name), row_group_size=row_group_size,
                       **parquet_encodings(table.schema, delta))
        files.append({"path": name, "num_rows": n})
    schema.to_json(os.path.join(tmp, "schema.json"))
    with open(os.path.join(tmp, "_manifest.json"), "w") as f:
        json.dump({"num_rows": rows, "files": files}, f)
    os.rename(tmp, path)


def generate_multi_hot(path: str, rows: int, rows_per_file: int, row_group_size: int) -> None:
    """The multi-hot rows as plain ``list<list<int64>>`` parquet, twice: ``dense``
    whose ``_schema.json`` gives the column's shape ``[None, 100, 10]`` (so the loader
    delivers dense blocks) and ``ragged`` without it (hard links to the same files),
    written atomically."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from tabstream.core.schema import ColumnSchema, Schema, Tags
    from tabstream.datasets import write_data

    tmp = path + ".tmp"
    num_files = max(1, -(-rows // rows_per_file))
    fixed = os.path.join(tmp, "fixed")
    write_data("multi-hot", fixed, rows, num_files=num_files, row_group_size=row_group_size,
               chunk_rows=row_group_size, slots=MH_SLOTS, nnz=MH_NNZ, vocabulary=MH_VOCAB)
    plain = pa.schema([pa.field("label", pa.int64()),
                       pa.field("multi_hot", pa.list_(pa.list_(pa.int64())))])
    dense, ragged = os.path.join(tmp, "dense"), os.path.join(tmp, "ragged")
    os.makedirs(dense)
    os.makedirs(ragged)
    files = []
    for name in sorted(os.listdir(fixed)):
        f = pq.ParquetFile(os.path.join(fixed, name))
        with pq.ParquetWriter(os.path.join(dense, name), plain) as writer:
            for i in range(f.num_row_groups):
                writer.write_table(f.read_row_group(i).cast(plain), row_group_size=row_group_size)
        os.link(os.path.join(dense, name), os.path.join(ragged, name))
        files.append({"path": name, "num_rows": f.metadata.num_rows})
        os.remove(os.path.join(fixed, name))
    os.rmdir(fixed)
    label = ColumnSchema("label", "int64", tags=[Tags.TARGET, Tags.BINARY_CLASSIFICATION])
    domain = {"domain": {"min": 0, "max": MH_VOCAB - 1}}
    for folder, props in ((dense, {"shape": [None, MH_SLOTS, MH_NNZ]}), (ragged, {})):
        Schema([label, ColumnSchema("multi_hot", "int64", tags=[Tags.CATEGORICAL], is_list=True,
                                    is_ragged=not props, properties={**domain, **props})]
               ).to_json(os.path.join(folder, "_schema.json"))
        with open(os.path.join(folder, "_manifest.json"), "w") as out:
            json.dump({"num_rows": rows, "files": files}, out)
    os.rename(tmp, path)


# -- the cases, each run in a child process ------------------------------------------
def _rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _vm_hwm_mb() -> float | None:
    """This process's own peak RSS. (A child's ru_maxrss also counts its parent's
    RSS at fork time; VmHWM belongs to the exec'd image alone.)"""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _cpu_s() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _result(rows: int, start: float, first: float | None) -> dict:
    return {"rows": rows, "seconds": time.perf_counter() - start, "first_batch_s": first,
            "cpu_s": _cpu_s() - _START_CPU, "start_rss_mb": _START_RSS, "vm_hwm_mb": _vm_hwm_mb()}


_START_RSS = 0.0  # peak RSS when the timed part starts: the imports' share
_START_CPU = 0.0  # CPU seconds (user + system, all threads) when the timed part starts


def _start() -> float:
    global _START_RSS, _START_CPU
    _START_RSS = _rss_mb()
    _START_CPU = _cpu_s()
    return time.perf_counter()


def _restart() -> float:
    """Restart the clock and the CPU count after a case's setup (peak RSS keeps the
    setup's share: it is the process's)."""
    global _START_CPU
    _START_CPU = _cpu_s()
    return time.perf_counter()


def _files(data: str) -> list[str]:
    with open(os.path.join(data, "_manifest.json")) as f:
        return [os.path.join(data, e["path"]) for e in json.load(f)["files"]]


def case_raw(data: str, batch_size: int, limit: int) -> dict:
    import pyarrow.parquet as pq

    start = _start()
    first = None
    rows = 0
    for path in _files(data):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
            arrays = {name: col.to_numpy() for name, col in zip(batch.schema.names, batch.columns,
                                                                 strict=True)}
            rows += len(arrays["label"])
            if first is None:
                first = time.perf_counter() - start
    return _result(rows, start, first)


def case_torch(data: str, batch_size: int, limit: int) -> dict:
    import torch

    from tabstream.loaders.torch import Loader

    torch.set_num_threads(1)
    start = _start()
    first = None
    rows = 0
    for _features, labels in Loader(data, batch_size, shuffle=True, seed=0):
        rows += len(labels)
        if first is None:
            first = time.perf_counter() - start
    return _result(rows, start, first)


def case_tf(data: str, batch_size: int, limit: int) -> dict:
    from tabstream.loaders.tensorflow import Loader

    start = _start()
    first = None
    rows = 0
    for _features, labels in Loader(data, batch_size, shuffle=True, seed=0):
        rows += int(labels.shape[0])
        if first is None:
            first = time.perf_counter() - start
    return _result(rows, start, first)


def case_handwritten(data: str, batch_size: int, limit: int) -> dict:
    import numpy as np
    import pandas as pd
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import DataLoader, Dataset

    torch.set_num_threads(1)

    class Rows(Dataset):
        def __init__(self, df: pd.DataFrame) -> None:
            self.cont = df[CONTINUOUS].to_numpy(np.float32)
            self.cat = df[CATEGORICAL].to_numpy(np.int64)
            self.label = df["label"].to_numpy(np.int64)

        def __len__(self) -> int:
            return len(self.label)

        def __getitem__(self, i: int) -> tuple[dict, np.int64]:
            return {"cont": self.cont[i], "cat": self.cat[i]}, self.label[i]

    start = _start()
    frames, have = [], 0
    for path in _files(data):  # the first `limit` rows
        frames.append(pq.read_table(path).slice(0, limit - have).to_pandas())
        have += len(frames[-1])
        if have >= limit:
            break
    df = pd.concat(frames, ignore_index=True)
    first = None
    rows = 0
    for _features, labels in DataLoader(Rows(df), batch_size=batch_size, shuffle=True):
        rows += len(labels)
        if first is None:
            first = time.perf_counter() - start
    return _result(rows, start, first)


def _mh_read(data: str) -> tuple:
    """The dense multi-hot rows in memory as numpy: ids (N, slots, nnz), labels (N,)."""
    import numpy as np
    import pyarrow.parquet as pq

    ids, labels = [], []
    for path in _files(data):
        t = pq.read_table(path)
        col = t.column("multi_hot").combine_chunks()
        ids.append(col.flatten().flatten().to_numpy().reshape(len(col), MH_SLOTS, MH_NNZ))
        labels.append(t.column("label").to_numpy())
    return np.concatenate(ids), np.concatenate(labels)


def case_tfdata(data: str, batch_size: int, limit: int) -> dict:
    import tensorflow as tf

    start = _start()
    ids, labels = _mh_read(os.path.join(data, "dense"))
    buffer = min(limit, len(labels))
    ds = tf.data.Dataset.from_tensor_slices((ids, labels)).shuffle(buffer, seed=0).batch(batch_size)
    del ids, labels  # tf holds its own copy
    setup = time.perf_counter() - start
    start = _restart()
    first = None
    rows = 0
    for _ids, y in ds:
        rows += int(y.shape[0])
        if first is None:
            first = time.perf_counter() - start
    result = _result(rows, start, first)
    result["setup_s"] = setup
    return result


def _mh_loader(kind: str, framework: str, data: str, batch_size: int) -> dict:
    if framework == "torch":
        import torch

        from tabstream.loaders.torch import Loader

        torch.set_num_threads(1)
    else:
        from tabstream.loaders.tensorflow import Loader
    start = _start()
    loader = Loader(os.path.join(data, kind), batch_size, shuffle=True, seed=0, labels=["label"])
    setup = time.perf_counter() - start
    start = _restart()
    first = None
    rows = 0
    for _features, labels in loader:
        rows += int(labels.shape[0])
        if first is None:
            first = time.perf_counter() - start
    result = _result(rows, start, first)
    result["setup_s"] = setup
    return result


def case_torch_dense(data: str, batch_size: int, limit: int) -> dict:
    return _mh_loader("dense", "torch", data, batch_size)


def case_tf_dense(data: str, batch_size: int, limit: int) -> dict:
    return _mh_loader("dense", "tf", data, batch_size)


def case_torch_ragged(data: str, batch_size: int, limit: int) -> dict:
    return _mh_loader("ragged", "torch", data, batch_size)


def case_tf_ragged(data: str, batch_size: int, limit: int) -> dict:
    return _mh_loader("ragged", "tf", data, batch_size)


def main_multi_hot(args: argparse.Namespace) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    data = args.data_dir or os.path.join(root, "bench_data",
                                         f"multihot-{args.rows}-rg{args.row_group_size}")
    if not os.path.exists(data):
        print(f"writing {args.rows:,} multi-hot rows to {data} ...", flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--multi-hot", "--generate",
                        "--rows", str(args.rows), "--rows-per-file", str(args.rows_per_file),
                        "--row-group-size", str(args.row_group_size), "--data-dir", data],
                       check=True)
    cases = [c for c in args.cases if c in MH_CASES] or list(MH_CASES)
    print(machine_note())
    print(f"data: {data} ({args.rows:,} rows of {MH_SLOTS} x {MH_NNZ} ids); tf.data shuffle "
          f"buffer {min(args.shuffle_buffer, args.rows):,}; medians of {args.repeats} runs, "
          "each in a fresh process", flush=True)
    print(_load_note("before"), flush=True)
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for batch_size in args.batch_sizes:
        runs = _round_robin(cases, args.repeats, lambda case, b=batch_size: run_case(
            case, data, b, args.shuffle_buffer))
        for case in cases:
            medians[case, batch_size] = {k: median([r[k] for r in runs[case]])
                                         for k in ("rows", "rate", "first_batch_s", "peak_rss_mb",
                                                   "setup_s", "cpu_s")}
            m = medians[case, batch_size]
            rates = ", ".join(f"{r['rate'] / 1e6:.3f}" for r in runs[case])
            print(f"  {case:<13} batch {batch_size:>6}: {m['rate'] / 1e6:6.3f} M rows/s (runs: "
                  f"{rates}), setup {m['setup_s']:.2f} s, CPU {m['cpu_s']:.2f} s, peak RSS "
                  f"{m['peak_rss_mb']:.0f} MB", flush=True)
    print(_load_note("after"), flush=True)
    headers = ["case", "batch", "rows", "M rows/s", "vs tf.data", "target", "setup s",
               "first batch s", "CPU s", "peak RSS MB"]
    # issue 34, item 4: dense at least 1.3x of tf.data, ragged at least 1.0x
    targets = {"torch_dense": 1.3, "tf_dense": 1.3, "torch_ragged": 1.0, "tf_ragged": 1.0}
    table = []
    for (case, batch_size), m in medians.items():
        base = medians.get(("tfdata", batch_size))
        ratio = m["rate"] / base["rate"] if base and case != "tfdata" else None
        target = targets.get(case)
        table.append([
            case, batch_size, f"{int(m['rows']):,}", f"{m['rate'] / 1e6:.3f}",
            f"{ratio:.2f}x" if ratio is not None else "",
            "" if target is None or ratio is None else
            (f">= {target}x met" if ratio >= target else f">= {target}x MISSED"),
            f"{m['setup_s']:.2f}", f"{m['first_batch_s']:.3f}", f"{m['cpu_s']:.2f}",
            f"{m['peak_rss_mb']:.0f}",
        ])
    print()
    print(format_table(headers, table, markdown=args.markdown))


# -- driver ---------------------------------------------------------------------------
def _round_robin(cases: Sequence[str], repeats: int,
                 run: Callable[[str], dict]) -> dict[str, list[dict]]:
    """``repeats`` runs of each case, taken in turns (case 1, case 2, ..., case 1, ...):
    on a shared machine a change of load then falls on every case alike."""
    runs: dict[str, list[dict]] = {case: [] for case in cases}
    for _ in range(repeats):
        for case in cases:
            runs[case].append(run(case))
    return runs


def _load_note(when: str) -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {when}: {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores)"


def main_one_process(data: str, batch_size: int, repeats: int, fill_threads: int | None = None) -> None:
    """``raw`` and ``torch`` alternately in this process (see the module doc);
    ``fill_threads``: the loader's column-copying threads (default: its own choice,
    one below 4 cores); when more than one, ``torch-1t`` (the shuffled epoch with
    one) runs beside them."""
    import pyarrow.parquet as pq
    import torch

    import tabstream.loaders.batching as batching
    from tabstream import Dataset
    from tabstream.loaders.torch import Loader

    torch.set_num_threads(1)
    threads = batching._FILL_THREADS if fill_threads is None else fill_threads
    print(f"loader fill threads: {threads}", flush=True)

    def with_threads(n: int, fn: Callable[[], tuple[int, float]]) -> Callable[[], tuple[int, float]]:
        def run() -> tuple[int, float]:
            batching._FILL_THREADS = n
            try:
                return fn()
            finally:
                batching._FILL_THREADS = threads
        return run

    def raw() -> tuple[int, float]:
        rows = 0
        for path in _files(data):
            for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size):
                arrays = [col.to_numpy() for col in batch.columns]
                rows += len(arrays[0])
        return rows, 0.0

    def loader(shuffle: bool) -> tuple[int, float]:
        start = time.perf_counter()
        rows, first = 0, 0.0
        for _features, labels in Loader(Dataset(data), batch_size, shuffle=shuffle, seed=0):
            if not rows:
                first = time.perf_counter() - start
            rows += len(labels)
        return rows, first

    cases = {"raw": raw, "torch": with_threads(threads, lambda: loader(True)),
             "ordered": with_threads(threads, lambda: loader(False))}
    if threads > 1:
        cases["torch-1t"] = with_threads(1, lambda: loader(True))
    for fn in cases.values():  # warm-up: imports, page cache, allocator
        fn()
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    print(_load_note("before"), flush=True)
    for _ in range(repeats):
        for name, fn in cases.items():
            wall, cpu = time.perf_counter(), _cpu_s()
            rows, first = fn()
            runs[name].append((time.perf_counter() - wall, _cpu_s() - cpu, first))
    print(_load_note("after"), flush=True)
    wall = {name: median([r[0] for r in runs[name]]) for name in cases}
    for name in cases:
        print(f"  {name:<7} batch {batch_size}: wall {wall[name]:.3f} s (runs: "
              + ", ".join(f"{r[0]:.3f}" for r in runs[name])
              + f"), CPU {median([r[1] for r in runs[name]]):.3f} s"
              + (f", set-up + first batch {median([r[2] for r in runs[name]]):.3f} s"
                 if name != "raw" else ""), flush=True)
    print(f"  torch / raw rate: {wall['raw'] / wall['torch']:.2f}x (shuffled), "
          f"{wall['raw'] / wall['ordered']:.2f}x (shuffle=False)"
          + (f", {wall['raw'] / wall['torch-1t']:.2f}x (shuffled, one fill thread)"
             if "torch-1t" in wall else ""))


def run_case(case: str, data: str, batch_size: int, limit: int) -> dict:
    argv = [sys.executable, os.path.abspath(__file__), "--child", case, "--data-dir", data,
            "--batch-sizes", str(batch_size), "--handwritten-rows", str(limit)]
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    child = run_child(argv, env=env)
    if not child.ok:
        raise SystemExit(f"case {case} at batch {batch_size} failed:\n{child.output[-3000:]}")
    result = dict(child.result)
    result["rate"] = result["rows"] / result["seconds"]
    result["peak_rss_mb"] = result.get("vm_hwm_mb") or child.peak_rss_mb
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[8192, 65536])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cases", nargs="+", choices=CASES + MH_CASES, default=list(CASES))
    parser.add_argument("--multi-hot", action="store_true",
                        help="the multi-hot comparison with tf.data (see the module doc)")
    parser.add_argument("--shuffle-buffer", type=int, default=65536,
                        help="--multi-hot: tf.data's shuffle buffer (capped by --rows)")
    parser.add_argument("--rows-per-file", type=int, default=None,
                        help=f"default {ROWS_PER_FILE:,}; {MH_ROWS_PER_FILE:,} with --multi-hot")
    parser.add_argument("--row-group-size", type=int, default=None,
                        help=f"default {ROW_GROUP_SIZE:,}; {MH_ROW_GROUP_SIZE:,} with --multi-hot")
    parser.add_argument("--handwritten-rows", type=int, default=200_000,
                        help="rows the hand-written DataLoader reads (it holds them all)")
    parser.add_argument("--data-dir", help="default: bench_data/loader-<rows>")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--one-process", action="store_true",
                        help="raw and torch alternately in this process (see the module doc)")
    parser.add_argument("--fill-threads", type=int, default=None,
                        help="--one-process: the loader's column-copying threads (default: its own "
                             "choice, one below 4 cores); above one, the shuffled epoch with one "
                             "runs beside it (torch-1t)")
    parser.add_argument("--child", choices=CASES + MH_CASES, help=argparse.SUPPRESS)
    parser.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dictionary-ids", action="store_true",
                        help="write the id columns dictionary-encoded (exports before session 23) "
                             "instead of delta-packed as to_parquet does")
    args = parser.parse_args(argv)
    if args.rows_per_file is None:
        args.rows_per_file = MH_ROWS_PER_FILE if args.multi_hot else ROWS_PER_FILE
    if args.row_group_size is None:
        args.row_group_size = MH_ROW_GROUP_SIZE if args.multi_hot else ROW_GROUP_SIZE

    if args.multi_hot and args.generate:
        generate_multi_hot(args.data_dir, args.rows, args.rows_per_file, args.row_group_size)
        return
    if args.generate:
        generate(args.data_dir, args.rows, args.rows_per_file, args.row_group_size,
                 dictionary_ids=args.dictionary_ids)
        return
    if args.child:
        fn = globals()[f"case_{args.child}"]
        emit_result(fn(args.data_dir, args.batch_sizes[0], args.handwritten_rows))
        return
    if args.multi_hot:
        main_multi_hot(args)
        return

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # "-delta": the ids delta-packed as exports write them since session 23 (a folder
    # written before holds dictionaries)
    layout = "dictionary" if args.dictionary_ids else "delta"
    data = args.data_dir or os.path.join(root, "bench_data", f"loader-{args.rows}-{layout}")
    if not os.path.exists(data):
        # In a child process: a child's ru_maxrss starts from its parent's RSS at
        # fork time, so this process must stay small for the cases' peaks to be theirs.
        print(f"writing {args.rows:,} rows to {data} ...", flush=True)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--generate", "--rows",
                        str(args.rows), "--rows-per-file", str(args.rows_per_file),
                        "--row-group-size", str(args.row_group_size), "--data-dir", data,
                        *(["--dictionary-ids"] if args.dictionary_ids else [])],
                       check=True)
    print(machine_note())
    if args.one_process:
        print(f"data: {data} ({args.rows:,} rows); medians of {args.repeats} alternating runs "
              "in one process", flush=True)
        for batch_size in args.batch_sizes:
            main_one_process(data, batch_size, args.repeats, args.fill_threads)
        return
    print(f"data: {data} ({args.rows:,} rows); medians of {args.repeats} runs, each in a fresh "
          "process", flush=True)

    print(_load_note("before"), flush=True)
    medians: dict[tuple[str, int], dict[str, float]] = {}
    for batch_size in args.batch_sizes:
        runs = _round_robin(args.cases, args.repeats, lambda case, b=batch_size: run_case(
            case, data, b, args.handwritten_rows))
        for case in args.cases:
            medians[case, batch_size] = {k: median([r[k] for r in runs[case]])
                                         for k in ("rows", "rate", "first_batch_s", "peak_rss_mb",
                                                   "start_rss_mb", "cpu_s")}
            m = medians[case, batch_size]
            rates = ", ".join(f"{r['rate'] / 1e6:.3f}" for r in runs[case])
            print(f"  {case:<12} batch {batch_size:>6}: {m['rate'] / 1e6:6.3f} M rows/s "
                  f"(runs: {rates}), first batch "
                  f"{m['first_batch_s']:.3f} s, CPU {m['cpu_s']:.2f} s, peak RSS "
                  f"{m['peak_rss_mb']:.0f} MB ({m['start_rss_mb']:.0f} MB after imports)",
                  flush=True)
    print(_load_note("after"), flush=True)

    headers = ["case", "batch", "rows", "M rows/s", "vs raw", "vs handwritten", "first batch s",
               "CPU s", "peak RSS MB", "of which imports"]
    table = []
    for (case, batch_size), m in medians.items():
        raw = medians.get(("raw", batch_size))
        hand = medians.get(("handwritten", batch_size))
        table.append([
            case, batch_size, f"{int(m['rows']):,}", f"{m['rate'] / 1e6:.3f}",
            f"{m['rate'] / raw['rate']:.2f}x" if raw and case != "raw" else "",
            f"{m['rate'] / hand['rate']:.1f}x" if hand and case != "handwritten" else "",
            f"{m['first_batch_s']:.3f}", f"{m['cpu_s']:.2f}", f"{m['peak_rss_mb']:.0f}",
            f"{m['start_rss_mb']:.0f}",
        ])
    print()
    print(format_table(headers, table, markdown=args.markdown))


if __name__ == "__main__":
    main()

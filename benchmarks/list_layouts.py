"""Which parquet list type reads faster: plain lists with a schema shape, or
fixed-size lists (issue 34 item 4: the advice in docs/multi-hot.md, measured).

The same ids are written four ways, the same row groups each:

    nested plain   list<list<int64>>                       + shape [None, S, L]
    nested fixed   fixed_size_list<fixed_size_list<int64, L>, S>
    flat plain     list<int64>                             + shape [None, S * L]
    flat fixed     fixed_size_list<int64, S * L>

and each is read, alternating, in one process (``--repeats`` rounds, medians):

    pyarrow        ``ParquetFile.read_row_group`` per group, the values buffer to
                   numpy (``flatten``), what any reader pays to decode the column
    loader         ``tabstream.loaders.torch.Loader`` (no shuffle, batch
                   ``--batch``), dense ``(B, S, L)`` or ``(B, S * L)`` blocks

Ids come from ``generate_data("multi-hot", slots=S, nnz=L, vocabulary=8192)``
(power-law ids, so dictionary-encoded pages, as real multi-hot data gives).

    python benchmarks/list_layouts.py                          # 65,536 rows, 100 x 10
    python benchmarks/list_layouts.py --rows 32768 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import machine_note  # noqa: E402

LAYOUTS = ("nested plain", "nested fixed", "flat plain", "flat fixed")


def _write(root: str, rows: int, slots: int, nnz: int, row_group: int) -> dict[str, str]:
    """The four layouts' folders (one file each, ``row_group``-row groups)."""
    from tabstream.core.schema import ColumnSchema, Schema, Tags
    from tabstream.datasets import generate_data

    table = generate_data("multi-hot", rows, slots=slots, nnz=nnz, vocabulary=8192)
    if not isinstance(table, pa.Table):
        table = pa.Table.from_pandas(table, preserve_index=False)
    values = table.column("multi_hot").combine_chunks().flatten().flatten()
    label = table.column("label")
    width = slots * nnz
    types = {
        "nested plain": pa.list_(pa.list_(pa.int64())),
        "nested fixed": pa.list_(pa.list_(pa.int64(), nnz), slots),
        "flat plain": pa.list_(pa.int64()),
        "flat fixed": pa.list_(pa.int64(), width),
    }
    inner = pa.FixedSizeListArray.from_arrays(values, nnz)
    nested = pa.FixedSizeListArray.from_arrays(inner, slots)
    flat = pa.FixedSizeListArray.from_arrays(values, width)
    folders = {}
    for name, type_ in types.items():
        column = (nested if name.startswith("nested") else flat).cast(type_)
        folder = os.path.join(root, name.replace(" ", "_"))
        os.makedirs(folder)
        pq.write_table(pa.table({"label": label, "ids": column}), os.path.join(folder, "part.parquet"),
                       row_group_size=row_group)
        shape = [None, slots, nnz] if name.startswith("nested") else [None, width]
        Schema([ColumnSchema("label", "int64", tags=[Tags.TARGET]),
                ColumnSchema("ids", "int64", tags=[Tags.CATEGORICAL], is_list=True,
                             is_ragged=False, properties={"shape": shape})]
               ).to_json(os.path.join(folder, "_schema.json"))
        with open(os.path.join(folder, "_manifest.json"), "w") as f:
            json.dump({"num_rows": rows, "files": [{"path": "part.parquet", "num_rows": rows}]}, f)
        folders[name] = folder
    return folders


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def read_pyarrow(folder: str) -> int:
    f = pq.ParquetFile(os.path.join(folder, "part.parquet"))
    rows = 0
    for g in range(f.num_row_groups):
        col = f.read_row_group(g, columns=["ids"]).column("ids").combine_chunks()
        flat = col.flatten()
        while pa.types.is_list(flat.type) or pa.types.is_fixed_size_list(flat.type):
            flat = flat.flatten()
        flat.to_numpy()
        rows += len(col)
    return rows


def read_loader(folder: str, batch: int) -> int:
    from tabstream.loaders.torch import Loader

    rows = 0
    for _features, labels in Loader(folder, batch, shuffle=False, labels=["label"]):
        rows += int(labels.shape[0])
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=65_536)
    parser.add_argument("--slots", type=int, default=100)
    parser.add_argument("--nnz", type=int, default=10)
    parser.add_argument("--row-group-size", type=int, default=16_384)
    parser.add_argument("--batch", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    root = tempfile.mkdtemp(prefix="tabstream-list-layouts-")
    try:
        folders = _write(root, args.rows, args.slots, args.nnz, args.row_group_size)
        print(f"{args.rows:,} rows of {args.slots} x {args.nnz} int64 ids, row groups of "
              f"{args.row_group_size:,}; {machine_note()}")
        readers = {"pyarrow": read_pyarrow,
                   "loader": lambda folder: read_loader(folder, args.batch)}
        times: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for name in LAYOUTS:  # warm-up: page cache, imports
            for reader in readers.values():
                reader(folders[name])
        for _ in range(args.repeats):
            for name in LAYOUTS:
                for how, reader in readers.items():
                    wall, cpu = time.perf_counter(), _cpu()
                    got = reader(folders[name])
                    assert got == args.rows, (name, how, got)
                    times.setdefault((name, how), []).append(
                        (time.perf_counter() - wall, _cpu() - cpu))
            print(f"  round done, load {os.getloadavg()[0]:.1f}", flush=True)
        print(f"\nmedians of {args.repeats} alternating rounds (rows/s; CPU s):")
        for how in readers:
            for name in LAYOUTS:
                wall = statistics.median(w for w, _ in times[(name, how)])
                cpu = statistics.median(c for _, c in times[(name, how)])
                print(f"  {how:8s} {name:13s} {args.rows / wall:>12,.0f} rows/s  CPU {cpu:.3f} s")
            for kind in ("nested", "flat"):
                plain = statistics.median(w for w, _ in times[(f"{kind} plain", how)])
                fixed = statistics.median(w for w, _ in times[(f"{kind} fixed", how)])
                print(f"  {how:8s} {kind}: plain reads at {fixed / plain:.2f}x the fixed-size "
                      "list's rate")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

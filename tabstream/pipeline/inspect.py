"""Dataset report: row counts, null rates, distinct values, cardinalities."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from dask import delayed

from tabstream.ops.categorify import merge_counts, value_counts
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.execution import compute

__all__ = ["inspect_dataset"]


def _piece_stats(ds: Dataset, piece: Any) -> dict[str, Any]:
    table = ds.read_piece(piece)
    out: dict[str, Any] = {"rows": table.num_rows, "nulls": {}, "uniques": {}}
    for name in table.column_names:
        col = table.column(name)
        out["nulls"][name] = col.null_count
        if pa.types.is_floating(col.type):
            out["nulls"][name] += int(pc.sum(pc.is_nan(col)).as_py() or 0)
        out["uniques"][name] = value_counts(col).select(["values", "counts"])
    return out


def _merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    names = list(parts[0]["nulls"])
    return {
        "rows": sum(p["rows"] for p in parts),
        "nulls": {n: sum(p["nulls"][n] for p in parts) for n in names},
        "uniques": {n: merge_counts([p["uniques"][n] for p in parts]) for n in names},
    }


def inspect_dataset(ds: Dataset, progress: bool | None = None) -> dict[str, Any]:
    """One pass over ``ds``: rows, and per column dtype, tags, null rate, number of
    distinct non-null values, and the schema's cardinality when it has one."""
    from tabstream.pipeline.execution import tree_reduce

    parts = [delayed(_piece_stats, pure=False)(ds, p) for p in ds.pieces]
    (stats,) = compute([tree_reduce(parts, _merge)], desc="inspect", progress=progress)
    rows = stats["rows"]
    columns = []
    for col in ds.schema:
        columns.append({
            "name": col.name,
            "dtype": col.dtype + ("[]" if col.is_list else ""),
            "tags": sorted(t.value for t in col.tags),
            "null_rate": stats["nulls"][col.name] / rows if rows else 0.0,
            "distinct": stats["uniques"][col.name].num_rows,
            "cardinality": col.cardinality,
        })
    return {"num_rows": rows, "num_files": len(ds.files) or 1, "npartitions": ds.npartitions,
            "columns": columns}

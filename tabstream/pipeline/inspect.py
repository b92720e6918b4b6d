"""Dataset report: one pass, bounded memory, per-column statistics.

For every column: type, tags, null rate (null and NaN), distinct count; for
numbers min/max/mean/std and quantiles; for non-float columns the most frequent
values; for lists the length of the lists (the value statistics are over their
elements). Every statistic is a small mergeable summary computed per partition
with pyarrow/numpy and combined in a tree, so memory does not grow with the data:

- distinct: exact while the merged value counts stay under ``exact_limit``
  values, else a HyperLogLog estimate (2**14 one-byte registers, about 0.8 %
  standard error) over the project's MurmurHash3, the same hash the ops use;
- top values: the value counts, cut to the ``exact_limit`` most frequent ones
  at every merge; counts are exact when nothing was cut (``top_exact``);
- quantiles: a weighted sorted sample of at most 2,048 points per column (exact
  below that many values; above, each merge moves a quantile by at most
  1/2,048 of the rows);
- mean/std: Chan's pairwise update of (count, mean, M2), stable on any size;
- min/max: exact, of integer columns in their own type (an int64 id above 2**53
  is not rounded through float64).

>>> import pandas as pd, tabstream as ts
>>> report = inspect_dataset(ts.Dataset(pd.DataFrame({"x": [1.0, 2.0, None, 4.0],
...                                                   "c": ["a", "b", "a", None]})))
>>> x, c = report["columns"]
>>> x["null_rate"], x["min"], x["max"], x["quantiles"]["0.5"]
(0.25, 1.0, 4.0, 2.0)
>>> c["distinct"], c["top"][0]
(2, {'value': 'a', 'count': 2})
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from dask import delayed

from tabstream.core.hashing import murmur3_32, normalize_missing
from tabstream.ops.categorify import merge_counts, value_counts
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.execution import compute, tree_reduce

__all__ = ["HyperLogLog", "QuantileSummary", "inspect_dataset", "write_plots"]

QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
_HLL_BITS = 14
_QUANTILE_POINTS = 2048
_INDEX_SEED, _RANK_SEED = 0x5EED1, 0x5EED2


class HyperLogLog:
    """Distinct-count sketch: ``2**bits`` one-byte registers, merged by maximum.

    A value's register comes from one MurmurHash3 of it and its rank (leading
    zeros + 1) from a second one with another seed, so the sketch sees 32 + ``bits``
    hash bits and needs no large-range correction below billions of values.

    >>> import pyarrow as pa
    >>> h = HyperLogLog()
    >>> h.add(pa.array(["a", "b", "a", None]))
    >>> round(h.estimate())
    2
    """

    def __init__(self, bits: int = _HLL_BITS) -> None:
        self.bits = bits
        self.registers = np.zeros(1 << bits, dtype=np.uint8)

    def add(self, values: pa.Array | pa.ChunkedArray) -> None:
        """Add the non-null values of a flat column (nulls are skipped)."""
        values = values.filter(pc.is_valid(values)) if values.null_count else values
        if len(values) == 0:
            return
        if pa.types.is_decimal(values.type):  # the hash takes no decimals: hash their text
            values = values.cast(pa.string())
        index = murmur3_32(values, seed=_INDEX_SEED) >> np.uint32(32 - self.bits)
        word = murmur3_32(values, seed=_RANK_SEED)
        # rank = leading zeros of the 32-bit word + 1 (33 when it is 0)
        rank = np.where(word == 0, 33, 32 - np.floor(np.log2(np.maximum(word, 1))).astype(np.int64))
        np.maximum.at(self.registers, index, rank.astype(np.uint8))

    def merge(self, other: HyperLogLog) -> HyperLogLog:
        out = HyperLogLog(self.bits)
        np.maximum(self.registers, other.registers, out=out.registers)
        return out

    def estimate(self) -> float:
        m = float(len(self.registers))
        alpha = 0.7213 / (1 + 1.079 / m)
        raw = alpha * m * m / float(np.sum(np.ldexp(1.0, -self.registers.astype(np.int64))))
        zeros = int(np.count_nonzero(self.registers == 0))
        if raw <= 2.5 * m and zeros:  # small range: linear counting is more exact
            return m * math.log(m / zeros)
        return raw


@dataclass
class QuantileSummary:
    """Sorted ``points`` with ``weights`` (rows each stands for), at most ``size``.

    >>> import numpy as np
    >>> s = QuantileSummary.of(np.array([3.0, 1.0, 2.0]))
    >>> s.quantile(0.5), s.merge(QuantileSummary.of(np.array([10.0]))).quantile(1.0)
    (2.0, 10.0)
    """

    points: np.ndarray
    weights: np.ndarray
    size: int = _QUANTILE_POINTS

    @classmethod
    def of(cls, values: np.ndarray, size: int = _QUANTILE_POINTS) -> QuantileSummary:
        values = np.sort(values.astype(np.float64))
        return cls(values, np.ones(len(values)), size)._compress()

    def _compress(self) -> QuantileSummary:
        if len(self.points) <= self.size:
            return self
        cum = np.cumsum(self.weights)
        total = cum[-1]
        # one point per 1/size of the weight, at the middle of its share
        targets = (np.arange(self.size) + 0.5) * (total / self.size)
        picks = np.minimum(np.searchsorted(cum, targets, side="left"), len(cum) - 1)
        return QuantileSummary(self.points[picks], np.full(self.size, total / self.size), self.size)

    def merge(self, other: QuantileSummary) -> QuantileSummary:
        points = np.concatenate([self.points, other.points])
        weights = np.concatenate([self.weights, other.weights])
        order = np.argsort(points, kind="stable")
        return QuantileSummary(points[order], weights[order], self.size)._compress()

    def quantile(self, q: float) -> float | None:
        """The smallest point whose cumulative weight reaches ``q`` of the total
        (numpy's ``inverted_cdf`` method when the summary is exact)."""
        if not len(self.points):
            return None
        cum = np.cumsum(self.weights)
        i = int(np.searchsorted(cum, q * cum[-1] * (1 - 1e-12), side="left"))
        return float(self.points[min(i, len(self.points) - 1)])


@dataclass
class _Moments:
    """Count, mean and M2 over float64; ``min``/``max`` as given (Python ints for
    integer columns, exact), merged by comparison."""

    count: int = 0
    mean: float = 0.0
    m2: float = 0.0
    min: float | int = math.inf
    max: float | int = -math.inf

    @classmethod
    def of(cls, values: np.ndarray) -> _Moments:
        if not len(values):
            return cls()
        values = values.astype(np.float64)
        mean = float(values.mean())
        return cls(len(values), mean, float(np.sum((values - mean) ** 2)),
                   float(values.min()), float(values.max()))

    def merge(self, other: _Moments) -> _Moments:
        n = self.count + other.count
        if not n:
            return _Moments()
        delta = other.mean - self.mean
        return _Moments(n, self.mean + delta * other.count / n,
                        self.m2 + other.m2 + delta * delta * self.count * other.count / n,
                        min(self.min, other.min), max(self.max, other.max))


@dataclass
class _Column:
    rows: int
    nulls: int
    hll: HyperLogLog
    counts: pa.Table  # (values, counts), cut to the most frequent
    cut: bool  # counts lost values: distinct and top counts are estimates
    moments: _Moments | None = None
    quantiles: QuantileSummary | None = None
    lengths: _Moments | None = None
    infinite: int = 0  # ±inf values, left out of the moments and quantiles


def _is_numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _cut(counts: pa.Table, limit: int) -> tuple[pa.Table, bool]:
    if counts.num_rows <= limit:
        return counts, False
    order = pc.sort_indices(counts, [("counts", "descending"), ("values", "ascending")])
    return counts.take(order[:limit]), True


def _column_stats(col: pa.ChunkedArray, limit: int) -> _Column:
    if pa.types.is_dictionary(col.type):
        col = col.cast(col.type.value_type)
    rows = len(col)
    lengths = None
    values = col
    if pa.types.is_list(col.type) or pa.types.is_large_list(col.type) \
            or pa.types.is_fixed_size_list(col.type):
        lengths = _Moments.of(pc.drop_null(pc.list_value_length(col)).to_numpy(zero_copy_only=False))
        values = pc.list_flatten(col)
    missing = normalize_missing(col)
    nulls = missing.null_count
    values = normalize_missing(values)
    hll = HyperLogLog()
    hll.add(values)
    counts, cut = _cut(value_counts(values), limit)
    out = _Column(rows, nulls, hll, counts, cut, lengths=lengths)
    if _is_numeric(values.type):
        numbers = pc.drop_null(values).to_numpy(zero_copy_only=False).astype(np.float64)
        finite = np.isfinite(numbers)
        if not finite.all():  # ±inf (NaN is null here): counted, kept out of the statistics
            out.infinite = int(len(numbers) - finite.sum())
            numbers = numbers[finite]
        out.moments = _Moments.of(numbers)
        out.quantiles = QuantileSummary.of(numbers)
        if pa.types.is_integer(values.type) and out.moments.count:
            ends = pc.min_max(values)  # exact: float64 rounds integers above 2**53
            out.moments.min, out.moments.max = ends["min"].as_py(), ends["max"].as_py()
    return out


def _merge_columns(parts: list[_Column], limit: int) -> _Column:
    first = parts[0]
    hll = first.hll
    moments, quantiles, lengths = first.moments, first.quantiles, first.lengths
    for p in parts[1:]:
        hll = hll.merge(p.hll)
        if moments is not None and p.moments is not None:
            moments = moments.merge(p.moments)
        if quantiles is not None and p.quantiles is not None:
            quantiles = quantiles.merge(p.quantiles)
        if lengths is not None and p.lengths is not None:
            lengths = lengths.merge(p.lengths)
    counts, cut = _cut(merge_counts([p.counts for p in parts]), limit)
    return _Column(sum(p.rows for p in parts), sum(p.nulls for p in parts), hll, counts,
                   cut or any(p.cut for p in parts), moments, quantiles, lengths,
                   sum(p.infinite for p in parts))


def _piece_stats(ds: Dataset, piece: Any, limit: int) -> dict[str, _Column]:
    table = ds.read_piece(piece)
    return {name: _column_stats(table.column(name), limit) for name in table.column_names}


def _merge(parts: list[dict[str, _Column]], limit: int) -> dict[str, _Column]:
    return {name: _merge_columns([p[name] for p in parts], limit) for name in parts[0]}


def _plain(value: Any) -> Any:
    """A JSON-friendly scalar."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)  # decimals, durations: their exact text


def _column_report(col: Any, stats: _Column, top: int) -> dict[str, Any]:
    exact = not stats.cut
    distinct = stats.counts.num_rows if exact else round(stats.hll.estimate())
    out: dict[str, Any] = {
        "name": col.name,
        "dtype": col.dtype + ("[]" if col.is_list else ""),
        "tags": sorted(t.value for t in col.tags),
        "null_rate": stats.nulls / stats.rows if stats.rows else 0.0,
        "nulls": stats.nulls,
        "distinct": distinct,
        "distinct_exact": exact,
        "cardinality": col.cardinality,
    }
    if stats.lengths is not None:
        m = stats.lengths
        out["list_length"] = {"min": int(m.min) if m.count else None,
                              "max": int(m.max) if m.count else None,
                              "mean": m.mean if m.count else None}
    if stats.moments is not None:
        m = stats.moments
        out.update({"min": _plain(m.min) if m.count else None,
                    "max": _plain(m.max) if m.count else None,
                    "mean": m.mean if m.count else None,
                    "std": math.sqrt(m.m2 / (m.count - 1)) if m.count > 1 else None,
                    "infinite": stats.infinite})
        assert stats.quantiles is not None
        out["quantiles"] = {str(q): stats.quantiles.quantile(q) for q in QUANTILES}
        if m.count:  # the ends are known exactly
            out["quantiles"].update({"0.0": out["min"], "1.0": out["max"]})
    is_float = col.dtype.startswith("float") and "categorical" not in out["tags"]
    if not is_float:
        counts = stats.counts
        order = pc.sort_indices(counts, [("counts", "descending"), ("values", "ascending")])
        best = counts.take(order[:top])
        out["top"] = [{"value": _plain(v), "count": c}
                      for v, c in zip(best["values"].to_pylist(), best["counts"].to_pylist())]
        out["top_exact"] = exact
    return out


def inspect_dataset(ds: Dataset, progress: bool | None = None, top: int = 10,
                    exact_limit: int = 10_000, histograms: bool = False) -> dict[str, Any]:
    """One pass over ``ds``: rows and files, and one entry per column (see the
    module docstring). ``histograms=True`` adds, per numeric column, ``_summary``:
    the :class:`QuantileSummary` (for plots; not JSON)."""
    if not isinstance(top, int) or isinstance(top, bool) or top < 1:
        raise ValueError(f"top must be a positive int, got {top!r}")
    if not isinstance(exact_limit, int) or isinstance(exact_limit, bool) or exact_limit < top:
        raise ValueError(f"exact_limit must be an int >= top ({top}), got {exact_limit!r}")
    parts = [delayed(_piece_stats, pure=False)(ds, p, exact_limit) for p in ds.pieces]
    (stats,) = compute([tree_reduce(parts, lambda ps: _merge(ps, exact_limit))],
                       desc="inspect", progress=progress)
    rows = next(iter(stats.values())).rows if stats else 0
    columns = []
    for col in ds.schema:
        entry = _column_report(col, stats[col.name], top)
        if histograms and stats[col.name].quantiles is not None:
            entry["_summary"] = stats[col.name].quantiles
        columns.append(entry)
    return {"num_rows": rows, "num_files": len(ds.files) or 1, "npartitions": ds.npartitions,
            "columns": columns}


# -- pictures -------------------------------------------------------------------
def import_pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ImportError("plots need matplotlib: pip install 'tabstream[plots]'") from exc
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def _safe_name(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)


def chart_kind(entry: dict[str, Any]) -> str:
    """``"histogram"`` for numbers, ``"top"`` (a bar chart of the top values) for
    categorical ids and other values, ``"empty"`` for a column with no values."""
    summary = entry.get("_summary")
    if "categorical" in entry["tags"] and entry.get("top"):
        return "top"  # ids: which ones are frequent matters, not their numeric spread
    if summary is not None and len(summary.points):
        return "histogram"
    return "top" if entry.get("top") else "empty"


def _draw_column(ax: Any, entry: dict[str, Any]) -> None:
    summary = entry.get("_summary")
    kind = chart_kind(entry)
    if kind == "histogram":
        points = summary.points
        lo, hi, p95 = points[0], points[-1], summary.quantile(0.95) or 0.0
        skewed = lo >= 0 and hi > 100 * max(p95, 1.0)  # long tail: log-spaced bins
        bins = np.concatenate([[0.0], np.geomspace(1.0, hi + 1, 40)]) if skewed else 40
        ax.hist(points, bins=bins, weights=summary.weights, color="#4878a8")
        if skewed:
            ax.set_xscale("symlog", linthresh=1.0)
        ax.set_ylabel("rows")
        ax.set_xlabel("value" if "list_length" not in entry else "element value")
    elif kind == "top":
        labels = [str(t["value"])[:24] for t in entry["top"]][::-1]
        ax.barh(labels, [t["count"] for t in entry["top"]][::-1], color="#d08040")
        ax.set_xlabel("rows" if "list_length" not in entry else "elements")
        ax.tick_params(axis="y", labelsize=7)
    else:
        ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
    distinct = f"{entry['distinct']:,}" + ("" if entry["distinct_exact"] else " (approx.)")
    ax.set_title(f"{entry['name']} ({entry['dtype']}): {100 * entry['null_rate']:.1f}% null, "
                 f"{distinct} distinct", fontsize=8)


def write_plots(report: dict[str, Any], folder: str) -> list[str]:
    """PNG pictures of a report made with ``histograms=True``: one per column
    (``COLUMN.png``: a histogram of numbers, a bar chart of the top values of
    categorical ids and other columns, see :func:`chart_kind`) and ``overview.png`` (null rate and distinct count of every
    column, then every column's small picture). Returns the paths written."""
    import os

    plt = import_pyplot()
    os.makedirs(folder, exist_ok=True)
    written = []
    columns = report["columns"]
    used: set[str] = {"overview"}
    for entry in columns:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        _draw_column(ax, entry)
        fig.tight_layout()
        stem = base = _safe_name(entry["name"])
        k = 1
        while stem.lower() in used:  # names that differ only in odd characters or case
            stem, k = f"{base}_{k}", k + 1
        used.add(stem.lower())
        path = os.path.join(folder, f"{stem}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)

    ncols = 4
    nrows = 1 + math.ceil(len(columns) / ncols)
    fig = plt.figure(figsize=(4 * ncols, 2.6 * nrows))
    grid = fig.add_gridspec(nrows, ncols)
    names = [c["name"] for c in columns]
    ax = fig.add_subplot(grid[0, : ncols // 2])
    ax.bar(names, [100 * c["null_rate"] for c in columns], color="#a05050")
    ax.set_ylabel("null %")
    ax.set_title(f"{report['num_rows']:,} rows, {len(columns)} columns: null rate", fontsize=9)
    ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    ax = fig.add_subplot(grid[0, ncols // 2:])
    ax.bar(names, [max(1, c["distinct"]) for c in columns], color="#5080a0")
    ax.set_yscale("log")
    ax.set_title("distinct values (log scale)", fontsize=9)
    ax.tick_params(axis="x", labelrotation=90, labelsize=6)
    for i, entry in enumerate(columns):
        _draw_column(fig.add_subplot(grid[1 + i // ncols, i % ncols]), entry)
    fig.tight_layout()
    path = os.path.join(folder, "overview.png")
    fig.savefig(path, dpi=80)
    plt.close(fig)
    written.append(path)
    return written

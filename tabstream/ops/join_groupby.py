"""JoinGroupby: statistics of continuous columns per category, joined back to the rows.

    ["user", "price"] >> JoinGroupby(cont_cols=["price"], stats=["count", "mean"])

The continuous columns must be part of the op's selection; the op outputs only the
columns it creates. Null and NaN are one category, ``-0.0`` is ``0.0``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import sort_indices
from tabstream.core.operators import StatOperator, drop_lookup_indexes, lookup_indexes
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.keys import (
    check_distinct_keys,
    check_groups,
    check_scalar_categories,
    dependencies_of,
    group_codes,
    key_column,
    lookup,
    names_and_nodes,
    require_selected,
    resolve_groups,
    with_columns,
)
from tabstream.ops.numeric import check_numeric, plain
from tabstream.ops.nvt_params import check_nvt_knobs, write_stats_files

__all__ = ["JoinGroupby"]


# -- JoinGroupby --------------------------------------------------------------------------
_STATS = ("count", "sum", "mean", "std", "var", "min", "max")


class JoinGroupby(StatOperator):
    """Statistics of continuous columns per category, joined back to each row.

    Select the categories and ``cont_cols``: ``["user", "price"] >> JoinGroupby(
    cont_cols=["price"], stats=["count", "mean"])`` outputs ``user_count`` (rows of
    the category, int64) and ``user_price_mean`` (float32); in general
    ``<group><sep><cont><sep><stat>`` (``out_dtype``, float32 by default) for ``stats``
    among sum, mean, std, var (sample, ddof=1), min, max, as ``pandas``
    ``groupby(dropna=False)`` computes them after mapping NaN keys to null and
    ``-0.0`` keys to ``0.0``: null and NaN keys are one category, nulls and NaN of a
    continuous column are skipped, ±inf counts as a value. A category unseen at fit
    gets null in every output (``FillMissing``
    after the op turns that into 0 or any value); so do mean/min/max of a category
    without values and std/var of one with fewer than two. The fitted statistics
    (one row per category, float64) are saved as parquet. Counts, min and max are
    identical for any partitioning; float64 sums and moments can differ in the last
    bits (addition order), far below float32 resolution.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"groups": list[str]}
    state_tables = {"stats.{groups}": {}}

    def __init__(self, cont_cols: list[str] | Any = None, stats: Sequence[str] = ("count",),
                 cat_groups: list[str | list[str]] | None = None, name_sep: str = "_",
                 out_dtype: str = "float32", out_path: str | None = None,
                 split_out: int | dict[str, int] | None = None,
                 tree_width: int | dict[str, int] | None = None, on_host: bool = True,
                 cat_cache: Any = "host") -> None:
        super().__init__()
        op = "JoinGroupby"
        cont, self._cont_nodes = ([], []) if cont_cols is None else names_and_nodes(cont_cols, "cont_cols", op)
        check_nvt_knobs(op, out_path=out_path, split_out=split_out, tree_width=tree_width)
        stats_list = [stats] if isinstance(stats, str) else list(stats)
        bad = [s for s in stats_list if s not in _STATS]
        if bad or not stats_list:
            raise ValueError(f"{op}: unknown stats {bad or stats_list!r}; choose from {list(_STATS)}")
        if not cont and any(s != "count" for s in stats_list):
            raise ValueError(f"{op}: stats {[s for s in stats_list if s != 'count']} need cont_cols")
        if not isinstance(name_sep, str):
            raise TypeError(f"{op}: name_sep must be a string, got {name_sep!r}")
        if out_dtype not in ("float32", "float64"):
            raise ValueError(f"{op}: out_dtype must be 'float32' or 'float64', got {out_dtype!r}")
        self.cont_cols = cont
        self.stats = stats_list
        self.cat_groups = check_groups(cat_groups, op)
        self.name_sep = name_sep
        self.out_dtype = out_dtype
        self.out_path = out_path
        self.split_out = split_out
        self.tree_width = tree_width
        self.on_host = bool(on_host)
        self.cat_cache = cat_cache
        self.tables: dict[str, pa.Table] = {}
        self.stats_files: dict[str, str] = {}  # out_path files by name, written at fit

    def set_column_groups(self, groups: list) -> None:
        """Called by the graph when the selection has nested lists (NVTabular's
        ``["a", "b", ["a", "b"]] >> JoinGroupby(...)``): they are the groups to encode,
        unless ``cat_groups`` was given."""
        if self.cat_groups is None and any(isinstance(g, list) for g in groups):
            self.cat_groups = check_groups(groups, "JoinGroupby")

    def dependencies(self) -> list[Any]:
        return dependencies_of(self.cont_cols, self._cont_nodes)

    def _outputs(self, group: str) -> list[tuple[str, str | None, str]]:
        """(output name, continuous column, stat) of one group."""
        out: list[tuple[str, str | None, str]] = []
        if "count" in self.stats:
            out.append((f"{group}{self.name_sep}count", None, "count"))
        sep = self.name_sep
        out += [(f"{group}{sep}{c}{sep}{s}", c, s) for c in self.cont_cols for s in self.stats if s != "count"]
        return out

    def _groups_of(self, names: Sequence[str]) -> list[list[str]]:
        return resolve_groups(self, names, self.cont_cols)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        names = input_schema.column_names
        require_selected(self.cont_cols, names, "JoinGroupby", "cont_cols")
        for c in self.cont_cols:
            check_numeric(self, input_schema[c])
        groups = self._groups_of(names)
        check_scalar_categories(self, input_schema, groups)
        return Schema(ColumnSchema(name, "int64" if stat == "count" else self.out_dtype,
                                   frozenset({Tags.CONTINUOUS}))
                      for g in groups for name, _, stat in self._outputs(self.name_sep.join(g)))

    def fit_partition(self, table: pa.Table) -> dict[str, pa.Table]:
        kernels = backend()
        # normalize_missing makes NaN null (left out of every statistic) and folds
        # -0.0 into 0.0, so min/max never depend on which zero came first
        xs = {c: kernels.normalize_missing(plain(table.column(c)).cast(pa.float64(), safe=False)) for c in self.cont_cols}
        out = {}
        for g in self._groups_of(table.column_names):
            key_names = [f"__key{i}__" for i in range(len(g))]
            work = {k: key_column(table.column(c)) for k, c in zip(key_names, g)}
            aggregations = [(key_names[0], "size", "__rows")]
            for j, (c, x) in enumerate(xs.items()):
                work[f"__x{j}__"] = x
                aggregations += [(f"__x{j}__", agg, f"__{stat}__{c}") for agg, stat in
                                 (("count", "n"), ("sum", "sum"), ("var", "m2"), ("min", "min"), ("max", "max"))]
            grouped = kernels.groupby_aggregate(pa.table(work), key_names, aggregations)
            # per-group statistics from here on (small): the partial layout _merge reads
            cols: dict[str, Any] = {"__rows": grouped.column("__rows").cast(pa.int64())}
            for c in self.cont_cols:
                n = grouped.column(f"__n__{c}").cast(pa.int64())
                # m2 = var * (n - 1); a group with fewer than two values has m2 0
                m2 = pc.fill_null(pc.multiply(grouped.column(f"__m2__{c}"), pc.subtract(n, 1).cast(pa.float64())), 0.0)
                cols.update({f"__n__{c}": n, f"__sum__{c}": grouped.column(f"__sum__{c}").cast(pa.float64()),
                             f"__m2__{c}": m2,
                             f"__min__{c}": pc.fill_null(grouped.column(f"__min__{c}"), math.nan),
                             f"__max__{c}": pc.fill_null(grouped.column(f"__max__{c}"), math.nan)})
            out[self.name_sep.join(g)] = pa.table({**{c: grouped.column(k) for c, k in zip(g, key_names)}, **cols})
        return out

    def combine(self, partials: Sequence[dict[str, pa.Table]]) -> dict[str, pa.Table]:
        return {name: self._merge([p[name] for p in partials], len(first.column_names)
                                  - 1 - 5 * len(self.cont_cols))
                for name, first in partials[0].items()}

    def _merge(self, tables: list[pa.Table], n_keys: int) -> pa.Table:
        merged = pa.concat_tables(tables, promote_options="permissive")
        uniq, codes = group_codes(merged.select(merged.column_names[:n_keys]))
        size = uniq.num_rows

        def col(name: str) -> np.ndarray:
            return np.asarray(merged.column(name).to_numpy(), dtype=np.float64)

        cols: dict[str, np.ndarray] = {"__rows": np.bincount(codes, col("__rows"), size).astype(np.int64)}
        for c in self.cont_cols:
            n_i, s_i = col(f"__n__{c}"), col(f"__sum__{c}")
            n, s = np.bincount(codes, n_i, size), np.bincount(codes, s_i, size)
            with np.errstate(divide="ignore", invalid="ignore"):
                # total M2 = sum of partial M2 + sum of n_i * (mean_i - mean)^2
                spread = np.where(n_i > 0, n_i * (s_i / n_i - (s / n)[codes]) ** 2, 0.0)
            m2 = np.bincount(codes, col(f"__m2__{c}") + spread, size)
            lo, hi = np.full(size, np.nan), np.full(size, np.nan)
            np.fmin.at(lo, codes, col(f"__min__{c}"))
            np.fmax.at(hi, codes, col(f"__max__{c}"))
            cols.update({f"__n__{c}": n.astype(np.int64), f"__sum__{c}": s, f"__m2__{c}": m2,
                         f"__min__{c}": lo, f"__max__{c}": hi})
        return with_columns(uniq, cols)

    def finalize(self, partial: dict[str, pa.Table]) -> None:
        tables = {}
        for name, t in partial.items():
            n_keys = t.num_columns - 1 - 5 * len(self.cont_cols)
            keys = t.column_names[:n_keys]
            t = t.take(sort_indices(t, [(k, "ascending") for k in keys]))
            cols = {}
            for out, c, stat in self._outputs(name):
                if stat == "count":
                    cols[out] = t.column("__rows").combine_chunks()
                    continue
                n = np.asarray(t.column(f"__n__{c}").to_numpy(), dtype=np.float64)
                s = np.asarray(t.column(f"__sum__{c}").to_numpy(), dtype=np.float64)
                with np.errstate(divide="ignore", invalid="ignore"):
                    var = t.column(f"__m2__{c}").to_numpy() / (n - 1)
                    values, valid = {
                        "sum": (s, n >= 0), "mean": (s / n, n > 0), "var": (var, n > 1),
                        "std": (np.sqrt(var), n > 1),
                        "min": (t.column(f"__min__{c}").to_numpy(), n > 0),
                        "max": (t.column(f"__max__{c}").to_numpy(), n > 0),
                    }[stat]
                cols[out] = pa.array(np.where(valid, values, 0.0), mask=~valid)
            tables[name] = with_columns(t.select(keys), cols)
        self.tables = tables
        drop_lookup_indexes(self)  # those of the statistics replaced
        self.fitted = True
        self.stats_files = write_stats_files("JoinGroupby", self.out_path, {
            f"join_groupby.{name}": t for name, t in self.tables.items()})

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        data = {}
        for g in self._groups_of(table.column_names):
            name = self.name_sep.join(g)
            stats = self.tables[name]
            idx = lookup(stats.select(g), table.select(g), "JoinGroupby",
                         indexes=lookup_indexes(self, name), source=stats)
            taken = backend().take(stats, pa.array(idx, mask=idx < 0))
            for out, _, stat in self._outputs(name):
                column = taken.column(out)
                data[out] = column if stat == "count" else column.cast(self.out_dtype)
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"groups": list(self.tables)}, {f"stats.{k}": v for k, v in self.tables.items()}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        for k in values["groups"]:
            table, outputs = tables[f"stats.{k}"], {out for out, _, _ in self._outputs(k)}
            check_distinct_keys(table, [c for c in table.column_names if c not in outputs], f"stats table 'stats.{k}'")
        self.tables = {k: tables[f"stats.{k}"] for k in values["groups"]}
        drop_lookup_indexes(self)
        self.fitted = True

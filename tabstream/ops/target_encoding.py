"""TargetEncoding: the mean target per category, k-fold out-of-fold on the fit data.

    te = ["user", "item", "label"] >> TargetEncoding(target="label")   # TE_user_label, TE_item_label

The target must be part of the op's selection; the op outputs only the columns it
creates. Null and NaN are one category, ``-0.0`` is ``0.0`` (see :mod:`tabstream.ops.keys`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.backends import current as backend
from tabstream.core.dtypes import sort_indices
from tabstream.core.operators import StatOperator, check_flag, drop_lookup_indexes, lookup_indexes
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.keys import (
    FOLD,
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
    sum_by_keys,
)
from tabstream.ops.numeric import check_numeric, to_float64
from tabstream.ops.nvt_params import check_nvt_knobs, write_stats_files

__all__ = ["TargetEncoding"]


# -- TargetEncoding -------------------------------------------------------------------
class TargetEncoding(StatOperator):
    """Smoothed mean of ``target`` per category, with out-of-fold encoding.

    Select the categories and the target: ``["user", "label"] >> TargetEncoding("label")``
    encodes every selected column except the target (and ``fold_col``), or the
    groups in ``cat_groups`` (a list entry of several names encodes their
    combination), and outputs ``TE_<group>_<target>`` (group names joined by ``_``)::

        TE = (sum + p_smooth * global_mean) / (count + p_smooth)

    ``sum``/``count`` are over the category's rows with a finite target (null, NaN
    and ±inf targets are left out); ``global_mean`` is ``target_mean`` or the fitted
    mean of the finite targets. A category never seen at fit (count 0) gets
    ``global_mean``; null and NaN are one category of their own.

    Folds (``kfold > 1``): row ``r`` belongs to fold
    ``murmur3_32(key(r), seed=fold_seed) % kfold`` where ``key`` is the value of
    ``fold_col`` when given (e.g. a row or event id; its nulls and NaN go to
    fold ``0``) and otherwise the row's 0-based position in its dataset
    partition. Fit records ``sum``/``count`` per (category, fold); transform
    encodes each row of fold ``f`` from the statistics of the other folds (train
    and validation rows alike, as NVTabular does), so a training row never sees its
    own target. With the positional rule this holds when the training data is
    transformed with the same partitioning it was fitted with (the same Dataset
    files and ``part_size``), and per-fold statistics depend on that partitioning;
    a ``fold_col`` makes folds, statistics and outputs independent of it.
    ``kfold=1`` uses all statistics for every row. ``drop_folds=False`` also outputs
    the fold of each row as ``__fold__`` (int64).
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"groups": list[str], "global_sums": dict[str, float],
                   "global_counts": dict[str, int]}
    state_tables = {"stats.{groups}": {}}

    def __init__(self, target: str | list[str] | Any, target_mean: float | dict[str, float] | None = None,
                 kfold: int | None = 3, fold_seed: int | None = 42, p_smooth: float = 20,
                 out_dtype: str | None = "float32", drop_folds: bool = True,
                 cat_groups: list[str | list[str]] | None = None, fold_col: str | None = None,
                 out_path: str | None = None, split_out: int | dict[str, int] | None = None,
                 tree_width: int | dict[str, int] | None = None, on_host: bool = True,
                 stat_cache: Any = "host", name_sep: str = "_") -> None:
        super().__init__()
        op = "TargetEncoding"
        targets, self._target_nodes = names_and_nodes(target, "target", op)
        kfold = 3 if kfold is None else kfold  # NVTabular's None: its default, 3 folds
        # NVTabular's fold_seed=None draws folds at random; tabstream's folds are a hash,
        # so None is the default seed (reproducible; see docs/nvtabular-differences.md)
        fold_seed = 42 if fold_seed is None else fold_seed
        out_dtype = "float32" if out_dtype is None else np.dtype(out_dtype).name
        if name_sep != "_":
            raise ValueError(f"{op}: name_sep={name_sep!r} is not supported; outputs are named "
                             "TE_<group>_<target>")
        check_nvt_knobs(op, out_path=out_path, split_out=split_out, tree_width=tree_width)
        if target_mean is not None:
            means = target_mean.values() if isinstance(target_mean, dict) else [target_mean]
            if any(isinstance(m, bool) or not isinstance(m, (int, float)) for m in means):
                raise TypeError(f"{op}: target_mean must be a number or a dict target -> number, got {target_mean!r}")
        if isinstance(kfold, bool) or not isinstance(kfold, int) or kfold < 1:
            raise ValueError(f"{op}: kfold must be an integer >= 1 (1 = no folds), got {kfold!r}")
        if isinstance(fold_seed, bool) or not isinstance(fold_seed, int) or not 0 <= fold_seed < 2**32:
            raise ValueError(f"{op}: fold_seed must be an integer in [0, 2**32), got {fold_seed!r}")
        if isinstance(p_smooth, bool) or not isinstance(p_smooth, (int, float)) or not p_smooth >= 0:
            raise ValueError(f"{op}: p_smooth must be a number >= 0, got {p_smooth!r}")
        if out_dtype not in ("float32", "float64"):
            raise ValueError(f"{op}: out_dtype must be 'float32' or 'float64', got {out_dtype!r}")
        if fold_col is not None and (not isinstance(fold_col, str) or fold_col in targets):
            raise ValueError(f"{op}: fold_col must be a column name other than the target, got {fold_col!r}")
        self.target = target if isinstance(target, str) else list(targets)
        self.out_path = out_path
        self.split_out = split_out
        self.tree_width = tree_width
        self.on_host = bool(on_host)
        self.stat_cache = stat_cache
        self.name_sep = name_sep
        self.stats_files: dict[str, str] = {}  # out_path files by name, written at fit
        self.target_mean = target_mean
        self.kfold = kfold
        self.fold_seed = fold_seed
        self.p_smooth = p_smooth
        self.out_dtype = out_dtype
        self.drop_folds = check_flag(drop_folds, "TargetEncoding", "drop_folds")
        self.cat_groups = check_groups(cat_groups, op)
        self.fold_col = fold_col
        self.stats: dict[str, pa.Table] = {}
        self.global_sums: dict[str, float] = {}
        self.global_counts: dict[str, int] = {}
        self._arrays: dict[str, Any] = {}

    def set_column_groups(self, groups: list) -> None:
        """Called by the graph when the selection has nested lists (NVTabular's
        ``["a", "b", ["a", "b"]] >> TargetEncoding(...)``): they are the groups to encode,
        unless ``cat_groups`` was given."""
        if self.cat_groups is None and any(isinstance(g, list) for g in groups):
            self.cat_groups = check_groups(groups, "TargetEncoding")

    def dependencies(self) -> list[Any]:
        return dependencies_of(self._value_cols(), self._target_nodes)

    @property
    def targets(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)

    def _value_cols(self) -> list[str]:
        return self.targets + ([self.fold_col] if self.fold_col else [])

    def _groups_of(self, names: Sequence[str]) -> list[list[str]]:
        return resolve_groups(self, names, self._value_cols())

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        names = input_schema.column_names
        require_selected(self._value_cols(), names, "TargetEncoding", "target/fold columns")
        for t in self.targets:
            check_numeric(self, input_schema[t])
        groups = self._groups_of(names)
        check_scalar_categories(self, input_schema, groups)
        cols = [ColumnSchema(f"TE_{'_'.join(g)}_{t}", self.out_dtype, frozenset({Tags.CONTINUOUS}))
                for g in groups for t in self.targets]
        if self.kfold > 1 and not self.drop_folds:
            cols.append(ColumnSchema(FOLD, "int64"))
        return Schema(cols)

    def _folds(self, table: pa.Table) -> np.ndarray:
        if self.kfold == 1:
            return np.zeros(table.num_rows, dtype=np.int64)
        # a NaN fold key is missing like null (fold 0); -0.0 hashes as 0.0
        key: Any = key_column(table.column(self.fold_col)) if self.fold_col \
            else np.arange(table.num_rows, dtype=np.int64)
        return (backend().murmur3(key, self.fold_seed).hashes % np.uint32(self.kfold)).astype(np.int64)

    # -- fit -----------------------------------------------------------------------
    def fit_partition(self, table: pa.Table) -> dict[str, Any]:
        folds = pa.array(self._folds(table))
        ys = {t: to_float64(table.column(t)) for t in self.targets}
        # per (category, fold): the sum and the count of the finite targets
        parts: dict[str, Any] = {}
        for t, y in ys.items():
            ok = np.isfinite(y)
            parts[f"__sum__{t}"] = pa.array(np.where(ok, y, 0.0))
            parts[f"__count__{t}"] = pa.array(ok.astype(np.int64))
        aggregations = [(name, "sum", name) for name in parts]
        groups = {}
        for g in self._groups_of(table.column_names):
            work = pa.table({**{c: key_column(table.column(c)) for c in g}, FOLD: folds, **parts})
            groups["_".join(g)] = backend().groupby_aggregate(work, [*g, FOLD], aggregations)
        sums = {t: float(y[np.isfinite(y)].sum()) for t, y in ys.items()}
        counts = {t: int(np.isfinite(y).sum()) for t, y in ys.items()}
        return {"groups": groups, "sums": sums, "counts": counts}

    def combine(self, partials: Sequence[dict[str, Any]]) -> dict[str, Any]:
        groups = {}
        for name, first in partials[0]["groups"].items():
            keys = [c for c in first.column_names if not c.startswith(("__sum__", "__count__"))]
            groups[name] = sum_by_keys([p["groups"][name] for p in partials], keys)
        return {"groups": groups,
                "sums": {t: sum(p["sums"][t] for p in partials) for t in self.targets},
                "counts": {t: sum(p["counts"][t] for p in partials) for t in self.targets}}

    def finalize(self, partial: dict[str, Any]) -> None:
        self.stats = {name: t.take(sort_indices(t, [(c, "ascending") for c in t.column_names
                                                    if not c.startswith(("__sum__", "__count__"))]))
                      for name, t in partial["groups"].items()}
        self.global_sums = dict(partial["sums"])
        self.global_counts = dict(partial["counts"])
        self._prepare()
        self.fitted = True
        self.stats_files = write_stats_files("TargetEncoding", self.out_path, {
            f"target_encoding.{name}": t for name, t in self.stats.items()})

    def _prepare(self) -> None:
        """Per group: distinct categories and (category x fold) sum/count arrays."""
        drop_lookup_indexes(self)  # those of the categories replaced
        self._arrays = {}
        for name, table in self.stats.items():
            keys = [c for c in table.column_names if c != FOLD and not c.startswith(("__sum__", "__count__"))]
            uniq, codes = group_codes(table.select(keys))
            folds = np.asarray(table.column(FOLD).to_numpy(), dtype=np.int64)
            per_target = {}
            for t in self.targets:
                sums = np.zeros((uniq.num_rows, self.kfold))
                counts = np.zeros((uniq.num_rows, self.kfold))
                sums[codes, folds] = table.column(f"__sum__{t}").to_numpy()
                counts[codes, folds] = table.column(f"__count__{t}").to_numpy()
                per_target[t] = (sums, counts, sums.sum(axis=1), counts.sum(axis=1))
            self._arrays[name] = (uniq, per_target)

    def global_mean(self, target: str) -> float:
        if self.target_mean is not None:
            return float(self.target_mean[target] if isinstance(self.target_mean, dict) else self.target_mean)
        count = self.global_counts.get(target, 0)
        return self.global_sums[target] / count if count else float("nan")

    # -- transform -------------------------------------------------------------------
    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        folds = self._folds(table)
        data = {}
        for g in self._groups_of(table.column_names):
            name = "_".join(g)
            uniq, per_target = self._arrays[name]
            idx = lookup(uniq, table.select(g), "TargetEncoding",
                         indexes=lookup_indexes(self, name), source=uniq)
            seen = idx >= 0
            at = np.where(seen, idx, 0)
            for t in self.targets:
                sums, counts, total_s, total_c = per_target[t]
                s = np.where(seen, total_s[at], 0.0)
                c = np.where(seen, total_c[at], 0.0)
                if self.kfold > 1:
                    s = s - np.where(seen, sums[at, folds], 0.0)
                    c = c - np.where(seen, counts[at, folds], 0.0)
                gm = self.global_mean(t)
                denom = c + self.p_smooth
                with np.errstate(divide="ignore", invalid="ignore"):
                    enc = np.where(denom > 0, (s + self.p_smooth * gm) / np.where(denom > 0, denom, 1), gm)
                data[f"TE_{'_'.join(g)}_{t}"] = pa.array(enc.astype(self.out_dtype))
        if self.kfold > 1 and not self.drop_folds:
            data[FOLD] = pa.array(folds)
        return pa.table(data)

    # -- state ---------------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        values = {"groups": list(self.stats), "global_sums": self.global_sums,
                  "global_counts": self.global_counts}
        return values, {f"stats.{k}": v for k, v in self.stats.items()}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        for field in ("global_sums", "global_counts"):
            missing = [t for t in self.targets if t not in values[field]]
            if missing:
                raise ValueError(f"{field} lacks the targets {missing}")
        bad = {t: n for t, n in values["global_counts"].items() if n < 1}
        if bad:
            raise ValueError(f"global_counts must be at least 1 (the rows the fit saw), got {bad}")
        for k in values["groups"]:
            table = tables[f"stats.{k}"]  # a (category, fold) pair once
            check_distinct_keys(table, [c for c in table.column_names if not c.startswith(("__sum__", "__count__"))],
                                f"stats table 'stats.{k}'")
        self.stats = {k: tables[f"stats.{k}"] for k in values["groups"]}
        self.global_sums = {k: float(v) for k, v in values["global_sums"].items()}
        self.global_counts = {k: int(v) for k, v in values["global_counts"].items()}
        self._prepare()
        self.fitted = True

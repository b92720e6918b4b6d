"""Ops that aggregate per category or per key and join the result back to the rows:
TargetEncoding, JoinGroupby, JoinExternal, DifferenceLag.

Extra input columns (the target of TargetEncoding, the continuous columns of
JoinGroupby, the partition key of DifferenceLag) are named as parameters and must
be part of the op's selection; the op works on the other selected columns and
outputs only the columns it creates::

    te = ["user", "item", "label"] >> TargetEncoding(target="label")   # TE_user_label, TE_item_label
    feats = te + (["user", "item"] >> Categorify()) + ["label"]

Category values are compared as values: null and NaN are one category (the
missing one), and ``-0.0`` is the category ``0.0``, for one or several key columns.
Keys meet as numbers (an int ``1`` is the float ``1.0``) or as strings; a number
key never meets a string key (TypeError naming both columns).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.core.hashing import murmur3_32
from tabstream.core.operators import Operator, StatOperator
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.statistics import check_numeric, plain, to_float64

__all__ = ["DifferenceLag", "JoinExternal", "JoinGroupby", "TargetEncoding"]

FOLD = "__fold__"


# -- grouping helpers -------------------------------------------------------------
def normalize_key(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A key column as one plain array whose equal values are equal bits: in float
    columns NaN becomes null (one missing value) and ``-0.0`` becomes ``0.0``."""
    column = plain(column)
    if pa.types.is_floating(column.type):
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
        column = pc.add(column, pa.scalar(0.0, column.type))  # -0.0 + 0.0 == +0.0
    return column


def missing_key(keys: pa.Table) -> np.ndarray:
    """True where any key of a row is missing (null, or NaN in a float column)."""
    out = np.zeros(keys.num_rows, dtype=bool)
    for name in keys.column_names:
        out |= np.asarray(pc.is_null(normalize_key(keys.column(name))).to_numpy(zero_copy_only=False), dtype=bool)
    return out


def group_codes(keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Distinct rows of ``keys`` and the index of each row's distinct row.

    Missing values are values: null and NaN of a column form one key (returned as
    null), and ``-0.0`` is the key ``0.0``.
    """
    cols = {name: normalize_key(keys.column(name)) for name in keys.column_names}
    codes = np.zeros(keys.num_rows, dtype=np.int64)
    for column in cols.values():
        enc = pc.dictionary_encode(column, null_encoding="encode")
        col_codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        # re-densify after each column so codes stay below the row count (no overflow)
        _, codes = np.unique(codes * max(1, len(enc.dictionary)) + col_codes, return_inverse=True)
        codes = codes.reshape(-1).astype(np.int64)
    _, first = np.unique(codes, return_index=True)
    return pa.table(cols).take(first), codes


def _key_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """Type both key columns are compared in: numbers as numbers, strings as strings."""
    if a == b:
        return a
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in (a, b)):
        return pa.float64() if pa.types.is_floating(a) or pa.types.is_floating(b) else pa.int64()
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (a, b)):
        return pa.large_string()
    return None


def lookup(table_keys: pa.Table, keys: pa.Table, op: str,
           against: str = "the fitted statistics' key") -> np.ndarray:
    """Row of ``table_keys`` (distinct rows) equal to each row of ``keys``; -1 where none."""
    stored, given = {}, {}
    for field, name in zip(table_keys.schema, keys.column_names):
        mine, theirs = plain(table_keys.column(field.name)), plain(keys.column(name))
        common = _key_type(mine.type, theirs.type)
        try:
            if common is None:
                raise pa.ArrowInvalid("not comparable")
            stored[field.name], given[field.name] = mine.cast(common), theirs.cast(common)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise TypeError(f"{op}: key column {name!r} is {theirs.type}, but {against} {field.name!r} "
                            f"is {mine.type}; make both numbers or both strings (e.g. with LambdaOp "
                            "before the op)") from exc
    _, codes = group_codes(pa.concat_tables([pa.table(stored), pa.table(given)]))
    m = table_keys.num_rows
    where = np.full(int(codes.max()) + 1 if len(codes) else 0, -1, dtype=np.int64)
    where[codes[:m]] = np.arange(m)
    return where[codes[m:]]


def _names(value: Any, what: str, op: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{op}: {what} must be a column name or a non-empty list of names, got {value!r}")
    return names


def _groups(cat_groups: Any, op: str) -> list[str | list[str]] | None:
    if cat_groups is None:
        return None
    if not isinstance(cat_groups, (list, tuple)) or not cat_groups:
        raise TypeError(f"{op}: cat_groups must be a non-empty list of names or lists of names, got {cat_groups!r}")
    return [g if isinstance(g, str) else _names(g, "each entry of cat_groups", op) for g in cat_groups]


def _resolve_groups(op: Any, available: Sequence[str], exclude: Sequence[str]) -> list[list[str]]:
    """Category groups of ``op``: ``cat_groups`` or each selected column not in ``exclude``."""
    name = type(op).__name__
    if op.cat_groups is None:
        groups = [[c] for c in available if c not in exclude]
    else:
        groups = [[g] if isinstance(g, str) else list(g) for g in op.cat_groups]
    missing = sorted({c for g in groups for c in g if c not in available})
    if missing:
        raise SchemaError(f"{name}: cat_groups columns {missing} are not selected; select them "
                          f"too, e.g. {sorted(set(available) | set(missing))} >> {name}(...)")
    clash = sorted({c for g in groups for c in g if c in exclude})
    if clash:
        raise ValueError(f"{name}: columns {clash} cannot be both a category and a value column")
    if not groups:
        raise SchemaError(f"{name}: no category column selected besides {list(exclude)}; "
                          f"select the categories too, e.g. ['user_id', *{list(exclude)}] >> {name}(...)")
    return groups


def _check_scalar_categories(op: Any, input_schema: Schema, groups: list[list[str]]) -> None:
    lists = [c for g in groups for c in g if input_schema[c].is_list]
    if lists:
        raise TypeError(f"{type(op).__name__} needs scalar category columns, but {lists} hold lists")


def _require(names: Sequence[str], schema_names: Sequence[str], op: str, role: str) -> None:
    missing = [n for n in names if n not in schema_names]
    if missing:
        raise SchemaError(f"{op}: {role} {missing} must be part of the op's selection; it "
                          f"selects {list(schema_names)}: select {list(schema_names) + missing} >> {op}(...)")


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

    def __init__(self, target: str | list[str], target_mean: float | dict[str, float] | None = None,
                 kfold: int = 3, fold_seed: int = 42, p_smooth: float = 20,
                 out_dtype: str = "float32", drop_folds: bool = True,
                 cat_groups: list[str | list[str]] | None = None, fold_col: str | None = None) -> None:
        super().__init__()
        op = "TargetEncoding"
        targets = _names(target, "target", op)
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
        self.target_mean = target_mean
        self.kfold = kfold
        self.fold_seed = fold_seed
        self.p_smooth = p_smooth
        self.out_dtype = out_dtype
        self.drop_folds = bool(drop_folds)
        self.cat_groups = _groups(cat_groups, op)
        self.fold_col = fold_col
        self.stats: dict[str, pa.Table] = {}
        self.global_sums: dict[str, float] = {}
        self.global_counts: dict[str, int] = {}
        self._arrays: dict[str, Any] = {}

    @property
    def targets(self) -> list[str]:
        return [self.target] if isinstance(self.target, str) else list(self.target)

    def _value_cols(self) -> list[str]:
        return self.targets + ([self.fold_col] if self.fold_col else [])

    def _groups_of(self, names: Sequence[str]) -> list[list[str]]:
        return _resolve_groups(self, names, self._value_cols())

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        names = input_schema.column_names
        _require(self._value_cols(), names, "TargetEncoding", "target/fold columns")
        for t in self.targets:
            check_numeric(self, input_schema[t])
        groups = self._groups_of(names)
        _check_scalar_categories(self, input_schema, groups)
        cols = [ColumnSchema(f"TE_{'_'.join(g)}_{t}", self.out_dtype, frozenset({Tags.CONTINUOUS}))
                for g in groups for t in self.targets]
        if self.kfold > 1 and not self.drop_folds:
            cols.append(ColumnSchema(FOLD, "int64"))
        return Schema(cols)

    def _folds(self, table: pa.Table) -> np.ndarray:
        if self.kfold == 1:
            return np.zeros(table.num_rows, dtype=np.int64)
        # a NaN fold key is missing like null (fold 0); -0.0 hashes as 0.0
        key: Any = normalize_key(table.column(self.fold_col)) if self.fold_col \
            else np.arange(table.num_rows, dtype=np.int64)
        return (murmur3_32(key, seed=self.fold_seed) % np.uint32(self.kfold)).astype(np.int64)

    # -- fit -----------------------------------------------------------------------
    def fit_partition(self, table: pa.Table) -> dict[str, Any]:
        folds = pa.array(self._folds(table))
        ys = {t: to_float64(table.column(t)) for t in self.targets}
        groups = {}
        for g in self._groups_of(table.column_names):
            uniq, codes = group_codes(table.select(g).append_column(FOLD, folds))
            cols = {}
            for t, y in ys.items():
                ok = np.isfinite(y)
                cols[f"__sum__{t}"] = np.bincount(codes, np.where(ok, y, 0.0), uniq.num_rows)
                cols[f"__count__{t}"] = np.bincount(codes[ok], minlength=uniq.num_rows).astype(np.int64)
            groups["_".join(g)] = _with_columns(uniq, cols)
        sums = {t: float(y[np.isfinite(y)].sum()) for t, y in ys.items()}
        counts = {t: int(np.isfinite(y).sum()) for t, y in ys.items()}
        return {"groups": groups, "sums": sums, "counts": counts}

    def combine(self, partials: Sequence[dict[str, Any]]) -> dict[str, Any]:
        groups = {}
        for name, first in partials[0]["groups"].items():
            keys = [c for c in first.column_names if not c.startswith(("__sum__", "__count__"))]
            groups[name] = _sum_by_keys([p["groups"][name] for p in partials], keys)
        return {"groups": groups,
                "sums": {t: sum(p["sums"][t] for p in partials) for t in self.targets},
                "counts": {t: sum(p["counts"][t] for p in partials) for t in self.targets}}

    def finalize(self, partial: dict[str, Any]) -> None:
        self.stats = {name: t.sort_by([(c, "ascending") for c in t.column_names
                                       if not c.startswith(("__sum__", "__count__"))])
                      for name, t in partial["groups"].items()}
        self.global_sums = dict(partial["sums"])
        self.global_counts = dict(partial["counts"])
        self._prepare()
        self.fitted = True

    def _prepare(self) -> None:
        """Per group: distinct categories and (category x fold) sum/count arrays."""
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
            uniq, per_target = self._arrays["_".join(g)]
            idx = lookup(uniq, table.select(g), "TargetEncoding")
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
        self.stats = {k: tables[f"stats.{k}"] for k in values["groups"]}
        self.global_sums = {k: float(v) for k, v in values["global_sums"].items()}
        self.global_counts = {k: int(v) for k, v in values["global_counts"].items()}
        self._prepare()
        self.fitted = True


def _with_columns(keys: pa.Table, cols: dict[str, np.ndarray]) -> pa.Table:
    for name, values in cols.items():
        keys = keys.append_column(name, pa.array(values))
    return keys


def _sum_by_keys(tables: Sequence[pa.Table], keys: list[str]) -> pa.Table:
    merged = pa.concat_tables(tables, promote_options="permissive")
    uniq, codes = group_codes(merged.select(keys))
    cols = {}
    for name in merged.column_names:
        if name not in keys:
            values = np.bincount(codes, merged.column(name).to_numpy(), uniq.num_rows)
            cols[name] = values.astype(np.int64) if pa.types.is_integer(merged.column(name).type) else values
    return _with_columns(uniq, cols)


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

    def __init__(self, cont_cols: list[str] | None = None, stats: Sequence[str] = ("count",),
                 cat_groups: list[str | list[str]] | None = None, name_sep: str = "_",
                 out_dtype: str = "float32") -> None:
        super().__init__()
        op = "JoinGroupby"
        cont = [] if cont_cols is None else _names(cont_cols, "cont_cols", op)
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
        self.cat_groups = _groups(cat_groups, op)
        self.name_sep = name_sep
        self.out_dtype = out_dtype
        self.tables: dict[str, pa.Table] = {}

    def _outputs(self, group: str) -> list[tuple[str, str | None, str]]:
        """(output name, continuous column, stat) of one group."""
        out: list[tuple[str, str | None, str]] = []
        if "count" in self.stats:
            out.append((f"{group}{self.name_sep}count", None, "count"))
        sep = self.name_sep
        out += [(f"{group}{sep}{c}{sep}{s}", c, s) for c in self.cont_cols for s in self.stats if s != "count"]
        return out

    def _groups_of(self, names: Sequence[str]) -> list[list[str]]:
        return _resolve_groups(self, names, self.cont_cols)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        names = input_schema.column_names
        _require(self.cont_cols, names, "JoinGroupby", "cont_cols")
        for c in self.cont_cols:
            check_numeric(self, input_schema[c])
        groups = self._groups_of(names)
        _check_scalar_categories(self, input_schema, groups)
        return Schema(ColumnSchema(name, "int64" if stat == "count" else self.out_dtype,
                                   frozenset({Tags.CONTINUOUS}))
                      for g in groups for name, _, stat in self._outputs(self.name_sep.join(g)))

    def fit_partition(self, table: pa.Table) -> dict[str, pa.Table]:
        # + 0.0 folds -0.0 into 0.0, so min/max never depend on which zero came first
        xs = {c: to_float64(table.column(c)) + 0.0 for c in self.cont_cols}
        out = {}
        for g in self._groups_of(table.column_names):
            uniq, codes = group_codes(table.select(g))
            n_groups = uniq.num_rows
            cols: dict[str, np.ndarray] = {"__rows": np.bincount(codes, minlength=n_groups).astype(np.int64)}
            for c, x in xs.items():
                ok = ~np.isnan(x)
                k, v = codes[ok], x[ok]
                n = np.bincount(k, minlength=n_groups).astype(np.int64)
                s = np.bincount(k, v, n_groups)
                with np.errstate(divide="ignore", invalid="ignore"):
                    mean = s / n
                    m2 = np.bincount(k, (v - mean[k]) ** 2, n_groups)
                lo, hi = np.full(n_groups, np.nan), np.full(n_groups, np.nan)
                np.fmin.at(lo, k, v)
                np.fmax.at(hi, k, v)
                cols.update({f"__n__{c}": n, f"__sum__{c}": s, f"__m2__{c}": m2,
                             f"__min__{c}": lo, f"__max__{c}": hi})
            out[self.name_sep.join(g)] = _with_columns(uniq, cols)
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
        return _with_columns(uniq, cols)

    def finalize(self, partial: dict[str, pa.Table]) -> None:
        tables = {}
        for name, t in partial.items():
            n_keys = t.num_columns - 1 - 5 * len(self.cont_cols)
            keys = t.column_names[:n_keys]
            t = t.sort_by([(k, "ascending") for k in keys])
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
            tables[name] = _with_columns(t.select(keys), cols)
        self.tables = tables
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        data = {}
        for g in self._groups_of(table.column_names):
            name = self.name_sep.join(g)
            stats = self.tables[name]
            idx = lookup(stats.select(g), table.select(g), "JoinGroupby")
            take = pa.array(idx, mask=idx < 0)
            for out, _, stat in self._outputs(name):
                column = stats.column(out).take(take)
                data[out] = column if stat == "count" else column.cast(self.out_dtype)
        return pa.table(data)

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"groups": list(self.tables)}, {f"stats.{k}": v for k, v in self.tables.items()}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.tables = {k: tables[f"stats.{k}"] for k in values["groups"]}
        self.fitted = True


# -- JoinExternal ------------------------------------------------------------------------------
class JoinExternal(StatOperator):
    """Join a side table on key columns: the selected columns plus the side's columns.

    ``df_ext`` is a pandas DataFrame, a pyarrow Table or the path/URL of a parquet
    file or folder. The side table is op state: ``Workflow.save`` writes it as
    parquet and ``Workflow.load`` reads it back from there (a workflow saved with
    an in-memory side table stores ``df_ext=None`` in its parameters), so a saved
    workflow never needs the original file, and nothing is pickled. A parquet path
    is read on first use (schema computation or fit), not at construction. Like
    every statistics op it must be fitted (``Workflow.fit``, or ``fit_table`` on
    any table) before transform, though fitting uses nothing of the data.

    * ``on``: key column(s) of the selection; ``on_ext`` the side's (default: ``on``).
    * ``columns_ext``: side columns to add (default: all but the keys).
    * ``how="left"``: every row is kept; rows whose key has no match (and rows with
      a missing key, null or NaN in any key column: a missing key never matches,
      as in SQL and unlike ``pandas.merge``) get null side columns.
      ``how="inner"``: such rows are dropped. ``-0.0`` matches ``0.0``.
    * ``drop_duplicates_ext=True`` removes duplicate rows of the side table (its
      keys and the added columns; null and NaN equal, ``-0.0`` equal to ``0.0``),
      keeping the first, before the join, as NVTabular does. A key with several
      different side rows still repeats the row once per match.
    * ``first_match_only=True`` joins each row to the first side row of its key
      only, so the row count never grows.

    Row order is kept (matches of one row in side-table order). ``how="inner"`` and
    duplicate side keys change the number of rows, so the op must then see every
    column the workflow outputs (apply it before branching), or the branches'
    row counts will differ.

    >>> side = pa.table({"k": [1.0, 1.0, -0.0, None], "w": [5, 5, 6, 7]})
    >>> t = pa.table({"k": [1.0, 0.0, float("nan")]})
    >>> JoinExternal(side, on="k").fit_table(t).transform(t)["w"]      # [5, 5, 6, null]
    >>> JoinExternal(side, on="k", drop_duplicates_ext=True)          # w: [5, 6, null]
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = dict[str, Any]()  # no JSON values: the side table is the state
    state_tables = {"side": {}}

    def __init__(self, df_ext: Any, on: str | list[str], how: str = "left",
                 on_ext: str | list[str] | None = None, columns_ext: list[str] | None = None,
                 drop_duplicates_ext: bool = False, first_match_only: bool = False) -> None:
        super().__init__()
        op = "JoinExternal"
        keys = _names(on, "on", op)
        keys_ext = keys if on_ext is None else _names(on_ext, "on_ext", op)
        if len(keys_ext) != len(keys):
            raise ValueError(f"{op}: on {keys} and on_ext {keys_ext} must have the same length")
        if how not in ("left", "inner"):
            raise ValueError(f"{op}: how must be 'left' or 'inner', got {how!r}")
        if columns_ext is not None:
            _names(columns_ext, "columns_ext", op)
        for name, flag in (("drop_duplicates_ext", drop_duplicates_ext), ("first_match_only", first_match_only)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{op}: {name} must be True or False, got {flag!r}")
        self._table: pa.Table | None = None
        if isinstance(df_ext, pd.DataFrame):
            self._table = pa.Table.from_pandas(df_ext, preserve_index=False)
            df_ext = None
        elif isinstance(df_ext, pa.Table):
            self._table, df_ext = df_ext, None
        elif isinstance(df_ext, os.PathLike):
            df_ext = os.fspath(df_ext)
        elif df_ext is not None and not isinstance(df_ext, str):
            raise TypeError(f"{op}: df_ext must be a pandas DataFrame, a pyarrow Table or a parquet "
                            f"path, got {type(df_ext).__name__}")
        self.df_ext = df_ext
        self.on = on if isinstance(on, str) else keys
        self.how = how
        self.on_ext = on_ext if on_ext is None or isinstance(on_ext, str) else keys_ext
        self.columns_ext = None if columns_ext is None else list(columns_ext)
        self.drop_duplicates_ext = bool(drop_duplicates_ext)
        self.first_match_only = bool(first_match_only)
        self._side_cache: tuple[pa.Table, pa.Table, np.ndarray] | None = None
        if self._table is not None:
            self._side()  # validate the given table now

    @property
    def keys(self) -> list[str]:
        return [self.on] if isinstance(self.on, str) else list(self.on)

    @property
    def keys_ext(self) -> list[str]:
        return self.keys if self.on_ext is None else [self.on_ext] if isinstance(self.on_ext, str) \
            else list(self.on_ext)

    def _side(self) -> tuple[pa.Table, pa.Table, np.ndarray]:
        """(payload columns, distinct side keys, key group of each side row)."""
        if self._side_cache is not None:
            return self._side_cache
        if self._table is None:
            if self.df_ext is None:
                raise NotFittedError("JoinExternal has no side table: pass df_ext, or load the "
                                     "workflow it was saved with (Workflow.load)")
            import fsspec
            import pyarrow.parquet as pq

            fs, path = fsspec.core.url_to_fs(self.df_ext)
            try:
                self._table = pq.read_table(path, filesystem=fs)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"JoinExternal: side table {self.df_ext!r} does not exist; "
                                        "pass an existing parquet file or folder") from exc
            except (pa.ArrowInvalid, OSError) as exc:
                raise DataError(f"JoinExternal: cannot read side table {self.df_ext!r} as parquet "
                                f"({exc}); pass a parquet file or folder, or a DataFrame") from exc
        side = self._table
        missing = [c for c in self.keys_ext + (self.columns_ext or []) if c not in side.column_names]
        if missing:
            raise SchemaError(f"JoinExternal: side table has no columns {missing}; it has {side.column_names}")
        payload = [c for c in (self.columns_ext or side.column_names) if c not in self.keys_ext]
        side = side.select(self.keys_ext + payload)
        if self.drop_duplicates_ext:
            nested = [f.name for f in side.schema if pa.types.is_nested(f.type)]
            if nested:
                raise TypeError(f"JoinExternal: drop_duplicates_ext compares whole side rows, but side "
                                f"columns {nested} hold lists or structs; leave them out with "
                                "columns_ext or use first_match_only=True")
            _, row_codes = group_codes(side)
            _, first = np.unique(row_codes, return_index=True)
            side = side.take(np.sort(first))
        uniq, codes = group_codes(side.select(self.keys_ext))
        if self.first_match_only:
            _, first = np.unique(codes, return_index=True)
            side = side.take(np.sort(first))
            uniq, codes = group_codes(side.select(self.keys_ext))
        self._table = side
        self._side_cache = (side.select(payload), uniq, codes)
        return self._side_cache

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        _require(self.keys, input_schema.column_names, "JoinExternal", "key columns")
        payload = self._side()[0]
        assert self._table is not None
        for key, key_ext in zip(self.keys, self.keys_ext):
            col, side_type = input_schema[key], plain(self._table.column(key_ext)).type
            if col.dtype != "unknown" and not col.is_list and \
                    _key_type(dtype_to_arrow_type(col.dtype), side_type) is None:
                raise TypeError(f"JoinExternal: key column {key!r} is {col.dtype}, but the side table's "
                                f"key {key_ext!r} is {side_type}; make both numbers or both strings "
                                "(e.g. with LambdaOp before the op)")
        clash = [c for c in payload.column_names if c in input_schema]
        if clash:
            raise SchemaError(f"JoinExternal: side columns {clash} are also selected columns; "
                              "choose the side columns with columns_ext or rename them")
        cols = list(input_schema)
        for field in payload.schema:
            dtype, is_list = arrow_type_to_dtype(field.type)
            cols.append(ColumnSchema(field.name, dtype, is_list=is_list))
        return Schema(cols)

    def fit_partition(self, table: pa.Table) -> None:
        return None

    def combine(self, partials: Sequence[Any]) -> None:
        return None

    def finalize(self, partial: Any) -> None:
        self._side()
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        payload, uniq, codes = self._side()
        keys = table.select(self.keys)
        group = lookup(uniq, keys, "JoinExternal", "the side table's key")
        group[missing_key(keys)] = -1  # a missing key (null or NaN) never matches
        # side rows grouped by key: rows of key g are order[starts[g]:starts[g] + counts[g]]
        counts = np.bincount(codes, minlength=uniq.num_rows + 1)  # + 1: a dummy key for -1
        order = np.append(np.argsort(codes, kind="stable"), -1)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        group[group < 0] = uniq.num_rows
        reps = counts[group] if self.how == "inner" else np.maximum(counts[group], 1)
        rows = np.repeat(np.arange(table.num_rows), reps)
        within = np.arange(len(rows)) - np.repeat(np.cumsum(reps) - reps, reps)
        g = group[rows]
        side_rows = np.where(g < uniq.num_rows, order[np.minimum(starts[g] + within, len(order) - 1)], -1)
        out = table.take(rows)
        side = payload.take(pa.array(side_rows, mask=side_rows < 0))
        for name, column in zip(side.column_names, side.columns):
            out = out.append_column(name, column)
        return out

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        self._side()
        assert self._table is not None
        return {}, {"side": self._table}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self._table = tables["side"]
        self._side_cache = None
        self.fitted = True


# -- DifferenceLag --------------------------------------------------------------------------------
class DifferenceLag(Operator):
    """``x[i] - x[i - shift]`` when rows ``i`` and ``i - shift`` have the same key.

    Select the value columns and ``partition_cols``:
    ``["ts", "user"] >> DifferenceLag("user", shift=[1, -1])`` outputs
    ``ts_difference_lag_1`` and ``ts_difference_lag_-1`` (NVTabular's names; a
    negative shift looks forward). The data must be sorted by key, then time;
    the lag is computed within one dataset partition only, so a key whose rows
    are split over two partitions gets null at the boundary (as in NVTabular):
    partition the data by key first. Rows without a row ``shift`` earlier of the
    same key, with a null key, or with a null value get null. Integer columns give
    int64 (overflow raises), float columns keep their dtype.
    """

    def __init__(self, partition_cols: str | list[str], shift: int | list[int] = 1) -> None:
        keys = _names(partition_cols, "partition_cols", "DifferenceLag")
        shifts = [shift] if not isinstance(shift, (list, tuple)) else list(shift)
        if not shifts or any(isinstance(s, bool) or not isinstance(s, int) or s == 0 for s in shifts):
            raise ValueError(f"DifferenceLag: shift must be a non-zero integer or a list of them, got {shift!r}")
        self.partition_cols = keys
        self.shift = shift if isinstance(shift, int) else shifts

    @property
    def shifts(self) -> list[int]:
        return [self.shift] if isinstance(self.shift, int) else list(self.shift)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        _require(self.partition_cols, input_schema.column_names, "DifferenceLag", "partition_cols")
        values = [c for c in input_schema if c.name not in self.partition_cols]
        if not values:
            raise SchemaError("DifferenceLag: select the value columns besides partition_cols, "
                              f"e.g. ['timestamp', *{self.partition_cols}] >> DifferenceLag(...)")
        cols = []
        for col in values:
            if col.dtype == "bool":
                raise TypeError(f"DifferenceLag cannot subtract bool column {col.name!r}")
            check_numeric(self, col)
            dtype = col.dtype if col.dtype.startswith("float") else "int64"
            cols += [ColumnSchema(f"{col.name}_difference_lag_{s}", dtype, frozenset({Tags.CONTINUOUS}))
                     for s in self.shifts]
        return Schema(cols)

    def transform(self, table: pa.Table) -> pa.Table:
        n = table.num_rows
        keys = [plain(table.column(k)) for k in self.partition_cols]
        data = {}
        for name in table.column_names:
            if name in self.partition_cols:
                continue
            x = plain(table.column(name))
            if not pa.types.is_floating(x.type):
                x = x.cast(pa.int64())
            for s in self.shifts:
                out = pa.nulls(n, x.type)
                if abs(s) < n:
                    cur, prev = (slice(s, n), slice(0, n - s)) if s > 0 else (slice(0, n + s), slice(-s, n))
                    same = pa.array(np.ones(n - abs(s), dtype=bool))
                    for k in keys:
                        same = pc.and_(same, pc.fill_null(pc.equal(k[cur], k[prev]), False))
                    diff = pc.if_else(same, pc.subtract_checked(x[cur], x[prev]), pa.scalar(None, x.type))
                    pad = pa.nulls(abs(s), x.type)
                    out = pa.concat_arrays([pad, diff] if s > 0 else [diff, pad])
                data[f"{name}_difference_lag_{s}"] = out
        return pa.table(data)

"""Row selection: which of a partition's stored rows a Dataset keeps.

A Dataset's ``filters=`` (:class:`ExprFilter`) and its split (:class:`RandomSplit`
from ``split``, :class:`ValueSplit` from ``split_by_value``) are row filters: each
names the ``columns`` it reads and gives a boolean ``mask(table, num_rows,
piece_index)`` over a partition's rows as stored. A random split reads no column
(its draws come from ``numpy.random.default_rng([seed, piece_index])``), so
counting its rows reads nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tabstream.core.errors import SchemaError
from tabstream.pipeline.unify import plain_type

__all__ = ["ExprFilter", "RandomSplit", "ValueSplit", "random_splits", "value_splits"]


class RandomSplit:
    columns: tuple[str, ...] = ()

    def __init__(self, seed: int, bounds: np.ndarray, k: int) -> None:
        self.seed, self.bounds, self.k = seed, bounds, k

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        # One draw per stored row of the partition: the same with or without filters,
        # and countable without reading anything.
        u = np.random.default_rng([self.seed, piece_index]).random(num_rows)
        return np.searchsorted(self.bounds, u, side="right") == self.k


class ValueSplit:
    def __init__(self, column: str, values: list[Any]) -> None:
        self.column, self.values = column, values
        self.columns = (column,)

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        assert table is not None
        col = table.column(self.column)
        keep = pc.fill_null(pc.is_in(col, value_set=pa.array(self.values, type=col.type)), False)
        return keep.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _split_values(column: str, col_type: pa.DataType, values: list[Any], group: int) -> list[Any]:
    """``values`` as values of the column's type (a str for an int column fails
    here, when the split is made, not when its rows are first read)."""
    def wrong(value: Any) -> TypeError:
        return TypeError(f"split_by_value({column!r}): the value {value!r} ({type(value).__name__}) of group "
                         f"{group} is not a {col_type} value, the type of column {column!r}")

    try:
        cast = pa.array(values, type=col_type).to_pylist()
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        for value in values:
            try:
                pa.array([value], type=col_type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
                raise wrong(value) from exc
        raise
    # Arrow truncates 2.5 to 2 for an int column: a value must survive the cast.
    for value, got in zip(values, cast, strict=True):
        if not (got == value or (got != got and value != value)):
            raise wrong(value)
    return cast


class ExprFilter:
    """``Dataset(..., filters=...)``: DNF tuples or a ``pyarrow.compute.Expression``."""

    def __init__(self, filters: Any, schema: pa.Schema) -> None:
        if isinstance(filters, pc.Expression):
            expr = filters
        elif isinstance(filters, (list, tuple)):
            try:
                expr = pq.filters_to_expression(list(filters))
            except (TypeError, ValueError) as exc:
                raise ValueError(
                    f"cannot read filters={filters!r}: {exc}; expected e.g. [('day', '<', 7)] or "
                    "a pyarrow.compute.Expression"
                ) from exc
        else:
            raise TypeError(
                f"filters must be a list of (column, op, value) tuples or a "
                f"pyarrow.compute.Expression, got {type(filters).__name__} {filters!r}"
            )
        self.expr = expr
        empty = schema.empty_table()
        try:
            result = self._evaluate(empty)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            reason = " ".join(str(exc).split())
            raise SchemaError(
                f"filters {expr} do not apply to this dataset: {reason}; columns: {schema.names}"
            ) from exc
        if not pa.types.is_boolean(result.type):
            raise TypeError(f"filters {expr} give {result.type} values; a filter must give "
                            "true/false per row, e.g. pc.field('day') < 7")
        # The columns the expression reads: those it cannot do without.
        needed = []
        for name in schema.names:
            try:
                self._evaluate(empty.drop_columns([name]))
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
                needed.append(name)
        if not needed:
            raise ValueError(f"filters {expr} read no column, so they keep all rows or none; "
                             f"name a column, e.g. [('day', '<', 7)]; columns: {schema.names}")
        self.columns = tuple(needed)

    def _evaluate(self, table: pa.Table) -> pa.ChunkedArray:
        import pyarrow.dataset as pds

        return pds.dataset(table).to_table(columns={"keep": self.expr}).column("keep")

    def mask(self, table: pa.Table | None, num_rows: int, piece_index: int) -> np.ndarray:
        assert table is not None
        keep = pc.fill_null(self._evaluate(table.select(list(self.columns))), False)
        return keep.to_numpy().astype(bool, copy=False) if num_rows else np.zeros(0, dtype=bool)


def random_splits(fractions: Sequence[float], seed: int) -> list[RandomSplit]:
    """The row filters of ``Dataset.split(fractions, seed)``, one per split."""
    fractions = [float(f) for f in fractions]
    if not fractions or any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-6:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions}")
    bounds = np.cumsum(fractions)
    bounds[-1] = np.inf
    return [RandomSplit(seed, bounds, k) for k in range(len(fractions))]


def value_splits(column: str, groups: Sequence[Sequence[Any]], schema: pa.Schema) -> list[ValueSplit]:
    """The row filters of ``Dataset.split_by_value(column, groups)``, one per group;
    ``schema`` is the Dataset's Arrow schema."""
    if column not in schema.names:
        raise SchemaError(f"cannot split on {column!r}: not in the dataset; available: {schema.names}")
    col_type = plain_type(schema.field(column).type)
    cast_groups: list[list[Any]] = []
    owner: dict[Any, int] = {}  # value -> the group that has it
    for g, values in enumerate(groups):
        cast = _split_values(column, col_type, list(values), g)
        for value in cast:
            if value in owner and owner[value] != g:
                raise ValueError(
                    f"split_by_value({column!r}): the value {value!r} is in group {owner[value]} and in "
                    f"group {g}; its rows would be in both splits: give each value to one group"
                )
            owner[value] = g
        cast_groups.append(cast)
    return [ValueSplit(column, values) for values in cast_groups]

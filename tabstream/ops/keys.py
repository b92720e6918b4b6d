"""Key helpers shared by the ops that group or join by category columns
(TargetEncoding, JoinGroupby, JoinExternal): key normalization, distinct keys and
their codes, lookups of keys in fitted statistics, and parameter checks.

Category values are compared as values: null and NaN are one key (the missing
one), ``-0.0`` is the key ``0.0``; keys meet as numbers or as strings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.dtypes import widen_half
from tabstream.core.errors import SchemaError
from tabstream.core.operators import held_index
from tabstream.core.schema import Schema
from tabstream.ops.numeric import plain

FOLD = "__fold__"

__all__ = ["group_codes", "key_column", "lookup", "missing_key"]


# -- grouping helpers -------------------------------------------------------------
def key_column(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """A key column as one plain array, missing values normalized by the backend's
    ``normalize_missing`` (NaN becomes null, ``-0.0`` becomes ``0.0``)."""
    return backend().normalize_missing(plain(column))


def missing_key(keys: pa.Table) -> np.ndarray:
    """True where any key of a row is missing (null, or NaN in a float column)."""
    out = np.zeros(keys.num_rows, dtype=bool)
    for name in keys.column_names:
        out |= np.asarray(pc.is_null(key_column(keys.column(name))).to_numpy(zero_copy_only=False), dtype=bool)
    return out


def group_codes(keys: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Distinct rows of ``keys`` and the index of each row's distinct row.

    Missing values are values: null and NaN of a column form one key (returned as
    null), and ``-0.0`` is the key ``0.0``.
    """
    cols = {name: key_column(keys.column(name)) for name in keys.column_names}
    codes = np.zeros(keys.num_rows, dtype=np.int64)
    for column in cols.values():
        # float16 hashed as float32 (exact): pyarrow before 26 has no half-float kernel
        enc = pc.dictionary_encode(widen_half(column), null_encoding="encode")
        col_codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        # re-densify after each column so codes stay below the row count (no overflow)
        _, codes = np.unique(codes * max(1, len(enc.dictionary)) + col_codes, return_inverse=True)
        codes = codes.reshape(-1).astype(np.int64)
    _, first = np.unique(codes, return_index=True)
    return pa.table(cols).take(first), codes


def check_distinct_keys(table: pa.Table, columns: list[str], what: str) -> None:
    """Refuse a saved statistics table that lists a key (the values of ``columns``)
    more than once: lookups would find one of its rows and leave the others' keys
    without statistics. ``ValueError`` naming ``what`` and the first repeated key."""
    if not columns or table.num_rows == 0:
        return
    _, codes = group_codes(table.select(columns))
    counts = np.bincount(codes)
    if len(counts) < table.num_rows:
        row = int(np.flatnonzero(counts[codes] > 1)[0])
        key = {c: table.column(c)[row].as_py() for c in columns}
        raise ValueError(f"{what} lists the key {key} more than once ({table.num_rows} rows, "
                         f"{len(counts)} distinct keys); each key is listed once")


def common_key_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """Type both key columns are compared in: numbers as numbers, strings as strings."""
    if a == b:
        return a
    if all(pa.types.is_integer(t) or pa.types.is_floating(t) for t in (a, b)):
        return pa.float64() if pa.types.is_floating(a) or pa.types.is_floating(b) else pa.int64()
    if all(pa.types.is_string(t) or pa.types.is_large_string(t) for t in (a, b)):
        return pa.large_string()
    return None


def lookup(table_keys: pa.Table, keys: pa.Table, op: str,
           against: str = "the fitted statistics' key", indexes: dict | None = None,
           source: Any = None) -> np.ndarray:
    """Row of ``table_keys`` (distinct rows) equal to each row of ``keys``; -1 where none.

    ``indexes``: a dict the caller keeps beside ``source`` (the fitted object
    ``table_keys`` comes from) and empties when it fits again. A key of one column is
    then looked up through the backend's vocabulary index over ``table_keys``, built
    on the first call and kept (see :meth:`~tabstream.backends.base.Backend.vocabulary_index`):
    otherwise every call codes the fitted keys together with the given ones, which
    costs as much as the fitted keys are many (100k rows against about 1M fitted
    keys: 90-153 ms, through the index 5-10 ms; benchmarks/RESULTS.md, session 12)."""
    if indexes is not None and table_keys.num_columns == 1 and keys.num_columns == 1:
        found = _indexed_lookup(table_keys, keys, indexes, source)
        if found is not None:
            return found
    stored, given = {}, {}
    for field, name in zip(table_keys.schema, keys.column_names):
        mine, theirs = plain(table_keys.column(field.name)), plain(keys.column(name))
        common = common_key_type(mine.type, theirs.type)
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


def _indexed_lookup(table_keys: pa.Table, keys: pa.Table, indexes: dict, source: Any) -> np.ndarray | None:
    """:func:`lookup` of one key column through a vocabulary index; None where there is
    none (too few keys, a missing key among them, floats, types that do not meet):
    the caller codes the keys instead (and reports types that do not meet)."""
    field, given = table_keys.schema.field(0), keys.column(0)
    given_type = given.type.value_type if pa.types.is_dictionary(given.type) else given.type
    common = common_key_type(field.type, given_type)
    if common is None:
        return None
    kernels = backend()
    try:
        # a fitted missing key (null) or float keys get no index: they are coded instead
        index = held_index(indexes, (type(kernels), field.name, common), source,
                           lambda: kernels.vocabulary_index(plain(table_keys.column(0)).cast(common)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # the coded lookup casts again and raises the TypeError naming the column
    if index is None:
        return None
    try:
        theirs = plain(given).cast(common)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # as above: a value that does not fit (uint64 past int64) is reported there
    hit = kernels.vocabulary_positions(index, theirs)
    if hit is None:
        return None
    found, non_null_only = hit
    if not theirs.null_count:
        return np.asarray(found, dtype=np.int64)
    # a missing key matches nothing: the fitted keys hold none
    valid = np.asarray(pc.is_valid(theirs).to_numpy(zero_copy_only=False), dtype=bool)
    if non_null_only:
        out = np.full(len(theirs), -1, dtype=np.int64)
        out[valid] = found
        return out
    out = np.asarray(found, dtype=np.int64)
    out[~valid] = -1
    return out


def names_and_nodes(value: Any, what: str, op: str) -> tuple[list[str], list[Any]]:
    """Column names given as a name, a list of names, a workflow node or a list
    mixing them (NVTabular takes a node as TargetEncoding's target or JoinGroupby's
    ``cont_cols``): ``(the names, the nodes)``. A node's names are the columns it
    outputs, worked out from the names it selects."""
    from tabstream.core.graph import ColumnSelector, Node

    items = list(value) if isinstance(value, (list, tuple)) else [value]
    names: list[str] = []
    nodes: list[Any] = []
    for item in items:
        if isinstance(item, ColumnSelector) and not item.tags:
            item = item.names
        if isinstance(item, Node):
            try:
                produced = item.output_names_from_selection()
            except TypeError as exc:
                raise TypeError(f"{op}: {what}: {exc}") from exc
            nodes.append(item)
            names += [n for n in produced if n not in names]
        elif isinstance(item, list) and all(isinstance(n, str) for n in item):
            names += [n for n in item if n not in names]
        elif isinstance(item, str):
            if item not in names:
                names.append(item)
        else:
            names = []
            break
    if not names:
        raise TypeError(f"{op}: {what} must be a column name, a non-empty list of names or a "
                        f"workflow node, got {value!r}")
    return names, nodes


def dependencies_of(names: Sequence[str], nodes: Sequence[Any]) -> list[Any]:
    """What ``cols >> op`` adds to the op's input: the nodes, then the names no node
    produces (see :meth:`Operator.dependencies`)."""
    produced = {n for node in nodes for n in node.output_names_from_selection()}
    return [*nodes, *(n for n in names if n not in produced)]


def column_names_of(value: Any, what: str, op: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise TypeError(f"{op}: {what} must be a column name or a non-empty list of names, got {value!r}")
    return names


def check_groups(cat_groups: Any, op: str) -> list[str | list[str]] | None:
    if cat_groups is None:
        return None
    if not isinstance(cat_groups, (list, tuple)) or not cat_groups:
        raise TypeError(f"{op}: cat_groups must be a non-empty list of names or lists of names, got {cat_groups!r}")
    return [g if isinstance(g, str) else column_names_of(g, "each entry of cat_groups", op) for g in cat_groups]


def resolve_groups(op: Any, available: Sequence[str], exclude: Sequence[str]) -> list[list[str]]:
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


def check_scalar_categories(op: Any, input_schema: Schema, groups: list[list[str]]) -> None:
    lists = [c for g in groups for c in g if input_schema[c].is_list]
    if lists:
        raise TypeError(f"{type(op).__name__} needs scalar category columns, but {lists} hold lists")


def require_selected(names: Sequence[str], schema_names: Sequence[str], op: str, role: str) -> None:
    missing = [n for n in names if n not in schema_names]
    if missing:
        raise SchemaError(f"{op}: {role} {missing} must be part of the op's selection; it "
                          f"selects {list(schema_names)}: select {list(schema_names) + missing} >> {op}(...)")


def with_columns(keys: pa.Table, cols: dict[str, np.ndarray]) -> pa.Table:
    for name, values in cols.items():
        keys = keys.append_column(name, pa.array(values))
    return keys


def sum_by_keys(tables: Sequence[pa.Table], keys: list[str]) -> pa.Table:
    """Sum every non-key column per distinct key (the backend's group-by); keys are
    normalized first, so null and NaN are one key and ``-0.0`` is ``0.0``."""
    kernels = backend()
    merged = kernels.concat(tables)
    merged = pa.table({name: key_column(merged.column(name)) if name in keys else merged.column(name)
                       for name in merged.column_names})
    values = [name for name in merged.column_names if name not in keys]
    return kernels.groupby_aggregate(merged, keys, [(name, "sum", name) for name in values])

"""Ops that aggregate per category or per key and join the result back to the rows.

One module each: :mod:`~tabstream.ops.target_encoding` (TargetEncoding),
:mod:`~tabstream.ops.join_groupby` (JoinGroupby), JoinExternal here, and
:mod:`~tabstream.ops.difference_lag` (DifferenceLag); their shared key handling is
:mod:`~tabstream.ops.keys`. All four names still import from here.

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

from tabstream.backends import current as backend
from tabstream.backends import frame_kinds, frame_to_arrow
from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type
from tabstream.core.errors import DataError, NotFittedError, SchemaError
from tabstream.core.operators import StatOperator
from tabstream.core.schema import ColumnSchema, Schema
from tabstream.ops.difference_lag import DifferenceLag
from tabstream.ops.join_groupby import JoinGroupby
from tabstream.ops.keys import (
    column_names_of,
    common_key_type,
    group_codes,
    lookup,
    missing_key,
    require_selected,
)
from tabstream.ops.numeric import plain
from tabstream.ops.target_encoding import TargetEncoding

__all__ = ["DifferenceLag", "JoinExternal", "JoinGroupby", "TargetEncoding"]



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

    >>> import pyarrow as pa
    >>> side = pa.table({"k": [1.0, 1.0, -0.0, None], "w": [5, 5, 6, 7]})
    >>> t = pa.table({"k": [1.0, 0.0, float("nan")]})
    >>> JoinExternal(side, on="k").fit_table(t).transform(t).to_pydict()   # 1.0 twice
    {'k': [1.0, 1.0, 0.0, nan], 'w': [5, 5, 6, None]}
    >>> op = JoinExternal(side, on="k", drop_duplicates_ext=True)
    >>> op.fit_table(t).transform(t).to_pydict()
    {'k': [1.0, 0.0, nan], 'w': [5, 6, None]}
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = dict[str, Any]()  # no JSON values: the side table is the state
    state_tables = {"side": {}}

    def __init__(self, df_ext: Any, on: str | list[str], how: str = "left",
                 on_ext: str | list[str] | None = None, columns_ext: list[str] | None = None,
                 drop_duplicates_ext: bool = False, first_match_only: bool = False,
                 kind_ext: str | None = None, cache: str = "host") -> None:
        super().__init__()
        op = "JoinExternal"
        keys = column_names_of(on, "on", op)
        keys_ext = keys if on_ext is None else column_names_of(on_ext, "on_ext", op)
        if len(keys_ext) != len(keys):
            raise ValueError(f"{op}: on {keys} and on_ext {keys_ext} must have the same length")
        if how not in ("left", "inner"):
            raise ValueError(f"{op}: how must be 'left' or 'inner', got {how!r}")
        if columns_ext is not None:
            column_names_of(columns_ext, "columns_ext", op)
        for name, flag in (("drop_duplicates_ext", drop_duplicates_ext), ("first_match_only", first_match_only)):
            if not isinstance(flag, (bool, np.bool_)):
                raise TypeError(f"{op}: {name} must be True or False, got {flag!r}")
        kinds = ("parquet", "csv", *frame_kinds())
        if kind_ext is not None and kind_ext not in kinds:
            raise ValueError(f"{op}: kind_ext must be None (inferred) or one of {list(kinds)}, "
                             f"got {kind_ext!r}")
        if cache not in ("host", "device"):
            raise ValueError(f"{op}: cache must be 'host' or 'device', got {cache!r}")
        self._table: pa.Table | None = None
        if not isinstance(df_ext, (pd.DataFrame, pa.Table, str, os.PathLike)) and df_ext is not None \
                and callable(getattr(df_ext, "compute", None)):
            # a dask DataFrame or a tabstream Dataset (NVTabular takes both): the side
            # table is small; it is read into memory once, here
            df_ext = _computed_frame(df_ext, op)
        if isinstance(df_ext, pd.DataFrame):
            self._table = pa.Table.from_pandas(df_ext, preserve_index=False)
            df_ext = None
        elif isinstance(df_ext, pa.Table):
            self._table, df_ext = df_ext, None
        elif isinstance(df_ext, os.PathLike):
            df_ext = os.fspath(df_ext)
        elif df_ext is not None and not isinstance(df_ext, str):
            raise TypeError(f"{op}: df_ext must be a pandas or dask DataFrame, a pyarrow Table, a "
                            f"Dataset or a parquet/CSV path, got {type(df_ext).__name__}")
        self.df_ext = df_ext
        self.on = on if isinstance(on, str) else keys
        self.how = how
        self.on_ext = on_ext if on_ext is None or isinstance(on_ext, str) else keys_ext
        self.columns_ext = None if columns_ext is None else list(columns_ext)
        self.drop_duplicates_ext = bool(drop_duplicates_ext)
        self.first_match_only = bool(first_match_only)
        # where NVTabular keeps the side table ("host"/"device"): tabstream's joins
        # read it from host memory; kept for NVTabular's signature
        self.kind_ext = kind_ext
        self.cache = cache
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
            is_csv = self.kind_ext == "csv" or (self.kind_ext is None and path.lower().endswith(
                (".csv", ".csv.gz", ".tsv", ".tsv.gz")))
            try:
                self._table = _read_csv(fs, path) if is_csv else pq.read_table(path, filesystem=fs)
            except FileNotFoundError as exc:
                raise FileNotFoundError(f"JoinExternal: side table {self.df_ext!r} does not exist; "
                                        "pass an existing parquet file or folder") from exc
            except (pa.ArrowInvalid, OSError) as exc:
                kind = "CSV" if is_csv else "parquet"
                raise DataError(f"JoinExternal: cannot read side table {self.df_ext!r} as {kind} "
                                f"({exc}); pass a parquet file or folder, a CSV file (kind_ext='csv'), "
                                "or a DataFrame") from exc
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
        require_selected(self.keys, input_schema.column_names, "JoinExternal", "key columns")
        payload = self._side()[0]
        assert self._table is not None
        for key, key_ext in zip(self.keys, self.keys_ext):
            col, side_type = input_schema[key], plain(self._table.column(key_ext)).type
            if col.dtype != "unknown" and not col.is_list and \
                    common_key_type(dtype_to_arrow_type(col.dtype), side_type) is None:
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
        # the join itself runs on the side rows' key groups (int64, null = no key)
        left = pa.table({"g": pa.array(group, mask=group < 0)})
        rows, side_rows = backend().join_indices(left, pa.table({"g": codes}), ["g"], how=self.how)
        out = backend().take(table, rows)
        side = backend().take(payload, side_rows)
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


def _computed_frame(frame: Any, op: str) -> pa.Table:
    """A dask DataFrame's or Dataset's rows as one Arrow table: ``compute()``, then
    the backend that owns the resulting frame converts it
    (:func:`tabstream.backends.frame_to_arrow`)."""
    result = frame.compute()
    if isinstance(result, pa.Table):
        return result
    if not hasattr(result, "columns"):
        raise TypeError(f"{op}: df_ext.compute() gave {type(result).__name__}, not a DataFrame")
    return frame_to_arrow(result).replace_schema_metadata(None)


def _read_csv(fs: Any, path: str) -> pa.Table:
    """A CSV side table (header line, types inferred; ``.tsv``: tab separated)."""
    import pyarrow.csv as pv

    tab = path.lower().endswith((".tsv", ".tsv.gz"))
    with fs.open(path, "rb", compression="infer") as f:
        return pv.read_csv(f, parse_options=pv.ParseOptions(delimiter="\t" if tab else ","))

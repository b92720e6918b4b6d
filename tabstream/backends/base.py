"""The kernel interface every backend implements.

Ops see a partition as a ``pyarrow.Table`` and call these kernels for the work
itself; a backend runs them on its own device (the arrow backend with pyarrow and
numpy on the CPU, the cudf backend with cudf and cupy on a GPU) and hands back
Arrow. Partial statistics and fitted state are therefore Arrow tables or JSON on
every backend, and a workflow fitted on one backend transforms on another with the
same ids.

The contract suite in ``tests/backends/`` is the specification: every kernel and
every op of the catalog must give the arrow backend's result (ids exactly, floats
to 1e-6). A new backend subclasses :class:`Backend`, implements each abstract
method and registers in :mod:`tabstream.backends`.

Conventions, shared by all kernels:

* ``column`` is a ``pyarrow.Array`` or ``ChunkedArray``; a kernel returns an Arrow
  array (chunked or not) of the same length unless it says otherwise.
* *missing* means null or NaN; ``-0.0`` and ``0.0`` are one value.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.hashing import DEFAULT_SEED, HashResult

__all__ = ["AGGREGATIONS", "Backend", "Column", "hll_rho", "slice_plan"]

Column = pa.Array | pa.ChunkedArray

#: aggregation names :meth:`Backend.groupby_aggregate` accepts; "count" counts
#: non-null values, "size" counts rows; "sum" of a group without values is 0
#: (pandas); "std"/"var" use ddof=1 (null below two values); "list" holds the
#: group's values in row order, nulls kept
AGGREGATIONS = ("sum", "count", "size", "mean", "min", "max", "first", "last", "std", "var", "list")


class Backend(abc.ABC):
    """Kernels ops call. One instance per backend; stateless and thread-safe."""

    #: registry name ("arrow", "cudf")
    name: ClassVar[str]
    #: True when the kernels run on a GPU
    gpu: ClassVar[bool] = False

    def __repr__(self) -> str:
        return f"<tabstream backend {self.name!r}>"

    # -- beside the kernels: what the pipeline asks of a backend -------------------
    # The pipeline and the loaders never branch on a backend's name: a Dataset asks
    # its backend for these. The defaults are the host's (pyarrow reads, pandas frames).

    #: True when :meth:`read_parquet_row_groups` decodes with a reader of its own
    reads_parquet: ClassVar[bool] = False

    def read_parquet_row_groups(self, source: Any, row_groups: Sequence[int],
                                columns: Sequence[str]) -> pa.Table:
        """Row groups of one parquet file (a local path or an open binary file), only
        ``columns``, decoded by this backend's reader and handed back as Arrow; only
        called where :attr:`reads_parquet` (else the Dataset reads with pyarrow)."""
        raise NotImplementedError(f"the {self.name} backend has no parquet reader of its own")

    @staticmethod
    def owns_frame(frame: Any) -> bool:
        """Whether ``frame`` (a partition, or the ``_meta``, of a dask DataFrame given
        as input) is this backend's frame type. Checked without importing a library."""
        return type(frame).__module__.split(".")[0] == "pandas"

    def frame_to_arrow(self, frame: Any) -> pa.Table:
        """One of this backend's frames as an Arrow table, without its index."""
        return pa.Table.from_pandas(frame, preserve_index=False)

    def dask_frame(self, read: Any, pieces: Sequence[Any], schema: pa.Schema) -> Any:
        """A dask DataFrame of this backend's frames, one partition per piece:
        ``read(piece)`` gives the piece as an Arrow table with ``schema``."""
        import dask.dataframe as dd

        from tabstream.core.dtypes import arrow_to_pandas

        return dd.from_map(_PandasPartition(read), list(pieces), meta=arrow_to_pandas(schema.empty_table()),
                           enforce_metadata=False)

    # -- missing values --------------------------------------------------------
    @abc.abstractmethod
    def normalize_missing(self, column: Column) -> Column:
        """NaN (also inside lists) becomes null and ``-0.0`` becomes ``0.0``; other
        values and types pass through. The one definition of "missing" of every op."""

    @abc.abstractmethod
    def is_missing(self, column: Column) -> Column:
        """bool per row, never null: True where the value is null or NaN."""

    @abc.abstractmethod
    def fill_missing(self, column: Column, value: Any) -> Column:
        """Nulls (and NaN of a float column) replaced by ``value``; the column's type
        is kept, so cast first when ``value`` needs a wider one."""

    # -- element-wise arithmetic ---------------------------------------------
    @abc.abstractmethod
    def clip(self, column: Column, lower: Any | None, upper: Any | None) -> Column:
        """Values limited to ``[lower, upper]`` (either may be None); nulls and NaN are
        kept, ±inf is bounded like any value. Bounds are of the column's type."""

    @abc.abstractmethod
    def log1p(self, column: Column) -> Column:
        """``log(1 + x)`` as float32 computed in float64; nulls stay null; below -1 NaN,
        at -1 -inf (numpy's log1p)."""

    @abc.abstractmethod
    def moments(self, column: Column) -> tuple[int, float, float]:
        """``(n, mean, m2)`` of the finite values (nulls, NaN and ±inf left out), ``m2``
        the sum of squared deviations from the mean; ``(0, 0.0, 0.0)`` when none."""

    @abc.abstractmethod
    def standardize(self, column: Column, mean: float, std: float) -> Column:
        """``(x - mean) / std`` (only ``x - mean`` when ``std`` is 0) as float32,
        computed in float64; nulls stay null."""

    # -- categorical -----------------------------------------------------------
    @abc.abstractmethod
    def value_counts(self, column: Column) -> pa.Table:
        """Distinct non-missing values and their counts, ``(values, counts int64)``, in
        any order; list columns count their elements. Missing values are normalized
        first (NaN is missing, ``-0.0`` counts as ``0.0``). A dictionary column (as
        parquet's dictionary-encoded pages read) counts its values, whatever its
        chunks' dictionaries (they may differ, hold unused or repeated entries, a
        null or NaN entry); the values come back of the dictionary's value type."""

    @abc.abstractmethod
    def encode(self, column: Column, vocabulary: pa.Array) -> pa.Array:
        """int64 position of each value in ``vocabulary`` (same type as ``column``, or
        as its dictionary's values for a dictionary column), null where the value is
        not in it or is null."""

    def vocabulary_index(self, vocabulary: pa.Array) -> Any:
        """A lookup structure over ``vocabulary`` (distinct values, no null) that
        :meth:`encode_ids` may be given with it, for a vocabulary that encodes many
        partitions: built once instead of once per call. None (this default) where
        the backend has none worth building; the caller then passes None. Never part
        of fitted state: rebuilt in each process that encodes."""
        return None

    def vocabulary_positions(self, index: Any, column: Column) -> tuple[np.ndarray, bool] | None:
        """Position in the vocabulary of ``index`` (what :meth:`vocabulary_index`
        built) of each value of ``column``, -1 where absent, and whether the positions
        cover the non-null values only (True) or every row (the nulls' entries then
        mean nothing); None where the index cannot read the column (the caller looks
        the values up another way). This default has no index to read."""
        return None

    def encode_ids(self, column: Column, vocabulary: pa.Array, start: int, missing: int,
                   unknown: int, index: Any = None) -> pa.Array:
        """int64 id of each value without nulls: its position in ``vocabulary`` plus
        ``start``; ``missing`` for a null, ``unknown`` for a value not in it. The same
        as :meth:`encode` followed by those three rules (what this default does);
        backends may compute it in fewer passes. ``index``: what
        :meth:`vocabulary_index` built from ``vocabulary``, or None; it changes no
        result."""
        ids = pc.add(self.encode(column, vocabulary), start)
        return pc.if_else(pc.is_null(column), pa.scalar(missing, pa.int64()),
                          pc.coalesce(ids, pa.scalar(unknown, pa.int64())))

    @abc.abstractmethod
    def murmur3(self, column: Column, seed: int = DEFAULT_SEED) -> HashResult:
        """MurmurHash3 (x86, 32 bit) of each value as numpy uint32 plus a numpy bool
        null mask: the exact function of :func:`tabstream.core.hashing.murmur3_32`
        (pinned by known-answer tests), so ids agree on every backend."""

    def spill_buckets(self, column: Column, buckets: int) -> np.ndarray:
        """The bucket in ``[0, buckets)`` (numpy ``int64``) of each value, for the
        hash-partitioned spills of a fit: a function of the value alone, so that every
        partial of the fit puts a value in the same bucket (null: bucket 0). Here
        :meth:`murmur3` modulo ``buckets``; a backend may hash faster, since buckets
        live only within one fit."""
        return self.murmur3(column).hashes.astype(np.int64) % buckets

    # -- relational ------------------------------------------------------------
    @abc.abstractmethod
    def groupby_aggregate(self, table: pa.Table, keys: Sequence[str],
                          aggregations: Sequence[tuple[str, str, str]]) -> pa.Table:
        """One row per distinct key (nulls form one group), columns ``keys`` then one
        per ``(column, aggregation, output_name)``; ``aggregation`` is one of
        :data:`AGGREGATIONS`. Row order is unspecified."""

    @abc.abstractmethod
    def join(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
             how: str = "left") -> pa.Table:
        """``left`` joined with ``right`` on ``keys`` (``how``: "left" or "inner"),
        keeping ``left``'s row order; a null key matches nothing. ``right`` must have
        one row per key (a lookup table): the result has at most ``left``'s rows."""

    # -- lists -----------------------------------------------------------------
    @abc.abstractmethod
    def list_flatten(self, column: Column) -> pa.Array:
        """The child values a list column's offsets cover, in order (a null list may
        cover some; they are kept, so that ``from_arrays(list_offsets(c), f(values))``
        re-wraps any element-wise ``f`` exactly)."""

    @abc.abstractmethod
    def list_offsets(self, column: Column) -> pa.Array:
        """int32/int64 offsets (length rows + 1, starting at 0) into
        :meth:`list_flatten`'s result."""

    # -- rows ------------------------------------------------------------------
    @abc.abstractmethod
    def take(self, table: pa.Table, indices: np.ndarray | pa.Array) -> pa.Table:
        """The rows at ``indices``, in that order; a null index gives a row of nulls."""

    @abc.abstractmethod
    def filter(self, table: pa.Table, mask: Column | np.ndarray) -> pa.Table:
        """The rows where ``mask`` is True (null counts as False)."""

    @abc.abstractmethod
    def concat(self, tables: Sequence[pa.Table]) -> pa.Table:
        """Rows of ``tables`` one after another; columns missing in some are null, and
        types are widened where they differ (int32 + int64 -> int64)."""

    # -- user functions (LambdaOp, Filter) -----------------------------------------
    @abc.abstractmethod
    def to_frame(self, table: pa.Table) -> Any:
        """The partition as the DataFrame a user's function receives (pandas on the
        arrow backend, cudf on the cudf backend); nulls stay nulls."""

    @abc.abstractmethod
    def from_frame(self, frame: Any) -> pa.Table:
        """A user function's DataFrame result back as Arrow (the index is dropped)."""

    @abc.abstractmethod
    def from_user_column(self, values: Any) -> pa.Array:
        """One column a user's function returned (a Series of :meth:`to_frame`'s kind,
        an array or a list) as an Arrow array; missing values (None, NA, NaN of
        non-float data) become nulls. Raises ``pyarrow.ArrowInvalid`` or
        ``ArrowTypeError`` when the values do not convert."""

    # -- kernels added for issue 9 (ops behind the backend) ---------------------------
    @abc.abstractmethod
    def digitize(self, column: Column, boundaries: Sequence[float]) -> pa.Array:
        """int64 bucket of each value: how many of the sorted ``boundaries`` are ``<= x``
        (``numpy.digitize(x, boundaries, right=False)``); -inf is bucket 0, +inf the
        last; null and NaN give null."""

    @abc.abstractmethod
    def join_indices(self, left: pa.Table, right: pa.Table, keys: Sequence[str],
                     how: str = "left") -> tuple[pa.Array, pa.Array]:
        """A many-to-many join as row numbers: ``(left_rows, right_rows)``, both int64
        of one length, one pair per match, in ``left``'s row order and, within a left
        row, in ``right``'s row order. ``how="left"`` also keeps each left row without
        a match once, with a null right row; ``how="inner"`` drops it. A null key
        matches nothing; keys must be of one type on both sides (ops normalize them,
        e.g. to group ids, before)."""

    @abc.abstractmethod
    def list_lengths(self, column: Column) -> pa.Array:
        """int64 number of elements of each row of a list column; a null row is 0."""

    @abc.abstractmethod
    def list_slice(self, column: Column, start: int, end: int | None,
                   pad_length: int | None = None, pad_value: Any = None) -> pa.Array:
        """Each row's ``[start:end]`` with Python's slicing rules (negative indices count
        from the row's end; ``end=None`` is the row's end). A null row stays null. With
        ``pad_length`` every row has exactly that many elements, the slice's followed
        by ``pad_value`` (a null row becomes all ``pad_value``). The result is a list
        (large_list for a large_list input) of the element type."""


    @abc.abstractmethod
    def hll_registers(self, column: Column, precision: int) -> np.ndarray:
        """HyperLogLog registers (numpy uint8, ``2**precision`` of them) of the non-null
        values: each value's :meth:`murmur3` hash (default seed) picks a register by its
        top ``precision`` bits, which keeps the largest "leading zeros + 1" of the other
        bits. The same registers on every backend, so sketches merge across them."""


    @abc.abstractmethod
    def distinct(self, column: Column) -> pa.Array:
        """The distinct non-null values of a flat column, in any order (values compare
        as they are: normalize missing values first where NaN must not count)."""


    @abc.abstractmethod
    def min_max(self, column: Column) -> tuple[Any, Any]:
        """``(min, max)`` of the non-null values as Python scalars (list columns: of
        their elements); ``(None, None)`` when there are none."""

    @abc.abstractmethod
    def cast(self, column: Column, type_: pa.DataType) -> pa.Array:
        """``column`` as ``type_`` (lists cast element-wise); a value an integer target
        cannot hold raises ``pyarrow.ArrowInvalid``, never wraps around. Floats narrow
        as IEEE 754 rounds them (a finite value beyond float32 becomes inf)."""


    @abc.abstractmethod
    def split_strings(self, column: Column, separator: str) -> pa.Array:
        """``list<string>``: each string split on the literal ``separator`` (empty
        pieces kept, as ``str.split``); the empty string gives ``[]``, null stays null."""


    @abc.abstractmethod
    def sort_indices(self, table: pa.Table, sort_keys: Sequence[tuple[str, str]]) -> pa.Array:
        """int64 row order sorting ``table`` by ``sort_keys`` (``(column, "ascending" or
        "descending")``, the first key first): stable (ties keep row order), nulls last
        in either direction. Normalize NaN to null first where it must sort as missing."""


def slice_plan(offsets: Any, valid: Any, start: int, end: int | None, pad_length: int | None,
               xp: Any) -> tuple[Any, Any]:
    """Gather plan of :meth:`Backend.list_slice` on ``xp`` arrays (numpy or cupy).

    ``offsets`` (rows + 1, int64) and ``valid`` (bool per row) describe the list
    column; returns ``(new_offsets, idx)``: the output's offsets and, per output
    element, its index into the column's flattened values, ``-1`` for a pad element.
    """
    lengths = xp.where(valid, offsets[1:] - offsets[:-1], 0)
    def bound(i: int) -> Any:  # an index as Python reads it, per row, within [0, length]
        raw = xp.full_like(lengths, i) if i >= 0 else lengths + i
        return xp.minimum(xp.maximum(raw, 0), lengths)

    s = bound(start)
    e = lengths if end is None else bound(end)
    kept = xp.maximum(e - s, 0)
    first = offsets[:-1] + s  # flat index of each row's first kept element
    rows = len(lengths)
    if pad_length is not None:
        pos = xp.tile(xp.arange(pad_length, dtype=xp.int64), rows)
        idx = xp.where(pos < xp.repeat(kept, pad_length), xp.repeat(first, pad_length) + pos, -1)
        return xp.arange(rows + 1, dtype=xp.int64) * pad_length, idx
    new_offsets = xp.concatenate([xp.zeros(1, dtype=xp.int64), xp.cumsum(kept)])
    idx = (xp.arange(int(new_offsets[-1]), dtype=xp.int64)
           - xp.repeat(new_offsets[:-1], kept) + xp.repeat(first, kept))
    return new_offsets, idx


def hll_rho(hashes: Any, precision: int, xp: Any) -> tuple[Any, Any]:
    """(register, rank) of each uint32 hash on ``xp`` arrays (numpy or cupy): the top
    ``precision`` bits pick the register; the rank is the position of the first 1
    bit of the other ``32 - precision`` bits (their leading zeros + 1)."""
    h = hashes.astype(xp.uint64)
    width = 32 - precision
    rest = (h & ((1 << width) - 1)).astype(xp.float64)
    rank = width - xp.frexp(rest)[1] + 1  # frexp(0) has exponent 0: rank width + 1
    return (h >> width).astype(xp.int64), rank.astype(xp.uint8)


class _PandasPartition:
    """Picklable partition function of :meth:`Backend.dask_frame`: the Arrow table a
    reader gives, as a pandas DataFrame."""

    def __init__(self, read: Any) -> None:
        self.read = read

    def __call__(self, piece: Any) -> Any:
        from tabstream.core.dtypes import arrow_to_pandas

        return arrow_to_pandas(self.read(piece))

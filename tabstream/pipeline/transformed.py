"""The lazy result of ``workflow.transform(dataset)``: a fitted workflow applied to a
Dataset partition by partition, read as Arrow, pandas, a dask frame, or exported.

:class:`TransformedDataset` lives apart from :mod:`tabstream.pipeline.workflow` (which
makes it) so that the Groupby's regrouping (:mod:`tabstream.pipeline.regroup`, a
subclass) and the workflow depend on it, not on each other.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from dask import delayed

from tabstream import backends
from tabstream.core.dtypes import arrow_to_pandas
from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.execution import compute

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TransformedDataset", "client_for", "conform"]


class TransformedDataset:
    """The lazy result of ``workflow.transform(dataset)``."""

    def __init__(self, workflow: Any, dataset: Dataset) -> None:  # a fitted Workflow
        self.workflow = workflow
        self.dataset = dataset

    @property
    def schema(self) -> Schema:
        return self.workflow.output_schema

    @property
    def npartitions(self) -> int:
        return self.dataset.npartitions

    @functools.cached_property
    def _dictionary_columns(self) -> list[str]:
        # once per transformed dataset, not per partition (it walks the graph)
        return self.workflow.dictionary_columns(self.dataset)

    def read_piece(self, piece: Any) -> pa.Table:
        dictionary = self._dictionary_columns
        columns = self.workflow.input_columns
        table = (self.dataset.read_piece(piece, columns, dictionary) if dictionary
                 else self.dataset.read_piece(piece, columns))
        return self.workflow.transform_table(table, self.dataset.backend_name)

    def to_iter(self):
        for piece in self.dataset.pieces:
            yield arrow_to_pandas(self.read_piece(piece))

    def to_ddf(self):
        """A dask DataFrame of the transformed partitions (dask-cudf on the cudf backend)."""

        first = self.read_piece(self.dataset.pieces[0])
        return backends.get(self.dataset.backend_name).dask_frame(self.read_piece, self.dataset.pieces,
                                                                  first.schema)

    def compute(self) -> pd.DataFrame:
        """The whole transformed dataset in memory (small data only)."""
        tables = compute([delayed(self.read_piece)(p) for p in self.dataset.pieces],
                         client_for(self.workflow.client, self.dataset))
        return arrow_to_pandas(pa.concat_tables(tables))

    def to_parquet(self, output_path: str, dtypes: dict[str, Any] | None = None, **kwargs: Any):
        """Export the transformed dataset; ``dtypes={column: dtype}`` casts output
        columns safely (see :func:`tabstream.pipeline.export.export`);
        ``output_files`` (NVTabular's name) is ``num_files``."""
        from tabstream.pipeline.export import export

        nvt_only = sorted(k for k in ("cats", "conts", "labels", "preserve_files") if k in kwargs)
        if nvt_only:
            raise TypeError(f"to_parquet: {', '.join(nvt_only)} (NVTabular's) are not taken: the workflow's "
                            "output schema names and tags the exported columns (AddTags for more), and "
                            "files follow num_files / out_files_per_proc")
        if "output_files" in kwargs:  # NVTabular's name for the number of files
            if kwargs.get("num_files") is not None:
                raise TypeError("to_parquet: give num_files or output_files (NVTabular's name), not both")
            kwargs["num_files"] = kwargs.pop("output_files")
        kwargs.setdefault("client", client_for(self.workflow.client, self.dataset))
        return export(self.dataset, self.workflow, output_path, dtypes=dtypes, **kwargs)

    def to_npy(self, output_path: Any, append: bool = False) -> str:
        """The transformed dataset as one 2-D ``.npy`` array (see :meth:`Dataset.to_npy`)."""
        from tabstream.pipeline.npy import write_npy

        return write_npy(self.read_piece, self.dataset.pieces, output_path, append=append)


def client_for(client: Any, dataset: Any) -> Any:
    """The dask client a dataset's tasks run on: ``client`` when given; on the cudf
    backend with several GPUs, dask-cuda's LocalCUDACluster; else None (threads).
    See :func:`tabstream.backends.scheduler_for`."""
    return backends.execution_client(getattr(dataset, "backend_name", backends.DEFAULT_BACKEND), client)


def _with_leaf(t: pa.DataType, leaf: pa.DataType) -> pa.DataType:
    """``t`` with its values (a list's innermost values) of type ``leaf``."""
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_with_leaf(t.value_type, leaf), t.list_size)
    if pa.types.is_large_list(t):
        return pa.large_list(_with_leaf(t.value_type, leaf))
    if pa.types.is_list(t):
        return pa.list_(_with_leaf(t.value_type, leaf))
    return leaf


def conform(table: pa.Table, schema: Schema) -> pa.Table:
    """Cast input columns to the types the workflow was fitted on when they differ
    only in representation (pandas turns nullable ints into float64, say)."""
    from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type

    columns = []
    for name, col in zip(table.column_names, table.columns):
        expected = schema[name]
        dtype, is_list = arrow_type_to_dtype(col.type)
        if is_list == expected.is_list and dtype != expected.dtype and expected.dtype != "unknown":
            # a list column's elements too (the serving artifact casts them alike)
            target = _with_leaf(col.type, dtype_to_arrow_type(expected.dtype))
            try:
                col = col.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, TypeError) as exc:
                raise SchemaError(
                    f"input column {name!r} is {dtype}, but the workflow was fitted on "
                    f"{expected.dtype} and the values do not convert: {exc}"
                ) from exc
        columns.append(col)
    return pa.table(columns, names=table.column_names)

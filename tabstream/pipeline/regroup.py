"""Repartition by key for :class:`~tabstream.ops.Groupby` (every row of a key in one
partition), with bounded memory.

``workflow.transform(dataset)`` on a graph holding a Groupby node returns a
:class:`GroupedTransformedDataset`, which runs in two passes:

1. *scatter*, one task per input partition: read it, compute the Groupby node's
   input (the ops before it), hash each row's key into one of ``B`` buckets
   (``B`` = the partitions the columns the workflow reads fill at ``part_size``,
   at most the input's partition count ``P``) and write the rows of each bucket to
   ``b<bucket>/p<partition>.parquet`` under a spill folder;
2. *group*, one task per bucket: read the bucket's files in partition order (so the
   rows keep their input order, which ``sort_cols`` ties and ``list`` rely on), apply
   the Groupby and the ops after it.

A task holds one input partition (pass 1) or one bucket (pass 2), never the
dataset; a bucket is about one partition's size unless a single key owns a large
share of the rows (all of a key's rows are always in one bucket). Pass 1 writes
up to ``B`` small files per partition, as export's ``shuffle="full"`` does. The spill folder of ``to_parquet`` is a hidden sibling of the output
folder on the output filesystem (so the workers of a distributed client share it),
named like export's temporary folder (``.out.tmp-<host>-<pid>-<id>``), removed
afterwards, or by the next export to the same place when this one was killed; ``to_iter``/``compute``/``to_ddf`` spill to a local temporary
folder removed with the returned object.

Limits: one Groupby per workflow, and no statistics op after it (its statistics
would be fitted on ungrouped partitions): fit and transform those in a second
workflow on the grouped export.
"""

from __future__ import annotations

import math
import posixpath
import shutil
import tempfile
import uuid
import weakref
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from dask import delayed

from tabstream import backends
from tabstream.core.dtypes import arrow_to_pandas
from tabstream.core.graph import Node, check_produced, concat_tables
from tabstream.pipeline import execution
from tabstream.pipeline.dataset import Dataset
from tabstream.pipeline.execution import compute
from tabstream.pipeline.transformed import TransformedDataset, conform

__all__ = ["GroupedTransformedDataset", "check_graph", "find_groupby"]


def find_groupby(output_node: Node) -> Node | None:
    """The graph's Groupby node (None without one); raises on graphs it cannot run."""
    from tabstream.ops.groupby import Groupby

    nodes = output_node.walk()
    found = [n for n in nodes if n.kind == "op" and isinstance(n.op, Groupby)]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(
            f"a workflow can hold one Groupby, this one has {len(found)}: {[n.op for n in found]}; "
            "export the first grouping and run a second workflow on it"
        )
    node = found[0]
    after: set[int] = {node.id}
    for n in nodes:  # parents come before children
        if any(p.id in after for p in n.parents):
            after.add(n.id)
            if n.kind == "op" and n.op.is_stat:
                raise ValueError(
                    f"{n.op!r} comes after {node.op!r}: its statistics would be fitted on partitions "
                    "that are not grouped yet; export the Groupby output and fit it in a second workflow"
                )
    return node


def check_graph(output_node: Node) -> None:
    """Raise early (at fit) on graphs :class:`GroupedTransformedDataset` cannot run."""
    find_groupby(output_node)


class _BucketDataset:
    """The scattered rows as a dataset whose pieces are buckets (what export reads)."""

    def __init__(self, fs: Any, root: str, schema: pa.Schema, pieces_of: list[list[int]],
                 backend_name: str = backends.DEFAULT_BACKEND) -> None:
        self.fs = fs
        self.backend_name = backend_name  # the scattered Dataset's
        self.root = root
        self.arrow_schema = schema
        self.pieces_of = pieces_of  # bucket -> input partitions that sent it rows

    @property
    def pieces(self) -> list[int]:
        return list(range(len(self.pieces_of)))

    @property
    def npartitions(self) -> int:
        return len(self.pieces_of)

    def piece_rows(self) -> None:
        """Unknown until the Groupby has run (see :meth:`Dataset.piece_rows`): the
        export counts the rows of pass 2's output."""
        return None

    def read_piece(self, piece: int, columns: Any = None) -> pa.Table:
        tables = []
        for p in self.pieces_of[piece]:
            with self.fs.open(_spill_file(self.root, piece, p), "rb") as f:
                tables.append(pq.read_table(f, schema=self.arrow_schema))
        if not tables:
            return self.arrow_schema.empty_table()
        return pa.concat_tables(tables)


class _AfterScatter:
    """Pass 2 of the workflow: the Groupby and what follows it, on one bucket
    (duck-types the parts of :class:`~tabstream.pipeline.workflow.Workflow` that export uses)."""

    def __init__(self, workflow: Any, node: Node, raw_schema: pa.Schema) -> None:
        self.workflow = workflow
        self.node = node
        self.raw_schema = raw_schema

    @property
    def output_schema(self):
        return self.workflow.output_schema

    @property
    def input_columns(self) -> None:
        return None

    def transform_table(self, table: pa.Table, backend: str = backends.DEFAULT_BACKEND) -> pa.Table:
        wf = self.workflow
        assert wf.input_schema is not None
        schemas: dict[int, Any] = {}
        with backends.use(backend):
            grouped = self.node.op.transform(table)
            check_produced(self.node.op, self.node.schema_for(wf.input_schema, schemas), grouped)
            # Nodes after the Groupby read it from the cache; any branch that bypasses it
            # sees no raw rows, and concatenating it with the groups fails loudly.
            return wf.output_node.transform(self.raw_schema.empty_table(), wf.input_schema,
                                            {self.node.id: grouped}, schemas)


def _spill_file(root: str, bucket: int, piece: int) -> str:
    return posixpath.join(root, f"b{bucket:05d}", f"p{piece:06d}.parquet")


def _scatter_piece(workflow: Any, dataset: Dataset, node: Node, index: int, buckets: int,
                   fs: Any, root: str) -> tuple[list[int], pa.Schema, pa.Schema]:
    from tabstream.ops.groupby import key_buckets
    from tabstream.pipeline.export import scatter_write

    schema = workflow.input_schema
    assert schema is not None
    table = dataset.read_piece(dataset.pieces[index], workflow.input_columns)
    table = conform(table.select(workflow.input_columns), schema)
    cache: dict[int, pa.Table] = {}
    schemas: dict[int, Any] = {}
    with backends.use(dataset.backend_name):
        rows = concat_tables([p.transform(table, schema, cache, schemas) for p in node.parents])
        bucket = key_buckets(rows, node.op.groupby_cols, buckets)
    # rows keep their input order inside a bucket
    sent = scatter_write(fs, rows, bucket, buckets, lambda b: _spill_file(root, b, index), keep_empty=False)
    return sent, rows.schema, table.schema


def _bucket_count(dataset: Dataset, columns: list[str]) -> int:
    """Buckets of the scatter pass: the partitions the columns the workflow reads fill
    at ``part_size``, at most one per input partition. (One bucket per input
    partition writes up to P * P spill files even when those columns are a small
    share of each row.)"""
    p = dataset.npartitions
    return max(1, min(p, math.ceil(p * _column_share(dataset, columns))))


def _column_share(dataset: Dataset, columns: list[str]) -> float:
    """The share of the dataset's bytes in ``columns`` (1.0 when it cannot be told
    without reading the data)."""
    wanted = set(columns)
    if dataset.engine == "dataframe" and dataset._table is not None:
        total = dataset._table.nbytes
        return dataset._table.select(list(columns)).nbytes / total if total else 1.0
    if dataset.engine == "parquet":
        used = total = 0
        for md in dataset.footers.values():  # the footers read when planning
            for i in range(md.num_row_groups):
                rg = md.row_group(i)
                for j in range(rg.num_columns):
                    chunk = rg.column(j)
                    total += chunk.total_uncompressed_size
                    if chunk.path_in_schema.split(".")[0] in wanted:
                        used += chunk.total_uncompressed_size
        return used / total if total else 1.0
    return 1.0


class GroupedTransformedDataset(TransformedDataset):
    """``workflow.transform(dataset)`` for a graph with a Groupby: partitions are key
    buckets, each holding every row of its keys (see the module docstring)."""

    def __init__(self, workflow: Any, dataset: Dataset, node: Node) -> None:
        super().__init__(workflow, dataset)
        self.node = node
        self._local: tuple[_BucketDataset, _AfterScatter] | None = None
        self._buckets: int | None = None

    @property
    def npartitions(self) -> int:
        if self._buckets is None:
            self._buckets = _bucket_count(self.dataset, self.workflow.input_columns)
        return self._buckets

    def _scatter(self, fs: Any, root: str, progress: bool | None = None) -> tuple[_BucketDataset, _AfterScatter]:
        buckets = self.npartitions
        tasks = [delayed(_scatter_piece, pure=False)(self.workflow, self.dataset, self.node, i, buckets, fs, root)
                 for i in range(len(self.dataset.pieces))]
        results = compute(tasks, self.workflow.client, desc="groupby: scatter", progress=progress)
        pieces_of: list[list[int]] = [[] for _ in range(buckets)]
        for index, (sent, _, _) in enumerate(results):
            for b in sent:
                pieces_of[b].append(index)
        _, rows_schema, raw_schema = results[0]
        return (_BucketDataset(fs, root, rows_schema, pieces_of, self.dataset.backend_name),
                _AfterScatter(self.workflow, self.node, raw_schema))

    def _scattered_locally(self) -> tuple[_BucketDataset, _AfterScatter]:
        if self._local is None:
            client = self.workflow.client
            if client is not None:
                if not execution.workers_share_this_host(client):
                    raise ValueError(
                        "Groupby: to_iter/compute/to_ddf regroup rows through a folder of this "
                        "machine, which workers on other machines cannot write; on this cluster "
                        "use to_parquet(path), whose regroup folder sits beside the output")
            folder = tempfile.mkdtemp(prefix="tabstream-groupby-")
            weakref.finalize(self, shutil.rmtree, folder, True)
            self._local = self._scatter(fsspec.filesystem("file"), folder)
        return self._local

    def read_piece(self, piece: Any) -> pa.Table:
        """The grouped output of bucket ``piece`` (``0 <= piece < npartitions``)."""
        buckets, after = self._scattered_locally()
        return after.transform_table(buckets.read_piece(piece), buckets.backend_name)

    def to_iter(self):
        for b in range(self.npartitions):
            yield arrow_to_pandas(self.read_piece(b))

    def to_ddf(self):
        import dask.dataframe as dd

        meta = arrow_to_pandas(self.read_piece(0).schema.empty_table())
        return dd.from_map(_GroupedPandas(self), list(range(self.npartitions)), meta=meta,
                           enforce_metadata=False)

    def compute(self):
        self._scattered_locally()
        tables = compute([delayed(self.read_piece)(b) for b in range(self.npartitions)], self.workflow.client)
        return arrow_to_pandas(pa.concat_tables(tables))

    def to_parquet(self, output_path: str, **kwargs: Any):
        from tabstream.core.scratch import owner_tag
        from tabstream.pipeline.export import export
        from tabstream.pipeline.export_folder import check_target, refuse_input_overlap

        kwargs.setdefault("client", self.workflow.client)
        fs, _, paths = fsspec.core.get_fs_token_paths(output_path,
                                                      storage_options=kwargs.get("storage_options") or {})
        target = paths[0].rstrip("/")
        # before the scatter pass
        refuse_input_overlap(fs, target, output_path, self.dataset.fs, self.dataset.files)
        check_target(fs, target, output_path, bool(kwargs.get("overwrite")))
        parent, name = posixpath.split(target)
        # Named like export's own temporary folder (owner-tagged), so that the next
        # export to the same place removes it when this process was killed.
        spill = posixpath.join(parent, f".{name}.tmp-{owner_tag()}-{uuid.uuid4().hex[:12]}")
        try:
            buckets, after = self._scatter(fs, spill, kwargs.get("progress"))
            return export(buckets, after, output_path, **kwargs)
        finally:
            if fs.exists(spill):
                fs.rm(spill, recursive=True)


class _GroupedPandas:
    def __init__(self, tds: GroupedTransformedDataset) -> None:
        self.tds = tds

    def __call__(self, piece: int):
        return arrow_to_pandas(self.tds.read_piece(piece))

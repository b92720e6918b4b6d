"""The framework-neutral loader: parquet row groups in, shuffled numpy batches out.

This module is the loader's core: its arguments (checked once, as
:class:`tabstream.loaders.options.LoaderOptions`), the columns it delivers, its
epochs, and the loop that cuts an epoch's chunks into batches. The roles it
drives have their own modules: :mod:`~tabstream.loaders.plan` (which rows each
rank reads, in which order), :mod:`~tabstream.loaders.source` (a Dataset's row
groups), :mod:`~tabstream.loaders.reading` (row groups into arrays),
:mod:`~tabstream.loaders.batching` and :mod:`~tabstream.loaders.layout` (rows into
batches, in their delivered form), :mod:`~tabstream.loaders.memory` (allocation
and the memory budget) and :mod:`~tabstream.loaders.threads` (reading and batching
ahead in background threads).

One epoch on one rank (see :mod:`tabstream.loaders.plan` for the sharding):

1. lay the row groups out in the epoch's order and take this rank's slice of rows;
2. read them in a background thread (two when one wide column dominates the row
   groups: parquet decodes a column on one thread), at most one row group ahead of
   the chunk being batched;
3. take ``parts_per_chunk`` row groups at a time (a *chunk*), deal its rows out to
   batches at random with a generator drawn from ``(seed, epoch, rank, chunk)``
   (a batch may span two chunks), and copy them column by column, releasing each
   source column once copied (wide columns, such as multi-hot blocks, batch by
   batch, each batch handed out once complete); a complete batch's rows are then
   shuffled among themselves, from ``(seed, epoch, rank, batch index)``;
4. hand the batches to the consumer through a queue of ``prefetch`` batches, from
   a second background thread.

Memory is bounded by the chunk size, whatever the dataset size: at most
``parts_per_chunk + 1`` row groups read, one chunk's worth of batches being
handed out, and ``prefetch`` + 2 batches in the queue and in the consumer's hands
(``Loader.chunk_bytes`` bounds a chunk with its copies and the read-ahead). Row
group and batch buffers are reused within an epoch: a batch's buffers only once
nothing refers to the batch any more (see :class:`tabstream.loaders.memory.BatchPool`). An error in a
background thread is raised in the consumer at the next batch; abandoning an
iteration stops the threads.

Yielded structure, for ``batch_size=3`` and a schema with an id ``C1``, a float
``I1``, a list ``tags`` and the target ``label``::

    features = {"C1": array([7, 3, 9]),                       # int64, shape (3,)
                "I1": array([0.5, 0.1, 0.2], dtype=float32),
                "tags": (array([4, 5, 6]), array([0, 2, 2, 3]))}  # (values, offsets)
    labels = array([1, 0, 0])

With ``pad=True`` a list column is ``(padded, mask)`` instead, both of shape
``(batch, max_len)``: ``(array([[4, 5], [0, 0], [6, 0]]), array([[T, T], [F, F], [T, F]]))``.
``labels`` is one array for one label column, a dict for several, ``None`` for none.

Fixed-length lists (a fixed-size list type, or a schema ``value_count`` with
``min == max``) are read as one dense block per row group, reshaped from the
values buffer, and delivered as ``(dense, mask)`` of shape ``(batch, L)`` with an
all-true mask (one shared array per shape: do not write to it), whatever ``pad``:
no per-row padding work. Lists of lists
(``list<list<number>>``) come as ``(values, outer_offsets, inner_offsets)``: row
``i`` holds the inner lists ``outer_offsets[i]:outer_offsets[i + 1]``, inner list
``j`` the values ``inner_offsets[j]:inner_offsets[j + 1]``; padded (``pad=`` a
``(F, L)`` pair, or fixed-size types) or fixed, they are ``(dense, mask)`` of shape
``(batch, F, L)``::

    "slots": (array([1, 2, 3]), array([0, 2, 3]), array([0, 1, 1, 3]))
    # row 0 = [[1], []], row 1 = [[2, 3]]; padded to (2, 2):
    # [[[1, 0], [0, 0]], [[2, 3], [0, 0]]], mask [[[T, F], [F, F]], [[T, T], [F, F]]]
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tabstream.core.errors import NotFittedError, SchemaError
from tabstream.core.schema import Schema, Tags
from tabstream.loaders import batching, memory, plan
from tabstream.loaders.batching import column_block
from tabstream.loaders.layout import Batch, Layout, pad_lengths, pad_lists, pad_nested
from tabstream.loaders.options import LoaderOptions, check_int
from tabstream.loaders.reading import RowGroupReader
from tabstream.loaders.source import ParquetSource, open_source
from tabstream.loaders.stepping import Mapped, Peekable, Stepping
from tabstream.loaders.threads import BatchIterator, PieceReader, read_threads

__all__ = ["Batch", "BatchIterator", "Layout", "Loader", "LoaderOptions", "column_block", "pad_lists",
           "pad_nested"]


def _select(schema: Schema, spec: Any, what: str) -> list[str]:
    """Column names for a selection: a name, a tag, a list mixing both, or a
    ``ColumnSelector`` (anything with ``resolve(schema)``)."""
    if hasattr(spec, "resolve"):
        return list(dict.fromkeys(spec.resolve(schema)))
    if isinstance(spec, (str, Tags)):
        spec = [spec]
    names: list[str] = []
    for item in spec:
        if isinstance(item, Tags):
            picked = schema.select_by_tag(item).column_names
            if not picked:
                raise SchemaError(f"no column of the schema is tagged {item.value!r} "
                                 f"(for {what}); columns: {schema.column_names}")
        elif isinstance(item, str):
            if item not in schema:
                raise SchemaError(f"{what} column {item!r} is not in the dataset schema; "
                                 f"available: {schema.column_names}")
            picked = [item]
        else:
            raise TypeError(f"{what} must be column names or Tags, got {item!r}")
        names.extend(n for n in picked if n not in names)
    return names


def _split_transforms(data: Any, transforms: Any) -> tuple[Any, Any]:
    """``(dataset, fitted workflow or None)`` from the loader's ``data`` and
    ``transforms`` arguments (``data`` may be ``workflow.transform(dataset)``)."""
    if transforms is None and "tabstream.pipeline.workflow" not in sys.modules:
        # Nothing can be a Workflow's output before its module is imported; skipping
        # the import (dask and the ops, about 0.3 s) keeps a plain loader's first
        # batch fast.
        return data, None
    from tabstream.pipeline.workflow import TransformedDataset, Workflow

    if isinstance(data, TransformedDataset):
        if transforms is not None:
            raise ValueError("data is already workflow.transform(dataset); pass transforms= "
                             "only with an untransformed dataset")
        data, transforms = data.dataset, data.workflow
    if transforms is None:
        return data, None
    if not isinstance(transforms, Workflow):
        raise TypeError(f"transforms must be a fitted tabstream.Workflow, got "
                        f"{type(transforms).__name__}")
    # ops that change the row count (Operator.changes_row_count) are refused
    changing = sorted({type(n.op).__name__ for n in transforms.output_node.walk()
                       if n.kind == "op" and n.op.changes_row_count})
    if changing:
        raise ValueError(
            f"the workflow given to the loader holds {changing}, which change the number "
            "of rows; a loader plans equal batches per rank from the row counts before "
            "reading, so it cannot run them online: export with "
            "workflow.transform(ds).to_parquet(...) and load that folder"
        )
    try:
        # Workflow has no public "is fitted" check yet; transform_table runs this one
        transforms._check_fitted()
    except NotFittedError as exc:
        raise NotFittedError(
            f"the workflow given to the loader is not fitted ({exc}); statistics ops "
            "(Categorify, Normalize, ...) need workflow.fit(train_dataset) first: a loader "
            "never fits them on the chunks it reads"
        ) from exc
    return data, transforms


class Loader(Stepping, Mapped):
    """Shuffled, sharded numpy batches from exported parquet.

    Its arguments are :class:`~tabstream.loaders.options.LoaderOptions` (checked
    there); ``Loader.from_options(options)`` builds one from them.

    Args:
        data: a parquet ``tabstream.Dataset``, split or filtered or not (the loader
            yields exactly its rows), or an export directory, a glob, a parquet file or
            a list of files (any fsspec URL), read as ``Dataset(data, engine="parquet")``:
            the export's manifest is checked and its schema file used.
        batch_size: rows per batch (see :mod:`tabstream.loaders.plan` for the last ones).
        shuffle: shuffle row groups, rows within chunks and rows within each batch,
            differently each epoch. Default ``False``, as merlin-dataloader's: pass
            ``shuffle=True`` for training.
        seed: the shuffle is a function of ``(seed, epoch)``: same on every rank, same
            on every run. Must be the same on all ranks.
        parts_per_chunk: row groups read and shuffled together; more is a better
            shuffle and more memory. A chunk also stays under :attr:`chunk_bytes`,
            counting its batch copies and the read-ahead (fewer row groups when
            they are large; one at least).
        global_size, global_rank: number of ranks and this one's index (default 1, 0;
            the torch and TensorFlow loaders default to the active process group or
            strategy).
        drop_last: drop the rows that do not fill a batch on every rank instead of
            delivering every row exactly once.
        features: the feature columns: names and/or :class:`Tags` (the columns with
            that tag), or a ``ColumnSelector``. Default: every schema column that is
            not a label.
        labels: label columns, same forms. Default: the columns tagged ``TARGET``.
        pad: ``True`` delivers list columns as ``(padded, mask)`` of the schema's
            ``value_count`` max length; a dict ``{name: length}`` gives lengths, and
            ``{name: (F, L)}`` the shape of a list-of-lists column. Fixed-length
            columns (see the module docstring) are dense whatever ``pad`` says.
        prefetch: batches prepared ahead of the consumer.
        storage_options: fsspec options when ``data`` is a path.
        transforms: a fitted ``tabstream.Workflow`` applied to each row group as it is
            read (``Workflow.transform_table``), so light ops (Categorify lookups,
            HashBucket, Normalize...) run online; ``Loader(workflow.transform(ds))``
            does the same. Features and labels are chosen among its output columns.
            Row-count-changing ops (Filter, Dropna, Groupby) are refused: the
            equal-batches plan counts rows before reading them.
        list_layout: ``"tuple"`` (ragged lists as ``(values, offsets)``) or ``"flat"``
            (merlin-dataloader's ``name__values`` and ``name__offsets`` features; see
            :data:`tabstream.loaders.options.LIST_LAYOUTS`).

    Epochs: each ``iter(loader)`` runs the next epoch (0, 1, 2, ...);
    ``set_epoch(n)`` makes the next iteration run epoch ``n`` (then ``n+1``...), as
    with ``DistributedSampler``. ``len(loader)`` is the number of batches this rank
    yields per epoch, the same on every rank.

    As merlin-dataloader's loaders, it also steps by hand (see
    :mod:`tabstream.loaders.stepping`): ``next(loader)``, ``peek()``, ``stop()``,
    ``with Loader(...) as loader:``, ``map(fn)``; and ``loader.batch_size = n``
    applies from the next epoch on.
    """

    #: Upper bound on the bytes one chunk costs: its decoded row groups (estimated
    #: from the column types and the footers), the batches they are copied into (as
    #: many bytes again) and the row group read ahead meanwhile, so that memory stays
    #: bounded whatever the files' row-group size. 96 MiB takes 2 row groups per
    #: chunk up to 75k Criteo rows each (268 bytes a row), 1 above: a torch loader
    #: then peaks under 500 MB with the imports (260 MB for python and torch) and
    #: the allocator's slack (measured on 100k-row groups; 2 of those peaked at
    #: 520-600 MB). A single row group larger than the bound is still read whole.
    chunk_bytes: int = 96 * 2**20

    def __init__(
        self,
        data: Any,
        batch_size: int,
        shuffle: bool = False,
        seed: int = 0,
        parts_per_chunk: int = 2,
        global_size: int | None = None,
        global_rank: int | None = None,
        drop_last: bool = False,
        *,
        features: Any = None,
        labels: Any = None,
        pad: bool | Mapping[str, Any] = False,
        prefetch: int = 2,
        storage_options: dict | None = None,
        transforms: Any = None,
        list_layout: str = "tuple",
    ) -> None:
        self._configure(LoaderOptions(
            data, batch_size, shuffle, seed, parts_per_chunk, global_size, global_rank, drop_last,
            features=features, labels=labels, pad=pad, prefetch=prefetch,
            storage_options=storage_options, transforms=transforms, list_layout=list_layout))

    @classmethod
    def from_options(cls, options: LoaderOptions) -> Loader:
        """The loader of ``options`` (what the torch and TensorFlow adapters build)."""
        if not isinstance(options, LoaderOptions):
            raise TypeError(f"options must be a LoaderOptions, got {type(options).__name__}")
        loader = cls.__new__(cls)
        loader._configure(options)
        return loader

    def _configure(self, options: LoaderOptions) -> None:
        self.options = options
        self.seed: int = options.seed
        self.parts_per_chunk: int = options.parts_per_chunk
        self.prefetch: int = options.prefetch
        self.global_size: int = options.global_size  # type: ignore[assignment]  # set by LoaderOptions
        self.global_rank: int = options.global_rank  # type: ignore[assignment]
        self.shuffle: bool = options.shuffle
        self.drop_last: bool = options.drop_last

        data, self.transforms = _split_transforms(options.data, options.transforms)
        self.source: ParquetSource = open_source(data, options.storage_options)
        full = self.source.schema if self.transforms is None else self.transforms.output_schema
        labels, features = options.labels, options.features
        self.label_names = (_select(full, Tags.TARGET, "labels")
                            if labels is None and full.select_by_tag(Tags.TARGET)
                            else _select(full, labels or [], "labels"))
        if features is None:
            self.feature_names = [n for n in full.column_names if n not in self.label_names]
        else:
            self.feature_names = _select(full, features, "features")
        both = set(self.feature_names) & set(self.label_names)
        if both:
            raise ValueError(f"columns {sorted(both)} are selected both as features and labels")
        if not self.feature_names and not self.label_names:
            raise ValueError("no columns selected: pass features= and/or labels=")
        self.columns = self.feature_names + self.label_names
        self.schema = full.select_by_name(self.columns)
        self._reader = RowGroupReader(self.source, self.columns, self.schema, self.transforms,
                                      shuffle=self.shuffle, seed=self.seed)
        self.layouts: dict[str, Layout] = self._reader.layouts
        self.pad_lengths = pad_lengths(options.pad, self.layouts, self.schema)

        self.num_rows = self.source.num_rows
        self._share = plan.split_rows(self.num_rows, self.batch_size, self.global_size,
                                      self.drop_last)[self.global_rank]
        self._epoch = 0
        # set_position's position, until an iteration of its epoch starts; then the
        # start of that iteration (what position() adds the batches taken to)
        self._pending: plan.EpochPosition | None = None
        self._active: plan.EpochPosition | None = None
        self._claimed: tuple[int, int] | None = None  # (epoch, batch_size) of the latest iteration
        self._column_blocks: list[list[str]] = []

    # -- configuration -------------------------------------------------------
    @property
    def batch_size(self) -> int:
        """Rows per batch; setting it (checked as the constructor's argument)
        applies to the epochs started afterwards."""
        return self.options.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        options = dataclasses.replace(self.options, batch_size=value)
        share = plan.split_rows(self.num_rows, options.batch_size, self.global_size,
                                self.drop_last)[self.global_rank]
        self.options, self._share = options, share

    def set_column_blocks(self, blocks: Sequence[Sequence[str]]) -> None:
        """Assemble each group of ``blocks`` (scalar columns of one dtype) in one
        ``(len(group), batch)`` buffer per batch, a column per row, in the group's
        order. Batches still hold one array per column, each a row of that buffer;
        :func:`column_block` gives the buffer back. For a consumer that hands a batch
        on as few arrays as it can: the TensorFlow loader passes a buffer per dtype
        through ``tf.py_function`` instead of one tensor per column. Applies to the
        epochs started after the call; ``[]`` turns it off."""
        seen: set[str] = set()
        groups = [list(g) for g in blocks]
        for group in groups:
            for name in group:
                layout = self.layouts.get(name)
                if layout is None or layout.depth:
                    raise ValueError(f"column block {group}: {name!r} is not a selected scalar "
                                     f"column; scalar columns: "
                                     f"{[n for n in self.columns if not self.layouts[n].depth]}")
                if name in seen:
                    raise ValueError(f"column {name!r} is in two column blocks")
                seen.add(name)
            dtypes = sorted({str(self.layouts[n].dtype) for n in group})
            if len(dtypes) > 1:
                raise ValueError(f"column block {group} mixes dtypes {dtypes}: one dtype per block")
        self._column_blocks = [g for g in groups if g]

    def column_dtype(self, name: str) -> tuple[np.dtype, bool]:
        """The numpy dtype of a selected column's values and whether it is a list."""
        layout = self.layouts[name]
        return layout.dtype, layout.depth > 0

    def column_layout(self, name: str) -> Layout:
        """How a selected column is delivered (see :class:`Layout`)."""
        return self.layouts[name]

    # -- epochs ---------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (later ones continue from there)."""
        self._epoch = check_int("epoch", epoch, 0)

    def __len__(self) -> int:
        """Batches this rank yields in the next iteration's epoch: the whole epoch's,
        or, after :meth:`set_position`, those left of that epoch."""
        pending = self._pending
        if pending is not None and pending.epoch == self._epoch:
            return self._rank_epoch(pending.epoch, self.global_rank, pending)[0].num_batches
        return self._share.num_batches

    @property
    def rows_per_epoch(self) -> int:
        """Rows this rank delivers per epoch."""
        return self._share.num_rows

    def next_epoch(self) -> int:
        """Claim the epoch for a new iteration and advance the counter."""
        epoch = self._epoch
        self._epoch += 1
        return epoch

    def __iter__(self) -> Iterator[Batch]:
        return self._continue_or_open()

    def _open_iteration(self) -> Peekable:
        return Peekable(self.iter_epoch(self.next_epoch(), self._mapping()))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({len(self.source.files)} files, {self.num_rows} rows, "
                f"batch_size={self.batch_size}, shuffle={self.shuffle}, "
                f"rank {self.global_rank}/{self.global_size}, {len(self)} batches)")

    # -- position in an epoch (resuming on another number of ranks) ----------
    def _unit_rows(self) -> list[int]:
        return [u.num_rows for u in self.source.units]

    def _start_of(self, epoch: int) -> plan.EpochPosition:
        """Where this loader's iteration of ``epoch`` starts (or the next one will)."""
        for start in (self._pending, self._active):
            if start is not None and start.epoch == epoch:
                return start
        return plan.EpochPosition(epoch, self.num_rows, self.seed, self.shuffle,
                                  plan.layout_digest(self._unit_rows()), np.empty((0, 2), np.int64))

    def _rank_epoch(self, epoch: int, rank: int, start: plan.EpochPosition | None,
                    batch_size: int | None = None
                    ) -> tuple[plan.RankShare, list[tuple[plan.Piece, np.ndarray | None]]]:
        """Rank ``rank``'s share of ``epoch`` and its pieces with their keep masks
        (see :func:`tabstream.loaders.plan.select_pieces`): of the whole epoch, or of
        the rows ``start`` has not delivered; in batches of ``batch_size`` (default
        the loader's)."""
        rows = self._unit_rows()
        order = plan.unit_order(len(rows), self.seed, epoch, self.shuffle)
        b = self.batch_size if batch_size is None else batch_size
        if start is None or start.num_delivered == 0:
            share = (self._share if rank == self.global_rank and b == self.batch_size else
                     plan.split_rows(self.num_rows, b, self.global_size, self.drop_last)[rank])
            return share, [(p, None) for p in plan.rank_pieces(rows, order, share.start, share.stop)]
        left = start.num_rows - start.num_delivered
        try:
            share = plan.resume_split(left, b, self.global_size, self.drop_last)[rank]
        except ValueError as exc:
            raise ValueError(f"resuming epoch {epoch} with {left} rows left to deliver: {exc}; "
                             "resume on fewer ranks") from exc
        selection = plan._slice(start.remaining(), share.start, share.stop)
        return share, plan.select_pieces(rows, order, selection, self.seed, epoch, self.shuffle)

    def _chunk_lengths(self, pieces: Sequence[plan.Piece], first_batch: int) -> list[int]:
        """How many pieces each chunk of an epoch takes (see :func:`memory.epoch_budget`)."""
        budget = memory.epoch_budget(pieces, self._reader.unit_bytes(), self._unit_rows(),
                                     self.parts_per_chunk, self.chunk_bytes, first_batch,
                                     self.prefetch, len(self.columns))
        return [len(c) for c in budget.chunks]

    def position(self, epoch: int, batches: int) -> dict[str, Any]:
        """Where ``epoch`` stands once every rank has taken ``batches`` batches of
        this loader's iteration of it (of what was left, after :meth:`set_position`):
        the rows delivered so far, as positions in the epoch's stream (a function of
        ``seed``, ``epoch`` and the row groups only), so nothing in it depends on the
        number of ranks or the batch size. Plain values, for a checkpoint.

        ``batches=0`` is where the iteration started. Every rank computes the same
        position (the plan is the same on all of them); none communicates.

            loader.position(epoch=0, batches=40)   # 2 ranks, batch_size=512
            {"format": "tabstream.loaders.position/1", "epoch": 0, "num_rows": 1000000,
             "seed": 0, "shuffle": True, "layout": "3f0c9a...", "rows_delivered": 40960,
             "delivered": "eJxjYGBg..."}      # stream ranges, compressed
        """
        epoch = check_int("epoch", epoch, 0)
        batches = check_int("batches", batches, 0)
        start = self._start_of(epoch)
        rows = self._unit_rows()
        order = plan.unit_order(len(rows), self.seed, epoch, self.shuffle)
        # the batch size the epoch's iteration runs with (a new one applies to later epochs)
        size = self._claimed[1] if self._claimed and self._claimed[0] == epoch else None
        parts = [np.empty((0, 2), np.int64)]
        for rank in range(self.global_size):
            share, pieces = self._rank_epoch(epoch, rank, start, size)
            if batches > share.num_batches:
                raise ValueError(f"batches={batches} is more than the {share.num_batches} "
                                 f"batches of epoch {epoch} each rank yields")
            sizes = list(share.batch_sizes())
            consumed = sum(sizes[:batches])
            if consumed == 0:
                continue
            plain = [p for p, _ in pieces]
            parts.append(plan.delivered_rows(
                pieces, self._chunk_lengths(plain, sizes[0]), rows, order, consumed,
                seed=self.seed, epoch=epoch, rank=rank, shuffle=self.shuffle))
        return start.with_delivered(np.concatenate(parts)).to_dict()

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Resume from :meth:`position`'s output, taken with any number of ranks and
        any batch size: the next iteration runs its epoch and delivers only the rows
        not delivered yet, each once, split over this loader's ranks in batches of
        ``batch_size`` by the usual rules (equal batch counts per rank; see
        :mod:`tabstream.loaders.plan`). The epochs after it are whole, as usual.

        Refused (:class:`ValueError`) when the position is of other data, another
        ``seed`` or another ``shuffle``: the rows it names would be other rows."""
        start = plan.EpochPosition.from_dict(position)
        digest = plan.layout_digest(self._unit_rows())
        for what, saved, here, fix in (
            ("seed", start.seed, self.seed, f"build the loader with seed={start.seed}"),
            ("shuffle", start.shuffle, self.shuffle, f"build the loader with shuffle={start.shuffle}"),
            ("rows", start.num_rows, self.num_rows, "load the data the position was taken on"),
            ("row groups (digest of their row counts)", start.layout, digest,
             "load the data the position was taken on (the same files, the same row groups)"),
        ):
            if saved != here:
                raise ValueError(f"the loader position (epoch {start.epoch}) was taken with "
                                 f"{what} {saved!r}, this loader has {here!r}: {fix}")
        self._pending = start
        self._epoch = start.epoch

    def _claim(self, epoch: int) -> tuple[plan.RankShare, list[tuple[plan.Piece, np.ndarray | None]]]:
        """This rank's share and pieces for an iteration of ``epoch`` starting now."""
        start = self._pending if self._pending is not None and self._pending.epoch == epoch else None
        self._pending = None if start is not None else self._pending
        self._active = start
        self._claimed = (epoch, self.batch_size)
        return self._rank_epoch(epoch, self.global_rank, start)

    # -- planning and reading -------------------------------------------------
    def pieces(self, epoch: int, share: plan.RankShare | None = None) -> list[plan.Piece]:
        """This rank's pieces of row groups for ``epoch``, in reading order."""
        share = self._share if share is None else share
        units = self.source.units
        order = plan.unit_order(len(units), self.seed, epoch, self.shuffle)
        return plan.rank_pieces([u.num_rows for u in units], order, share.start, share.stop)

    def _batches(self, epoch: int, run: tuple[plan.RankShare, list[tuple[plan.Piece, np.ndarray | None]]]
                 | None = None) -> Iterator[Batch]:
        """This rank's batches for ``epoch``, cut in the calling thread from row
        groups read by a helper thread.

        With shuffling, each batch takes the next ``batch_size`` entries of the
        chunk's random permutation, sorted: which rows share a batch is random and
        they are gathered in the chunk's order (an in-order gather is about twice
        as fast); the complete batch's rows are then put in an order of their own,
        drawn from ``(seed, epoch, rank, batch index)``
        (:func:`tabstream.loaders.batching.shuffle_within`).
        """
        share, kept = run if run is not None else self._rank_epoch(epoch, self.global_rank, None)
        pieces = [p for p, _ in kept]
        keeps = [k for _, k in kept]
        lists = [n for n in self.columns
                 if self.layouts[n].depth and self.layouts[n].fixed is None]
        dtypes = {n: (self.layouts[n].dtype, self.layouts[n].fixed or ())
                  for n in self.columns if n not in lists}
        sizes = share.batch_sizes()
        size = next(sizes, 0)
        budget = memory.epoch_budget(pieces, self._reader.unit_bytes(),
                                     [u.num_rows for u in self.source.units], self.parts_per_chunk,
                                     self.chunk_bytes, size, self.prefetch, len(self.columns))
        pool = memory.BatchPool(keep=budget.pool_keep)
        blocks = {n: (k, row, len(group)) for k, group in enumerate(self._column_blocks)
                  for row, n in enumerate(group)}
        made = 0  # batches started: the next one's index in the epoch
        def new_builder(size: int, index: int) -> batching.BatchBuilder:
            # shuffled: built in its own row order from the start (see shuffle_within)
            order = (batching.within_order(self.seed, epoch, self.global_rank, index, size)
                     if self.shuffle else None)
            return batching.BatchBuilder(dtypes, lists, size, pool, blocks, index, order)

        builder = new_builder(size, made)
        filled = 0
        recycler = memory.Recycler(keep=budget.recycler_keep)
        threads = read_threads(self._reader.unit_sizes())
        reader = PieceReader(
            lambda piece: self._reader.read_piece(piece, epoch, recycler, use_threads=threads == 1),
            pieces, budget=budget.read_ahead, threads=threads)
        try:
            at = 0
            for k, chunk_pieces in enumerate(budget.chunks):
                chunk = batching.Chunk([reader.get() for _ in chunk_pieces],
                                       [p.num_rows for p in chunk_pieces])
                # a resumed epoch keeps only the rows not delivered yet
                select = _kept_rows(chunk_pieces, keeps[at:at + len(chunk_pieces)])
                at += len(chunk_pieces)
                n = chunk.num_rows if select is None else len(select)
                order = (memory.permutation(plan.chunk_rng(self.seed, epoch, self.global_rank, k),
                                            n) if self.shuffle else None)
                if select is not None:
                    order = select if order is None else select[order]
                segments: list[batching.Segment] = []
                done: list[batching.BatchBuilder] = []
                pos = 0
                while pos < n and size:
                    take = min(size - filled, n - pos)
                    rows = (slice(pos, pos + take) if order is None
                            else memory.sorted_copy(order[pos:pos + take]))
                    segments.append((builder, filled, rows))
                    pos += take
                    filled += take
                    if filled == size:
                        done.append(builder)
                        size, filled = next(sizes, 0), 0
                        if size:
                            made += 1
                            builder = new_builder(size, made)
                handed: set[int] = set()
                for finished in chunk.fill(segments, done, recycler):
                    handed.add(id(finished))
                    yield from self._hand_out(finished, epoch)
                rest = [b for b in done if id(b) not in handed]
                # the chunk's columns are all dropped by now: the reader may fill its
                # budget again while the rest of the chunk's batches are consumed
                del chunk, segments, done
                reader.release(len(chunk_pieces))
                for finished in rest:
                    yield from self._hand_out(finished, epoch)
                del rest
        finally:
            reader.close()
        if size:  # the plan and the files disagree: never yield a short epoch silently
            raise RuntimeError(f"rank {self.global_rank} ran out of rows before its last batch; "
                               "were the files modified while loading?")

    def _hand_out(self, finished: batching.BatchBuilder, epoch: int) -> Iterator[Batch]:
        if self.shuffle:
            batching.shuffle_within(finished, self.seed, epoch, self.global_rank)
        batch = batching.finish_batch(finished, self.layouts, self.pad_lengths, self.feature_names,
                                      self.label_names, self.options.list_layout == "flat")
        # the batch's arrays are the consumer's now: a builder kept in a list of
        # finished batches must not keep their buffers from the pool
        finished.out, finished.lists, finished.held = {}, {}, {}
        del finished
        yield batch

    def iter_epoch(self, epoch: int,
                   transform: Callable[[Batch], Any] | None = None) -> BatchIterator:
        """Iterate ``epoch`` without touching the epoch counter. ``transform`` is
        applied to each batch in the background thread (e.g. to build tensors)."""
        return BatchIterator(self._batches(epoch, self._claim(epoch)), transform, self.prefetch)


def _kept_rows(pieces: Sequence[plan.Piece], keeps: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The chunk rows to deliver (indices into the pieces' rows laid end to end), or
    ``None`` for all of them."""
    if all(k is None for k in keeps):
        return None
    parts, at = [], 0
    for piece, keep in zip(pieces, keeps, strict=True):
        local = np.arange(piece.num_rows) if keep is None else np.flatnonzero(keep)
        parts.append(local + at)
        at += piece.num_rows
    return np.concatenate(parts).astype(np.int64)

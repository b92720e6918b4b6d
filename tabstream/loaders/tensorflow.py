"""TensorFlow / Keras 3 adapter: the core loader as a ``tf.data.Dataset``.

The loader *is* a ``tf.data.Dataset`` (with a fixed ``element_spec`` and a known
cardinality), so it goes straight into Keras and into ``tf.function`` loops::

    train = Loader("out/train", batch_size=65536, shuffle=True)
    valid = Loader("out/valid", batch_size=65536, shuffle=False)
    model.fit(train, validation_data=valid, epochs=2, shuffle=False)

    @tf.function
    def train_epoch(dataset):
        for features, labels in dataset: ...
    train_epoch(train)

Each new iteration (each Keras epoch) runs the next loader epoch, as with the
other loaders; ``set_epoch`` works too. After ``set_position`` (an epoch resumed,
perhaps on another number of ranks) the next iteration has ``len(loader)`` batches,
fewer than a whole epoch, and the dataset's cardinality says so; Keras reads it
once per ``fit`` call, so give the resumed epoch a ``fit`` call of its own
(``model.fit(loader, epochs=1)``, then ``model.fit(loader, initial_epoch=1,
epochs=E)``): in one call Keras would cut every later epoch to the first's length
(reading that cardinality warns, :class:`ResumedEpochWarning`).

Keras warns that ``shuffle=True`` (its default) is ignored for a
``tf.data.Dataset``: the loader shuffles by itself, so pass ``shuffle=False`` to
``fit`` to silence that.

Elements are ``(features, labels)`` (just ``features`` when there are no label
columns); each leaf is a tensor whose first dimension is the batch:
``features["C1"]``: int64 ``(batch,)``; a list column: ``(values, offsets)``
int ``(nnz,)`` and int64 ``(batch + 1,)``, or with ``pad=True`` ``(padded, mask)``
``(batch, length)``; a fixed-length list: ``(dense, mask)`` ``(batch, L)``; a list of
lists: ``(values, outer_offsets, inner_offsets)``, or padded/fixed ``(dense, mask)``
``(batch, F, L)``.

Under an active ``tf.distribute`` strategy with several workers (e.g.
``MultiWorkerMirroredStrategy``; create the loader inside ``strategy.scope()``)
the rank and size default to the worker's index and the number of workers, and
the loader turns off tf.data auto-sharding, since it shards by itself.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.data.ops import dataset_ops, iterator_ops
from tensorflow.python.eager import context
from tensorflow.python.framework import ops
from tensorflow.python.ops import gen_dataset_ops

try:  # the dataset op behind from_generator (TensorFlow's own module, private)
    from tensorflow.python.data.ops.from_generator_op import _GeneratorDataset
except ImportError:  # pragma: no cover - moved in some later TensorFlow: see _batches
    _GeneratorDataset = getattr(dataset_ops, "_GeneratorDataset", None)

from tabstream.loaders import batching, core, plan
from tabstream.loaders.options import LoaderOptions
from tabstream.loaders.stepping import Stepping

__all__ = ["Loader", "ResumedEpochWarning"]


class ResumedEpochWarning(UserWarning):
    """The next epoch was resumed (``set_position``) and has fewer batches than the
    epochs after it, which a Keras ``fit`` of several epochs would take for all."""


def _strategy_defaults(global_size: int | None, global_rank: int | None) -> tuple[int | None, int | None]:
    if not tf.distribute.has_strategy():
        return global_size, global_rank
    resolver = getattr(tf.distribute.get_strategy(), "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return global_size, global_rank
    jobs = resolver.cluster_spec().as_dict()
    chiefs = len(jobs.get("chief", []))
    workers = chiefs + len(jobs.get("worker", []))
    if resolver.task_type == "chief":
        index = 0
    elif resolver.task_type == "worker":
        index = chiefs + int(resolver.task_id)
    else:  # evaluator or parameter server: reads nothing by default
        return global_size, global_rank
    return (workers if global_size is None else global_size,
            index if global_rank is None else global_rank)


def _check_device(device: Any) -> str | None:
    """A TensorFlow device name that exists here, or None."""
    if device is None:
        return None
    if not isinstance(device, str):
        raise TypeError(f"device must be a device name such as '/GPU:0', got "
                        f"{type(device).__name__}")
    try:
        spec = tf.DeviceSpec.from_string(device)
    except ValueError as exc:
        raise ValueError(f"device {device!r} is not a TensorFlow device name: {exc}") from exc
    kind = (spec.device_type or "CPU").upper()
    found = [d.name for d in tf.config.list_logical_devices(kind)]
    index = spec.device_index or 0
    if index >= len(found):
        available = [d.name for d in tf.config.list_logical_devices()]
        raise ValueError(f"device {device!r}: TensorFlow has no such device here; "
                         f"available: {available}")
    return found[index]


# TensorFlow's kernels expect tensor memory aligned to this many bytes (Eigen's
# largest alignment); arrow's buffers, which the core loader's batches live in, are.
_ALIGN = 64


def _tensor(a: np.ndarray) -> tf.Tensor:
    """A numpy batch array as a CPU tensor, zero-copy where that is safe.

    ``tf.convert_to_tensor`` copies every array (a 17 MB memcpy into fresh pages
    per Criteo batch of 65,536 rows). The core loader's batch arrays are writable,
    contiguous and 64-byte aligned buffers that it never writes to again while
    anything refers to them, so the tensor takes the buffer over through DLPack
    instead: the capsule keeps the array alive as long as the tensor, and with it
    the buffer out of the loader's pool (see ``tabstream.loaders.memory.BatchPool``).
    Anything else (a view at an unaligned offset, a read-only array) is copied as
    before.
    """
    if (a.flags.c_contiguous and a.flags.writeable
            and a.__array_interface__["data"][0] % _ALIGN == 0):
        return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
    return tf.convert_to_tensor(a)


def _blocks(spec: Any, scalars: set[str]) -> list[list[int]]:
    """Positions in the flattened element of the scalar columns (named in
    ``scalars``), grouped by dtype in that order (groups of two or more): each group
    travels through ``tf.py_function`` as one ``(columns, batch)`` tensor, unstacked
    in the graph into its columns."""
    def column(s: Any) -> Any:  # a scalar column is one spec; others a tuple of them
        # (or, flat lists, single specs named after their part: not scalar columns)
        if isinstance(s, tf.TensorSpec):
            return s.name in scalars
        return tuple(False for _ in s)

    def columns(specs: Any) -> Any:
        return {n: column(s) for n, s in specs.items()} if isinstance(specs, dict) else column(specs)

    # the spec's nesting with each scalar column's leaf marked (by structure: a list
    # column's tensors have names of their own, which a scalar column may share)
    marks = columns(spec) if isinstance(spec, dict) else tuple(columns(part) for part in spec)
    groups: dict[tf.DType, list[int]] = {}
    for i, (s, scalar) in enumerate(zip(tf.nest.flatten(spec), tf.nest.flatten(marks), strict=True)):
        if scalar:
            groups.setdefault(s.dtype, []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _spec(core_loader: core.Loader) -> Any:
    """The element_spec: a TensorSpec per array, batch dimension left open."""

    def column(name: str) -> Any:
        layout = core_loader.column_layout(name)
        dtype = tf.as_dtype(layout.dtype)
        if not layout.depth:
            return tf.TensorSpec([None], dtype, name=name)
        length = core_loader.pad_lengths.get(name)
        if length is None:
            values = tf.TensorSpec([None], dtype, name=f"{name}__values")
            if layout.depth == 1:
                return values, tf.TensorSpec([None], tf.int64, name=f"{name}__offsets")
            return (values, tf.TensorSpec([None], tf.int64, name=f"{name}__outer_offsets"),
                    tf.TensorSpec([None], tf.int64, name=f"{name}__inner_offsets"))
        shape = [None, *(length if isinstance(length, tuple) else (length,))]
        return (tf.TensorSpec(shape, dtype, name=name),
                tf.TensorSpec(shape, tf.bool, name=f"{name}__mask"))

    features = {n: column(n) for n in core_loader.feature_names}
    if core_loader.options.list_layout == "flat":
        features = batching.flatten_lists(features, core_loader.layouts, core_loader.pad_lengths)
    labels = core_loader.label_names
    if not labels:
        return features
    if len(labels) == 1:
        return features, column(labels[0])
    return features, {n: column(n) for n in labels}


class Loader(dataset_ops.DatasetV2, Stepping):
    """Shuffled, sharded batches from exported parquet, as a ``tf.data.Dataset``.

    Takes the arguments of :class:`tabstream.loaders.Loader` (``features=``,
    ``labels=``, ``pad=``, ``prefetch=``, ``storage_options=``, ``transforms=``
    included). The
    loader's own settings are under ``loader.core`` (``tf.data.Dataset`` already
    has ``shuffle``/``batch`` methods); ``len(loader)`` and ``set_epoch`` work as
    for the other loaders.

    ``device`` (e.g. ``"/GPU:0"``; default ``None``: where TensorFlow places them)
    prefetches batches onto that device (``tf.data.experimental.prefetch_to_device``),
    so host-to-GPU copies overlap the training step; batches and their order do not
    depend on it.

    merlin-dataloader's ``next(loader)``, ``peek()``, ``stop()``, ``with``,
    ``loader.batch_size = n`` (from the next epoch on) and ``iter(loader)``
    continuing the epoch ``next``/``peek`` started work as for the torch loader
    (:mod:`tabstream.loaders.stepping`). ``map(fn)`` is merlin's: it changes the
    loader and returns it, ``fn`` traced into the pipeline as tf.data's ``map``
    traces it (see :meth:`map`).

    ``position(epoch, batches)`` and ``set_position(position)`` are the core's
    (:meth:`tabstream.loaders.Loader.position`): an epoch resumed on another number
    of ranks has fewer batches, and the dataset's cardinality (what Keras takes for
    the epoch's length) follows: it is always the next iteration's ``len(loader)``.
    Datasets made from the loader (``loader.repeat()``, ``loader.take(n)``) keep the
    length of the moment they were made.
    """

    def __init__(
        self,
        dataset: Any,
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
        device: str | None = None,
        list_layout: str = "tuple",
    ) -> None:
        global_size, global_rank = _strategy_defaults(global_size, global_rank)
        self.device = _check_device(device)
        self.core = core.Loader.from_options(LoaderOptions(
            dataset, batch_size, shuffle, seed, parts_per_chunk, global_size, global_rank,
            drop_last, features=features, labels=labels, pad=pad, prefetch=prefetch,
            storage_options=storage_options, transforms=transforms, list_layout=list_layout,
        ))
        self._keys = itertools.count()
        self._epochs: dict[int, core.BatchIterator] = {}
        self._calls = threading.Condition()  # guards the three below
        self._in_flight = 0      # tf.data's calls into the loader running now (_enter)
        self._started = 0        # tf.data's calls so far
        self._closed = False     # set at interpreter exit (see _close_at_exit)
        _OPEN.add(self)
        self._spec = _spec(self.core)
        flat = tf.nest.flatten(self._spec)
        self._block_positions = _blocks(self._spec, {
            n for n in self.core.columns if not self.core.column_layout(n).depth})
        grouped = {i for g in self._block_positions for i in g}
        self._single_positions = [i for i in range(len(flat)) if i not in grouped]
        self.core.set_column_blocks([[flat[i].name for i in g] for g in self._block_positions])
        self._maps: list[tuple[Any, dict[str, Any]]] = []  # map()'s functions, in order
        self._built: tuple[int, int] | None = None  # (cardinality, maps) the dataset was built for
        ds = self._build()
        super().__init__(ds._variant_tensor)

    def _build(self, maps: list[tuple[Any, dict[str, Any]]] | None = None) -> tf.data.Dataset:
        """The dataset the loader stands for: its batches, with the cardinality of the
        next iteration's epoch (``len(self.core)``), the ``map`` functions, prefetching.

        Kept as ``self._dataset`` (and its variant as the loader's own) unless
        ``maps`` is given: then only returned, for ``map`` to check its function
        before keeping it."""
        keep = maps is None
        maps = self._maps if maps is None else maps
        count = len(self.core)
        ds = self._batches(self._spec, count)
        # tf.data's cardinality, which Keras takes for the epoch's length (its
        # progress bar); checked at the epoch's end, so it must be this epoch's:
        # a resumed epoch (set_position) has fewer batches than the next one. The
        # loader rebuilds the dataset when the length changes (_variant_tensor).
        ds = ds.apply(tf.data.experimental.assert_cardinality(count))
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        # Nothing here is autotuned (one generator, prefetch 1), and with
        # autotuning on, the end of an epoch waited for tf.data's next optimization
        # tick (its period doubles from 10 ms: ticks at about 2.55 s, 5.1 s, ... after
        # the iterator starts), so whole epochs snapped to those times: the bimodal
        # Criteo runs and the 0.098 M rows/s multi-hot epochs of benchmarks/RESULTS.md.
        options.autotune.enabled = False
        ds = ds.with_options(options)
        for fn, kwargs in maps:
            ds = dataset_ops.DatasetV2.map(ds, fn, **kwargs)
        if self.device is None:
            ds = ds.prefetch(1)
        else:  # must be the last transformation
            ds = ds.apply(tf.data.experimental.prefetch_to_device(self.device, buffer_size=1))
        if keep:
            # the datasets built before stay referenced: an iterator made from one
            # may still be running (their py_functions must stay registered)
            self.__dict__.setdefault("_builds", []).append(ds)
            self._dataset = ds
            self._built = (count, len(maps))
            if "_variant_tensor_attr" in self.__dict__:  # a rebuild (the first is __init__'s)
                self._variant_tensor_attr = ds._variant_tensor
        return ds

    @property
    def _variant_tensor(self) -> tf.Tensor:
        # Every use of the dataset (an iterator, Keras, a tf.function argument,
        # cardinality()) goes through here: rebuilt when the next epoch's length is
        # not the one built (set_position, the epoch after a resumed one, a new
        # batch_size). Only eagerly: a graph being traced keeps what it was given.
        if context.executing_eagerly() and self._built != (len(self.core), len(self._maps)):
            self._build()
        return self._variant_tensor_attr

    def _open_iteration(self) -> _EagerIterator:
        # an eager iterator: dropping it ends its epoch (tf.data calls _close_epoch)
        with ops.colocate_with(self._variant_tensor):  # as tf.data.Dataset.__iter__
            return _EagerIterator(self)

    # tf.data.Dataset's abstract interface
    def _inputs(self) -> list[tf.data.Dataset]:
        return [self._dataset]

    def __iter__(self) -> iterator_ops.OwnedIterator:
        if context.executing_eagerly():
            # the epoch next()/peek() started, else a new one
            return self._continue_or_open()
        return super().__iter__()

    @property
    def element_spec(self) -> Any:
        # the specs with their column names (the mapped batches carry none)
        return self._dataset.element_spec if self._maps else self._spec

    def _batches(self, spec: Any, count: int) -> tf.data.Dataset:
        """One epoch per new iterator, its batches as tensors of ``spec``.

        tf.data's generator dataset (the op behind ``from_generator``) with three
        functions of the loader's own: a new iterator opens an epoch (its key in a
        registry) at its first element, each element is the epoch's next batch
        through ``tf.py_function`` as one flat list of tensors (``from_generator``
        checks and converts a nested element, about 0.5 ms more per batch of 40
        columns), the end of the epoch is a StopIteration (tf.data's end of
        sequence), and dropping the iterator, mid-epoch or not, closes the epoch's
        threads. Fewer dataset layers and functions to trace than ``from_generator``
        keys flat-mapped to a ``range().map()`` of batches, which stays as the
        fallback where TensorFlow no longer has the op's Python class
        (benchmarks/RESULTS.md, session 11)."""
        flat = tf.nest.flatten(spec)
        blocks, singles = self._block_positions, self._single_positions
        # the py_function's outputs: a (columns, batch) tensor per block, then the
        # other arrays one by one
        dtypes = [flat[g[0]].dtype for g in blocks] + [flat[i].dtype for i in singles]

        # Plain graph-building code: autograph's rewrite of these functions (parsing
        # their source) was a third of building the first loader in a process.
        plain = tf.autograph.experimental.do_not_convert

        @plain
        def next_batch(key: tf.Tensor) -> Any:
            outputs = tf.py_function(self._next_batch, [key], dtypes)
            tensors: list[Any] = [None] * len(flat)
            for g, block in zip(blocks, outputs, strict=False):
                # rows of a contiguous buffer: slices, not copies
                for i, row in zip(g, tf.unstack(block, num=len(g)), strict=True):
                    tensors[i] = row
            for i, tensor in zip(singles, outputs[len(blocks):], strict=True):
                tensors[i] = tensor
            for tensor, s in zip(tensors, flat, strict=True):
                tensor.set_shape(s.shape)
            return tf.nest.pack_sequence_as(spec, tensors)

        if _GeneratorDataset is None:
            def epoch_keys() -> Iterator[int]:
                key = self._open_epoch()
                try:
                    yield key
                finally:
                    self._close_epoch(key)

            keys = tf.data.Dataset.from_generator(epoch_keys,
                                                  output_signature=tf.TensorSpec([], tf.int64))
            return keys.flat_map(plain(
                lambda key: tf.data.Dataset.range(count).map(plain(lambda _: next_batch(key)))))

        @plain
        def open_epoch(_: tf.Tensor) -> tf.Tensor:
            return tf.py_function(self._open_epoch, [], tf.int64)

        @plain
        def close_epoch(key: tf.Tensor) -> tf.Tensor:
            return tf.py_function(self._close_epoch, [key], tf.int64)

        return _GeneratorDataset(tf.constant(0, tf.int64), open_epoch, next_batch, close_epoch,
                                 output_signature=spec)

    def _to_tensors(self, batch: core.Batch) -> list[tf.Tensor]:
        # In the loader's background thread, off tf.data's critical path.
        element = batch if self.core.label_names else batch[0]
        flat = tf.nest.flatten(element)
        out = []
        for g in self._block_positions:
            columns = [flat[i] for i in g]
            block = core.column_block(columns)
            # the core assembles them as one buffer (set_column_blocks); stacked
            # otherwise (a copy), should that ever not hold
            out.append(_tensor(np.stack(columns) if block is None else block))
        out.extend(_tensor(flat[i]) for i in self._single_positions)
        return out

    # tf.data's three calls into the loader, from its own threads. Each is counted
    # (see _close); once the loader is closed at exit they end at once.
    def _enter(self) -> bool:
        """Count a call starting; whether the loader is still open."""
        with self._calls:
            self._started += 1
            self._in_flight += 1
            return not self._closed

    def _leave(self) -> None:
        with self._calls:
            self._in_flight -= 1
            self._calls.notify_all()

    def _open_epoch(self) -> int:
        # A new iterator's first element: one epoch (none once closed: key -1).
        try:
            if not self._enter():
                return -1
            key = next(self._keys)
            self._epochs[key] = self.core.iter_epoch(self.core.next_epoch(), self._to_tensors)
            return key
        finally:
            self._leave()

    def _close_epoch(self, key: Any) -> int:
        # The epoch ended, or its iterator was dropped (at most once per key).
        try:
            self._enter()
            epoch = self._epochs.pop(int(key), None)
            if epoch is not None:
                epoch.close()
            return 0
        finally:
            self._leave()

    def _next_batch(self, key: tf.Tensor) -> list[tf.Tensor]:
        try:
            epoch = self._epochs.get(int(key)) if self._enter() else None
            if epoch is None:  # closed at exit (key -1, or ended by _close)
                raise StopIteration
            return next(epoch)
        finally:
            self._leave()

    def _close(self, deadline: float) -> None:
        """End the open epochs, then wait until tf.data has stopped calling in: no
        call running and none started for :data:`_QUIET_S` (a call tf.data has
        scheduled may still be waiting for the interpreter lock), at most until
        ``deadline`` (``time.monotonic()``). Later calls end at once."""
        with self._calls:
            self._closed = True
            if not self._epochs and not self._in_flight:
                return  # no iterator mid-epoch: tf.data has nothing to call
        for epoch in list(self._epochs.values()):
            epoch.close()
        seen = -1
        while time.monotonic() < deadline:
            with self._calls:
                quiet = not self._in_flight and seen == self._started
                seen = self._started
            # tf.data's thread also runs Python of its own after a call (it formats
            # the exception a closed loader raises): wait for that to end too
            if quiet and not _foreign_python_running():
                return
            time.sleep(_QUIET_S)  # lets a call waiting for the lock in; it ends at once

    def stop(self) -> None:
        """End the epochs under way (``next``, ``peek``, the iterators handed out,
        and those of datasets made from the loader): their reading threads stop now,
        and the next iteration runs the next epoch, whole."""
        super().stop()
        for epoch in list(self._epochs.values()):
            epoch.close()

    def cardinality(self) -> tf.Tensor:
        """tf.data's cardinality: the next iteration's batches (``len(loader)``).

        Keras's ``fit`` reads it once per call and takes it for every epoch of the
        call; when the next epoch is a resumed one (``set_position``), shorter than
        the epochs after it, this warns (:class:`ResumedEpochWarning`): one call of
        several epochs would stop each later epoch early, leaving rows out."""
        count = super().cardinality()
        core = self.core
        whole = plan.split_rows(core.num_rows, core.batch_size, core.global_size,
                                core.drop_last)[core.global_rank].num_batches
        if context.executing_eagerly() and int(count) != whole:
            warnings.warn(
                f"tensorflow.Loader: the next epoch ({core.epoch}, resumed by set_position) "
                f"has {int(count)} batches, the epochs after it {whole}. Keras's fit takes "
                f"the first epoch's length for every epoch of one call and would stop the "
                f"later ones after {int(count)} batches: fit the resumed epoch in a call of "
                f"its own, model.fit(loader, epochs=1), then model.fit(loader, "
                f"initial_epoch=..., epochs=...) for the whole epochs",
                ResumedEpochWarning, stacklevel=2)
        return count

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration run ``epoch`` (see :class:`tabstream.loaders.Loader`)."""
        self.core.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will run."""
        return self.core.epoch

    @property
    def batch_size(self) -> int:
        """Rows per batch; setting it applies from the next epoch on (an epoch under
        way keeps its own), ``len(loader)`` and the cardinality with it."""
        return self.core.batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        self.core.batch_size = value

    def position(self, epoch: int, batches: int) -> dict[str, Any]:
        """Where ``epoch`` stands once every rank has taken ``batches`` batches: plain
        values, free of the number of ranks (:meth:`tabstream.loaders.Loader.position`)."""
        return self.core.position(epoch, batches)

    def set_position(self, position: Mapping[str, Any]) -> None:
        """Resume from :meth:`position`'s output, taken on any number of ranks: the
        next iteration delivers the rows of its epoch not delivered yet
        (:meth:`tabstream.loaders.Loader.set_position`); ``len(loader)`` and the
        dataset's cardinality are that epoch's, then whole epochs' again."""
        self.core.set_position(position)

    def map(self, map_func: Any, num_parallel_calls: Any = None, deterministic: Any = None,
            name: str | None = None) -> Loader:
        """Apply ``map_func`` to every batch from the next epoch on, as
        merlin-dataloader's ``map``: returns the loader itself, changed, so calls
        chain (``Loader(...).map(f).map(g)``) and ``next``, ``peek``, ``iter``, Keras
        and ``tf.function`` loops all get the mapped batches.

        The function runs as tf.data's ``map`` runs it (its arguments too:
        ``num_parallel_calls``, ``deterministic``, ``name``): traced once into the
        input pipeline, called with the element unpacked, ``map_func(features,
        labels)`` (``map_func(features)`` without labels), on graph tensors. So
        ``loader.map(f)`` used the tf.data way gives the mapped dataset too; what
        differs is that the loader is changed. For a mapped dataset that leaves the
        loader as it is, call tf.data's own: ``tf.data.Dataset.map(loader, f)``.

            weighted = Loader(data, 1024).map(lambda x, y: (x, y, x.pop("weight")))
            model.fit(weighted)          # (features, labels, sample_weight) batches
        """
        if not callable(map_func):
            raise TypeError(f"map takes a function of (features, labels), got "
                            f"{type(map_func).__name__} {map_func!r}")
        kwargs = {k: v for k, v in (("num_parallel_calls", num_parallel_calls),
                                    ("deterministic", deterministic), ("name", name))
                  if v is not None}
        maps = [*self._maps, (map_func, kwargs)]
        self._build(maps)  # traces the function: a bad one raises here, nothing kept
        self._maps = maps
        self._build()
        return self

    def __len__(self) -> int:
        return len(self.core)

    def __repr__(self) -> str:
        return repr(self.core).replace("Loader(", "tensorflow.Loader(", 1)


# Loaders not yet collected, for _close_at_exit.
_OPEN: weakref.WeakSet[Loader] = weakref.WeakSet()
# How long exit waits, at most, for tf.data's calls into the loaders to end.
_EXIT_WAIT_S = 10.0
# Quiet for this long (no call into the loader), tf.data has stopped asking.
_QUIET_S = 0.05


class _EagerIterator(iterator_ops.OwnedIterator):
    """The loader's iterator in eager code (``for features, labels in loader``).

    tf.data's own checks every tensor of every element against the element spec
    in Python (``set_shape`` per tensor and the nest packing: 0.17 ms per batch of
    40 columns alone, several times that while the loader's threads compete for
    the interpreter); the iterator op has already checked them against the same
    shapes and types, so this one only packs them. Inside a ``tf.function`` (which
    rebuilds the iterator from its spec) and on any other path it is tf.data's."""

    _ahead: tuple[Any, ...] = ()   # the batch peek() took, not yet delivered
    _closed = False                # stop() ended it: no more batches

    def _next_internal(self) -> Any:
        if not context.executing_eagerly():
            return super()._next_internal()
        if self._ahead:
            (batch,), self._ahead = self._ahead, ()
            return batch
        if self._closed:
            raise tf.errors.OutOfRangeError(None, None, "the loader was stopped")
        with context.execution_mode(context.SYNC):
            tensors = gen_dataset_ops.iterator_get_next(
                self._iterator_resource, output_types=self._flat_output_types,
                output_shapes=self._flat_output_shapes)
        return tf.nest.pack_sequence_as(self._element_spec, tensors)

    # merlin-dataloader's stepping (tabstream.loaders.stepping): the loader's
    # next()/peek() and iter() after them share this iterator
    def peek(self) -> Any:
        """The next batch, left in place (StopIteration at the end of the epoch)."""
        if not self._ahead:
            self._ahead = (next(self),)
        return self._ahead[0]

    def close(self) -> None:
        """End the epoch for this iterator: later calls get no batch. Its reading
        threads stop when tf.data drops the iterator (when it is collected)."""
        self._closed = True
        self._ahead = ()

    @property
    def _type_spec(self) -> Any:
        # How a tf.function (Keras's train step) receives the iterator: the iterator
        # op alone, which would skip a batch peek() holds here. Refused instead.
        if self._ahead:
            raise ValueError(
                "this iterator holds the batch loader.peek() returned, which a "
                "tf.function (Keras fit, a custom tf.function loop) would skip: take it "
                "with next(loader) first, or call loader.stop() to start the next epoch "
                "whole")
        return super()._type_spec


def _foreign_python_running() -> bool:
    """Whether a thread that Python did not start (one of tf.data's) is running
    Python code now: such a thread has a frame only while it holds a call."""
    dummy = getattr(threading, "_DummyThread", ())
    ours = {t.ident for t in threading.enumerate() if not isinstance(t, dummy)}
    return any(ident not in ours for ident in sys._current_frames())


@atexit.register  # after tensorflow's own exit handlers were registered: runs before them
def _close_at_exit() -> None:
    """End every open epoch while the interpreter still runs Python code.

    An iterator dropped mid-epoch (a script that stops after a few batches, Keras's
    ``steps_per_epoch``) keeps tf.data's prefetch thread inside a ``py_function``
    waiting for the next batch. Once the interpreter starts shutting down, that
    thread can no longer run Python: it is ended while it waits for the
    interpreter lock, and the iterator's destructor then waits for it forever
    (a script that took one batch of 65,536 rows from ten files hung at exit in 7
    of 8 runs; with this, 10 of 10 exited).
    Ending the epochs first makes the waiting call return, and tf.data's prefetch
    buffer, full with its result, asks for no more; a call that still comes
    (opening, continuing or closing an epoch) ends at once."""
    deadline = time.monotonic() + _EXIT_WAIT_S
    for loader in list(_OPEN):
        with contextlib.suppress(Exception):  # exit goes on whatever one loader does
            loader._close(deadline)

"""Stepping a loader by hand, as merlin-dataloader's users do: ``next(loader)``,
``loader.peek()``, ``loader.stop()``, ``with Loader(...) as loader:`` and
``loader.map(fn)``.

A tabstream loader is iterable: each ``iter(loader)`` runs the next epoch in a
fresh iterator. Code written for merlin-dataloader also treats the loader itself
as the iterator. :class:`Stepping`, mixed into the core loader and both adapters,
gives that code what it expects, on top of the epochs:

* ``next(loader)`` continues the epoch *under way*, starting the next epoch when
  none is (the first call, or the one after the epoch ended with StopIteration);
* ``peek()`` returns the batch ``next(loader)`` would return, without taking it;
* ``iter(loader)`` after ``next``/``peek`` continues that same epoch, the peeked
  batch first (so ``first = loader.peek(); batches = list(loader)`` gives
  ``batches[0] == first`` and the whole epoch); otherwise a new epoch;
* ``stop()`` (and leaving a ``with`` block) ends the epochs under way, including
  iterators ``iter(loader)`` handed out, and stops their threads: the next
  iteration runs the next epoch, whole;
* ``map(fn)`` applies ``fn(features, labels)`` to every batch from the next epoch
  on and returns the loader; the next ``map`` gets what the previous returned,
  unpacked (``fn(*batch)``). The core and torch loaders call it in the background
  thread; the TensorFlow loader traces it into its tf.data pipeline (see
  :meth:`tabstream.loaders.tensorflow.Loader.map`);
* ``loader.batch_size = n`` applies from the next epoch on.

The TensorFlow loader, a ``tf.data.Dataset``, follows these rules in eager code;
its stepping iterator is a tf.data iterator, so Keras and ``tf.function`` loops
take it too (one holding a peeked batch is refused there: it would skip the batch).

For example::

    loader = Loader(data, batch_size=2)
    first = loader.peek(); again = next(loader)  # the same batch
    with loader.map(lambda x, y: (x, y, x.pop("weight"))) as weighted:
        for features, labels, weights in weighted: ...
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol, runtime_checkable

__all__ = ["Peekable", "Stepper", "Stepping"]


class Peekable:
    """An epoch's batches with one batch of look-ahead, closed once (its ``close``,
    or ``closer``, ends the epoch's threads)."""

    def __init__(self, batches: Iterator[Any], closer: Callable[[], Any] | None = None) -> None:
        self._batches: Iterator[Any] | None = batches
        self._closer = closer
        self._ahead: list[Any] = []

    def __iter__(self) -> Peekable:
        return self

    def __next__(self) -> Any:
        if self._ahead:
            return self._ahead.pop()
        if self._batches is None:
            raise StopIteration
        try:
            return next(self._batches)
        except StopIteration:
            self.close()
            raise

    def peek(self) -> Any:
        """The next batch, left in place (StopIteration at the end of the epoch)."""
        if not self._ahead:
            self._ahead.append(next(self))
        return self._ahead[0]

    def close(self) -> None:
        batches, self._batches = self._batches, None
        self._ahead.clear()
        closer = self._closer or getattr(batches, "close", None)
        self._closer = None
        if batches is not None and closer is not None:
            closer()


@runtime_checkable
class Stepper(Protocol):
    """An epoch's batches that ``next``/``peek`` step through and ``stop`` closes:
    a :class:`Peekable`, or an iterator with these of its own (the TensorFlow
    loader's, which must stay a tf.data iterator for Keras and ``tf.function``)."""

    def __iter__(self) -> Any: ...

    def __next__(self) -> Any: ...

    def peek(self) -> Any: ...

    def close(self) -> None: ...


class Stepping:
    """merlin-dataloader's stepping methods (see the module docstring). A class
    mixing it in provides :meth:`_open_iteration`, one new epoch's batches as
    delivered; its ``__iter__`` may return :meth:`_continue_or_open`."""

    _stepping: Stepper | None = None

    def _open_iteration(self) -> Iterator[Any]:  # pragma: no cover - abstract
        raise NotImplementedError

    def _handed_out(self) -> weakref.WeakSet:
        handed = self.__dict__.get("_handed")
        if handed is None:
            handed = self.__dict__["_handed"] = weakref.WeakSet()
        return handed

    def _open_tracked(self) -> Stepper:
        batches = self._open_iteration()
        stepper = batches if isinstance(batches, Stepper) else Peekable(batches)
        self._handed_out().add(stepper)
        return stepper

    def _continue_or_open(self) -> Stepper:
        """The epoch ``next``/``peek`` started, else a new one."""
        stepper, self._stepping = self._stepping, None
        return stepper if stepper is not None else self._open_tracked()

    def _stepper(self) -> Stepper:
        if self._stepping is None:
            self._stepping = self._open_tracked()
        return self._stepping

    def __next__(self) -> Any:
        try:
            return next(self._stepper())
        except StopIteration:
            self._stepping = None
            raise

    def peek(self) -> Any:
        """The batch ``next(loader)`` returns next, without taking it (the next epoch
        starts when none is under way)."""
        try:
            return self._stepper().peek()
        except StopIteration:
            self._stepping = None
            raise

    def stop(self) -> None:
        """End the epochs under way (``next``, ``peek`` and the iterators handed
        out): their threads stop, and the next iteration runs the next epoch."""
        self._stepping = None
        for stepper in list(self._handed_out()):
            stepper.close()
        self._handed_out().clear()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


class Mapped:
    """``map(fn)`` for the loaders that deliver batches themselves (core, torch)."""

    _map_fns: tuple[Callable[..., Any], ...] = ()

    def map(self, fn: Callable[..., Any]) -> Any:
        """Apply ``fn(*batch)`` to each batch from the next epoch on (``fn(features,
        labels)`` first, then with what the previous function returned); returns
        the loader, so calls chain."""
        if not callable(fn):
            raise TypeError(f"map takes a function of (features, labels), got "
                            f"{type(fn).__name__} {fn!r}")
        self._map_fns = (*self._map_fns, fn)
        return self

    def _mapping(self, transform: Callable[[Any], Any] | None = None
                 ) -> Callable[[Any], Any] | None:
        """``transform`` followed by the map functions (None when neither)."""
        fns = self._map_fns
        if not fns:
            return transform

        def apply(batch: Any) -> Any:
            if transform is not None:
                batch = transform(batch)
            for fn in fns:
                batch = fn(*batch)
            return batch

        return apply

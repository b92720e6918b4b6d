"""The loader's arguments, checked once: :class:`LoaderOptions`.

The core :class:`tabstream.loaders.Loader` and the torch and TensorFlow adapters
take the same arguments, in the same order, with the same defaults; each builds one
``LoaderOptions`` from them and the core reads its settings from it, so the checks
(and their messages) live here alone. The adapters' own arguments (``device``,
``keyed_jagged``) are not part of it.

    >>> opts = LoaderOptions("out/train", 1024, seed=3)
    >>> opts.batch_size, opts.shuffle, opts.global_size, opts.global_rank
    (1024, False, 1, 0)
    >>> LoaderOptions("out/train", 0)
    Traceback (most recent call last):
    ...
    ValueError: batch_size must be >= 1, got 0
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

import numpy as np

__all__ = ["LIST_LAYOUTS", "LoaderOptions", "check_int"]

#: How ragged list features are delivered: ``"tuple"``, ``features["tags"] = (values,
#: offsets)``; ``"flat"``, merlin-dataloader's ``features["tags__values"]`` and
#: ``features["tags__offsets"]`` (lists of lists: ``__values``, ``__outer_offsets``,
#: ``__inner_offsets``). Padded and fixed-length lists stay ``(dense, mask)``.
LIST_LAYOUTS = ("tuple", "flat")


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int, refused (naming ``name``) when it is not an integer
    (booleans included) or is below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class LoaderOptions:
    """The arguments of :class:`tabstream.loaders.Loader`, in its order (see its
    docstring for what each means), checked on construction.

    Numbers are checked (ints of at least their minimum; ``global_rank <
    global_size``) and normalized: ``global_size``/``global_rank`` of ``None``
    become 1 and 0 (the adapters put the process group's or strategy's in first),
    ``shuffle``/``drop_last`` plain bools. ``features``, ``labels``, ``pad`` and
    ``transforms`` are checked against the dataset's schema when the loader opens
    it. ``dataclasses.replace(options, seed=1)`` checks again.
    """

    data: Any
    batch_size: int
    shuffle: bool = False
    seed: int = 0
    parts_per_chunk: int = 2
    global_size: int | None = None
    global_rank: int | None = None
    drop_last: bool = False
    _: KW_ONLY
    features: Any = None
    labels: Any = None
    pad: bool | Mapping[str, Any] = False
    prefetch: int = 2
    storage_options: dict | None = None
    transforms: Any = None
    list_layout: str = "tuple"

    def __post_init__(self) -> None:
        if self.list_layout not in LIST_LAYOUTS:
            raise ValueError(f"list_layout must be one of {list(LIST_LAYOUTS)}, got "
                             f"{self.list_layout!r}")
        checked = {
            "batch_size": check_int("batch_size", self.batch_size, 1),
            "seed": check_int("seed", self.seed, 0),
            "parts_per_chunk": check_int("parts_per_chunk", self.parts_per_chunk, 1),
            "prefetch": check_int("prefetch", self.prefetch, 1),
            "global_size": check_int("global_size",
                                     1 if self.global_size is None else self.global_size, 1),
            "global_rank": check_int("global_rank",
                                     0 if self.global_rank is None else self.global_rank, 0),
        }
        if checked["global_rank"] >= checked["global_size"]:
            raise ValueError(f"global_rank must be < global_size={checked['global_size']}, "
                             f"got {checked['global_rank']}")
        checked["shuffle"] = bool(self.shuffle)
        checked["drop_last"] = bool(self.drop_last)
        for name, value in checked.items():
            object.__setattr__(self, name, value)

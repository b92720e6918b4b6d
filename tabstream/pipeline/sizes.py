"""Byte sizes given as a number or as text (``"128MB"``, ``"1.5 GiB"``): a Dataset's
``part_size`` and its CSV parser's ``block_size``."""

from __future__ import annotations

import re

import numpy as np

__all__ = ["DEFAULT_PART_SIZE", "parse_bytes"]

DEFAULT_PART_SIZE = 64 * 2**20


def parse_bytes(size: int | str | None) -> int:
    """``"128MB"`` -> 134217728. Integers pass through."""
    if size is None:
        return DEFAULT_PART_SIZE
    if isinstance(size, (int, np.integer)):
        if size <= 0:
            raise ValueError(f"part_size must be positive, got {size}")
        return int(size)
    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?i?b?)\s*", str(size).lower())
    if not m:
        raise ValueError(f"cannot parse part_size {size!r}; expected e.g. 128MB, 1GB or a byte count")
    unit = m.group(2).rstrip("b").rstrip("i")
    scale = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}[unit]
    value = int(float(m.group(1)) * scale)
    if value <= 0:
        raise ValueError(f"part_size must be positive, got {size!r}")
    return value

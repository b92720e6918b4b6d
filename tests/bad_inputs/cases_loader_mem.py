"""Dataset(cache=...): values a user gets wrong."""

from __future__ import annotations

import tabstream as ts


def _unknown_cache(tmp):
    (tmp / "raw.tsv").write_text("1\t2\n")
    ts.Dataset(str(tmp / "raw.tsv"), names=["a", "b"], cache="memory")


def _cache_dir_missing(tmp):
    # an explicit "disk" cache that cannot be written is an error ("auto" parses again)
    (tmp / "raw.tsv").write_text("1\t2\n")
    ds = ts.Dataset(str(tmp / "raw.tsv"), names=["a", "b"], cache="disk",
                    cache_dir=str(tmp / "no_such_dir"))
    ds.read_piece(ds.pieces[0])


CASES = [
    ("unknown cache value", _unknown_cache, ValueError,
     r"cache must be 'auto', 'disk' or None, got 'memory'"),
    ("explicit disk cache into a missing folder", _cache_dir_missing, FileNotFoundError,
     r"no_such_dir"),
]

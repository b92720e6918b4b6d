"""Shuffled, sharded batches from exported parquet.

The core here yields numpy batches and imports no framework; the adapters
``tabstream.loaders.torch.Loader`` and ``tabstream.loaders.tensorflow.Loader``
turn them into tensors (import those modules explicitly).
"""

from tabstream.loaders.core import Batch, Layout, Loader, pad_lists, pad_nested
from tabstream.loaders.options import LoaderOptions
from tabstream.loaders.plan import RankShare, split_rows
from tabstream.loaders.source import ParquetSource, open_source

__all__ = ["Batch", "Layout", "Loader", "LoaderOptions", "ParquetSource", "RankShare", "open_source",
           "pad_lists", "pad_nested", "split_rows"]

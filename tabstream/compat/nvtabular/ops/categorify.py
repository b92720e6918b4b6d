"""``nvtabular.ops.categorify``: where NVTabular code imports ``get_embedding_sizes`` from."""

from tabstream.compat.nvtabular.ops import Categorify, get_embedding_sizes

__all__ = ["Categorify", "get_embedding_sizes"]

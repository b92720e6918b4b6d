"""``get_embedding_sizes``: the embedding table sizes of a fitted workflow's (or
node's) categorical outputs, as NVTabular's function of the same name returns them.

>>> import pandas as pd
>>> import tabstream as ts
>>> from tabstream import ops
>>> cats = ["user"] >> ops.Categorify()
>>> wf = ts.Workflow(cats).fit(pd.DataFrame({"user": ["a", "b", "a"]}))
>>> get_embedding_sizes(wf) == get_embedding_sizes(cats) == {"user": (5, 16)}
True
"""

from __future__ import annotations

from typing import Any

from tabstream.core.schema import Schema, Tags

__all__ = ["get_embedding_sizes"]


def get_embedding_sizes(source: Any, output_dtypes: dict | None = None) -> Any:
    """``{column: (cardinality, dimension)}`` of every categorical output of
    ``source`` (a fitted Workflow, or a node of one) that carries
    ``properties["embedding_sizes"]``. When some are ragged lists (multi-hot), a pair
    ``(single_hot, multi_hot)`` of such dicts, as NVTabular returns.
    ``output_dtypes`` is accepted for NVTabular's signature and not needed."""
    schema = source.output_schema
    if not isinstance(schema, Schema):
        raise TypeError(f"get_embedding_sizes takes a fitted Workflow or a node of one, got "
                        f"{type(source).__name__}")
    single: dict[str, tuple[int, int]] = {}
    multi: dict[str, tuple[int, int]] = {}
    for col in schema.select_by_tag(Tags.CATEGORICAL):
        sizes = col.properties.get("embedding_sizes")
        if not sizes:
            continue
        pair = (int(sizes["cardinality"]), int(sizes["dimension"]))
        (multi if col.is_list and col.is_ragged else single)[col.name] = pair
    return (single, multi) if multi else single

"""Ops that change schema metadata only: AddTags, AddMetadata."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from tabstream.core.operators import Operator
from tabstream.core.schema import ColumnSchema, Tags, normalize_tags

__all__ = ["AddMetadata", "AddTags"]


class AddTags(Operator):
    """Add tags to the selected columns; data passes through unchanged.

    >>> import pandas as pd
    >>> import tabstream as ts
    >>> wf = ts.Workflow(["label"] >> AddTags([Tags.TARGET, Tags.BINARY_CLASSIFICATION]))
    >>> sorted(t.value for t in wf.fit(pd.DataFrame({"label": [1, 0]})).output_schema["label"].tags)
    ['binary_classification', 'target']
    """

    def __init__(self, tags: Iterable[Tags | str] | Tags | str) -> None:
        self.tags = sorted(t.value for t in normalize_tags(tags))

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        return col.with_tags(self.tags)

    def transform(self, table: pa.Table) -> pa.Table:
        return table


class AddMetadata(Operator):
    """Add tags and/or properties to the selected columns."""

    def __init__(self, tags: Iterable[Tags | str] | None = None,
                 properties: dict[str, Any] | None = None) -> None:
        self.tags = sorted(t.value for t in normalize_tags(tags))
        self.properties = dict(properties or {})

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        return col.with_tags(self.tags).with_properties(**self.properties)

    def transform(self, table: pa.Table) -> pa.Table:
        return table

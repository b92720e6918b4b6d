"""DropLowCardinality: drop categorical columns with too few distinct values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.backends import current as backend
from tabstream.core.operators import StatOperator
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops.numeric import valid_values

__all__ = ["DropLowCardinality"]


# Categorify's reserved ids (padding, missing, out-of-vocabulary): a column with k
# distinct values gets ids up to k + _RESERVED_IDS - 1.
_RESERVED_IDS = 3


def _largest_id(col: ColumnSchema) -> int | None:
    """Largest id of a categorical column by its schema (``domain.max``, else
    ``embedding_sizes.cardinality - 1``); None when the schema has neither."""
    domain = col.properties.get("domain")
    if isinstance(domain, dict) and domain.get("max") is not None:
        return int(domain["max"])
    sizes = col.properties.get("embedding_sizes")
    if isinstance(sizes, dict) and sizes.get("cardinality") is not None:
        return int(sizes["cardinality"]) - 1
    return None


class DropLowCardinality(StatOperator):
    """Drop categorical columns with too few ids: NVTabular's rule.

    A column tagged categorical (and not target) is dropped when its largest id in
    the schema (``domain.max``, as Categorify and Bucketize set it, else
    ``embedding_sizes.cardinality - 1``) is below ``min_cardinality``; a column
    whose largest id equals it stays. Every other column (continuous, untagged,
    target) is kept. With Categorify's three reserved ids (0 padding, 1 missing,
    2 out-of-vocabulary) the default ``min_cardinality=4`` drops columns of one
    distinct value::

        schema: cat domain.max=3 (1 value), cat2 domain.max=4 (2 values), label (target), price
        ["cat", "cat2", "label", "price"] >> DropLowCardinality()   # cat2, label, price

    A categorical column without a domain (not encoded yet) is judged as Categorify
    would encode it: fit counts its distinct non-missing values ``k`` (null and NaN
    are missing, ``-0.0`` is ``0.0``, list columns count their elements) and the
    column is dropped when ``k + 2 < min_cardinality``. Each partial keeps at most
    ``min_cardinality`` values per such column, so memory stays tiny. Before fit
    those columns are listed in the output schema; ``dropped`` names the columns
    the op removes.
    """

    # saved-state declaration, checked by Workflow.load (see StatOperator.state_types)
    state_types = {"distinct": dict[str, int]}

    def __init__(self, min_cardinality: int = 4) -> None:
        super().__init__()
        if isinstance(min_cardinality, bool) or not isinstance(min_cardinality, (int, np.integer)):
            raise TypeError(f"DropLowCardinality: min_cardinality must be an integer, "
                            f"got {min_cardinality!r}")
        if min_cardinality < 1:
            raise ValueError(f"DropLowCardinality: min_cardinality must be an integer >= 1, "
                             f"got {min_cardinality!r}")
        self.min_cardinality = int(min_cardinality)
        #: distinct non-missing values (at most min_cardinality) of each categorical
        #: column without a domain in the schema, counted at fit
        self.distinct: dict[str, int] = {}
        self._schema: Schema | None = None

    def _verdict(self, col: ColumnSchema) -> str:
        """'keep', 'drop', 'count' (categorical without a domain: fit counts its
        values) or 'later' (output of a Categorify not fitted yet: its domain comes)."""
        if Tags.CATEGORICAL not in col.tags or Tags.TARGET in col.tags:
            return "keep"
        largest = _largest_id(col)
        if largest is None:
            return "later" if "start_index" in col.properties else "count"
        return "drop" if largest < self.min_cardinality else "keep"

    def _dropped(self, schema: Schema) -> list[str]:
        from tabstream.core.errors import SchemaError

        out = []
        for col in schema:
            verdict = self._verdict(col)
            if verdict in ("count", "later") and self.fitted:
                if col.name not in self.distinct:
                    raise SchemaError(
                        f"DropLowCardinality: categorical column {col.name!r} has no domain in "
                        "the schema and its values were not counted at fit; fit the workflow "
                        "again (Workflow.fit) with this input")
                largest = self.distinct[col.name] + _RESERVED_IDS - 1
                verdict = "drop" if largest < self.min_cardinality else "keep"
            if verdict == "drop":
                out.append(col.name)
        return out

    @property
    def dropped(self) -> list[str]:
        """Columns removed, for the input schema last seen (none before one is known)."""
        return [] if self._schema is None else self._dropped(self._schema)

    def compute_output_schema(self, input_schema: Schema) -> Schema:
        # transform sees only a table: remember the schema its decisions rest on
        self._schema = input_schema
        return input_schema.without(self._dropped(input_schema))

    def _to_count(self, names: Sequence[str]) -> list[str]:
        schema = self._schema
        if schema is None:
            return []
        return [n for n in names if n in schema and self._verdict(schema[n]) == "count"]

    def _smallest(self, values: pa.Array) -> pa.Array:
        uniq = backend().distinct(values)
        return uniq.take(pc.sort_indices(uniq)[: self.min_cardinality])

    def fit_partition(self, table: pa.Table) -> dict[str, pa.Array]:
        return {name: self._smallest(valid_values(table.column(name)))
                for name in self._to_count(table.column_names)}

    def combine(self, partials: Sequence[dict[str, pa.Array]]) -> dict[str, pa.Array]:
        return {name: self._smallest(pa.concat_arrays([p[name] for p in partials]))
                for name in partials[0]}

    def finalize(self, partial: dict[str, pa.Array]) -> None:
        self.distinct = {name: len(values) for name, values in partial.items()}
        self.fitted = True

    def transform(self, table: pa.Table) -> pa.Table:
        self.check_fitted()
        return table.drop_columns([c for c in self.dropped if c in table.column_names])

    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        return {"distinct": dict(self.distinct)}, {}

    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        self.distinct = {str(k): int(v) for k, v in values["distinct"].items()}
        self.fitted = True

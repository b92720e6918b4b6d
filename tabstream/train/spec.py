"""The framework-neutral feature spec that the torch and Keras models build from.

One reading of a schema decides, for both frameworks, which columns a model sees
and how:

* columns tagged ``TARGET`` are labels, never features;
* a ``CATEGORICAL`` column is embedded (one table per column, or per shared
  vocabulary), also when it is tagged ``CONTINUOUS`` as well: its values are ids,
  and feeding an id to a model as a float is never what was meant;
* a ``CONTINUOUS`` column (not categorical) is one float per row; a continuous
  list column is refused (the bundled models take scalars);
* categorical list columns are pooled (``combiner``) into one vector per row.

The batch layout is the loaders' (see ``tabstream.loaders``): per row-batch of
``B`` rows, a single-hot id column is ``(B,)`` int64, a list column is
``(values (nnz,), offsets (B + 1,))`` or ``(padded (B, L), mask (B, L))``, a
continuous column is ``(B,)`` float32::

    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> def categorical(name, n, is_list=False):
    ...     return ColumnSchema(name, "int64", tags=[Tags.CATEGORICAL], is_list=is_list,
    ...                         properties={"domain": {"min": 0, "max": n - 1}})
    >>> schema = Schema([categorical("C1", 1000), categorical("tags", 50, is_list=True),
    ...                  ColumnSchema("x", "float32", tags=[Tags.CONTINUOUS]),
    ...                  ColumnSchema("click", "float32", tags=[Tags.TARGET])])
    >>> spec = feature_spec(schema)     # C1: 1,000 ids; tags: list of 50 ids; x: float; click: target
    >>> spec.categorical, spec.lists, spec.continuous, spec.targets
    (('C1', 'tags'), ('tags',), ('x',), ('click',))
    >>> spec.layouts
    {'C1': 'single-hot', 'tags': 'list', 'x': 'continuous'}
    >>> spec.output_dims, spec.concat_dim      # dims from floor(card ** 0.25 * 2) -> multiple of 8
    ({'C1': 16, 'tags': 8}, 25)
    >>> {k: v.shape for k, v in spec.example_batch(4).items()}     # numpy, ragged lists
    {'C1': (4,), 'tags__values': (...,), 'tags__offsets': (5,), 'x': (4,)}

``tabstream.train.torch`` and ``tabstream.train.tensorflow`` both call
:func:`feature_spec` (and the argument checks below), so a schema gives the same
features, the same tables and the same errors in either framework.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tabstream.core.schema import Schema, Tags
from tabstream.train.tables import TableConfig, table_configs_from_schema

__all__ = [
    "FeatureSpec",
    "check_positive",
    "check_threshold",
    "feature_spec",
]


@dataclass(frozen=True)
class FeatureSpec:
    """What a model built from a schema reads (see the module docstring).

    Attributes:
        tables: the embedding tables (plain configs, never mutated).
        categorical: categorical feature columns, in schema order.
        lists: those of ``categorical`` that are list (multi-hot) columns.
        continuous: scalar continuous feature columns, in schema order.
        targets: the label columns.
    """

    tables: tuple[TableConfig, ...]
    categorical: tuple[str, ...]
    lists: tuple[str, ...]
    continuous: tuple[str, ...]
    targets: tuple[str, ...]

    @property
    def features(self) -> tuple[str, ...]:
        """Every feature column: categorical ones, then continuous ones."""
        return self.categorical + self.continuous

    @property
    def layouts(self) -> dict[str, str]:
        """``{column: "single-hot" | "list" | "continuous"}``."""
        out = {c: ("list" if c in self.lists else "single-hot") for c in self.categorical}
        out.update({c: "continuous" for c in self.continuous})
        return out

    @property
    def output_dims(self) -> dict[str, int]:
        """``{categorical column: embedding dim}``."""
        return {f: t.dim for t in self.tables for f in t.feature_names}

    @property
    def concat_dim(self) -> int:
        """Width of all embeddings and continuous features side by side."""
        return sum(self.output_dims.values()) + len(self.continuous)

    def example_batch(
        self, batch_size: int = 2, list_layout: str = "ragged", seed: int = 0
    ) -> dict[str, np.ndarray]:
        """Random numpy features in the loaders' layout: valid ids for every table,
        lists of 0 to 3 ids (``list_layout="ragged"``: ``name__values`` and
        ``name__offsets``; ``"padded"``: ``name`` ``(B, 3)`` and ``name__mask``),
        standard-normal floats for continuous columns."""
        if list_layout not in ("ragged", "padded"):
            raise ValueError(f"list_layout must be 'ragged' or 'padded', got {list_layout!r}")
        check_threshold(batch_size, "batch_size")
        rng = np.random.default_rng(seed)
        cards = {f: t.cardinality for t in self.tables for f in t.feature_names}
        batch: dict[str, np.ndarray] = {}
        for name in self.categorical:
            if name not in self.lists:
                batch[name] = rng.integers(0, cards[name], batch_size, dtype=np.int64)
                continue
            lengths = rng.integers(0, 4, batch_size)
            if list_layout == "ragged":
                batch[f"{name}__values"] = rng.integers(0, cards[name], int(lengths.sum()),
                                                        dtype=np.int64)
                batch[f"{name}__offsets"] = np.r_[0, np.cumsum(lengths)].astype(np.int64)
            else:
                batch[name] = rng.integers(0, cards[name], (batch_size, 3), dtype=np.int64)
                batch[f"{name}__mask"] = np.arange(3)[None, :] < lengths[:, None]
        for name in self.continuous:
            batch[name] = rng.standard_normal(batch_size).astype(np.float32)
        return batch

    def select(self, names: Any) -> FeatureSpec:
        """The spec restricted to the feature columns in ``names`` (e.g. one tower's)."""
        keep = set(names)
        return FeatureSpec(
            tables=tuple(t for t in self.tables if set(t.feature_names) & keep),
            categorical=tuple(c for c in self.categorical if c in keep),
            lists=tuple(c for c in self.lists if c in keep),
            continuous=tuple(c for c in self.continuous if c in keep),
            targets=self.targets,
        )


def feature_spec(
    schema: Schema | Mapping[str, Any],
    dim: int | dict[str, int] | None = None,
    infer_sizes: bool = True,
    multiplier: float = 2.0,
    combiner: str = "sum",
) -> FeatureSpec:
    """Read ``schema`` into a :class:`FeatureSpec` (rules in the module docstring);
    table sizes as in :func:`tabstream.train.table_configs_from_schema`.

    Raises:
        TypeError: ``schema`` is not a Schema (or its dict form).
        ValueError: a continuous list column, or a categorical column without a
            domain (its cardinality is unknown).
    """
    if isinstance(schema, Mapping) and not isinstance(schema, Schema):
        schema = Schema.from_dict(dict(schema))
    if not isinstance(schema, Schema):
        raise TypeError(f"schema must be a tabstream Schema, got {type(schema).__name__}")
    targets = tuple(c.name for c in schema if Tags.TARGET in c.tags)
    features = schema.without(list(targets))
    categorical = tuple(c.name for c in features if Tags.CATEGORICAL in c.tags)
    continuous_cols = [
        c for c in features if Tags.CONTINUOUS in c.tags and Tags.CATEGORICAL not in c.tags
    ]
    continuous_lists = [c.name for c in continuous_cols if c.is_list]
    if continuous_lists:
        raise ValueError(
            f"continuous list columns {continuous_lists} are not supported by the bundled "
            "models; drop them from the schema or reduce them to scalars first"
        )
    tables = (
        table_configs_from_schema(
            features.select_by_name(list(categorical)), dim=dim, infer_sizes=infer_sizes,
            multiplier=multiplier, combiner=combiner,
        )
        if categorical
        else []
    )
    return FeatureSpec(
        tables=tuple(tables),
        categorical=categorical,
        lists=tuple(c.name for c in features if c.name in categorical and c.is_list),
        continuous=tuple(c.name for c in continuous_cols),
        targets=targets,
    )


def check_threshold(value: Any, what: str = "threshold") -> int:
    """A count (rows, sizes): ``TypeError`` unless an int (``bool`` is not one),
    ``ValueError`` unless >= 1. The same rule in both frameworks."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value}")
    return int(value)


def check_positive(value: Any, what: str) -> float:
    """A real setting that must be > 0 (a temperature, a learning rate):
    ``TypeError`` unless a number, ``ValueError`` unless positive and finite."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{what} must be a number, got {value!r} ({type(value).__name__})")
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{what} must be > 0 and finite, got {value}")
    return float(value)

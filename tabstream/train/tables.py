"""Framework-neutral embedding table configuration derived from a schema.

Both ``tabstream.train.torch`` and ``tabstream.train.tensorflow`` build their
embedding modules from these plain configs and never mutate them.

>>> infer_embedding_dim(1_000_000)     # floor(1e6 ** 0.25 * 2) = 63 -> 64
64
"""

from __future__ import annotations

from dataclasses import dataclass

from tabstream.core.schema import Schema, Tags, infer_embedding_dim

__all__ = ["TableConfig", "infer_embedding_dim", "table_configs_from_schema"]


@dataclass(frozen=True)
class TableConfig:
    """One embedding table: ``cardinality`` rows of ``dim`` floats, looked up by the
    columns in ``feature_names`` (several when a vocabulary is shared). Multi-hot
    (list) features are pooled with ``combiner`` ("sum" or "mean"), or with
    ``combiner=None`` looked up per id: ``(B, L, dim)`` plus the ``(B, L)`` mask.

    ``list_features`` names the features of ``feature_names`` that are list columns
    (a single-hot ``item_id`` may share its table with a list ``history_item_ids``);
    ``is_list`` is then whether any is. With ``list_features=None`` (configs written
    by hand or by older versions) every feature is a list exactly when ``is_list``.
    Ask :meth:`is_list_feature` rather than ``is_list`` about one feature."""

    name: str
    cardinality: int
    dim: int
    feature_names: tuple[str, ...]
    is_list: bool = False
    combiner: str | None = "sum"
    list_features: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.cardinality <= 0 or self.dim <= 0:
            raise ValueError(
                f"table {self.name!r}: cardinality and dim must be positive, "
                f"got {self.cardinality} x {self.dim}"
            )
        if self.combiner not in ("sum", "mean", None):
            raise ValueError(f"table {self.name!r}: combiner must be 'sum', 'mean' or None "
                             f"(one vector per id), got {self.combiner!r}")
        if self.list_features is not None:
            extra = sorted(set(self.list_features) - set(self.feature_names))
            if extra:
                raise ValueError(f"table {self.name!r}: list_features {extra} are not among "
                                 f"its feature_names {list(self.feature_names)}")
            if self.is_list != bool(self.list_features):
                raise ValueError(f"table {self.name!r}: is_list={self.is_list} disagrees with "
                                 f"list_features={self.list_features!r}; is_list must be True "
                                 "exactly when some feature is a list")

    def is_list_feature(self, feature: str) -> bool:
        """Whether ``feature`` (one of ``feature_names``) is a list column."""
        if self.list_features is None:
            return self.is_list
        return feature in self.list_features


def table_configs_from_schema(
    schema: Schema,
    dim: int | dict[str, int] | None = None,
    infer_sizes: bool = True,
    multiplier: float = 2.0,
    combiner: str = "sum",
) -> list[TableConfig]:
    """One table per categorical column, or one per shared vocabulary.

    Columns whose ``properties["domain"]["name"]`` (set by a joint Categorify) is the
    same share one table. ``dim`` fixes the dimension for all tables (an int) or per
    table (a dict); otherwise, with ``infer_sizes``, the schema's
    ``embedding_sizes.dimension`` is used, falling back to :func:`infer_embedding_dim`.
    """
    groups: dict[str, list] = {}
    for col in schema.select_by_tag(Tags.CATEGORICAL):
        if Tags.TARGET in col.tags:
            continue  # a categorical target is predicted, not embedded
        if col.cardinality is None:
            raise ValueError(
                f"categorical column {col.name!r} has no domain in its schema; "
                "fit a Categorify/HashBucket on it or set properties['domain']"
            )
        table = str(col.properties.get("domain", {}).get("name") or col.name)
        groups.setdefault(table, []).append(col)

    configs = []
    for table, cols in groups.items():
        cardinality = max(int(c.cardinality) for c in cols)
        if isinstance(dim, dict):
            d = dim.get(table, dim.get(cols[0].name))
        else:
            d = dim
        if d is None:
            sizes = cols[0].properties.get("embedding_sizes") or {}
            if infer_sizes or not sizes.get("dimension"):
                d = infer_embedding_dim(cardinality, multiplier)
            else:
                d = int(sizes["dimension"])
        configs.append(
            TableConfig(
                name=table,
                cardinality=cardinality,
                dim=int(d),
                feature_names=tuple(c.name for c in cols),
                is_list=any(c.is_list for c in cols),
                combiner=combiner,
                list_features=tuple(c.name for c in cols if c.is_list),
            )
        )
    return configs


#: suffix of a Wide&Deep wide table's name in a parameter server: ``C1`` -> ``C1_wide``
WIDE_SUFFIX = "_wide"


def wide_table_configs(schema: Schema, combiner: str = "sum") -> list[TableConfig]:
    """The 1-wide tables of a Wide&Deep model's wide part over ``schema``'s
    categorical columns, named ``<table>_wide`` (so that one parameter server can
    hold them beside the deep tables of the same features)."""
    from tabstream.train.spec import feature_spec

    return [TableConfig(cfg.name + WIDE_SUFFIX, cfg.cardinality, 1, cfg.feature_names,
                        cfg.is_list, cfg.combiner, cfg.list_features)
            for cfg in feature_spec(schema, dim=1, combiner=combiner).tables]

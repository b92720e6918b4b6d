"""Column schemas and tags.

A :class:`Schema` is an ordered collection of :class:`ColumnSchema`; it is
computed for a workflow's output before any data is read and written beside
every export as ``_schema.json``::

    {"columns": [{"name": "C1", "dtype": "int64", "tags": ["categorical"],
                  "is_list": false, "is_ragged": false,
                  "properties": {"domain": {"min": 0, "max": 41},
                                 "embedding_sizes": {"cardinality": 42, "dimension": 16}}}]}
"""

from __future__ import annotations

import difflib
import enum
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import fsspec

from tabstream.core.jsonfile import loads_json

__all__ = ["ColumnSchema", "CustomTag", "EMBEDDING_RULES", "Schema", "Tags", "embedding_dim",
           "infer_embedding_dim"]


class Tags(str, enum.Enum):
    """Semantic tags attached to columns; the loaders and models select by them."""

    CATEGORICAL = "categorical"
    CONTINUOUS = "continuous"
    TARGET = "target"
    BINARY_CLASSIFICATION = "binary_classification"
    REGRESSION = "regression"
    LIST = "list"
    ID = "id"
    USER = "user"
    ITEM = "item"
    USER_ID = "user_id"
    ITEM_ID = "item_id"
    CONTEXT = "context"
    EMBEDDING = "embedding"

    def __str__(self) -> str:  # "categorical", not "Tags.CATEGORICAL"
        return self.value


# Composite tags expand to several plain tags (as in Merlin: USER_ID is USER + ID).
_EXPANSIONS = {
    Tags.USER_ID: (Tags.USER, Tags.ID),
    Tags.ITEM_ID: (Tags.ITEM, Tags.ID),
}


class CustomTag(str):
    """A free-form tag beside the :class:`Tags` members (Merlin allows any string:
    ``"session_id"``, ``"sequence"``): a string with the ``value`` a member has."""

    __slots__ = ()

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"CustomTag({str.__repr__(self)})"


def normalize_tags(tags: Iterable[Tags | str] | Tags | str | None) -> frozenset[Tags]:
    """Turn tags given as enum members or strings into a set of :class:`Tags`; a
    string that names no member is a free-form :class:`CustomTag`, unless it looks
    like a misspelt member (``"categorial"``), which is an error."""
    if tags is None:
        return frozenset()
    if isinstance(tags, (str, Tags)):
        tags = [tags]
    out: set[Any] = set()
    for tag in tags:
        if isinstance(tag, (Tags, CustomTag)):
            t: Any = tag
        elif not isinstance(tag, str) or not tag:
            raise TypeError(f"a tag is a Tags member or a non-empty string, got {tag!r}")
        else:
            try:
                t = Tags(tag.lower())
            except ValueError:
                close = difflib.get_close_matches(tag.lower(), [m.value for m in Tags], n=1, cutoff=0.85)
                if close:
                    raise ValueError(f"unknown tag {tag!r}; did you mean {close[0]!r}? (a free-form tag "
                                     "may be any string that does not look like a Tags member)") from None
                t = CustomTag(tag)
        out.add(t)
        out.update(_EXPANSIONS.get(t, ()))
    return frozenset(out)


@dataclass(frozen=True)
class ColumnSchema:
    """One column: its name, element dtype (a numpy-style name such as ``"int64"``,
    ``"float32"``, ``"string"``, ``"bool"``), tags and free-form properties.

    List columns have ``is_list=True``; ``dtype`` is then the element type. A list
    column's tags are the ones given (as in Merlin): ``Tags.LIST`` is not added by
    itself; ops that make lists add it where NVTabular's do (``ListSlice``).
    ``is_ragged`` is False for a list whose rows all have one length (a fixed-size
    Arrow list, ``ListSlice(pad=True)``, ``ValueCount`` with ``min == max``).
    """

    name: str
    dtype: str = "unknown"
    tags: frozenset[Tags] = field(default_factory=frozenset)
    properties: Mapping[str, Any] = field(default_factory=dict)
    is_list: bool = False
    is_ragged: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "tags", normalize_tags(self.tags))
        object.__setattr__(self, "properties", dict(self.properties))
        if self.is_ragged and not self.is_list:  # a ragged column is a list (as in merlin.schema)
            object.__setattr__(self, "is_list", True)
        if not isinstance(self.dtype, str):  # np.int64, np.dtype("float32"), pa.int32(), str
            from tabstream.core.dtypes import arrow_type_to_dtype, dtype_to_arrow_type

            object.__setattr__(self, "dtype", arrow_type_to_dtype(dtype_to_arrow_type(self.dtype))[0])

    @property
    def shape(self) -> tuple[int | None, ...]:
        """Merlin's shape: ``(None,)`` a scalar per row, ``(None, None)`` a ragged list,
        ``(None, n)`` a list of ``n`` values per row."""
        if not self.is_list:
            return (None,)
        count = self.properties.get("value_count") or {}
        fixed = not self.is_ragged and count.get("min") is not None and count.get("min") == count.get("max")
        return (None, int(count["max"]) if fixed else None)

    def with_shape(self, shape: Any) -> ColumnSchema:
        """The column with Merlin's ``shape``: ``(None,)``/``None`` a scalar, ``(None,
        None)`` a ragged list, ``(None, n)`` a list of ``n`` values (its
        ``value_count`` property set to ``n``)."""
        dims = (None,) if shape is None else tuple(shape) if isinstance(shape, (tuple, list)) else (None, shape)
        if len(dims) == 1:
            props = {k: v for k, v in self.properties.items() if k != "value_count"}
            return replace(self, is_list=False, is_ragged=False, properties=props)
        if len(dims) != 2 or not (dims[1] is None or (isinstance(dims[1], int) and dims[1] >= 0)):
            raise ValueError(f"ColumnSchema {self.name!r}: shape must be (None,), (None, None) or "
                             f"(None, n) with n >= 0, got {shape!r} (lists of lists are not described by shape)")
        if dims[1] is None:
            return replace(self, is_list=True, is_ragged=True)
        return replace(self, is_list=True, is_ragged=False,
                       properties={**self.properties, "value_count": {"min": dims[1], "max": dims[1]}})

    def with_name(self, name: str) -> ColumnSchema:
        return replace(self, name=name)

    def with_dtype(self, dtype: str, is_list: bool | None = None,
                   is_ragged: bool | None = None) -> ColumnSchema:
        return replace(
            self,
            dtype=dtype,
            is_list=self.is_list if is_list is None else is_list,
            is_ragged=self.is_ragged if is_ragged is None else is_ragged,
        )

    def with_tags(self, tags: Iterable[Tags | str] | Tags | str) -> ColumnSchema:
        return replace(self, tags=self.tags | normalize_tags(tags))

    def without_tags(self, tags: Iterable[Tags | str] | Tags | str) -> ColumnSchema:
        return replace(self, tags=self.tags - normalize_tags(tags))

    def with_properties(self, **properties: Any) -> ColumnSchema:
        return replace(self, properties={**self.properties, **properties})

    @property
    def cardinality(self) -> int | None:
        """Number of distinct ids (``domain.max + 1``) for categorical columns."""
        domain = self.properties.get("domain")
        if domain is None:
            return None
        return int(domain["max"]) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "tags": sorted(t.value for t in self.tags),
            "is_list": self.is_list,
            "is_ragged": self.is_ragged,
            "properties": _jsonable(self.properties),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ColumnSchema:
        return cls(
            name=d["name"],
            dtype=d.get("dtype", "unknown"),
            tags=normalize_tags(d.get("tags", ())),
            properties=d.get("properties", {}),
            is_list=bool(d.get("is_list", False)),
            is_ragged=bool(d.get("is_ragged", False)),
        )


def _jsonable(value: Any) -> Any:
    """Properties may hold numpy scalars; JSON wants plain Python values."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        return value.item()
    return value


class Schema:
    """An ordered set of :class:`ColumnSchema`, addressable by name."""

    def __init__(self, columns: Iterable[ColumnSchema | str] = ()) -> None:
        self._columns: dict[str, ColumnSchema] = {}
        for col in columns:
            if isinstance(col, str):
                col = ColumnSchema(col)
            if col.name in self._columns:
                raise ValueError(f"duplicate column {col.name!r} in schema")
            self._columns[col.name] = col

    # -- container protocol -------------------------------------------------
    def __iter__(self) -> Iterator[ColumnSchema]:
        return iter(self._columns.values())

    def __len__(self) -> int:
        return len(self._columns)

    def __contains__(self, name: object) -> bool:
        return name in self._columns

    def __getitem__(self, name: str) -> ColumnSchema:
        try:
            return self._columns[name]
        except KeyError:
            raise KeyError(
                f"column {name!r} is not in the schema; available: {self.column_names}"
            ) from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"Schema({[c.name for c in self]})"

    def __add__(self, other: Schema) -> Schema:
        merged = dict(self._columns)
        merged.update({c.name: c for c in other})
        return Schema(merged.values())

    @property
    def column_schemas(self) -> dict[str, ColumnSchema]:
        """Name -> column, in order (merlin.schema's ``column_schemas``)."""
        return {c.name: c for c in self}

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    # -- selection ----------------------------------------------------------
    def select_by_name(self, names: Iterable[str] | str) -> Schema:
        if isinstance(names, str):
            names = [names]
        names = list(names)
        missing = [n for n in names if n not in self._columns]
        if missing:
            raise KeyError(
                f"columns {missing} are not in the schema; available: {self.column_names}"
            )
        return Schema(self._columns[n] for n in names)

    def select_by_tag(self, tags: Iterable[Tags | str] | Tags | str, any_: bool = False) -> Schema:
        """Columns carrying all of ``tags`` (or any of them with ``any_=True``)."""
        wanted = normalize_tags(tags)
        if any_:
            return Schema(c for c in self if c.tags & wanted)
        return Schema(c for c in self if wanted <= c.tags)

    def without(self, names: Iterable[str] | str) -> Schema:
        if isinstance(names, str):
            names = [names]
        drop = set(names)
        return Schema(c for c in self if c.name not in drop)

    def replace(self, col: ColumnSchema) -> Schema:
        cols = dict(self._columns)
        cols[col.name] = col
        return Schema(cols.values())

    # -- serialization ------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"columns": [c.to_dict() for c in self]}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schema:
        return cls(ColumnSchema.from_dict(c) for c in d["columns"])

    def to_json(self, path: str | None = None, storage_options: dict | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            with fsspec.open(path, "w", **(storage_options or {})) as f:
                f.write(text)
        return text

    def to_merlin_pbtxt(self) -> str:
        """NVTabular/Merlin ``schema.pbtxt`` text (see :mod:`tabstream.core.merlin`)."""
        from tabstream.core.merlin import schema_to_pbtxt

        return schema_to_pbtxt(self)

    @classmethod
    def from_merlin_pbtxt(cls, text: str) -> Schema:
        """A schema from NVTabular/Merlin ``schema.pbtxt`` text, keeping tags and domains."""
        from tabstream.core.merlin import schema_from_pbtxt

        return schema_from_pbtxt(text)

    @classmethod
    def from_json(cls, text_or_path: str, storage_options: dict | None = None) -> Schema:
        text = text_or_path
        if not text_or_path.lstrip().startswith("{"):
            try:
                with fsspec.open(text_or_path, "r", **(storage_options or {})) as f:
                    text = f.read()
            except FileNotFoundError:
                raise FileNotFoundError(f"schema file not found: {text_or_path}") from None
        try:
            return cls.from_dict(loads_json(text, text_or_path[:200], "schema"))
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"not a tabstream schema ({text_or_path[:200]!r}): {exc}") from exc


# The embedding-size rule lives here, below ops (which write it into the schema) and
# train (which reads it), so neither imports the other.
def infer_embedding_dim(cardinality: int, multiplier: float = 2.0, multiple_of: int = 8) -> int:
    """``floor(cardinality ** 0.25 * multiplier)`` rounded up to a multiple of ``multiple_of``."""
    if cardinality <= 0:
        raise ValueError(f"cardinality must be positive, got {cardinality}")
    raw = math.floor(cardinality**0.25 * multiplier)
    return max(multiple_of, int(math.ceil(raw / multiple_of) * multiple_of))


def _nvtabular_dim(cardinality: int) -> int:
    return min(max(16, round(1.6 * cardinality**0.56)), 512)


#: Embedding dimension rules by name (see :func:`embedding_dim`).
EMBEDDING_RULES = {
    # NVTabular's (and fast.ai's): 1.6 * cardinality ** 0.56, rounded, kept in [16, 512]
    "nvtabular": _nvtabular_dim,
    # tabstream's before: floor(cardinality ** 0.25 * 2), up to a multiple of 8
    "fourth_root": infer_embedding_dim,
}


def embedding_dim(cardinality: int, rule: str = "nvtabular") -> int:
    """The suggested embedding dimension of a table of ``cardinality`` rows, the
    ``dimension`` ops write into ``properties["embedding_sizes"]``.

    ``rule="nvtabular"`` (the default) is NVTabular's ``min(max(16, round(1.6 *
    cardinality ** 0.56)), 512)``; ``rule="fourth_root"`` is :func:`infer_embedding_dim`
    (the trainers' default when they infer sizes)::

        embedding_dim(29)                        # 16  (1.6 * 29 ** 0.56 = 10.5 -> at least 16)
        embedding_dim(1_000_000)                 # 512 (1.6 * 1e6 ** 0.56 = 3,674 -> at most 512)
        embedding_dim(29, rule="fourth_root")    # 8   (floor(29 ** 0.25 * 2) = 4 -> 8)
    """
    if cardinality <= 0:
        raise ValueError(f"cardinality must be positive, got {cardinality}")
    try:
        fn = EMBEDDING_RULES[rule]
    except KeyError:
        raise ValueError(f"unknown embedding size rule {rule!r}; expected one of: "
                         f"{', '.join(EMBEDDING_RULES)}") from None
    return int(fn(int(cardinality)))

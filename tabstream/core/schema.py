"""Column schemas and tags.

A :class:`Schema` is an ordered collection of :class:`ColumnSchema`; it is
computed for a workflow's output before any data is read and written beside
every export as ``_schema.json``::

    {"version": 1,
     "columns": [{"name": "C1", "dtype": "int64", "tags": ["categorical"],
                  "is_list": false, "is_ragged": false,
                  "properties": {"domain": {"min": 0, "max": 41},
                                 "embedding_sizes": {"cardinality": 42, "dimension": 16}}}]}

``version`` (:data:`SCHEMA_VERSION`; absent in files of older tabstreams, read as 1)
changes when a reader of today could misread the file: :meth:`Schema.from_dict`
refuses a newer one. It also checks every field's type and the ``domain``, so a
damaged file is a :class:`~tabstream.core.errors.DataError` naming column, field and
value, never a ``TypeError`` later or a table of -4 rows.
"""

from __future__ import annotations

import difflib
import enum
import json
import math
import numbers
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import fsspec

from tabstream.core.errors import DataError
from tabstream.core.jsonfile import loads_json

__all__ = ["ColumnSchema", "CustomTag", "EMBEDDING_RULES", "SCHEMA_VERSION", "Schema", "Tags",
           "embedding_dim", "infer_embedding_dim"]

#: version of the schema document :meth:`Schema.to_json` writes (``_schema.json``)
SCHEMA_VERSION = 1
_SCHEMA_FORMAT = "tabstream.schema"


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
        tags = normalize_tags(self.tags)
        properties = dict(self.properties)
        if "merlin_tags" in properties:
            # tabstream before CustomTag kept Merlin's free-form tags here: they are tags
            tags |= _file_tags(properties.pop("merlin_tags"), f"ColumnSchema {self.name!r}")
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "properties", properties)
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
        try:
            return int(domain["max"]) + 1
        except (TypeError, ValueError, KeyError, IndexError):
            # a schema read from a file was checked by from_dict; this one was built in code
            raise DataError(f"column {self.name!r}: properties['domain'] is {domain!r}; expected "
                            '{"min": <int>, "max": <int>}, the ids 0..max of a categorical '
                            "column (cardinality max + 1)") from None

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
    def from_dict(cls, d: Mapping[str, Any], where: str = "schema column") -> ColumnSchema:
        """The column of :meth:`to_dict`, each field's type and the ``domain`` checked:
        a :class:`~tabstream.core.errors.DataError` names the column (``where``
        says which: ``"columns[3]"``), the field, the value and what was expected::

            ColumnSchema.from_dict({"name": "C1", "tags": ["categorical"],
                                    "properties": {"domain": {"min": 0, "max": 41}}}).cardinality  # 42
            ColumnSchema.from_dict({"name": "C1", "properties": {"domain": {"min": 0, "max": -5}}})
            # DataError: schema column 'C1': properties.domain is {'min': 0, 'max': -5}: min 0
            # is above max -5; expected min <= max
        """
        if not isinstance(d, Mapping):
            raise DataError(f"{where}: expected an object with a 'name' and optionally 'dtype', "
                            f"'tags', 'properties', 'is_list', 'is_ragged'; got {_shown(d)}")
        name = d.get("name")
        if not isinstance(name, str) or not name:
            raise DataError(f"{where}: field 'name' is {_shown(name)}; expected the column's name, a "
                            "non-empty string")
        at = f"schema column {name!r}" + (f" ({where})" if where != "schema column" else "")
        dtype = d.get("dtype", "unknown")
        if not isinstance(dtype, str) or not dtype:
            raise DataError(f"{at}: field 'dtype' is {_shown(dtype)}; expected a dtype name such as "
                            "'int64', 'float32' or 'string'")
        flags = {}
        for flag in ("is_list", "is_ragged"):
            value = d.get(flag, False)
            if not isinstance(value, bool):
                raise DataError(f"{at}: field {flag!r} is {_shown(value)}; expected true or false")
            flags[flag] = value
        raw_tags = d.get("tags", ())
        if not isinstance(raw_tags, (list, tuple)) or not all(isinstance(t, str) and t for t in raw_tags):
            raise DataError(f"{at}: field 'tags' is {_shown(raw_tags)}; expected a list of tag names "
                            "(non-empty strings), e.g. ['categorical']")
        # a file's tags as written: Tags members by name, any other a CustomTag (which
        # tabstream writes itself, "items" say: never judged a misspelt "item")
        tags = _file_tags(raw_tags, at)
        properties = d.get("properties", {})
        if not isinstance(properties, Mapping):
            raise DataError(f"{at}: field 'properties' is {_shown(properties)}; expected an object "
                            '(such as {"domain": {"min": 0, "max": 41}})')
        categorical = Tags.CATEGORICAL in tags
        # ids (a categorical column's, an integer column's) are integers; a continuous
        # column's domain may be any numbers (Merlin's float_domain). A categorical
        # domain may start below 0 (raw ids with a -1 sentinel, as Merlin writes them):
        # tables are sized from max, and the lookups refuse ids out of range
        _check_range(properties, "domain", at, integral=categorical or dtype.startswith(("int", "uint")),
                     low=None)
        _check_range(properties, "value_count", at, integral=True, low=0)
        if "merlin_tags" in properties:  # written by tabstream before CustomTag (see __post_init__)
            extra = properties["merlin_tags"]
            if not isinstance(extra, (list, tuple)) or not all(isinstance(t, str) and t for t in extra):
                raise DataError(f"{at}: properties.merlin_tags is {_shown(extra)}; expected a list "
                                "of tag names (non-empty strings)")
        return cls(name=name, dtype=dtype, tags=tags, properties=properties, **flags)


def _shown(value: Any) -> str:
    """``value`` for a message: its repr, cut short, and its JSON type."""
    text = repr(value)
    text = text if len(text) <= 80 else text[:77] + "..."
    kind = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a number", type(None): "null"}.get(type(value), type(value).__name__)
    return f"{text} ({kind})"


def _check_range(properties: Mapping[str, Any], key: str, at: str, integral: bool,
                 low: int | None) -> None:
    """``properties[key]`` (``domain``, ``value_count``), when there and not null, is
    ``{"min": ..., "max": ...}`` of numbers (whole numbers where ``integral``), not
    NaN, ``min <= max``, neither below ``low``."""
    value = properties.get(key)
    if value is None:
        return
    want = "integers" if integral else "numbers"
    if not isinstance(value, Mapping):
        raise DataError(f"{at}: properties.{key} is {_shown(value)}; expected an object "
                        f'{{"min": ..., "max": ...}} of {want}')
    for bound in ("min", "max"):
        x = value.get(bound)
        if x is not None and (isinstance(x, bool) or not isinstance(x, numbers.Real) or x != x or (
                integral and not isinstance(x, numbers.Integral) and not float(x).is_integer())):
            raise DataError(f"{at}: properties.{key}.{bound} is {_shown(value[bound])}; expected "
                            f"{'an integer' if integral else 'a number'}")
    lo, hi = value.get("min"), value.get("max")
    if lo is not None and hi is not None and lo > hi:
        raise DataError(f"{at}: properties.{key} is {dict(value)!r}: min {lo} is above max {hi}; "
                        "expected min <= max")
    if low is not None:
        for bound in ("min", "max"):
            if value.get(bound) is not None and value[bound] < low:
                raise DataError(f"{at}: properties.{key}.{bound} is {value[bound]!r}; expected at "
                                f"least {low}" + (" (the ids of a categorical column index the rows "
                                                  "of its embedding table)" if key == "domain" else ""))


def _file_tags(names: Any, where: str) -> frozenset[Any]:
    """Tags a file names (Merlin's, or ``merlin_tags`` of older tabstreams): a
    :class:`Tags` member where one has the name, else a :class:`CustomTag`, never
    judged a misspelling (the file says what it says)."""
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise TypeError(f"{where}: merlin_tags is {names!r}; expected a list of tag names")
    members = {m.value for m in Tags}
    picked: list[Any] = []
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"{where}: merlin_tags holds {name!r}; expected non-empty strings")
        picked.append(Tags(name.lower()) if name.lower() in members else CustomTag(name))
    return normalize_tags(picked)


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
        """The schema of :meth:`to_dict` or of a ``_schema.json`` (see the module's
        docstring): a newer ``version`` or another ``format`` is refused, and every
        column is checked (:meth:`ColumnSchema.from_dict`); errors are a
        :class:`~tabstream.core.errors.DataError` (the reader of a file adds its path)."""
        if not isinstance(d, Mapping):
            raise DataError(f"not a tabstream schema: expected an object with a 'columns' list, got "
                            f"{_shown(d)}")
        _check_schema_version(d)
        columns = d.get("columns")
        if not isinstance(columns, list):
            raise DataError(f"not a tabstream schema: field 'columns' is {_shown(columns)}; expected a "
                            'list of columns ({"name": ..., "dtype": ..., "tags": [...], ...})')
        out = [ColumnSchema.from_dict(c, f"columns[{i}]") for i, c in enumerate(columns)]
        seen: set[str] = set()
        for i, col in enumerate(out):
            if col.name in seen:
                raise DataError(f"columns[{i}]: column {col.name!r} is listed twice; expected each "
                                "column once")
            seen.add(col.name)
        return cls(out)

    def to_json(self, path: str | None = None, storage_options: dict | None = None) -> str:
        text = json.dumps({"version": SCHEMA_VERSION, **self.to_dict()}, indent=2)
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
            doc = loads_json(text, text_or_path[:200], "schema")
        except json.JSONDecodeError as exc:
            raise ValueError(f"not a tabstream schema ({text_or_path[:200]!r}): {exc}") from exc
        try:
            return cls.from_dict(doc)
        except DataError as exc:
            where = "schema text" if text is text_or_path else text_or_path
            raise DataError(f"{where}: {exc}", hint=exc.hint) from exc


def _check_schema_version(d: Mapping[str, Any]) -> None:
    """A schema document's ``version`` (and ``format``, which tabstream does not
    write: a future one might) is one this tabstream reads; absent is version 1."""
    upgrade = "it was written by a newer tabstream: upgrade tabstream to read it"
    fmt = d.get("format")
    if fmt is not None:
        base, _, number = fmt.partition("/") if isinstance(fmt, str) else ("", "", "")
        if base != _SCHEMA_FORMAT or (number and not number.isdigit()):
            raise DataError(f"not a tabstream schema: field 'format' is {_shown(fmt)}; expected "
                            f"{_SCHEMA_FORMAT!r} (or no 'format')")
        if number and int(number) > SCHEMA_VERSION:
            raise DataError(f"schema format {fmt!r}: this tabstream reads {_SCHEMA_FORMAT!r} up to "
                            f"version {SCHEMA_VERSION}; {upgrade}", hint="upgrade tabstream")
    version = d.get("version", 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DataError(f"not a tabstream schema: field 'version' is {_shown(version)}; expected a "
                        f"version number (this tabstream reads 1 to {SCHEMA_VERSION})")
    if version > SCHEMA_VERSION:
        raise DataError(f"schema version {version}: this tabstream reads versions 1 to "
                        f"{SCHEMA_VERSION}; {upgrade}", hint="upgrade tabstream")


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

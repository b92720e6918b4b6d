"""Operator bases and the op registry.

An op is its constructor parameters plus, for statistics ops, fitted state:

* ``__init__`` stores and validates settings, nothing else; ``get_params()`` returns
  them (JSON values) so one generic writer can save every op.
* ``compute_output_schema(input_schema)`` declares the columns the op produces
  before any data is read; the executor checks each produced partition against it.
* ``transform(table)`` is a pure function of one partition (a ``pyarrow.Table``).
* :class:`StatOperator` adds ``fit_partition`` (small partial statistics of one
  partition), ``combine`` (merge partials; associative, used in a tree reduction)
  and ``finalize`` (store the result as typed state), plus ``get_state``/``set_state``
  that return JSON values and named Arrow tables (saved as parquet).
"""

from __future__ import annotations

import abc
import inspect
import math
import string
import threading
import types
import typing
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Union

import numpy as np
import pyarrow as pa

from tabstream.core.call_forms import wrap_schema, wrap_transform
from tabstream.core.errors import NotFittedError
from tabstream.core.schema import ColumnSchema, Schema

__all__ = ["ColumnOperator", "Operator", "StatOperator", "check_flag", "get_op_class", "registered_ops"]


def registered_ops() -> dict[str, type[Operator]]:
    """Every concrete op class by name (what the contract test suite runs over).

    Registration is subclassing: any concrete, public subclass of :class:`Operator`
    that has been imported is an op.
    """
    found: dict[str, type[Operator]] = {}
    stack = list(Operator.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        if not inspect.isabstract(cls) and not cls.__name__.startswith("_"):
            found[cls.__name__] = cls
    return found


def get_op_class(name: str) -> type[Operator]:
    """The registered op class called ``name``. Ops register by being imported:
    ``tabstream.ops`` (which ``tabstream.ops.base`` and ``Workflow.load`` import)
    brings in the whole catalog; an op of your own, the module that defines it."""
    ops = registered_ops()
    try:
        return ops[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; registered ops: {sorted(ops)} "
                         "(an op of your own registers when its module is imported)") from None


def check_params(op_cls: type[Operator], params: dict[str, Any]) -> None:
    """Raise ``TypeError`` naming unknown or missing constructor arguments of ``op_cls``."""
    sig = inspect.signature(op_cls.__init__)
    named = {n: p for n, p in sig.parameters.items()
             if n != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    takes_any = any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values())
    unknown = sorted(set(params) - set(named))
    if unknown and not takes_any:
        raise TypeError(f"{op_cls.__name__}: unknown parameters {unknown}; it takes {list(named)}")
    missing = [n for n, p in named.items() if p.default is p.empty and n not in params]
    if missing:
        raise TypeError(f"{op_cls.__name__}: missing required parameters {missing}; it takes {list(named)}")


# -- fitted-state declarations -----------------------------------------------------
#: column kinds a stats table declaration may name, with the pyarrow test of each
_COLUMN_KINDS = {
    "integer": pa.types.is_integer,
    "floating": pa.types.is_floating,
    "numeric": lambda t: pa.types.is_integer(t) or pa.types.is_floating(t),
    "string": lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
}


def _type_name(expected: Any) -> str:
    if expected is type(None) or expected is None:
        return "null"
    if typing.get_origin(expected) in (Union, types.UnionType):
        return " | ".join(_type_name(arm) for arm in typing.get_args(expected))
    if isinstance(expected, type) and typing.get_origin(expected) is None:
        return expected.__name__
    return str(expected).replace("typing.", "").replace("NoneType", "null")


def _state_mismatch(value: Any, expected: Any, field: str) -> tuple[str, Any, Any] | None:
    """``(field, expected, found)`` of the first place ``value`` does not match the
    annotation ``expected`` (built-in types, ``list[...]``, ``dict[str, ...]``,
    unions, ``Any``), or None when it matches."""
    if expected is Any:
        return None
    origin = typing.get_origin(expected)
    if origin in (Union, types.UnionType):
        misses = [_state_mismatch(value, arm, field) for arm in typing.get_args(expected)]
        if all(m is not None for m in misses):
            deepest = max(misses, key=lambda m: len(m[0]))  # type: ignore[index]
            return deepest if deepest[0] != field else (field, expected, value)  # type: ignore[index]
        return None
    if expected is None or expected is type(None):
        return None if value is None else (field, expected, value)
    if expected is float:  # JSON writes 1.0 as 1.0, but a hand-edited 1 is a float too
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return None if ok else (field, expected, value)
    if expected is int:
        return None if isinstance(value, int) and not isinstance(value, bool) else (field, expected, value)
    if origin is None:
        return None if isinstance(value, expected) else (field, expected, value)
    if origin is list:
        if not isinstance(value, list):
            return field, expected, value
        (item,) = typing.get_args(expected) or (Any,)
        for i, v in enumerate(value):
            miss = _state_mismatch(v, item, f"{field}[{i}]")
            if miss:
                return miss
        return None
    if origin is dict:
        if not isinstance(value, dict):
            return field, expected, value
        key_t, value_t = typing.get_args(expected) or (Any, Any)
        for k, v in value.items():
            miss = _state_mismatch(k, key_t, f"{field} key {k!r}") or _state_mismatch(v, value_t, f"{field}.{k}")
            if miss:
                return miss
        return None
    raise TypeError(f"unsupported state annotation {expected!r}")  # a bug in a declaration


_VALUE_CHECKS = {
    "finite": lambda x: math.isfinite(x),
    "non-negative": lambda x: x >= 0 or math.isnan(x),  # NaN is "finite"'s to report
}


def _numbers(value: Any, field: str) -> Iterator[tuple[str, float]]:
    """``(field path, number)`` of every number in a state value (dicts and lists walked)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _numbers(v, f"{field}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{field}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield field, value


def _found(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(value).__name__})"


def instance_of(op_cls: type) -> Any:
    """``cols >> LogOp`` (the class): its instance with default parameters, as
    NVTabular builds it; a class with required parameters is a ``TypeError``."""
    sig = inspect.signature(op_cls)  # the constructor's parameters, without self
    required = [n for n, p in sig.parameters.items()
                if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if required or inspect.isabstract(op_cls):
        needs = f"it needs {required}" if required else "it is abstract"
        raise TypeError(f"{op_cls.__name__} is a class and {needs}; apply an instance: "
                        f">> {op_cls.__name__}(...)")
    return op_cls()


class _OpMeta(abc.ABCMeta):
    def __rrshift__(cls, other: Any) -> Any:
        # `cols >> LogOp` (the class): NVTabular applies LogOp()
        return instance_of(cls).__rrshift__(other)


#: lookup indexes ops keep over their fitted keys (see
#: ``Backend.vocabulary_index``), per op: outside the op's attributes, so never
#: pickled (dask ships ops to workers, each process builds its own) nor saved, and
#: gone with the op
_LOOKUP_INDEXES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lookup_indexes(op: Any, group: str) -> dict:
    """The dict of lookup indexes ``op`` keeps for ``group`` (a vocabulary, a key
    column group); :func:`drop_lookup_indexes` empties them when the op fits again."""
    return _LOOKUP_INDEXES.setdefault(op, {}).setdefault(group, {})


def check_flag(value: Any, op: str, name: str) -> bool:
    """``value`` of the flag parameter ``name`` of ``op``: True or False (numpy's too);
    anything else is a ``TypeError`` (``bool("no")`` would be True, silently)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{op}: {name} must be True or False, got {value!r}")
    return bool(value)


def drop_lookup_indexes(op: Any) -> None:
    _LOOKUP_INDEXES.pop(op, None)


_INDEX_BUILD_LOCK = threading.Lock()  # see held_index


def held_index(indexes: dict, key: Any, source: Any, build: Callable[[], Any]) -> Any:
    """The index ``indexes`` (of :func:`lookup_indexes`) keeps under ``key`` for the
    fitted object ``source``, made by ``build()`` when it has none for that very
    object (a replaced vocabulary gets a new one). Built once: the export's first
    partitions ask together, and an index built by each of them was that much memory
    twice (at 16M Criteo rows about 30 MB a copy); the others wait for the first. An
    error of ``build`` reaches its caller and nothing is kept."""
    held = indexes.get(key)
    if held is None or held[0] is not source:
        with _INDEX_BUILD_LOCK:
            held = indexes.get(key)
            if held is None or held[0] is not source:
                held = indexes[key] = (source, build())
    return held[1]


class Operator(metaclass=_OpMeta):
    """Base class of all ops; ``columns >> op`` builds a graph node."""

    #: ops that need no fitting leave this False
    is_stat: ClassVar[bool] = False
    #: What the workflow and the loaders need to know of an op, declared by the op
    #: (never guessed from its class name): True when ``transform`` drops or groups
    #: rows, so its output may hold fewer or more rows than its input (Filter, Dropna,
    #: Groupby). A loader refuses such an op as an online transform (it plans equal
    #: batches per rank from the row counts before reading). An op whose row count
    #: changes only with some data or settings (JoinExternal with ``how="inner"`` or
    #: duplicate side keys) leaves it False: the loader refuses a row group whose
    #: count changed when it reads it, and the export counts rows after the workflow.
    changes_row_count: ClassVar[bool] = False
    #: True when ``fit_partition``/``transform`` take string columns as dictionary
    #: arrays (Categorify): a column that only such ops read is then read from
    #: parquet as a dictionary, without decoding its strings (see
    #: ``Workflow.dictionary_columns``).
    accepts_dictionary: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # NVTabular's call forms (``transform(col_selector, df)``,
        # ``compute_output_schema(schema, col_selector)``) reach every op, and a
        # custom op written in NVTabular's forms runs in tabstream's executor: see
        # tabstream.core.call_forms
        super().__init_subclass__(**kwargs)
        for name, wrap in (("transform", wrap_transform), ("compute_output_schema", wrap_schema)):
            fn = cls.__dict__.get(name)
            if inspect.isfunction(fn) and not getattr(fn, "__isabstractmethod__", False):
                setattr(cls, name, wrap(fn))

    # -- parameters ---------------------------------------------------------
    def get_params(self) -> dict[str, Any]:
        """Constructor parameters, read back from attributes of the same name."""
        sig = inspect.signature(type(self).__init__)
        return {
            name: getattr(self, name)
            for name, p in sig.parameters.items()
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
        }

    def to_config(self) -> dict[str, Any]:
        return {"class": type(self).__name__, "params": self.get_params()}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> Operator:
        """Rebuild an op from :meth:`to_config`'s output. The class is looked up among
        registered ops by name; parameters are checked against its constructor."""
        if not isinstance(config, dict) or not isinstance(config.get("class"), str):
            raise TypeError(f"an op config is a JSON object with a string 'class', got {config!r}")
        op_cls = get_op_class(config["class"])
        params = config.get("params", {})
        if not isinstance(params, dict):
            raise TypeError(f"{op_cls.__name__}: 'params' must be a JSON object of constructor "
                            f"arguments, got {type(params).__name__} {params!r}")
        check_params(op_cls, params)
        return op_cls(**params)

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    def dependencies(self) -> list[Any]:
        """Columns the op reads besides its selection (column names or nodes), added
        to its input by ``cols >> op`` as NVTabular's dependencies are: e.g.
        TargetEncoding's target, JoinGroupby's ``cont_cols``. None by default."""
        return []

    # -- schema and transform ----------------------------------------------
    def compute_output_schema(self, input_schema: Schema) -> Schema:
        return Schema(self.output_column(col) for col in input_schema)

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        """Schema of the output column made from input column ``col``."""
        return col

    @abc.abstractmethod
    def transform(self, table: pa.Table) -> pa.Table:
        """The op applied to one partition; a pure function of ``table``."""

    def output_column_names(self, col_selector: Any) -> Any:
        """The names of the columns the op makes from ``col_selector``'s columns, as a
        ``ColumnSelector`` (NVTabular's method; worked out from the names alone)."""
        from tabstream.core.call_forms import as_selector, dependency_names
        from tabstream.core.graph import ColumnSelector

        selector = as_selector(col_selector)
        names = list(selector.names) + [n for n in dependency_names(self) if n not in selector.names]
        schema = Schema(ColumnSchema(n) for n in names)
        out = self.compute_output_schema(schema, selector)  # type: ignore[call-arg]  # both forms, see call_forms
        return ColumnSelector(out.column_names)

    # -- graph building -----------------------------------------------------
    def __rrshift__(self, other: Any):
        from tabstream.core.graph import as_node

        return as_node(other) >> self


Operator.compute_output_schema = wrap_schema(Operator.compute_output_schema)  # type: ignore[method-assign]


class ColumnOperator(Operator):
    """An op that maps each input column to one output column of the same name."""

    @abc.abstractmethod
    def transform_column(self, name: str, column: pa.ChunkedArray) -> pa.ChunkedArray | pa.Array:
        """The op applied to one column of a partition."""

    def transform(self, table: pa.Table) -> pa.Table:
        return pa.table({name: self.transform_column(name, table.column(name)) for name in table.column_names})


class StatOperator(Operator):
    """An op with statistics computed by :meth:`fit` over partitions."""

    is_stat: ClassVar[bool] = True

    #: The JSON values ``get_state`` returns, field name -> annotation, e.g.
    #: ``{"means": dict[str, float]}``; checked by :meth:`check_state` when a saved
    #: workflow is loaded. None: not declared (only ``set_state`` itself checks).
    state_types: ClassVar[dict[str, Any] | None] = None
    #: The Arrow tables ``get_state`` returns: name template -> required columns
    #: (column -> "integer" | "floating" | "numeric" | "string" | None for any type).
    #: A template ``"vocab.{vocabularies}"`` stands for one table per name in the
    #: state value ``vocabularies``; ``"side"`` is one table of that name.
    state_tables: ClassVar[dict[str, dict[str, str | None]]] = {}
    #: Value constraints on the numbers of state fields, field name -> constraints
    #: (``"finite"``, ``"non-negative"``), e.g. ``{"stds": ("finite", "non-negative")}``;
    #: checked with :attr:`state_types` by :meth:`check_state`.
    state_values: ClassVar[dict[str, tuple[str, ...]]] = {}
    #: True when the last combination of a fit may run as several tasks side by side:
    #: ``combine_root(partials, shard, shards)`` then merges share ``shard`` of
    #: ``shards`` and :meth:`join_root` puts the shares together (Categorify: by
    #: vocabulary).
    shards_root: ClassVar[bool] = False
    #: True when the op writes statistics larger than memory to files under its
    #: ``spill_dir`` (a constructor argument; None: a temporary folder of the
    #: process). On a cluster whose workers share the client's machine, a fit then
    #: gives such an op a folder every process reads (see ``Workflow.fit``).
    spills: ClassVar[bool] = False

    def __init__(self) -> None:
        self.fitted = False

    @abc.abstractmethod
    def fit_partition(self, table: pa.Table) -> Any:
        """Small partial statistics of one partition."""

    @abc.abstractmethod
    def combine(self, partials: Sequence[Any]) -> Any:
        """Merge partials (associative: used in a tree reduction)."""

    def combine_root(self, partials: Sequence[Any], shard: int = 0, shards: int = 1) -> Any:
        """The last combination of a fit (its result goes straight to :meth:`finalize`);
        an op may make it cheaper than :meth:`combine`, which it is by default. With
        :attr:`shards_root`, it merges share ``shard`` of ``shards``."""
        return self.combine(partials)

    def join_root(self, parts: Sequence[Any]) -> Any:
        """The shares of a sharded :meth:`combine_root` as one (ops with
        :attr:`shards_root` only)."""
        raise NotImplementedError(f"{type(self).__name__} sets shards_root but has no join_root")

    @abc.abstractmethod
    def finalize(self, partial: Any) -> None:
        """Store the combined statistics as state and set ``fitted``."""

    #: True when :meth:`update` folds an update's partials (combined as in a fit) into
    #: the fitted state (``Workflow.update``; Categorify's living vocabulary)
    updatable: ClassVar[bool] = False

    def check_updatable(self) -> None:
        """Raise ``ValueError`` saying why this op's settings forbid :meth:`update`."""

    def update(self, partial: Any) -> Any:
        """Fold combined partials of new data into the fitted state (ops that set
        :attr:`updatable`); returns what changed."""
        raise NotImplementedError(f"{type(self).__name__} cannot update its statistics")

    def discard_partials(self) -> None:
        """Remove what this op's partials hold outside memory (spill files), after a
        fit that failed: nothing will read them. Most ops hold nothing; the default
        does nothing."""

    @abc.abstractmethod
    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        """Fitted state as (JSON values, named Arrow tables); saved as JSON + parquet."""

    @abc.abstractmethod
    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Restore what :meth:`get_state` returned."""

    @classmethod
    def check_state(cls, values: Any) -> list[str]:
        """Check saved state values against :attr:`state_types`; return the names of
        the tables they call for (expanded :attr:`state_tables` templates). Raises
        ``TypeError``/``ValueError`` naming the field, what was expected and what was found."""
        if not isinstance(values, dict):
            raise TypeError(f"field 'state' must be a JSON object, found {_found(values)}")
        if cls.state_types is not None:
            missing = [k for k in cls.state_types if k not in values]
            if missing:
                raise ValueError(f"state fields {missing} are missing; {cls.__name__} saves "
                                 f"{list(cls.state_types)}")
            unknown = sorted(set(values) - set(cls.state_types))
            if unknown:
                raise ValueError(f"unknown state fields {unknown}; {cls.__name__} saves "
                                 f"{list(cls.state_types)}")
            for name, expected in cls.state_types.items():
                miss = _state_mismatch(values[name], expected, name)
                if miss:
                    field, want, value = miss
                    raise TypeError(f"state field {field!r} must be {_type_name(want)}, "
                                    f"found {_found(value)}")
        for name, constraints in cls.state_values.items():
            for field, number in _numbers(values.get(name), name):
                bad = [c for c in constraints if not _VALUE_CHECKS[c](number)]
                if bad:
                    raise ValueError(f"state field {field!r} must be {' and '.join(constraints)}, "
                                     f"found {number!r}")
        names: list[str] = []
        for template in cls.state_tables:
            fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
            if not fields:
                names.append(template)
                continue
            (field,) = fields
            keys = values.get(field)
            if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
                raise TypeError(f"state field {field!r} must be a list of names, found {_found(keys)}")
            names += [template.format(**{field: k}) for k in keys]
        return names

    @classmethod
    def check_state_table(cls, name: str, schema: pa.Schema) -> None:
        """Check a saved stats table's columns against :attr:`state_tables`."""
        columns = next((cols for template, cols in cls.state_tables.items()
                        if name == template
                        or ("{" in template and name.startswith(template.partition("{")[0]))), None)
        if columns is None:
            return
        for column, kind in columns.items():
            if column not in schema.names:
                raise ValueError(f"stats table {name!r} has no column {column!r} (it has {schema.names}); "
                                 f"expected columns {list(columns)}")
            found = schema.field(column).type
            if kind is not None and not _COLUMN_KINDS[kind](found):
                raise TypeError(f"stats table {name!r} column {column!r} must be {kind}, found {found}")

    @classmethod
    def check_state_table_values(cls, name: str, table: pa.Table) -> None:
        """Check a saved stats table's values (after :meth:`check_state_table`);
        raises ``ValueError`` naming the table, column and value. None by default."""

    def check_fitted(self) -> None:
        if not getattr(self, "fitted", False):
            raise NotFittedError(
                f"{type(self).__name__} has not been fitted; call Workflow.fit(dataset) "
                "before transform"
            )

    def fit_table(self, table: pa.Table) -> StatOperator:
        """Fit on one in-memory table (convenience for tests and small data)."""
        self.finalize(self.combine([self.fit_partition(table)]))
        return self

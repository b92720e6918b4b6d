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
from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa

from tabstream.errors import NotFittedError
from tabstream.pipeline.schema import ColumnSchema, Schema

__all__ = ["ColumnOperator", "Operator", "StatOperator", "get_op_class", "registered_ops"]

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
    import tabstream.ops  # noqa: F401  (imports every op module)

    ops = registered_ops()
    try:
        return ops[name]
    except KeyError:
        raise ValueError(f"unknown op {name!r}; registered ops: {sorted(ops)}") from None


class _OpMeta(abc.ABCMeta):
    def __rrshift__(cls, other: Any) -> Any:
        # `cols >> Categorify` (the class, not an instance) is a common slip
        raise TypeError(f"{cls.__name__} is a class; apply an instance: >> {cls.__name__}(...)")


class Operator(metaclass=_OpMeta):
    """Base class of all ops; ``columns >> op`` builds a graph node."""

    #: ops that need no fitting leave this False
    is_stat: ClassVar[bool] = False

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
        op_cls = get_op_class(config["class"])
        return op_cls(**config.get("params", {}))

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    # -- schema and transform ----------------------------------------------
    def compute_output_schema(self, input_schema: Schema) -> Schema:
        return Schema(self.output_column(col) for col in input_schema)

    def output_column(self, col: ColumnSchema) -> ColumnSchema:
        """Schema of the output column made from input column ``col``."""
        return col

    @abc.abstractmethod
    def transform(self, table: pa.Table) -> pa.Table:
        """The op applied to one partition; a pure function of ``table``."""

    # -- graph building -----------------------------------------------------
    def __rrshift__(self, other: Any):
        from tabstream.pipeline.graph import as_node

        return as_node(other) >> self


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

    def __init__(self) -> None:
        self.fitted = False

    @abc.abstractmethod
    def fit_partition(self, table: pa.Table) -> Any:
        """Small partial statistics of one partition."""

    @abc.abstractmethod
    def combine(self, partials: Sequence[Any]) -> Any:
        """Merge partials (associative: used in a tree reduction)."""

    @abc.abstractmethod
    def finalize(self, partial: Any) -> None:
        """Store the combined statistics as state and set ``fitted``."""

    @abc.abstractmethod
    def get_state(self) -> tuple[dict[str, Any], dict[str, pa.Table]]:
        """Fitted state as (JSON values, named Arrow tables); saved as JSON + parquet."""

    @abc.abstractmethod
    def set_state(self, values: dict[str, Any], tables: dict[str, pa.Table]) -> None:
        """Restore what :meth:`get_state` returned."""

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

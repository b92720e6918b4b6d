"""Column selectors and the operator graph.

Graphs are built with three operators::

    cats = ["C1", "C2"] >> ops.Categorify()          # apply an op
    feats = cats + conts + ["label"]                   # concatenate outputs
    feats = feats - ["C2"]                             # drop columns

Nodes are immutable once built. The output schema of every node is computed from
the input schema alone (no data), which is where missing columns are reported.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import pyarrow as pa

from tabstream.core.dtypes import arrow_type_to_dtype
from tabstream.core.errors import SchemaError
from tabstream.core.schema import Schema, Tags, normalize_tags

__all__ = ["ColumnSelector", "Node", "as_node"]

_ids = itertools.count()


class ColumnSelector:
    """Select input columns by name and/or by tag.

    >>> from tabstream.core.schema import ColumnSchema, Schema, Tags
    >>> schema = Schema([ColumnSchema("C1", "int64", tags=[Tags.CATEGORICAL]),
    ...                  ColumnSchema("C2", "int64", tags=[Tags.CATEGORICAL]),
    ...                  ColumnSchema("I1", "float32", tags=[Tags.CONTINUOUS])])
    >>> ColumnSelector(["C1", "I1"]).resolve(schema)
    ['C1', 'I1']
    >>> ColumnSelector(tags=[Tags.CATEGORICAL]).resolve(schema)   # every column tagged categorical
    ['C1', 'C2']
    """

    def __init__(self, names: Iterable[str] | str | None = None,
                 tags: Iterable[Tags | str] | Tags | str | None = None) -> None:
        if isinstance(names, str):
            names = [names]
        # Nested lists are column groups (joint/combo Categorify, HashedCross).
        self.groups: list = [list(n) if isinstance(n, (list, tuple)) else n for n in (names or [])]
        self.names: list[str] = []
        for item in self.groups:
            for n in item if isinstance(item, list) else [item]:
                if not isinstance(n, str):
                    raise TypeError(f"column names must be strings, got {n!r}")
                if n not in self.names:
                    self.names.append(n)
        self.tags = normalize_tags(tags)

    def resolve(self, schema: Schema) -> list[str]:
        missing = [n for n in self.names if n not in schema]
        if missing:
            raise SchemaError(
                f"selected columns {missing} do not exist; available columns: {schema.column_names}"
            )
        out = list(self.names)
        if self.tags:
            tagged = [c.name for c in schema.select_by_tag(self.tags)]
            if not tagged:
                raise SchemaError(
                    f"no column carries tags {sorted(t.value for t in self.tags)}; "
                    f"columns and their tags: "
                    f"{ {c.name: sorted(t.value for t in c.tags) for c in schema} }"
                )
            out += [n for n in tagged if n not in out]
        return out

    @property
    def has_groups(self) -> bool:
        return any(isinstance(g, list) for g in self.groups)

    def to_config(self) -> dict[str, Any]:
        return {"names": self.groups, "tags": sorted(t.value for t in self.tags)}

    def __rshift__(self, op: Any) -> Node:
        return as_node(self) >> op

    def __add__(self, other: Any) -> Any:
        # NVTabular's selector arithmetic: selector + selector (or column names) is one
        # selector of both's names, each once (a node of the two had no .names); not
        # when both select by different tags (a selector's tags are all required)
        if isinstance(other, (ColumnSelector, str, list, tuple)):
            more = other if isinstance(other, ColumnSelector) else ColumnSelector(other)
            if not self.tags or not more.tags or self.tags == more.tags:
                return ColumnSelector(self.groups + [g for g in more.groups if g not in self.groups],
                                      tags=self.tags | more.tags)
        return as_node(self) + other

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, (str, list, tuple)):
            return ColumnSelector(other) + self
        return as_node(other) + self

    def __repr__(self) -> str:
        parts = []
        if self.names:
            parts.append(repr(self.names))
        if self.tags:
            parts.append(f"tags={sorted(t.value for t in self.tags)}")
        return f"ColumnSelector({', '.join(parts)})"


class Node:
    """One step of a workflow graph.

    ``kind`` is ``"select"`` (input columns), ``"op"`` (an operator applied to the
    concatenated outputs of ``parents``), ``"concat"``, ``"drop"`` or ``"union"``
    (the first parent's columns, then the others' columns it lacks: how an op's
    dependencies, e.g. TargetEncoding's target, join its selection).
    """

    def __init__(self, kind: str, parents: Sequence[Node] = (), op: Any = None,
                 selector: ColumnSelector | None = None, names: Sequence[str] = ()) -> None:
        self.kind = kind
        self.parents = list(parents)
        self.op = op
        self.selector = selector
        self.names = list(names)
        self.id = next(_ids)
        self.input_schema: Schema | None = None  # set when its workflow is fitted

    # -- building -----------------------------------------------------------
    def __rshift__(self, op: Any) -> Node:
        from tabstream.core.operators import Operator

        if isinstance(op, type) and issubclass(op, Operator):
            from tabstream.core.operators import instance_of

            op = instance_of(op)  # NVTabular's `cols >> LogOp`: LogOp()
        if callable(op) and not isinstance(op, (Operator, type)):
            # NVTabular's `cols >> (lambda col: ...)`: a LambdaOp, found in the op
            # registry (core does not import the ops layer above it)
            from tabstream.core.operators import registered_ops

            lambda_op = registered_ops().get("LambdaOp")
            if lambda_op is None:
                raise TypeError("`>> function` builds a LambdaOp; import tabstream.ops first")
            op = lambda_op(op)
        if not isinstance(op, Operator):
            raise TypeError(f"`>>` needs an op instance on its right, got {type(op).__name__}")
        if self.kind == "select" and self.selector is not None and self.selector.has_groups \
                and hasattr(op, "set_column_groups"):
            op.set_column_groups(self.selector.groups)
        # the columns the op reads besides its selection (NVTabular's dependencies):
        # added to its input, never selected twice
        # a method in tabstream, a property in NVTabular (custom ops override either)
        dependencies = op.dependencies() if callable(op.dependencies) else op.dependencies
        if isinstance(dependencies, (str, Node, ColumnSelector)):
            dependencies = [dependencies]
        dependencies = [as_node(d) for d in dependencies or ()]
        parent = Node("union", [self, *dependencies]) if dependencies else self
        return Node("op", [parent], op=op)

    def __getitem__(self, columns: str | Sequence[str]) -> Node:
        """The node's output restricted to ``columns`` (NVTabular's ``node[cols]``)."""
        names = [columns] if isinstance(columns, str) else list(columns)
        if not names or not all(isinstance(n, str) for n in names):
            raise TypeError(f"node[...] takes a column name or a list of names, got {columns!r}")
        return Node("pick", [self], names=names)

    def output_names_from_selection(self) -> list[str]:
        """The names this node outputs, worked out from the column names it selects
        (a node given where NVTabular takes column names, e.g. ``TargetEncoding``'s
        target). Raises ``TypeError`` when they depend on the data (tags, dtypes)."""
        leaves = [n for n in self.walk() if n.kind == "select"]
        if any(n.selector is None or n.selector.tags for n in leaves):
            raise TypeError(f"{self!r} selects columns by tag; give the column names instead")
        from tabstream.core.schema import ColumnSchema

        names = list(dict.fromkeys(c for n in leaves for c in n.selector.names))  # type: ignore[union-attr]
        try:
            return self.schema_for(Schema([ColumnSchema(c, "float64") for c in names])).column_names
        except (SchemaError, TypeError, ValueError) as exc:
            raise TypeError(f"cannot tell the columns {self!r} outputs before fit ({exc}); "
                            "give the column names instead") from exc

    def __add__(self, other: Any) -> Node:
        return Node("concat", _flatten_concat([self, as_node(other)]))

    def __radd__(self, other: Any) -> Node:
        return Node("concat", _flatten_concat([as_node(other), self]))

    def __sub__(self, other: Any) -> Node:
        if isinstance(other, (Node, ColumnSelector)):
            # NVTabular's `node - other_node`: drop the columns the other node outputs
            # (worked out from the names it selects); those this node does not output
            # are ignored, as in NVTabular
            names = as_node(other).output_names_from_selection()
            try:
                mine = self.output_names_from_selection()
            except TypeError:  # selects by tag: every name must then exist at fit
                mine = names
            names = [n for n in names if n in mine]
            return Node("drop", [self], names=names) if names else self
        names = [other] if isinstance(other, str) else list(other)
        return Node("drop", [self], names=names)

    @property
    def output_schema(self) -> Any:
        """The schema this node outputs, once its workflow is fitted (NVTabular's
        ``node.output_schema``). Calling it, ``node.output_schema(input_schema)``,
        computes it for another input schema."""
        if self.input_schema is None:
            return _UnboundSchema(self)
        return _CallableSchema(self, self.schema_for(self.input_schema))

    def bind(self, input_schema: Schema) -> None:
        """Record the workflow's input schema on this node and those above it
        (``Workflow.fit``/``fit_schema``/``load`` call it)."""
        for node in self.walk():
            node.input_schema = input_schema

    # -- traversal ----------------------------------------------------------
    def walk(self) -> list[Node]:
        """All nodes reachable from this one, parents before children."""
        order: list[Node] = []
        seen: set[int] = set()

        def visit(n: Node) -> None:
            if n.id in seen:
                return
            seen.add(n.id)
            for p in n.parents:
                visit(p)
            order.append(n)

        visit(self)
        return order

    def schema_for(self, input_schema: Schema, cache: dict[int, Schema] | None = None) -> Schema:
        """The schema this node outputs given the workflow's input schema."""
        cache = {} if cache is None else cache
        if self.id in cache:
            return cache[self.id]
        if self.kind == "select":
            assert self.selector is not None
            out = input_schema.select_by_name(self.selector.resolve(input_schema))
        elif self.kind == "op":
            inp = concat_schemas([p.schema_for(input_schema, cache) for p in self.parents])
            try:
                out = self.op.compute_output_schema(inp)
            except SchemaError:
                raise
            except KeyError as exc:
                raise SchemaError(f"{self.op!r}: {exc}") from exc
        elif self.kind == "concat":
            out = concat_schemas([p.schema_for(input_schema, cache) for p in self.parents])
        elif self.kind == "drop":
            inp = self.parents[0].schema_for(input_schema, cache)
            missing = [n for n in self.names if n not in inp]
            if missing:
                raise SchemaError(f"cannot drop {missing}: not among {inp.column_names}")
            out = inp.without(self.names)
        elif self.kind == "pick":
            inp = self.parents[0].schema_for(input_schema, cache)
            missing = [n for n in self.names if n not in inp]
            if missing:
                raise SchemaError(f"node[{self.names}]: {missing} are not among its columns {inp.column_names}")
            out = inp.select_by_name(self.names)
        elif self.kind == "union":
            cols: dict[str, Any] = {}
            for p in self.parents:
                for c in p.schema_for(input_schema, cache):
                    cols.setdefault(c.name, c)
            out = Schema(cols.values())
        else:
            raise ValueError(f"unknown node kind {self.kind!r}")
        cache[self.id] = out
        return out

    def transform(self, table: pa.Table, input_schema: Schema,
                  cache: dict[int, pa.Table] | None = None,
                  schema_cache: dict[int, Schema] | None = None,
                  uses: dict[int, int] | None = None,
                  rows: dict[int, int] | None = None) -> pa.Table:
        """Evaluate this node on one partition (an Arrow table of input columns).

        Each node's output is kept in ``cache`` for the nodes that read it. ``uses``
        (see :func:`consumer_counts`) says how many reads each output has left: an
        output is dropped from the cache at its last, so the intermediate tables of a
        chain (FillMissing, Clip, LogOp before Normalize) do not all live until the
        partition is done. A call without ``cache`` counts its own. ``rows`` gets the
        row count of every node evaluated."""
        if cache is None:
            cache = {}
            uses = consumer_counts([self]) if uses is None else uses
        schema_cache = {} if schema_cache is None else schema_cache
        if self.id in cache:
            return cache[self.id]
        expected = self.schema_for(input_schema, schema_cache)

        def parent_outputs() -> list[pa.Table]:
            return [p.transform(table, input_schema, cache, schema_cache, uses, rows) for p in self.parents]

        if self.kind == "select":
            out = table.select(expected.column_names)
        elif self.kind == "op":
            out = self.op.transform(concat_tables(parent_outputs()))
            check_produced(self.op, expected, out)
        elif self.kind == "concat":
            out = concat_tables(parent_outputs())
        elif self.kind == "union":
            out = union_tables(parent_outputs())
        elif self.kind == "pick":
            out = parent_outputs()[0].select(self.names)
        else:
            out = parent_outputs()[0].drop_columns(self.names)
        cache[self.id] = out
        if rows is not None:
            rows[self.id] = out.num_rows
        if uses is not None:
            for p in self.parents:
                release(p, cache, uses)
        return out

    def __repr__(self) -> str:
        if self.kind == "select":
            return f"Node({self.selector!r})"
        if self.kind == "op":
            return f"Node({self.parents!r} >> {self.op!r})"
        if self.kind == "drop":
            return f"Node({self.parents[0]!r} - {self.names!r})"
        if self.kind == "pick":
            return f"Node({self.parents[0]!r}[{self.names!r}])"
        if self.kind == "union":
            return f"Node({' | '.join(repr(p) for p in self.parents)})"
        return f"Node({' + '.join(repr(p) for p in self.parents)})"


def consumer_counts(requests: Sequence[Node]) -> dict[int, int]:
    """How many times each node's output is read when the nodes ``requests`` (in the
    order a caller asks for them, repeats included) are evaluated with one cache: once
    per request, and once per edge from each node reached (evaluated once) to it. The
    caller calls :func:`release` for each request once it is done with its output."""
    uses: dict[int, int] = {}
    for node in requests:
        uses[node.id] = uses.get(node.id, 0) + 1
    seen: set[int] = set()
    stack = list(requests)
    while stack:
        node = stack.pop()
        if node.id in seen:
            continue
        seen.add(node.id)
        for parent in node.parents:
            uses[parent.id] = uses.get(parent.id, 0) + 1
            stack.append(parent)
    return uses


def release(node: Node, cache: dict[int, pa.Table], uses: dict[int, int]) -> None:
    """One read of ``node``'s output is done: at the last, it leaves ``cache``."""
    left = uses.get(node.id, 0) - 1
    uses[node.id] = left
    if left <= 0:
        cache.pop(node.id, None)


def as_node(obj: Any) -> Node:
    """A node from a node, a selector, a column name or a list of names/nodes."""
    if isinstance(obj, Node):
        return obj
    if isinstance(obj, ColumnSelector):
        return Node("select", selector=obj)
    if isinstance(obj, str):
        return Node("select", selector=ColumnSelector([obj]))
    if not isinstance(obj, (list, tuple)) and callable(getattr(obj, "tolist", None)):
        obj = obj.tolist()  # a pandas Index or numpy array of names (`df.columns >> op`)
        if not isinstance(obj, list):
            raise TypeError("cannot build a workflow node from a single value; use column names")
    if isinstance(obj, (list, tuple)):
        if all(isinstance(x, (str, list, tuple)) and not isinstance(x, Node) for x in obj) and \
                all(isinstance(n, str) for x in obj for n in ([x] if isinstance(x, str) else x)):
            return Node("select", selector=ColumnSelector(list(obj)))
        nodes = [as_node(x) for x in obj]
        return nodes[0] if len(nodes) == 1 else Node("concat", _flatten_concat(nodes))
    raise TypeError(
        f"cannot build a workflow node from {type(obj).__name__}; use column names, "
        "a ColumnSelector or another node"
    )


def _flatten_concat(nodes: list[Node]) -> list[Node]:
    out: list[Node] = []
    for n in nodes:
        out.extend(n.parents if n.kind == "concat" else [n])
    return out


def concat_schemas(schemas: list[Schema]) -> Schema:
    cols: dict[str, Any] = {}
    for s in schemas:
        for c in s:
            if c.name in cols:
                raise SchemaError(
                    f"column {c.name!r} is produced twice by the concatenated nodes; "
                    "rename one of them (ops.Rename) or drop it"
                )
            cols[c.name] = c
    return Schema(cols.values())


def concat_tables(tables: list[pa.Table]) -> pa.Table:
    if len(tables) == 1:
        return tables[0]
    if len({t.num_rows for t in tables}) > 1:
        sizes = {", ".join(t.column_names): t.num_rows for t in tables}
        raise SchemaError(
            f"cannot put columns with different row counts side by side: {sizes}. An op that "
            "drops rows (Filter, Dropna) keeps only the columns it is applied to; apply it to "
            "every column you keep, e.g. (['a', 'b', 'label'] >> Filter(f)) >> ..."
        )
    names: list[str] = []
    arrays: list[Any] = []
    for t in tables:
        for name, col in zip(t.column_names, t.columns):
            if name not in names:
                names.append(name)
                arrays.append(col)
    return pa.table(arrays, names=names)


def union_tables(tables: list[pa.Table]) -> pa.Table:
    """An op's input and its dependencies: each later table adds only the columns the
    ones before it lack, and one that adds none is left out, its row count unchecked
    (a dependency the selection already holds, after a Filter or Dropna that kept
    fewer rows than the raw column has)."""
    names = set(tables[0].column_names)
    kept = [tables[0]]
    for table in tables[1:]:
        new = [n for n in table.column_names if n not in names]
        if new:
            kept.append(table.select(new))
            names.update(new)
    return concat_tables(kept)


def check_produced(op: Any, expected: Schema, table: pa.Table) -> None:
    """The executor holds every op to the schema it declared."""
    if table.column_names != expected.column_names:
        raise SchemaError(
            f"{type(op).__name__} declared columns {expected.column_names} "
            f"but produced {table.column_names}"
        )
    for col, field in zip(expected, table.schema):
        dtype, is_list = arrow_type_to_dtype(field.type)
        if (dtype, is_list) != (col.dtype, col.is_list):
            raise SchemaError(
                f"{type(op).__name__} declared column {col.name!r} as "
                f"{'list of ' if col.is_list else ''}{col.dtype} but produced "
                f"{'list of ' if is_list else ''}{dtype}"
            )


class _CallableSchema(Schema):
    """``node.output_schema``: the schema, and callable as the method it once was."""

    def __init__(self, node: Node, schema: Schema) -> None:
        super().__init__(schema)
        self._node = node

    def __call__(self, input_schema: Schema, cache: dict[int, Schema] | None = None) -> Schema:
        return self._node.schema_for(input_schema, cache)


class _UnboundSchema:
    """``node.output_schema`` before the node's workflow is fitted: callable with an
    input schema; anything else says to fit first."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def __call__(self, input_schema: Schema, cache: dict[int, Schema] | None = None) -> Schema:
        return self._node.schema_for(input_schema, cache)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise SchemaError(f"{self._node!r} has no output schema yet: fit its workflow first "
                          "(Workflow(node).fit(dataset)), or call node.output_schema(input_schema)")

    def __iter__(self) -> Any:
        return self.__getattr__("columns")

    def __len__(self) -> int:
        return self.__getattr__("columns")

    def __contains__(self, name: object) -> bool:
        return self.__getattr__("columns")

    def __getitem__(self, name: str) -> Any:
        return self.__getattr__("columns")

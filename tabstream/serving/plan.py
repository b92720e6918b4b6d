"""The serving plan: a fitted Workflow as a flat list of in-graph steps (no framework).

:func:`build_plan` walks the workflow's graph column by column and writes each
output column's recipe as steps over numbered *slots* (slot ``i < len(inputs)`` is
raw input ``i``; each step fills one new slot). The Keras and torch builders
(:mod:`tabstream.serving.keras`, :mod:`tabstream.serving.torch`) run the steps with
their own tensors; the plan itself holds only names, numbers and lists, so
:meth:`ServingPlan.to_json` writes it as it is.

>>> import pandas as pd, tabstream as ts
>>> from tabstream import ops
>>> wf = ts.Workflow((["c"] >> ops.Categorify()) + (["x"] >> ops.FillMissing(0)) + ["label"])
>>> _ = wf.fit(pd.DataFrame({"c": ["a", "b", "a"], "x": [1.0, None, 2.0], "label": [1, 0, 1]}))
>>> plan = build_plan(wf, exclude=["label"])
>>> [i.name for i in plan.inputs], [o.name for o in plan.outputs]
(['c', 'x'], ['c', 'x'])
>>> [s["op"] for s in plan.steps]
['categorify', 'fill']

Every output column is delivered as the loader delivers it: a ``[B]`` tensor of its
schema dtype (floats that the Workflow leaves null are NaN; integers it leaves null,
e.g. ``Bucketize`` of a missing value, are ``-1``); a list column as ``(values,
offsets)`` (``[N]``, ``[B+1]``), or ``(dense, mask)`` ``[B, L]`` when its schema
fixes every row's length ``L`` (``ListSlice(pad=True)``, a ``ValueCount`` of one length).

List slots hold their values element by element (``kinds`` is the element kind)
plus row offsets; element-wise steps (Categorify, HashBucket, LogOp, Normalize)
keep the offsets, ``list_slice`` makes new ones. A null list is an empty list here,
as the loaders deliver both alike.

Ops with no in-graph form are refused by name, with the reason (:data:`REFUSED`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from tabstream.core.errors import ExportError
from tabstream.core.graph import Node
from tabstream.core.hashing import murmur3_32
from tabstream.core.schema import ColumnSchema, Schema, Tags
from tabstream.ops import (
    AddMetadata,
    AddTags,
    Bucketize,
    Categorify,
    Clip,
    DataStats,
    DifferenceLag,
    DropLowCardinality,
    Dropna,
    FillMedian,
    FillMissing,
    Filter,
    Groupby,
    HashBucket,
    HashedCross,
    JoinExternal,
    JoinGroupby,
    LambdaOp,
    ListSlice,
    LogOp,
    Normalize,
    NormalizeMinMax,
    ReduceDtypeSize,
    Rename,
    SplitList,
    TargetEncoding,
    ValueCount,
)
from tabstream.ops.structural import TagAsItemFeatures, TagAsItemID, TagAsUserFeatures, TagAsUserID

__all__ = ["InputSpec", "OutputSpec", "REFUSED", "ServingPlan", "build_plan", "string_keys"]

#: the second seed of the 64-bit string key (seed 0 is the project hash itself)
KEY_SEED = 0x2545F491

#: why each op that is refused has no in-graph form
REFUSED: dict[type, str] = {
    JoinExternal: "it joins an external table on its keys; join the table beside the served model",
    JoinGroupby: "it joins per-key statistics tables; serve those as a feature store lookup",
    Groupby: "it groups rows into sequences, while a served request is independent rows",
    TargetEncoding: "it joins per-category target statistics tables (no in-graph table join yet)",
    DifferenceLag: "it reads the previous row of the same key, which a request does not hold",
    Filter: "it drops rows, so scores would no longer line up with the request's rows",
    Dropna: "it drops rows, so scores would no longer line up with the request's rows",
    LambdaOp: "it runs an arbitrary Python function",
    SplitList: "it splits strings into lists (no in-graph version yet); send the lists as lists",
    ReduceDtypeSize: "its dtypes are fitted per column (no in-graph version yet)",
    DataStats: "it only collects statistics",
    DropLowCardinality: "it drops columns by fitted cardinality (no in-graph version yet)",
}

#: ops that change only the schema (tags, properties, names): the slot passes through
_PASSTHROUGH = (AddTags, AddMetadata, Rename, TagAsItemFeatures, TagAsItemID, TagAsUserFeatures, TagAsUserID,
                ValueCount)

#: ops whose in-graph version takes list columns (element by element, or ListSlice)
_LIST_OPS = (Categorify, HashBucket, LogOp, Normalize, ListSlice)


@dataclass(frozen=True)
class InputSpec:
    """A raw column the artifact takes: ``kind`` is ``"string"``, ``"int"``, ``"float"``
    or ``"bool"`` (of its elements when ``is_list``); ``dtype`` the Workflow's input dtype."""

    name: str
    kind: str
    dtype: str
    is_list: bool = False


@dataclass(frozen=True)
class OutputSpec:
    """A column the artifact returns: ``slot`` holds it, ``dtype`` is its schema dtype;
    ``layout`` ``"scalar"`` (``[B]``), ``"ragged"`` (``(values, offsets)``) or ``"fixed"``
    (``(dense, mask)`` of ``[B, length]``)."""

    name: str
    slot: int
    dtype: str
    layout: str = "scalar"
    length: int | None = None


@dataclass
class ServingPlan:
    """Inputs, steps (dicts with ``"op"``, ``"out"`` slot and ``"in"`` slots) and outputs."""

    inputs: list[InputSpec]
    steps: list[dict[str, Any]]
    outputs: list[OutputSpec]
    kinds: dict[int, str] = field(default_factory=dict)  # slot -> kind of its values
    lists: list[int] = field(default_factory=list)  # slots holding list columns

    def to_json(self) -> str:
        doc = {"inputs": [vars(i) for i in self.inputs], "steps": self.steps,
               "outputs": [vars(o) for o in self.outputs], "kinds": {str(k): v for k, v in self.kinds.items()},
               "lists": self.lists}
        return json.dumps(_finite_json(doc), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> ServingPlan:
        doc = _from_finite_json(json.loads(text))
        return cls([InputSpec(**i) for i in doc["inputs"]], doc["steps"],
                   [OutputSpec(**o) for o in doc["outputs"]], {int(k): v for k, v in doc["kinds"].items()},
                   list(doc.get("lists", [])))


def _finite_json(value: Any) -> Any:
    """±inf (a Clip bound, a fill value) as ``{"float": "inf"}``: strict JSON has no inf."""
    if isinstance(value, float) and not math.isfinite(value):
        return {"float": repr(value)}
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_json(v) for v in value]
    return value


def _from_finite_json(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"float"}:
            return float(value["float"])
        return {k: _from_finite_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_from_finite_json(v) for v in value]
    return value


def _kind(dtype: str) -> str:
    if dtype == "string":
        return "string"
    if dtype == "bool":
        return "bool"
    if dtype.startswith(("int", "uint")):
        return "int"
    if dtype.startswith("float"):
        return "float"
    raise TypeError(dtype)


class _Builder:
    def __init__(self, input_schema: Schema) -> None:
        self.input_schema = input_schema
        self.inputs: list[InputSpec] = []
        self.input_slots: dict[str, int] = {}
        self.steps: list[dict[str, Any]] = []
        self.kinds: dict[int, str] = {}
        self.lists: set[int] = set()
        # slots of uint64 values, held as their bits in int64 (2**63 and up negative)
        self.unsigned: set[int] = set()
        self.next_slot = 0
        self._raw: list[str] = []

    def raw(self, name: str) -> int:
        if name not in self.input_slots:
            col = self.input_schema[name]
            try:
                kind = _kind(col.dtype)
            except TypeError:
                what = f"a list of {col.dtype}" if col.is_list else f"dtype {col.dtype}"
                raise ExportError(f"serving: raw column {name!r} has {what}; the artifact takes strings, "
                                  "integers, floats and bools, and lists of those: leave it out of the served "
                                  "workflow (Workflow.remove_inputs)") from None
            slot = self._slot(kind)
            if col.is_list:
                self.lists.add(slot)
            if col.dtype == "uint64":
                self.unsigned.add(slot)
            self.input_slots[name] = slot
            self._raw.append(name)
        return self.input_slots[name]

    def _slot(self, kind: str) -> int:
        slot = self.next_slot
        self.next_slot += 1
        self.kinds[slot] = kind
        return slot

    def step(self, op: str, inputs: list[int], kind: str, **params: Any) -> int:
        out = self._slot(kind)
        if any(i in self.lists for i in inputs):  # element-wise steps keep the lists
            self.lists.add(out)
        if inputs and inputs[0] in self.unsigned:
            if op in _ARITHMETIC:
                # the step computes with uint64 bits: as floats they are 2**64 more
                # when negative, and ordered by their bits with the sign flipped
                params["unsigned"] = True
            if kind == "int" and op in _KEEPS_INTS:
                self.unsigned.add(out)
        self.steps.append({"op": op, "out": out, "in": inputs, **params})
        return out


#: steps that compute with their input's values (not hash or look up their bits)
_ARITHMETIC = frozenset({"fill", "clip", "log1p", "standardize", "bucketize"})
#: steps whose integer output holds the input's values (the dtype kept): a uint64
#: input gives a uint64 output
_KEEPS_INTS = frozenset({"fill", "clip", "list_slice"})


Translator = Callable[[Any, _Builder, dict[str, int], Schema, Schema], dict[str, int]]


def _per_column(fn: Callable[[Any, _Builder, str, int, ColumnSchema, ColumnSchema], int]) -> Translator:
    """A translator for ops that map input column ``i`` to output column ``i``."""

    def translate(op, b, slots, in_schema, out_schema):
        return {o.name: fn(op, b, i.name, slots[i.name], i, o) for i, o in zip(in_schema, out_schema)}
    return translate


def _fill(op: Any, b: _Builder, slots: dict[str, int], in_schema: Schema, out_schema: Schema) -> dict[str, int]:
    out: dict[str, int] = {}
    for name in in_schema.column_names:
        value = op.fill_val if isinstance(op, FillMissing) else op.medians[name]
        dtype = out_schema[name].dtype
        out[name] = slots[name] if value is None else b.step("fill", [slots[name]], _kind(dtype),
                                                             value=_fill_value(value, dtype), dtype=dtype)
        if op.add_binary_cols:
            flag = f"{name}_filled"
            out[flag] = b.step("missing_flag", [slots[name]], "bool", dtype="bool") if value is not None \
                else b.step("const_false", [slots[name]], "bool", dtype="bool")
    return out


def _clip(op, b, name, slot, col, out):
    if _kind(out.dtype) == "int":
        # the op's own rule: a bound no value of the dtype can cross is dropped
        lo, hi = op._int_bounds(name, col.dtype)
        return b.step("clip", [slot], "int", min=lo, max=hi, dtype=out.dtype)
    return b.step("clip", [slot], _kind(out.dtype), min=_num(op.min_value), max=_num(op.max_value), dtype=out.dtype)


def _fill_value(value: Any, dtype: str) -> float | int:
    """A fill value as the plan holds it: an int for integer dtypes (a float would
    round one past 2**53), else a float."""
    return int(value) if _kind(dtype) == "int" else float(value)


def int_bits(value: int) -> int:
    """An integer of int64 or uint64 range as the int64 that holds its bits (how the
    artifact carries uint64 values: 2**63 and up negative)."""
    return value - (1 << 64) if value >= 1 << 63 else value


def _num(v: Any) -> float | None:
    return None if v is None else float(v)


def float_width(value: float, dtype: str) -> float:
    """``value`` rounded to the float dtype ``dtype`` (float16, float32), as the
    Workflow casts a fill value or a Clip bound to its column's type."""
    if dtype in ("float16", "float32"):
        with np.errstate(over="ignore"):
            return float(np.asarray(value, np.float64).astype(dtype))
    return value


def _log(op, b, name, slot, col, out):
    return b.step("log1p", [slot], "float", dtype=out.dtype)


def _standardize(op, b, name, slot, col, out):
    if isinstance(op, Normalize):
        shift, scale = op.means[name], op.stds[name]
    else:
        shift, scale = op.mins[name], max(op.maxs[name] - op.mins[name], 0.0)
    return b.step("standardize", [slot], "float", shift=float(shift), scale=float(scale), dtype=out.dtype)


def _bucketize(op, b, name, slot, col, out):
    bounds = op.boundaries[name] if isinstance(op.boundaries, dict) else op.boundaries
    return b.step("bucketize", [slot], "int", boundaries=[float(v) for v in bounds], dtype=out.dtype)


def _hash_bucket(op, b, name, slot, col, out):
    return b.step("hash_bucket", [slot], "int", num_buckets=int(out.properties["num_buckets"]), dtype="int64")


def _list_slice(op, b, name, slot, col, out):
    if slot not in b.lists:  # the op's own schema check refuses scalars at fit already
        raise ExportError(f"serving: ListSlice on column {name!r}, which is not a list")
    start, end = op._bounds
    if op.pad and b.kinds[slot] == "string":
        raise ExportError(f"serving: ListSlice(pad=True) on the list of strings {name!r} has no in-graph "
                          "version yet; pad after Categorify (ListSlice on the ids), or leave the column out "
                          "(Workflow.remove_inputs)")
    pad_value = None if not op.pad else _fill_value(op.pad_value, "float64" if b.kinds[slot] == "float" else "int64")
    out_slot = b.step("list_slice", [slot], b.kinds[slot], start=start, end=end,
                      length=op.length if op.pad else None, pad_value=pad_value, dtype=out.dtype)
    return out_slot


def _hashed_cross(op: Any, b: _Builder, slots: dict[str, int], in_schema: Schema, out_schema: Schema) -> dict[str, int]:
    out = {}
    for col in out_schema:
        parts = col.name.split("_X_")
        out[col.name] = b.step("hashed_cross", [slots[p] for p in parts], "int",
                               num_buckets=int(col.properties["num_buckets"]), dtype="int64")
    return out


def _categorify(op: Any, b: _Builder, slots: dict[str, int], in_schema: Schema, out_schema: Schema) -> dict[str, int]:
    if op.encode_type == "combo" and op.column_groups and any(len(g) > 1 for g in op.column_groups):
        raise ExportError("serving: Categorify(encode_type='combo') has no in-graph version yet (the combined "
                          "key of several columns); use HashedCross, or joint encoding")
    out = {}
    for name in in_schema.column_names:
        kind = b.kinds[slots[name]]
        mapping = op.reverse_mapping(name)
        ids = mapping.column("id").to_numpy().astype(np.int64)
        values = mapping.column("value").combine_chunks()
        # the column's own num_buckets (op.buckets_of of its vocabulary; a dict names some)
        step: dict[str, Any] = {"num_buckets": out_schema[name].properties.get("num_buckets"),
                                "dtype": out_schema[name].dtype, "ids": ids.tolist()}
        if kind == "string":
            step["vocab"] = values.cast("string").to_pylist()
        elif kind == "float":
            step["vocab"] = float_bits(values.cast("float64").to_numpy(zero_copy_only=False)).tolist()
        elif pa.types.is_uint64(values.type):
            step["vocab"] = values.view(pa.int64()).to_pylist()  # the bits, as raw_arrays sends them
        else:
            step["vocab"] = values.cast("int64").to_pylist()
        out[name] = b.step("categorify", [slots[name]], "int", **step)
    return out


def float_bits(x: np.ndarray) -> np.ndarray:
    """The int64 bit patterns of float64 values, ``-0.0`` folded into ``0.0``."""
    return (np.asarray(x, dtype=np.float64) + 0.0).view(np.int64)


def string_keys(values: Iterable[str]) -> np.ndarray:
    """The 64-bit lookup key of each string, ``murmur3(b, 0) << 32 | murmur3(b, KEY_SEED)``,
    as int64 (what the torch artifact computes in-graph)."""
    arr = pa.array(list(values), pa.string())
    h0 = murmur3_32(arr).astype(np.uint64)
    h1 = murmur3_32(arr, KEY_SEED).astype(np.uint64)
    return ((h0 << np.uint64(32)) | h1).view(np.int64)


_TRANSLATORS: dict[type, Translator] = {
    FillMissing: _fill,
    FillMedian: _fill,
    Clip: _per_column(_clip),
    LogOp: _per_column(_log),
    Normalize: _per_column(_standardize),
    NormalizeMinMax: _per_column(_standardize),
    Bucketize: _per_column(_bucketize),
    HashBucket: _per_column(_hash_bucket),
    HashedCross: _hashed_cross,
    Categorify: _categorify,
    ListSlice: _per_column(_list_slice),
}


def _translate(op: Any, b: _Builder, slots: dict[str, int], in_schema: Schema, out_schema: Schema) -> dict[str, int]:
    cls = type(op)
    if isinstance(op, _PASSTHROUGH):
        # schema-only ops: output column i is input column i (Rename renames them)
        return {o.name: slots[i.name] for i, o in zip(in_schema, out_schema)}
    translator = next((t for c, t in _TRANSLATORS.items() if cls is c), None)
    if translator is None:
        why = next((r for c, r in REFUSED.items() if isinstance(op, c)), "it has no in-graph version")
        raise ExportError(f"serving: {cls.__name__} cannot run inside the exported model: {why}. "
                          f"Apply it before the served workflow, or leave its columns out "
                          "(Workflow.remove_inputs)")
    for col in in_schema:
        if col.is_list and not isinstance(op, _LIST_OPS):
            raise ExportError(f"serving: {cls.__name__} on list column {col.name!r} has no in-graph version; "
                              f"the in-graph list ops are {sorted(c.__name__ for c in _LIST_OPS)}: leave the "
                              "column out (Workflow.remove_inputs)")
    return translator(op, b, slots, in_schema, out_schema)


def _node_slots(node: Node, b: _Builder, cache: dict[int, dict[str, int]],
                schemas: dict[int, Schema]) -> dict[str, int]:
    if node.id in cache:
        return cache[node.id]
    out_schema = node.output_schema(b.input_schema, schemas)
    if node.kind == "select":
        slots = {name: b.raw(name) for name in out_schema.column_names}
    elif node.kind == "op":
        slots = {}
        for p in node.parents:
            slots.update(_node_slots(p, b, cache, schemas))
        in_schema = Schema([c for p in node.parents for c in p.output_schema(b.input_schema, schemas)])
        slots = _translate(node.op, b, slots, in_schema, out_schema)
    elif node.kind == "concat":
        slots = {}
        for p in node.parents:
            slots.update(_node_slots(p, b, cache, schemas))
    else:  # drop
        slots = {k: v for k, v in _node_slots(node.parents[0], b, cache, schemas).items() if k not in node.names}
    cache[node.id] = slots
    return slots


def build_plan(workflow: Any, exclude: Iterable[str] | None = None) -> ServingPlan:
    """The serving plan of a fitted ``workflow``.

    ``exclude``: output columns not to serve; by default those tagged ``TARGET``
    (the label passes through at training only). Raw inputs that only excluded
    columns need are not inputs of the artifact.
    """
    schema: Schema = workflow.output_schema
    if exclude is None:
        exclude = [c.name for c in schema if Tags.TARGET in c.tags]
    exclude = set(exclude)
    unknown = sorted(exclude - set(schema.column_names))
    if unknown:
        raise ValueError(f"serving: exclude names {unknown}, which are not output columns of the workflow; "
                         f"its outputs are {schema.column_names}")
    served = [c for c in schema if c.name not in exclude]
    # only the graph below the served columns: an excluded column's ops are not translated
    node = workflow.output_node - sorted(exclude) if exclude else workflow.output_node
    b = _Builder(workflow.input_schema)
    slots = _node_slots(node, b, {}, {})
    strings = [c.name for c in served if b.kinds[slots[c.name]] == "string"]
    if strings:
        raise ExportError(f"serving: output columns {strings} are strings (or lists of strings), which the "
                          "artifact does not return; encode them in the workflow (Categorify or HashBucket "
                          "after them), or leave them out (exclude=..., Workflow.remove_inputs)")
    steps, needed = _prune(b.steps, [slots[c.name] for c in served])
    inputs = [InputSpec(n, b.kinds[b.input_slots[n]], workflow.input_schema[n].dtype,
                        b.input_slots[n] in b.lists)
              for n in b._raw if b.input_slots[n] in needed]
    # renumber: inputs first (0..n-1), then the steps' outputs in order
    order = [b.input_slots[i.name] for i in inputs] + [s["out"] for s in steps]
    new = {old: i for i, old in enumerate(order)}
    steps = [{**s, "out": new[s["out"]], "in": [new[i] for i in s["in"]]} for s in steps]
    outputs = [OutputSpec(c.name, new[slots[c.name]], c.dtype, *_layout(c)) for c in served]
    kinds = {new[old]: b.kinds[old] for old in order}
    return ServingPlan(inputs, steps, outputs, kinds, sorted(new[old] for old in order if old in b.lists))


def _layout(col: ColumnSchema) -> tuple[str, int | None]:
    """How the loaders deliver ``col``: scalar, ragged ``(values, offsets)``, or fixed
    ``(dense, mask)`` when the schema gives every row one length."""
    if not col.is_list:
        return "scalar", None
    counts = col.properties.get("value_count") or {}
    if counts.get("min") is not None and counts.get("min") == counts.get("max") and int(counts["max"]) > 0:
        return "fixed", int(counts["max"])  # as tabstream.loaders.layout.column_layout reads it
    return "ragged", None


def _prune(steps: list[dict[str, Any]], wanted: Iterable[int]) -> tuple[list[dict[str, Any]], set[int]]:
    """The steps the ``wanted`` slots need, in order, and every slot they read."""
    by_out = {s["out"]: s for s in steps}
    needed: set[int] = set()
    todo = list(wanted)
    while todo:
        slot = todo.pop()
        if slot in needed:
            continue
        needed.add(slot)
        if slot in by_out:
            todo.extend(by_out[slot]["in"])
    return [s for s in steps if s["out"] in needed], needed


def without_inputs(workflow: Any, names: Iterable[str]) -> Node | None:
    """The output node of ``workflow``'s graph rebuilt without the raw columns ``names``
    and everything computed from them (None when nothing is left). The fitted ops are
    shared, not copied. A per-column op keeps its other columns; an op that combines
    columns (a cross, a join) loses all its outputs when one of its inputs goes.
    """
    from tabstream.core.graph import ColumnSelector
    from tabstream.core.operators import ColumnOperator

    raw = set(names)
    unknown = sorted(raw - set(workflow.input_columns))
    if unknown:
        raise ValueError(f"remove_inputs: {unknown} are not input columns of the workflow; "
                         f"its inputs are {workflow.input_columns}")
    schemas: dict[int, Schema] = {}
    built: dict[int, Node | None] = {}
    for node in workflow.output_node.walk():
        if node.kind == "select":
            kept = [n for n in node.output_schema(workflow.input_schema, schemas).column_names if n not in raw]
            built[node.id] = Node("select", selector=ColumnSelector(kept)) if kept else None
            continue
        parents = [built[p.id] for p in node.parents]
        alive = [p for p in parents if p is not None]
        if node.kind == "concat":
            built[node.id] = None if not alive else alive[0] if len(alive) == 1 else Node("concat", alive)
        elif node.kind == "drop":
            parent = alive[0] if alive else None
            if parent is None:
                built[node.id] = None
                continue
            have = parent.output_schema(workflow.input_schema.without(sorted(raw)), {}).column_names
            names_left = [n for n in node.names if n in have]
            built[node.id] = Node("drop", [parent], names=names_left) if names_left else parent
        else:
            before = sum(len(p.output_schema(workflow.input_schema, schemas)) for p in node.parents)
            after = sum(len(p.output_schema(workflow.input_schema.without(sorted(raw)), {})) for p in alive)
            per_column = isinstance(node.op, (ColumnOperator, *_PASSTHROUGH))
            if not alive or (after < before and not per_column):
                built[node.id] = None
            else:
                built[node.id] = Node("op", alive, op=node.op)
    return built[workflow.output_node.id]

"""A fitted Workflow as a Keras layer: raw columns in, the model's inputs out.

``Workflow.to_keras()`` returns :class:`RawFeatures`, a Keras 3 layer of TensorFlow
operations (the TensorFlow backend), so ``model.export`` writes it into the
SavedModel: serving needs TensorFlow only. Inputs, per raw column ``NAME``: numbers
``NAME`` float64/int64 ``[B]``, strings ``NAME`` ``tf.string [B]``, and
``NAME__mask`` bool ``[B]`` (True where present); lists ``NAME`` (their elements,
``[N]``), ``NAME__mask`` ``[N]`` and ``NAME__offsets`` int64 ``[B+1]`` (row splits).
Output: ``{column: tensor [B]}`` of the output schema's dtypes, list columns ``(values,
offsets)`` or ``(dense, mask)`` ``[B, L]`` when fixed, as the TF loader delivers them.

>>> import pandas as pd, tabstream as ts
>>> from tabstream import ops
>>> from tabstream.serving.inputs import raw_arrays
>>> wf = ts.Workflow(["c"] >> ops.Categorify())
>>> _ = wf.fit(pd.DataFrame({"c": ["a", "b", "a"]}))
>>> layer = wf.to_keras()
>>> raw = raw_arrays(pd.DataFrame({"c": ["b", "zz", None, "a"]}), layer.plan.inputs, "keras")
>>> layer({k: tf.constant(v) for k, v in raw.items()})["c"].numpy().tolist()   # b, unseen, null, a
[4, 2, 1, 3]

Categorify looks values up in a ``tf.lookup.StaticHashTable`` (strings by value,
numbers by their int64 value or float64 bits); MurmurHash3 (HashBucket, HashedCross,
Categorify's hashed out-of-vocabulary ids) runs as TensorFlow integer operations
(:mod:`tabstream.serving.murmur`).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import tensorflow as tf

from tabstream.serving import murmur
from tabstream.serving.plan import ServingPlan, float_width, int_bits

__all__ = ["RawFeatures", "export", "input_signature", "signature_outputs"]

_DTYPES = {"float32": tf.float32, "float64": tf.float64, "float16": tf.float16,
           "int64": tf.int64, "int32": tf.int32, "int16": tf.int16, "int8": tf.int8,
           "uint8": tf.uint8, "uint16": tf.uint16, "uint32": tf.uint32, "uint64": tf.uint64, "bool": tf.bool}


def _float64(col: Any, step: dict[str, Any]) -> Any:
    """A column's values as float64; uint64 bits (``step["unsigned"]``) rounded once
    from their two 32-bit halves, as numpy converts uint64."""
    if not step.get("unsigned"):
        return tf.cast(col.values, tf.float64)
    high = tf.bitwise.bitwise_and(tf.bitwise.right_shift(col.values, _i64(32)), _i64(0xFFFFFFFF))
    low = tf.bitwise.bitwise_and(col.values, _i64(0xFFFFFFFF))
    return tf.cast(high, tf.float64) * 4294967296.0 + tf.cast(low, tf.float64)


def _i64(v: Any) -> Any:
    return tf.constant(v, tf.int64)


class _K:
    """The tensor kernels :mod:`tabstream.serving.murmur` needs."""

    @staticmethod
    def band(a, m):
        return tf.bitwise.bitwise_and(a, _i64(m) if isinstance(m, int) else m)

    @staticmethod
    def bor(a, b):
        return tf.bitwise.bitwise_or(a, b)

    @staticmethod
    def bxor(a, b):
        return tf.bitwise.bitwise_xor(a, _i64(b) if isinstance(b, int) else b)

    @staticmethod
    def shl(a, n):
        return tf.bitwise.left_shift(a, _i64(n))

    @staticmethod
    def shr(a, n):
        return tf.bitwise.right_shift(a, _i64(n))

    @staticmethod
    def gather(data, idx):
        return tf.gather(data, tf.clip_by_value(idx, 0, tf.shape(data, out_type=tf.int64)[0] - 1))

    @staticmethod
    def where(c, a, b):
        return tf.where(c, a, b)

    @staticmethod
    def full_like(a, v):
        return tf.fill(tf.shape(a), tf.constant(v, a.dtype))

    @staticmethod
    def loop(counts, body, state):
        steps = tf.reduce_max(tf.concat([counts, tf.zeros([1], tf.int64)], 0))
        out = tf.while_loop(lambda j, *hs: j < steps,
                            lambda j, *hs: (j + 1, *body(j, list(hs))),
                            (tf.constant(0, tf.int64), *state))
        return list(out[1:])


def _bits(x: Any) -> Any:
    """float64 bits with -0.0 as 0.0 (a ``where``: graph optimizers drop ``x + 0.0``)."""
    return tf.bitcast(tf.where(tf.equal(x, 0.0), tf.zeros_like(x), x), tf.int64)


class _Column:
    def __init__(self, values: Any, present: Any, kind: str, starts: Any = None, lengths: Any = None,
                 strings: Any = None, offsets: Any = None) -> None:
        self.values, self.present, self.kind = values, present, kind
        self.starts, self.lengths, self.strings = starts, lengths, strings
        self.offsets = offsets  # row offsets of a list column's elements
        self._hash: Any = None

    @classmethod
    def of_strings(cls, strings: Any, present: Any, offsets: Any = None) -> _Column:
        """A string column (or list column's elements) with their bytes end to end."""
        lengths = tf.cast(tf.strings.length(strings, unit="BYTE"), tf.int64)
        ends = tf.cumsum(lengths)
        data = tf.reshape(tf.io.decode_raw(tf.strings.reduce_join(strings), tf.uint8), [-1])
        data = tf.concat([tf.cast(data, tf.int64), tf.zeros([4], tf.int64)], 0)
        return cls(data, present, "string", ends - lengths, lengths, strings=strings, offsets=offsets)

    def missing(self) -> Any:
        if self.kind == "float":
            return tf.logical_or(tf.logical_not(self.present), tf.math.is_nan(self.values))
        return tf.logical_not(self.present)

    def hash(self) -> Any:
        if self._hash is None:
            if self.kind == "string":
                (self._hash,) = murmur.hash_bytes(_K, self.values, self.starts, self.lengths)
            else:
                bits = _bits(self.values) if self.kind == "float" else self.values
                self._hash = murmur.hash_int64(_K, bits)
        return self._hash


def input_signature(plan: ServingPlan) -> dict[str, tf.TensorSpec]:
    """``{input name: tf.TensorSpec}`` of the raw inputs, any batch size."""
    sig = {}
    for spec in plan.inputs:
        dtype = {"string": tf.string, "float": tf.float64}.get(spec.kind, tf.int64)
        sig[spec.name] = tf.TensorSpec([None], dtype, name=spec.name)
        sig[f"{spec.name}__mask"] = tf.TensorSpec([None], tf.bool, name=f"{spec.name}__mask")
        if spec.is_list:
            sig[f"{spec.name}__offsets"] = tf.TensorSpec([None], tf.int64, name=f"{spec.name}__offsets")
    return sig


class RawFeatures(keras.layers.Layer):
    """The serving plan as TensorFlow operations (see the module docstring)."""

    def __init__(self, plan: ServingPlan, **kwargs: Any) -> None:
        # float64 throughout: Keras would otherwise cast float64 raw inputs to float32
        super().__init__(trainable=False, dtype="float64", **kwargs)
        self.plan = plan
        self._tables: dict[str, Any] = {}  # string keys: TF's tracking saves no others
        for step in plan.steps:
            if step["op"] == "categorify":
                kind = plan.kinds[step["in"][0]]
                if kind == "string":
                    keys = tf.constant(np.array(step["vocab"], dtype=object), tf.string)
                else:
                    keys = tf.constant(np.asarray(step["vocab"], dtype=np.int64), tf.int64)
                init = tf.lookup.KeyValueTensorInitializer(keys, tf.constant(step["ids"], tf.int64))
                self._tables[f"t{step['out']}"] = tf.lookup.StaticHashTable(init, default_value=-1)
        self.built = True  # no weights to create

    def lookup_tables(self) -> list[Any]:
        """The layer's ``tf.lookup`` tables (an export archive tracks them)."""
        return list(self._tables.values())

    def call(self, inputs: dict[str, Any]) -> dict[str, Any]:
        env: dict[int, _Column] = {}
        for slot, spec in enumerate(self.plan.inputs):
            present = tf.cast(inputs[f"{spec.name}__mask"], tf.bool)
            values = inputs[spec.name]
            if spec.kind == "string":
                col = _Column.of_strings(values, present)
            elif spec.kind == "float":
                values = tf.cast(values, tf.float64)
                if spec.dtype in ("float32", "float16"):  # rounded as Workflow.transform casts it
                    values = tf.cast(tf.cast(values, spec.dtype), tf.float64)
                col = _Column(values, present, "float")
            elif spec.kind == "bool":  # any other number is True, as Workflow.transform casts it
                col = _Column(tf.cast(tf.not_equal(tf.cast(values, tf.int64), 0), tf.int64), present, "bool")
            else:
                col = _Column(tf.cast(values, tf.int64), present, spec.kind)
            if spec.is_list:
                col.offsets = tf.cast(inputs[f"{spec.name}__offsets"], tf.int64)
            env[slot] = col
        for step in self.plan.steps:
            cols = [env[i] for i in step["in"]]
            got = getattr(self, "_" + step["op"])(step, *cols)
            if got.offsets is None:  # an element-wise step keeps the rows
                got.offsets = cols[0].offsets
            env[step["out"]] = got
        out: dict[str, Any] = {}
        for spec in self.plan.outputs:
            col = env[spec.slot]
            dtype = _DTYPES[spec.dtype]
            if dtype.is_floating:
                values = tf.where(col.missing(), tf.constant(np.nan, tf.float64), tf.cast(col.values, tf.float64))
            elif dtype == tf.bool:
                values = tf.cast(col.values, tf.bool)
            else:
                values = tf.where(col.missing(), _i64(-1), col.values)
            values = tf.cast(values, dtype)
            if spec.layout == "ragged":
                out[spec.name] = (values, col.offsets)
            elif spec.layout == "fixed":
                out[spec.name] = _dense(values, col.offsets, spec.length)
            else:
                out[spec.name] = values
        return out

    # -- steps (one per plan op) ---------------------------------------------
    @staticmethod
    def _round(values: Any, dtype: str) -> Any:
        """float64 ``values`` rounded to the float dtype ``dtype`` (float16, float32)."""
        if dtype in ("float16", "float32"):
            return tf.cast(tf.cast(values, _DTYPES[dtype]), tf.float64)
        return values

    @staticmethod
    def _all(col: _Column) -> Any:
        return tf.ones_like(col.present)

    def _fill(self, step, col):
        missing = col.missing()
        if step["dtype"].startswith("float"):
            value = float_width(step["value"], step["dtype"])
            values = tf.where(missing, tf.constant(value, tf.float64), _float64(col, step))
            return _Column(self._round(values, step["dtype"]), self._all(col), "float")
        values = tf.where(missing, _i64(int_bits(int(step["value"]))), col.values)
        return _Column(values, self._all(col), "int")

    # bool columns hold int64 0/1, as raw bool inputs do (hashes and lookups take int64)
    def _missing_flag(self, step, col):
        return _Column(tf.cast(col.missing(), tf.int64), self._all(col), "bool")

    def _const_false(self, step, col):
        return _Column(tf.zeros(tf.shape(col.present), tf.int64), self._all(col), "bool")

    def _clip(self, step, col):
        lo, hi = step["min"], step["max"]
        if step["dtype"].startswith("float"):
            values = self._round(_float64(col, step), step["dtype"])
            lo = None if lo is None else float_width(lo, step["dtype"])
            hi = None if hi is None else float_width(hi, step["dtype"])
            if lo is not None:
                values = tf.where(values < lo, tf.constant(lo, tf.float64), values)
            if hi is not None:
                values = tf.where(values > hi, tf.constant(hi, tf.float64), values)
            return _Column(values, col.present, "float")
        values = col.values
        # uint64 bits compare as unsigned with the sign bit flipped (bounds likewise)
        flip = (1 << 63) if step.get("unsigned") else 0
        order = tf.bitwise.bitwise_xor(values, _i64(-(1 << 63))) if flip else values
        if lo is not None and np.isfinite(lo):
            values = tf.where(order < _i64(int(lo) - flip), _i64(int_bits(int(lo))), values)
        if hi is not None and np.isfinite(hi):
            values = tf.where(order > _i64(int(hi) - flip), _i64(int_bits(int(hi))), values)
        return _Column(values, col.present, "int")

    def _log1p(self, step, col):
        return _Column(self._round(tf.math.log1p(_float64(col, step)), step["dtype"]),
                       col.present, "float")

    def _standardize(self, step, col):
        values = _float64(col, step) - step["shift"]
        if step["scale"] > 0:
            values = values / step["scale"]
        return _Column(self._round(values, step["dtype"]), col.present, "float")

    def _bucketize(self, step, col):
        bounds = tf.constant(step["boundaries"], tf.float64)
        values = _float64(col, step)
        ids = tf.searchsorted(bounds, values, side="right", out_type=tf.int64)
        return _Column(ids, tf.logical_not(col.missing()), "int")

    def _hash_bucket(self, step, col):
        n = step["num_buckets"]
        ids = tf.where(col.missing(), _i64(n), tf.math.floormod(col.hash(), _i64(n)))
        return _Column(ids, self._all(col), "int")

    def _hashed_cross(self, step, *cols):
        n = step["num_buckets"]
        marker = _i64(murmur.MISSING_PART)
        first_missing = cols[0].missing()
        h = tf.where(first_missing, tf.fill(tf.shape(cols[0].present), marker), cols[0].hash())
        all_missing = first_missing
        for col in cols[1:]:
            missing = col.missing()
            folded = murmur.hash_combine(_K, h, col.hash())
            m = tf.fill(tf.shape(h), marker)
            skipped = murmur.hash_combine(_K, murmur.hash_combine(_K, h, m), m)
            h = tf.where(missing, skipped, folded)
            all_missing = tf.logical_and(all_missing, missing)
        h = tf.where(first_missing, murmur.hash_combine(_K, h, tf.fill(tf.shape(h), marker)), h)
        ids = tf.where(all_missing, _i64(n), tf.math.floormod(h, _i64(n)))
        return _Column(ids, tf.ones_like(all_missing), "int")

    def _list_slice(self, step, col):
        """Python's ``row[start:end]`` per row; with ``length``, every row padded to it."""
        o = col.offsets
        n = o[1:] - o[:-1]
        start, end = step["start"], step["end"]

        def bound(v):
            return tf.minimum(tf.maximum(n + v if v < 0 else tf.fill(tf.shape(n), _i64(v)), 0), n)

        s = bound(start)
        e = tf.maximum(n if end is None else bound(end), s)
        if step["length"] is not None:
            length = step["length"]
            k = tf.range(length, dtype=tf.int64)
            idx = tf.reshape(tf.expand_dims(o[:-1] + s, 1) + k, [-1])
            valid = tf.reshape(k < tf.expand_dims(e - s, 1), [-1])
            values = tf.concat([col.values, tf.zeros([1], col.values.dtype)], 0)  # never empty
            present = tf.concat([col.present, tf.ones([1], tf.bool)], 0)
            pad = tf.constant(step["pad_value"] if col.kind == "float" else int_bits(int(step["pad_value"])), values.dtype)
            values = tf.where(valid, _K.gather(values, idx), pad)
            present = tf.where(valid, _K.gather(present, idx), True)
            rows = tf.range(tf.shape(n, out_type=tf.int64)[0] + 1) * length
            return _Column(values, present, col.kind, offsets=rows)
        p = tf.range(tf.shape(col.present, out_type=tf.int64)[0])
        row = tf.minimum(tf.searchsorted(o[1:], p, side="right", out_type=tf.int64),
                         tf.shape(n, out_type=tf.int64)[0] - 1)
        within = p - tf.gather(o, row)
        keep = tf.where((within >= tf.gather(s, row)) & (within < tf.gather(e, row)))[:, 0]
        offsets = tf.concat([tf.zeros([1], tf.int64), tf.cumsum(e - s)], 0)
        present = tf.gather(col.present, keep)
        if col.kind == "string":
            return _Column.of_strings(tf.gather(col.strings, keep), present, offsets)
        return _Column(tf.gather(col.values, keep), present, col.kind, offsets=offsets)

    def _categorify(self, step, col):
        table = self._tables[f"t{step['out']}"]
        if col.kind == "string":
            ids = table.lookup(col.strings)
        elif col.kind == "float":
            ids = table.lookup(_bits(col.values))
        else:
            ids = table.lookup(col.values)
        if step["num_buckets"]:
            oov = tf.math.floormod(col.hash(), _i64(step["num_buckets"])) + 2
        else:
            oov = tf.fill(tf.shape(ids), _i64(2))
        ids = tf.where(ids < 0, oov, ids)
        ids = tf.where(col.missing(), _i64(1), ids)
        return _Column(ids, self._all(col), "int")


def _dense(values: Any, offsets: Any, length: int) -> tuple[Any, Any]:
    """Ragged rows as ``(dense [B, length], mask)``: cut or zero-padded, as the loader does."""
    n = offsets[1:] - offsets[:-1]
    k = tf.range(length, dtype=tf.int64)
    idx = tf.expand_dims(offsets[:-1], 1) + k
    mask = k < tf.expand_dims(n, 1)
    padded = tf.concat([values, tf.zeros([1], values.dtype)], 0)  # never empty
    dense = tf.where(mask, _K.gather(padded, idx), tf.zeros([], values.dtype))
    return dense, mask


class _Bundle(keras.Model):
    """Raw features, then the model."""

    def __init__(self, features: RawFeatures, model: Any) -> None:
        super().__init__()
        self.features, self.model = features, model
        self.built = True  # both parts are

    def call(self, inputs: dict[str, Any]) -> Any:
        return self.model(self.features(inputs))


def signature_outputs(features: dict[str, Any]) -> dict[str, Any]:
    """The layer's outputs as a SavedModel signature returns them (one tensor per
    name): a ragged list ``NAME`` as ``NAME__values`` and ``NAME__offsets`` (the
    loaders' ``list_layout="flat"``), a fixed-length one as ``NAME`` ``[B, L]`` and
    ``NAME__mask``; the bundled models take both forms."""
    out = {}
    for name, value in features.items():
        if isinstance(value, tuple):
            first, second = value
            if first.shape.rank == 1:
                out[f"{name}__values"], out[f"{name}__offsets"] = first, second
            else:
                out[name], out[f"{name}__mask"] = first, second
        else:
            out[name] = value
    return out


def export(layer: RawFeatures, path: str, model: Any = None) -> None:
    """Write a SavedModel at ``path`` whose ``serve`` endpoint takes the raw inputs
    (:func:`input_signature`) and returns ``model``'s outputs (the features
    themselves without a model, flat: :func:`signature_outputs`); a ``features``
    endpoint returns the features."""
    archive = keras.export.ExportArchive()
    target = layer if model is None else _Bundle(layer, model)
    archive.track(target)
    for table in layer.lookup_tables():  # resources inside a nested layer are not found alone
        archive.track(table)
    signature = [input_signature(layer.plan)]

    def features(inputs):
        return signature_outputs(layer.call(inputs))

    archive.add_endpoint("serve", target.call if model is not None else features, input_signature=signature)
    if model is not None:
        archive.add_endpoint("features", features, input_signature=signature)
    archive.write_out(path, verbose=False)

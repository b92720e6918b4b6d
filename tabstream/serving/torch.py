"""A fitted Workflow as an ``nn.Module``: raw columns in, the model's inputs out.

``Workflow.to_torch()`` returns :class:`RawFeatures`; ``torch.export`` captures it
(alone or with the model, :func:`export`) into a program that needs neither
tabstream nor Python code of ours to run. Inputs, per raw column ``NAME`` (see
:mod:`tabstream.serving.inputs`): numbers ``NAME`` float64/int64 ``[B]`` plus
``NAME__mask`` bool ``[B]`` (True where present); strings ``NAME`` uint8 (the
UTF-8 bytes of the batch, end to end), ``NAME__offsets`` int64 ``[B+1]`` and
``NAME__mask``; lists ``NAME`` (their elements, ``[N]``), ``NAME__mask`` ``[N]``,
``NAME__offsets`` int64 ``[B+1]`` (a list of strings: the bytes in ``NAME``, the
elements' byte offsets in ``NAME__value_offsets`` ``[N+1]``). Output: ``{column:
tensor [B]}`` of the output schema's dtypes; list columns ``(values, offsets)``, or
``(dense, mask)`` ``[B, L]`` when the schema fixes their length, as the loader gives them.

>>> import pandas as pd, tabstream as ts
>>> from tabstream import ops
>>> from tabstream.serving.inputs import raw_arrays
>>> wf = ts.Workflow(["c"] >> ops.Categorify())
>>> _ = wf.fit(pd.DataFrame({"c": ["a", "b", "a"]}))
>>> module = wf.to_torch()
>>> raw = {k: torch.as_tensor(v) for k, v in raw_arrays(pd.DataFrame({"c": ["b", "zz", None, "a"]}),
...                                                     module.plan.inputs, "torch").items()}
>>> module(raw)["c"].tolist()     # b, unseen (2), null (1), a
[4, 2, 1, 3]

Categorify looks strings up by a 64-bit key (two MurmurHash3 seeds) in a sorted
table, then compares the bytes with the vocabulary entry found: ids are exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from tabstream.core.errors import ExportError
from tabstream.serving import murmur
from tabstream.serving.plan import KEY_SEED, ServingPlan, float_width, int_bits, string_keys

__all__ = ["RawFeatures", "export"]

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
           "uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32, "uint64": torch.uint64,
           "bool": torch.bool}


class _K:
    """The tensor kernels :mod:`tabstream.serving.murmur` needs."""

    @staticmethod
    def band(a, m):
        return torch.bitwise_and(a, m)

    @staticmethod
    def bor(a, b):
        return torch.bitwise_or(a, b)

    @staticmethod
    def bxor(a, b):
        return torch.bitwise_xor(a, b)

    @staticmethod
    def shl(a, n):
        return torch.bitwise_left_shift(a, n)

    @staticmethod
    def shr(a, n):
        return torch.bitwise_right_shift(a, n)

    @staticmethod
    def mul32(a, c):
        # torch's int64 product wraps modulo 2**64 (two's complement), so its low 32
        # bits are the uint32 product: 2 operations instead of 7 (a 1-row request runs
        # ~1,100 ATen calls, each paying dispatch)
        return torch.bitwise_and(a * c, 0xFFFFFFFF)

    @staticmethod
    def gather(data, idx):
        # index_select: ``data[idx]`` is ~300x slower on CPU (torch 2.13, 10k of 800k)
        return torch.index_select(data, 0, torch.clamp(idx, 0, data.shape[0] - 1))

    @staticmethod
    def where(c, a, b):
        return torch.where(c, a, b)

    @staticmethod
    def full_like(a, v):
        return torch.full_like(a, v)

    @staticmethod
    def loop(counts, body, state):
        from torch._higher_order_ops.while_loop import while_loop

        steps = torch.cat([counts, counts.new_zeros(1)]).max()
        if not (torch.compiler.is_exporting() or torch.compiler.is_compiling()):
            # eager: a plain loop (the while_loop operator compiles its body when run eagerly)
            for j in range(int(steps)):
                state = body(torch.tensor(j, dtype=torch.int64), list(state))
            return list(state)

        def cond(j, *hs):
            return j < steps

        def step(j, *hs):
            return (j + 1, *body(j, list(hs)))

        out = while_loop(cond, step, (torch.zeros((), dtype=torch.int64), *state))
        return list(out[1:])


#: the MurmurHash3 seeds a step reads of a string column (Categorify's key is two)
_HASH_SEEDS: dict[str, tuple[int, ...]] = {"categorify": (0, KEY_SEED), "hash_bucket": (0,), "hashed_cross": (0,)}


def _concat_strings(cols: list[Any]) -> Any:
    """Several string columns as one: their bytes end to end, in order."""
    data, starts, base = [], [], 0
    for col in cols:
        n = col.values.shape[0] - 4
        data.append(col.values[:n])
        starts.append(col.starts + base)
        base = base + n
    return _Column(torch.cat([*data, cols[0].values.new_zeros(4)]), torch.cat([c.present for c in cols]),
                   "string", torch.cat(starts), torch.cat([c.lengths for c in cols]))


def _hash_together(cols: list[Any], seeds: tuple[int, ...]) -> None:
    """Hash the strings of several columns in one pass over their bytes, end to end
    (one loop, one op per step for all columns: a request's cost is its op count),
    and leave each column its share (``_Column.hashes`` then finds them)."""
    both = _concat_strings(cols)
    hs = murmur.hash_bytes(_K, both.values, both.starts, both.lengths, seeds)
    sizes = [c.lengths.shape[0] for c in cols]
    for seed, h in zip(seeds, hs):
        for col, piece in zip(cols, torch.split(h, sizes)):
            col._hashes[seed] = piece


# A float column fitted narrower than float64: its values in a request (float64, as
# pandas and JSON clients send them) are rounded to that width first, as
# Workflow.transform casts them; a float64 0.1 would match no vocabulary value fitted
# from float32 0.1, nor hash or bucket like it.
_NARROW_FLOATS = {"float32": torch.float32, "float16": torch.float16}


def _as(x: Any, dtype: Any) -> Any:
    """``x.to(dtype)`` only where it changes something: an exported program runs every
    node from Python, a no-op cast too (two nodes with its metadata check)."""
    return x if x.dtype == dtype else x.to(dtype)


def _take(values: Any, idx: Any) -> Any:
    """``values[idx]`` (in-range ``idx``) through index_select, see :meth:`_K.gather`."""
    return torch.index_select(values, 0, idx)


def _float64(col: Any, step: dict[str, Any]) -> Any:
    """A column's values as float64; uint64 bits (``step["unsigned"]``) rounded once
    from their two 32-bit halves, as numpy converts uint64."""
    if not step.get("unsigned"):
        return _as(col.values, torch.float64)
    high = torch.bitwise_and(torch.bitwise_right_shift(col.values, 32), 0xFFFFFFFF)
    low = torch.bitwise_and(col.values, 0xFFFFFFFF)
    return high.to(torch.float64) * 4294967296.0 + low.to(torch.float64)


def _bits(x: Any) -> Any:
    """float64 bits with -0.0 as 0.0 (a ``where``: a compiler may drop ``x + 0.0``)."""
    return torch.where(x == 0.0, torch.zeros_like(x), x).view(torch.int64)


class _Column:
    """A slot's values: numbers ``values`` + ``present``; strings their bytes too
    (``values`` the bytes, each string ``starts``/``lengths`` into them, in order);
    a list column its elements so, and its row ``offsets``."""

    def __init__(self, values: Any, present: Any, kind: str, starts: Any = None, lengths: Any = None,
                 offsets: Any = None) -> None:
        self.values, self.present, self.kind = values, present, kind
        self.starts, self.lengths, self.offsets = starts, lengths, offsets
        self._hashes: dict[int, Any] = {}

    def missing(self) -> Any:
        if self.kind == "float":
            return ~self.present | torch.isnan(self.values)
        return ~self.present

    def hashes(self, seeds: tuple[int, ...] = (0,)) -> list[Any]:
        todo = tuple(s for s in seeds if s not in self._hashes)
        if todo:
            if self.kind == "string":
                got = murmur.hash_bytes(_K, self.values, self.starts, self.lengths, todo)
            else:
                bits = _bits(self.values) if self.kind == "float" else self.values
                got = [murmur.hash_int64(_K, bits, s) for s in todo]
            self._hashes.update(zip(todo, got))
        return [self._hashes[s] for s in seeds]


class RawFeatures(nn.Module):
    """The serving plan as torch operations (see the module docstring)."""

    def __init__(self, plan: ServingPlan) -> None:
        super().__init__()
        self.plan = plan
        # Categorify of raw string columns (one row each): one lookup for them all, in
        # one table of every vocabulary (row c: step c's keys, padded with sentinels)
        together = [s for s in plan.steps if s["op"] == "categorify" and s["in"][0] < len(plan.inputs)
                    and plan.inputs[s["in"][0]].kind == "string" and not plan.inputs[s["in"][0]].is_list]
        self._lookup_together = together if len(together) > 1 else []
        tables = {}
        for step in plan.steps:
            if step["op"] == "categorify":
                tables[step["out"]] = self._table(step)
                if step["out"] not in {s["out"] for s in self._lookup_together}:
                    for name, arr in tables[step["out"]].items():
                        self.register_buffer(f"t{step['out']}_{name}", torch.as_tensor(arr), persistent=True)
        if self._lookup_together:
            self._merge_tables([tables[s["out"]] for s in self._lookup_together])
        # the raw string columns hashed in one pass, and the seeds they need
        needs: dict[int, set[int]] = {}
        for step in plan.steps:
            seeds = _HASH_SEEDS.get(step["op"], ())
            for slot in step["in"]:
                if slot < len(plan.inputs) and plan.inputs[slot].kind == "string" and seeds:
                    needs.setdefault(slot, set()).update(seeds)
        self._hashed_together = sorted(needs) if len(needs) > 1 else []
        self._together_seeds = tuple(sorted(set().union(*needs.values()))) if needs else ()

    def _merge_tables(self, tables: list[dict[str, np.ndarray]]) -> None:
        width = max(len(t["keys"]) for t in tables)
        sentinel = np.iinfo(np.int64).max
        keys = np.full((len(tables), width), sentinel, np.int64)
        merged = {name: np.zeros((len(tables), width), np.int64) for name in ("ids", "starts", "lengths")}
        valid = np.zeros((len(tables), width), bool)
        base = 0
        for c, t in enumerate(tables):
            n = len(t["keys"])
            keys[c, :n] = t["keys"]
            valid[c, :n] = t["valid"]
            merged["ids"][c, :n] = t["ids"]
            merged["lengths"][c, :n] = t["lengths"]
            merged["starts"][c, :n] = t["starts"] + base
            base += len(t["bytes"])
        flat = {"g_keys": keys, "g_flat_keys": keys.reshape(-1), "g_valid": valid.reshape(-1),
                "g_bytes": np.concatenate([t["bytes"] for t in tables]),
                "g_row": (np.arange(len(tables), dtype=np.int64) * width)[:, None],
                **{f"g_{k}": v.reshape(-1) for k, v in merged.items()}}
        for name, arr in flat.items():
            self.register_buffer(name, torch.as_tensor(arr), persistent=True)

    def _categorify_together(self, env: dict[int, _Column]) -> dict[int, _Column]:
        """:meth:`_categorify` of every step in ``_lookup_together`` at once."""
        steps = self._lookup_together
        cols = [env[s["in"][0]] for s in steps]
        keys = torch.stack([torch.bitwise_or(torch.bitwise_left_shift(h0, 32), h1)
                            for h0, h1 in (c.hashes((0, KEY_SEED)) for c in cols)])
        pos = torch.clamp(torch.searchsorted(self.g_keys, keys), max=self.g_keys.shape[1] - 1)
        flat = (pos + self.g_row).reshape(-1)
        both = _concat_strings(cols)
        found = (_take(self.g_flat_keys, flat) == keys.reshape(-1)) & _take(self.g_valid, flat) \
            & (_take(self.g_lengths, flat) == both.lengths)
        found = found & self._same_bytes(both, {"bytes": self.g_bytes, "starts": self.g_starts,
                                                "lengths": self.g_lengths}, flat)
        found = found.reshape(len(steps), -1)
        ids = _take(self.g_ids, flat).reshape(len(steps), -1)
        out = {}
        for c, (step, col) in enumerate(zip(steps, cols)):
            out[step["out"]] = self._finish_ids(step, col, found[c], ids[c])
        return out

    def _finish_ids(self, step: dict[str, Any], col: _Column, found: Any, ids: Any) -> _Column:
        """Out-of-vocabulary and missing rows' ids (Categorify's encoding)."""
        if step["num_buckets"]:
            oov = torch.remainder(col.hashes()[0], step["num_buckets"]) + 2
        else:
            oov = torch.full_like(ids, 2)
        ids = torch.where(found, ids, oov)
        ids = torch.where(col.missing(), 1, ids)
        return _Column(ids, torch.ones_like(col.present), "int")

    def _table(self, step: dict[str, Any]) -> dict[str, np.ndarray]:
        kind = self.plan.kinds[step["in"][0]]
        ids = np.asarray(step["ids"], dtype=np.int64)
        out = step["out"]
        if kind == "string":
            keys = string_keys(step["vocab"])
            encoded = [v.encode() for v in step["vocab"]]
            lengths = np.array([len(v) for v in encoded], dtype=np.int64)
            starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64) if len(encoded) else lengths
            data = np.frombuffer(b"".join(encoded) + b"\0" * 4, np.uint8).astype(np.int64)
        else:
            keys = np.asarray(step["vocab"], dtype=np.int64)
            lengths = starts = np.zeros(len(keys), np.int64)
            data = np.zeros(4, np.int64)
        order = np.argsort(keys, kind="stable")
        keys, ids, starts, lengths = keys[order], ids[order], starts[order], lengths[order]
        if len(np.unique(keys)) != len(keys):
            raise ExportError(f"serving: two vocabulary values of Categorify output slot {out} share a "
                              "64-bit lookup key; please report this (it should not happen in practice)")
        # a sentinel entry that never matches: the table is never empty
        valid = np.concatenate([np.ones(len(keys), bool), [False]])
        keys = np.concatenate([keys, [np.iinfo(np.int64).max]])
        ids, starts, lengths = (np.concatenate([a, [0]]) for a in (ids, starts, lengths))
        return {"keys": keys, "ids": ids, "starts": starts, "lengths": lengths, "valid": valid, "bytes": data}

    # -- forward --------------------------------------------------------------
    def forward(self, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        env: dict[int, _Column] = {}
        for slot, spec in enumerate(self.plan.inputs):
            present = inputs[f"{spec.name}__mask"]
            if spec.kind == "string":
                offsets = inputs[f"{spec.name}__value_offsets" if spec.is_list else f"{spec.name}__offsets"]
                data = torch.cat([inputs[spec.name].to(torch.int64), offsets.new_zeros(4)])
                starts = offsets[:-1]
                col = _Column(data, present, "string", starts, offsets[1:] - starts)
            elif spec.kind == "float":
                values = _as(inputs[spec.name], torch.float64)
                narrow = _NARROW_FLOATS.get(spec.dtype)
                if narrow is not None:  # rounded as Workflow.transform casts it (see plan)
                    values = values.to(narrow).to(torch.float64)
                col = _Column(values, present, "float")
            elif spec.kind == "bool":  # any other number is True, as Workflow.transform casts it
                col = _Column(_as(inputs[spec.name], torch.int64).ne(0).to(torch.int64), present, "bool")
            else:
                col = _Column(_as(inputs[spec.name], torch.int64), present, spec.kind)
            if spec.is_list:
                col.offsets = _as(inputs[f"{spec.name}__offsets"], torch.int64)
            env[slot] = col
        if self._hashed_together:
            _hash_together([env[i] for i in self._hashed_together], self._together_seeds)
        done = self._categorify_together(env) if self._lookup_together else {}
        for step in self.plan.steps:
            if step["out"] in done:
                env[step["out"]] = done[step["out"]]
                continue
            cols = [env[i] for i in step["in"]]
            got = getattr(self, "_" + step["op"])(step, *cols)
            if got.offsets is None:  # an element-wise step keeps the rows
                got.offsets = cols[0].offsets
            env[step["out"]] = got
        out: dict[str, Any] = {}
        for spec in self.plan.outputs:
            col = env[spec.slot]
            dtype = _DTYPES[spec.dtype]
            if dtype.is_floating_point:
                values = torch.where(col.missing(), torch.nan, _as(col.values, torch.float64))
            elif dtype == torch.bool:
                values = col.values
            else:
                values = torch.where(col.missing(), -1, col.values)
            if spec.layout == "fixed":  # padded before the cast: no index_select of uint64 in torch
                dense, mask = _dense(values, col.offsets, spec.length)
                out[spec.name] = (_as(dense, dtype), mask)
                continue
            values = _as(values, dtype)
            out[spec.name] = (values, col.offsets) if spec.layout == "ragged" else values
        return out

    # -- steps (one per plan op) ---------------------------------------------
    @staticmethod
    def _round(values: Any, dtype: str) -> Any:
        """float64 ``values`` rounded to the float dtype ``dtype`` (float16, float32)."""
        if dtype in ("float16", "float32"):
            return values.to(_DTYPES[dtype]).to(torch.float64)
        return values

    def _fill(self, step, col):
        missing = col.missing()
        if step["dtype"].startswith("float"):
            value = float_width(step["value"], step["dtype"])
            values = torch.where(missing, value, _float64(col, step))
            values = self._round(values, step["dtype"])
            return _Column(values, torch.ones_like(col.present), "float")
        values = torch.where(missing, int_bits(int(step["value"])), col.values)
        return _Column(values, torch.ones_like(col.present), "int")

    def _missing_flag(self, step, col):
        return _Column(col.missing(), torch.ones_like(col.present), "bool")

    def _const_false(self, step, col):
        return _Column(torch.zeros_like(col.present), torch.ones_like(col.present), "bool")

    def _clip(self, step, col):
        lo, hi = step["min"], step["max"]
        if step["dtype"].startswith("float"):
            values = self._round(_float64(col, step), step["dtype"])
            lo = None if lo is None else float_width(lo, step["dtype"])
            hi = None if hi is None else float_width(hi, step["dtype"])
            if lo is not None:
                values = torch.where(values < lo, lo, values)
            if hi is not None:
                values = torch.where(values > hi, hi, values)
            return _Column(values, col.present, "float")
        values = col.values
        # uint64 bits compare as unsigned with the sign bit flipped (bounds likewise)
        flip = (1 << 63) if step.get("unsigned") else 0
        order = torch.bitwise_xor(values, -(1 << 63)) if flip else values
        if lo is not None and np.isfinite(lo):
            values = torch.where(order < int(lo) - flip, int_bits(int(lo)), values)
        if hi is not None and np.isfinite(hi):
            values = torch.where(order > int(hi) - flip, int_bits(int(hi)), values)
        return _Column(values, col.present, "int")

    def _log1p(self, step, col):
        values = self._round(torch.log1p(_float64(col, step)), step["dtype"])
        return _Column(values, col.present, "float")

    def _standardize(self, step, col):
        values = _float64(col, step) - step["shift"]
        if step["scale"] > 0:
            values = values / step["scale"]
        return _Column(self._round(values, step["dtype"]), col.present, "float")

    def _bucketize(self, step, col):
        bounds = torch.tensor(step["boundaries"], dtype=torch.float64)
        values = _float64(col, step)
        ids = torch.searchsorted(bounds, values.contiguous(), right=True)
        return _Column(ids, ~col.missing(), "int")

    def _hash_bucket(self, step, col):
        n = step["num_buckets"]
        (h,) = col.hashes()
        ids = torch.where(col.missing(), n, torch.remainder(h, n))
        return _Column(ids, torch.ones_like(col.present), "int")

    def _hashed_cross(self, step, *cols):
        n = step["num_buckets"]
        first_missing = cols[0].missing()
        h = torch.where(first_missing, murmur.MISSING_PART, cols[0].hashes()[0])
        all_missing = first_missing
        for col in cols[1:]:
            missing = col.missing()
            folded = murmur.hash_combine(_K, h, col.hashes()[0])
            m = torch.full_like(h, murmur.MISSING_PART)
            skipped = murmur.hash_combine(_K, murmur.hash_combine(_K, h, m), m)
            h = torch.where(missing, skipped, folded)
            all_missing = all_missing & missing
        h = torch.where(first_missing, murmur.hash_combine(_K, h, torch.full_like(h, murmur.MISSING_PART)), h)
        ids = torch.where(all_missing, n, torch.remainder(h, n))
        return _Column(ids, torch.ones_like(all_missing), "int")

    def _list_slice(self, step, col):
        """Python's ``row[start:end]`` per row; with ``length``, every row padded to it."""
        o = col.offsets
        n = o[1:] - o[:-1]
        start, end = step["start"], step["end"]
        s = torch.minimum(torch.clamp(n + start if start < 0 else torch.full_like(n, start), min=0), n)
        e = n if end is None else torch.minimum(torch.clamp(n + end if end < 0 else torch.full_like(n, end),
                                                            min=0), n)
        e = torch.maximum(e, s)
        if step["length"] is not None:
            length = step["length"]
            k = torch.arange(length, dtype=torch.int64)
            idx = ((o[:-1] + s).unsqueeze(1) + k).reshape(-1)
            valid = (k < (e - s).unsqueeze(1)).reshape(-1)
            values = torch.cat([col.values, col.values.new_zeros(1)])  # never empty
            present = torch.cat([col.present, col.present.new_ones(1)])
            pad = step["pad_value"] if col.kind == "float" else int_bits(int(step["pad_value"]))
            values = torch.where(valid, _K.gather(values, idx), pad)
            present = torch.where(valid, _K.gather(present, idx), True)
            rows = torch.arange(n.shape[0] + 1, dtype=torch.int64) * length
            return _Column(values, present, col.kind, offsets=rows)
        p = torch.arange(col.present.shape[0], dtype=torch.int64)
        row = torch.clamp(torch.searchsorted(o[1:].contiguous(), p, right=True), max=n.shape[0] - 1)
        within = p - _take(o, row)
        keep = torch.nonzero((within >= _take(s, row)) & (within < _take(e, row))).squeeze(1)
        offsets = torch.cat([o.new_zeros(1), torch.cumsum(e - s, 0)])
        present = _take(col.present, keep)
        if col.kind == "string":
            return _Column(col.values, present, "string", _take(col.starts, keep), _take(col.lengths, keep),
                           offsets)
        return _Column(_take(col.values, keep), present, col.kind, offsets=offsets)

    def _categorify(self, step, col):
        t = {name: getattr(self, f"t{step['out']}_{name}")
             for name in ("keys", "ids", "starts", "lengths", "valid", "bytes")}
        if col.kind == "string":
            h0, h1 = col.hashes((0, KEY_SEED))
            key = torch.bitwise_or(torch.bitwise_left_shift(h0, 32), h1)
        elif col.kind == "float":
            key = _bits(col.values)
        else:
            key = col.values
        pos = torch.clamp(torch.searchsorted(t["keys"], key.contiguous()), max=t["keys"].shape[0] - 1)
        found = (_take(t["keys"], pos) == key) & _take(t["valid"], pos)
        if col.kind == "string":
            found = found & (_take(t["lengths"], pos) == col.lengths) & self._same_bytes(col, t, pos)
        return self._finish_ids(step, col, found, _take(t["ids"], pos))

    @staticmethod
    def _same_bytes(col: _Column, t: dict[str, Any], pos: Any) -> Any:
        """Per string: every byte equals the candidate vocabulary entry's byte there.
        Each byte belongs to the last string starting at or before it, when inside it
        (strings are in order and do not overlap; a list slice leaves bytes of none)."""
        n_bytes = col.values.shape[0] - 4
        p = torch.arange(n_bytes, dtype=torch.int64)
        # a sentinel string after every byte: the tables are never empty
        starts = torch.cat([col.starts, col.starts.new_full((1,), n_bytes)])
        lengths = torch.cat([col.lengths, col.lengths.new_zeros(1)])
        row = torch.clamp(torch.searchsorted(starts.contiguous(), p, right=True) - 1, min=0)
        within = p - _take(starts, row)
        inside = (within >= 0) & (within < _take(lengths, row))
        cand = _take(torch.cat([pos, pos.new_zeros(1)]), row)
        vocab_at = _K.gather(t["bytes"], _take(t["starts"], cand) + within)
        differs = inside & ((vocab_at != col.values[:n_bytes]) | (within >= _take(t["lengths"], cand)))
        bad = torch.zeros_like(lengths).index_add(0, row, differs.to(torch.int64))
        return bad[:-1] == 0


def _dense(values: Any, offsets: Any, length: int) -> tuple[Any, Any]:
    """Ragged rows as ``(dense [B, length], mask)``: cut or zero-padded, as the loader does."""
    n = offsets[1:] - offsets[:-1]
    k = torch.arange(length, dtype=torch.int64)
    idx = offsets[:-1].unsqueeze(1) + k
    mask = k < n.unsqueeze(1)
    padded = torch.cat([values, values.new_zeros(1)])  # never empty
    dense = torch.where(mask, _K.gather(padded, idx.reshape(-1)).reshape(idx.shape), 0)
    return _as(dense, values.dtype), mask


def export(module: RawFeatures, example: dict[str, torch.Tensor], model: nn.Module | None = None) -> Any:
    """``torch.export`` of ``module`` (followed by ``model``, when given) with a dynamic
    batch: one dimension name for the rows, one per string column's bytes, one per
    list column's elements."""
    from torch.export import Dim
    from torch.export import export as torch_export

    batch = Dim("batch", min=1)
    shapes: dict[str, Any] = {}
    for spec in module.plan.inputs:
        rows = batch
        if spec.is_list:
            rows = Dim(f"{spec.name}_values", min=0)
            shapes[f"{spec.name}__offsets"] = {0: batch + 1}
        shapes[f"{spec.name}__mask"] = {0: rows}
        if spec.kind == "string":
            shapes[spec.name] = {0: Dim(f"{spec.name}_bytes", min=0)}
            shapes[f"{spec.name}__value_offsets" if spec.is_list else f"{spec.name}__offsets"] = {0: rows + 1}
        else:
            shapes[spec.name] = {0: rows}
    target = module if model is None else _Bundle(module, model)
    # size-oblivious: a batch of one row (or a string column of empty strings, no
    # bytes) must not be specialized away when the example batch is larger
    from torch.fx.experimental import _config

    with _config.patch(backed_size_oblivious=True):
        return torch_export(target.eval(), (example,), dynamic_shapes=(shapes,))


class _Bundle(nn.Module):
    """Raw features, then the model."""

    def __init__(self, features: RawFeatures, model: nn.Module) -> None:
        super().__init__()
        self.features, self.model = features, model

    def forward(self, inputs: dict[str, torch.Tensor]) -> Any:
        return self.model(self.features(inputs))

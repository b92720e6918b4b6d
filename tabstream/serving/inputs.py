"""Raw rows as the artifact's inputs (numpy arrays), for tests, benchmarks and clients.

A client may build these arrays any way it likes; this module is only the one
way tabstream writes them. For each raw column ``NAME`` of the plan:

* numbers: ``NAME`` float64 or int64 ``[B]`` (NaN allowed) and ``NAME__mask`` bool ``[B]``
  (True where present);
* strings: ``NAME`` their UTF-8 bytes concatenated, ``NAME__offsets`` int64 ``[B+1]``
  (torch), or ``NAME`` an object array of ``bytes`` (Keras, ``tf.string``), and
  ``NAME__mask``;
* lists: their elements as above, ``[N]`` (``NAME__mask`` ``[N]``: True where the
  element is present), and ``NAME__offsets`` int64 ``[B+1]``, row ``i`` being elements
  ``offsets[i]:offsets[i+1]`` (a null list is sent as an empty one); a list of strings
  in torch has its bytes in ``NAME`` and the elements' byte offsets in
  ``NAME__value_offsets`` int64 ``[N+1]``.

>>> import pandas as pd
>>> from tabstream.serving.plan import InputSpec
>>> arrays = raw_arrays(pd.DataFrame({"c": ["ab", None, "é"]}), [InputSpec("c", "string", "string")], "torch")
>>> arrays["c"].tolist(), arrays["c__offsets"].tolist(), arrays["c__mask"].tolist()
([97, 98, 195, 169], [0, 2, 2, 4], [True, False, True])
>>> arrays = raw_arrays(pd.DataFrame({"l": [["ab", None], None, ["c"]]}),
...                     [InputSpec("l", "string", "string", is_list=True)], "torch")
>>> [arrays[k].tolist() for k in ("l", "l__value_offsets", "l__offsets", "l__mask")]
[[97, 98, 99], [0, 2, 2, 3], [0, 2, 2, 3], [True, False, True]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabstream.core.errors import SchemaError
from tabstream.serving.plan import InputSpec

__all__ = ["raw_arrays"]


def raw_arrays(data: Any, inputs: Sequence[InputSpec], framework: str) -> dict[str, np.ndarray]:
    """The artifact's input arrays for ``data`` (a pandas DataFrame or an Arrow table)."""
    table = data if isinstance(data, pa.Table) else pa.Table.from_pandas(data, preserve_index=False)
    missing = [i.name for i in inputs if i.name not in table.column_names]
    if missing:
        raise SchemaError(f"serving: the raw rows lack columns {missing} that the artifact takes; "
                          f"they have {table.column_names}")
    out: dict[str, np.ndarray] = {}
    for spec in inputs:
        col = table.column(spec.name).combine_chunks()
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        is_list = pa.types.is_list(col.type) or pa.types.is_large_list(col.type) \
            or pa.types.is_fixed_size_list(col.type)
        if is_list != spec.is_list:
            raise SchemaError(f"serving: raw column {spec.name!r} is {'a list' if is_list else 'not a list'} "
                              f"({col.type}), but the artifact takes {'lists' if spec.is_list else 'scalars'} "
                              f"of {spec.dtype} there")
        if is_list:
            lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False)
            out[f"{spec.name}__offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            col = pc.list_flatten(col)  # a null list gives no elements
            if pa.types.is_dictionary(col.type):
                col = col.cast(col.type.value_type)
        _elements(out, spec, col, framework, "__value_offsets" if is_list else "__offsets")
    # writable copies where Arrow lent its buffers: torch.from_numpy warns on read-only arrays
    return {k: v if v.flags.writeable else v.copy() for k, v in out.items()}


def _elements(out: dict[str, np.ndarray], spec: InputSpec, col: pa.Array, framework: str,
              offsets_key: str) -> None:
    """``col``'s values (a column, or a list column's elements) and their mask."""
    present = col.is_valid().to_numpy(zero_copy_only=False)
    out[f"{spec.name}__mask"] = np.asarray(present, dtype=bool)
    if spec.kind == "string":
        strings = col.cast(pa.large_string())
        if framework == "torch":
            strings = pc.fill_null(strings, "")
            offsets = np.frombuffer(strings.buffers()[1], np.int64)[strings.offset:strings.offset + len(strings) + 1]
            data_buf = strings.buffers()[2]
            raw = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
            out[spec.name] = raw[offsets[0]:offsets[-1]].copy()
            out[f"{spec.name}{offsets_key}"] = (offsets - offsets[0]).astype(np.int64)
        else:
            values = strings.to_pylist()
            out[spec.name] = np.array([b"" if v is None else v.encode() for v in values], dtype=object)
    elif spec.kind == "float":
        out[spec.name] = np.asarray(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False),
                                    dtype=np.float64)
    elif pa.types.is_uint64(col.type):  # the bits as int64: 2**63 and up too (hashes read the bytes)
        out[spec.name] = np.asarray(col.fill_null(0).to_numpy(zero_copy_only=False), np.uint64).view(np.int64)
    else:
        out[spec.name] = np.asarray(col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                                    dtype=np.int64)

"""Raw rows as the artifact's inputs (numpy arrays), for tests, benchmarks and clients.

A client may build these arrays any way it likes; this module is only the one
way tabstream writes them. For each raw column ``NAME`` of the plan:

* numbers: ``NAME`` float64 or int64 ``[B]`` (NaN allowed) and ``NAME__mask`` bool ``[B]``
  (True where present);
* strings: ``NAME`` their UTF-8 bytes concatenated, ``NAME__offsets`` int64 ``[B+1]``
  (torch), or ``NAME`` an object array of ``bytes`` (Keras, ``tf.string``), and
  ``NAME__mask``.

>>> import pandas as pd
>>> from tabstream.serving.plan import InputSpec
>>> arrays = raw_arrays(pd.DataFrame({"c": ["ab", None, "é"]}), [InputSpec("c", "string", "string")], "torch")
>>> arrays["c"].tolist(), arrays["c__offsets"].tolist(), arrays["c__mask"].tolist()
([97, 98, 195, 169], [0, 2, 2, 4], [True, False, True])
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
                out[f"{spec.name}__offsets"] = (offsets - offsets[0]).astype(np.int64)
            else:
                values = strings.to_pylist()
                out[spec.name] = np.array([b"" if v is None else v.encode() for v in values], dtype=object)
        elif spec.kind == "float":
            out[spec.name] = np.asarray(col.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False),
                                        dtype=np.float64)
        else:
            out[spec.name] = np.asarray(col.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False),
                                        dtype=np.int64)
    # writable copies where Arrow lent its buffers: torch.from_numpy warns on read-only arrays
    return {k: v if v.flags.writeable else v.copy() for k, v in out.items()}

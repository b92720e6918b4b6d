"""Backends asked for wrongly: a GPU that is not there, a backend that does not
exist, kernels of a backend whose libraries are missing, bad kernel arguments."""

from __future__ import annotations

from unittest import mock

import pandas as pd
import pyarrow as pa

import tabstream as ts
import tabstream.backends as backends
import tabstream.backends.cudf as cudf_backend
from tabstream.backends.arrow import ArrowBackend
from tabstream.core.errors import BackendUnavailableError

FRAME = pd.DataFrame({"x": [1.0, 2.0], "c": ["a", "b"]})
NO_GPU = "no CUDA GPU is visible (0 devices)"


def _no_gpu():
    return mock.patch.object(backends, "gpu_status", lambda: NO_GPU)


def _dataset_on_gpu_without_one(tmp):
    with _no_gpu():
        ts.Dataset(FRAME, cpu=False)


def _dataset_default_without_gpu(tmp):
    with _no_gpu():
        assert ts.Dataset(FRAME).backend_name == "arrow"


def _cudf_kernel_without_cudf(tmp):
    with mock.patch.object(cudf_backend, "gpu_status", lambda: "cudf/cupy do not import (No module named 'cudf')"):
        cudf_backend.CudfBackend().clip(pa.array([1.0]), 0.0, None)


def _old_import_paths(tmp):
    from tabstream.core.errors import DataError
    from tabstream.core.operators import Operator
    from tabstream.core.schema import Schema

    assert Schema.__module__ == "tabstream.core.schema" and Operator.__module__ == "tabstream.core.operators"
    assert DataError.__module__ == "tabstream.core.errors"


CASES = [
    ("Dataset(cpu=False) without a GPU", _dataset_on_gpu_without_one, BackendUnavailableError,
     r"Dataset\(cpu=False\) asks for the GPU \(cudf\) backend, which cannot run here: no CUDA GPU is "
     r"visible \(0 devices\)"),
    ("Dataset(cpu=None) without a GPU falls back to arrow", _dataset_default_without_gpu, None, None),
    ("Dataset(cpu='gpu')", lambda tmp: ts.Dataset(FRAME, cpu="gpu"), TypeError,
     "cpu must be True, False or None, got str 'gpu'"),
    ("unknown backend", lambda tmp: backends.get("polars"), ValueError,
     r"unknown backend 'polars'; registered backends: \['arrow', 'cudf'\]"),
    ("backend named by a number", lambda tmp: backends.use(1).__enter__(), TypeError,
     "a backend is named by a string, one of \\['arrow', 'cudf'\\]; got 1"),
    ("cudf kernel without cudf", _cudf_kernel_without_cudf, BackendUnavailableError,
     r"the cudf backend cannot run here: cudf/cupy do not import \(No module named 'cudf'\)"),
    ("group-by with an unknown aggregation",
     lambda tmp: ArrowBackend().groupby_aggregate(pa.table({"k": [1], "v": [2]}), ["k"], [("v", "median", "m")]),
     ValueError, r"unknown aggregation 'median'; expected one of \['sum', 'count', 'size'"),
    ("outer join", lambda tmp: ArrowBackend().join(pa.table({"k": [1]}), pa.table({"k": [1]}), ["k"], how="outer"),
     ValueError, "join: how must be 'left' or 'inner', got 'outer'"),
    ("old import paths of moved modules", _old_import_paths, None, None),
]

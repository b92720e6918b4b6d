"""Backends: the kernels ops call, one module per backend, chosen once per Dataset.

>>> import tabstream.backends as backends
>>> backends.registered()          # every backend the package ships
['arrow', 'cudf']
>>> backends.available()           # those usable here (cudf needs cudf + a GPU)
['arrow']

The executor runs each partition's ops inside ``with backends.use(name):``; an op
asks :func:`current` for the backend and calls its kernels. Ops never branch on the
backend and never import cudf, cupy or pandas internals themselves.

Where the tasks run is chosen per Dataset too (:func:`scheduler_for`): a client the
user gave; else, on the cudf backend with several GPUs, dask-cuda's
``LocalCUDACluster`` (one worker per GPU); else dask's threads in this process.

>>> scheduler_for("cudf", gpus=4, client_given=False)
'local-cuda-cluster'
>>> scheduler_for("cudf", gpus=1, client_given=False)
'threads'
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from tabstream.backends.base import Backend
from tabstream.backends.cudf import gpu_count, gpu_status
from tabstream.core.errors import BackendUnavailableError

__all__ = ["Backend", "BackendUnavailableError", "DEFAULT_BACKEND", "available", "choose", "current",
           "execution_client", "frame_backend", "frame_kinds", "frame_to_arrow", "get", "gpu_count", "gpu_status",
           "registered", "scheduler_for", "use"]

# name -> (module, class); modules are imported on first use
_REGISTRY: dict[str, tuple[str, str]] = {
    "arrow": ("tabstream.backends.arrow", "ArrowBackend"),
    "cudf": ("tabstream.backends.cudf", "CudfBackend"),
}
_INSTANCES: dict[str, Backend] = {}
#: the backend that always runs (the host's): what in-memory data and defaults use
DEFAULT_BACKEND = "arrow"
_CURRENT: ContextVar[str] = ContextVar("tabstream_backend", default="arrow")


def registered() -> list[str]:
    """Every backend the package ships, usable here or not."""
    return list(_REGISTRY)


def _unavailable_reason(name: str) -> str | None:
    return gpu_status() if name == "cudf" else None


def available() -> list[str]:
    """The registered backends that can run on this machine."""
    return [name for name in _REGISTRY if _unavailable_reason(name) is None]


def get(name: str) -> Backend:
    """The backend called ``name``; an error saying what to install when it cannot
    run here."""
    if not isinstance(name, str):
        raise TypeError(f"a backend is named by a string, one of {registered()}; got {name!r}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown backend {name!r}; registered backends: {registered()}")
    reason = _unavailable_reason(name)
    if reason is not None:
        from tabstream.backends.cudf import INSTALL_HINT

        raise BackendUnavailableError(f"the {name} backend cannot run here: {reason}",
                                      hint=INSTALL_HINT)
    if name not in _INSTANCES:
        _INSTANCES[name] = _backend_class(name)()
    return _INSTANCES[name]


def _backend_class(name: str) -> type[Backend]:
    module, cls = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)


def frame_backend(frame: Any) -> str:
    """The backend whose frame type ``frame`` is (a partition, or the ``_meta``, of a
    dask DataFrame given as input): ``"arrow"`` for pandas and anything no other
    backend claims. Checked without importing a backend's library."""
    for name in _REGISTRY:
        if name != "arrow" and _backend_class(name).owns_frame(frame):
            return name
    return "arrow"


def frame_kinds() -> tuple[str, ...]:
    """The kinds of in-memory frame a user may name (NVTabular's ``kind_ext``):
    pandas, Arrow, each other backend's frame (by the backend's name) and dask."""
    return ("pandas", "arrow", *(n for n in _REGISTRY if n != DEFAULT_BACKEND), "dask")


def frame_to_arrow(frame: Any) -> Any:
    """A frame of any backend (pandas, cudf, ...) as an Arrow table, without its index."""
    return get(frame_backend(frame)).frame_to_arrow(frame)


def choose(cpu: bool | None) -> str:
    """The backend a Dataset uses: ``cpu=True`` the arrow (CPU) backend; ``cpu=None``
    cudf when it imports and a GPU is present, else arrow; ``cpu=False`` cudf, and a
    clear error naming what is missing when it cannot run here."""
    if cpu is not None and not isinstance(cpu, bool):
        raise TypeError(f"cpu must be True, False or None, got {type(cpu).__name__} {cpu!r}")
    if cpu:
        return "arrow"
    reason = gpu_status()
    if reason is None:
        return "cudf"
    if cpu is None:
        return "arrow"
    from tabstream.backends.cudf import INSTALL_HINT

    raise BackendUnavailableError(
        f"Dataset(cpu=False) asks for the GPU (cudf) backend, which cannot run here: {reason}",
        hint=INSTALL_HINT)


def current() -> Backend:
    """The backend of the partition being processed (arrow outside any :func:`use`)."""
    return get(_CURRENT.get())


@contextlib.contextmanager
def use(name: str) -> Iterator[Backend]:
    """Run the block's kernels on backend ``name`` (this thread or task only)."""
    backend = get(name)
    token = _CURRENT.set(name)
    try:
        yield backend
    finally:
        _CURRENT.reset(token)


#: where a Dataset's tasks run (see :func:`scheduler_for`)
SCHEDULERS = ("client", "local-cuda-cluster", "threads")


def scheduler_for(backend: str, gpus: int, client_given: bool) -> str:
    """Where fit, transform and export of a Dataset on ``backend`` run, with ``gpus``
    CUDA GPUs visible and a dask client given or not:

    * ``"client"``: a client was given; it is used, whatever the backend;
    * ``"local-cuda-cluster"``: the cudf backend, more than one GPU and no client:
      dask-cuda's ``LocalCUDACluster``, one worker per GPU;
    * ``"threads"``: otherwise, dask's threaded scheduler in this process (on the
      cudf backend: one GPU, shared by the threads).

    A pure function of its arguments (no GPU is looked for here)."""
    if not isinstance(backend, str):
        raise TypeError(f"backend must be a backend name, one of {registered()}; got {backend!r}")
    if backend not in _REGISTRY:
        raise ValueError(f"unknown backend {backend!r}; registered backends: {registered()}")
    if isinstance(gpus, bool) or not isinstance(gpus, int):
        raise TypeError(f"gpus must be an int (the number of visible GPUs), got {type(gpus).__name__} {gpus!r}")
    if gpus < 0:
        raise ValueError(f"gpus must be 0 or more, got {gpus}")
    if not isinstance(client_given, bool):
        raise TypeError(f"client_given must be True or False, got {type(client_given).__name__} {client_given!r}")
    if client_given:
        return "client"
    if backend == "cudf" and gpus > 1:
        return "local-cuda-cluster"
    return "threads"


def execution_client(backend: str, client: Any = None) -> Any:
    """The dask client to run a Dataset's tasks on (None: threads), as
    :func:`scheduler_for` decides: ``client`` when given; the process's shared
    ``LocalCUDACluster`` client on the cudf backend with several GPUs (started on
    first use); else None. GPUs are counted only on the cudf backend."""
    gpus = gpu_count() if backend == "cudf" and client is None else 0
    where = scheduler_for(backend, gpus, client is not None)
    if where == "local-cuda-cluster":
        from tabstream.backends.cudf import local_cuda_client

        return local_cuda_client()
    return client

import pytest

import tabstream.backends as backends

# Every registered backend runs the suite; GPU ones carry the ``gpu`` marker so that
# ``pytest -m "not gpu"`` (make test) deselects them and ``make test-gpu`` runs them.
BACKEND_PARAMS = [pytest.param(name, marks=[pytest.mark.gpu] if name == "cudf" else [])
                  for name in backends.registered()]


@pytest.fixture(params=BACKEND_PARAMS)
def backend_name(request):
    name = request.param
    if name not in backends.available():
        pytest.skip(f"backend {name!r} cannot run here: {backends.gpu_status()}")
    return name


@pytest.fixture
def backend(backend_name):
    return backends.get(backend_name)

# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip prints one warning per missing local index folder; keep the output readable
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test test-slow test-gpu lint bench docs clean

$(PY):
	$(PYTHON) -m venv $(VENV)

# Stamps re-run the install when pyproject.toml changes.
$(VENV)/.demo-installed: pyproject.toml | $(PY)
	$(PIP) -e ".[torch]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import tabstream, torch"
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(PY)
	$(PIP) -e ".[dev,torch,tensorflow]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import tabstream, torch, tensorflow, pytest, polars"
	touch $@ $(VENV)/.demo-installed

$(VENV)/.docs-installed: pyproject.toml | $(PY)
	$(PIP) -e ".[docs]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import mkdocs, mkdocstrings"
	touch $@

# The documentation site in site/; warnings are errors (mkdocs.yml: strict).
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

demo: $(VENV)/.demo-installed
	$(VENV)/bin/tabstream demo

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check tabstream tests benchmarks examples tools
	$(VENV)/bin/lint-imports

# The tests not marked slow: about 20 minutes on 2 cores.
test: $(VENV)/.dev-installed lint
	$(PY) -m pytest -m "not gpu and not slow" -q

# The tests marked slow (several training processes, fresh interpreters, the examples
# and benchmarks run end to end): about 20 more minutes on 2 cores. CI runs both.
test-slow: $(VENV)/.dev-installed
	$(PY) -m pytest -m "slow and not gpu" -q

# On a machine with an NVIDIA GPU: the gpu extra, then every test marked gpu, which
# includes the backend contract suite (tests/backends) on the cudf backend. Refuses to
# "pass" by skipping: it stops first when the cudf backend cannot run here. It prints
# the GPUs seen and where tasks run (one GPU: threads; several: LocalCUDACluster);
# -rs lists the tests skipped and why (several GPUs, TensorFlow with GPU support).
# CUDA=13 installs the gpu-cu13 extra (cudf for CUDA 13) instead of gpu (CUDA 12).
CUDA ?= 12
GPU_EXTRA := $(if $(filter 13,$(CUDA)),gpu-cu13,gpu)
test-gpu: $(VENV)/.dev-installed
	$(PIP) -e ".[dev,torch,$(GPU_EXTRA)]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) -c "import sys, tabstream.backends as b; r = b.gpu_status(); print('cudf backend:', r or 'available'); sys.exit(1 if r else 0)"
	$(PY) -c "import tabstream.backends as b; n = b.gpu_count(); print('GPUs:', n, '-> tasks run on', b.scheduler_for('cudf', n, False))"
	$(PY) -m pytest -m gpu -q -rs
	$(PY) -m pytest tests/backends -q -rs

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/etl.py

clean:
	rm -rf $(VENV) demo_out bench_data .pytest_cache site

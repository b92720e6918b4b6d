# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# pip prints one warning per missing local index folder; keep the output readable
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: demo test lint bench clean

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

demo: $(VENV)/.demo-installed
	$(VENV)/bin/tabstream demo

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check tabstream tests benchmarks examples
	$(VENV)/bin/lint-imports

test: $(VENV)/.dev-installed lint
	$(PY) -m pytest -m "not gpu" -q

bench: $(VENV)/.dev-installed
	$(PY) benchmarks/etl.py

clean:
	rm -rf $(VENV) demo_out bench_data .pytest_cache

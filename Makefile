# DualPace — two commands on a fresh machine: `make serve` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dualpace-installed
CEXT_SRC := $(wildcard cext/*.c cext/*.h cext/build.py)
CEXT_STAMP := $(VENV)/.dualpace-cext

.PHONY: install test lint serve clean build-ext demo-model

install: $(STAMP) $(CEXT_STAMP)

$(STAMP): pyproject.toml bin/install-torch
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	bin/install-torch $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The C kernels: compiled with the system gcc through cffi into dualpace/kernels/.
$(CEXT_STAMP): $(STAMP) $(CEXT_SRC)
	$(PY) cext/build.py
	touch $@

build-ext: $(CEXT_STAMP)

lint: install
	$(VENV)/bin/ruff check .

test: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

serve: install
	$(VENV)/bin/dualpace serve $(SERVE_ARGS)

clean:
	rm -rf build *.egg-info dualpace/kernels/_dualpace_cext* $(CEXT_STAMP)

# DualPace — two commands on a fresh machine: `make serve` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.dualpace-installed
CEXT_SRC := $(wildcard cext/*.c cext/*.h cext/build.py)
CEXT_STAMP := $(VENV)/.dualpace-cext

.PHONY: install test lint serve clean build-ext install-service bench-peers install-browser

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

# Debian's chromium for the dashboard's browser test; skipped (with a note) where it can't be.
install-browser:
	bin/install-browser

test: install install-browser
	$(VENV)/bin/ruff check .
	$(VENV)/bin/pytest -q $(PYTEST_ARGS)

serve: install
	$(VENV)/bin/dualpace serve $(SERVE_ARGS)

# DualPace beside llama.cpp's llama-server and the transformers floor (bench/peers). Builds
# llama-server from the llama-cpp-python sdist first (~15 minutes, once); never run by CI.
bench-peers: install
	$(PY) -m pip install --quiet -e '.[dev,peers]'
	test -x bench/peers/.build/llama-server || bash bench/peers/build_llama_server.sh
	$(PY) bench/peers/compare_peers.py $(PEERS_ARGS)

clean:
	rm -rf build *.egg-info dualpace/kernels/_dualpace_cext* $(CEXT_STAMP)

# Installs the service: code under /opt/dualpace, a dedicated user, the unit and the env file
# (an existing /etc/dualpace/dualpace.env is kept). Run as root.
PREFIX ?= /opt/dualpace
install-service:
	id -u dualpace >/dev/null 2>&1 || useradd --system --home-dir $(PREFIX) --shell /usr/sbin/nologin dualpace
	mkdir -p $(PREFIX) /etc/dualpace
	cp -a pyproject.toml Makefile README.md dualpace cext bin systemd $(PREFIX)/
	$(MAKE) -C $(PREFIX) install
	chown -R dualpace:dualpace $(PREFIX)
	install -m 0644 systemd/dualpace.service /etc/systemd/system/dualpace.service
	test -f /etc/dualpace/dualpace.env || install -m 0640 -g dualpace systemd/dualpace.env /etc/dualpace/dualpace.env
	systemctl daemon-reload
	@echo "installed: systemctl enable --now dualpace"

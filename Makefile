# Gristmill: the obvious targets. `make dev` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)
JARS    = docker/kafka/libs/.fetched

.PHONY: install dev test test-unit test-e2e lint fmt bench bench-peers bench-sweep bench-profile chaos clean

install: $(STAMP) $(JARS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[embed,dev]'
	rm -f $(VENV)/.installed-* && touch $@

# Apache Kafka (broker jar and runtime dependencies) from Maven Central.
$(JARS): docker/kafka/pom.xml
	cd docker/kafka && mvn -q -B dependency:copy-dependencies -DoutputDirectory=libs -DincludeScope=runtime
	touch $@

dev: install
	$(VENV)/bin/gristmill dev

test: install
	$(PY) -m pytest -q

test-unit: install
	$(PY) -m pytest -q tests/unit

test-e2e: install
	$(PY) -m pytest -q tests/e2e

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

fmt: install
	$(VENV)/bin/ruff check --fix .

bench: install
	$(VENV)/bin/python -m bench.loadtest --rate 200 --count 1000 --runs 3

# The peer comparison (docs/bench/README.md): Ray Serve goes into its own .venv-peers.
bench-peers: install
	$(PY) -m bench.sweep --setup-peers

bench-sweep: bench-peers
	$(PY) -m bench.sweep --crosscheck 100 --out docs/bench

bench-profile: install
	$(PY) -m bench.profile --rate 100 --duration 30 --out docs/bench

chaos: install
	$(VENV)/bin/gristmill chaos --rounds 20

clean:
	rm -rf .gristmill .pytest_cache .mypy_cache .ruff_cache

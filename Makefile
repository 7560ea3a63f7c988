# Gristmill: the obvious targets. `make dev` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed-$(shell cat pyproject.toml client/pyproject.toml | sha1sum | cut -c1-12)
JARS    = docker/kafka/libs/.fetched

.PHONY: install test-tools dev test test-unit test-integration test-e2e fuzz lint fmt bench bench-peers bench-sweep bench-profile bench-policy chaos clean deploy-check

install: $(STAMP) $(JARS)

$(STAMP): pyproject.toml client/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e client -e '.[embed,dev]'
	rm -f $(VENV)/.installed-* && touch $@

# Apache Kafka (broker jar and runtime dependencies) from Maven Central.
$(JARS): docker/kafka/pom.xml
	cd docker/kafka && mvn -q -B dependency:copy-dependencies -DoutputDirectory=libs -DincludeScope=runtime
	touch $@

# make dev DEV_ARGS='--port 0' (a free port) or '--port 8001 --state-dir .gristmill-2'
dev: install
	$(VENV)/bin/gristmill dev $(DEV_ARGS)

# Beyond Python, the tests need Prometheus and promtool (the metrics e2e test, the alert
# rules' tests) and Chromium (the dashboard e2e test): Debian's packages, installed here
# as root (CI, a fresh machine); otherwise one line says what is missing and how to get
# it. SKIP_TOOLS=1 runs the suite without them (those tests then skip).
TEST_TOOLS = prometheus promtool chromium
test-tools:
	@missing=$$(for t in $(TEST_TOOLS); do command -v $$t >/dev/null || printf '%s ' $$t; done); \
	[ -z "$$missing" ] && exit 0; \
	pkgs=$$(for t in $$missing; do case $$t in promtool) echo prometheus;; *) echo $$t;; esac; done | sort -u | xargs); \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing $$pkgs (Debian packages) for the tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$pkgs >/dev/null; \
	elif [ -n "$(SKIP_TOOLS)" ]; then \
		echo "missing $${missing% }: the tests that need them will skip (SKIP_TOOLS=1)"; \
	else \
		echo "make test: missing $${missing% }; install them with: sudo apt-get install $$pkgs (or SKIP_TOOLS=1 make test to skip their tests)"; \
		exit 1; \
	fi

# Everything CI runs: the chart's tests (make deploy-check), then the Python suite (unit,
# integration, end to end).
test: install test-tools
	deploy/check.sh
	$(PY) -m pytest -q

test-unit: install
	$(PY) -m pytest -q tests/unit client/tests

test-integration: install
	$(PY) -m pytest -q tests/integration

test-e2e: install
	$(PY) -m pytest -q tests/e2e

# schemathesis against a live system's OpenAPI schema, many cases per operation (the
# test suite runs the same test with 25).
fuzz: install
	GRISTMILL_FUZZ_EXAMPLES=1000 $(PY) -m pytest -q tests/e2e/test_fuzz.py

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

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

# Policy under load (docs/bench/policy.md): tiers at 3x capacity, a noisy tenant, backfill.
bench-policy: install
	$(PY) -m bench.overload --shapes 20:2,100:10,500:50 --factor 3 --seconds 40
	$(PY) -m bench.fairness --burst 50000 --noisy-rate 500 --quiet-rate 20
	$(PY) -m bench.jobs --backfill 100000 --rate 100 --seconds 20

chaos: install
	$(VENV)/bin/gristmill chaos --rounds 20

# Helm chart (lint, render, kubeconform), compose file and Dockerfile: no cluster, no Docker.
deploy-check: install
	deploy/check.sh

clean:
	rm -rf .gristmill .pytest_cache .mypy_cache .ruff_cache

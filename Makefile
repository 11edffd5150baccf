# diskless — every target installs what it needs first (fresh Debian + Python 3.11).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install run test unit integration bench bench-spark tier lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

# kcat is one of the real clients the tests drive; it comes from Debian's packages.
.PHONY: .kcat
.kcat:
	@command -v kcat >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq kcat >/dev/null; }

# PySpark needs a Java runtime; Debian's JRE 17 where `java` is missing.
.PHONY: .java
.java:
	@command -v java >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

install: $(STAMP) .kcat .java

run: install
	$(PY) -m diskless dev --data-dir ./data

# Integration tests mostly wait on real servers starting, electing and timing out, so they run in
# TEST_WORKERS processes (pytest-xdist; each test still gets its own servers on run-time ports).
# The outer limit only guards CI against a hang no per-test timeout could catch.
TEST_WORKERS ?= 3
test: install
	timeout --kill-after=30 2700 $(PY) -m pytest -q -p no:cacheprovider --durations=30 -n $(TEST_WORKERS) --dist worksteal

unit: install
	$(PY) -m pytest -q tests/unit

integration: install
	$(PY) -m pytest -q tests/integration

# A 3-broker, 3-AZ cluster on the embedded S3 server against issue 10's targets (~4 minutes);
# BENCH_ARGS passes flags, e.g. make bench BENCH_ARGS="--partitions 1000" or "--quick".
bench: install
	$(PY) -m diskless bench $(BENCH_ARGS)

# Tier the local `make run` cluster's committed WAL ranges into segment objects (PySpark job, one
# shot); TIER_ARGS passes flags, e.g. make tier TIER_ARGS="--every 60" or "--master spark://host:7077".
tier: install
	$(PY) -m diskless tier --dev-dir ./data $(TIER_ARGS)

# The diskless Spark data source's read throughput beside a Kafka consumer on the same diskless
# topic (own cluster, ~2 minutes); SPARK_BENCH_ARGS e.g. "--records 1000000" or "--dev-dir ./data".
bench-spark: install
	$(PY) -m diskless.spark.bench $(SPARK_BENCH_ARGS)

lint: install
	$(VENV)/bin/ruff check diskless wal_manager tests bench
	$(VENV)/bin/ruff format --check diskless wal_manager tests bench

format: install
	$(VENV)/bin/ruff format diskless wal_manager tests bench
	$(VENV)/bin/ruff check --fix diskless wal_manager tests bench

clean:
	rm -rf $(VENV) data .pytest_cache .hypothesis

# txnwatch — `make test` and `make demo` set up everything they need (venv, PyPI packages, Maven jars, Debian
# packages) and are quick when it is already there.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
JARS   := .cache/jars
MVN    := mvn -q -B -s dev/jvm/settings.xml
PYTEST_ARGS ?=
# make test's pytest workers. Each has its own broker and Spark session; a test file stays on one worker, so its
# module fixtures (a broker of its own, a running job) are built once. 1 runs the files one after the other.
PYTEST_WORKERS ?= 2

.PHONY: help deps venv jars tools image lint typecheck test test-unit testbed-up testbed-down clean demo bench faults-long

help:
	@echo "make demo          a local broker, real traffic incl. a hanging transaction, the collector and the streaming job (DEMO_SECONDS=300)"
	@echo "make test          lint, type-check and run every test tier against a real local Kafka broker and Spark"
	@echo "make test-unit     the pure tier only (no JVM)"
	@echo "make compat        the compatibility matrix: the whole product on Kafka 3.5-4.4, KRaft and ZooKeeper (~40 min)"
	@echo "make test-s3a      only the s3a checkpoint test (part of make long): the job against a local S3 server (moto), with a restart"
	@echo "make image         build the container images (collector, stream) with buildah, no Docker engine needed"
	@echo "make bench         every benchmark (about an hour, BENCH=latency,peers for some); rewrites docs/BENCHMARKS.md's tables"
	@echo "make faults-long   the fault tests that keep the streaming job down for 3 and 10 minutes (~20 min)"
	@echo "make long          every test that waits for real minutes: those two, the s3a restart, a Spark standalone cluster (~30 min)"
	@echo "make soak          200 transactional ids x 20 transactions/s for SOAK_MINUTES (5); plots docs/soak.png"
	@echo "make testbed-up    start a local KRaft broker (python -m dev.kafka up --no-verification)"
	@echo "make testbed-down  stop it"

# Debian packages: a JDK (Kafka 4 brokers need Java 17+) and Maven (resolves the jars from Maven Central).
deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null; then \
		echo "installing openjdk-17-jdk-headless and maven from Debian"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jdk-headless maven; \
	fi
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "txnwatch needs Python >= 3.11"'

$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	@touch $@

venv: $(VENV)/.installed

$(JARS)/kafka/.resolved: dev/jvm/kafka/pom.xml dev/jvm/settings.xml | deps
	rm -rf $(JARS)/kafka
	$(MVN) -f dev/jvm/kafka/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS))/kafka
	@touch $@

$(JARS)/spark/.resolved: dev/jvm/spark/pom.xml dev/jvm/settings.xml | deps
	rm -rf $(JARS)/spark
	$(MVN) -f dev/jvm/spark/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS))/spark
	@touch $@

# Kafka Streams for the field-client tests (dev/field_clients.py compiles dev/jvm/streams/FieldStreams.java against it).
$(JARS)/streams/.resolved: dev/jvm/streams/pom.xml dev/jvm/settings.xml | deps
	rm -rf $(JARS)/streams
	$(MVN) -f dev/jvm/streams/pom.xml dependency:copy-dependencies -DoutputDirectory=$(abspath $(JARS))/streams
	@touch $@

jars: $(JARS)/kafka/.resolved $(JARS)/spark/.resolved $(JARS)/streams/.resolved

# promtool, prometheus, helm, kubeconform: built once from the Go module proxy into .cache/bin (dev/gotools.py).
tools: venv
	$(PY) -m dev.gotools ensure promtool prometheus helm kubeconform >/dev/null

# The container images, both targets of the Dockerfile (collector, stream), built with buildah on bases made from
# Debian's packages (dev/image.py: no Docker engine or registry needed); quick when their inputs did not change.
image:
	$(PYTHON) -m dev.image build

# ruff, then the rooms' arrows (import-linter's contracts in pyproject.toml: a wrong import fails here).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# mypy --strict (pyproject.toml) on every room and the console script that joins them.
typecheck: venv
	$(VENV)/bin/mypy detectors common admin streaming txnwatch_cli.py

# Every tier: unit, spark, broker, e2e. The broker is started by the session fixture (tests/conftest.py).
# Two cells of the compatibility matrix run here (3.9 ZooKeeper, 4.0 at transaction version 0); `make compat` runs all.
test: deps venv jars $(JARS)/kafka-3.9.2/.resolved $(JARS)/kafka-4.0.2/.resolved tools image lint typecheck
	$(VENV)/bin/pytest tests -m "not long and not compat" -n $(PYTEST_WORKERS) --dist loadfile --durations=40 $(PYTEST_ARGS)

# Any Apache Kafka release's broker and tools, from a POM dev/kafka_versions.py writes for it (Maven Central).
$(JARS)/kafka-%/.resolved: dev/kafka_versions.py dev/jvm/settings.xml | deps venv
	rm -f $@
	$(PY) -m dev.kafka_versions $*

# The compatibility matrix (tests/compat/test_matrix.py): per Kafka release, orphans, the collector, the job, inspect,
# proposals abort, the transaction log decoded and that release's find-hanging; results in
# benchmarks/results/compat.json (docs/compatibility.md). Every release's jars are resolved first. Then every other
# test marked `compat` (e.g. the TLS and mutual-TLS modes of tests/e2e/test_auth_modes.py).
.PHONY: compat
compat: deps venv jars
	$(PY) -m dev.kafka_versions
	$(VENV)/bin/pytest tests/compat --durations=0 $(PYTEST_ARGS)
	$(VENV)/bin/pytest tests -m compat --ignore=tests/compat --durations=0 $(PYTEST_ARGS)

# Only the job on an s3a checkpoint against moto's S3 server, with a restart (`make long` runs it too; make test runs
# only its check of the chart's jar list), for work on the s3a connector (dev/jvm/spark/pom.xml).
.PHONY: test-s3a
test-s3a: deps venv jars
	$(VENV)/bin/pytest tests/e2e/test_s3a_checkpoint.py $(PYTEST_ARGS)

# The fault tests that wait for real minutes (docs/reliability.md, Faults): the streaming job down for 10 minutes.
# `make test` runs the same test with 3 minutes down.
faults-long: deps venv jars
	$(VENV)/bin/pytest tests/e2e/test_faults_e2e.py -m long -s $(PYTEST_ARGS)

# Every test marked `long` (minutes of real waiting each), left out of make test to keep it under 45 minutes: the job
# down 3 and 10 minutes, its restart on an s3a checkpoint, the job on a Spark standalone cluster.
.PHONY: long
long: deps venv jars tools
	$(VENV)/bin/pytest tests -m long --durations=0 $(PYTEST_ARGS)

# The pure tier: no JVM, no jars, no broker (tests/unit/test_unit_tier.py checks nothing there reads .cache/).
test-unit: venv
	$(VENV)/bin/pytest tests/unit -m "not jars" $(PYTEST_ARGS)

testbed-up: venv jars
	$(PY) -m dev.kafka up --no-verification

testbed-down: venv
	$(PY) -m dev.kafka down

clean:
	-$(PY) -m dev.kafka down
	-$(PYTHON) -m dev.image release
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info

# The README's first command: broker, traffic (steady, late, really hanging), collector and streaming job, shown
# to a person. DEMO_SECONDS bounds it (default 300); Ctrl-C stops everything it started.
demo: deps venv jars
	$(PY) -m dev.demo --seconds $${DEMO_SECONDS:-300}

# Benchmarks are not tests: one after the other (they share the cores), raw figures to benchmarks/results/, then the
# tables of docs/BENCHMARKS.md rewritten from them. BENCH=name[,name] runs some (python -m benchmarks.make_bench -h).
bench: deps venv jars
	$(PY) -m benchmarks.make_bench $(if $(BENCH),--only $(BENCH))

# Five minutes of load (200 transactional ids, 20 transactions/s in total) and three real orphans on its own test
# bed, with the collector and the job; samples memory, state and lag (every 10 s; 30 s from 20 minutes on) into
# .cache/soak/soak.json and docs/soak.png, with each curve's level and drift (docs/reliability.md). Not part of
# `make test`: SOAK_MINUTES plus about 2 minutes (`make soak SOAK_MINUTES=60` for the hour).
.PHONY: soak
SOAK_MINUTES ?= 5
soak: deps venv jars
	$(PY) -m benchmarks.soak --seconds $$(( $(SOAK_MINUTES) * 60 ))

# tokenlake: every task a user or CI runs. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
LAKE ?= lake
RUN ?=
RUN_NAME ?=
EXAMPLE_DUMP ?= example-dump
BENCH_SCALE ?= 1

.PHONY: help setup extract example follow verify views audit sql report test test-fast lint fmt bench clean

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

setup: $(VENV)/.installed ## create .venv and install tokenlake (torch==2.13.0, CPU build)

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# Pin the CPU build that lies on these machines; a bare `torch` would pull GBs of CUDA.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

example: setup ## write the small built-in example dump to $(EXAMPLE_DUMP)/
	$(PY) -m pipeline generate $(EXAMPLE_DUMP) --preset example --force

# Without RUN, extract the built-in example dump so a fresh clone shows the whole job.
extract: setup ## RUN=dump [LAKE=lake] [RUN_NAME=name]: dump directory -> Parquet lake + DuckDB catalog
	@if [ -z "$(RUN)" ]; then \
	  $(MAKE) --no-print-directory example && \
	  $(PY) -m pipeline extract $(EXAMPLE_DUMP) --lake $(LAKE) --run-name example; \
	else \
	  $(PY) -m pipeline extract "$(RUN)" --lake "$(LAKE)" $(if $(RUN_NAME),--run-name "$(RUN_NAME)"); \
	fi

follow: setup ## RUN=dump [LAKE=lake]: keep extracting a live run's complete steps (Ctrl-C ends)
	$(PY) -m pipeline extract "$(RUN)" --lake "$(LAKE)" $(if $(RUN_NAME),--run-name "$(RUN_NAME)") --follow

verify: setup ## [LAKE=lake]: check the lake against its manifests and sources; exit 1 on a mismatch
	$(PY) -m pipeline verify "$(LAKE)"

views: setup ## rebuild $(LAKE)/tokenlake.duckdb from the Parquet files and sql/
	$(PY) -m pipeline views "$(LAKE)"

audit: setup ## run the sql/audits checks against $(LAKE); exit 1 if any returns rows
	$(PY) -m pipeline audit "$(LAKE)"

sql: setup ## Q="SELECT ..." [LAKE=lake]: run a query against the catalog
	$(PY) -m pipeline query "$(LAKE)" "$(Q)"

report: setup ## [LAKE=lake] [RUN_NAME=name] [OUT=report.html]: one self-contained HTML report
	$(PY) -m pipeline report "$(LAKE)" $(if $(RUN_NAME),--run "$(RUN_NAME)") -o "$(or $(OUT),report.html)"

lint: setup ## ruff check + format check + mypy (strict defs in pipeline/)
	$(VENV)/bin/ruff check pipeline tests
	$(VENV)/bin/ruff format --check pipeline tests
	$(VENV)/bin/mypy pipeline

fmt: setup ## format and fix what ruff can
	$(VENV)/bin/ruff format pipeline tests
	$(VENV)/bin/ruff check --fix pipeline tests

test: lint ## lint, then the whole test suite (what CI runs)
	$(PY) -m pytest -q --doctest-modules pipeline tests

test-fast: setup ## tests not marked slow
	$(PY) -m pytest -q -m "not slow" --doctest-modules pipeline tests

bench: setup ## BENCH_SCALE=1: generate big dumps in a temp dir and print throughput figures
	$(PY) -m pipeline.bench --scale $(BENCH_SCALE)

clean: ## remove the example dump and the default lake (never touches RUN)
	rm -rf $(EXAMPLE_DUMP) lake

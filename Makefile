# tokenlake: every task a user or CI runs. `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash

VENV ?= .venv
PY := $(VENV)/bin/python
LAKE ?= lake
RUN ?=
RUN_NAME ?=
Q ?=
STEPS ?=
REPLACE ?=
OUT ?= report.html
EXAMPLE_DUMP ?= example-dump
BENCH_STEPS ?= 100
BENCH_SCALE ?= 1
# pytest-xdist workers for `make test`/`test-fast` (`auto`: one per CPU; 0 runs in one process).
TEST_WORKERS ?= auto
# tests/conftest.py schedules: a module with a module-scoped fixture on one worker, longest first.
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS)
# Relative RUN and LAKE mean the directory make was called from, also with `make -C DIR`
# (which changes into DIR; PWD still names the caller's directory).
CALLER_DIR := $(or $(PWD),$(CURDIR))
# Recipes read these from the environment ("$$TL_RUN"), never pasted into the shell text, and
# `$(value ...)` keeps make from expanding a `$` in them, so any name or path round-trips.
export TL_LAKE := $(value LAKE)
export TL_RUN := $(value RUN)
export TL_RUN_NAME := $(value RUN_NAME)
export TL_Q := $(value Q)
export TL_OUT := $(value OUT)
export TL_STEPS := $(value STEPS)
export TL_PORT := $(value PORT)
export TL_REPLACE := $(value REPLACE)
export TL_EXAMPLE_DUMP := $(value EXAMPLE_DUMP)
export CALLER_DIR
# `abs PATH`: PATH made absolute against the caller's directory.
ABS := abs() { case "$$1" in /*) printf '%s' "$$1";; *) printf '%s/%s' "$$CALLER_DIR" "$$1";; esac; }
comma := ,
# What `make extract` says after an error that names an option: make takes them as variables.
OPTIONS_HINT := make extract takes these options as variables: RUN_NAME=name (--run-name), STEPS=0-9 (--steps), REPLACE=1 (--replace)
LOCK := pipeline/requirements-lock.txt
# What `make extract` installs: torch for the example generator (synth), the `duckdb` shell.
RUN_EXTRAS := synth,duckdb-cli
# What `make test` adds: lint and test tools, the Ray executor, Spark, S3 and its test server.
TEST_EXTRAS := $(RUN_EXTRAS),dev,ray,spark,s3,moto
# `$(call install,EXTRAS)`: the venv with tokenlake editable and those extras at the locked
# versions, tokenlake's bytecode compiled (as `pip install` compiles a package it copies: where
# PYTHONDONTWRITEBYTECODE is set, every command would compile it again, about 0.05 s of a
# query's 0.25 s of CPU and 0.6-1 s of an extraction's), then the torch build it got (the CPU
# one: no CUDA).
define install
python3 -m venv $(VENV)
$(PY) -m pip install -q -c $(LOCK) -e '.[$(1)]'
$(PY) -m compileall -q pipeline > /dev/null
@$(PY) -c 'import torch; cuda = torch.version.cuda; print("Set-up done: torch", torch.__version__, f"(CUDA {cuda})" if cuda else "(the CPU build, no CUDA)")'
touch $@
endef
# The files the example dump is generated from: `make example` rewrites it only when they change.
GENERATOR := pipeline/tokenlake/generator/synth.py pipeline/tokenlake/generator/synth_spec.py pipeline/tokenlake/read/cp_layout.py

.PHONY: help setup setup-test lock extract example follow verify views audit sql report serve test test-fast lint fmt bench bench-steps bench-formats bench-bounds clean

help: ## list the targets (with the defaults in force)
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) \
	  | sed -e 's|\$$(LAKE)|$(LAKE)|g' -e 's|\$$(EXAMPLE_DUMP)|$(EXAMPLE_DUMP)|g' \
	        -e 's|\$$(BENCH_SCALE)|$(BENCH_SCALE)|g' -e 's|\$$(BENCH_STEPS)|$(BENCH_STEPS)|g' -e 's|\$$(TEST_WORKERS)|$(TEST_WORKERS)|g' \
	  | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

setup: $(VENV)/.installed-run ## create .venv with what extraction needs (tokenlake, torch==2.13.0 CPU build, the duckdb shell)

setup-test: $(VENV)/.installed-test ## setup, plus what the tests need (dev tools, Ray, Spark, S3, moto)

# Every version comes from the lock (the tested set; `make lock` refreshes it), so pip never
# backtracks into a newer torch, whose CUDA build is GBs.
$(VENV)/.installed-run: pyproject.toml $(LOCK)
	$(call install,$(RUN_EXTRAS))

$(VENV)/.installed-test: pyproject.toml $(LOCK)
	$(call install,$(TEST_EXTRAS))

lock: setup ## refresh pipeline/requirements-lock.txt after a dependency in pyproject.toml changed (keeps the other pins)
	$(PY) -m pip install -q pip-tools
	$(VENV)/bin/pip-compile -q --strip-extras --no-emit-find-links --no-emit-index-url \
	  $(foreach e,$(subst $(comma), ,$(TEST_EXTRAS)),--extra=$(e)) -o $(LOCK) pyproject.toml

example: setup $(EXAMPLE_DUMP)/.generated ## write the small built-in example dump to $(EXAMPLE_DUMP)/ (once)
	@:

# A stamp: regenerating an unchanged example would give its files new times, and the next
# `make extract` would re-read every step.
$(EXAMPLE_DUMP)/.generated: $(GENERATOR) $(VENV)/.installed-run
	$(PY) -m tokenlake generate "$$TL_EXAMPLE_DUMP" --preset example --force
	touch "$@"

# Without RUN, extract the built-in example dump so a fresh clone shows the whole job.
extract: setup ## RUN=dump [LAKE=$(LAKE)] [RUN_NAME=name] [STEPS=0-9] [REPLACE=1]: dump directory -> Parquet lake + DuckDB catalog
	@$(ABS); if [ -z "$$TL_RUN" ]; then \
	  $(MAKE) --no-print-directory example && set -- "$$TL_EXAMPLE_DUMP" --run-name example; \
	else set -- "$$(abs "$$TL_RUN")" $${TL_RUN_NAME:+--run-name "$$TL_RUN_NAME"}; fi; \
	err=$$(mktemp); \
	$(PY) -m tokenlake extract "$$@" --lake "$$(abs "$$TL_LAKE")" $${TL_STEPS:+--steps "$$TL_STEPS"} \
	  $${TL_REPLACE:+--replace} 2> >(tee "$$err" >&2); code=$$?; wait $$!; \
	if [ $$code -ne 0 ] && grep -q -e --replace -e --steps -e --run-name "$$err"; then \
	  echo "$(OPTIONS_HINT)" >&2; fi; rm -f "$$err"; exit $$code

follow: setup ## RUN=dump [LAKE=$(LAKE)] [RUN_NAME=name]: keep extracting a live run's complete steps (Ctrl-C ends)
	@$(ABS); if [ -z "$$TL_RUN" ]; then echo "make follow: give RUN=DUMP_DIR" >&2; exit 2; fi; \
	$(PY) -m tokenlake extract "$$(abs "$$TL_RUN")" --lake "$$(abs "$$TL_LAKE")" --follow \
	  $${TL_RUN_NAME:+--run-name "$$TL_RUN_NAME"}

verify: setup ## [LAKE=$(LAKE)]: check the lake against its manifests and sources; exit 1 on a mismatch
	@$(ABS); $(PY) -m tokenlake verify "$$(abs "$$TL_LAKE")"

views: setup ## [LAKE=$(LAKE)]: rebuild the lake's tokenlake.duckdb from the Parquet files and sql/
	@$(ABS); $(PY) -m tokenlake views "$$(abs "$$TL_LAKE")"

audit: setup ## [LAKE=$(LAKE)]: run the sql/audits checks; exit 1 on an error-severity audit
	@$(ABS); $(PY) -m tokenlake audit "$$(abs "$$TL_LAKE")"

sql: setup ## Q="SELECT ..." [LAKE=$(LAKE)]: run a query against the catalog
	@$(ABS); $(PY) -m tokenlake query "$$(abs "$$TL_LAKE")" "$$TL_Q"

report: setup ## [LAKE=$(LAKE)] [RUN_NAME=name] [STEPS=0-9] [OUT=report.html]: one self-contained HTML report
	@$(ABS); $(PY) -m tokenlake report "$$(abs "$$TL_LAKE")" $${TL_RUN_NAME:+--run "$$TL_RUN_NAME"} \
	  $${TL_STEPS:+--steps "$$TL_STEPS"} -o "$$(abs "$$TL_OUT")"

serve: setup ## [LAKE=$(LAKE)] [PORT=8765]: the explorer over the lake at http://127.0.0.1:PORT/ (Ctrl-C stops)
	@$(ABS); $(PY) -m tokenlake serve "$$(abs "$$TL_LAKE")" --port "$${TL_PORT:-8765}"

lint: setup-test ## ruff check + format check + mypy (strict defs in pipeline/)
	$(VENV)/bin/ruff check pipeline tests
	$(VENV)/bin/ruff format --check pipeline tests
	$(VENV)/bin/mypy pipeline

fmt: setup-test ## format and fix what ruff can
	$(VENV)/bin/ruff format pipeline tests
	$(VENV)/bin/ruff check --fix pipeline tests

test: lint ## [TEST_WORKERS=$(TEST_WORKERS)]: lint, then the whole test suite in parallel (what CI runs)
	$(PYTEST) --doctest-modules pipeline tests

test-fast: setup-test ## [TEST_WORKERS=$(TEST_WORKERS)]: tests not marked slow, in parallel
	$(PYTEST) -m "not slow" --doctest-modules pipeline tests

bench: setup ## BENCH_SCALE=$(BENCH_SCALE): generate big dumps in a temp dir and print throughput figures
	PYTHONPATH=pipeline $(PY) -m benchmarks.bench --scale $(BENCH_SCALE)

bench-steps: setup ## BENCH_STEPS=$(BENCH_STEPS): a step's fixed cost (many 4-sample steps, per stage) and every command's CPU, against issue 34's goals
	PYTHONPATH=pipeline $(PY) -m benchmarks.bench --steps $(BENCH_STEPS)

bench-formats: setup-test ## our S3 commit protocol vs Delta Lake and Iceberg on a local S3 server (docs/table-formats.md)
	$(PY) -m pip install -q -e '.[formats]'
	PYTHONPATH=pipeline $(PY) -m benchmarks.bench_formats

bench-bounds: setup-test ## each file kind of docs/security.md's table of bounds, built just beyond its bound: the time and peak memory of its refusal
	PYTHONPATH=pipeline $(PY) -m benchmarks.bench_bounds

clean: ## remove $(EXAMPLE_DUMP)/ and the default lake (never touches RUN)
	rm -rf "$$TL_EXAMPLE_DUMP" lake

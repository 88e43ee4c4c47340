# image-archive: everything a developer or CI runs goes through here.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
SAM_VENV ?= .venv-sam
SAM ?= $(SAM_VENV)/bin/sam
PY := $(VENV)/bin/python
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: help venv sam-venv node-deps lint format test unit local services bench clean

help:
	@echo "make local                the whole pipeline on this machine (24 records), Ctrl-C stops it"
	@echo "make local ARGS=--short   the same with 8 records, about 10 s (what CI runs)"
	@echo "make local ARGS=--keep    the same, and the services keep running after the summary"
	@echo "make services             the local services on env.json's ports, for sam local invoke"
	@echo "make test                 set up (venv, pinned deps, PostgreSQL binaries, Node packages) and run every check"
	@echo "make test-busy            the tests, three times, beside a CPU load (not part of make test)"
	@echo "make test-deep            the model-based tests with 20x their examples (not part of make test)"
	@echo "make lint                 ruff check, ruff format --check, mypy --strict src"
	@echo "make format               apply ruff's formatting and safe fixes"
	@echo "make bench                the benchmarks under bench/, one table (about 10 minutes)"
	@echo "make template-check       cfn-lint, sam validate, sam validate --lint (offline)"
	@echo "make sam-build            sam build (no Docker, no python3.13 needed)"
	@echo "make venv, make sam-venv  the project's virtualenv, the SAM CLI's"
	@echo "make node-deps            the TypeScript producer's packages, for its tests (Node.js 20+)"

$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints.txt
	# The checkout itself, editable: $(VENV)/bin/archive-ctl (pyproject.toml [project.scripts]).
	$(PY) -m pip install -q --no-deps -e .
	touch $@

$(SAM_VENV)/.installed: requirements-sam.txt
	test -x $(SAM_VENV)/bin/python || $(PYTHON) -m venv $(SAM_VENV)
	$(SAM_VENV)/bin/python -m pip install -q --upgrade pip
	# aws-sam-cli pins its own boto3, so it lives apart from the application's.
	$(SAM_VENV)/bin/python -m pip install -q -r requirements-sam.txt
	touch $@

# The TypeScript producer of docs/how-to/connect-the-generation-service.md is type-checked and run by the tests.
PRODUCER_TS := tests/producer_ts
$(PRODUCER_TS)/node_modules/.installed: $(PRODUCER_TS)/package.json $(PRODUCER_TS)/package-lock.json
	./scripts/ensure-node.sh
	npm ci --prefix $(PRODUCER_TS) --no-audit --no-fund --loglevel=error
	touch $@

venv: $(VENV)/.installed

node-deps: $(PRODUCER_TS)/node_modules/.installed

sam-venv: $(SAM_VENV)/.installed

lint: venv
	$(VENV)/bin/ruff check src tests devkit bench
	$(VENV)/bin/ruff format --check src tests devkit bench
	$(VENV)/bin/mypy --strict src

format: venv
	$(VENV)/bin/ruff check --fix src tests devkit bench
	$(VENV)/bin/ruff format src tests devkit bench

unit: venv
	$(VENV)/bin/pytest -q tests/unit

-include mk/*.mk

# Template checks and a real `sam build` first: a template that cannot deploy fails fast.
test: venv sam-venv node-deps lint template-check sam-build
	./scripts/ensure-postgres.sh
	$(VENV)/bin/pytest -q

clean:
	rm -rf $(VENV) $(SAM_VENV) $(PRODUCER_TS)/node_modules .aws-sam .pytest_cache .mypy_cache .ruff_cache

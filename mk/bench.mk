# Benchmarks (issue 7); the main Makefile includes this file (`-include mk/*.mk`)
# and declares `bench` phony.
#
#   make bench    every bench under bench/, one table with PASS/FAIL (bench/results/)
#
# ensure-postgres.sh first: the benches start devkit's throwaway PostgreSQL cluster.

VENV ?= .venv
PY ?= $(VENV)/bin/python

bench: venv
	./scripts/ensure-postgres.sh
	$(PY) -m bench.run

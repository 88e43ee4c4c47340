# `make test-busy`: the suite beside a busy machine (issue 19); the main Makefile includes
# this file. Not part of `make test` nor of CI: it takes three runs' time, about 15 minutes.
#
#   make test-busy                            3 runs of pytest beside $(nproc) spinning processes
#   make test-busy BUSY=4 RUNS=1 PYTEST_ARGS="tests/integration -x"
#
# Every time-dependent test waits on its event (or drives the clock), so a slow moment
# may slow the suite down but must not turn it red.

BUSY ?= $(shell nproc)
RUNS ?= 3
PYTEST_ARGS ?=

.PHONY: test-busy

test-busy: venv
	./scripts/ensure-postgres.sh
	BUSY=$(BUSY) RUNS=$(RUNS) PYTEST=$(VENV)/bin/pytest ./scripts/test-busy.sh $(PYTEST_ARGS)

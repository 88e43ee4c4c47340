# `make test-deep`: the model-based (Hypothesis) tests with 20 times the examples `make
# test` runs. Not part of `make test` nor of CI; the main Makefile includes this file.
#
#   make test-deep                      every test marked `model`
#   make test-deep PYTEST_ARGS="-k ledger"

.PHONY: test-deep

test-deep: venv
	./scripts/ensure-postgres.sh
	HYPOTHESIS_PROFILE=deep $(VENV)/bin/pytest -q -m model $(PYTEST_ARGS)

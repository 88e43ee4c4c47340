# `make local`: the whole pipeline on this machine (devkit/demo/); the main Makefile
# includes this file. Same setup as `make test`: the venv and PostgreSQL's binaries.
#
#   make local                      24 records, backoff 2 s / 5 s, about 15 s
#   make local ARGS=--short         the CI mode: 8 records, about 10 s
#   make local ARGS="--records 50 --concurrency 4"
#   make local ARGS=--keep          then leave the services running, for `archive-ctl show`
#   make services                   the services alone, on env.json's ports (sam local invoke)
#
# Archived files and the containers' logs stay in local-data/<time>/ (git-ignored).

ARGS ?=

local: venv
	./scripts/ensure-postgres.sh
	$(PY) -m devkit.demo $(ARGS)

services: venv
	./scripts/ensure-postgres.sh
	$(PY) -m devkit.demo.stack $(ARGS)

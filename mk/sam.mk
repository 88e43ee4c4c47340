# SAM targets; the main Makefile includes this file (`include mk/sam.mk`).
#
#   make template-check   cfn-lint (no errors or warnings), sam validate, sam validate --lint
#   make sam-build        sam build (no Docker, no python3.13 needed: see mk/lambda/Makefile)
#
# Both run offline. `sam validate` insists on a region although it calls no AWS
# service, hence SAM_REGION; SAM_CLI_TELEMETRY=0 keeps the CLI from phoning home.

VENV ?= .venv
SAM ?= .venv-sam/bin/sam
SAM_TEMPLATE ?= template.yaml
SAM_REGION ?= us-east-1
SAM_BUILD_FLAGS ?= --parallel

SAM_RUN = SAM_CLI_TELEMETRY=0 $(SAM)
# Each target depends on the venv whose tool it runs, so that it works in a fresh clone
# in the order the README gives. A SAM from elsewhere (SAM=/path/to/sam) needs no venv.
SAM_VENV ?= .venv-sam
SAM_NEEDS := $(if $(filter $(SAM_VENV)/bin/sam,$(SAM)),sam-venv)

.PHONY: template-check cfn-lint sam-validate sam-build sam-clean

template-check: cfn-lint sam-validate

# cfn-lint exits non-zero on warnings as well as errors.
cfn-lint: venv
	$(VENV)/bin/cfn-lint -- $(SAM_TEMPLATE)

# Plain `sam validate` runs SAM's own translator checks (it catches type errors
# cfn-lint misses, e.g. a non-integer BatchSize); `--lint` runs only cfn-lint
# (the copy inside the SAM CLI's venv). Neither replaces the other.
sam-validate: $(SAM_NEEDS)
	$(SAM_RUN) validate --template-file $(SAM_TEMPLATE) --region $(SAM_REGION)
	$(SAM_RUN) validate --lint --template-file $(SAM_TEMPLATE) --region $(SAM_REGION)

sam-build: $(SAM_NEEDS)
	$(SAM_RUN) build --template-file $(SAM_TEMPLATE) $(SAM_BUILD_FLAGS)

sam-clean:
	rm -rf .aws-sam

# The README's two commands: `make run` (estimate a shipped example, no torch) and `make test` (every test).
PYTHON ?= python3
VENV ?= .venv
CORE_VENV ?= .venv-core
EXAMPLE ?= hpcmem/examples/sft-qwen2.5-7b-lora.yaml
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TORCH_EXTENSIONS_DIR := $(CURDIR)/.torch_extensions

.PHONY: run test setup-core setup-test slurm-deps bench

# A login-node install: the light core only (click, jinja2, pyyaml, submitit), no torch.
setup-core:
	test -x $(CORE_VENV)/bin/python || $(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install -q --disable-pip-version-check .

run: setup-core
	$(CORE_VENV)/bin/hpcmem estimate sft --config $(EXAMPLE)

# torch FIRST (the CPU wheel on disk), then the project with its [train,test] extras constrained to that torch.
setup-test:
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check -e ".[train,test]" torch==2.13.0

# SLURM 22.05 from Debian for the slurm tier (tests start and stop their own daemons).
slurm-deps:
	command -v slurmctld >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm >/dev/null; }

# Two workers (the CI machine's two cores), one test file per worker at a time: module fixtures (a built model, a
# started SLURM cluster) are made once per file; each SLURM fixture takes its own free ports and state folder.
TEST_WORKERS ?= 2
test: setup-test slurm-deps
	$(VENV)/bin/lint-imports
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

bench: setup-test
	for b in cli_bench estimate_bench plan_bench lengths_bench trace_bench; do $(VENV)/bin/python -m hpcmem.bench.$$b || exit 1; done

# The README's quickstart: `make train` and `make test` each set up .venv (once) and then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=
PYTEST_ARGS ?=

# The torch to install into .venv. With a GPU (nvidia-smi runs): the default wheel, from pip's index.
# Without one: a CPU build from PyTorch's CPU index (no CUDA libraries: torch is ~750 MB instead of
# several GB); when that index cannot be reached, pip's default index instead (said out loud).
# TORCH_SPEC picks the version (CI pins the CPU build, torch==2.13.0: see .ci/run), TORCH_INDEX the
# index (empty: pip's own). Changing either reinstalls torch on the next make.
TORCH_SPEC ?= torch
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo yes)
ifeq ($(HAVE_GPU),yes)
TORCH_INDEX ?=
else
TORCH_INDEX ?= $(TORCH_CPU_INDEX)
endif
TORCH_WANTED := $(TORCH_SPEC) index=$(or $(TORCH_INDEX),pip-default)

.PHONY: setup train test test-slow test-all FORCE

# Holds the torch this .venv should have; rewritten only when TORCH_SPEC or TORCH_INDEX changes, which
# makes .installed out of date and reinstalls.
$(VENV)/.torch-wanted: FORCE
	@mkdir -p $(VENV)
	@echo '$(TORCH_WANTED)' | cmp -s - $@ || echo '$(TORCH_WANTED)' > $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch-wanted
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "make: $(if $(HAVE_GPU),a GPU is here (nvidia-smi),no GPU here (no nvidia-smi or it failed)): installing $(TORCH_SPEC) from $(or $(TORCH_INDEX),pip's configured indexes/find-links)"
	@sh scripts/install_torch.sh $(BIN)/python '$(TORCH_SPEC)' '$(TORCH_INDEX)' '$(TORCH_WANTED)' $(VENV)/.torch-installed
	$(BIN)/python -m pip install -q -e '.[test]'
	@touch $@

setup: $(VENV)/.installed

# On a GPU: the default run (accel=torch, model=small, data=stdlib, W&B offline). Without one: the
# quick CPU configuration, said out loud.
train: setup
	@if $(BIN)/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then \
	  $(BIN)/python -m harness.train $(ARGS); \
	else \
	  echo "make train: no CUDA GPU here, so the quick CPU configuration runs: model=tiny trainer=cpu"; \
	  $(BIN)/python -m harness.train model=tiny trainer=cpu $(ARGS); \
	fi

# `make test`: the default set, every behaviour with at least one fast case (4-8 minutes on 2 CPU
# cores); the tests marked slow (the other sizes and dtypes of a kernel test, whole training runs) are
# run by `make test-slow` alone, and by `make test-all` with the rest. CI runs test.
# TEST_WORKERS: test processes (pytest-xdist; each test file runs whole in one of them, so a file's
# shared fixtures are built once); 0 runs the tests in this process alone.
TEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(PYTEST) -m "not slow" $(PYTEST_ARGS)

test-slow: setup
	$(PYTEST) -m slow $(PYTEST_ARGS)

test-all: setup
	$(PYTEST) $(PYTEST_ARGS)

# The README's quickstart: `make train` and `make test` each set up .venv (once) and then run.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The torch to install into .venv. CI pins the CPU build: TORCH_SPEC=torch==2.13.0 (see .ci/run).
TORCH_SPEC ?= torch
ARGS ?=
PYTEST_ARGS ?=

.PHONY: setup train test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

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

test: setup
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

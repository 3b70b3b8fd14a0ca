# Two entry points, each self-sufficient on a fresh machine with only Python:
#   make demo   creates .venv, installs pl-privfed, runs `pl-privfed demo` (a useful private run on
#               the embedded digits, its non-private twin and a second algorithm at the same ε)
#   make test   creates .venv, installs pl-privfed[dev], runs ruff (lint + format) and pytest
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch/torchvision pins that install from this project's machines' local disk; override freely.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1

.PHONY: demo test lint install benchmark clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/pl-privfed demo

lint: $(BIN)/.installed
	$(BIN)/ruff check pl_privfed tests benchmarks examples
	$(BIN)/ruff format --check pl_privfed tests benchmarks examples

test: lint
	$(BIN)/python -m pytest

benchmark: $(BIN)/.installed
	$(BIN)/python benchmarks/round_time.py

clean:
	rm -rf $(VENV) logs lightning_logs wandb .pytest_cache .ruff_cache

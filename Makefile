# ThunderSync: `make demo` shows the system on a CPU; `make test` runs the test suite.
# Both create .venv, install torch's CPU build where no torch is present, then the project.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# A bare `torch` requirement can pull a multi-GB CUDA build: pin the CPU build first.
# Elsewhere, e.g.: make TORCH_SPEC="torch==2.13.0 --index-url <your CPU wheel index>"
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,swebench,plots,tracking
PYTEST_ARGS ?=

.PHONY: install demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q $(TORCH_SPEC)
	$(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/thundersync envs
	$(BIN)/thundersync verify --trials 1 --deterministic
	$(BIN)/python benchmarks/learner_overhead.py --repeats 3 --groups 4
	$(BIN)/thundersync eval --suite tb1-mini --agent oracle
	$(BIN)/thundersync eval --suite tb1-mini --agent nop

test: install
	$(BIN)/python -m pytest -q -m "not gpu and not vllm and not browser" $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check thundersync environments harness leaderboard tests benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache

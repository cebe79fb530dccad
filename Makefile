# Two commands for a newcomer: `make serve` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
MODEL ?=

.PHONY: serve test test-fast test-portable lint bench install install-dev clean

serve: $(VENV)/.installed
	$(BIN)/mlxserve serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL),)

# Every tier, then the engine and API tiers again as a Mac's GPU runs them (test-portable).
test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest
	$(MAKE) --no-print-directory test-portable

# The unit and engine tiers: no HTTP, under a minute.
test-fast: $(VENV)/.installed-dev
	$(BIN)/python -m pytest tests/unit tests/engine

# MLXSERVE_PORTABLE=1: none of the CPU backend's own paths (mlxserve/platform), so quantized
# weights stay quantized and attention is MLX's own, as on a Mac. Real-model statistics
# (marked slow) run once, in the pass above.
test-portable: $(VENV)/.installed-dev
	MLXSERVE_PORTABLE=1 $(BIN)/python -m pytest tests/engine tests/api -m "not slow"

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.installed-dev
	$(BIN)/python scripts/bench.py

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(VENV)/bin/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(VENV)/.installed $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

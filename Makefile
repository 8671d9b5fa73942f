# Inference Lab — every entry point. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
# torch first, pinned: the CPU wheel. Anything else pulls a multi-GB CUDA build. Same pin as pyproject.toml.
TORCH  := torch==2.13.0
# nbgrader runs `alembic` by name, so the venv's bin/ must be on PATH for every recipe.
export PATH := $(BIN):$(PATH)
# Jupyter refuses to run as root unless told; containers and CI often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# Extra arguments for the command a target runs, e.g. `make bench ARGS=--quick`, `make grade-ui ARGS=--port=8890`.
ARGS ?=

.PHONY: help setup lab grade-ui test test-quick lint bench bench-18 bench-19 bench-20 serve bench-load machine release clean-cache

help:
	@echo "make setup        create .venv, install the lab, fetch and verify the model (idempotent)"
	@echo "make lab          setup, then open JupyterLab on weeks/"
	@echo "make grade-ui     (instructors) JupyterLab on the repo root, opening nbgrader's formgrader for hand-grading"
	@echo "make test         setup, then the whole test suite (what CI runs)"
	@echo "make test-quick   the suite without executing whole notebooks or the READMEs' commands"
	@echo "make lint         ruff on lib/, grader/, benchmarks/, tools/, tests/ (the test command runs it too)"
	@echo "make bench        speed benchmark: lib, lib.fast, transformers, the bandwidth roofline"
	@echo "make bench-18     speculative decoding: each draft's tok/s vs target greedy (identical tokens)"
	@echo "make bench-19     serving: static vs continuous vs prefix-cached batching; batch 8 vs batch 1 decode"
	@echo "make bench-20     quantized decode: F32 vs int8 vs int4 paths (and llama.cpp when installed)"
	@echo "make serve        an OpenAI-compatible server on 127.0.0.1:8000 (SmolLM2, the week-19 engine); PORT=8001 to move it"
	@echo "make bench-load   load-test the server with the openai client: throughput, TTFT/TPOT p50/p95, KV use"
	@echo "make machine      this machine's whole table: CPU and flags, bandwidth, kernels chosen, both decode benchmarks"
	@echo "make release WEEK=16   regenerate weeks/16 from solutions/16 (keeps a student's edited files)"
	@echo "ARGS=... passes arguments on: make bench ARGS=--quick (each bench-NN too: a run in seconds),"
	@echo "         make bench ARGS=--profile, make grade-ui ARGS='--port=8890 --no-browser'"

$(VENV)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --disable-pip-version-check -q $(TORCH)
	$(BIN)/python -m pip install --disable-pip-version-check -q -e .
	touch $@

setup: $(VENV)/.installed
	$(BIN)/python -m lib.fetch

lab: setup
	$(BIN)/jupyter lab --notebook-dir=weeks $(LAB_ARGS) $(ARGS)

# The formgrader needs the course root (this folder, where nbgrader_config.py is) inside the server's root.
grade-ui: $(VENV)/.installed
	cd $(CURDIR) && $(BIN)/jupyter lab --notebook-dir=. --ServerApp.default_url=/formgrader $(LAB_ARGS) $(ARGS)

test: setup
	$(BIN)/python -m pytest --durations=30

test-quick: setup
	$(BIN)/python -m pytest -m "not notebook and not commands"

lint: $(VENV)/.installed
	$(BIN)/ruff check $(ARGS)

bench: setup
	$(BIN)/python benchmarks/decode.py $(ARGS)

bench-18: setup
	$(BIN)/python benchmarks/speculative.py $(ARGS)

bench-19: setup
	$(BIN)/python benchmarks/serving.py $(ARGS)

bench-20: setup
	$(BIN)/python benchmarks/quant.py $(ARGS)

PORT ?= 8000
serve: setup
	$(BIN)/python -m lib.server --port $(PORT)

bench-load: setup
	$(BIN)/python benchmarks/load.py $(ARGS)

machine: setup
	$(BIN)/python benchmarks/machine.py $(ARGS)

release: $(VENV)/.installed
	@test -n "$(WEEK)" || (echo "usage: make release WEEK=16" && exit 2)
	$(BIN)/python -m grader release $(WEEK)

clean-cache:
	rm -rf data/cache

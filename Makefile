# Inference Lab — every entry point. `make help` lists them.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(abspath $(VENV))/bin
# torch first, pinned: the CPU wheel. Anything else pulls a multi-GB CUDA build. Same pin as pyproject.toml.
TORCH  := torch==2.13.0
# GPU owners: `make setup TORCH_INDEX=https://download.pytorch.org/whl/cu130` installs the same pinned torch as a
# CUDA build from that index instead (README.md, "GPU owners"). The venv remembers it (.venv/.torch-index), so later
# make commands keep that build; a new index re-runs the install (a CPU torch already there satisfies the pin, so pip
# would keep it: it is uninstalled first). Back to the CPU wheel: `rm -rf .venv`.
TORCH_INDEX ?= $(shell cat $(VENV)/.torch-index 2>/dev/null)
PIP := $(BIN)/python -m pip install --disable-pip-version-check -q
# A CUDA build of torch requires its own triton: where that is not pyproject.toml's pin, the one route pip accepts
# (pyproject.toml's comment on triton says why it is safe) is torch's triton, every other dependency, then the
# project itself with --no-deps. These print whether torch requires another triton, and those other dependencies.
TORCH_WANTS_OTHER_TRITON := import importlib.metadata as m, re; pin = re.search(r"\"triton==([^\"]+)\"", open("pyproject.toml").read())[1]; want = [r for r in m.requires("torch") or [] if re.match(r"triton\b", r)]; print(int(bool(want) and not any(re.search(r"==\s*" + re.escape(pin) + r"\s*(;|$$)", r) for r in want)))
DEPS_BUT_TORCH_TRITON := import tomllib; deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(d for d in deps if not d.startswith(("torch", "triton"))))
# nbgrader runs `alembic` by name, so the venv's bin/ must be on PATH for every recipe.
export PATH := $(BIN):$(PATH)
# Jupyter refuses to run as root unless told; containers and CI often are root.
LAB_ARGS ?= $(if $(filter 0,$(shell id -u)),--allow-root,)
# Extra arguments for the command a target runs, e.g. `make bench ARGS=--quick`, `make grade-ui ARGS=--port=8890`.
ARGS ?=

.PHONY: help setup lab grade-ui test test-quick lint bench bench-18 bench-19 bench-20 serve bench-load machine results gpu-check release clean-cache

help:
	@echo "make setup        create .venv, install the lab, fetch and verify the model (idempotent)"
	@echo "                  TORCH_INDEX=https://download.pytorch.org/whl/cu130: a CUDA build of the pinned torch (GPU owners)"
	@echo "make lab          setup, then open JupyterLab on weeks/"
	@echo "make grade-ui     (instructors) JupyterLab on the repo root, opening nbgrader's formgrader for hand-grading"
	@echo "make test         setup, then the whole test suite (what CI runs), in TEST_JOBS processes (default: cores, max 4)"
	@echo "make test-quick   the suite without executing whole notebooks or the READMEs' commands"
	@echo "make lint         ruff on lib/, grader/, benchmarks/, tools/, tests/ (the test command runs it too)"
	@echo "make bench        speed benchmark: lib, lib.modeling.fast, transformers, the bandwidth roofline"
	@echo "make bench-18     speculative decoding: each draft's tok/s vs target greedy (identical tokens)"
	@echo "make bench-19     serving: static vs continuous vs prefix-cached batching; batch 8 vs batch 1 decode"
	@echo "make bench-20     quantized decode: F32 vs int8 vs int4 paths (and llama.cpp when installed)"
	@echo "make serve        an OpenAI-compatible server on 127.0.0.1:8000 (SmolLM2, the week-19 engine); PORT=8001 to move it,"
	@echo "                  ARGS=--max-num-seqs=16 (python -m lib.serve.server --help lists the options)"
	@echo "make bench-load   load-test the server with the openai client: throughput, TTFT/TPOT p50/p95, KV use"
	@echo "make machine      this machine's whole table: CPU and flags, bandwidth, kernels measured again, both decode"
	@echo "                  benchmarks; ARGS=--record keeps the runs as this machine class's records (results/)"
	@echo "make results      render README.md's speed table and docs/performance.md from the records (ARGS=--check: diff only)"
	@echo "make gpu-check    (GPU owners) every solution notebook and the test suite on this CUDA machine: one line each"
	@echo "make release WEEK=16   regenerate weeks/16 from solutions/16 (keeps a student's edited files)"
	@echo "ARGS=... passes arguments on: make bench ARGS=--quick (each bench-NN too: a run in seconds),"
	@echo "         make bench ARGS=--profile, make grade-ui ARGS='--port=8890 --no-browser'"

# A TORCH_INDEX other than the one the venv was set up with (none: the CPU wheel) makes the install run again.
$(VENV)/.installed: pyproject.toml $(if $(filter-out $(shell cat $(VENV)/.torch-index 2>/dev/null),$(TORCH_INDEX)),FORCE)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
ifeq ($(TORCH_INDEX),)
	@tools/setup_stage.sh "$(TORCH), the CPU wheel" $(VENV) $(PIP) $(TORCH)
	@tools/setup_stage.sh "the lab and its dependencies from pyproject.toml" \
	    $(VENV) $(PIP) -e .
else
	$(BIN)/python -c 'import sys, torch; sys.exit(torch.version.cuda is None)' 2>/dev/null || $(BIN)/python -m pip uninstall -y -q torch
	$(PIP) --index-url $(TORCH_INDEX) $(TORCH)
	if [ "$$($(BIN)/python -c '$(TORCH_WANTS_OTHER_TRITON)')" = 1 ]; then \
	    echo "make setup: this torch build requires its own triton, not pyproject.toml's pin: keeping torch's triton"; \
	    $(BIN)/python -c '$(DEPS_BUT_TORCH_TRITON)' > $(VENV)/requirements-gpu.txt && \
	    $(PIP) -r $(VENV)/requirements-gpu.txt && $(PIP) --no-deps -e .; \
	else $(PIP) -e .; fi
	echo '$(TORCH_INDEX)' > $(VENV)/.torch-index
endif
	touch $@

FORCE:

setup: $(VENV)/.installed
	$(BIN)/python -m lib.modeling.fetch

lab: setup
	$(BIN)/jupyter lab --notebook-dir=weeks $(LAB_ARGS) $(ARGS)

# The formgrader needs the course root (this folder, where nbgrader_config.py is) inside the server's root.
# LabApp's default URL (/lab) wins over ServerApp's, so the landing page is set there. `exec`: the shell becomes
# JupyterLab, so stopping make (which passes SIGTERM on to its recipe) stops the server too.
grade-ui: $(VENV)/.installed
	cd $(CURDIR) && exec $(BIN)/jupyter lab --notebook-dir=. --LabApp.default_url=/formgrader $(LAB_ARGS) $(ARGS)

# The test command's processes (pytest-xdist): one per core, at most 4 (each loads the model); each runs torch on
# cores / TEST_JOBS threads (conftest.py), so they never wait on each other's threads. TEST_JOBS=0: one process.
TEST_JOBS ?= $(shell $(PYTHON) -c "import os; print(min(4, os.cpu_count() or 1))")

test: setup
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal --durations=30

test-quick: setup
	$(BIN)/python -m pytest -n $(TEST_JOBS) --dist worksteal -m "not notebook and not commands"

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
	$(BIN)/python -m lib.serve.server --port $(PORT) $(ARGS)

bench-load: setup
	$(BIN)/python benchmarks/load.py $(ARGS)

machine: setup
	$(BIN)/python benchmarks/machine.py $(ARGS)

results: $(VENV)/.installed
	$(BIN)/python tools/results.py $(ARGS)

# tools/gpu_check.sh says why it cannot run on a machine without CUDA (exit status 2).
gpu-check: setup
	PYTHON=$(BIN)/python tools/gpu_check.sh $(ARGS)

release: $(VENV)/.installed
	@test -n "$(WEEK)" || (echo "usage: make release WEEK=16" && exit 2)
	$(BIN)/python -m grader release $(WEEK)

clean-cache:
	rm -rf data/cache

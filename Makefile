# Each target sets itself up: it creates .venv if missing and installs the project into it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
export XLA_PYTHON_CLIENT_PREALLOCATE ?= false

.PHONY: demo test test-slow lint docs bench claims clean-venv

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,lint,docs]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m experiments.async_workers --quick

# Tests and the docstring examples (doctests) of jaxstale/: see [tool.pytest.ini_options].
# Two pytest-xdist workers, each with its own compile cache (conftest.py): one process leaves
# a core idle while XLA compiles (single-threaded); measured idle on 2 cores, 1,452 tests:
# 3 min 47 s with -n 2, 5 min 6 s in one process. XLA:CPU compiles at LLVM -O0 here (the root
# conftest.py: most of the time is compiling); the slow sets run at the default level.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2

# Four processes, without the tests' per-process compile cache and at XLA's default optimization
# level (root conftest.py): one process compiling every slow case segfaulted inside XLA late in the run (a cache read once, a compile
# once, at 87-97 %), and so did the asyncdp + pipeline process once the GPT and stage-tree
# parity cases joined it (in XLA's compile, in test_mesh.py at 89 %): the mesh parity matrix
# (128 cases) runs in a process of its own. Each set runs on two pytest-xdist workers, as
# `make test` does, but GPT-2 small's (its children peak at ~11 GiB each: alone).
SLOW := $(BIN)/python -m pytest -q -n 2 -m slow
SLOW_ENV := JAXSTALE_TEST_JIT_CACHE=off JAXSTALE_TEST_XLA_O0=off
test-slow: $(STAMP)
	$(SLOW_ENV) $(SLOW) tests/asyncdp tests/pipeline --ignore=tests/pipeline/test_mesh.py \
		--ignore=tests/pipeline/test_gpt2_small.py
	$(SLOW_ENV) $(BIN)/python -m pytest -q -m slow tests/pipeline/test_gpt2_small.py
	$(SLOW_ENV) $(SLOW) tests/pipeline/test_mesh.py
	$(SLOW_ENV) $(SLOW) tests/experiments
	$(SLOW_ENV) $(SLOW) --ignore=tests/asyncdp --ignore=tests/pipeline \
		--ignore=tests/experiments

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# API reference from the docstrings, offline; warnings are errors. Output: docs/_build/html/.
docs: $(STAMP)
	$(BIN)/python -m sphinx -W --keep-going -q -b html docs docs/_build/html

# Every claims-report configuration (resuming finished cells), then study/claims.md, its figures,
# a copy of each configuration's rows (study/claims/rows/, committed) and README's verdict
# lines. The image claims ~22 CPU-hours on 2 cores (MNIST-1D, 27,000 updates, 10 seeds), the
# DiLoCo and language-model ones more (study/README.md, "Running the claims");
# `python -m study` alone re-writes the report from the run folders in
# results/claims/, `--from-rows` from the committed rows (byte for byte).
claims: $(STAMP)
	$(BIN)/python -m study --run --readme README.md

bench: $(STAMP)
	for b in benchmarks/[!_]*.py; do $(BIN)/python $$b || exit 1; done

clean-venv:
	rm -rf $(VENV)

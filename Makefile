# Two commands a newcomer needs: `make repro` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
JAX_STAMP := $(VENV)/.jax-$(shell cat requirements.lock requirements-jax.lock | sha256sum | cut -c1-12)
export PATH := $(abspath $(BIN)):$(PATH)
export PYTHONHASHSEED := 0
# bash with pipefail: a recipe's pipeline fails when any command in it fails (make repro's filter below)
SHELL := bash
.SHELLFLAGS := -o pipefail -c

.PHONY: venv jax repro test test-slow bench docs clean-venv

venv: $(STAMP)

# The JAX extra (numpyro and blackjax backends), which make repro and make test install: tests and `make bench`
# cover every backend; the default fits use nutpie.
jax: $(JAX_STAMP)

$(JAX_STAMP): $(STAMP) requirements-jax.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-jax.lock
	touch $@

$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# `dvc repro` ends every run that reran a stage with "Use `dvc push` to send your updates to remote storage.",
# remote or not (dvc/commands/repro.py prints it unconditionally; no config option turns it off). Without a DVC
# remote there is nowhere to push, so that line is dropped; with one it stays. The exit status is dvc's.
PUSH_HINT := ^Use .dvc push. to send your updates to remote storage\.$$
repro: $(JAX_STAMP)
	@echo "$(BIN)/dvc repro"; if [ -n "$$($(BIN)/dvc remote list)" ]; then $(BIN)/dvc repro; \
	else $(BIN)/dvc repro | { grep --line-buffered -v '$(PUSH_HINT)' || [ $$? -eq 1 ]; }; fi
	$(BIN)/dvc status

test: $(JAX_STAMP)
	$(BIN)/ruff check src stages tests scripts benchmarks
	$(BIN)/python -m pytest

test-slow: $(JAX_STAMP)
	$(BIN)/python -m pytest -m slow

# Side-by-side backends, the NumPy gradient floor, a warm `dvc repro` and scaling
# in n_groups: prints a table and writes reports/benchmark.json (takes long).
bench: $(JAX_STAMP)
	$(BIN)/python -m benchmarks.run --out reports/benchmark.json

# The docs site (docs/, MyST Markdown) into docs/_build/html: offline, warnings as errors. The params reference
# and the API pages are generated from the code as it builds (docs/_ext/hbnn_reference.py).
docs: $(JAX_STAMP)
	$(BIN)/python -m sphinx -b html -q -W --keep-going docs docs/_build/html
	@echo "docs: open docs/_build/html/index.html"

clean-venv:
	rm -rf $(VENV)

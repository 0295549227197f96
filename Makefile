# Two commands a newcomer needs: `make repro` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
JAX_STAMP := $(VENV)/.jax-$(shell cat requirements.lock requirements-jax.lock | sha256sum | cut -c1-12)
export PATH := $(abspath $(BIN)):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: venv jax repro test test-slow bench clean-venv

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

repro: $(JAX_STAMP)
	$(BIN)/dvc repro
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

clean-venv:
	rm -rf $(VENV)

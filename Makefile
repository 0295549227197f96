# Two commands a newcomer needs: `make repro` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-12)
export PATH := $(abspath $(BIN)):$(PATH)
export PYTHONHASHSEED := 0

.PHONY: venv repro test test-slow lint clean-venv

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found (set PYTHON=...)"; exit 1; }
	rm -rf $(VENV)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

repro: $(STAMP)
	$(BIN)/dvc repro
	$(BIN)/dvc status

test: $(STAMP)
	$(BIN)/ruff check src stages tests scripts
	$(BIN)/python -m pytest

test-slow: $(STAMP)
	$(BIN)/python -m pytest -m slow

clean-venv:
	rm -rf $(VENV)

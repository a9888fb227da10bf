# pgpong: every target creates .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
ARGS   ?=

.PHONY: train play test test-long test-matrix lint soak bench tutorial clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "pgpong needs Python 3.11 or newer (set PYTHON=...)")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Re-install when the package description changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[study,test]"
	@touch $@

train: $(VENV)/.installed
	$(BIN)/pgpong train $(ARGS)

play: $(VENV)/.installed
	$(BIN)/pgpong play $(ARGS)

# Every test but the longest end-to-end ones (marked long; make test-long runs them, CI runs both).
test: $(VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -m "not long" $(ARGS)

test-long: $(VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/python -m pytest -m long $(ARGS)

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests
	$(BIN)/ruff format --check src tests
	$(BIN)/mypy

# Ten minutes of training while a rollout worker is killed every few seconds.
soak: $(VENV)/.installed
	RAY_USAGE_STATS_ENABLED=0 $(BIN)/python tests/soak.py $(ARGS)

# Each Python 3.11-3.13 found here x newest and lowest dependencies: a fresh venv, the fast tests.
test-matrix:
	$(PYTHON) tests/matrix.py $(ARGS)

bench: $(VENV)/.installed
	$(BIN)/pgpong bench $(ARGS)

# docs/tutorial.py (the text to edit) -> docs/tutorial.ipynb, run in a fresh kernel and saved with its outputs (5-8 minutes).
tutorial: $(VENV)/.installed
	$(BIN)/jupytext --to ipynb --output docs/tutorial.ipynb docs/tutorial.py
	cd docs && RAY_USAGE_STATS_ENABLED=0 ../$(BIN)/jupyter-execute --inplace --timeout=1200 tutorial.ipynb

clean:
	rm -rf $(VENV) .matrix build src/*.egg-info .pytest_cache

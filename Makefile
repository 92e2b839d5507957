# The two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test lint unit e2e bench clean help

help:
	@echo "make demo   - create .venv, start a real rLLM gateway with real stragglers, scan it"
	@echo "make test   - create .venv, run ruff, mypy and every test"
	@echo "make lint   - ruff and mypy only"
	@echo "make bench  - run the benchmarks (prints ratios against bare baselines)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "gatewayscope needs Python >= 3.10")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,gateway,notebook]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gatewayscope demo

lint: $(STAMP)
	$(BIN)/ruff check gatewayscope tests $(wildcard bench)
	$(BIN)/mypy

test: lint
	$(BIN)/python -m pytest --doctest-modules gatewayscope tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

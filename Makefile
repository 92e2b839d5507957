# The two commands: `make demo` and `make test`. Each creates .venv and installs what it needs.
# `make test` also installs the rLLM gateway of the upstream repository (main) into .venv-upstream, from the
# archive in ../shared/peers/, and runs every test that starts a real gateway on both gateways.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# `make bench BENCH_SCALE=0.1` runs the scaling rows at a tenth of their full store sizes (1M, 10M and 100k
# sessions); BENCH_ARGS passes further flags to `python -m bench` (for example `--only cli-startup`)
BENCH_SCALE ?= 1
BENCH_ARGS ?=

# The upstream rLLM gateway (rllm-org/rllm main, rllm-model-gateway/): its own environment, with gatewayscope
# installed in it too (no extras) so the guarded launcher runs under upstream's Python. When it cannot be
# installed, UPSTREAM_UNAVAILABLE holds the reason and the upstream cases of the tests skip with it.
UPSTREAM_ARCHIVE ?= ../shared/peers/rllm-model-gateway-main.tar.gz
UPSTREAM_VENV := .venv-upstream
UPSTREAM_STAMP := $(UPSTREAM_VENV)/.installed
UPSTREAM_UNAVAILABLE := $(UPSTREAM_VENV)/.unavailable
UPSTREAM_LOG := $(UPSTREAM_VENV)/install.log

.PHONY: demo test lint unit e2e bench clean help upstream

help:
	@echo "make demo     - create .venv, start a real rLLM gateway with real stragglers, scan it"
	@echo "make test     - create .venv (and .venv-upstream), run ruff, mypy and every test"
	@echo "make lint     - ruff and mypy only"
	@echo "make unit     - the fast loop: the tests that start no process (well under a minute)"
	@echo "make e2e      - the tests that start real processes (gateways, Prometheus, kernels, a browser)"
	@echo "make bench    - run the benchmarks, print one table (BENCH_SCALE=0.1: smaller stores)"
	@echo "make upstream - install the upstream rLLM gateway ($(UPSTREAM_ARCHIVE)) into $(UPSTREAM_VENV)"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "gatewayscope needs Python >= 3.10")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,gateway,notebook]'
	@touch $(STAMP)

# Never fails the make: an archive that is missing or does not install leaves $(UPSTREAM_UNAVAILABLE) with the
# reason (the tests print it in their skips) and no stamp, so the next `make test` tries again.
$(UPSTREAM_STAMP): pyproject.toml $(wildcard $(UPSTREAM_ARCHIVE))
	@rm -rf $(UPSTREAM_VENV)
	@mkdir -p $(UPSTREAM_VENV)
	@if [ "$(UPSTREAM_ARCHIVE)" = none ]; then \
	  echo "UPSTREAM_ARCHIVE=none: the upstream-main gateway cases are skipped" | tee $(UPSTREAM_UNAVAILABLE); \
	elif [ ! -f "$(UPSTREAM_ARCHIVE)" ]; then \
	  echo "$(UPSTREAM_ARCHIVE) not found (from $(CURDIR)); the upstream-main gateway cases are skipped" \
	    | tee $(UPSTREAM_UNAVAILABLE); \
	elif ! { echo "installing the upstream rLLM gateway into $(UPSTREAM_VENV) (about 600 MB; log: $(UPSTREAM_LOG))" \
	    && $(PYTHON) -m venv $(UPSTREAM_VENV) > $(UPSTREAM_LOG) 2>&1 \
	    && $(UPSTREAM_VENV)/bin/python -m pip install --quiet --upgrade pip >> $(UPSTREAM_LOG) 2>&1 \
	    && $(UPSTREAM_VENV)/bin/python -m pip install --quiet $(UPSTREAM_ARCHIVE) >> $(UPSTREAM_LOG) 2>&1 \
	    && $(UPSTREAM_VENV)/bin/python -m pip install --quiet -e . >> $(UPSTREAM_LOG) 2>&1 \
	    && (cd / && $(CURDIR)/$(UPSTREAM_VENV)/bin/python -c 'import rllm_model_gateway.server, gatewayscope.guard.gateway') \
	       >> $(UPSTREAM_LOG) 2>&1; }; then \
	  { echo "installing $(UPSTREAM_ARCHIVE) into $(UPSTREAM_VENV) failed; the end of $(UPSTREAM_LOG):"; \
	    grep -v '^WARNING: Location' $(UPSTREAM_LOG) | tail -n 5; } | tee $(UPSTREAM_VENV)/.reason; \
	  mv $(UPSTREAM_VENV)/.reason $(UPSTREAM_UNAVAILABLE); \
	else \
	  touch $(UPSTREAM_STAMP); \
	fi

upstream: $(UPSTREAM_STAMP)

demo: $(STAMP)
	$(BIN)/gatewayscope demo

lint: $(STAMP)
	$(BIN)/ruff check gatewayscope tests $(wildcard bench)
	$(BIN)/mypy

test: lint $(UPSTREAM_STAMP)
	$(BIN)/python -m pytest --doctest-modules gatewayscope tests $(PYTEST_ARGS)

# the fast loop after each edit: every test neither e2e nor slow, with starting a process refused
# (tests/conftest.py); `make e2e` runs the rest, `make test` everything
unit: $(STAMP)
	GATEWAYSCOPE_UNIT_TESTS=1 $(BIN)/python -m pytest -m "not e2e and not slow" -n 6 --doctest-modules gatewayscope tests $(PYTEST_ARGS)

e2e: $(STAMP) $(UPSTREAM_STAMP)
	$(BIN)/python -m pytest -m "e2e or slow" tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m bench --scale $(BENCH_SCALE) $(BENCH_ARGS)

clean:
	rm -rf $(VENV) $(UPSTREAM_VENV) .pytest_cache .mypy_cache .ruff_cache

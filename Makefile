# `make run` starts Corral with embedded defaults; `make test` runs the test suite.
# Both set up what they need (virtualenv, services, nsjail) on a fresh Debian/Ubuntu box.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (tests/groups.py: which tests share one); 0: in-process
TEST_WORKERS ?= 3

.PHONY: help run test lint format clean

help:
	@echo "make run    start Corral on http://127.0.0.1:8080 (embedded: SQLite, in-process dispatch)"
	@echo "make test   install what the tests need, start PostgreSQL and Redis, run the suite"
	@echo "make lint   ruff and mypy"

# verl's reward client is tested unchanged; `import verl` would pull in torch, so it is
# installed without dependencies and loaded by path (tests/compat/test_verl_reward.py).
$(STAMP): pyproject.toml
	@PYTHON=$$(scripts/find-python) || exit 1; \
	  [ -x $(PY) ] || $$PYTHON -m venv $(VENV); \
	  $(PY) -m pip install -q -e '.[dev]' && \
	  $(PY) -m pip install -q --no-deps verl==0.9.1 && touch $(STAMP)

run: $(STAMP)
	@bash scripts/setup-nsjail.sh
	@bash scripts/setup-wasm.sh
	@bash scripts/setup-images.sh
	@bash scripts/setup-sandboxes.sh
	@bash scripts/setup-microvm.sh
	@bash scripts/setup-console.sh
	@exec bash scripts/run

test: $(STAMP)
	@bash scripts/setup-nsjail.sh
	@bash scripts/setup-wasm.sh
	@bash scripts/setup-images.sh
	@bash scripts/setup-sandboxes.sh
	@bash scripts/setup-microvm.sh
	@bash scripts/setup-console.sh --browser
	@set -a; eval "$$(bash scripts/services.sh)"; set +a; \
	  CORRAL_TEST_REQUIRE_SERVICES=1 $(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check app corral node images common wire migrations deploy tests bench functions
	$(VENV)/bin/ruff format --check app corral node images common wire migrations deploy tests bench functions
	$(VENV)/bin/mypy

format: $(STAMP)
	$(VENV)/bin/ruff format app corral node images common wire migrations deploy tests bench
	$(VENV)/bin/ruff check --fix app corral node images common wire migrations deploy tests bench

clean:
	rm -rf $(VENV) var .pytest_cache .mypy_cache .ruff_cache

# Two commands for a newcomer: `make demo` and `make test`. Everything installs
# into .venv; nothing needs a server for the embedded default.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# The embedded-default smoke tests: the whole agent API and the reconciler on
# SQLite + the filesystem broker, with no server configured.
SMOKE_TESTS := tests/agent_api tests/test_reconciler.py tests/test_settings.py tests/test_prices.py

.PHONY: install demo test test-embedded clean

install: $(STAMP)

$(STAMP): pyproject.toml tests/emulators/package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build on local disk; an unpinned torch would download a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	npm ci --prefix tests/emulators --no-audit --no-fund --loglevel=error
	touch $(STAMP)

demo: install
	$(BIN)/python manage.py demo

test: install
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-embedded: install
	env -u DATABASE_URL -u CELERY_BROKER_URL $(BIN)/python -m pytest $(SMOKE_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf var .pytest_cache

# Two commands for a newcomer: `make demo` and `make test`. Everything installs
# into .venv; nothing needs a server for the embedded default.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=
# Test processes in parallel (pytest-xdist), one per CPU, a test module on one of them:
# its module-scoped fixtures (a demo run, built wheels, a cloud emulator, an uninterrupted
# reference training) are made once, where `--dist load` spread a module's neighbouring
# tests over the workers and each made them again. Modules go out slowest first, in the
# order tests/slowest_first.py collects them, not xdist's most-tests-first. One worker a
# CPU: a third on 2 cores keeps the cores busier (idle 22 % -> 6 %, .ci/run ~2 min
# shorter), but on the embedded default it failed the memory tier's e2e in both runs
# tried (6 steps lost for K = 5: a replication in flight when the node died took longer
# than a step to land on the loaded machine). TEST_WORKERS=3 for the faster run.
TEST_WORKERS ?= auto
XDIST := -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

.PHONY: install agent-wheel demo test test-embedded clean

install: $(STAMP) agent-wheel

# The library's wheel cloud VMs install, built from this checkout's agents/ into var/dist
# (jobs/fleet/agent_dist.py): run again after changing agents/, so VMs get the change.
agent-wheel: $(STAMP)
	$(BIN)/python manage.py build_agent_wheel

# Two distributions, both editable: the trainer/agent library (agents/, import `respawn`)
# and the control plane (this directory: controlplane/, jobs/ and frontend/, import
# `respawn_server`, `respawn_server.jobs`, `respawn_server.frontend`) with the test tools.
$(STAMP): pyproject.toml setup.py agents/pyproject.toml tests/emulators/package-lock.json
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU build on local disk; an unpinned torch would download a multi-GB CUDA build.
	# --no-compile: pip byte-compiles every module it installs, one file after another
	# (62 CPU-s of a fresh install, 25,000 files); the demo's and the tests' processes
	# cache the few thousand they import instead (below).
	$(BIN)/pip install --quiet --no-compile torch==2.13.0
	# A .venv from before the split holds the single distribution `respawn` (top-level
	# agents, jobs, respawncli...): it goes, so nothing imports the old names from it.
	$(BIN)/pip uninstall --quiet --yes respawn
	$(BIN)/pip install --quiet --no-compile -e ./agents -e '.[dev]'
	npm ci --prefix tests/emulators --no-audit --no-fund --loglevel=error
	touch $(STAMP)

# Bytecode is cached whatever PYTHONDONTWRITEBYTECODE says (some shells set it): the
# demo's and the tests' servers, agents and trainers would otherwise compile every module
# they import at each start (torch alone: 1.3 -> 3.0 CPU-s an import).
demo: install
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python manage.py demo

# .ci/system-setup installs the system packages the tests drive where it can (as root)
# and, where it cannot, names in one line what this run leaves out.
test: install
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest $(XDIST) $$(.ci/system-setup $(BIN)/python) $(PYTEST_ARGS)

# The whole suite on the embedded default (SQLite, the filesystem broker), whatever
# this shell has configured: what a newcomer's `make test` runs.
test-embedded: install
	env -u PYTHONDONTWRITEBYTECODE -u DATABASE_URL -u CELERY_BROKER_URL $(BIN)/python -m pytest $(XDIST) \
		$$(.ci/system-setup $(BIN)/python) $(PYTEST_ARGS)

clean:
	rm -rf var .pytest_cache

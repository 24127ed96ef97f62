# Everything runs from a project-local virtual environment built from PyPI alone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test fast upgrade check demo bench property chaos clean sysdeps

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

# Lint and format (ruff), types (mypy: the product, chaos and bench), import layers (import-linter).
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

run: $(STAMP)
	$(BIN)/reaper run

# Debian packages the tests need: promtool (the prometheus package) for the alert-rule
# tests, RUNLEVEL=1 keeping the package's service from being started; chromium for the Web
# UI test (tests/e2e/test_web_ui.py drives /usr/bin/chromium with Playwright, which then
# downloads no browser of its own); podman, runc and busybox-static for the agent's engine
# tests (tests/e2e/test_agent_engine.py: real containers through Podman's Docker API, from
# an image imported from the static busybox, since no registry is reachable).
sysdeps:
	command -v promtool >/dev/null || \
		(apt-get update -qq && RUNLEVEL=1 apt-get install -y -qq prometheus >/dev/null)
	command -v chromium >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq chromium >/dev/null)
	(command -v podman && command -v runc && dpkg -s busybox-static) >/dev/null 2>&1 || \
		(apt-get update -qq && apt-get install -y -qq podman runc busybox-static >/dev/null)

# Four pytest processes side by side. The time-skipping test server (tests/workflows) and the
# dev server (tests/e2e) are never started in the same process (the SDK misbehaves with two
# environments alive in one process, docs/platform-notes.md), so the unit and time-skipping
# tests run in one process; the dev-server tests that start a stack of their own (marker
# `own_stack`: reaper demo, the Web UI, the repairs on a server of their own, a Temporal
# outage; about four minutes) in a second; the two smoke tests (marker `smoke`: `python -m
# bench --quick` and a short chaos campaign, each a command that starts its own stack, four
# to six minutes together) run after the others, alone: beside them the CPU-bound quick bench
# outran its limit (540 s at load 11-14 on a clean clone); the other dev-server tests (about nine minutes in one process)
# in two, split by file: E2E_FIRST (the longest files: a controller killed mid-step, the
# CLI, the container engine, outages, a locked table; about 5 minutes alone) and
# the rest (about 4.8; a new file lands there). Each of these starts its own dev server and
# Postgres on free ports. Side by side the four are CPU-bound on 2 cores (a fresh clone's
# run spent about 1,200 CPU-seconds, servers and Postgres included), so the suite gets shorter
# only by spending less CPU, not by another split: the in-process controllers validate each
# workflow class once per process and cache bytecode (tests/support/controller.py,
# tests/conftest.py), `reaper` commands fork from a process that has imported the CLI
# (tests/support/cli.py), and a test waiting on a liveness asks again after the controller's
# next workflow activation, not on a clock (tests/support/fleet.py). The background
# processes' output is kept in .reaper/test-*.log and printed when all have ended; the exit
# status fails if any failed. The property tests run derandomized
# here (the same examples on every run, so a red CI is reproducible); `make property`
# explores new random timelines.
UNIT_TESTS := tests/core tests/policy tests/activities tests/workflows tests/chaos
E2E_MARKS := not slow and not upgrade and not smoke and not own_stack
E2E_FIRST := tests/e2e/test_durable.py tests/e2e/test_cli.py tests/e2e/test_agent_engine.py \
	tests/e2e/test_outage.py tests/e2e/test_lock_fault.py
test: $(STAMP) sysdeps
	@mkdir -p .reaper
	@$(BIN)/python -m pytest -q -p no:cacheprovider --hypothesis-profile=repeatable \
		$(UNIT_TESTS) > .reaper/test-unit.log 2>&1 & unit=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m 'own_stack and not smoke' tests/e2e \
		> .reaper/test-own.log 2>&1 & own=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m '$(E2E_MARKS)' $(E2E_FIRST) \
		> .reaper/test-e2e-first.log 2>&1 & first=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m '$(E2E_MARKS)' tests/e2e \
		$(addprefix --ignore=,$(E2E_FIRST)); e2e=$$?; \
	wait $$unit; u=$$?; wait $$own; o=$$?; wait $$first; f=$$?; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -m smoke tests/e2e \
		> .reaper/test-smoke.log 2>&1; s=$$?; \
	echo "---- $(UNIT_TESTS) (exit $$u):"; cat .reaper/test-unit.log; \
	echo "---- tests/e2e -m 'own_stack and not smoke' (exit $$o):"; cat .reaper/test-own.log; \
	echo "---- tests/e2e -m smoke, after the others (exit $$s):"; cat .reaper/test-smoke.log; \
	echo "---- $(E2E_FIRST) (exit $$f):"; cat .reaper/test-e2e-first.log; \
	echo "---- the other tests/e2e (exit $$e2e)"; \
	test $$e2e -eq 0 -a $$u -eq 0 -a $$o -eq 0 -a $$s -eq 0 -a $$f -eq 0

# The tests that need no Temporal server and no Postgres (tests/conftest.py marks the others
# `server` by their fixtures): the policy tables, the core, the pure property tests, the
# replay of stored histories, the release and patch checks. Under a minute on 2 cores.
fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider --hypothesis-profile=repeatable \
		-m 'not server and not slow and not upgrade' $(UNIT_TESTS)

# The upgrade promise (tests/e2e/test_upgrade.py): the previous release (releases.toml),
# exported from this repository's history with `git archive`, runs its controller until work
# is in flight in every step, then this checkout's controller takes over (stopped first, then
# serving side by side). Two to three minutes on 2 cores, so a step of its own; `-s` prints
# each variant's timeline. Needs the repository's history (a clean clone has it).
upgrade: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -s -m upgrade tests/e2e/test_upgrade.py

# Random timelines through the real workflows against the reference model, many more than in
# `make test` (REAPER_TIMELINE_EXAMPLES, default here 200; about 3-4 s each).
property: $(STAMP)
	REAPER_TIMELINE_EXAMPLES=$${REAPER_TIMELINE_EXAMPLES:-200} \
	REAPER_FLEET_TIMELINES=$${REAPER_FLEET_TIMELINES:-100} \
		$(BIN)/python -m pytest -q -p no:cacheprovider --timeout=0 \
		tests/workflows/test_property.py tests/workflows/test_fleet_timelines.py

# A chaos campaign against its own stack (docs/chaos.md): SEED and ROUNDS choose it, PEER
# the controllers' REAPER_PEER_VERSION (default 1.1); the last line counts rounds, kills,
# destroys, reaps and violations (exit 1 on a violation).
chaos: $(STAMP)
	$(BIN)/python -m chaos --seed $${SEED:-7} --rounds $${ROUNDS:-200} --peer-version $${PEER:-1.1}

demo: $(STAMP)
	$(BIN)/reaper demo

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .reaper

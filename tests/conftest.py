"""Fixtures for every test: a real embedded Postgres (no mocks, developers' brief).

Fixtures only; what tests import lives in ``tests/support``. The Temporal servers are in
``tests/workflows/conftest.py`` (time-skipping) and ``tests/e2e/conftest.py`` (dev server):
pytest runs the two directories in separate processes (the SDK misbehaves with two
environments alive in one process, docs/platform-notes.md).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import settings as hypothesis_settings

from activities.sealing import load_secret
from reaper.infra.db import migrate
from reaper.kit.postgres import EmbeddedPostgres

_exit_status = 0

# The in-process controllers run the workflows in the SDK's default sandbox, which imports
# each workflow module afresh for every workflow run. Where PYTHONDONTWRITEBYTECODE is set
# (these machines set it), nothing is ever cached, so every run compiled the modules from
# source again: about half of the test process's own CPU in tests/workflows (py-spy). The
# bytecode goes to __pycache__ beside the sources, as Python's default does.
sys.dont_write_bytecode = False

# `make test` runs the property tests with this profile: the same examples every run, no
# example database, so a red CI run is reproducible from the commit alone.
hypothesis_settings.register_profile("repeatable", derandomize=True, database=None)


SERVER_FIXTURES = frozenset({"pg_server_url", "time_env", "dev_env", "long_runs"})
"""Fixtures that start a Temporal server or Postgres (the others that need one build on
these)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Marker `server` on every test whose fixtures start a Temporal server or Postgres;
    # `make fast` runs the others.
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    # The Temporal SDK can abort at interpreter exit after all work is done (docs/platform-notes.md:
    # "Fatal Python error: PyGILState_Release", exit 134). The run is over and reported
    # here; leave with pytest's own status so CI judges the tests, not the teardown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """One embedded Postgres (:class:`reaper.kit.postgres.EmbeddedPostgres`) for the whole
    session, stopped and deleted at its end (here, not at interpreter exit, which
    ``pytest_unconfigure`` skips)."""
    root = Path(tempfile.mkdtemp(prefix="reaper-test-pg-"))
    server = EmbeddedPostgres(root / "data")
    yield server.start()
    server.delete()
    shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture
async def db_url(pg_server_url: str) -> AsyncIterator[str]:
    """A fresh, migrated database for one test; its URL."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(pg_server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = pg_server_url.replace("/postgres?", f"/{name}?")
    yield url
    admin = await asyncpg.connect(pg_server_url)
    await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    await admin.close()


@pytest_asyncio.fixture
async def pool(db_url: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(db_url, min_size=1, max_size=8)
    await migrate(p)
    await load_secret(p)
    yield p
    await p.close()

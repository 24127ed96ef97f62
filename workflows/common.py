"""What the workflows share: ids, search attributes, activity options, continue-as-new, signals."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from reaper.core.contract import SEARCH_ATTRIBUTES as ATTRIBUTE_TYPES
    from reaper.core.contract import fleet_monitor_id as fleet_monitor_id  # re-exported
    from reaper.core.contract import liveness_id

WORKER_ATTR = SearchAttributeKey.for_keyword("ReaperWorker")
STATE_ATTR = SearchAttributeKey.for_keyword("ReaperState")
MISSING_ATTR = SearchAttributeKey.for_int("ReaperMissing")
SEARCH_ATTRIBUTES = (WORKER_ATTR, STATE_ATTR, MISSING_ATTR)
"""Registered on every server reaper uses (CONTRACT.md §2)."""
assert {k.name for k in SEARCH_ATTRIBUTES} == set(ATTRIBUTE_TYPES)

ACTIVITY_TIMEOUT = timedelta(seconds=15)
"""Short, so that work interrupted by a controller crash resumes within 30 s (rule 8)."""

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
)
"""Unlimited attempts: a Postgres outage delays work, never drops it (rule 8)."""

HISTORY_CAP = 8_000
"""Continue-as-new at this many events even if the server has not suggested it yet, so no
run nears Temporal's hard limit of 51,200 events (docs/platform-notes.md)."""

CHANGE_FEED = "change-feed"
"""Patch (deprecated since 1.2: always taken): the fleet monitor reads the change feed and
nudges changed workers, and unchanged reports are re-diffed every ``FULL_RESYNC_INTERVAL``
instead of every ``RESYNC_INTERVAL``."""

REPAIR_STUCK = "repair-stuck"
"""Patch (deprecated since 1.2: always taken): the fleet monitor runs ``repair_stuck`` at
every check (activities/repair.py)."""

R = TypeVar("R")


def start_activity(
    method: Callable[[Any, Any], Awaitable[R]], arg: Any, *, summary: str
) -> workflow.ActivityHandle[R]:
    """Start one of reaper's activities with the shared timeout and unlimited retries.

    Args:
        method: an unbound method of ``activities.ReaperActivities`` taking one input.
        arg: its input model.
        summary: the label shown in the Web UI.
    """
    return workflow.start_activity_method(
        method, arg, start_to_close_timeout=ACTIVITY_TIMEOUT, retry_policy=RETRY, summary=summary
    )


async def run_activity(method: Callable[[Any, Any], Awaitable[R]], arg: Any, *, summary: str) -> R:
    """Run one of reaper's activities to completion (see :func:`start_activity`)."""
    return await start_activity(method, arg, summary=summary)


async def run_local_activity(
    method: Callable[[Any, Any], Awaitable[R]],
    arg: Any,
    *,
    summary: str,
    timeout: timedelta = ACTIVITY_TIMEOUT,
) -> R:
    """Run one of reaper's activities as a local activity, inside the current workflow task,
    with the activities' unlimited retries (:data:`RETRY`: at most 10 s between tries, so a
    run is back within seconds of Postgres, rule 8; the SDK's default backs off to 100 s).

    Args:
        method: an unbound method of ``activities.ReaperActivities`` taking one input.
        arg: its input model.
        summary: the label shown in the Web UI.
        timeout: start-to-close of one try (seconds as a ``timedelta``).
    """
    return await workflow.execute_local_activity_method(
        method, arg, start_to_close_timeout=timeout, retry_policy=RETRY, summary=summary
    )


def should_continue_as_new() -> bool:
    """Whether this run's history is long enough to hand its state to a new run."""
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.get_current_history_length() >= HISTORY_CAP


def collector_id(worker: str) -> str:
    """Workflow id of a worker's handle collector, a child of its liveness."""
    return f"gc-{worker}"


def reap_id(worker: str, n: int) -> str:
    """Workflow id of the ``n``-th reap of a worker (ids from data, never random)."""
    return f"reap-{worker}-{n}"


async def request_resync(worker: str) -> None:
    """Tell a worker's liveness that Postgres changed for it (a task was placed on it), so its
    next reports are reconciled even if unchanged. Signal ``nudge`` (an internal name)."""
    await signal_quietly(liveness_id(worker), "nudge", None)


async def tell_placed(placed: list[tuple[str, str]]) -> None:
    """Tell each worker that received tasks (``(task_id, worker)`` pairs) to pick them up."""
    for worker in sorted({w for _, w in placed}):
        await request_resync(worker)


async def signal_quietly(workflow_id: str, name: str, arg: object) -> bool:
    """Signal another workflow; False (logged) if it does not exist or is closed.

    A liveness that is gone will learn everything from Postgres on its next report, so a
    failed signal is never worth failing the collector for.
    """
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(name, arg)
        return True
    except Exception as exc:
        workflow.logger.info("signal %s to %s failed: %s", name, workflow_id, exc)
        return False

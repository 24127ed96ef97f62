"""Names, ids, search attributes and activity options shared by the workflows."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeKey

with workflow.unsafe.imports_passed_through():
    from reaper.core.contract import liveness_id

WORKER_ATTR = SearchAttributeKey.for_keyword("ReaperWorker")
STATE_ATTR = SearchAttributeKey.for_keyword("ReaperState")
MISSING_ATTR = SearchAttributeKey.for_int("ReaperMissing")
SEARCH_ATTRIBUTES = (WORKER_ATTR, STATE_ATTR, MISSING_ATTR)
"""Registered on every server reaper uses (CONTRACT.md §2)."""

ACTIVITY_TIMEOUT = timedelta(seconds=15)
"""Short, so that work interrupted by a controller crash resumes within 30 s (rule 8)."""

RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
)
"""Unlimited attempts: a Postgres outage delays work, never drops it (rule 8)."""


def collector_id(worker: str) -> str:
    """Workflow id of a worker's handle collector, a child of its liveness."""
    return f"gc-{worker}"


def reap_id(worker: str, n: int) -> str:
    """Workflow id of the ``n``-th reap of a worker (ids from data, never random)."""
    return f"reap-{worker}-{n}"


async def nudge(worker: str) -> None:
    """Tell a worker's liveness that Postgres changed for it (a task was placed on it)."""
    await signal_quietly(liveness_id(worker), "nudge", None)


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

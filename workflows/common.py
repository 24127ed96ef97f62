"""Names, ids, search attributes and activity options shared by the workflows."""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy, SearchAttributeKey

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


def liveness_id(worker: str) -> str:
    """Workflow id of a worker's liveness (CONTRACT.md §2)."""
    return f"liveness-{worker}"


def collector_id(worker: str) -> str:
    """Workflow id of a worker's handle collector, a child of its liveness."""
    return f"gc-{worker}"


def reap_id(worker: str, n: int) -> str:
    """Workflow id of the ``n``-th reap of a worker (ids from data, never random)."""
    return f"reap-{worker}-{n}"
